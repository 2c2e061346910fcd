/* Spinlocks through their whole lives, in the shapes of TSan's deadlock
 * detector stress test and of code that keeps spinlocks on the stack. In
 * glibc 2.36 pthread_spin_init is pthread_spin_unlock's code (both store 1,
 * unlocked): a recorder that sees addresses must tell the two apart.
 *
 * spinlocks MODE [N]
 *   create:  4 threads, each N times: 10 spinlocks on its stack initialised
 *            and destroyed (TSan's Test14). Each init finds the word the
 *            last lock there left: 1.
 *   reinit:  4 threads, each with 4 spinlocks in a heap array: N times lock
 *            all 4 in order, unlock them, destroy and initialise them again
 *            in place (TSan's Test18).
 *   stack:   N times, two functions whose two spinlocks share stack
 *            addresses take them in opposite orders, never destroying them:
 *            the addresses are taken both ways, by different locks.
 *   zeroed:  spinlocks in zeroed memory (word 0) initialised, taken in
 *            order, freed.
 *   inverse: static spin_a and spin_b taken a -> b, then b -> a: a cycle.
 *   all:     all of these in one run (create, reinit and stack with N).
 * Exit status 2: the stack functions' locks did not share addresses. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int shared;
static long iters = 1000;

/* As TSan's PthreadSpinLock: padded to 64 bytes. */
struct padded {
	pthread_spinlock_t mu;
	char padding[64 - sizeof(pthread_spinlock_t)];
};

__attribute__((noinline)) static void make_locks(struct padded *l, int n)
{
	for (int i = 0; i < n; i++)
		pthread_spin_init(&l[i].mu, PTHREAD_PROCESS_PRIVATE);
}

__attribute__((noinline)) static void drop_locks(struct padded *l, int n)
{
	for (int i = 0; i < n; i++)
		pthread_spin_destroy(&l[i].mu);
}

static void *create_loop(void *arg)
{
	(void)arg;
	for (long it = 0; it < iters; it++) {
		struct padded some_locks[10];
		make_locks(some_locks, 10);
		drop_locks(some_locks, 10);
	}
	return NULL;
}

static void *reinit_loop(void *arg)
{
	(void)arg;
	struct padded *l = malloc(4 * sizeof(*l));
	make_locks(l, 4);
	for (long it = 0; it < iters; it++) {
		for (int i = 0; i < 4; i++)
			pthread_spin_lock(&l[i].mu);
		shared++;
		for (int i = 0; i < 4; i++)
			pthread_spin_unlock(&l[i].mu);
		drop_locks(l, 4);
		make_locks(l, 4);
	}
	drop_locks(l, 4);
	free(l);
	return NULL;
}

static void four_threads(void *(*fn)(void *))
{
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, fn, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
}

/* The two functions have one frame layout: their locks land at the same
 * addresses. Each returns its first lock's address. */
__attribute__((noinline)) static uintptr_t first_then_second(void)
{
	pthread_spinlock_t l[2];
	pthread_spin_init(&l[0], PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&l[1], PTHREAD_PROCESS_PRIVATE);
	pthread_spin_lock(&l[0]);
	pthread_spin_lock(&l[1]);
	shared++;
	pthread_spin_unlock(&l[1]);
	pthread_spin_unlock(&l[0]);
	return (uintptr_t)&l[0];
}

__attribute__((noinline)) static uintptr_t second_then_first(void)
{
	pthread_spinlock_t l[2];
	pthread_spin_init(&l[0], PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&l[1], PTHREAD_PROCESS_PRIVATE);
	pthread_spin_lock(&l[1]);
	pthread_spin_lock(&l[0]);
	shared++;
	pthread_spin_unlock(&l[0]);
	pthread_spin_unlock(&l[1]);
	return (uintptr_t)&l[0];
}

static int stack(void)
{
	for (long it = 0; it < iters; it++) {
		if (first_then_second() != second_then_first())
			return 2;
	}
	return 0;
}

static void zeroed(void)
{
	struct padded *l = calloc(2, sizeof(*l));
	make_locks(l, 2);
	pthread_spin_lock(&l[0].mu);
	pthread_spin_lock(&l[1].mu);
	shared++;
	pthread_spin_unlock(&l[1].mu);
	pthread_spin_unlock(&l[0].mu);
	free(l);
}

static pthread_spinlock_t spin_a, spin_b;

__attribute__((noinline)) static void take_both(pthread_spinlock_t *first, pthread_spinlock_t *second)
{
	pthread_spin_lock(first);
	pthread_spin_lock(second);
	shared++;
	pthread_spin_unlock(second);
	pthread_spin_unlock(first);
}

static void inverse(void)
{
	pthread_spin_init(&spin_a, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&spin_b, PTHREAD_PROCESS_PRIVATE);
	take_both(&spin_a, &spin_b);
	take_both(&spin_b, &spin_a);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: spinlocks create|reinit|stack|zeroed|inverse|all [N]\n");
		return 1;
	}
	if (argc > 2)
		iters = atol(argv[2]);
	const char *mode = argv[1];
	int all = strcmp(mode, "all") == 0;
	if (all || strcmp(mode, "create") == 0)
		four_threads(create_loop);
	if (all || strcmp(mode, "reinit") == 0)
		four_threads(reinit_loop);
	if ((all || strcmp(mode, "stack") == 0) && stack() != 0) {
		fprintf(stderr, "the stack functions' locks did not share addresses\n");
		return 2;
	}
	if (all || strcmp(mode, "zeroed") == 0)
		zeroed();
	if (all || strcmp(mode, "inverse") == 0)
		inverse();
	return 0;
}
