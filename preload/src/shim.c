// SPDX-License-Identifier: GPL-2.0
/* hooktrace's user-space recorder: a library preloaded into the target
 * (LD_PRELOAD) that interposes the allocator, the pthread lock calls and
 * thread start and exit, and writes the records of ../bpf/hooktrace.h into
 * a ring in shared memory that hooktrace reads. The records are exactly the
 * BPF side's, with the same aggregate-mode semantics (a per-thread held set
 * and a chain cache), so everything downstream is shared.
 *
 * Rules of the hot path: no syscall, no allocation inside an interposed
 * allocator function, errno and return values untouched, and a thread-local
 * guard so the shim's own calls (and a signal handler that lands inside the
 * shim) are forwarded unrecorded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <elf.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/auxv.h>
#include <ucontext.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h> /* __u32 and friends, as hooktrace.h uses them */
#include "hooktrace.h"
#include "shm.h"

#define EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define MAX_HELD 8
#define PATTERN_CACHE 64 /* a power of two */

/* ---- the real functions ------------------------------------------------ */

static struct {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*reallocarray)(void *, size_t, size_t);
	void (*free)(void *);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
	int (*mutex_lock)(pthread_mutex_t *);
	int (*mutex_trylock)(pthread_mutex_t *);
	int (*mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
	int (*mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);
	int (*mutex_unlock)(pthread_mutex_t *);
	int (*mutex_init)(pthread_mutex_t *, const pthread_mutexattr_t *);
	int (*mutex_destroy)(pthread_mutex_t *);
	int (*rw_rdlock)(pthread_rwlock_t *);
	int (*rw_wrlock)(pthread_rwlock_t *);
	int (*rw_tryrdlock)(pthread_rwlock_t *);
	int (*rw_trywrlock)(pthread_rwlock_t *);
	int (*rw_timedrdlock)(pthread_rwlock_t *, const struct timespec *);
	int (*rw_timedwrlock)(pthread_rwlock_t *, const struct timespec *);
	int (*rw_clockrdlock)(pthread_rwlock_t *, clockid_t, const struct timespec *);
	int (*rw_clockwrlock)(pthread_rwlock_t *, clockid_t, const struct timespec *);
	int (*rw_unlock)(pthread_rwlock_t *);
	int (*rw_init)(pthread_rwlock_t *, const pthread_rwlockattr_t *);
	int (*rw_destroy)(pthread_rwlock_t *);
	int (*spin_lock)(pthread_spinlock_t *);
	int (*spin_trylock)(pthread_spinlock_t *);
	int (*spin_unlock)(pthread_spinlock_t *);
	int (*spin_init)(pthread_spinlock_t *, int);
	int (*spin_destroy)(pthread_spinlock_t *);
	int (*cond_wait)(pthread_cond_t *, pthread_mutex_t *);
	int (*cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
	int (*cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
	int (*create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	void (*exit)(void *) __attribute__((noreturn));
	pid_t (*fork)(void);
	pid_t (*_Fork)(void);
	pid_t (*vfork)(void);
	int (*execve)(const char *, char *const[], char *const[]);
	int (*execvpe)(const char *, char *const[], char *const[]);
	int (*fexecve)(int, char *const[], char *const[]);
	int (*execveat)(int, const char *, char *const[], char *const[], int);
	int (*spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
		     char *const[], char *const[]);
	int (*spawnp)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
		      char *const[], char *const[]);
	void (*_exit)(int) __attribute__((noreturn));
	/* Reached through GOT slots the shim rewrites, not exported. */
	int (*madvise)(void *, size_t, int);
	int (*munmap)(void *, size_t);
	void *(*mmap)(void *, size_t, int, int, int, off_t);
	void *(*mremap)(void *, size_t, size_t, int, ...);
	int (*brk)(void *);
	void *(*sbrk)(intptr_t);
	void *(*dlopen)(const char *, int);
	void *(*dlmopen)(Lmid_t, const char *, int);
} real;

/* dlsym may call calloc (for its error state) before the real allocator is
 * known: those calls are served from here and never freed. */
static char boot_heap[64 << 10] __attribute__((aligned(16)));
static size_t boot_used;
static __thread int resolving;
struct tstate;
static struct tstate *tstate_self(void);

static void *boot_alloc(size_t n)
{
	n = (n + 15) & ~(size_t)15;
	size_t at = __atomic_fetch_add(&boot_used, n, __ATOMIC_RELAXED);
	if (at + n > sizeof(boot_heap))
		return NULL;
	return boot_heap + at; /* static memory: already zero */
}

static int is_boot(const void *p)
{
	return (const char *)p >= boot_heap && (const char *)p < boot_heap + sizeof(boot_heap);
}

#define RESOLVE(field, name) real.field = dlsym(RTLD_NEXT, name)

static void resolve_real(void)
{
	if (resolving)
		return;
	int saved = errno, guard = *(int *)tstate_self();
	resolving = 1;
	int *g = (int *)tstate_self(); /* guard is the first field */
	*g = 1; /* what dlsym allocates is the shim's, not the target's */
	RESOLVE(calloc, "calloc");
	RESOLVE(malloc, "malloc");
	RESOLVE(realloc, "realloc");
	RESOLVE(reallocarray, "reallocarray");
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
	resolving = 0;
	*(int *)tstate_self() = guard;
	errno = saved;
}

/* ---- process state ------------------------------------------------------ */

static unsigned char *shm;   /* the mapping, NULL when not recording */
static unsigned char *ring;  /* its record area */
static __u64 ring_mask;
static __u32 cfg_flags;
static __u32 my_pid;
static int active;             /* this process records */
static int init_state;         /* 0 not yet, 1 in progress, 2 done */
static int glibc_free;         /* free is glibc's: its chunk headers may be read */
static __u64 sample_seq;       /* sample ids */
static __u64 chain_keys[1 << 16]; /* the chain cache: pattern -> stack */
static __u64 chain_vals[1 << 16];
static __u64 stacks_sent[1 << 12]; /* stack hashes sent (lossy: hooktrace dedups) */

/* Counts lock lifetimes ended in this process: an init or destroy, a free
 * of a chunk that holds a lock, and whatever calls lifetime_changed (the
 * memory wrappers' munmap and mremap). Mixed into every chain-cache key, as
 * the BPF side's lock_epoch is: a lock re-made at an address is a new lock
 * to the analysis, and the patterns the old one was in must be sent again
 * for it. An exec starts a new image with an empty chain cache anyway. */
static __u64 lock_epoch;

/* Pages that hold a lock the analysis was sent (an init, a sent
 * acquisition), as the BPF side's lock_pages: a free of a chunk spanning
 * one must be sent and end the epoch even in aggregate mode, or a lock
 * freed without destroy and re-made at its address (a zeroed mutex needs
 * no init) would merge with the old one. An open-addressed set of page
 * numbers + 1, never emptied; a page that finds no room in its probe window
 * goes unregistered, as an evicted page does on the BPF side. The lowest
 * and highest pages let most frees answer with two compares. */
#define LOCK_PAGE_BITS 14
#define LOCK_PAGE_PROBES 8
static __u64 lock_pages[1 << LOCK_PAGE_BITS];
static __u64 lock_page_lo = ~0ULL, lock_page_hi;
extern void *__libc_stack_end;

/* What a new image needs to record too: the library's path as the loader
 * has it, and the descriptor variable, for an exec whose environment
 * dropped them. */
static char shim_path[4096];
static char shm_env_entry[64];

/* The end of a process image (exit, _exit, exec) kills its other threads
 * wherever they are, in the middle of a record too, which would then be
 * lost. So each thread says when it is writing one, and the thread that
 * ends the image first stops the others from starting one (closing_tid)
 * and waits for those under way. Flags are by counter slot (slots are
 * never reused), one cache line each; threads past the slots share a
 * counter. */
static struct {
	__u32 v;
	char pad[60];
} writing[SHM_SLOTS] __attribute__((aligned(64)));
static __u32 writing_shared;
static __u32 closing_tid;

#define H64(off) ((__u64 *)(shm + (off)))
#define H32(off) ((__u32 *)(shm + (off)))

struct held_lock {
	__u64 addr;
	__u64 stack;
	__u64 time;
	__u32 kind;
	__u16 op;
	__u16 sent;
};

struct tstate {
	int guard;   /* inside the shim: forward unrecorded */
	int inited;  /* for this process (a fork starts again) */
	/* The thread's TID and allocator call, which the kernel's sys_enter
	 * tracepoint reads too (hooktrace_shim_ready). */
	struct shim_alloc_state shared;
	__u64 *calls;   /* this thread's counter slot, NULL for the shared one */
	__u32 *writing; /* its writing flag, NULL for the shared counter */
	int exited;     /* its exit is recorded */
	__u64 stack_hi; /* how far up the thread's stack may be read, 0 when unknown */
	__s32 held;
	__u32 nheld;
	struct held_lock held_locks[MAX_HELD];
	__u64 held_sum; /* held_mix of held_locks' addresses, summed (held_push) */
	/* The patterns this thread last found, by key's low bits: a
	 * registration cache's hot loop has a few dozen (each lock, and each
	 * allocator call site under each lock). */
	__u64 cache_key[PATTERN_CACHE];
	__u64 cache_stack[PATTERN_CACHE];
	/* Return addresses of probed functions, swapped for the exit stub. */
	__u32 nshadow;
	struct shadow {
		__u64 slot; /* where on the stack */
		__u64 ret;  /* what was there */
		__u32 index;
	} shadow[32];
};

static __thread struct tstate ts __attribute__((tls_model("initial-exec")));

/* A vfork child runs on its parent's thread: the same stack, the same
 * thread-local memory. So the thread's state is left as it is for the
 * parent, and the child records nothing until it execs or exits (child is
 * set meanwhile). One level per vfork under way (a child may vfork too):
 * where the call returns to, and the state to give back to the parent. */
#define VFORK_LEVELS 8
static __thread struct {
	int child;
	__u32 depth;
	struct vfork_level {
		__u64 ret;
		int guard;
		int child;
		void *map; /* what the child's exec mapped, for the parent to unmap */
		size_t map_len;
	} levels[VFORK_LEVELS];
} vf __attribute__((tls_model("initial-exec")));

/* This thread is inside fork: the child's fork handlers run before fork
 * returns to it, so a call seen here may be the child's, which must not
 * be recorded as the parent's. */
static __thread int forking __attribute__((tls_model("initial-exec")));
static void after_fork_child(void);

/* Who forks, for the creation record: the parent writes it when the child
 * does not record; a child that records writes it itself, before any
 * record of its own, so the creation comes first in the ring. */
static __thread struct {
	__u32 pid, tid;
	__u64 stack;
} fork_from __attribute__((tls_model("initial-exec")));

static struct tstate *tstate_self(void)
{
	return &ts;
}

extern char probe_exit_stub[] __attribute__((visibility("hidden")));

/* The return address in a stack slot, as the program put it there: a
 * probed function's is swapped for the exit stub while it runs. */
static __u64 real_ret(struct tstate *t, __u64 slot, __u64 v)
{
	if (v != (__u64)probe_exit_stub)
		return v;
	for (__u32 i = t->nshadow; i-- > 0;)
		if (t->shadow[i].slot == slot)
			return t->shadow[i].ret;
	return v;
}

/* The shim's own image: its frames (a thread's start routine returns into
 * thread_start) are not the target's. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern const char _end[] __attribute__((visibility("hidden")));

static int in_shim(__u64 pc)
{
	return pc >= (__u64)__ehdr_start && pc < (__u64)_end;
}

static __u64 now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t); /* the vDSO: no syscall */
	return (__u64)t.tv_sec * 1000000000ULL + (__u64)t.tv_nsec;
}

/* Keeps what an exec's new environment needs (see exec_env). */
static void remember_env(int fd)
{
	Dl_info di;
	if (dladdr((void *)remember_env, &di) && di.dli_fname && strlen(di.dli_fname) < sizeof(shim_path))
		strcpy(shim_path, di.dli_fname);
	char digits[16];
	int n = 0;
	do
		digits[n++] = (char)('0' + fd % 10);
	while ((fd /= 10) > 0);
	size_t at = strlen(SHM_ENV);
	memcpy(shm_env_entry, SHM_ENV, at);
	shm_env_entry[at++] = '=';
	while (n > 0)
		shm_env_entry[at++] = digits[--n];
	shm_env_entry[at] = 0;
}

/* The kernel's sys_enter tracepoint reads a thread's t->shared at the
 * thread pointer plus offset, once its uprobe on this function has
 * learned offset: a memory syscall glibc makes inside free is then
 * flagged as inside that free, as the shim's own records are. Exported
 * and never inlined, so the probe has a symbol to attach to and offset
 * is in the first argument register. */
EXPORT __attribute__((noinline)) void hooktrace_shim_ready(long offset)
{
	__asm__ volatile("" : : "r"(offset) : "memory");
}

/* Names the offset of t->shared from the thread pointer to the kernel
 * side, once per process image that records. ts is initial-exec TLS, at
 * one offset from every thread's thread pointer (%fs:0 holds the
 * pointer itself, which the kernel keeps as the task's fsbase). */
static void announce_shared(void)
{
	unsigned long tp;
	__asm__("mov %%fs:0, %0" : "=r"(tp));
	hooktrace_shim_ready((long)((unsigned long)&ts.shared - tp));
}

/* Maps the memfd hooktrace passed, once per process image; returns
 * whether this call did it. */
static int init_process(void)
{
	int expected = 0;
	if (!__atomic_compare_exchange_n(&init_state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0;
	int saved = errno;
	if (!real.malloc)
		resolve_real();
	const char *v = getenv(SHM_ENV);
	int fd = -1;
	if (v) {
		fd = 0;
		for (; *v >= '0' && *v <= '9'; v++)
			fd = fd * 10 + (*v - '0');
	}
	struct stat st;
	/* One mapping of the whole memfd, sized by fstat: the recorder's own
	 * memory syscalls are kept to one. */
	if (fd > 0 && fstat(fd, &st) == 0 && st.st_size >= SHM_HEADER_BYTES) {
		void *all = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (all != MAP_FAILED && *(__u64 *)all == SHM_MAGIC &&
		    *(__u64 *)((unsigned char *)all + SHM_OFF_DATA) + *(__u64 *)((unsigned char *)all + SHM_OFF_DATA_SIZE) <=
			    (__u64)st.st_size) {
			shm = all;
			ring = shm + *H64(SHM_OFF_DATA);
			ring_mask = *H64(SHM_OFF_DATA_SIZE) - 1;
			cfg_flags = *H32(SHM_OFF_FLAGS);
			my_pid = getpid();
			active = my_pid == *H32(SHM_OFF_TRACED) || (cfg_flags & SHM_F_FOLLOW);
			remember_env(fd);
			if (active)
				announce_shared();
		} else if (all != MAP_FAILED) {
			munmap(all, (size_t)st.st_size);
		}
	}
	glibc_free = real.free && real.free == dlsym(RTLD_NEXT, "__libc_free");
	errno = saved;
	__atomic_store_n(&init_state, 2, __ATOMIC_RELEASE);
	return 1;
}

/* ---- lock lifetimes ----------------------------------------------------- */

/* Ends the chain cache's patterns: every lock-lifetime end calls this. A
 * wrapper of munmap or mremap must call it too (the BPF side bumps its
 * epoch at both syscalls): the locks in what they unmap or move end
 * (rec_unmap). */
static void lifetime_changed(void)
{
	__atomic_fetch_add(&lock_epoch, 1, __ATOMIC_RELAXED);
}

static __u32 lock_page_slot(__u64 page, __u32 i)
{
	return (__u32)(((page * 0x9e3779b97f4a7c15ULL) >> (64 - LOCK_PAGE_BITS)) + i) & ((1 << LOCK_PAGE_BITS) - 1);
}

static void lock_page_add(__u64 lock)
{
	__u64 page = lock >> 12;
	for (__u32 i = 0; i < LOCK_PAGE_PROBES; i++) {
		__u64 *slot = &lock_pages[lock_page_slot(page, i)], have = 0;
		if (__atomic_compare_exchange_n(slot, &have, page + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			break;
		if (have == page + 1)
			return;
	}
	/* The bounds only widen, and only at a page's first sighting. */
	__u64 lo = __atomic_load_n(&lock_page_lo, __ATOMIC_RELAXED);
	while (page < lo && !__atomic_compare_exchange_n(&lock_page_lo, &lo, page, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	__u64 hi = __atomic_load_n(&lock_page_hi, __ATOMIC_RELAXED);
	while (page > hi && !__atomic_compare_exchange_n(&lock_page_hi, &hi, page, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static int lock_page_has(__u64 page)
{
	for (__u32 i = 0; i < LOCK_PAGE_PROBES; i++) {
		__u64 v = __atomic_load_n(&lock_pages[lock_page_slot(page, i)], __ATOMIC_RELAXED);
		if (v == page + 1)
			return 1;
		if (v == 0)
			return 0;
	}
	return 0;
}

/* A freed chunk of up to this many pages (256 KiB) is checked page by
 * page; a larger one within the bounds is taken to hold a lock. */
#define FREE_CHECK_PAGES 64

/* Whether freeing the glibc chunk at p may end a lock's lifetime: a page
 * it spans holds a lock. The BPF side skips chunks glibc mmapped, whose
 * munmap it sees and ends the epoch at; the shim's record of that munmap
 * (rec_free_munmap) does not, so such chunks are checked like any other.
 * Another allocator's chunk has no size the shim can read, and its free no
 * size the analysis could end locks by. */
static int free_covers_lock(__u64 p, __u64 size)
{
	if (!p || !size)
		return 0;
	__u64 first = p >> 12, last = (p + size - 1) >> 12;
	if (last < __atomic_load_n(&lock_page_lo, __ATOMIC_RELAXED) ||
	    first > __atomic_load_n(&lock_page_hi, __ATOMIC_RELAXED))
		return 0;
	if (last - first >= FREE_CHECK_PAGES)
		return 1;
	for (__u64 page = first; page <= last; page++)
		if (lock_page_has(page))
			return 1;
	return 0;
}

/* ---- the ring ----------------------------------------------------------- */

static void count_lost(__u32 type)
{
	__atomic_fetch_add(H64(SHM_OFF_LOST) + (type & 3), 1, __ATOMIC_RELAXED);
}

/* A short sleep that is not a cancellation point (nanosleep is one): the
 * shim must not add one to a call that has none. */
static void pause_10us(void)
{
	struct timespec ts10 = {0, 10000};
	syscall(SYS_nanosleep, &ts10, NULL);
}

/* Starts a record; returns 0 when the image is ending in another thread,
 * whose end would cut the record short: the call is counted, not
 * recorded. */
static int write_begin(void)
{
	__u32 *flag = ts.writing;
	if (likely(flag != NULL)) {
		/* An exchange, for the full barrier before closing_tid is read
		 * (cheaper than a store and mfence). */
		__atomic_exchange_n(flag, 1, __ATOMIC_SEQ_CST);
	} else {
		__atomic_fetch_add(&writing_shared, 1, __ATOMIC_SEQ_CST);
	}
	__u32 closing = __atomic_load_n(&closing_tid, __ATOMIC_RELAXED);
	if (unlikely(closing != 0) && closing != ts.shared.tid) {
		if (flag)
			__atomic_store_n(flag, 0, __ATOMIC_RELEASE);
		else
			__atomic_fetch_sub(&writing_shared, 1, __ATOMIC_RELEASE);
		return 0;
	}
	return 1;
}

static void write_end(void)
{
	if (likely(ts.writing != NULL))
		__atomic_store_n(ts.writing, 0, __ATOMIC_RELEASE);
	else
		__atomic_fetch_sub(&writing_shared, 1, __ATOMIC_RELEASE);
}

static void wait_unflagged(__u32 *flag)
{
	/* Bounded like a writer's wait for room: a writer waiting for the
	 * reader finishes within it. */
	for (unsigned k = 0; __atomic_load_n(flag, __ATOMIC_ACQUIRE) && k < 40000; k++) {
		if (k < 64)
			__builtin_ia32_pause();
		else
			pause_10us();
	}
}

/* This thread ends the image: no other thread starts a record from now on,
 * and the records under way are finished first. */
static void end_writes(struct tstate *self)
{
	__atomic_store_n(&closing_tid, self->shared.tid, __ATOMIC_SEQ_CST);
	__u32 n = __atomic_load_n(H32(SHM_OFF_NEXT_SLOT), __ATOMIC_RELAXED);
	if (n > SHM_SLOTS)
		n = SHM_SLOTS;
	for (__u32 i = 0; i < n; i++)
		if (&writing[i].v != self->writing)
			wait_unflagged(&writing[i].v);
	wait_unflagged(&writing_shared);
}

/* Reserves room for a body of len bytes and returns where it goes, or NULL
 * (counted as lost) when the reader has not made room within a bounded
 * wait. *seq_at receives the position to publish. */
static int reader_stalled;

static unsigned char *ring_reserve(__u32 len, __u64 *pos_out)
{
	__u64 need = (SHM_REC_HDR + len + 15) & ~15ULL, size = ring_mask + 1;
	__u64 *headp = H64(SHM_OFF_HEAD), *tailp = H64(SHM_OFF_TAIL);
	unsigned waited = 0;
	for (;;) {
		__u64 head = __atomic_load_n(headp, __ATOMIC_RELAXED);
		__u64 off = head & ring_mask, pad = 0;
		if (off + need > size)
			pad = size - off;
		__u64 tail = __atomic_load_n(tailp, __ATOMIC_ACQUIRE);
		if (head + pad + need - tail > size) {
			/* Full: wait for the reader, boundedly; a reader that never
			 * comes back (hooktrace killed) must not hang the target. */
			if (reader_stalled || waited > 20000)
				return NULL;
			waited++;
			if (waited < 64) {
				__builtin_ia32_pause();
			} else if (waited < 20000) {
				pause_10us();
				if (waited == 19999)
					reader_stalled = 1;
			}
			continue;
		}
		reader_stalled = 0;
		if (!__atomic_compare_exchange_n(headp, &head, head + pad + need, 0, __ATOMIC_ACQ_REL,
						 __ATOMIC_RELAXED))
			continue;
		if (pad) {
			unsigned char *p = ring + off;
			*(__u32 *)(p + 8) = (__u32)(pad - SHM_REC_HDR);
			*(__u32 *)(p + 12) = SHM_KIND_PAD;
			__atomic_store_n((__u64 *)p, head + 1, __ATOMIC_RELEASE);
		}
		__u64 pos = head + pad;
		unsigned char *p = ring + (pos & ring_mask);
		*(__u32 *)(p + 8) = len;
		*(__u32 *)(p + 12) = SHM_KIND_DATA;
		*pos_out = pos;
		return p + SHM_REC_HDR;
	}
}

static void ring_commit(unsigned char *body, __u64 pos)
{
	__atomic_store_n((__u64 *)(body - SHM_REC_HDR), pos + 1, __ATOMIC_RELEASE);
}

static void ring_output(const void *rec, __u32 len, __u32 type)
{
	if (!write_begin())
		return;
	__u64 pos;
	unsigned char *p = ring_reserve(len, &pos);
	if (!p) {
		count_lost(type);
	} else {
		memcpy(p, rec, len);
		ring_commit(p, pos);
	}
	write_end();
}

/* ---- threads ------------------------------------------------------------ */

static void count_call(struct tstate *t, __u32 op)
{
	/* One instruction, so a signal handler's count on this thread (which
	 * lands between instructions) is never lost; no lock prefix: the
	 * slot has one writer. */
	if (likely(t->calls != NULL))
		__asm__ volatile("incq %0" : "+m"(t->calls[op]));
	else
		__atomic_fetch_add(H64(SHM_OFF_SHARED) + op, 1, __ATOMIC_RELAXED);
}

/* Sets up a thread's state for this process: its TID (one syscall per
 * thread), its counter slot. */
static void thread_init(struct tstate *t)
{
	int saved = errno;
	memset(t, 0, sizeof(*t));
	t->shared.tid = (__u32)syscall(SYS_gettid);
	__u32 slot = __atomic_fetch_add(H32(SHM_OFF_NEXT_SLOT), 1, __ATOMIC_RELAXED);
	if (slot < SHM_SLOTS) {
		t->calls = H64(SHM_OFF_SLOTS) + (__u64)slot * SHM_SLOT_OPS;
		t->writing = &writing[slot].v;
	}
	if (t->shared.tid == my_pid)
		t->stack_hi = (__u64)__libc_stack_end;
	t->inited = 1;
	errno = saved;
}

/* The calling thread's state when it records, or NULL. Sets the guard. */
static void exec_event(struct tstate *t);

static struct tstate *enter(void)
{
	struct tstate *t = &ts;
	if (t->guard)
		return NULL;
	int first = 0;
	if (unlikely(__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2)) {
		t->guard = 1;
		first = init_process();
		t->guard = 0;
		if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2)
			return NULL;
	}
	if (unlikely(forking) && (__u32)getpid() != my_pid)
		after_fork_child();
	if (!active)
		return NULL;
	t->guard = 1;
	if (unlikely(!t->inited))
		thread_init(t);
	if (unlikely(first))
		exec_event(t);
	return t;
}

/* enter for an interposed call of op. Inside the shim (the guard is set)
 * the call is forwarded unrecorded, but counted when it is the target's:
 * a signal handler that interrupted the shim, not the shim's own
 * bootstrap. */
static struct tstate *enter_op(__u32 op)
{
	struct tstate *t = &ts;
	if (unlikely(t->guard)) {
		if (t->inited && active && !resolving && !vf.child)
			count_call(t, op);
		return NULL;
	}
	return enter();
}

static void leave(struct tstate *t)
{
	t->guard = 0;
}

/* ---- stacks ------------------------------------------------------------- */

/* The frame-pointer chain from an interposer's frame: fn (the real
 * function, where the BPF side's probe would be), the caller's return
 * address, then the caller's chain. Every frame read is checked to lie on
 * the live stack, so code built without frame pointers (which leaves
 * anything in rbp) ends the walk instead of faulting. At a return (fn 0)
 * the caller comes first, as at the BPF side's return probes. */
static __u32 walk(struct tstate *t, __u64 *ips, __u64 fn, __u64 *frame, int *truncated)
{
	__u32 n = 0;
	if (fn)
		ips[n++] = fn;
	ips[n++] = frame[1];
	__u64 lo = (__u64)frame, hi = t->stack_hi;
	__u64 fp = frame[0];
	while (n < MAX_FRAMES) {
		if (!hi || fp <= lo || fp + 16 > hi || (fp & 7))
			break;
		__u64 *f = (__u64 *)fp;
		__u64 ra = real_ret(t, fp + 8, f[1]);
		if (!ra)
			break;
		if (!in_shim(ra))
			ips[n++] = ra;
		lo = fp;
		fp = f[0];
	}
	*truncated = n == MAX_FRAMES;
	return n;
}

/* Sends the stack in r (once per hash, as far as this process knows) and
 * returns its hash. */
static __u64 send_stack(struct stack *r, __u32 nr, int truncated)
{
	__u64 hash = 0xcbf29ce484222325ULL ^ my_pid;
	for (__u32 i = 0; i < nr; i++) {
		hash ^= r->ips[i];
		hash *= 0x100000001b3ULL;
	}
	hash &= ~(1ULL << 63); /* the top bit marks sample ids */
	if (!hash)
		hash = 1;
	__u64 *slot = &stacks_sent[hash & ((1 << 12) - 1)];
	if (__atomic_load_n(slot, __ATOMIC_RELAXED) == hash)
		return hash;
	r->type = REC_STACK;
	r->nr = nr;
	r->pid = my_pid;
	r->truncated = truncated;
	r->hash = hash;
	memset(&r->ips[nr], 0, (MAX_FRAMES - nr) * sizeof(__u64));
	ring_output(r, sizeof(*r), REC_STACK);
	__atomic_store_n(slot, hash, __ATOMIC_RELAXED);
	return hash;
}

static __u64 take_stack(struct tstate *t, __u64 fn, __u64 *frame)
{
	struct stack r;
	int truncated;
	__u32 nr = walk(t, r.ips, fn, frame, &truncated);
	return send_stack(&r, nr, truncated);
}

/* Raw stack memory from sp up, with the registers a probe at ip would
 * see, for hooktrace's .eh_frame unwinder; returns its id (top bit set). */
static __u64 take_sample_regs(struct tstate *t, __u64 ip, __u64 sp, __u64 bp, __u64 until)
{
	__u64 len = SAMPLE_BYTES;
	if (until > sp && until - sp + 2048 < len)
		len = until - sp + 2048;
	/* Only the live stack may be read. */
	__u64 top = t->stack_hi ? t->stack_hi : (until > sp ? until : sp) + 16;
	if (sp + len > top)
		len = top > sp ? top - sp : 0;
	len &= ~7ULL;
	if (len < 16)
		return 0;
	if (!write_begin())
		return 0;
	__u64 pos;
	unsigned char *p = ring_reserve(sizeof(struct sample), &pos);
	if (!p) {
		count_lost(REC_SAMPLE);
		write_end();
		return 0;
	}
	struct sample *r = (struct sample *)p;
	__u64 id = (1ULL << 63) | ((__u64)t->shared.tid << 32) |
		   (__atomic_fetch_add(&sample_seq, 1, __ATOMIC_RELAXED) & 0xffffffff);
	r->type = REC_SAMPLE;
	r->len = (__u32)len;
	r->pid = my_pid;
	r->pad = 0;
	r->hash = id;
	r->ip = ip;
	r->sp = sp;
	r->bp = bp;
	memcpy(r->data, (void *)sp, len);
	for (__u32 i = 0; i < t->nshadow; i++) {
		__u64 slot = t->shadow[i].slot;
		if (slot >= sp && slot + 8 <= sp + len)
			memcpy(r->data + (slot - sp), &t->shadow[i].ret, 8);
	}
	ring_commit(p, pos);
	write_end();
	return id;
}

/* A sample from an interposer's return-address slot up, with the
 * registers a probe at fn's entry would see. */
static __u64 take_sample(struct tstate *t, __u64 fn, __u64 *frame)
{
	return take_sample_regs(t, fn, (__u64)&frame[1], frame[0], t->shared.alloc_sp);
}

/* ---- events ------------------------------------------------------------- */

static void event_init(struct event *e, struct tstate *t, __u32 op)
{
	memset(e, 0, sizeof(*e));
	e->type = REC_EVENT;
	e->op = op;
	e->pid = my_pid;
	e->tid = t->shared.tid;
	e->time = now();
}

static void event_send(struct event *e)
{
	ring_output(e, sizeof(*e), REC_EVENT);
}

/* A sample inside an allocator call, a frame-pointer stack otherwise. */
static void send_with_stack(struct tstate *t, struct event *e, __u64 fn, __u64 *frame)
{
	if ((e->flags & F_IN_ALLOC) && (cfg_flags & SHM_F_SAMPLES) && fn)
		e->stack = take_sample(t, fn, frame);
	if (!e->stack)
		e->stack = take_stack(t, fn, frame);
	event_send(e);
}

/* The lock's attributes the analyzer uses, as Event.Arg: a mutex's type
 * (__kind, offset 16 on x86-64 glibc), a rwlock's preference (__flags,
 * offset 48: PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP makes reads
 * queue behind writers). */
static __u32 mutex_kind(__u32 op, __u64 lock)
{
	if (!lock)
		return 0;
	if (op >= OP_MUTEX_LOCK && op <= OP_MUTEX_DESTROY)
		return *(__u32 *)(lock + 16);
	if (op >= OP_RWLOCK_RDLOCK && op <= OP_RWLOCK_CLOCKWRLOCK)
		return *(__u32 *)(lock + 48);
	return 0;
}

/* The held set's part of a chain key, kept as the locks come and go
 * rather than hashed on every call: a sum (not a xor) of each address
 * mixed, so that a lock held twice still counts. The edges an acquisition
 * adds do not depend on the order the held locks were taken in. */
static inline __u64 held_mix(__u64 addr)
{
	addr ^= addr >> 31;
	return addr * 0xbf58476d1ce4e5b9ULL;
}

static void held_push(struct tstate *t, __u64 addr, __u32 op, __u32 kind, __u64 stack, __u64 time, __u16 sent)
{
	__u32 i = t->nheld;
	if (i >= MAX_HELD)
		return;
	t->held_locks[i] = (struct held_lock){addr, stack, time, kind, (__u16)op, sent};
	t->nheld = i + 1;
	t->held_sum += held_mix(addr);
}

static int held_pop(struct tstate *t, __u64 addr)
{
	for (int i = (int)t->nheld - 1; i >= 0; i--) {
		if (t->held_locks[i].addr != addr)
			continue;
		int sent = t->held_locks[i].sent;
		for (__u32 j = i; j + 1 < t->nheld; j++)
			t->held_locks[j] = t->held_locks[j + 1];
		t->nheld--;
		t->held_sum -= held_mix(addr);
		return sent;
	}
	return -1;
}

/* The chain key: independent products the CPU multiplies in parallel,
 * then one finalizer, so that the low bits (the caches' index) mix all. */
static __u64 pattern_key(struct tstate *t, __u32 op, __u64 lock, __u64 site)
{
	__u64 h = t->held_sum;
	h += (lock ^ 0x9e3779b97f4a7c15ULL) * 0x94d049bb133111ebULL;
	h += (site ^ 0xc2b2ae3d27d4eb4fULL) * 0xff51afd7ed558ccdULL;
	h += ((__u64)op | ((__u64)my_pid << 32)) * 0xc4ceb9fe1a85ec53ULL;
	h += __atomic_load_n(&lock_epoch, __ATOMIC_RELAXED) * 0x165667b19e3779f9ULL;
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	return h ? h : 1;
}

static void flush_held(struct tstate *t)
{
	for (__u32 i = 0; i < t->nheld; i++) {
		struct held_lock *h = &t->held_locks[i];
		if (h->sent)
			continue;
		struct event fe;
		event_init(&fe, t, h->op);
		if (h->time)
			fe.time = h->time;
		fe.addr = h->addr;
		fe.arg = mutex_kind(h->op, h->addr);
		fe.stack = h->stack;
		fe.flags = F_ACQUIRED | (i > 0 ? F_LOCKS_HELD : 0);
		event_send(&fe);
		h->sent = 1;
	}
}

#define CHAIN_MASK ((1 << 16) - 1)

/* The stack hash a pattern was sent with (bit 62 set, so never 0), or 0
 * when the pattern is new. */
static __u64 pattern_seen(struct tstate *t, __u64 key)
{
	__u32 c = key & (PATTERN_CACHE - 1);
	if (t->cache_key[c] == key)
		return t->cache_stack[c];
	for (__u32 i = 0; i < 8; i++) {
		__u32 at = (key + i) & CHAIN_MASK;
		__u64 k = __atomic_load_n(&chain_keys[at], __ATOMIC_ACQUIRE);
		if (k == 0)
			return 0;
		if (k == key) {
			t->cache_key[c] = key;
			t->cache_stack[c] = __atomic_load_n(&chain_vals[at], __ATOMIC_RELAXED) | (1ULL << 62);
			return t->cache_stack[c];
		}
	}
	return 0;
}

static void pattern_sent(struct tstate *t, __u64 key, __u64 stack)
{
	for (__u32 i = 0; i < 8; i++) {
		__u32 at = (key + i) & CHAIN_MASK;
		__u64 zero = 0;
		if (__atomic_compare_exchange_n(&chain_keys[at], &zero, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED) ||
		    zero == key) {
			__atomic_store_n(&chain_vals[at], stack, __ATOMIC_RELAXED);
			break;
		}
	}
	__u32 c = key & (PATTERN_CACHE - 1);
	t->cache_key[c] = key;
	t->cache_stack[c] = stack | (1ULL << 62);
}

static int dedupable(struct tstate *t)
{
	return !(cfg_flags & SHM_F_FULL) && t->held >= 0 && (__u32)t->held == t->nheld;
}

static void alloc_context(struct tstate *t, struct event *e)
{
	if (!t->shared.alloc_depth)
		return;
	e->flags |= F_IN_ALLOC;
	e->addr2 = t->shared.alloc_op | ((__u64)t->shared.alloc_seq << 16);
}

/* An allocator call's entry. Returns nothing: the call is made by the
 * interposer, inside alloc_depth. */
static void rec_alloc(struct tstate *t, __u32 op, __u64 fn, __u64 *frame, __u64 addr, __u64 size, __u64 arg)
{
	count_call(t, op);
	int nested = t->shared.alloc_depth > 0;
	__u64 outer = t->shared.alloc_op | ((__u64)t->shared.alloc_seq << 16);
	if (!nested) {
		t->shared.alloc_seq++;
		t->shared.alloc_op = op;
		t->shared.alloc_sp = (__u64)&frame[1];
	}
	/* A free that may end a lock's lifetime is sent: the analysis ends
	 * the locks in the chunk it names. */
	int covers = 0;
	if (!(cfg_flags & SHM_F_FULL) && !nested && op == OP_FREE && (covers = free_covers_lock(addr, size)))
		lifetime_changed();
	if (!(cfg_flags & SHM_F_FULL) && !nested && !covers && t->held <= 0)
		return;
	__u64 key = 0;
	if (!nested && !covers && dedupable(t)) {
		key = pattern_key(t, op, 0, frame[1]);
		if (pattern_seen(t, key))
			return;
	}
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	if (nested) {
		e.flags |= F_IN_ALLOC;
		e.addr2 = outer;
	}
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	e.addr = addr;
	e.size = size;
	e.arg = arg;
	send_with_stack(t, &e, fn, frame);
	if (key)
		pattern_sent(t, key, e.stack);
}

/* A blocking acquisition, recorded at entry as the BPF side does: a thread
 * that then blocks for good is seen waiting. */
static void rec_acquire(struct tstate *t, __u32 op, __u64 lock, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	__u64 key = 0;
	if (dedupable(t) && t->nheld < MAX_HELD && !t->shared.alloc_depth) {
		key = pattern_key(t, op, lock, 0);
		__u64 known = pattern_seen(t, key);
		if (known) {
			/* No clock read here (the vDSO's is a fifth of this path):
			 * if the acquisition is ever sent, flush_held stamps it. */
			held_push(t, lock, op, 0, known & ~(1ULL << 62), 0, 0);
			t->held++;
			return;
		}
	}
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	e.arg = mutex_kind(op, lock);
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	e.flags |= F_ACQUIRED;
	alloc_context(t, &e);
	send_with_stack(t, &e, fn, frame);
	held_push(t, lock, op, (__u32)e.arg, e.stack, e.time, 1);
	t->held++;
	lock_page_add(lock);
	if (key)
		pattern_sent(t, key, e.stack);
}

static void rec_release(struct tstate *t, __u32 op, __u64 lock)
{
	count_call(t, op);
	int sent = held_pop(t, lock);
	if (t->held > 0)
		t->held--;
	if (sent == 0)
		return; /* its acquisition was only counted: so is its release */
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	event_send(&e);
}

/* A try, timed or clock acquisition's result (counted at entry). */
static void rec_try_result(struct tstate *t, __u32 op, __u64 lock, __u64 addr2, int ret, __u64 *frame)
{
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.flags = F_RETURN;
	e.addr = lock;
	e.addr2 = addr2;
	e.ret = ret;
	if (ret == 0) {
		e.flags |= F_ACQUIRED;
		t->held++;
	}
	e.arg = mutex_kind(op, lock);
	if (t->held > 1 || (!(e.flags & F_ACQUIRED) && t->held > 0))
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	send_with_stack(t, &e, 0, frame);
	if (e.flags & F_ACQUIRED) {
		held_push(t, lock, op, (__u32)e.arg, e.stack, e.time, 1);
		lock_page_add(lock);
	}
}

/* An init or destroy: the lock's lifetime ends (re-initialising a live
 * lock ends it too), so every pattern is new again. An init is sent with
 * its stack, which names a heap lock, and registers the lock's page; a
 * destroy goes without, as on the BPF side. */
static void rec_lifetime(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	lifetime_changed();
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	e.arg = arg;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	if (!frame) {
		event_send(&e);
		return;
	}
	send_with_stack(t, &e, fn, frame);
	lock_page_add(lock);
}

/* ---- the allocator ------------------------------------------------------ */

#define FRAME ((__u64 *)__builtin_frame_address(0))
#define ENSURE(field)                   \
	do {                            \
		if (unlikely(!real.field)) \
			resolve_real(); \
	} while (0)

/* An allocator interposer: record, then call inside the depth counter, so
 * that what the allocator does meanwhile (a hook it runs) is flagged. */
static void rec_alloc_mmap(struct tstate *t, void *p, __u64 fn, __u64 *frame);

#define ALLOC_CALL(op, field, rtype, call, addr, size, arg, fresh)                            \
	struct tstate *t = enter_op(op);                                                            \
	if (!t)                                                                                \
		return call;                                                                   \
	rec_alloc(t, op, (__u64)real.field, FRAME, (__u64)(addr), (__u64)(size), (__u64)(arg)); \
	t->shared.alloc_depth++;                                                               \
	leave(t);                                                                              \
	rtype r = call;                                                                        \
	rec_alloc_mmap(t, (fresh), (__u64)real.field, FRAME);                                 \
	t->shared.alloc_depth--;                                                               \
	if (!t->shared.alloc_depth)                                                            \
		t->shared.alloc_sp = 0;                                                        \
	return r;

EXPORT void *malloc(size_t n)
{
	if (unlikely(!real.malloc)) {
		if (resolving)
			return boot_alloc(n);
		resolve_real();
	}
	ALLOC_CALL(OP_MALLOC, malloc, void *, real.malloc(n), 0, n, 0, r)
}

EXPORT void *calloc(size_t n, size_t m)
{
	if (unlikely(!real.calloc)) {
		if (resolving)
			return boot_alloc(n * m);
		resolve_real();
	}
	ALLOC_CALL(OP_CALLOC, calloc, void *, real.calloc(n, m), 0, n * m, 0, r)
}

EXPORT void *realloc(void *p, size_t n)
{
	if (unlikely(!real.realloc)) {
		if (resolving)
			return boot_alloc(n);
		resolve_real();
	}
	if (unlikely(is_boot(p))) {
		/* From the bootstrap heap: move it to the real allocator. */
		void *q = real.malloc(n);
		if (q)
			memcpy(q, p, n < 256 ? n : 256);
		return q;
	}
	ALLOC_CALL(OP_REALLOC, realloc, void *, real.realloc(p, n), p, n, 0, NULL)
}

EXPORT void *reallocarray(void *p, size_t n, size_t m)
{
	ENSURE(reallocarray);
	ALLOC_CALL(OP_REALLOC, reallocarray, void *, real.reallocarray(p, n, m), p, n * m, 0, NULL)
}

/* The size free releases, from glibc's chunk header (as the BPF side reads
 * it); 0 for another allocator's pointers would be wrong, so only glibc's
 * layout is assumed where the BPF side assumes it. */
static size_t chunk_size(void *p)
{
	if (!p || !glibc_free)
		return 0;
	return (((__u64 *)p)[-1] & ~7ULL) - 8;
}

/* glibc's free gives a chunk it mmapped back with munmap, by a call inside
 * libc that no interposition sees; a runtime's hook patched into munmap's
 * entry runs there. The chunk's header says which chunks those are and
 * where their mapping starts. */
struct mapping {
	__u64 addr, len;
};

static struct mapping mmapped_chunk(void *p)
{
	struct mapping m = {0, 0};
	if (!p || !glibc_free)
		return m;
	__u64 hdr = ((__u64 *)p)[-1], prev = ((__u64 *)p)[-2];
	if (!(hdr & 2)) /* IS_MMAPPED */
		return m;
	m.addr = (__u64)p - 16 - prev;
	m.len = prev + (hdr & ~7ULL);
	return m;
}

/* The munmap that free made, sent once free returns (what a hook took
 * meanwhile is recorded already, as it precedes the system call the BPF
 * side sees), inside the free, as the BPF side's sys_enter sends every
 * munmap: the analysis learns the hook ran under the locks held around
 * free without taking them again. Its stack is free's own, which tells
 * the analysis glibc holds no arena lock there. Where the kernel's
 * tracepoint is added, the kernel records it, flagged inside the free. */
static void rec_free_munmap(struct tstate *t, struct mapping m, __u64 *frame)
{
	count_call(t, OP_MUNMAP);
	struct event e;
	event_init(&e, t, OP_MUNMAP);
	e.addr = m.addr;
	e.size = m.len;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	e.stack = take_stack(t, (__u64)real.free, frame);
	event_send(&e);
}

/* glibc maps a chunk above its mmap threshold with its own mmap, inside
 * the allocator call, which no interposition sees: sent once the call
 * returns, inside it, with the fields the BPF side's sys_enter gives that
 * mmap (no address asked for, the mapping's length, read-write, private
 * and anonymous), so the preload recorder alone counts a program's mapped
 * blocks as the kernel does. realloc is left out: it may move a mapped
 * chunk with mremap instead. Under the kernel's tracepoint the kernel
 * records it. */
static void rec_alloc_mmap(struct tstate *t, void *p, __u64 fn, __u64 *frame)
{
	struct mapping m = mmapped_chunk(p);
	if (likely(!m.len) || (cfg_flags & SHM_F_SYSCALLS) || t->guard)
		return;
	t->guard = 1;
	count_call(t, OP_MMAP);
	struct event e;
	event_init(&e, t, OP_MMAP);
	e.size = m.len;
	e.arg = (__u64)(PROT_READ | PROT_WRITE) | ((__u64)(MAP_PRIVATE | MAP_ANONYMOUS) << 32);
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	e.stack = take_stack(t, fn, frame);
	event_send(&e);
	leave(t);
}

EXPORT void free(void *p)
{
	if (unlikely(is_boot(p)))
		return;
	if (unlikely(!real.free)) {
		if (resolving)
			return;
		resolve_real();
	}
	struct tstate *t = enter_op(OP_FREE);
	if (!t) {
		real.free(p);
		return;
	}
	rec_alloc(t, OP_FREE, (__u64)real.free, FRAME, (__u64)p, chunk_size(p), 0);
	struct mapping unmapped = mmapped_chunk(p);
	t->shared.alloc_depth++;
	leave(t);
	real.free(p);
	if (unmapped.len && !t->guard && !(cfg_flags & SHM_F_SYSCALLS)) {
		t->guard = 1;
		rec_free_munmap(t, unmapped, FRAME);
		leave(t);
	}
	t->shared.alloc_depth--;
	if (!t->shared.alloc_depth)
		t->shared.alloc_sp = 0;
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	ENSURE(posix_memalign);
	ALLOC_CALL(OP_POSIX_MEMALIGN, posix_memalign, int, real.posix_memalign(out, align, n), 0, n, align, r ? NULL : *out)
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	ENSURE(aligned_alloc);
	ALLOC_CALL(OP_ALIGNED_ALLOC, aligned_alloc, void *, real.aligned_alloc(align, n), 0, n, align, r)
}

EXPORT void *memalign(size_t align, size_t n)
{
	ENSURE(memalign);
	ALLOC_CALL(OP_MEMALIGN, memalign, void *, real.memalign(align, n), 0, n, align, r)
}

EXPORT void *valloc(size_t n)
{
	ENSURE(valloc);
	ALLOC_CALL(OP_VALLOC, valloc, void *, real.valloc(n), 0, n, 0, r)
}

EXPORT void *pvalloc(size_t n)
{
	ENSURE(pvalloc);
	ALLOC_CALL(OP_PVALLOC, pvalloc, void *, real.pvalloc(n), 0, n, 0, r)
}

/* ---- locks -------------------------------------------------------------- */

#define ACQUIRE(op, field, call, lock)                              \
	ENSURE(field);                                              \
	struct tstate *t = enter_op(op);                                 \
	if (t) {                                                    \
		rec_acquire(t, op, (__u64)(lock), (__u64)real.field, FRAME); \
		leave(t);                                           \
	}                                                           \
	return call;

#define TRY(op, field, call, lock, addr2)                    \
	ENSURE(field);                                       \
	struct tstate *t = enter_op(op);                          \
	if (!t)                                              \
		return call;                                 \
	count_call(t, op);                                   \
	leave(t);                                            \
	int r = call;                                        \
	if (!t->guard) {                                     \
		t->guard = 1;                                \
		rec_try_result(t, op, (__u64)(lock), (__u64)(addr2), r, FRAME); \
		leave(t);                                    \
	}                                                    \
	return r;

#define RELEASE(op, field, call, lock)       \
	ENSURE(field);                       \
	struct tstate *t = enter_op(op);          \
	if (t) {                             \
		rec_release(t, op, (__u64)(lock)); \
		leave(t);                    \
	}                                    \
	return call;

EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
	ACQUIRE(OP_MUTEX_LOCK, mutex_lock, real.mutex_lock(m), m)
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
	TRY(OP_MUTEX_TRYLOCK, mutex_trylock, real.mutex_trylock(m), m, 0)
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *at)
{
	TRY(OP_MUTEX_TIMEDLOCK, mutex_timedlock, real.mutex_timedlock(m, at), m, at)
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t c, const struct timespec *at)
{
	TRY(OP_MUTEX_CLOCKLOCK, mutex_clocklock, real.mutex_clocklock(m, c, at), m, c)
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
	RELEASE(OP_MUTEX_UNLOCK, mutex_unlock, real.mutex_unlock(m), m)
}

EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a)
{
	ENSURE(mutex_init);
	int r = real.mutex_init(m, a);
	struct tstate *t = enter_op(OP_MUTEX_INIT);
	if (t) {
		/* Read after the init: the kind the attributes gave. */
		rec_lifetime(t, OP_MUTEX_INIT, (__u64)m, mutex_kind(OP_MUTEX_INIT, (__u64)m), (__u64)real.mutex_init,
			     FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_mutex_destroy(pthread_mutex_t *m)
{
	ENSURE(mutex_destroy);
	struct tstate *t = enter_op(OP_MUTEX_DESTROY);
	if (t) {
		rec_lifetime(t, OP_MUTEX_DESTROY, (__u64)m, mutex_kind(OP_MUTEX_DESTROY, (__u64)m), 0, NULL);
		leave(t);
	}
	return real.mutex_destroy(m);
}

EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
	ACQUIRE(OP_RWLOCK_RDLOCK, rw_rdlock, real.rw_rdlock(l), l)
}

EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	ACQUIRE(OP_RWLOCK_WRLOCK, rw_wrlock, real.rw_wrlock(l), l)
}

EXPORT int pthread_rwlock_tryrdlock(pthread_rwlock_t *l)
{
	TRY(OP_RWLOCK_TRYRDLOCK, rw_tryrdlock, real.rw_tryrdlock(l), l, 0)
}

EXPORT int pthread_rwlock_trywrlock(pthread_rwlock_t *l)
{
	TRY(OP_RWLOCK_TRYWRLOCK, rw_trywrlock, real.rw_trywrlock(l), l, 0)
}

EXPORT int pthread_rwlock_timedrdlock(pthread_rwlock_t *l, const struct timespec *at)
{
	TRY(OP_RWLOCK_TIMEDRDLOCK, rw_timedrdlock, real.rw_timedrdlock(l, at), l, at)
}

EXPORT int pthread_rwlock_timedwrlock(pthread_rwlock_t *l, const struct timespec *at)
{
	TRY(OP_RWLOCK_TIMEDWRLOCK, rw_timedwrlock, real.rw_timedwrlock(l, at), l, at)
}

EXPORT int pthread_rwlock_clockrdlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	TRY(OP_RWLOCK_CLOCKRDLOCK, rw_clockrdlock, real.rw_clockrdlock(l, c, at), l, c)
}

EXPORT int pthread_rwlock_clockwrlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	TRY(OP_RWLOCK_CLOCKWRLOCK, rw_clockwrlock, real.rw_clockwrlock(l, c, at), l, c)
}

EXPORT int pthread_rwlock_unlock(pthread_rwlock_t *l)
{
	RELEASE(OP_RWLOCK_UNLOCK, rw_unlock, real.rw_unlock(l), l)
}

/* The preference is read from the lock after the init (glibc copies the
 * attribute's kind into __flags): what the BPF side reads from the
 * attribute at entry, and the default's 0 without one. */
EXPORT int pthread_rwlock_init(pthread_rwlock_t *l, const pthread_rwlockattr_t *a)
{
	ENSURE(rw_init);
	int r = real.rw_init(l, a);
	struct tstate *t = enter_op(OP_RWLOCK_INIT);
	if (t) {
		rec_lifetime(t, OP_RWLOCK_INIT, (__u64)l, *(__u32 *)((__u64)l + GLIBC_RWLOCK_FLAGS_OFFSET),
			     (__u64)real.rw_init, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_rwlock_destroy(pthread_rwlock_t *l)
{
	ENSURE(rw_destroy);
	struct tstate *t = enter_op(OP_RWLOCK_DESTROY);
	if (t) {
		rec_lifetime(t, OP_RWLOCK_DESTROY, (__u64)l, 0, 0, NULL);
		leave(t);
	}
	return real.rw_destroy(l);
}

EXPORT int pthread_spin_lock(pthread_spinlock_t *l)
{
	ACQUIRE(OP_SPIN_LOCK, spin_lock, real.spin_lock(l), l)
}

EXPORT int pthread_spin_trylock(pthread_spinlock_t *l)
{
	TRY(OP_SPIN_TRYLOCK, spin_trylock, real.spin_trylock(l), l, 0)
}

EXPORT int pthread_spin_unlock(pthread_spinlock_t *l)
{
	RELEASE(OP_SPIN_UNLOCK, spin_unlock, real.spin_unlock(l), l)
}

/* glibc 2.36's pthread_spin_init is pthread_spin_unlock's code; the BPF
 * side, which sees one address, tells them apart by whether the thread
 * holds the lock. The shim is called by name, so each counts as what the
 * program called. */
EXPORT int pthread_spin_init(pthread_spinlock_t *l, int pshared)
{
	ENSURE(spin_init);
	int r = real.spin_init(l, pshared);
	struct tstate *t = enter_op(OP_SPIN_INIT);
	if (t) {
		rec_lifetime(t, OP_SPIN_INIT, (__u64)l, 0, (__u64)real.spin_init, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_spin_destroy(pthread_spinlock_t *l)
{
	ENSURE(spin_destroy);
	struct tstate *t = enter_op(OP_SPIN_DESTROY);
	if (t) {
		rec_lifetime(t, OP_SPIN_DESTROY, (__u64)l, 0, 0, NULL);
		leave(t);
	}
	return real.spin_destroy(l);
}

/* cond_wait releases its mutex at entry and holds it again at return,
 * whatever the result (as the BPF side's entry and return probes say). */
static void cond_enter(struct tstate *t, __u32 op, pthread_cond_t *c, pthread_mutex_t *m, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.addr = (__u64)c;
	e.addr2 = (__u64)m;
	held_pop(t, (__u64)m);
	if (t->held > 0)
		t->held--;
	send_with_stack(t, &e, fn, frame);
}

static void cond_return(struct tstate *t, __u32 op, pthread_cond_t *c, pthread_mutex_t *m, int ret, __u64 *frame)
{
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.flags = F_RETURN | F_ACQUIRED;
	e.addr = (__u64)c;
	e.addr2 = (__u64)m;
	e.ret = ret;
	t->held++;
	if (t->held > 1)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	send_with_stack(t, &e, 0, frame);
	held_push(t, (__u64)m, OP_MUTEX_LOCK, 0, e.stack, e.time, 1);
	lock_page_add((__u64)m);
}

/* A wait is a cancellation point: a thread cancelled in it has the mutex
 * back when its cleanup handlers run (and one of them usually unlocks
 * it), but the wait never returns. Its return is recorded by a handler of
 * the shim's own, which runs first. */
struct cond_call {
	struct tstate *t;
	__u32 op;
	pthread_cond_t *c;
	pthread_mutex_t *m;
	__u64 *frame;
};

static void cond_cancelled(void *p)
{
	struct cond_call *w = p;
	struct tstate *t = w->t;
	if (t->guard)
		return;
	t->guard = 1;
	cond_return(t, w->op, w->c, w->m, ECANCELED, w->frame);
	leave(t);
}

#define COND(op, field, call)                                  \
	ENSURE(field);                                         \
	struct tstate *t = enter_op(op);                       \
	if (!t)                                                \
		return call;                                   \
	cond_enter(t, op, c, m, (__u64)real.field, FRAME);     \
	leave(t);                                              \
	struct cond_call w = {t, op, c, m, FRAME};             \
	int r;                                                 \
	pthread_cleanup_push(cond_cancelled, &w);              \
	r = call;                                              \
	pthread_cleanup_pop(0);                                \
	if (!t->guard) {                                       \
		t->guard = 1;                                  \
		cond_return(t, op, c, m, r, FRAME);            \
		leave(t);                                      \
	}                                                      \
	return r;

EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
	COND(OP_COND_WAIT, cond_wait, real.cond_wait(c, m))
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *at)
{
	COND(OP_COND_TIMEDWAIT, cond_timedwait, real.cond_timedwait(c, m, at))
}

/* The analyzer knows one timed wait: clockwait is one. */
EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk, const struct timespec *at)
{
	COND(OP_COND_TIMEDWAIT, cond_clockwait, real.cond_clockwait(c, m, clk, at))
}

/* ---- threads and processes ---------------------------------------------- */

/* What a new thread needs from its creator, in a static pool: the shim
 * must not allocate for it (a new thread's first allocator call creates
 * its arena, and that call must be the target's own). */
struct start {
	void *(*fn)(void *);
	void *arg;
	__u32 parent_tid;
	int busy;
	__u64 stack;
};

#define START_SLOTS 256
static struct start starts[START_SLOTS];

static struct start *start_get(void)
{
	for (int i = 0; i < START_SLOTS; i++) {
		int zero = 0;
		if (__atomic_compare_exchange_n(&starts[i].busy, &zero, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return &starts[i];
	}
	return NULL;
}

static void thread_exit_event(struct tstate *t, __s64 ret)
{
	if (t->exited)
		return;
	t->exited = 1;
	count_call(t, OP_THREAD_EXIT);
	struct event e;
	event_init(&e, t, OP_THREAD_EXIT);
	e.ret = ret;
	event_send(&e);
}

/* A thread that ends by cancellation (or pthread_exit) unwinds through
 * thread_start without returning to it. */
static void thread_unwound(void *unused)
{
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		leave(t);
	}
}

static void *thread_start(void *p)
{
	struct start *sp = p, s = *sp;
	__atomic_store_n(&sp->busy, 0, __ATOMIC_RELEASE);
	struct tstate *t = enter();
	if (t) {
		/* Above this frame are glibc's start_thread frame, then the
		 * thread's TLS and struct pthread (over 2 KiB): all mapped, so
		 * walks and samples may read that far and reach start_thread,
		 * as the BPF side's do. */
		t->stack_hi = (__u64)__builtin_frame_address(0) + 1024;
		/* The creation, as the BPF side's sched_process_fork reports it:
		 * by the creating thread, naming the new one. */
		count_call(t, OP_THREAD_CREATE);
		struct event e;
		event_init(&e, t, OP_THREAD_CREATE);
		e.tid = s.parent_tid;
		e.arg = t->shared.tid;
		e.addr = my_pid;
		e.stack = s.stack;
		event_send(&e);
		leave(t);
	}
	void *r;
	pthread_cleanup_push(thread_unwound, NULL);
	r = s.fn(s.arg);
	pthread_cleanup_pop(0);
	thread_unwound(NULL);
	return r;
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	ENSURE(create);
	struct tstate *t = enter();
	if (!t)
		return real.create(th, attr, fn, arg);
	struct start *s = start_get();
	if (!s) {
		/* 256 threads being started at once: this one goes unrecorded
		 * in its creation only. */
		leave(t);
		return real.create(th, attr, fn, arg);
	}
	s->fn = fn;
	s->arg = arg;
	s->parent_tid = t->shared.tid;
	s->stack = take_stack(t, (__u64)real.create, FRAME);
	leave(t);
	int r = real.create(th, attr, thread_start, s);
	if (r != 0)
		__atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
	return r;
}

EXPORT void pthread_exit(void *ret)
{
	ENSURE(exit);
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		leave(t);
	}
	real.exit(ret);
}

/* _exit ends the process wherever its other threads are: what they are
 * writing is finished first. A vfork child's _exit is its parent's
 * business only in that the parent resumes. */
static void process_end(void)
{
	if (vf.child)
		return;
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		end_writes(t);
		leave(t);
	}
}

EXPORT void _exit(int status)
{
	ENSURE(_exit);
	process_end();
	real._exit(status);
}

EXPORT void _Exit(int status)
{
	ENSURE(_exit);
	process_end();
	real._exit(status);
}

/* The creation of a process, as the BPF side's sched_process_fork reports
 * it: by the parent, naming the child. */
static void process_created_from(struct tstate *t, __u32 pid, __u32 tid, pid_t child, __u64 stack)
{
	count_call(t, OP_THREAD_CREATE);
	struct event e;
	event_init(&e, t, OP_THREAD_CREATE);
	e.pid = pid;
	e.tid = tid;
	e.flags = F_PROCESS;
	e.arg = (__u64)child;
	e.addr = (__u64)child;
	e.stack = stack;
	event_send(&e);
}

static void process_created(struct tstate *t, pid_t child, __u64 fn, __u64 *frame)
{
	process_created_from(t, my_pid, t->shared.tid, child, take_stack(t, fn, frame));
}

/* In a child of fork: state starts afresh (the thread's held set and
 * counter slot were its parent's, and the threads that were writing are
 * not in the child), and without follow-forks the child records nothing. */
static void after_fork_child(void)
{
	forking = 0;
	my_pid = getpid();
	active = shm && (cfg_flags & SHM_F_FOLLOW);
	ts.inited = 0;
	ts.guard = 0;
	/* Only the flags that are set are written: the others stay shared
	 * with the parent, copied by no write. */
	for (__u32 i = 0; i < SHM_SLOTS; i++)
		if (writing[i].v)
			writing[i].v = 0;
	writing_shared = 0;
	closing_tid = 0;
	reader_stalled = 0;
	if (active && fork_from.tid) {
		int saved = errno;
		ts.guard = 1;
		thread_init(&ts);
		process_created_from(&ts, fork_from.pid, fork_from.tid, (pid_t)my_pid, fork_from.stack);
		ts.guard = 0;
		errno = saved;
	}
	if (active)
		announce_shared();
}

#define FORK(field)                                                            \
	ENSURE(field);                                                         \
	if (!real.field) {                                                     \
		errno = ENOSYS;                                                \
		return -1;                                                     \
	}                                                                      \
	fork_from.tid = 0;                                                     \
	struct tstate *t = enter();                                            \
	if (t) {                                                               \
		fork_from.pid = my_pid;                                        \
		fork_from.tid = t->shared.tid;                                        \
		fork_from.stack = take_stack(t, (__u64)real.field, FRAME);     \
		leave(t);                                                      \
	}                                                                      \
	forking = 1;                                                           \
	pid_t r = real.field();                                                \
	if (r == 0) {                                                          \
		if (forking) /* not yet done by a fork handler's call */     \
			after_fork_child();                                    \
		return 0;                                                      \
	}                                                                      \
	forking = 0;                                                           \
	if (r > 0 && fork_from.tid && !(cfg_flags & SHM_F_FOLLOW)) {           \
		int saved = errno;                                             \
		t = enter();                                                   \
		if (t) {                                                       \
			process_created_from(t, fork_from.pid, fork_from.tid, r, fork_from.stack); \
			leave(t);                                              \
		}                                                              \
		errno = saved;                                                 \
	}                                                                      \
	return r;

EXPORT pid_t fork(void)
{
	FORK(fork)
}

EXPORT pid_t __fork(void)
{
	FORK(fork)
}

/* fork without the fork handlers (async-signal-safe). */
EXPORT pid_t _Fork(void)
{
	FORK(_Fork)
}

/* vfork keeps its semantics (the child borrows the parent's memory and
 * runs first, the parent resumes at its exec or exit): treating it as
 * fork, as TSan does, would run the fork handlers, copy the address space
 * and let a parent's variable written by the child keep its old value.
 * The wrapper is an assembly trampoline because the child returns first
 * and then reuses the stack below its caller's frame: the wrapper's
 * return address cannot stay on the stack for the parent, so it is kept
 * in this thread's vfork levels. Between vfork and exec or exit the child
 * records nothing: it has no thread state of its own, and what it may
 * call there is async-signal-safe only. */
__attribute__((used, visibility("hidden"))) void *vfork_enter(__u64 ret)
{
	ENSURE(vfork);
	if (vf.depth >= VFORK_LEVELS)
		abort(); /* nowhere to keep the return address */
	struct vfork_level *l = &vf.levels[vf.depth++];
	l->ret = ret;
	l->guard = ts.guard;
	l->child = vf.child;
	l->map = NULL;
	return (void *)real.vfork;
}

struct vfork_back {
	__u64 ret;
	__s64 result;
};

/* After the real vfork, in the child and then in the parent; returns
 * where to return to and vfork's result (in rax:rdx). */
__attribute__((used, visibility("hidden"))) struct vfork_back vfork_leave(__s64 r)
{
	struct vfork_level *l = &vf.levels[vf.depth - 1];
	struct vfork_back b = {l->ret, r};
	if (r == 0) {
		ts.guard = 1;
		vf.child = 1;
		return b;
	}
	int saved = errno;
	vf.depth--;
	ts.guard = l->guard;
	vf.child = l->child;
	if (l->map)
		syscall(SYS_munmap, l->map, l->map_len);
	if (r > 0) {
		struct tstate *t = enter();
		if (t) {
			/* The stack as at the caller's vfork call: its return
			 * address, then its frame chain. */
			__u64 frame[2] = {FRAME[0], l->ret};
			process_created(t, (pid_t)r, (__u64)real.vfork, frame);
			leave(t);
		}
	}
	errno = saved;
	return b;
}

/* The stack is 16-byte aligned at each call: 8 off at entry, the return
 * address popped. */
__asm__(".text\n"
	".globl vfork\n"
	".globl __vfork\n"
	".type vfork,@function\n"
	".type __vfork,@function\n"
	"vfork:\n"
	"__vfork:\n"
	"\tpop %rdi\n"
	"\tcall vfork_enter\n"
	"\tcall *%rax\n"
	"\tmov %rax, %rdi\n"
	"\tcall vfork_leave\n"
	"\tpush %rax\n"
	"\tmov %rdx, %rax\n"
	"\tret\n"
	".size vfork, .-vfork\n"
	".size __vfork, .-__vfork\n");

/* ---- exec --------------------------------------------------------------- */

/* An exec's new image records when this one does and the environment
 * still preloads the library and names the shared memory. An environment
 * that dropped either (a clean envp, clearenv) gets them back; the rest
 * of it, argv and every result are the program's. The new environment is
 * built on the stack, or in a mapping when large, never with the target's
 * allocator (a vfork child shares its parent's heap), and is gone when
 * the exec fails. */
struct exec_env {
	char *const *envp;
	void *map;
	size_t map_len;
	int closing; /* the image's end was announced: undone if the exec fails */
	char buf[2048];
};

static int preload_has_shim(const char *list)
{
	size_t n = strlen(shim_path);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ": ");
		if (len == n && memcmp(p, shim_path, n) == 0)
			return 1;
		p += len;
		p += strspn(p, ": ");
	}
	return 0;
}

static void exec_env_done(struct exec_env *x);

/* child: the exec starts a new process (posix_spawn), which records only
 * when following. */
static char *const *exec_env(struct exec_env *x, char *const *envp, int child)
{
	x->envp = envp;
	x->map = NULL;
	x->closing = 0;
	if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2 || !active || !shim_path[0])
		return envp;
	if ((child || vf.child) && !(cfg_flags & SHM_F_FOLLOW))
		return envp;
	if (!child && !vf.child) {
		/* exec ends this image: what other threads write is finished
		 * first. */
		struct tstate *t = enter();
		if (t) {
			end_writes(t);
			x->closing = 1;
			leave(t);
		}
	}
	size_t n = 0, fd_at = (size_t)-1, pre_at = (size_t)-1;
	if (envp) {
		for (; envp[n]; n++) {
			if (strncmp(envp[n], "LD_PRELOAD=", 11) == 0)
				pre_at = n; /* the loader takes the last */
			else if (strncmp(envp[n], SHM_ENV "=", sizeof(SHM_ENV)) == 0)
				fd_at = n;
		}
	}
	int pre_ok = pre_at != (size_t)-1 && preload_has_shim(envp[pre_at] + 11);
	int fd_ok = fd_at != (size_t)-1 && strcmp(envp[fd_at], shm_env_entry) == 0;
	if (pre_ok && fd_ok)
		return envp;
	const char *old = pre_at != (size_t)-1 ? envp[pre_at] + 11 : "";
	size_t pre_len = 11 + strlen(shim_path) + 1 + strlen(old) + 1;
	size_t need = (n + 3) * sizeof(char *) + pre_len;
	char *mem = x->buf;
	if (need > sizeof(x->buf)) {
		size_t len = (need + 4095) & ~(size_t)4095;
		void *m = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) {
			exec_env_done(x);
			errno = E2BIG; /* as the kernel says of an environment too large */
			return NULL;
		}
		x->map = m;
		x->map_len = len;
		if (vf.child) {
			/* The exec that succeeds leaves it in the parent's memory. */
			vf.levels[vf.depth - 1].map = m;
			vf.levels[vf.depth - 1].map_len = len;
		}
		mem = m;
	}
	char **out = (char **)mem;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (i != fd_at && (i != pre_at || pre_ok))
			out[k++] = envp[i];
	if (!pre_ok) {
		char *s = mem + (n + 3) * sizeof(char *);
		out[k++] = s;
		memcpy(s, "LD_PRELOAD=", 11);
		s += 11;
		size_t sl = strlen(shim_path);
		memcpy(s, shim_path, sl);
		s += sl;
		if (*old)
			*s++ = ':';
		strcpy(s, old);
	}
	out[k++] = shm_env_entry;
	out[k] = NULL;
	x->envp = out;
	return out;
}

/* After an exec that failed (or a spawn): errno stays the exec's. */
static void exec_env_done(struct exec_env *x)
{
	int saved = errno;
	if (x->map) {
		syscall(SYS_munmap, x->map, x->map_len);
		if (vf.child)
			vf.levels[vf.depth - 1].map = NULL;
	}
	if (x->closing)
		__atomic_store_n(&closing_tid, 0, __ATOMIC_RELEASE);
	errno = saved;
}

#define EXEC_WITH_ENV(field, envp, child, call)             \
	ENSURE(field);                                      \
	if (!real.field) {                                  \
		errno = ENOSYS;                             \
		return -1;                                  \
	}                                                   \
	struct exec_env x;                                  \
	char *const *env = exec_env(&x, envp, child);       \
	if (envp && !env)                                   \
		return -1;                                  \
	int r = call;                                       \
	exec_env_done(&x);                                  \
	return r;

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	EXEC_WITH_ENV(execve, envp, 0, real.execve(path, argv, env))
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	EXEC_WITH_ENV(execvpe, envp, 0, real.execvpe(file, argv, env))
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	EXEC_WITH_ENV(fexecve, envp, 0, real.fexecve(fd, argv, env))
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	EXEC_WITH_ENV(execveat, envp, 0, real.execveat(dirfd, path, argv, env, flags))
}

/* The calls that take the environment from environ are execve's and
 * execvpe's with it, as in glibc. */
EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

/* The argument lists of execl and friends, collected on the stack as
 * glibc does. */
#define COLLECT_ARGS(arg, argv, tail)                      \
	va_list ap;                                        \
	size_t argc = 1;                                   \
	va_start(ap, arg);                                 \
	while (va_arg(ap, char *) != NULL)                 \
		argc++;                                    \
	va_end(ap);                                        \
	if (argc >= 1 << 20) {                             \
		errno = E2BIG;                             \
		return -1;                                 \
	}                                                  \
	char *argv[argc + 1];                              \
	argv[0] = (char *)arg;                             \
	va_start(ap, arg);                                 \
	for (size_t i = 1; i <= argc; i++)                 \
		argv[i] = va_arg(ap, char *);              \
	tail;                                              \
	va_end(ap);

EXPORT int execl(const char *path, const char *arg, ...)
{
	COLLECT_ARGS(arg, argv, )
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	COLLECT_ARGS(arg, argv, )
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp;
	COLLECT_ARGS(arg, argv, envp = va_arg(ap, char *const *))
	return execve(path, argv, envp);
}

/* posix_spawn starts a new process: its image records only when following
 * (the child of a spawn, as of a fork). */
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENSURE(spawn);
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 1);
	if (envp && !env)
		return errno;
	int r = real.spawn(pid, path, fa, attr, argv, env);
	exec_env_done(&x);
	return r;
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENSURE(spawnp);
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 1);
	if (envp && !env)
		return errno;
	int r = real.spawnp(pid, file, fa, attr, argv, env);
	exec_env_done(&x);
	return r;
}

/* ---- libc's memory wrappers: rewritten GOT slots ----------------------- */

/* madvise, munmap, mmap, mremap, brk and sbrk are not exported by the
 * shim: runtimes that patch libc's memory entry points (Open MPI's
 * patcher, UCX) look them up by name or take their address, and must find
 * libc's, or glibc's own calls (free -> madvise) would miss their hooks.
 * Instead the shim rewrites the objects' R_X86_64_JUMP_SLOT slots (data,
 * not code) for these functions, where a slot still holds libc's function
 * or is not bound yet: a slot a runtime redirected is left alone, and
 * R_X86_64_GLOB_DAT slots are never touched, so &madvise and dlsym still
 * give libc's function. What these wrappers do not see is glibc calling
 * itself (free -> shrink_heap -> madvise): the kernel's tracepoint does,
 * when hooktrace may use it. */

/* A memory call, recorded at entry with the fields the BPF side's
 * sys_enter gives it, never deduplicated (as there). */
static void rec_mem(struct tstate *t, __u32 op, __u64 addr, __u64 size, __u64 arg, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	struct event e;
	event_init(&e, t, op);
	e.addr = addr;
	e.size = size;
	e.arg = arg;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	send_with_stack(t, &e, fn, frame);
}

/* munmap and mremap: the one place where the memory they give up ends the
 * lifetimes of the locks in it (the BPF side bumps lock_epoch there). */
static void rec_unmap(struct tstate *t, __u32 op, __u64 addr, __u64 size, __u64 arg, __u64 fn, __u64 *frame)
{
	lifetime_changed();
	rec_mem(t, op, addr, size, arg, fn, frame);
}

/* errno is the caller's until the real call sets it. */
#define MEMCALL(op, rec, fn, addr, size, arg)                                              \
	struct tstate *t = enter_op(op);                                                   \
	if (t) {                                                                           \
		int saved = errno;                                                         \
		rec(t, op, (__u64)(addr), (__u64)(size), (__u64)(arg), (__u64)(fn), FRAME); \
		errno = saved;                                                             \
		leave(t);                                                                  \
	}

static int wrap_madvise(void *a, size_t n, int advice)
{
	MEMCALL(OP_MADVISE, rec_mem, real.madvise, a, n, advice)
	return real.madvise(a, n, advice);
}

static int wrap_munmap(void *a, size_t n)
{
	if (cfg_flags & SHM_F_SYSCALLS) { /* the kernel records it */
		lifetime_changed();
		return real.munmap(a, n);
	}
	MEMCALL(OP_MUNMAP, rec_unmap, real.munmap, a, n, 0)
	return real.munmap(a, n);
}

static void *wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
	MEMCALL(OP_MMAP, rec_mem, real.mmap, a, n, (__u64)(__u32)prot | ((__u64)(__u32)flags << 32))
	return real.mmap(a, n, prot, flags, fd, off);
}

static void *wrap_mremap(void *a, size_t old, size_t n, int flags, ...)
{
	/* The new address is passed only with MREMAP_FIXED; reading it
	 * otherwise reads a register, harmlessly. */
	va_list ap;
	va_start(ap, flags);
	void *at = va_arg(ap, void *);
	va_end(ap);
	if (cfg_flags & SHM_F_SYSCALLS) { /* the kernel records it */
		lifetime_changed();
		return real.mremap(a, old, n, flags, at);
	}
	MEMCALL(OP_MREMAP, rec_unmap, real.mremap, a, old, n)
	return real.mremap(a, old, n, flags, at);
}

static int wrap_brk(void *a)
{
	MEMCALL(OP_BRK, rec_mem, real.brk, a, 0, 0)
	return real.brk(a);
}

/* sbrk is a brk call to the current break plus the increment, as the
 * kernel would see it (sbrk(0) makes none, but is the program's call). */
static void *wrap_sbrk(intptr_t incr)
{
	struct tstate *t = enter_op(OP_BRK);
	if (t) {
		int saved = errno;
		__u64 cur = (__u64)real.sbrk(0);
		rec_mem(t, OP_BRK, cur + (__u64)incr, 0, 0, (__u64)real.sbrk, FRAME);
		errno = saved;
		leave(t);
	}
	return real.sbrk(incr);
}

/* ends_locks: under the kernel's tracepoint, which records every memory
 * syscall itself, only these are wrapped: the memory they give up ends the
 * lifetimes of the locks in it, in the shim's chain cache too. */
static const struct memcall {
	const char *name;
	void *wrapper;
	void **real; /* what a slot bound to libc holds */
	int ends_locks;
} memcalls[] = {
	{"madvise", (void *)wrap_madvise, (void **)&real.madvise, 0},
	{"munmap", (void *)wrap_munmap, (void **)&real.munmap, 1},
	{"mmap", (void *)wrap_mmap, (void **)&real.mmap, 0},
	{"mmap64", (void *)wrap_mmap, (void **)&real.mmap, 0},
	{"mremap", (void *)wrap_mremap, (void **)&real.mremap, 1},
	{"brk", (void *)wrap_brk, (void **)&real.brk, 0},
	{"sbrk", (void *)wrap_sbrk, (void **)&real.sbrk, 0},
};

/* Whether the page at addr is writable now, from /proc/self/maps (read
 * without allocating). Full RELRO makes a GOT read-only once, after its
 * object is relocated: a page seen writable is one the loader may still be
 * writing, and must not be made read-only under it. -1 when unknown. */
static int page_writable(__u64 addr)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char buf[4096];
	size_t have = 0;
	int found = -1;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		char *line = buf, *nl;
		while ((nl = strchr(line, '\n')) != NULL) {
			char *p = line;
			__u64 lo = 0, hi = 0;
			for (; *p && *p != '-'; p++)
				lo = lo * 16 + (__u64)(*p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10);
			for (p++; *p && *p != ' '; p++)
				hi = hi * 16 + (__u64)(*p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10);
			if (addr >= lo && addr < hi && p + 2 < nl) {
				found = p[2] == 'w';
				break;
			}
			line = nl + 1;
		}
		if (found >= 0)
			break;
		have = (size_t)(buf + have - line);
		memmove(buf, line, have);
		if (have == sizeof(buf) - 1)
			have = 0; /* a line longer than the buffer: no mapping line is */
	}
	close(fd);
	return found;
}

/* Stores v in the GOT slot at slot, through a read-only (RELRO) page if
 * need be, restoring its protection. */
static int write_slot(__u64 slot, __u64 v)
{
	long page = sysconf(_SC_PAGESIZE);
	void *pg = (void *)(slot & ~(__u64)(page - 1));
	int w = page_writable(slot);
	if (w < 0)
		return 0;
	if (w) {
		__atomic_store_n((__u64 *)slot, v, __ATOMIC_RELEASE);
		return 1;
	}
	if (mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE) != 0)
		return 0;
	__atomic_store_n((__u64 *)slot, v, __ATOMIC_RELEASE);
	mprotect(pg, (size_t)page, PROT_READ);
	return 1;
}

/* An address of the object's own (a lazily bound slot points at its PLT). */
static int in_object(struct dl_phdr_info *info, __u64 a)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_LOAD && a >= info->dlpi_addr + ph->p_vaddr &&
		    a < info->dlpi_addr + ph->p_vaddr + ph->p_memsz)
			return 1;
	}
	return 0;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
	__u64 base = info->dlpi_addr;
	/* Not libc (whose own calls are direct anyway), the loader, the vDSO
	 * or the shim itself. */
	if (in_object(info, (__u64)real.madvise) || in_object(info, (__u64)gnu_get_libc_version) || base == getauxval(AT_BASE) ||
	    base == getauxval(AT_SYSINFO_EHDR) || in_object(info, (__u64)patch_object))
		return 0;
	const ElfW(Dyn) *dyn = NULL;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
	if (!dyn)
		return 0;
	__u64 jmprel = 0, pltrelsz = 0, symtab = 0, strtab = 0, pltrel = 0;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_JMPREL:
			jmprel = dyn->d_un.d_ptr;
			break;
		case DT_PLTRELSZ:
			pltrelsz = dyn->d_un.d_val;
			break;
		case DT_SYMTAB:
			symtab = dyn->d_un.d_ptr;
			break;
		case DT_STRTAB:
			strtab = dyn->d_un.d_ptr;
			break;
		case DT_PLTREL:
			pltrel = dyn->d_un.d_val;
			break;
		}
	}
	if (!jmprel || !symtab || !strtab || pltrel != DT_RELA)
		return 0;
	/* The loader relocated these in place; an executable at 0 needs no
	 * relocation. */
	if (jmprel < base)
		jmprel += base, symtab += base, strtab += base;
	const ElfW(Rela) *r = (const ElfW(Rela) *)jmprel;
	const ElfW(Sym) *syms = (const ElfW(Sym) *)symtab;
	for (size_t i = 0; i < pltrelsz / sizeof(*r); i++) {
		if (ELF64_R_TYPE(r[i].r_info) != R_X86_64_JUMP_SLOT)
			continue;
		const ElfW(Sym) *sym = &syms[ELF64_R_SYM(r[i].r_info)];
		/* A symbol the object defines (an executable's canonical PLT
		 * entry, whose address the program took) is left alone. */
		if (sym->st_shndx != SHN_UNDEF || sym->st_value != 0)
			continue;
		const char *name = (const char *)strtab + sym->st_name;
		for (size_t k = 0; k < sizeof(memcalls) / sizeof(memcalls[0]); k++) {
			if (strcmp(name, memcalls[k].name) != 0)
				continue;
			if ((cfg_flags & SHM_F_SYSCALLS) && !memcalls[k].ends_locks)
				break;
			__u64 slot = base + r[i].r_offset;
			__u64 cur = __atomic_load_n((__u64 *)slot, __ATOMIC_ACQUIRE);
			if (cur == (__u64)memcalls[k].wrapper)
				break;
			/* libc's function, or the object's own PLT (bound lazily,
			 * not yet called): anything else is a runtime's. */
			if (cur == (__u64)*memcalls[k].real || (cur && in_object(info, cur)))
				write_slot(slot, (__u64)memcalls[k].wrapper);
			break;
		}
	}
	return 0;
}

static void arm_probes(void);
static int patch_lock;

/* The objects loaded so far: their memory calls and the probes in them.
 * Under the kernel's tracepoint the memory calls are its to record. */
static void instrument_objects(void)
{
	while (__atomic_exchange_n(&patch_lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	if (real.madvise)
		dl_iterate_phdr(patch_object, NULL);
	arm_probes();
	__atomic_store_n(&patch_lock, 0, __ATOMIC_RELEASE);
}

/* dlopen and dlmopen: what they loaded is instrumented as what was there
 * at start. (Exporting these is safe: no runtime patches them.)
 *
 * glibc's dlopen takes its caller from its return address: the caller's
 * RUNPATH and $ORIGIN find the library, its namespace receives it. So the
 * real dlopen must see the program's return address, not the shim's, yet
 * return to the shim. It is entered with a return address inside the
 * caller's object that holds a ret instruction, and that ret returns to
 * the shim (a return-address swap like the --probe exit stub's; neither
 * works under a hardware shadow stack, which glibc 2.36 does not enable). */
__attribute__((used, visibility("hidden"))) void *dl_real_fn[2];

struct gadget_search {
	__u64 pc;
	__u64 found;
};

static int find_gadget(struct dl_phdr_info *info, size_t size, void *data)
{
	struct gadget_search *gs = data;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		__u64 lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_filesz;
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || gs->pc < lo || gs->pc >= hi)
			continue;
		for (__u64 a = lo; a < hi; a++)
			if (*(const __u8 *)a == 0xc3) {
				gs->found = a;
				break;
			}
		return 1;
	}
	return 0;
}

/* Where the real dlopen should return to for a call from caller (0 when
 * the caller is in no object: JIT code, which glibc treats as the
 * executable's anyway); resolves the real functions first. */
__attribute__((used, visibility("hidden"))) __u64 dl_gadget(__u64 caller)
{
	int saved = errno;
	if (!real.dlopen || !real.dlmopen)
		resolve_real();
	dl_real_fn[0] = (void *)real.dlopen;
	dl_real_fn[1] = (void *)real.dlmopen;
	struct gadget_search gs = {caller, 0};
	if (!in_shim(caller))
		dl_iterate_phdr(find_gadget, &gs);
	errno = saved;
	return gs.found;
}

__attribute__((used, visibility("hidden"))) void dl_loaded(void *h)
{
	if (!h)
		return;
	int saved = errno;
	struct tstate *t = enter();
	if (t) {
		instrument_objects();
		leave(t);
	}
	errno = saved;
}

/* The stubs: keep the arguments (dlmopen has three), find the gadget, and
 * enter the real function with the gadget, then the continuation, as the
 * return addresses; the stack is as at a call (rsp+8 16-byte aligned).
 * At the continuation, or after a plain call when there is no gadget,
 * dl_loaded gets the handle, which is then returned. */
#define DL_STUB(name, index)                                       \
	".text\n"                                                  \
	".globl " name "\n"                                        \
	".type " name ",@function\n" name ":\n"                    \
	"\t.cfi_startproc\n"                                       \
	"\tpush %rbp\n"                                            \
	"\t.cfi_def_cfa_offset 16\n"                               \
	"\t.cfi_offset %rbp, -16\n"                                \
	"\tmov %rsp, %rbp\n"                                       \
	"\t.cfi_def_cfa_register %rbp\n"                           \
	"\tsub $32, %rsp\n"                                        \
	"\tmov %rdi, -8(%rbp)\n"                                   \
	"\tmov %rsi, -16(%rbp)\n"                                  \
	"\tmov %rdx, -24(%rbp)\n"                                  \
	"\tmov 8(%rbp), %rdi\n"                                    \
	"\tcall dl_gadget\n"                                       \
	"\tmov -8(%rbp), %rdi\n"                                   \
	"\tmov -16(%rbp), %rsi\n"                                  \
	"\tmov -24(%rbp), %rdx\n"                                  \
	"\tmov dl_real_fn+" index "(%rip), %r11\n"                 \
	"\ttest %rax, %rax\n"                                      \
	"\tjz 1f\n"                                                \
	"\tlea 2f(%rip), %rcx\n"                                   \
	"\tmov %rcx, -16(%rbp)\n"                                  \
	"\tmov %rax, -24(%rbp)\n"                                  \
	"\tlea -24(%rbp), %rsp\n"                                  \
	"\tjmp *%r11\n"                                            \
	"1:\tcall *%r11\n"                                         \
	"2:\tmov %rax, -8(%rbp)\n"                                 \
	"\tand $-16, %rsp\n"                                       \
	"\tmov %rax, %rdi\n"                                       \
	"\tcall dl_loaded\n"                                       \
	"\tmov -8(%rbp), %rax\n"                                   \
	"\tleave\n"                                                \
	"\t.cfi_def_cfa %rsp, 8\n"                                 \
	"\tret\n"                                                  \
	"\t.cfi_endproc\n"                                         \
	".size " name ", .-" name "\n"

__asm__(DL_STUB("dlopen", "0") DL_STUB("dlmopen", "8"));

/* ---- --probe: breakpoints handled in the process ---------------------- */

/* A function the user named, reached by calls inside its own object as
 * well as through the PLT: its first byte is an int3, the SIGTRAP handler
 * records the entry and resumes at a copy of the first instruction, which
 * jumps back after it. Nothing is restored in between, so other threads
 * never run past an unarmed entry. */
static struct probe {
	__u64 addr;
	__u8 *displaced;
	__u32 index;
} probes[SHM_PROBES];
static int nprobes;
static struct sigaction old_trap;

static void probe_hit(struct tstate *t, struct probe *pr, ucontext_t *uc)
{
	__u64 sp = (__u64)uc->uc_mcontext.gregs[REG_RSP];
	__u64 bp = (__u64)uc->uc_mcontext.gregs[REG_RBP];
	count_call(t, OP_PROBE_ENTER);
	flush_held(t);
	struct event e;
	event_init(&e, t, OP_PROBE_ENTER);
	e.arg = pr->index;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	/* The whole stack, unwound by hooktrace with .eh_frame: the rule
	 * OUTER>INNER looks for OUTER among INNER's callers. */
	if (cfg_flags & SHM_F_SAMPLES)
		e.stack = take_sample_regs(t, pr->addr, sp, bp, 0);
	if (!e.stack) {
		struct stack r;
		__u32 n = 0;
		r.ips[n++] = pr->addr;
		if (t->stack_hi && sp + 8 <= t->stack_hi)
			r.ips[n++] = real_ret(t, sp, *(__u64 *)sp);
		__u64 lo = sp, fp = bp;
		while (n < MAX_FRAMES && t->stack_hi && fp > lo && fp + 16 <= t->stack_hi && !(fp & 7)) {
			__u64 *f = (__u64 *)fp;
			__u64 ra = real_ret(t, fp + 8, f[1]);
			if (!ra)
				break;
			r.ips[n++] = ra;
			lo = fp;
			fp = f[0];
		}
		e.stack = send_stack(&r, n, n == MAX_FRAMES);
	}
	event_send(&e);
	/* The exit: the return address goes through the exit stub, as a
	 * uretprobe's does through the kernel's trampoline. */
	if (t->nshadow < sizeof(t->shadow) / sizeof(t->shadow[0]) && t->stack_hi && sp + 8 <= t->stack_hi) {
		t->shadow[t->nshadow++] = (struct shadow){sp, *(__u64 *)sp, pr->index};
		*(__u64 *)sp = (__u64)probe_exit_stub;
	}
}

/* Called by the exit stub with the function's return value and the slot
 * its return address was in; returns where to go back to. Entries above
 * the slot are of frames a longjmp left. */
__attribute__((used, visibility("hidden"))) __u64 probe_exit_c(__u64 rax, __u64 slot)
{
	struct tstate *t = &ts;
	while (t->nshadow > 0 && t->shadow[t->nshadow - 1].slot < slot)
		t->nshadow--;
	if (t->nshadow == 0 || t->shadow[t->nshadow - 1].slot != slot)
		abort(); /* no way back: the stack was changed under the recorder */
	struct shadow sh = t->shadow[--t->nshadow];
	int saved = errno;
	if (!t->guard && active) {
		t->guard = 1;
		count_call(t, OP_PROBE_EXIT);
		struct event e;
		event_init(&e, t, OP_PROBE_EXIT);
		e.flags = F_RETURN;
		e.arg = sh.index;
		e.ret = (__s64)rax;
		event_send(&e);
		t->guard = 0;
	}
	errno = saved;
	return sh.ret;
}

/* The exit stub: keeps every register and the flags (a caller compiled
 * with interprocedural register allocation may keep values in
 * caller-saved registers across a call it knows), asks probe_exit_c where
 * to go back to, and goes there with ret through a slot reserved first.
 * The stack is 16-byte aligned at the call. */
__asm__(".text\n"
	".type probe_exit_stub,@function\n"
	"probe_exit_stub:\n"
	"\tsub $8, %rsp\n"
	"\tpushfq\n"
	"\tpush %rax\n"
	"\tpush %rcx\n"
	"\tpush %rdx\n"
	"\tpush %rsi\n"
	"\tpush %rdi\n"
	"\tpush %r8\n"
	"\tpush %r9\n"
	"\tpush %r10\n"
	"\tpush %r11\n"
	"\tsub $264, %rsp\n"
	"\tmovdqu %xmm0, 0(%rsp)\n"
	"\tmovdqu %xmm1, 16(%rsp)\n"
	"\tmovdqu %xmm2, 32(%rsp)\n"
	"\tmovdqu %xmm3, 48(%rsp)\n"
	"\tmovdqu %xmm4, 64(%rsp)\n"
	"\tmovdqu %xmm5, 80(%rsp)\n"
	"\tmovdqu %xmm6, 96(%rsp)\n"
	"\tmovdqu %xmm7, 112(%rsp)\n"
	"\tmovdqu %xmm8, 128(%rsp)\n"
	"\tmovdqu %xmm9, 144(%rsp)\n"
	"\tmovdqu %xmm10, 160(%rsp)\n"
	"\tmovdqu %xmm11, 176(%rsp)\n"
	"\tmovdqu %xmm12, 192(%rsp)\n"
	"\tmovdqu %xmm13, 208(%rsp)\n"
	"\tmovdqu %xmm14, 224(%rsp)\n"
	"\tmovdqu %xmm15, 240(%rsp)\n"
	"\tmov 328(%rsp), %rdi\n"
	"\tlea 344(%rsp), %rsi\n"
	"\tcall probe_exit_c\n"
	"\tmov %rax, 344(%rsp)\n"
	"\tmovdqu 0(%rsp), %xmm0\n"
	"\tmovdqu 16(%rsp), %xmm1\n"
	"\tmovdqu 32(%rsp), %xmm2\n"
	"\tmovdqu 48(%rsp), %xmm3\n"
	"\tmovdqu 64(%rsp), %xmm4\n"
	"\tmovdqu 80(%rsp), %xmm5\n"
	"\tmovdqu 96(%rsp), %xmm6\n"
	"\tmovdqu 112(%rsp), %xmm7\n"
	"\tmovdqu 128(%rsp), %xmm8\n"
	"\tmovdqu 144(%rsp), %xmm9\n"
	"\tmovdqu 160(%rsp), %xmm10\n"
	"\tmovdqu 176(%rsp), %xmm11\n"
	"\tmovdqu 192(%rsp), %xmm12\n"
	"\tmovdqu 208(%rsp), %xmm13\n"
	"\tmovdqu 224(%rsp), %xmm14\n"
	"\tmovdqu 240(%rsp), %xmm15\n"
	"\tadd $264, %rsp\n"
	"\tpop %r11\n"
	"\tpop %r10\n"
	"\tpop %r9\n"
	"\tpop %r8\n"
	"\tpop %rdi\n"
	"\tpop %rsi\n"
	"\tpop %rdx\n"
	"\tpop %rcx\n"
	"\tpop %rax\n"
	"\tpopfq\n"
	"\tret\n"
	".size probe_exit_stub, .-probe_exit_stub\n");

static void on_trap(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	__u64 at = (__u64)uc->uc_mcontext.gregs[REG_RIP] - 1;
	int armed = __atomic_load_n(&nprobes, __ATOMIC_ACQUIRE);
	for (int i = 0; i < armed; i++) {
		if (probes[i].addr != at)
			continue;
		int saved = errno;
		struct tstate *t = enter();
		if (t) {
			probe_hit(t, &probes[i], uc);
			leave(t);
		}
		errno = saved;
		uc->uc_mcontext.gregs[REG_RIP] = (greg_t)probes[i].displaced;
		return;
	}
	/* Not ours: what the program would have had. */
	if (old_trap.sa_flags & SA_SIGINFO) {
		old_trap.sa_sigaction(sig, si, ucv);
	} else if (old_trap.sa_handler != SIG_DFL && old_trap.sa_handler != SIG_IGN) {
		old_trap.sa_handler(sig);
	} else {
		sigaction(SIGTRAP, &old_trap, NULL);
		raise(SIGTRAP);
	}
}

struct probe_search {
	const struct shm_probe *want;
	__u64 addr;
};

static const char *base_name(const char *p)
{
	const char *b = p;
	for (; *p; p++)
		if (*p == '/')
			b = p + 1;
	return b;
}

/* The loader names a library by the path it opened, mostly its soname's
 * link (libopen-pal.so.40); hooktrace names the file that holds the code
 * (libopen-pal.so.40.30.2): either is the object. */
static int object_named(const char *name, const char *want)
{
	char real[PATH_MAX];
	if (strcmp(base_name(name), want) == 0)
		return 1;
	return realpath(name, real) && strcmp(base_name(real), want) == 0;
}

static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct probe_search *ps = data;
	const char *name = info->dlpi_name ? info->dlpi_name : "";
	int is_exe = name[0] == 0 && !ps->addr;
	if ((ps->want->object[0] == 0 && is_exe) ||
	    (ps->want->object[0] && name[0] && object_named(name, ps->want->object))) {
		ps->addr = info->dlpi_addr + ps->want->vaddr;
		return 1;
	}
	return 0;
}

/* Arms the table's probes in the objects loaded so far: in the
 * constructor (before main, before any thread but this one runs), then
 * after each dlopen for a library loaded later. A function whose live
 * first bytes are not the file's (a runtime patched it) is left alone. */
static __u8 probe_done[SHM_PROBES]; /* armed, or refused for good */
static int trap_installed;

static void arm_probes(void)
{
	__u32 n = *H32(SHM_OFF_NPROBES);
	if (n == 0 || n > SHM_PROBES)
		return;
	long page = sysconf(_SC_PAGESIZE);
	int first = nprobes;
	for (__u32 i = 0; i < n; i++) {
		if (probe_done[i])
			continue;
		const struct shm_probe *sp = (const struct shm_probe *)(shm + SHM_OFF_PROBES + i * SHM_PROBE_BYTES);
		struct probe_search ps = {sp, 0};
		dl_iterate_phdr(find_object, &ps);
		if (!ps.addr)
			continue; /* not loaded (yet) */
		probe_done[i] = 1;
		if (sp->len == 0 || sp->len > 15 || memcmp((void *)ps.addr, sp->insn, sp->len) != 0)
			continue;
		/* The displaced copy goes within 2 GiB of the function, so a
		 * rip-relative operand can still reach its target. */
		__u8 *tramp = MAP_FAILED;
		for (__u64 k = 1; k <= 512 && tramp == MAP_FAILED; k++) {
			__u64 hint = (ps.addr & ~(__u64)(page - 1)) - k * (1ULL << 20);
			tramp = mmap((void *)hint, (size_t)page, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		}
		if (tramp == MAP_FAILED)
			continue;
		memcpy(tramp, sp->insn, sp->len);
		if (sp->disp_at) {
			__s32 disp;
			memcpy(&disp, tramp + sp->disp_at, 4);
			__s64 moved = (__s64)disp + (__s64)ps.addr - (__s64)(__u64)tramp;
			if (moved != (__s32)moved) {
				munmap(tramp, (size_t)page);
				continue;
			}
			disp = (__s32)moved;
			memcpy(tramp + sp->disp_at, &disp, 4);
		}
		/* Then jmp *0(%rip) back to the next instruction. */
		__u8 *j = tramp + sp->len;
		j[0] = 0xff, j[1] = 0x25, j[2] = j[3] = j[4] = j[5] = 0;
		__u64 back = ps.addr + sp->len;
		memcpy(j + 6, &back, 8);
		mprotect(tramp, (size_t)page, PROT_READ | PROT_EXEC);
		probes[nprobes] = (struct probe){ps.addr, tramp, sp->index};
		/* Published whole: other threads may be trapping already. */
		__atomic_store_n(&nprobes, nprobes + 1, __ATOMIC_RELEASE);
	}
	if (nprobes == first)
		return;
	if (!trap_installed) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_trap;
		sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
		sigfillset(&sa.sa_mask);
		sigaction(SIGTRAP, &sa, &old_trap);
		trap_installed = 1;
	}
	/* One byte, written whole: a thread already running the function
	 * (a library's constructor started it) sees the old byte or the
	 * int3, either of which runs right. */
	for (int i = first; i < nprobes; i++) {
		__u64 pg = probes[i].addr & ~(__u64)(page - 1);
		if (mprotect((void *)pg, (size_t)page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0)
			continue;
		*(volatile __u8 *)probes[i].addr = 0xcc;
		mprotect((void *)pg, (size_t)page, PROT_READ | PROT_EXEC);
	}
}

/* A new process image is an exec, as the BPF side's sched_process_exec
 * reports it: the first record of each image. */
static void exec_event(struct tstate *t)
{
	count_call(t, OP_EXEC);
	struct event e;
	event_init(&e, t, OP_EXEC);
	event_send(&e);
}

/* Recording starts here if no interposed call came first. The main
 * thread's exit is recorded at exit() or _exit(). */
__attribute__((constructor)) static void shim_init(void)
{
	struct tstate *t = enter();
	if (t) {
		instrument_objects();
		leave(t);
	}
}

/* exit: the other threads' records under way are finished before the
 * process ends; later ones are counted, not written. */
__attribute__((destructor)) static void shim_fini(void)
{
	struct tstate *t = enter();
	if (!t)
		return;
	thread_exit_event(t, 0);
	end_writes(t);
	leave(t);
}
