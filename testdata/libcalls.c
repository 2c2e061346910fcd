/* The shared library of testdata/calls.c: rwlocks and spinlocks made,
 * taken and destroyed from a library's own code, through its own PLT. */
#include <pthread.h>
#include <stdlib.h>

/* A tail call: the library's caller is the init's caller. */
__attribute__((noinline)) int lib_rwlock_init(pthread_rwlock_t *l)
{
	return pthread_rwlock_init(l, NULL);
}

/* Takes a and b in the order given, each a freshly made rwlock that ends
 * here: made by the caller through lib_rwlock_init. */
__attribute__((noinline)) void lib_rwlock_pair(pthread_rwlock_t *first, pthread_rwlock_t *second)
{
	pthread_rwlock_wrlock(first);
	pthread_rwlock_wrlock(second);
	pthread_rwlock_unlock(second);
	pthread_rwlock_unlock(first);
}

__attribute__((noinline)) void lib_rwlock_end(pthread_rwlock_t *l)
{
	pthread_rwlock_destroy(l);
	__asm__ volatile("" ::: "memory"); /* not a tail call */
}

/* A spinlock's whole life, n times. */
__attribute__((noinline)) void lib_spin_life(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_spinlock_t s;
		pthread_spin_init(&s, PTHREAD_PROCESS_PRIVATE);
		pthread_spin_lock(&s);
		pthread_spin_unlock(&s);
		pthread_spin_destroy(&s);
	}
}

/* Never called, and last: its call is the last probe a tracer attaches in
 * this library when it attaches them by address, one at a time (kernels
 * without uprobe_multi links, where each probe gets its program just after
 * its breakpoint shows). testdata/calls.c's dlopen mode waits for the
 * breakpoints up to here: the calls it then makes are all probed. */
__attribute__((noinline)) void lib_probes_end(pthread_spinlock_t *s)
{
	pthread_spin_destroy(s);
	__asm__ volatile("" ::: "memory"); /* not a tail call */
}
