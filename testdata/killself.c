/* Takes two locks in both orders on two threads, then kills itself with
 * SIGKILL: no exit handler runs, and what the recorder wrote up to then
 * must still reach the trace. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

static pthread_mutex_t kill_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t kill_b = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep;

__attribute__((noinline)) void a_then_b(void)
{
	pthread_mutex_lock(&kill_a);
	pthread_mutex_lock(&kill_b);
	keep = malloc(99);
	pthread_mutex_unlock(&kill_b);
	pthread_mutex_unlock(&kill_a);
}

__attribute__((noinline)) void b_then_a(void)
{
	pthread_mutex_lock(&kill_b);
	pthread_mutex_lock(&kill_a);
	pthread_mutex_unlock(&kill_a);
	pthread_mutex_unlock(&kill_b);
}

static void *worker(void *arg)
{
	b_then_a();
	return arg;
}

int main(void)
{
	a_then_b();
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);
	raise(SIGKILL);
	return 0;
}
