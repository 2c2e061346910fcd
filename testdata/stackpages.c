/* Allocator calls from many stack pages: each of THREADS threads recurses
 * DEPTH frames of about 1 KiB and, at every depth, makes one malloc and
 * one free under a mutex, ROUNDS times; halfway through, the process forks
 * (the child exits at once), which write-protects every stack page and
 * makes the next write copy it. The probes read each call's return address
 * from pages that change under them: the counts must still be exact
 * (THREADS*ROUNDS*DEPTH malloc and free, and as many lock and unlock).
 * Exit 0. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 3
#define DEPTH 24
#define ROUNDS 40

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t half;
static void *volatile sink;

__attribute__((noinline)) static void descend(int depth)
{
	volatile char frame[1000];
	frame[0] = (char)depth;
	pthread_mutex_lock(&mu);
	void *p = malloc(32 + depth);
	sink = p;
	free(p);
	pthread_mutex_unlock(&mu);
	if (depth > 1)
		descend(depth - 1);
	frame[1] = frame[0];
}

static void *worker(void *arg)
{
	(void)arg;
	for (int r = 0; r < ROUNDS; r++) {
		if (r == ROUNDS / 2)
			pthread_barrier_wait(&half);
		descend(DEPTH);
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	pthread_barrier_init(&half, NULL, THREADS + 1);
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	pthread_barrier_wait(&half);
	pid_t child = fork();
	if (child == 0)
		_exit(0);
	waitpid(child, NULL, 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	return 0;
}
