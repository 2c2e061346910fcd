/* A memory hook that waits for a lock its own thread holds: the process
 * hangs for good, every time. libc's munmap is patched with a hook that
 * takes hook_lock, as memory-hook runtimes do. A new thread takes
 * hook_lock, a normal mutex, and calls malloc: a thread's first malloc
 * makes its arena, and glibc trims the new heap's mapping with munmap from
 * inside malloc (_int_new_arena -> new_heap -> alloc_new_heap -> munmap).
 * The hook then waits for hook_lock, which its own thread holds. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libcpatch.h"

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep; /* so the compiler keeps the malloc */

__attribute__((noinline)) int munmap_hook(void *addr, size_t len)
{
	pthread_mutex_lock(&hook_lock); /* held by this thread, in register_region */
	pthread_mutex_unlock(&hook_lock);
	return syscall(SYS_munmap, addr, len);
}

__attribute__((noinline)) static void register_region(void)
{
	pthread_mutex_lock(&hook_lock);
	keep = malloc(64); /* the thread's first: it makes an arena, and unmaps */
	pthread_mutex_unlock(&hook_lock);
}

static void *worker(void *arg)
{
	register_region();
	return arg;
}

int main(void)
{
	patch((void *)munmap, (void *)munmap_hook);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	fprintf(stderr, "hookhang: thread started\n");
	pthread_join(t, NULL);
	fprintf(stderr, "hookhang: finished (it should not have)\n");
	return 0;
}
