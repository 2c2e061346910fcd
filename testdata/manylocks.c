/* Many locks of one class, as a runtime's per-object locks are: N objects,
 * each with its own mutex, kept in a table under table_lock. A worker
 * updates each object with table_lock and the object's mutex held, and the
 * update allocates. libc's madvise is patched with a hook that takes
 * table_lock, as memory-hook runtimes do, and another thread's frees trim
 * its arena's heap, so the hook runs inside free with the arena lock held:
 * table_lock → object → allocator → table_lock, for every object. The
 * threads run one after the other, so nothing hangs.
 *
 *     manylocks [N]
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

struct object {
	pthread_mutex_t lock;
	void *data;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct object *table;
static long nobjects = 256;
static volatile long invalidations;
static void *volatile keep;

__attribute__((noinline)) int invalidate_hook(void *addr, size_t len, int advice)
{
	pthread_mutex_lock(&table_lock);
	invalidations++;
	pthread_mutex_unlock(&table_lock);
	return syscall(SYS_madvise, addr, len, advice);
}

__attribute__((noinline)) void object_init(struct object *o)
{
	pthread_mutex_init(&o->lock, NULL);
	o->data = NULL;
}

__attribute__((noinline)) void object_update(struct object *o)
{
	pthread_mutex_lock(&o->lock);
	void *old = o->data;
	o->data = malloc(64);
	keep = o->data;
	free(old);
	pthread_mutex_unlock(&o->lock);
}

__attribute__((noinline)) void update_all(void)
{
	for (long i = 0; i < nobjects; i++) {
		pthread_mutex_lock(&table_lock);
		object_update(&table[i]);
		pthread_mutex_unlock(&table_lock);
	}
}

static void *worker(void *arg)
{
	update_all();
	update_all();
	return arg;
}

__attribute__((noinline)) void churn(void)
{
	enum { BLOCKS = 96 };
	void *p[BLOCKS];
	for (int i = 0; i < BLOCKS; i++) {
		p[i] = malloc(8192);
		keep = p[i];
		memset(p[i], 1, 8192);
	}
	for (int i = BLOCKS - 1; i >= 0; i--)
		free(p[i]);
}

static void *releaser(void *arg)
{
	churn();
	return arg;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		nobjects = atol(argv[1]);
	table = calloc(nobjects, sizeof *table);
	for (long i = 0; i < nobjects; i++)
		object_init(&table[i]);
	patch((void *)madvise, (void *)invalidate_hook);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, releaser, NULL);
	pthread_join(t, NULL);
	fprintf(stderr, "%ld objects, %ld invalidations\n", nobjects, invalidations);
	return invalidations > 0 ? 0 : 1;
}
