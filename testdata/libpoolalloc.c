/* An allocator library that, as jemalloc does, takes its own mutex inside
 * malloc, and runs a caller's function with that mutex held (jemalloc runs
 * its extent hooks and its tests' hooks so). A malloc by the thread that
 * holds it is re-entrant and takes no lock, as jemalloc's is. Its locks
 * inside malloc are the allocator at work, not a memory hook: a thread
 * holding pool_lock around a malloc cannot deadlock with them. Blocks come
 * from mmap, one bump pointer, and are never reused. A hook the program
 * sets (as jemalloc's extent hooks are set) runs inside malloc whenever it
 * maps memory: that one is a memory hook, and its locks are the program's. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int holding;
static char *cur, *end;
static void (*map_hook)(void);

void pool_set_hook(void (*fn)(void))
{
	map_hook = fn;
}

#define HDR 16

static void *bump(size_t n, size_t align)
{
	if (align < HDR)
		align = HDR;
	size_t need = n + HDR + align;
	if (!cur || (size_t)(end - cur) < need) {
		size_t size = need > (16u << 20) ? need : (16u << 20);
		char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		cur = m;
		end = m + size;
		if (map_hook)
			map_hook();
	}
	char *p = (char *)(((size_t)cur + HDR + align - 1) & ~(align - 1));
	((size_t *)p)[-1] = n;
	cur = p + n;
	return p;
}

static void *pool_alloc(size_t n, size_t align)
{
	if (holding)
		return bump(n, align);
	pthread_mutex_lock(&pool_lock);
	void *p = bump(n, align);
	pthread_mutex_unlock(&pool_lock);
	if (!p)
		errno = ENOMEM;
	return p;
}

void *malloc(size_t n) { return pool_alloc(n, 16); }
void free(void *p) { (void)p; }
void *calloc(size_t n, size_t m) { return pool_alloc(n * m, 16); } /* fresh mmap memory: zero */
size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-1] : 0; }
void *memalign(size_t align, size_t n) { return pool_alloc(n, align); }
void *aligned_alloc(size_t align, size_t n) { return pool_alloc(n, align); }

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p = pool_alloc(n, align);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *realloc(void *p, size_t n)
{
	void *q = pool_alloc(n, 16);
	if (p && q) {
		size_t old = malloc_usable_size(p);
		memcpy(q, p, old < n ? old : n);
	}
	return q;
}

/* Runs fn with pool_lock held. */
void pool_locked(void (*fn)(void))
{
	pthread_mutex_lock(&pool_lock);
	holding = 1;
	fn();
	holding = 0;
	pthread_mutex_unlock(&pool_lock);
}
