/* Threads that make exactly THREADS*PER malloc(777) calls, each under a
 * mutex, and print their TIDs: the tracer must count every one, on the
 * right thread, with worker_alloc in the stack. Its own output goes to
 * stderr so that stdout holds only hooktrace's report. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 4
#define PER 2500

static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile sink;

__attribute__((noinline)) void worker_alloc(void)
{
	pthread_mutex_lock(&big_lock);
	void *p = malloc(777);
	sink = p;
	pthread_mutex_unlock(&big_lock);
	free(p);
}

static void *worker(void *arg)
{
	fprintf(stderr, "tid %d\n", gettid());
	for (int i = 0; i < PER; i++)
		worker_alloc();
	return arg;
}

int main(void)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	fprintf(stderr, "done %d\n", THREADS * PER);
	return 3;
}
