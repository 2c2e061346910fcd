/* Part of the shim (shim.c includes it; shim.h declares what the parts share): process state: the shared memory mapped once per process image, and lock lifetimes. */
#include "shim.h"

/* ---- process state ------------------------------------------------------ */

unsigned char *shm;   /* the mapping, NULL when not recording */
unsigned char *ring;  /* its record area */
__u64 ring_mask;
__u32 cfg_flags;
__u32 my_pid;
int active;             /* this process records */
int init_state;         /* 0 not yet, 1 in progress, 2 done */
#ifdef HOOKTRACE_INJECT
int shim_gen = 1; /* shim.h */
#endif
int glibc_free;         /* free is glibc's: its chunk headers may be read */
__u64 sample_seq;       /* sample ids */
__u64 chain_keys[CHAIN_SLOTS]; /* the chain cache: pattern -> stack */
__u64 chain_vals[CHAIN_SLOTS];
__u64 stacks_sent[STACKS_SENT_SLOTS]; /* stack hashes sent (lossy: hooktrace dedups) */

/* Counts lock lifetimes ended in this process: an init or destroy, a free
 * of a chunk that holds a lock, and whatever calls lifetime_changed (the
 * memory wrappers' munmap and mremap). Mixed into every chain-cache key, as
 * the BPF side's lock_epoch is: a lock re-made at an address is a new lock
 * to the analysis, and the patterns the old one was in must be sent again
 * for it. An exec starts a new image with an empty chain cache anyway. */
__u64 lock_epoch __attribute__((aligned(64)));
/* Whether a pattern was cached since lock_epoch last changed: if none
 * was, no cached pattern has the current epoch, and a lifetime's end
 * leaves it as it is. A loop that makes and destroys locks while nothing
 * else is sent then writes no shared cache line (the epoch, read by every
 * acquisition, would bounce between the cores). A pattern found new
 * before an end and cached after it keeps the epoch it had; it could only
 * hide a lock that its thread used while another initialised or destroyed
 * it, which is undefined. */
__u32 epoch_used;

/* Pages that hold a lock the analysis was sent (an init, a sent
 * acquisition), as the BPF side's lock_pages: a free of a chunk spanning
 * one must be sent and end the epoch even in aggregate mode, or a lock
 * freed without destroy and re-made at its address (a zeroed mutex needs
 * no init) would merge with the old one. An open-addressed set of page
 * numbers + 1, never emptied; a page that finds no room in its probe window
 * goes unregistered, as an evicted page does on the BPF side. The lowest
 * and highest pages let most frees answer with two compares. */
__u64 lock_pages[1 << LOCK_PAGE_SET_BITS];
__u64 lock_page_lo = ~0ULL, lock_page_hi;

/* What a new image needs to record too: the library's path as the loader
 * has it, and the descriptor variable, for an exec whose environment
 * dropped them. */
char shim_path[4096];
char shm_env_entry[64];
char shm_name_entry[128]; /* empty when the environment had none */

/* The end of a process image (exit, _exit, exec) kills its other threads
 * wherever they are, in the middle of a record too, which would then be
 * lost. So each thread says when it is writing one, and the thread that
 * ends the image first stops the others from starting one (closing_tid)
 * and waits for those under way. Flags are by counter slot (slots are
 * never reused), one cache line each; threads past the slots share a
 * counter. */
struct writing_flag writing[SHM_SLOTS];
__u32 writing_shared;
__u32 closing_tid;

__thread struct tstate ts;
__thread struct vfork_state vf;
__thread int forking;
__thread struct fork_origin fork_from;

/* Whether sp is on the thread's own stack, which is mapped from sp up to
 * stack_hi. A user-level thread's stack (makecontext, Argobots, Boost's
 * fibers) is anywhere else, and mapped only as far as its owner made it. */
static int on_own_stack(struct tstate *t, __u64 sp)
{
	return t->stack_hi && sp < t->stack_hi && sp >= t->stack_lo;
}

/* How far up from sp memory can be read, up to sp + span: on the
 * thread's own stack, to its top; elsewhere, page by page as far as the
 * kernel can read it for us (one 1-byte read a page, which stops at the
 * first unmapped page) and never faults. 0 when not even sp can be read. */
#define FOREIGN_PAGES 17
__u64 readable_top(struct tstate *t, __u64 sp, __u64 span)
{
	if (on_own_stack(t, sp))
		return t->stack_hi;
	if (!t->stack_hi)
		return 0;
	struct iovec local[FOREIGN_PAGES], remote[FOREIGN_PAGES];
	char sink[FOREIGN_PAGES];
	__u64 page = sp & ~4095ULL, end = sp + span;
	int n = 0;
	for (__u64 p = page; p < end && n < FOREIGN_PAGES; p += 4096, n++) {
		local[n] = (struct iovec){&sink[n], 1};
		remote[n] = (struct iovec){(void *)(p < sp ? sp : p), 1};
	}
	long got = syscall(SYS_process_vm_readv, my_pid, local, n, remote, n, 0);
	if (got <= 0)
		return 0;
	__u64 top = page + (__u64)got * 4096;
	return top < end ? top : end;
}

/* RLIMIT_STACK's soft limit, at most cap (which an unlimited or unknown
 * one gives): the main thread's stack grows down to it, and glibc sizes a
 * thread created without attributes by it. Read once per process image,
 * at its first use (the main thread's set-up, mostly), as glibc reads it
 * once for its threads: not a system call per pthread_create. */
__u64 stack_limit(__u64 cap)
{
	static __u64 limit; /* the limit + 1, 0 until read */
	__u64 v = __atomic_load_n(&limit, __ATOMIC_RELAXED);
	if (!v) {
		struct rlimit rl;
		v = ~0ULL;
		if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
			v = (__u64)rl.rlim_cur + 1;
		__atomic_store_n(&limit, v, __ATOMIC_RELAXED);
	}
	return v - 1 < cap ? v - 1 : cap;
}

/* The shim's own image: its frames (a thread's start routine returns into
 * thread_start) are not the target's. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern const char _end[] __attribute__((visibility("hidden")));

int in_shim(__u64 pc)
{
	return pc >= (__u64)__ehdr_start && pc < (__u64)_end;
}

__u64 now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t); /* the vDSO: no syscall */
	return (__u64)t.tv_sec * 1000000000ULL + (__u64)t.tv_nsec;
}

/* Keeps what an exec's new environment needs (see exec_env): the
 * library's path and the shared memory's variables, name=value, as this
 * image was given them. */
static void remember_env(const char *fd_entry, const char *name_entry)
{
	Dl_info di;
	if (dladdr((void *)remember_env, &di) && di.dli_fname && strlen(di.dli_fname) < sizeof(shim_path))
		strcpy(shim_path, di.dli_fname);
	if (strlen(fd_entry) < sizeof(shm_env_entry))
		strcpy(shm_env_entry, fd_entry);
	if (name_entry && strlen(name_entry) < sizeof(shm_name_entry))
		strcpy(shm_name_entry, name_entry);
}

/* Names the offset of t->shared from the thread pointer to the kernel's
 * sys_enter tracepoint, when it records the memory syscalls, once per
 * process image that records: a memory syscall glibc makes inside free is
 * then flagged as inside that free, as the shim's own records are. ts is
 * initial-exec TLS, at one offset from every thread's thread pointer
 * (%fs:0 holds the pointer itself, which the kernel keeps as the task's
 * fsbase). The call is a madvise the kernel refuses (enum shim_ready),
 * made directly, not through the interposed wrapper. */
void announce_shared(void)
{
	if (!(cfg_flags & SHM_F_SYSCALLS))
		return;
	unsigned long tp;
	__asm__("mov %%fs:0, %0" : "=r"(tp));
	syscall(SYS_madvise, (long)((unsigned long)&ts.shared - tp), (long)SHIM_READY_LEN, (long)SHIM_READY_ADVICE);
}

/* Maps the shared memory open at fd when it is hooktrace's, of this run
 * when id is not 0; returns whether it did. */
int map_shm(int fd, __u64 id)
{
	struct stat st;
	/* One mapping of the whole memfd, sized by fstat: the recorder's own
	 * memory syscalls are kept to one. */
	if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < SHM_HEADER_BYTES)
		return 0;
	void *all = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (all == MAP_FAILED)
		return 0;
	unsigned char *m = all;
	if (*(__u64 *)m != SHM_MAGIC || (id && *(__u64 *)(m + SHM_OFF_ID) != id) ||
	    *(__u64 *)(m + SHM_OFF_DATA) + *(__u64 *)(m + SHM_OFF_DATA_SIZE) > (__u64)st.st_size) {
		munmap(all, (size_t)st.st_size);
		return 0;
	}
	shm = m;
	return 1;
}

/* The entry name=... of environ, or NULL. */
static const char *env_entry(const char *name)
{
	size_t n = strlen(name);
	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return *e;
	return NULL;
}

/* Finds the shared memory: at the descriptor the environment names, else
 * (a parent closed it before the exec) by opening it again through
 * hooktrace's own descriptor, which the environment names with the run's
 * id; the descriptor opened for that is closed once it is mapped, so the
 * program's descriptors are as they were. Returns whether it is mapped. */
static int find_shm(const char *fd_entry, const char *name_entry)
{
	int fd = -1;
	if (fd_entry) {
		const char *v = fd_entry + sizeof(SHM_ENV);
		for (fd = 0; *v >= '0' && *v <= '9'; v++)
			fd = fd * 10 + (*v - '0');
	}
	__u64 id = 0;
	const char *path = NULL;
	if (name_entry) {
		const char *v = name_entry + sizeof(SHM_NAME_ENV);
		int i = 0;
		for (; i < 16; i++) {
			char c = v[i];
			int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
			if (d < 0)
				break;
			id = id << 4 | (__u64)d;
		}
		if (i == 16 && v[16] == ':')
			path = v + 17;
		else
			id = 0;
	}
	if (fd > 0 && map_shm(fd, id))
		return 1;
	if (!path || !id)
		return 0;
	int again = open(path, O_RDWR | O_CLOEXEC);
	if (again < 0)
		return 0;
	int ok = map_shm(again, id);
	close(again);
	return ok;
}

/* Maps the shared memory hooktrace made, once per process image; returns
 * whether this call did it. */
int init_process(void)
{
	int expected = 0;
	if (!__atomic_compare_exchange_n(&init_state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0;
	int saved = errno;
	if (!real.malloc)
		resolve_real();
	const char *fd_entry = env_entry(SHM_ENV), *name_entry = env_entry(SHM_NAME_ENV);
#ifdef HOOKTRACE_INJECT
	/* Injected: hooktrace_attach names the memory, not the environment. */
	fd_entry = name_entry = NULL;
#endif
	if (find_shm(fd_entry, name_entry)) {
		ring = shm + *H64(SHM_OFF_DATA);
		ring_mask = *H64(SHM_OFF_DATA_SIZE) - 1;
		cfg_flags = *H32(SHM_OFF_FLAGS);
		my_pid = getpid();
		active = my_pid == *H32(SHM_OFF_TRACED) || (cfg_flags & SHM_F_FOLLOW);
		remember_env(fd_entry ? fd_entry : "", name_entry);
		if (active)
			announce_shared();
	}
	glibc_free = real.free && real.free == dlsym(REAL_SCOPE, "__libc_free");
	errno = saved;
	__atomic_store_n(&init_state, 2, __ATOMIC_RELEASE);
	return 1;
}

/* ---- lock lifetimes ----------------------------------------------------- */

/* Ends the chain cache's patterns: every lock-lifetime end calls this. A
 * wrapper of munmap or mremap must call it too (the BPF side bumps its
 * epoch at both syscalls): the locks in what they unmap or move end
 * (rec_unmap). */
void lifetime_changed(void)
{
	if (__atomic_load_n(&epoch_used, __ATOMIC_ACQUIRE) && __atomic_exchange_n(&epoch_used, 0, __ATOMIC_ACQ_REL))
		__atomic_fetch_add(&lock_epoch, 1, __ATOMIC_RELEASE);
}

void lock_page_add(__u64 lock)
{
	__u64 page = lock >> 12;
	for (__u32 i = 0; i < LOCK_PAGE_PROBES; i++) {
		__u64 *slot = &lock_pages[lock_page_slot(page, i)];
		/* Read before the exchange: a page already there (every init
		 * of a loop's locks) is then found without taking the cache
		 * line from the other threads. */
		__u64 have = __atomic_load_n(slot, __ATOMIC_RELAXED);
		if (have == page + 1)
			return;
		if (have)
			continue;
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

/* Lock lifetimes in aggregate mode, as the BPF side's lives map keeps
 * them (see its enum life_state): at an address whose last lifetime the
 * analysis saw end (LIFE_ENDED: its destroy was sent), an init is kept
 * here instead of sent (LIFE_PENDING), and its destroy, if nothing used
 * the lock, drops both. Any record sent that uses the lock sends the kept
 * init first (life_use); the init and the destroy end the epoch, so the
 * lock's next acquisition by any thread is such a record. An entry is of
 * the process that wrote it (a child of fork starts with none); an
 * address that finds no room in its probe window is not kept, so a full
 * table sends every lifetime, as a full map does. Taken by one thread at
 * a time (lives_owner), never while it writes the ring. */
#define LIFE_BUCKETS (1 << 10)
#define LIFE_WAYS 7

enum life_state {
	LIFE_ENDED = 1,
	LIFE_PENDING = 2,
};

struct life {
	__u64 addr;
	__u64 stack; /* the pending init's */
	__u32 arg;
	__u32 pid;
	__u16 op;
	__u16 flags;
	__u32 state; /* enum life_state; 0 for a free slot */
};

/* An address's entry is in one bucket, which one thread at a time takes
 * (owner: its &ts); threads making locks at different addresses take
 * different cache lines. */
struct life_bucket {
	__u64 owner;
	struct life slot[LIFE_WAYS];
} __attribute__((aligned(64)));

static struct life_bucket lives[LIFE_BUCKETS];
/* The process that has entries, 0 for none: most processes make no lock
 * twice at one address, and find the table empty with one read. */
static __u32 lives_pid __attribute__((aligned(64)));

/* Takes lock's bucket, NULL when this thread has it already (a signal
 * handler interrupted it there). */
static struct life_bucket *lives_lock(__u64 lock)
{
	struct life_bucket *b = &lives[((lock * 0x9e3779b97f4a7c15ULL) >> 32) & (LIFE_BUCKETS - 1)];
	return owner_lock(&b->owner) ? b : NULL;
}

static void lives_unlock(struct life_bucket *b)
{
	owner_unlock(&b->owner);
}

/* The entry of lock in its bucket b (taken), or with add a free slot for
 * it (NULL when the bucket is full). */
static struct life *life_slot(struct life_bucket *b, __u64 lock, int add)
{
	struct life *room = NULL;
	for (__u32 i = 0; i < LIFE_WAYS; i++) {
		struct life *l = &b->slot[i];
		int live = l->state && l->pid == my_pid;
		if (live && l->addr == lock)
			return l;
		if (!live && !room)
			room = l;
	}
	if (!add || !room)
		return NULL;
	*room = (struct life){.addr = lock, .pid = my_pid};
	if (__atomic_load_n(&lives_pid, __ATOMIC_RELAXED) != my_pid)
		__atomic_store_n(&lives_pid, my_pid, __ATOMIC_RELAXED);
	return room;
}

static int lives_empty(void)
{
	return (cfg_flags & SHM_F_FULL) || __atomic_load_n(&lives_pid, __ATOMIC_RELAXED) != my_pid;
}

/* An init: whether it is kept (its address's last lifetime ended, or its
 * last init is still kept) rather than sent. */
int life_keep(__u32 op, __u64 lock, __u32 arg, __u16 flags, __u64 stack)
{
	struct life_bucket *b;
	if (lives_empty() || !(b = lives_lock(lock)))
		return 0;
	struct life *l = life_slot(b, lock, 0);
	if (l) {
		l->state = LIFE_PENDING;
		l->op = (__u16)op;
		l->arg = arg;
		l->flags = flags & F_BUSY;
		l->stack = stack;
	}
	lives_unlock(b);
	return l != NULL;
}

/* A destroy (not a misuse): whether it ends a kept init's lifetime, which
 * nothing used, so that neither is sent. Otherwise the destroy is to be
 * sent, and the analysis ends the lock's lifetime: its next init is kept. */
int life_end(__u64 lock)
{
	struct life_bucket *b;
	if ((cfg_flags & SHM_F_FULL) || !(b = lives_lock(lock)))
		return 0;
	struct life *l = life_slot(b, lock, 1);
	int unused = l && l->state == LIFE_PENDING;
	if (l)
		l->state = LIFE_ENDED;
	lives_unlock(b);
	return unused;
}

/* A record about to be sent at time uses lock: a kept init of it goes
 * first, in the sending thread's name (no finding depends on which thread
 * made an init), and the lifetime is live again. */
void life_use(struct tstate *t, __u64 lock, __u64 time)
{
	struct life_bucket *b;
	if (lives_empty() || !(b = lives_lock(lock)))
		return;
	struct life *l = life_slot(b, lock, 0), kept = {0};
	if (l) {
		kept = *l;
		l->state = 0;
	}
	lives_unlock(b);
	if (kept.state != LIFE_PENDING)
		return;
	struct event e;
	event_init(&e, t, kept.op);
	e.time = time;
	e.flags = kept.flags;
	e.addr = lock;
	e.arg = kept.arg;
	e.stack = kept.stack;
	event_send(&e);
}

/* In a child of fork: a thread of the parent may have had a bucket (the
 * child's entries are none: they are the parent's). */
void lives_after_fork(void)
{
	if (__atomic_load_n(&lives_pid, __ATOMIC_RELAXED) == 0)
		return;
	for (__u32 i = 0; i < LIFE_BUCKETS; i++)
		if (lives[i].owner)
			lives[i].owner = 0;
}

#ifdef HOOKTRACE_INJECT
/* An attach of the injected build: what the last reader was sent, this
 * one was not. */
void lives_reset(void)
{
	memset(lives, 0, sizeof(lives));
	lives_pid = 0;
}
#endif
