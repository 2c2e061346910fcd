/* The shim's one internal header: the types, the globals (defined in the
 * part that owns each), the hot path's inline functions and the prototypes
 * of what one part calls in another. Each part (real.c, state.c, ...)
 * includes it and compiles alone (make lint checks that); shim.c includes
 * the parts into one translation unit, so that the hot path inlines across
 * them. */
#ifndef HOOKTRACE_SHIM_H
#define HOOKTRACE_SHIM_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <malloc.h> /* memalign, pvalloc */
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h> /* __u32 and friends, as hooktrace.h uses them */
#include "hooktrace.h"
#include "glibc.h"
#include "shm.h"

#define EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
/* The hot path of every interposer: what a call that is only counted runs. */
#define HOT static inline __attribute__((always_inline))

/* The injected build (HOOKTRACE_INJECT, inject.c) is loaded into a running
 * process by dlopen, where initial-exec TLS must fit in the static TLS
 * block's surplus (about 1.5 KiB with glibc's defaults): its per-thread
 * caches are smaller. The preloaded build's pattern cache is the BPF
 * side's (hooktrace.h). */
#ifdef HOOKTRACE_INJECT
#define SHIM_PATTERN_CACHE (PATTERN_CACHE / 4)
#define VFORK_LEVELS 2
#define INJECTED 1
#else
#define INJECTED 0
#define SHIM_PATTERN_CACHE PATTERN_CACHE
#define VFORK_LEVELS 8
#endif

_Static_assert(SHM_SLOT_OPS >= OP_COUNT, "a counter slot has a counter for every op");

/* Preloaded, the next definition after the shim's; injected (loaded
 * locally by dlopen, after every binding was made), the one the program's
 * own references bound to. */
#ifdef HOOKTRACE_INJECT
#define REAL_SCOPE RTLD_DEFAULT
#else
#define REAL_SCOPE RTLD_NEXT
#endif

/* An interposer's own frame: the caller's return address is FRAME[1]. */
#define FRAME ((__u64 *)__builtin_frame_address(0))
/* The real function, resolved on the first call that needs it. */
#define ENSURE(field)                      \
	do {                               \
		if (unlikely(!real.field)) \
			resolve_real();    \
	} while (0)

/* The shared memory's header fields (shm.h). */
#define H64(off) ((__u64 *)(shm + (off)))
#define H32(off) ((__u32 *)(shm + (off)))

#define CHAIN_SLOTS (1 << 16) /* the chain cache's entries */
#define CHAIN_MASK (CHAIN_SLOTS - 1)
#define STACKS_SENT_SLOTS (1 << 12)
/* The lock pages' set: 2^LOCK_PAGE_SET_BITS slots, a page looked for in
 * LOCK_PAGE_PROBES of them. (The BPF side's LOCK_PAGE_BITS counts the bits
 * of its filter in front of a hash map: another structure.) */
#define LOCK_PAGE_SET_BITS 14
#define LOCK_PAGE_PROBES 8
/* A freed chunk of up to this many pages (256 KiB) is checked page by
 * page; a larger one within the bounds is taken to hold a lock. */
#define FREE_CHECK_PAGES 64
#define WALK_SPAN (64 << 10) /* how far up a user-level thread's stack a walk reads */

/* ---- types -------------------------------------------------------------- */

/* The real functions, resolved with dlsym (real.c). */
struct real_fns {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
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
	int (*dlclose)(void *);
};

struct tstate {
	int guard;   /* inside the shim: forward unrecorded */
	int inited;  /* shim_gen it was set up in, 0 for none (a fork starts again) */
	/* The thread's TID and allocator call, which the kernel's sys_enter
	 * tracepoint reads too (announce_shared). */
	struct shim_alloc_state shared;
	__u64 *calls;   /* this thread's counter slot, NULL for the shared one */
	__u32 *writing; /* its writing flag, NULL for the shared counter */
	int exited;     /* its exit is recorded */
	__u64 stack_hi; /* how far up the thread's stack may be read, 0 when unknown */
	__u64 stack_lo; /* where its stack ends below; 0 when unknown */
	__s32 held;
	__u32 nheld;
	struct held_lock held_locks[MAX_HELD];
	__u64 held_sum; /* held_mix of held_locks' addresses, summed (held_push) */
	/* The patterns this thread last found, by key's low bits: a
	 * registration cache's hot loop has a few dozen (each lock, and each
	 * allocator call site under each lock). */
	__u64 cache_key[SHIM_PATTERN_CACHE];
	__u64 cache_stack[SHIM_PATTERN_CACHE];
};

/* A vfork child runs on its parent's thread: the same stack, the same
 * thread-local memory. So the thread's state is left as it is for the
 * parent, and the child records nothing until it execs or exits (child is
 * set meanwhile). One level per vfork under way (a child may vfork too):
 * where the call returns to, and the state to give back to the parent. */
struct vfork_state {
	int child;
	__u32 depth;
	struct vfork_level {
		__u64 ret;
		int guard;
		int child;
		void *map; /* what the child's exec mapped, for the parent to unmap */
		size_t map_len;
	} levels[VFORK_LEVELS];
};

/* Who forks, for the creation record: the parent writes it when the child
 * does not record; a child that records writes it itself, before any
 * record of its own, so the creation comes first in the ring. */
struct fork_origin {
	__u32 pid, tid;
	__u64 stack;
};

/* A thread's flags for the end of a process image (ring.c's end_writes),
 * by counter slot, one cache line each. */
struct writing_flag {
	__u32 v;
	/* The TID of the live thread that has the slot, 0 once its exit is
	 * recorded: the end of the process records the exits of the threads
	 * it ends, as the kernel's sched_process_exit reports each. */
	__u32 live_tid;
	char pad[56];
} __attribute__((aligned(64)));

/* A libc memory wrapper the shim reaches through rewritten GOT slots
 * (memcalls.c). ends_locks: under the kernel's tracepoint, which records
 * every memory syscall itself, only these are wrapped: the memory they
 * give up ends the lifetimes of the locks in it, in the shim's chain cache
 * too. */
struct memcall {
	const char *name;
	void *wrapper;
	void **real; /* what a slot bound to libc holds */
	int ends_locks;
};

/* ---- globals, each defined in the part named ---------------------------- */

/* real.c */
extern struct real_fns real;
extern __thread int resolving; /* inside resolve_real: dlsym's calls are the shim's */

/* state.c: the process's recording */
extern unsigned char *shm;  /* the mapping, NULL when not recording */
extern unsigned char *ring; /* its record area */
extern __u64 ring_mask;
extern __u32 cfg_flags;
extern __u32 my_pid;
extern int active;     /* this process records */
extern int init_state; /* 0 not yet, 1 in progress, 2 done */
/* A thread's state is for the recording it was set up in (tstate.inited):
 * each attach of the injected build starts a new one, in a new shared
 * memory. The preloaded build has one, and the compiler knows it. */
#ifdef HOOKTRACE_INJECT
extern int shim_gen;
#else
#define shim_gen 1
#endif
extern int glibc_free; /* free is glibc's: its chunk headers may be read */
extern __u64 sample_seq;
extern __u64 chain_keys[CHAIN_SLOTS]; /* the chain cache: pattern -> stack */
extern __u64 chain_vals[CHAIN_SLOTS];
extern __u64 stacks_sent[STACKS_SENT_SLOTS]; /* stack hashes sent (lossy: hooktrace dedups) */
extern __u64 lock_epoch;
extern __u32 epoch_used;
extern __u64 lock_pages[1 << LOCK_PAGE_SET_BITS];
extern __u64 lock_page_lo, lock_page_hi;
extern char shim_path[4096];
extern char shm_env_entry[64];
extern char shm_name_entry[128];
extern struct writing_flag writing[SHM_SLOTS];
extern __u32 writing_shared;
extern __u32 closing_tid;

/* state.c: the calling thread's */
extern __thread struct tstate ts __attribute__((tls_model("initial-exec")));
extern __thread struct vfork_state vf __attribute__((tls_model("initial-exec")));
/* This thread is inside fork: the child's fork handlers run before fork
 * returns to it, so a call seen here may be the child's, which must not
 * be recorded as the parent's. */
extern __thread int forking __attribute__((tls_model("initial-exec")));
extern __thread struct fork_origin fork_from __attribute__((tls_model("initial-exec")));

/* ring.c */
extern int reader_stalled;

/* memcalls.c */
extern const struct memcall memcalls[];
extern const size_t nmemcalls;

/* probes.c: the exit stub a probed function returns through */
extern char probe_exit_stub[] __attribute__((visibility("hidden")));

/* glibc's: where the main thread's stack starts */
extern void *__libc_stack_end;

/* ---- prototypes, by the part that defines them -------------------------- */

/* What one part calls in another is declared SHARED here and defined
 * without a storage class: static in the unity build (shim.c defines
 * SHIM_UNITY), so the compiler sees every caller and inlines and
 * specializes as it would in one file; extern when a part is compiled
 * alone (make lint). */
#ifdef SHIM_UNITY
#define SHARED static
#else
#define SHARED extern
#endif

/* real.c */
SHARED void resolve_real(void);
SHARED void *boot_alloc(size_t n);
SHARED int is_boot(const void *p);
SHARED size_t boot_size(const void *p);

/* state.c */
SHARED __u64 readable_top(struct tstate *t, __u64 sp, __u64 span);
SHARED __u64 stack_limit(__u64 cap);
SHARED int in_shim(__u64 pc);
SHARED __u64 now(void);
SHARED void announce_shared(void);
SHARED int map_shm(int fd, __u64 id);
SHARED int init_process(void);
SHARED void lifetime_changed(void);
SHARED void lock_page_add(__u64 lock);
SHARED int life_keep(__u32 op, __u64 lock, __u32 arg, __u16 flags, __u64 stack);
SHARED int life_end(__u64 lock);
SHARED void life_use(struct tstate *t, __u64 lock, __u64 time);
SHARED void lives_after_fork(void);
#ifdef HOOKTRACE_INJECT
SHARED void lives_reset(void);
#endif

/* ring.c */
SHARED void count_lost(__u32 type);
SHARED int write_begin(void);
SHARED void write_end(void);
SHARED __u32 slots_taken(void);
SHARED void end_writes(struct tstate *self);
SHARED unsigned char *ring_reserve(__u32 len, __u64 *pos_out);
SHARED void ring_commit(unsigned char *body, __u64 pos);
SHARED void ring_output(const void *rec, __u32 len, __u32 type);

/* record.c */
SHARED void thread_init(struct tstate *t);
SHARED struct tstate *enter_slow(struct tstate *t);
SHARED __u64 send_stack(struct stack *r, __u32 nr, int truncated);
SHARED __u64 take_stack(struct tstate *t, __u64 fn, __u64 *frame);
SHARED __u64 take_sample_regs(struct tstate *t, __u64 ip, __u64 sp, __u64 bp, __u64 until);
SHARED void event_init(struct event *e, struct tstate *t, __u32 op);
SHARED void event_send(struct event *e);
SHARED void send_with_stack(struct tstate *t, struct event *e, __u64 fn, __u64 *frame);
SHARED __u32 mutex_kind(__u32 op, __u64 lock);
SHARED int held_pop(struct tstate *t, __u64 addr);
SHARED struct event send_held(struct tstate *t, const struct held_lock *h, __u32 i);
SHARED void flush_held(struct tstate *t);
SHARED void pattern_sent(struct tstate *t, __u64 key, __u64 stack);
SHARED void alloc_context(struct tstate *t, struct event *e);
SHARED void mem_event(struct tstate *t, struct event *e, __u32 op, __u64 addr, __u64 size, __u64 arg);
SHARED void send_alloc(struct tstate *t, __u32 op, __u64 fn, __u64 *frame, __u64 addr, __u64 size, __u64 arg,
		__u64 outer, __u64 key);
SHARED void send_acquire(struct tstate *t, __u32 op, __u64 lock, __u64 fn, __u64 *frame, __u64 key);
SHARED void send_release(struct tstate *t, __u32 op, __u64 lock);
SHARED int lock_word_holder(__u32 op, __u64 lock, __u32 *holder);
SHARED void send_misuse(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u16 flags, __u32 holder, __u64 fn,
		 __u64 *frame);
SHARED void rec_try_result(struct tstate *t, __u32 op, __u64 lock, __u64 addr2, int ret, __u64 *frame);
SHARED void rec_lifetime(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u64 fn, __u64 *frame);
SHARED void rec_destroy(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u64 fn, __u64 *frame);

/* procs.c */
SHARED void thread_exit_event(struct tstate *t, __s64 ret);
SHARED void others_ended(struct tstate *self);
SHARED void after_fork_child(void);

/* memcalls.c */
SHARED int find_mapping(__u64 addr, __u64 *lo_out, __u64 *hi_out, int *writable);
SHARED int in_segment(struct dl_phdr_info *info, __u64 a, __u32 type);
SHARED int store_slot(__u64 slot, __u64 v, int relro);
SHARED void each_jump_slot(struct dl_phdr_info *info, void (*slot)(struct dl_phdr_info *, __u64, const char *, void *),
		    void *data);
SHARED int slot_unredirected(struct dl_phdr_info *info, __u64 slot, void *real_fn);
SHARED int is_libc(struct dl_phdr_info *info);
SHARED int not_patched(struct dl_phdr_info *info);
SHARED void instrument_objects(void);

/* probes.c */
SHARED void arm_probes(void);
SHARED void exec_event(struct tstate *t);
SHARED __u64 real_ret(__u64 slot, __u64 v);
SHARED void restore_returns(__u8 *copy, __u64 sp, __u64 len);
SHARED void exits_after_fork(void);

/* inject.c: the injected build's object patcher (a no-op preloaded) */
SHARED int inject_patch_object(struct dl_phdr_info *info, size_t size, void *data);

/* ---- the hot path --------------------------------------------------------- */

static inline void count_call(struct tstate *t, __u32 op)
{
	/* One instruction, so a signal handler's count on this thread (which
	 * lands between instructions) is never lost; no lock prefix: the
	 * slot has one writer. */
	if (likely(t->calls != NULL))
		__asm__ volatile("incq %0" : "+m"(t->calls[op]));
	else
		__atomic_fetch_add(H64(SHM_OFF_SHARED) + op, 1, __ATOMIC_RELAXED);
}

/* The calling thread's state when it records, or NULL. Sets the guard.
 * One test of each flag on the way in; the rest in enter_slow. */
HOT struct tstate *enter(void)
{
	struct tstate *t = &ts;
	if (t->guard)
		return NULL;
	if (unlikely(__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2 || forking || t->inited != shim_gen))
		return enter_slow(t);
	if (!active)
		return NULL;
	t->guard = 1;
	return t;
}

/* enter for an interposed call of op. Inside the shim (the guard is set)
 * the call is forwarded unrecorded, but counted when it is the target's:
 * a signal handler that interrupted the shim, not the shim's own
 * bootstrap. */
HOT struct tstate *enter_op(__u32 op)
{
	struct tstate *t = &ts;
	if (unlikely(t->guard)) {
		if (t->inited == shim_gen && active && !resolving && !vf.child)
			count_call(t, op);
		return NULL;
	}
	return enter();
}

/* A spinlock a thread owns (its &ts in *owner, 0 when free), for the
 * shim's process-wide tables. Takes it and returns 1; returns 0 when this
 * thread has it already: a signal handler interrupted it there, and must
 * do without rather than wait for itself. */
static inline int owner_lock(__u64 *owner)
{
	__u64 me = (__u64)&ts, free = 0;
	if (__atomic_load_n(owner, __ATOMIC_RELAXED) == me)
		return 0;
	while (!__atomic_compare_exchange_n(owner, &free, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
		free = 0;
		__builtin_ia32_pause();
	}
	return 1;
}

static inline void owner_unlock(__u64 *owner)
{
	__atomic_store_n(owner, 0, __ATOMIC_RELEASE);
}

static inline void leave(struct tstate *t)
{
	t->guard = 0;
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

static inline void held_push(struct tstate *t, __u64 addr, __u32 op, __u32 kind, __u64 stack, __u64 time, __u16 sent)
{
	__u32 i = t->nheld;
	if (i >= MAX_HELD)
		return;
	t->held_locks[i] = (struct held_lock){addr, stack, time, kind, (__u16)op, sent};
	t->nheld = i + 1;
	t->held_sum += held_mix(addr);
}

/* The chain key: independent products the CPU multiplies in parallel,
 * then one finalizer, so that the low bits (the caches' index) mix all. */
HOT __u64 pattern_key(struct tstate *t, __u32 op, __u64 lock, __u64 site)
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

/* The stack hash a pattern was sent with (bit 62 set, so never 0), or 0
 * when the pattern is new. */
HOT __u64 pattern_seen(struct tstate *t, __u64 key)
{
	__u32 c = key & (SHIM_PATTERN_CACHE - 1);
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

static inline int dedupable(struct tstate *t)
{
	return !(cfg_flags & SHM_F_FULL) && t->held >= 0 && (__u32)t->held == t->nheld;
}

static inline __u32 lock_page_slot(__u64 page, __u32 i)
{
	return (__u32)(((page * 0x9e3779b97f4a7c15ULL) >> (64 - LOCK_PAGE_SET_BITS)) + i) & ((1 << LOCK_PAGE_SET_BITS) - 1);
}

static inline int lock_page_has(__u64 page)
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

/* Whether freeing the glibc chunk at p may end a lock's lifetime: a page
 * it spans holds a lock. The BPF side skips chunks glibc mmapped, whose
 * munmap it sees and ends the epoch at; the shim's record of that munmap
 * (rec_glibc_syscall) does not, so such chunks are checked like any other.
 * Another allocator's chunk has no size the shim can read, and its free no
 * size the analysis could end locks by. */
static inline int free_covers_lock(__u64 p, __u64 size)
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

/* An allocator call's entry. Returns nothing: the call is made by the
 * interposer, inside alloc_depth. Inlined into each interposer: most calls
 * are only counted. */
HOT void rec_alloc(struct tstate *t, __u32 op, __u64 fn, __u64 *frame, __u64 addr, __u64 size, __u64 arg)
{
	count_call(t, op);
	if (t->shared.alloc_depth > 0) {
		/* Nested: a hook the allocator ran allocates. alloc_op is never
		 * 0 there, so outer is never 0. */
		send_alloc(t, op, fn, frame, addr, size, arg,
			   t->shared.alloc_op | ((__u64)t->shared.alloc_seq << 16), 0);
		return;
	}
	t->shared.alloc_seq++;
	t->shared.alloc_op = op;
	t->shared.alloc_sp = (__u64)&frame[1];
	if (cfg_flags & SHM_F_FULL) {
		send_alloc(t, op, fn, frame, addr, size, arg, 0, 0);
		return;
	}
	/* A free that may end a lock's lifetime is sent: the analysis ends
	 * the locks in the chunk it names. */
	if (op == OP_FREE && free_covers_lock(addr, size)) {
		lifetime_changed();
		send_alloc(t, op, fn, frame, addr, size, arg, 0, 0);
		return;
	}
	if (t->held <= 0)
		return;
	__u64 key = 0;
	if (dedupable(t)) {
		key = pattern_key(t, op, 0, frame[1]);
		if (pattern_seen(t, key))
			return;
	}
	send_alloc(t, op, fn, frame, addr, size, arg, 0, key);
}

/* An acquisition of lock whose pattern was sent before is held unsent,
 * only counted; returns whether it was. *key gets the pattern either way.
 * No clock read here (the vDSO's is a fifth of this path): if the
 * acquisition is ever sent, flush_held stamps it. */
HOT int held_known(struct tstate *t, __u32 op, __u64 lock, __u64 *key)
{
	*key = pattern_key(t, op, lock, 0);
	__u64 known = pattern_seen(t, *key);
	if (!known)
		return 0;
	held_push(t, lock, op, 0, known & ~(1ULL << 62), 0, 0);
	t->held++;
	return 1;
}

/* A blocking acquisition, recorded at entry as the BPF side does: a thread
 * that then blocks for good is seen waiting. */
HOT void rec_acquire(struct tstate *t, __u32 op, __u64 lock, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	__u64 key = 0;
	if (dedupable(t) && t->nheld < MAX_HELD && !t->shared.alloc_depth && held_known(t, op, lock, &key))
		return;
	send_acquire(t, op, lock, fn, frame, key);
}

HOT void rec_release(struct tstate *t, __u32 op, __u64 lock, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	int sent = held_pop(t, lock);
	if (t->held > 0)
		t->held--;
	if (unlikely(sent < 0)) {
		/* The thread does not hold it. */
		__u32 holder;
		lock_word_holder(op, lock, &holder);
		send_misuse(t, op, lock, 0, 0, holder, fn, frame);
	} else if (sent != 0) {
		send_release(t, op, lock); /* else its acquisition was only counted: so is its release */
	}
}

#endif
