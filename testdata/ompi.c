/* The Open MPI madvise-hook pattern in miniature. The program patches the
 * entry of libc's madvise with a jump to its hook, as memory-hook runtimes
 * do; the hook takes reg_lock. One thread calls malloc while holding
 * reg_lock; another frees enough memory in its own arena that glibc trims
 * the heap, calling madvise from inside free with the arena lock held. The
 * threads run one after the other, so the run never hangs.
 * With "munmap" as argument the second thread frees one large mmapped block
 * instead (free -> munmap_chunk -> munmap: no arena lock), and the hook is
 * patched into munmap. */
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

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile long invalidations;
static void *volatile keep; /* so the compiler keeps every malloc */
static int use_munmap;

__attribute__((noinline)) int release_hook(void *addr, size_t len, int advice)
{
	pthread_mutex_lock(&reg_lock);
	invalidations++;
	pthread_mutex_unlock(&reg_lock);
	return syscall(SYS_madvise, addr, len, advice);
}

__attribute__((noinline)) int unmap_hook(void *addr, size_t len)
{
	pthread_mutex_lock(&reg_lock);
	invalidations++;
	pthread_mutex_unlock(&reg_lock);
	return syscall(SYS_munmap, addr, len);
}

__attribute__((noinline)) void register_region(void)
{
	pthread_mutex_lock(&reg_lock);
	void *node = malloc(48);
	keep = node;
	pthread_mutex_unlock(&reg_lock);
	free(node);
}

static void *registrar(void *arg)
{
	/* A thread's first malloc creates its arena, and trims the new heap
	 * with munmap: with the hook in munmap and reg_lock held, that would
	 * deadlock this thread on itself. Let the arena exist first. */
	keep = malloc(16);
	free(keep);
	register_region();
	return arg;
}

__attribute__((noinline)) void churn(void)
{
	if (use_munmap) {
		void *big = malloc(4 << 20); /* above the mmap threshold */
		keep = big;
		memset(big, 1, 4096);
		free(big);
		return;
	}
	enum { N = 96 };
	void *p[N];
	for (int i = 0; i < N; i++) {
		p[i] = malloc(8192);
		keep = p[i];
		memset(p[i], 1, 8192);
	}
	for (int i = N - 1; i >= 0; i--)
		free(p[i]);
}

static void *releaser(void *arg)
{
	churn();
	return arg;
}

int main(int argc, char **argv)
{
	use_munmap = argc > 1 && strcmp(argv[1], "munmap") == 0;
	if (use_munmap)
		patch((void *)munmap, (void *)unmap_hook);
	else
		patch((void *)madvise, (void *)release_hook);
	pthread_t t;
	pthread_create(&t, NULL, registrar, NULL);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, releaser, NULL);
	pthread_join(t, NULL);
	fprintf(stderr, "invalidations %ld\n", invalidations);
	return invalidations > 0 ? 0 : 1;
}
