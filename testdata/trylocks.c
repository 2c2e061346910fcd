/* Locks taken by trylock in a hot loop, as jemalloc takes its mutexes:
 * N times, try_a takes lock_a by trylock and lock_b under it, and a
 * trylock of held_d, which its own thread holds, fails. Then once lock_c
 * is taken under lock_a (a new pattern, with lock_a's acquisition a known
 * one), and, after that thread is done, another thread takes lock_c then
 * lock_a: a cycle of lock_a and lock_c (a thread holding lock_a, taken by
 * trylock, can wait for lock_c). Prints the trylock calls it made. */
#include <pthread.h>
#include <stdio.h>

#define N 10000

static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_c = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t held_d = PTHREAD_MUTEX_INITIALIZER;
static int tries;

__attribute__((noinline)) void try_a(pthread_mutex_t *inner)
{
	tries++;
	if (pthread_mutex_trylock(&lock_a) != 0)
		return;
	pthread_mutex_lock(inner);
	pthread_mutex_unlock(inner);
	pthread_mutex_unlock(&lock_a);
}

__attribute__((noinline)) void try_held(void)
{
	pthread_mutex_lock(&held_d);
	tries++;
	if (pthread_mutex_trylock(&held_d) == 0) /* a normal mutex: EBUSY */
		pthread_mutex_unlock(&held_d);
	pthread_mutex_unlock(&held_d);
}

static void *looper(void *arg)
{
	for (int i = 0; i < N; i++) {
		try_a(&lock_b);
		try_held();
	}
	try_a(&lock_c);
	return arg;
}

__attribute__((noinline)) void c_then_a(void)
{
	pthread_mutex_lock(&lock_c);
	pthread_mutex_lock(&lock_a);
	pthread_mutex_unlock(&lock_a);
	pthread_mutex_unlock(&lock_c);
}

static void *other(void *arg)
{
	c_then_a();
	return arg;
}

int main(void)
{
	pthread_t t;
	pthread_create(&t, NULL, looper, NULL);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, other, NULL);
	pthread_join(t, NULL);
	fprintf(stderr, "trylocks %d\n", tries);
	return 0;
}
