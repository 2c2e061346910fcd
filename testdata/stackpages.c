/* Allocator calls from many stack pages: each of THREADS threads recurses
 * DEPTH frames of about 1 KiB and, at every depth, makes one malloc and
 * one free under a mutex, ROUNDS times; halfway through, the process forks
 * (the child exits at once), which write-protects every stack page and
 * makes the next write copy it. The last thread runs on a stack of its
 * own, 2 MiB-aligned and advised for transparent huge pages, so that where
 * the kernel backs it with one (madvise mode or always), its page is a
 * page table's 2 MiB leaf. The probes read each call's return address
 * from pages that change under them: the counts must still be exact
 * (THREADS*ROUNDS*DEPTH malloc and free, and as many lock and unlock).
 * Exit 0, or 1 when the huge-page stack cannot be mapped. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4
#define HUGE (2UL << 20)
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
	for (int i = 0; i < THREADS - 1; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	char *raw = mmap(NULL, 2 * HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED) {
		perror("mapping a stack");
		return 1;
	}
	char *stack = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	madvise(stack, HUGE, MADV_HUGEPAGE); /* refused where THP is off: 4K pages then */
	memset(stack, 0, HUGE);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, stack, HUGE);
	pthread_create(&t[THREADS - 1], &attr, worker, NULL);
	pthread_attr_destroy(&attr);
	pthread_barrier_wait(&half);
	pid_t child = fork();
	if (child == 0)
		_exit(0);
	waitpid(child, NULL, 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	return 0;
}
