/* The workload, allocating under locks the way a registration
 * cache does: THREADS threads, 4 mutexes; inside every hold 3 malloc and 3
 * free of 16-271 bytes, and every 1024 iterations a 256 KiB block (mapped
 * and unmapped by glibc). It prints nothing and exits 0.
 *
 *     workload_locks [ITERS [THREADS]]
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOCKS 4
static pthread_mutex_t locks[LOCKS] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
				      PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static __thread void *volatile sink; /* per thread: no race for TSan to report */
static long iters = 200000;

__attribute__((noinline)) static void step(long i)
{
	pthread_mutex_t *m = &locks[i % LOCKS];
	pthread_mutex_lock(m);
	void *p[3];
	for (int k = 0; k < 3; k++) {
		p[k] = malloc(16 + (size_t)((i * 7 + k * 85) % 256));
		sink = p[k];
	}
	for (int k = 0; k < 3; k++)
		free(p[k]);
	pthread_mutex_unlock(m);
	if (i % 1024 == 0) {
		char *big = malloc(256 << 10);
		memset(big, 1, 4096);
		sink = big;
		free(big);
	}
}

static void *worker(void *arg)
{
	for (long i = 0; i < iters; i++)
		step(i);
	return arg;
}

int main(int argc, char **argv)
{
	int threads = 2;
	if (argc > 1)
		iters = atol(argv[1]);
	if (argc > 2)
		threads = atoi(argv[2]);
	if (threads < 1 || threads > 256 || iters < 0)
		return 2;
	pthread_t t[256];
	for (int i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, worker, NULL))
			return 1;
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	return 0;
}
