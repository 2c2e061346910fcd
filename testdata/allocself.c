/* glibc's allocator entry points that call another one: each program call
 * must be one call, counted once, under every recorder.
 *   calls  N times each, under a lock (so that the aggregate mode sends
 *          the calls' patterns):
 *            reallocarray growing an array from NULL (glibc's reallocarray
 *            calls realloc through libc's PLT, which the preloaded library
 *            interposes; realloc(NULL, n) jumps to malloc);
 *            realloc(NULL, 64), then realloc(p, 0) (which calls free);
 *            memalign(16, 64) and aligned_alloc(16, 64) (glibc 2.36's one
 *            function, which jumps to malloc for so small an alignment);
 *            posix_memalign(16, 64) (which calls malloc);
 *          and a free for each but realloc's; then N times a malloc
 *          two calls deep, and a strdup (libc's, whose malloc is a
 *          program call) under a frame whose unwritten stack still holds
 *          that malloc's return address. Prints the counts a recorder
 *          must find.
 *   hook   a runtime's hook patched into mremap, which allocates: glibc's
 *          realloc of a mapped chunk calls mremap, so the hook re-enters
 *          the allocator inside reallocarray (as realloc). */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libcpatch.h"

#define N 100

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep;
/* The allocator functions called through pointers, so that the compiler
 * makes every call (it folds realloc(NULL, n) into malloc otherwise). */
static void *(*volatile realloc_fn)(void *, size_t) = realloc;
static void *(*volatile memalign_fn)(size_t, size_t) = memalign;
static void *(*volatile aligned_alloc_fn)(size_t, size_t) = aligned_alloc;

__attribute__((noinline)) void grow(void)
{
	long *a = NULL;
	for (size_t i = 0; i < N; i++) {
		pthread_mutex_lock(&lock);
		long *b = reallocarray(a, i + 1, sizeof(long));
		pthread_mutex_unlock(&lock);
		if (!b)
			abort();
		a = b;
		a[i] = (long)i;
	}
	free(a);
}

__attribute__((noinline)) void inner_calls(void)
{
	for (int i = 0; i < N; i++) {
		pthread_mutex_lock(&lock);
		void *p = realloc_fn(NULL, 64);
		keep = realloc_fn(p, 0);
		p = memalign_fn(16, 64);
		keep = p;
		free(p);
		p = aligned_alloc_fn(16, 64);
		keep = p;
		free(p);
		if (posix_memalign(&p, 16, 64))
			abort();
		keep = p;
		free(p);
		pthread_mutex_unlock(&lock);
	}
}

__attribute__((noinline)) void *alloc_inner(size_t n)
{
	void *p = malloc(n);
	keep = p;
	return p;
}

__attribute__((noinline)) void *alloc_outer(size_t n)
{
	void *p = alloc_inner(n);
	keep = p;
	return p;
}

/* Its buffer is never written but at its ends: the slot where
 * alloc_inner's malloc call left its return address is in it. */
__attribute__((noinline)) char *dup_padded(const char *s)
{
	volatile char pad[512];
	pad[0] = 0;
	char *r = strdup(s);
	pad[1] = 0;
	return r;
}

__attribute__((noinline)) void stale_slot(void)
{
	for (int i = 0; i < N; i++) {
		void *p = alloc_outer(16);
		char *q = dup_padded("x");
		free(q);
		free(p);
	}
}

static volatile long hooked;

__attribute__((noinline)) void *mremap_hook(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	void *at = va_arg(ap, void *);
	va_end(ap);
	/* What a hook that keeps a registry does: a node for the new range. */
	keep = malloc(32);
	free(keep);
	hooked++;
	return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, at);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "calls";
	if (strcmp(mode, "hook") == 0) {
		void *big = malloc(1 << 20); /* above the mmap threshold: mapped */
		patch((void *)mremap, (void *)mremap_hook);
		void *bigger = reallocarray(big, 2, 1 << 20);
		free(bigger);
		fprintf(stderr, "hooked %ld\n", hooked);
		return hooked == 1 ? 0 : 1;
	}
	grow();
	inner_calls();
	stale_slot();
	fprintf(stderr, "realloc %d malloc %d free %d memalign+aligned_alloc %d posix_memalign %d\n", 3 * N, 2 * N,
		5 * N + 1, 2 * N, N);
	return 0;
}
