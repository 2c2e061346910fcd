/* A munmap hook reached from inside malloc, with no arena lock involved.
 * The program patches libc's munmap with a jump to its hook, as memory-hook
 * runtimes do; the hook takes hook_lock. A thread's first malloc makes its
 * arena, and glibc trims the new heap's mapping with munmap from inside
 * malloc (_int_new_arena -> new_heap -> alloc_new_heap -> munmap), so the
 * hook takes its lock inside malloc. Everything runs one thread after the
 * other: the run never hangs.
 *   self        the main thread holds hook_lock around a malloc: had that
 *               malloc made a heap, the hook would wait for its own thread.
 *   recursive   as self, with hook_lock a recursive mutex: the hook would
 *               run inside hook_lock's critical section instead.
 *   wrapper     UCX's pattern: the hook takes a recursive wrapper (owner
 *               and count) over a pthread spinlock. The main thread holds
 *               it around a free that unmaps, so the hook runs under it and
 *               re-enters through the wrapper, and around a malloc.
 *   cross       the main thread holds cfg_lock around a malloc (cfg_lock ->
 *               hook_lock through the hook); another thread takes hook_lock,
 *               then cfg_lock.
 *   consistent  as cross, but the other thread takes cfg_lock, then
 *               hook_lock: the order the hook path implies. */
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
static pthread_mutex_t cfg_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile long unmaps;
static void *volatile keep; /* so the compiler keeps every malloc */

__attribute__((noinline)) int munmap_hook(void *addr, size_t len)
{
	pthread_mutex_lock(&hook_lock);
	unmaps++;
	pthread_mutex_unlock(&hook_lock);
	return syscall(SYS_munmap, addr, len);
}

/* A recursive lock over a pthread spinlock, as UCX's: only the first
 * level calls pthread_spin_lock. */
struct rlock {
	pthread_spinlock_t spin;
	pthread_t owner;
	int count;
};
/* Unlocked, as pthread_spin_init leaves it on x86-64 (1: the lock is
 * "lock decl" to zero). Not pthread_spin_init itself: in glibc 2.36 it is
 * the same code as pthread_spin_unlock, and traced as an unlock. */
static struct rlock wrap_lock = {.spin = 1};

__attribute__((noinline)) void rlock_lock(struct rlock *l)
{
	if (l->count > 0 && pthread_equal(l->owner, pthread_self())) {
		l->count++;
		return;
	}
	pthread_spin_lock(&l->spin);
	l->owner = pthread_self();
	l->count = 1;
}

__attribute__((noinline)) void rlock_unlock(struct rlock *l)
{
	if (--l->count == 0)
		pthread_spin_unlock(&l->spin);
}

__attribute__((noinline)) int munmap_hook_wrapped(void *addr, size_t len)
{
	rlock_lock(&wrap_lock);
	unmaps++;
	rlock_unlock(&wrap_lock);
	return syscall(SYS_munmap, addr, len);
}

/* Under the wrapper: a free that unmaps (the hook runs and re-enters),
 * then a malloc. */
__attribute__((noinline)) void under_wrapper(void)
{
	void *big = malloc(4 << 20); /* above the mmap threshold */
	keep = big;
	rlock_lock(&wrap_lock);
	free(big);
	void *node = malloc(48);
	keep = node;
	rlock_unlock(&wrap_lock);
	free(node);
}

/* The first malloc of a new thread: glibc makes its arena. */
__attribute__((noinline)) void make_arena(void)
{
	keep = malloc(64);
	free(keep);
}

static void *arena_thread(void *arg)
{
	make_arena();
	return arg;
}

/* The main arena grows with brk: no munmap, so no hang here. */
__attribute__((noinline)) void alloc_under(pthread_mutex_t *m)
{
	pthread_mutex_lock(m);
	void *node = malloc(48);
	keep = node;
	pthread_mutex_unlock(m);
	free(node);
}

__attribute__((noinline)) void hook_then_cfg(void)
{
	pthread_mutex_lock(&hook_lock);
	pthread_mutex_lock(&cfg_lock);
	pthread_mutex_unlock(&cfg_lock);
	pthread_mutex_unlock(&hook_lock);
}

__attribute__((noinline)) void cfg_then_hook(void)
{
	pthread_mutex_lock(&cfg_lock);
	pthread_mutex_lock(&hook_lock);
	pthread_mutex_unlock(&hook_lock);
	pthread_mutex_unlock(&cfg_lock);
}

static void *order_thread(void *arg)
{
	if (arg)
		cfg_then_hook();
	else
		hook_then_cfg();
	return NULL;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "self";
	if (strcmp(mode, "recursive") == 0) {
		pthread_mutexattr_t attr;
		pthread_mutexattr_init(&attr);
		pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
		pthread_mutex_init(&hook_lock, &attr);
	}
	int wrapper = strcmp(mode, "wrapper") == 0;
	patch((void *)munmap, wrapper ? (void *)munmap_hook_wrapped : (void *)munmap_hook);
	pthread_t t;
	pthread_create(&t, NULL, arena_thread, NULL);
	pthread_join(t, NULL);
	if (wrapper) {
		under_wrapper();
	} else if (strcmp(mode, "self") == 0 || strcmp(mode, "recursive") == 0) {
		alloc_under(&hook_lock);
	} else {
		alloc_under(&cfg_lock);
		pthread_create(&t, NULL, order_thread, strcmp(mode, "consistent") == 0 ? &t : NULL);
		pthread_join(t, NULL);
	}
	fprintf(stderr, "unmaps %ld\n", unmaps);
	return unmaps > 0 ? 0 : 1;
}
