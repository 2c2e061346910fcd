/* The benchmark's workload: THREADS threads, each doing ITERS rounds of
 * lock(shared mutex); p = malloc(SIZE); unlock; free(p). A fixed amount of
 * work; it prints nothing and exits 0.
 *
 *     workload [ITERS [THREADS [SIZE]]]
 */
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile sink;
static long iters = 200000;
static size_t size = 64;

__attribute__((noinline)) static void step(void)
{
	pthread_mutex_lock(&lock);
	void *p = malloc(size);
	sink = p;
	pthread_mutex_unlock(&lock);
	free(p);
}

static void *worker(void *arg)
{
	for (long i = 0; i < iters; i++)
		step();
	return arg;
}

int main(int argc, char **argv)
{
	int threads = 4;
	if (argc > 1)
		iters = atol(argv[1]);
	if (argc > 2)
		threads = atoi(argv[2]);
	if (argc > 3)
		size = (size_t)atol(argv[3]);
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
