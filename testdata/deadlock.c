/* Two threads take two mutexes in opposite orders; a barrier between
 * their first and second lock makes sure each holds one and waits for the
 * other: a real deadlock, every time. Hang detection must catch it. */
#include <pthread.h>
#include <stdio.h>

pthread_mutex_t accounts_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t both_hold_one;

__attribute__((noinline)) static void post_to_ledger(void)
{
	pthread_mutex_lock(&accounts_lock);
	pthread_barrier_wait(&both_hold_one);
	pthread_mutex_lock(&ledger_lock); /* held by audit_accounts */
	pthread_mutex_unlock(&ledger_lock);
	pthread_mutex_unlock(&accounts_lock);
}

__attribute__((noinline)) static void audit_accounts(void)
{
	pthread_mutex_lock(&ledger_lock);
	pthread_barrier_wait(&both_hold_one);
	pthread_mutex_lock(&accounts_lock); /* held by post_to_ledger */
	pthread_mutex_unlock(&accounts_lock);
	pthread_mutex_unlock(&ledger_lock);
}

static void *poster(void *arg)
{
	(void)arg;
	post_to_ledger();
	return NULL;
}

static void *auditor(void *arg)
{
	(void)arg;
	audit_accounts();
	return NULL;
}

int main(void)
{
	pthread_t a, b;
	pthread_barrier_init(&both_hold_one, NULL, 2);
	pthread_create(&a, NULL, poster, NULL);
	pthread_create(&b, NULL, auditor, NULL);
	fprintf(stderr, "deadlock: threads started\n");
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	fprintf(stderr, "deadlock: finished (it should not have)\n");
	return 0;
}
