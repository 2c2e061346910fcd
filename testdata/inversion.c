/* Two threads take two locks in opposite orders, one after the other, so
 * the run never hangs: the inversion is a potential deadlock all the same. */
#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;
static volatile int shared;

__attribute__((noinline)) void take_a_then_b(void)
{
	pthread_mutex_lock(&lock_a);
	pthread_mutex_lock(&lock_b);
	shared++;
	pthread_mutex_unlock(&lock_b);
	pthread_mutex_unlock(&lock_a);
}

__attribute__((noinline)) void take_b_then_a(void)
{
	pthread_mutex_lock(&lock_b);
	pthread_mutex_lock(&lock_a);
	shared++;
	pthread_mutex_unlock(&lock_a);
	pthread_mutex_unlock(&lock_b);
}

static void *first(void *arg)
{
	take_a_then_b();
	return arg;
}

static void *second(void *arg)
{
	take_b_then_a();
	return arg;
}

int main(int argc, char **argv)
{
	/* "consistent": both threads take a then b. */
	int consistent = argc > 1;
	pthread_t t;
	pthread_create(&t, NULL, first, NULL);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, consistent ? first : second, NULL);
	pthread_join(t, NULL);
	return shared == 2 ? 0 : 1;
}
