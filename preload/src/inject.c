/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the injected build's entry points,
 * which hooktrace calls in a running process it has stopped with ptrace
 * (package inject): start recording into a shared memory, and stop.
 *
 * Loaded by dlopen after every symbol was bound, the library interposes
 * nothing by its exports: hooktrace_attach rewrites the GOT slots of the
 * allocator, the pthread lock and thread calls, dlopen and the memory
 * wrappers in every loaded object, remembering each slot's value, and
 * hooktrace_detach puts every one back. The library stays loaded, dormant
 * (no slot leads to it), for the next attach: unloading code a thread may
 * still be in (a wrapper blocked in a lock call) is not safe. */
#include "shim.h"

#ifdef HOOKTRACE_INJECT

/* The interposers a slot is rewritten to, by the name the slot binds. */
static const struct got_func {
	const char *name;
	void *wrapper;
	void **real;
} got_funcs[] = {
	{"malloc", (void *)malloc, (void **)&real.malloc},
	{"calloc", (void *)calloc, (void **)&real.calloc},
	{"realloc", (void *)realloc, (void **)&real.realloc},
	{"reallocarray", (void *)reallocarray, NULL},
	{"free", (void *)free, (void **)&real.free},
	{"cfree", (void *)free, (void **)&real.free},
	{"posix_memalign", (void *)posix_memalign, (void **)&real.posix_memalign},
	{"aligned_alloc", (void *)aligned_alloc, (void **)&real.aligned_alloc},
	{"memalign", (void *)memalign, (void **)&real.memalign},
	{"valloc", (void *)valloc, (void **)&real.valloc},
	{"pvalloc", (void *)pvalloc, (void **)&real.pvalloc},
	{"pthread_mutex_lock", (void *)pthread_mutex_lock, (void **)&real.mutex_lock},
	{"pthread_mutex_trylock", (void *)pthread_mutex_trylock, (void **)&real.mutex_trylock},
	{"pthread_mutex_timedlock", (void *)pthread_mutex_timedlock, (void **)&real.mutex_timedlock},
	{"pthread_mutex_clocklock", (void *)pthread_mutex_clocklock, (void **)&real.mutex_clocklock},
	{"pthread_mutex_unlock", (void *)pthread_mutex_unlock, (void **)&real.mutex_unlock},
	{"pthread_mutex_init", (void *)pthread_mutex_init, (void **)&real.mutex_init},
	{"pthread_mutex_destroy", (void *)pthread_mutex_destroy, (void **)&real.mutex_destroy},
	{"pthread_rwlock_rdlock", (void *)pthread_rwlock_rdlock, (void **)&real.rw_rdlock},
	{"pthread_rwlock_wrlock", (void *)pthread_rwlock_wrlock, (void **)&real.rw_wrlock},
	{"pthread_rwlock_tryrdlock", (void *)pthread_rwlock_tryrdlock, (void **)&real.rw_tryrdlock},
	{"pthread_rwlock_trywrlock", (void *)pthread_rwlock_trywrlock, (void **)&real.rw_trywrlock},
	{"pthread_rwlock_timedrdlock", (void *)pthread_rwlock_timedrdlock, (void **)&real.rw_timedrdlock},
	{"pthread_rwlock_timedwrlock", (void *)pthread_rwlock_timedwrlock, (void **)&real.rw_timedwrlock},
	{"pthread_rwlock_clockrdlock", (void *)pthread_rwlock_clockrdlock, (void **)&real.rw_clockrdlock},
	{"pthread_rwlock_clockwrlock", (void *)pthread_rwlock_clockwrlock, (void **)&real.rw_clockwrlock},
	{"pthread_rwlock_unlock", (void *)pthread_rwlock_unlock, (void **)&real.rw_unlock},
	{"pthread_rwlock_init", (void *)pthread_rwlock_init, (void **)&real.rw_init},
	{"pthread_rwlock_destroy", (void *)pthread_rwlock_destroy, (void **)&real.rw_destroy},
	{"pthread_spin_lock", (void *)pthread_spin_lock, (void **)&real.spin_lock},
	{"pthread_spin_trylock", (void *)pthread_spin_trylock, (void **)&real.spin_trylock},
	{"pthread_spin_unlock", (void *)pthread_spin_unlock, (void **)&real.spin_unlock},
	{"pthread_spin_init", (void *)pthread_spin_init, (void **)&real.spin_init},
	{"pthread_spin_destroy", (void *)pthread_spin_destroy, (void **)&real.spin_destroy},
	{"pthread_cond_wait", (void *)pthread_cond_wait, (void **)&real.cond_wait},
	{"pthread_cond_timedwait", (void *)pthread_cond_timedwait, (void **)&real.cond_timedwait},
	{"pthread_cond_clockwait", (void *)pthread_cond_clockwait, (void **)&real.cond_clockwait},
	{"pthread_create", (void *)pthread_create, (void **)&real.create},
	{"pthread_exit", (void *)pthread_exit, (void **)&real.exit},
	{"dlopen", (void *)dlopen, (void **)&real.dlopen},
	{"dlmopen", (void *)dlmopen, (void **)&real.dlmopen},
	{"dlclose", (void *)dlclose, (void **)&real.dlclose},
};

/* Every slot rewritten, and what it held, for detach. */
#define SAVED_SLOTS 8192
static struct saved_slot {
	__u64 slot, old, wrapper;
	int relro;
} saved[SAVED_SLOTS];
static int nsaved;

static void rewrite(struct dl_phdr_info *info, __u64 slot, void *wrapper)
{
	__u64 old = __atomic_load_n((__u64 *)slot, __ATOMIC_ACQUIRE);
	if (old == (__u64)wrapper || nsaved == SAVED_SLOTS)
		return;
	int relro = in_segment(info, slot, PT_GNU_RELRO);
	if (!store_slot(slot, (__u64)wrapper, relro))
		return;
	saved[nsaved++] = (struct saved_slot){slot, old, (__u64)wrapper, relro};
}

static void inject_slot(struct dl_phdr_info *info, __u64 slot, const char *name, void *data)
{
	int libc = *(int *)data;
	for (size_t k = 0; k < sizeof(got_funcs) / sizeof(got_funcs[0]); k++) {
		const struct got_func *g = &got_funcs[k];
		if (strcmp(name, g->name) != 0)
			continue;
		void *bound = g->real ? *g->real : dlsym(REAL_SCOPE, name);
		if (slot_unredirected(info, slot, bound))
			rewrite(info, slot, g->wrapper);
		return;
	}
	if (libc)
		return; /* libc's own memory calls are direct */
	for (size_t k = 0; k < nmemcalls; k++) {
		if (strcmp(name, memcalls[k].name) != 0)
			continue;
		if ((cfg_flags & SHM_F_SYSCALLS) && !memcalls[k].ends_locks)
			return;
		if (slot_unredirected(info, slot, *memcalls[k].real))
			rewrite(info, slot, memcalls[k].wrapper);
		return;
	}
}

/* The injected build's patch_object: libc's slots too (its strdup calls
 * malloc through one, as the preloaded library sees), every slot saved. */
int inject_patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
	if (not_patched(info))
		return 0;
	int libc = is_libc(info);
	each_jump_slot(info, inject_slot, &libc);
	return 0;
}

/* A fork's child does not record (attach traces one process): its
 * patched slots lead to a dormant library. */
static void inject_fork_child(void)
{
	active = 0;
}

/* Starts recording into the shared memory hooktrace made, opened at path
 * (its descriptor, through /proc/self/fd), of run id. Called with every
 * thread stopped outside the allocator, the loader and this library;
 * release_old when no thread has a frame of it at all, so the memories of
 * earlier attaches may go.
 * Returns how many GOT slots lead to the library now, or a negative
 * errno. */
/* The memories of earlier attaches, kept mapped until no thread may
 * write into them (release_old). */
#define KEPT_MAPS 64
static unsigned char *kept[KEPT_MAPS];
static int nkept;

static void keep_or_release(unsigned char *old, int release_old)
{
	if (old && nkept < KEPT_MAPS)
		kept[nkept++] = old;
	if (!release_old)
		return;
	for (int i = 0; i < nkept; i++)
		munmap(kept[i], (size_t)(*(__u64 *)(kept[i] + SHM_OFF_DATA) + *(__u64 *)(kept[i] + SHM_OFF_DATA_SIZE)));
	nkept = 0;
}

EXPORT __attribute__((noinline)) long hooktrace_attach(const char *path, __u64 id, int release_old)
{
	int saved_errno = errno, guard = ts.guard;
	ts.guard = 1;
	resolve_real();
	long ret = 0;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	/* The memory of an earlier attach stays mapped while a thread that
	 * was inside a wrapper then may still write its record into it;
	 * release_old says no thread is inside the library now. */
	unsigned char *old = shm;
	int ok = map_shm(fd, id);
	close(fd);
	if (!ok) {
		shm = old;
		ret = -EINVAL;
		goto out;
	}
	keep_or_release(old, release_old);
	static int atfork_done;
	if (!atfork_done && pthread_atfork(NULL, NULL, inject_fork_child) == 0)
		atfork_done = 1;
	ring = shm + *H64(SHM_OFF_DATA);
	ring_mask = *H64(SHM_OFF_DATA_SIZE) - 1;
	cfg_flags = *H32(SHM_OFF_FLAGS) & ~(__u32)SHM_F_FOLLOW;
	my_pid = getpid();
	/* What the last reader was sent, this one was not. */
	memset(chain_keys, 0, sizeof(chain_keys));
	memset(chain_vals, 0, sizeof(chain_vals));
	memset(stacks_sent, 0, sizeof(stacks_sent));
	memset(lock_pages, 0, sizeof(lock_pages));
	lock_page_lo = ~0ULL;
	lock_page_hi = 0;
	lives_reset();
	memset(writing, 0, sizeof(writing));
	writing_shared = 0;
	closing_tid = 0;
	reader_stalled = 0;
	glibc_free = real.free && real.free == dlsym(REAL_SCOPE, "__libc_free");
	shim_gen++; /* every thread sets itself up again */
	__atomic_store_n(&init_state, 2, __ATOMIC_RELEASE);
	active = 1;
	announce_shared();
	instrument_objects();
	ret = nsaved;
out:
	ts.guard = guard;
	errno = saved_errno;
	return ret;
}

/* Stops recording: every rewritten slot gets back what it held (unless
 * something else rewrote it since). Called with every thread stopped.
 * Returns how many slots were restored. */
EXPORT __attribute__((noinline)) long hooktrace_detach(void)
{
	int saved_errno = errno;
	active = 0;
	long n = 0;
	while (nsaved > 0) {
		struct saved_slot *s = &saved[--nsaved];
		if (__atomic_load_n((__u64 *)s->slot, __ATOMIC_ACQUIRE) == s->wrapper && store_slot(s->slot, s->old, s->relro))
			n++;
	}
	errno = saved_errno;
	return n;
}

#else

int inject_patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
	return 0;
}

#endif
