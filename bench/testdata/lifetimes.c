/* Lock lifetimes against lock holds, with the same number of calls:
 * THREADS threads, each ITERS times making 2*LOCKS calls on LOCKS locks on
 * its own stack (padded to 64 bytes, as TSan's deadlock stress test pads
 * them; its Test14 is the rwlock and spin shapes here):
 *
 *   mutex:   pthread_mutex_lock and pthread_mutex_unlock of each (the locks
 *            initialised once, before the phase);
 *   mutex-life, rwlock-life, spin-life: each initialised and destroyed.
 *
 *     lifetimes MODE ITERS THREADS OWNFILE
 *
 * It writes to OWNFILE, in the main workload's form (bench.ParseOwn),
 * the phase's wall time (from the first worker's start, once all are
 * ready, to the last one's end), the process's CPU time in it, and the
 * calls it made there, by name. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOCKS 10

union lock {
	pthread_mutex_t mutex;
	pthread_rwlock_t rwlock;
	pthread_spinlock_t spin;
	char pad[64];
};

static long iters;
static const char *mode;
static pthread_barrier_t ready;

__attribute__((noinline)) static void holds(union lock *l)
{
	for (int i = 0; i < LOCKS; i++) {
		pthread_mutex_lock(&l[i].mutex);
		pthread_mutex_unlock(&l[i].mutex);
	}
}

__attribute__((noinline)) static void lifetimes(union lock *l)
{
	switch (mode[0]) {
	case 'm':
		for (int i = 0; i < LOCKS; i++)
			pthread_mutex_init(&l[i].mutex, NULL);
		for (int i = 0; i < LOCKS; i++)
			pthread_mutex_destroy(&l[i].mutex);
		break;
	case 'r':
		for (int i = 0; i < LOCKS; i++)
			pthread_rwlock_init(&l[i].rwlock, NULL);
		for (int i = 0; i < LOCKS; i++)
			pthread_rwlock_destroy(&l[i].rwlock);
		break;
	case 's':
		for (int i = 0; i < LOCKS; i++)
			pthread_spin_init(&l[i].spin, PTHREAD_PROCESS_PRIVATE);
		for (int i = 0; i < LOCKS; i++)
			pthread_spin_destroy(&l[i].spin);
		break;
	}
}

static long long ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long first_start = -1, last_end;

static void *worker(void *arg)
{
	union lock l[LOCKS];
	int hold = strcmp(mode, "mutex") == 0;
	if (hold)
		for (int i = 0; i < LOCKS; i++)
			pthread_mutex_init(&l[i].mutex, NULL);
	pthread_barrier_wait(&ready);
	long long start = ns(CLOCK_MONOTONIC), was = -1;
	__atomic_compare_exchange_n(&first_start, &was, start, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	for (long it = 0; it < iters; it++) {
		if (hold)
			holds(l);
		else
			lifetimes(l);
	}
	long long end = ns(CLOCK_MONOTONIC), last = __atomic_load_n(&last_end, __ATOMIC_SEQ_CST);
	while (end > last && !__atomic_compare_exchange_n(&last_end, &last, end, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	return arg;
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "mutex") && strcmp(argv[1], "mutex-life") && strcmp(argv[1], "rwlock-life") &&
			  strcmp(argv[1], "spin-life"))) {
		fprintf(stderr, "usage: lifetimes mutex|mutex-life|rwlock-life|spin-life ITERS THREADS OWNFILE\n");
		return 2;
	}
	mode = argv[1];
	iters = atol(argv[2]);
	int threads = atoi(argv[3]);
	if (threads < 1 || threads > 64 || iters < 0)
		return 2;
	pthread_t t[64];
	pthread_barrier_init(&ready, NULL, threads + 1);
	for (int i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, worker, NULL))
			return 1;
	long long cpu = ns(CLOCK_PROCESS_CPUTIME_ID);
	pthread_barrier_wait(&ready);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	cpu = ns(CLOCK_PROCESS_CPUTIME_ID) - cpu;
	long long wall = last_end - first_start;
	FILE *f = fopen(argv[4], "w");
	if (!f)
		return 1;
	long n = (long)threads * iters * LOCKS;
	const char *kind = mode[0] == 'r' ? "rwlock" : mode[0] == 's' ? "spin" : "mutex";
	int hold = strcmp(mode, "mutex") == 0;
	fprintf(f, "phase_ns=%lld cpu_ns=%lld pthread_mutex_lock=%ld pthread_mutex_unlock=%ld malloc=0 free=0 big=0", wall, cpu,
		hold ? n : 0, hold ? n : 0);
	if (!hold)
		fprintf(f, " pthread_%s_init=%ld pthread_%s_destroy=%ld", kind, n, kind, n);
	fputc('\n', f);
	return fclose(f) != 0;
}
