/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the real functions: resolved with dlsym, and the bootstrap allocator dlsym may need. */
#include "shim.h"

/* ---- the real functions ------------------------------------------------ */

struct real_fns real;

/* dlsym may call calloc (for its error state) before the real allocator is
 * known: those calls are served from here and never freed. Each block
 * starts with its size, so that a realloc moving one to the real
 * allocator copies all of it and no more. */
#define BOOT_HDR 16
static char boot_heap[64 << 10] __attribute__((aligned(16)));
static size_t boot_used;
__thread int resolving;

void *boot_alloc(size_t n)
{
	if (n > sizeof(boot_heap))
		return NULL;
	size_t need = BOOT_HDR + ((n + 15) & ~(size_t)15);
	size_t at = __atomic_fetch_add(&boot_used, need, __ATOMIC_RELAXED);
	if (at + need > sizeof(boot_heap))
		return NULL;
	*(size_t *)(boot_heap + at) = n;
	return boot_heap + at + BOOT_HDR; /* static memory: already zero */
}

int is_boot(const void *p)
{
	return (const char *)p >= boot_heap && (const char *)p < boot_heap + sizeof(boot_heap);
}

/* The size a bootstrap block was asked for. */
size_t boot_size(const void *p)
{
	return *(const size_t *)((const char *)p - BOOT_HDR);
}

#define RESOLVE(field, name) real.field = dlsym(REAL_SCOPE, name)

void resolve_real(void)
{
	if (resolving)
		return;
	int saved = errno, guard = ts.guard;
	resolving = 1;
	ts.guard = 1; /* what dlsym allocates is the shim's, not the target's */
	RESOLVE(calloc, "calloc");
	RESOLVE(malloc, "malloc");
	RESOLVE(realloc, "realloc");
	RESOLVE(free, "free");
	RESOLVE(posix_memalign, "posix_memalign");
	RESOLVE(aligned_alloc, "aligned_alloc");
	RESOLVE(memalign, "memalign");
	RESOLVE(valloc, "valloc");
	RESOLVE(pvalloc, "pvalloc");
	RESOLVE(mutex_lock, "pthread_mutex_lock");
	RESOLVE(mutex_trylock, "pthread_mutex_trylock");
	RESOLVE(mutex_timedlock, "pthread_mutex_timedlock");
	RESOLVE(mutex_clocklock, "pthread_mutex_clocklock");
	RESOLVE(mutex_unlock, "pthread_mutex_unlock");
	RESOLVE(mutex_init, "pthread_mutex_init");
	RESOLVE(mutex_destroy, "pthread_mutex_destroy");
	RESOLVE(rw_rdlock, "pthread_rwlock_rdlock");
	RESOLVE(rw_wrlock, "pthread_rwlock_wrlock");
	RESOLVE(rw_tryrdlock, "pthread_rwlock_tryrdlock");
	RESOLVE(rw_trywrlock, "pthread_rwlock_trywrlock");
	RESOLVE(rw_timedrdlock, "pthread_rwlock_timedrdlock");
	RESOLVE(rw_timedwrlock, "pthread_rwlock_timedwrlock");
	RESOLVE(rw_clockrdlock, "pthread_rwlock_clockrdlock");
	RESOLVE(rw_clockwrlock, "pthread_rwlock_clockwrlock");
	RESOLVE(rw_unlock, "pthread_rwlock_unlock");
	RESOLVE(rw_init, "pthread_rwlock_init");
	RESOLVE(rw_destroy, "pthread_rwlock_destroy");
	RESOLVE(spin_lock, "pthread_spin_lock");
	RESOLVE(spin_trylock, "pthread_spin_trylock");
	RESOLVE(spin_unlock, "pthread_spin_unlock");
	RESOLVE(spin_init, "pthread_spin_init");
	RESOLVE(spin_destroy, "pthread_spin_destroy");
	RESOLVE(cond_wait, "pthread_cond_wait");
	RESOLVE(cond_timedwait, "pthread_cond_timedwait");
	RESOLVE(cond_clockwait, "pthread_cond_clockwait");
	RESOLVE(create, "pthread_create");
	RESOLVE(exit, "pthread_exit");
	RESOLVE(fork, "fork");
	RESOLVE(_Fork, "_Fork");
	RESOLVE(vfork, "vfork");
	RESOLVE(execve, "execve");
	RESOLVE(execvpe, "execvpe");
	RESOLVE(fexecve, "fexecve");
	RESOLVE(execveat, "execveat");
	RESOLVE(spawn, "posix_spawn");
	RESOLVE(spawnp, "posix_spawnp");
	RESOLVE(_exit, "_exit");
	RESOLVE(madvise, "madvise");
	RESOLVE(munmap, "munmap");
	RESOLVE(mmap, "mmap");
	RESOLVE(mremap, "mremap");
	RESOLVE(brk, "brk");
	RESOLVE(sbrk, "sbrk");
	RESOLVE(dlopen, "dlopen");
	RESOLVE(dlmopen, "dlmopen");
	RESOLVE(dlclose, "dlclose");
	resolving = 0;
	ts.guard = guard;
	errno = saved;
}
