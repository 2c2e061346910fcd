/* A long-running program that checks its own arithmetic while it allocates
 * and locks: attaching to it and detaching must not change its answer. It
 * prints "ready" once running, then works until it reads a line on stdin. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 2

static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long total, rounds;
static volatile int stop;

static void *worker(void *arg)
{
	unsigned long long mine = 0, n = 0;
	while (!stop) {
		unsigned long *v = malloc(64 * sizeof *v);
		for (int i = 0; i < 64; i++)
			v[i] = i;
		unsigned long s = 0;
		for (int i = 0; i < 64; i++)
			s += v[i];
		free(v);
		pthread_mutex_lock(&sum_lock);
		total += s;
		rounds++;
		pthread_mutex_unlock(&sum_lock);
		mine += s;
		n++;
	}
	if (mine != n * 2016ULL) {
		printf("worker: wrong sum %llu for %llu rounds\n", mine, n);
		exit(1);
	}
	return arg;
}

int main(void)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		line[0] = 0;
	stop = 1;
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	if (total != rounds * 2016ULL) {
		printf("wrong: %llu for %llu rounds\n", total, rounds);
		return 1;
	}
	printf("right: %llu rounds\n", rounds);
	return 0;
}
