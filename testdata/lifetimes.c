/* Lock lifetimes, per kind. Each mode ends one lock's life and makes
 * another at the same address; the analysis must keep them apart.
 *   spin, rwlock:  a -> b; destroy and free both; two new locks c, d land at
 *                  b's and a's addresses; c -> d. No cycle: b's and a's
 *                  addresses are taken in both orders, but by different locks.
 *   zeroed:        the same with mutexes that are zeroed memory, never
 *                  initialised or destroyed: only the free ends them.
 *   spin-same, rwlock-same, zeroed-same: the same locks taken b -> a
 *                  afterwards: a cycle.
 *   spininit:      only pthread_spin_init/destroy, never a lock or unlock.
 *   writer, reader: one thread read-locks a rwlock twice; writer's prefers
 *                  writers (PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP).
 *   remutex:       a -> b; destroy and re-initialise both in place; a -> b and
 *                  b -> a: a cycle between the new mutexes.
 *   unmapped:      zeroed mutexes a, b in a mapping of the program's own;
 *                  a -> b; the mapping unmapped and mapped again at the same
 *                  address; new zeroed c, d at a's and b's addresses; c -> d
 *                  (the very pattern a -> b was), then d -> c: a cycle
 *                  between the new mutexes, which only the munmap tells
 *                  from the old ones.
 *   reheaped:      a mutex in a file's mapping (static data, to a probe) at
 *                  the page above the heap's end; the mapping unmapped, and
 *                  the heap grown over that page; then as zeroed, with a
 *                  and b in chunks on that page: no cycle, which only the
 *                  frees tell.
 *   handoff:       a mutex made and destroyed at one heap address a few
 *                  times, unused; made there again and handed to a running
 *                  thread with no lock call between, which takes it and
 *                  then order_y; main takes order_y and then it: a cycle
 *                  between the mutex, named by where it was made, and
 *                  order_y. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile int shared;

/* The lock kind the spin and rwlock modes use, as calls on void *. */
struct kind {
	size_t size;
	void (*init)(void *);
	void (*destroy)(void *);
	void (*lock)(void *);
	void (*unlock)(void *);
};

static void spin_init(void *l) { pthread_spin_init(l, PTHREAD_PROCESS_PRIVATE); }
static void spin_destroy(void *l) { pthread_spin_destroy(l); }
static void spin_lock(void *l) { pthread_spin_lock(l); }
static void spin_unlock(void *l) { pthread_spin_unlock(l); }
static void rw_init(void *l) { pthread_rwlock_init(l, NULL); }
static void rw_destroy(void *l) { pthread_rwlock_destroy(l); }
static void rw_lock(void *l) { pthread_rwlock_wrlock(l); }
static void rw_unlock(void *l) { pthread_rwlock_unlock(l); }

static void zero_init(void *l) { memset(l, 0, sizeof(pthread_mutex_t)); }
static void no_destroy(void *l) { (void)l; }
static void mutex_lock(void *l) { pthread_mutex_lock(l); }
static void mutex_unlock(void *l) { pthread_mutex_unlock(l); }

static const struct kind spin = {sizeof(pthread_spinlock_t), spin_init, spin_destroy, spin_lock, spin_unlock};
static const struct kind rwlock = {sizeof(pthread_rwlock_t), rw_init, rw_destroy, rw_lock, rw_unlock};
static const struct kind zeroed = {sizeof(pthread_mutex_t), zero_init, no_destroy, mutex_lock, mutex_unlock};

__attribute__((noinline)) static void take_in_order(const struct kind *k, void *first, void *second)
{
	k->lock(first);
	k->lock(second);
	shared++;
	k->unlock(second);
	k->unlock(first);
}

__attribute__((noinline)) static void *make_lock(const struct kind *k)
{
	/* Same size class for both kinds: the new locks reuse the old chunks. */
	void *l = malloc(64);
	k->init(l);
	return l;
}

static int reuse(const struct kind *k, int same)
{
	void *a = make_lock(k), *b = make_lock(k);
	take_in_order(k, a, b);
	if (same) {
		take_in_order(k, b, a);
		return 0;
	}
	uintptr_t old_a = (uintptr_t)a, old_b = (uintptr_t)b;
	k->destroy(a);
	k->destroy(b);
	free(a);
	free(b);
	/* The allocator's per-thread cache is last in, first out. */
	void *c = make_lock(k), *d = make_lock(k);
	if ((uintptr_t)c != old_b || (uintptr_t)d != old_a) {
		fprintf(stderr, "new locks at %p %p, old at %#lx %#lx\n", c, d, (unsigned long)old_a, (unsigned long)old_b);
		return 2;
	}
	take_in_order(k, c, d);
	return 0;
}

static int spininit(void)
{
	pthread_spinlock_t *locks = calloc(1000, sizeof(*locks));
	for (int i = 0; i < 1000; i++)
		pthread_spin_init(&locks[i], PTHREAD_PROCESS_PRIVATE);
	for (int i = 0; i < 1000; i++)
		pthread_spin_destroy(&locks[i]);
	free((void *)locks); /* pthread_spinlock_t is volatile int */
	return 0;
}

__attribute__((noinline)) static void read_twice(pthread_rwlock_t *l)
{
	pthread_rwlock_rdlock(l);
	pthread_rwlock_rdlock(l);
	shared++;
	pthread_rwlock_unlock(l);
	pthread_rwlock_unlock(l);
}

static int reads(int writer)
{
	static pthread_rwlock_t table_lock;
	pthread_rwlockattr_t attr;
	pthread_rwlockattr_init(&attr);
	if (writer)
		pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&table_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	read_twice(&table_lock);
	pthread_rwlock_destroy(&table_lock);
	return 0;
}

static pthread_mutex_t mutex_a, mutex_b;

static int remutex(void)
{
	pthread_mutex_init(&mutex_a, NULL);
	pthread_mutex_init(&mutex_b, NULL);
	pthread_mutex_lock(&mutex_a);
	pthread_mutex_lock(&mutex_b);
	pthread_mutex_unlock(&mutex_b);
	pthread_mutex_unlock(&mutex_a);
	pthread_mutex_destroy(&mutex_a);
	pthread_mutex_destroy(&mutex_b);
	pthread_mutex_init(&mutex_a, NULL);
	pthread_mutex_init(&mutex_b, NULL);
	pthread_mutex_lock(&mutex_a);
	pthread_mutex_lock(&mutex_b);
	pthread_mutex_unlock(&mutex_b);
	pthread_mutex_unlock(&mutex_a);
	pthread_mutex_lock(&mutex_b);
	pthread_mutex_lock(&mutex_a);
	pthread_mutex_unlock(&mutex_a);
	pthread_mutex_unlock(&mutex_b);
	return 0;
}

static int unmapped(void)
{
	size_t len = 4096;
	char *page = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 1;
	void *a = page, *b = page + 64;
	take_in_order(&zeroed, a, b);
	munmap(page, len);
	if (mmap(page, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != page)
		return 1;
	take_in_order(&zeroed, a, b); /* c -> d */
	take_in_order(&zeroed, b, a); /* d -> c */
	return 0;
}

static int reheaped(void)
{
	char *page = (char *)(((uintptr_t)sbrk(0) + 4095) & ~(uintptr_t)4095);
	int fd = memfd_create("lifetimes", 0);
	if (fd < 0 || ftruncate(fd, 4096) != 0 ||
	    mmap(page, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0) != page) {
		perror("mapping a file at the heap's end");
		return 1;
	}
	close(fd);
	mutex_lock(page);
	mutex_unlock(page);
	munmap(page, 4096);
	/* Small chunks come from the top of the heap, which grows into the
	 * page; they are kept, so the two on the page are the last two. */
	void *a = NULL, *b = NULL;
	for (int i = 0; i < 1 << 20 && !b; i++) {
		char *p = malloc(64);
		if ((uintptr_t)p >> 12 != (uintptr_t)page >> 12)
			continue;
		if (!a)
			a = p;
		else if ((uintptr_t)(p + 64) >> 12 == (uintptr_t)page >> 12)
			b = p;
	}
	if (!b) {
		fprintf(stderr, "the heap did not grow over %p\n", (void *)page);
		return 1;
	}
	zero_init(a);
	zero_init(b);
	take_in_order(&zeroed, a, b);
	free(a);
	free(b);
	void *c = malloc(64), *d = malloc(64);
	if (c != b || d != a) {
		fprintf(stderr, "new locks at %p %p, old at %p %p\n", c, d, a, b);
		return 2;
	}
	zero_init(c);
	zero_init(d);
	take_in_order(&zeroed, c, d);
	return 0;
}

static pthread_mutex_t order_y = PTHREAD_MUTEX_INITIALIZER;
static void *shared_mutex;
static int handed, taken;

__attribute__((noinline)) static void make_shared(void *m)
{
	pthread_mutex_init(m, NULL);
}

static void *take_handed(void *arg)
{
	while (!__atomic_load_n(&handed, __ATOMIC_ACQUIRE))
		;
	mutex_lock(shared_mutex);
	mutex_lock(&order_y);
	shared++;
	mutex_unlock(&order_y);
	mutex_unlock(shared_mutex);
	__atomic_store_n(&taken, 1, __ATOMIC_RELEASE);
	return arg;
}

static int handoff(void)
{
	shared_mutex = malloc(64);
	pthread_t t;
	if (pthread_create(&t, NULL, take_handed, NULL))
		return 1;
	for (int i = 0; i < 4; i++) {
		make_shared(shared_mutex);
		pthread_mutex_destroy(shared_mutex);
	}
	make_shared(shared_mutex);
	__atomic_store_n(&handed, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&taken, __ATOMIC_ACQUIRE))
		;
	mutex_lock(&order_y);
	mutex_lock(shared_mutex);
	shared++;
	mutex_unlock(shared_mutex);
	mutex_unlock(&order_y);
	pthread_join(t, NULL);
	pthread_mutex_destroy(shared_mutex);
	free(shared_mutex);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	if (!strcmp(mode, "spin") || !strcmp(mode, "spin-same"))
		return reuse(&spin, mode[4] == '-');
	if (!strcmp(mode, "rwlock") || !strcmp(mode, "rwlock-same"))
		return reuse(&rwlock, mode[6] == '-');
	if (!strcmp(mode, "zeroed") || !strcmp(mode, "zeroed-same"))
		return reuse(&zeroed, mode[6] == '-');
	if (!strcmp(mode, "spininit"))
		return spininit();
	if (!strcmp(mode, "writer") || !strcmp(mode, "reader"))
		return reads(mode[0] == 'w');
	if (!strcmp(mode, "remutex"))
		return remutex();
	if (!strcmp(mode, "unmapped"))
		return unmapped();
	if (!strcmp(mode, "reheaped"))
		return reheaped();
	if (!strcmp(mode, "handoff"))
		return handoff();
	fprintf(stderr, "usage: lifetimes spin|spin-same|rwlock|rwlock-same|zeroed|zeroed-same|spininit|writer|reader|remutex|unmapped|reheaped|handoff\n");
	return 2;
}
