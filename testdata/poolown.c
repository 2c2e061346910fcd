/* A program on testdata/libpoolalloc.c's allocator: a worker thread
 * mallocs N times (the allocator takes pool_lock inside each call), while
 * the main thread N times has the allocator run a function with pool_lock
 * held that mallocs (re-entrant). Nothing here can deadlock: the program
 * has no lock of its own, and the allocator's own locking is its own.
 *   poolown [N]        default 200; prints "mallocs M"
 *   poolown N hook     also a memory hook, set in the allocator, that takes
 *                      the program's own prog_lock whenever malloc maps
 *                      memory: the worker's big blocks make it run, while
 *                      the main thread holds prog_lock around a malloc.
 *                      That can deadlock: the hook takes prog_lock inside
 *                      malloc, after pool_lock, and the main thread takes
 *                      pool_lock in malloc after prog_lock. The run does
 *                      not: the main thread starts after the worker ended. */
#include <string.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

void pool_locked(void (*fn)(void));
void pool_set_hook(void (*fn)(void));

static pthread_mutex_t prog_lock = PTHREAD_MUTEX_INITIALIZER;
static int hook;

static void on_map(void)
{
	pthread_mutex_lock(&prog_lock);
	pthread_mutex_unlock(&prog_lock);
}

static int n = 200;
static void *volatile sink;

static void inside(void)
{
	sink = malloc(48);
}

static void *worker(void *arg)
{
	for (int i = 0; i < n; i++)
		sink = malloc(hook && i % 50 == 0 ? 32 << 20 : 32);
	return arg;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		n = atoi(argv[1]);
	if (argc > 2 && strcmp(argv[2], "hook") == 0) {
		hook = 1;
		pool_set_hook(on_map);
	}
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	if (hook)
		pthread_join(t, NULL);
	for (int i = 0; i < n; i++) {
		pool_locked(inside);
		if (hook) {
			pthread_mutex_lock(&prog_lock);
			sink = malloc(16);
			pthread_mutex_unlock(&prog_lock);
		}
	}
	if (!hook)
		pthread_join(t, NULL);
	printf("mallocs %d\n", (2 + hook) * n);
	return 0;
}
