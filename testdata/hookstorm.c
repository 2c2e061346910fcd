/* A memory-hook storm: libc's madvise is patched with a hook that takes
 * hook_lock, as memory-hook runtimes (Open MPI, UCX) do. THREADS threads
 * each allocate and free ROUNDS batches of 8 KiB blocks in their own arena;
 * each batch's frees trim the heap, so free calls madvise from inside the
 * allocator (arena lock held) and the hook takes hook_lock there: thousands
 * of locks inside allocator calls a second, each with a raw stack sample.
 * Before the storm one thread calls malloc with hook_lock held, so the
 * trace has the arena-lock cycle to find.
 *
 *     hookstorm [ROUNDS [THREADS]]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libcpatch.h"

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile long invalidations;
static void *volatile keep;
static long rounds = 2000;

__attribute__((noinline)) int storm_hook(void *addr, size_t len, int advice)
{
	pthread_mutex_lock(&hook_lock);
	invalidations++;
	pthread_mutex_unlock(&hook_lock);
	return syscall(SYS_madvise, addr, len, advice);
}

__attribute__((noinline)) void register_block(void)
{
	pthread_mutex_lock(&hook_lock);
	void *node = malloc(48);
	keep = node;
	pthread_mutex_unlock(&hook_lock);
	free(node);
}

__attribute__((noinline)) void release_batch(void)
{
	enum { N = 48 };
	void *p[N];
	for (int i = 0; i < N; i++) {
		p[i] = malloc(8192);
		keep = p[i];
		memset(p[i], 1, 64);
	}
	for (int i = N - 1; i >= 0; i--)
		free(p[i]);
}

static void *releaser(void *arg)
{
	for (long r = 0; r < rounds; r++)
		release_batch();
	return arg;
}

static void *registrar(void *arg)
{
	/* A thread's first malloc creates its arena (and trims the new heap):
	 * let it exist before malloc runs with hook_lock held. */
	keep = malloc(16);
	free(keep);
	register_block();
	return arg;
}

int main(int argc, char **argv)
{
	int threads = 4;
	if (argc > 1)
		rounds = atol(argv[1]);
	if (argc > 2)
		threads = atoi(argv[2]);
	if (threads < 1 || threads > 64 || rounds < 0)
		return 2;
	patch((void *)madvise, (void *)storm_hook);
	pthread_t t[64];
	pthread_create(&t[0], NULL, registrar, NULL);
	pthread_join(t[0], NULL);
	for (int i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, releaser, NULL))
			return 1;
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	fprintf(stderr, "invalidations %ld\n", invalidations);
	return invalidations > 0 ? 0 : 1;
}
