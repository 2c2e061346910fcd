/* UCX's memory-event pattern in miniature: a recursive spinlock (owner +
 * count over pthread_spin_lock/pthread_spin_trylock, as ucs_recursive_spinlock)
 * taken inside a munmap hook (munmap's entry is patched, as UCM does), from
 * several threads, some of which already hold it when they free and so
 * re-enter it recursively in the hook. No thread ever takes the spinlock
 * itself twice: a self-deadlock report on it would be impossible.
 * Says "ready" on stderr once the hook is in place (stdout is the tracer's
 * report under run), then runs until "stop" on stdin (or, with an
 * argument, for that many rounds). */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libcpatch.h"

struct recursive_spinlock {
	pthread_spinlock_t lock;
	volatile pthread_t owner; /* 0: none */
	int count;
};

static struct recursive_spinlock event_lock;
static volatile int stop;
static volatile long events, rounds_left = -1;
static void *volatile keep;

__attribute__((noinline)) static void rlock_lock(struct recursive_spinlock *l)
{
	pthread_t self = pthread_self();
	if (l->owner == self) {
		l->count++;
		return;
	}
	pthread_spin_lock(&l->lock);
	l->owner = self;
	l->count++;
}

__attribute__((noinline)) static int rlock_trylock(struct recursive_spinlock *l)
{
	pthread_t self = pthread_self();
	if (l->owner == self) {
		l->count++;
		return 1;
	}
	if (pthread_spin_trylock(&l->lock) != 0)
		return 0;
	l->owner = self;
	l->count++;
	return 1;
}

__attribute__((noinline)) static void rlock_unlock(struct recursive_spinlock *l)
{
	if (--l->count == 0) {
		l->owner = 0;
		pthread_spin_unlock(&l->lock);
	}
}

/* The munmap hook dispatches the event under the lock, and the handler
 * takes it again (recursively). */
__attribute__((noinline)) int munmap_hook(void *addr, size_t len)
{
	rlock_lock(&event_lock);
	rlock_lock(&event_lock);
	events++;
	rlock_unlock(&event_lock);
	rlock_unlock(&event_lock);
	return syscall(SYS_munmap, addr, len);
}

__attribute__((noinline)) static void release_big(void)
{
	void *big = malloc(1 << 20); /* above the mmap threshold: free munmaps */
	keep = big;
	memset(big, 1, 64);
	free(big);
}

static void *worker(void *arg)
{
	long i = (long)arg;
	while (!stop) {
		switch (i++ % 3) {
		case 0: /* free -> munmap -> hook, the lock not held */
			release_big();
			break;
		case 1: /* free with the lock held: the hook re-enters it */
			rlock_lock(&event_lock);
			release_big();
			rlock_unlock(&event_lock);
			break;
		case 2: /* the progress path polls with trylock */
			if (rlock_trylock(&event_lock)) {
				release_big();
				rlock_unlock(&event_lock);
			}
			break;
		}
		if (rounds_left > 0 && __sync_sub_and_fetch(&rounds_left, 1) <= 0)
			stop = 1;
		usleep(2000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	enum { THREADS = 4 };
	if (argc > 1)
		rounds_left = atol(argv[1]);
	/* A fixed threshold: glibc would raise it after the first free and
	 * serve the blocks from the heap. */
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
	pthread_spin_init(&event_lock.lock, PTHREAD_PROCESS_PRIVATE);
	patch((void *)munmap, (void *)munmap_hook);
	pthread_t t[THREADS];
	for (long i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, (void *)i);
	fprintf(stderr, "ready\n");
	if (rounds_left < 0) {
		char line[16];
		while (fgets(line, sizeof line, stdin) && strncmp(line, "stop", 4) != 0)
			;
		stop = 1;
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	pthread_spin_destroy(&event_lock.lock);
	fprintf(stderr, "events %ld\n", events);
	return events > 0 ? 0 : 1;
}
