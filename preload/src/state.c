/* Part of shim.c, which includes it: process state: the shared memory mapped once per process image, and lock lifetimes. */

/* ---- process state ------------------------------------------------------ */

static unsigned char *shm;   /* the mapping, NULL when not recording */
static unsigned char *ring;  /* its record area */
static __u64 ring_mask;
static __u32 cfg_flags;
static __u32 my_pid;
static int active;             /* this process records */
static int init_state;         /* 0 not yet, 1 in progress, 2 done */
/* A thread's state is for the recording it was set up in (tstate.inited):
 * each attach of the injected build starts a new one, in a new shared
 * memory. */
static int shim_gen = 1;
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
static char shm_name_entry[128]; /* empty when the environment had none */

/* The end of a process image (exit, _exit, exec) kills its other threads
 * wherever they are, in the middle of a record too, which would then be
 * lost. So each thread says when it is writing one, and the thread that
 * ends the image first stops the others from starting one (closing_tid)
 * and waits for those under way. Flags are by counter slot (slots are
 * never reused), one cache line each; threads past the slots share a
 * counter. */
static struct {
	__u32 v;
	/* The TID of the live thread that has the slot, 0 once its exit is
	 * recorded: the end of the process records the exits of the threads
	 * it ends, as the kernel's sched_process_exit reports each. */
	__u32 live_tid;
	char pad[56];
} writing[SHM_SLOTS] __attribute__((aligned(64)));
static __u32 writing_shared;
static __u32 closing_tid;

#define H64(off) ((__u64 *)(shm + (off)))
#define H32(off) ((__u32 *)(shm + (off)))

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
	/* Return addresses of probed functions, swapped for the exit stub. */
	__u32 nshadow;
	struct shadow {
		__u64 slot; /* where on the stack */
		__u64 ret;  /* what was there */
		__u32 index;
	} shadow[SHADOW_SLOTS];
};

static __thread struct tstate ts __attribute__((tls_model("initial-exec")));

/* A vfork child runs on its parent's thread: the same stack, the same
 * thread-local memory. So the thread's state is left as it is for the
 * parent, and the child records nothing until it execs or exits (child is
 * set meanwhile). One level per vfork under way (a child may vfork too):
 * where the call returns to, and the state to give back to the parent. */
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
static __u64 readable_top(struct tstate *t, __u64 sp, __u64 span)
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
static void announce_shared(void)
{
	if (!(cfg_flags & SHM_F_SYSCALLS))
		return;
	unsigned long tp;
	__asm__("mov %%fs:0, %0" : "=r"(tp));
	syscall(SYS_madvise, (long)((unsigned long)&ts.shared - tp), (long)SHIM_READY_LEN, (long)SHIM_READY_ADVICE);
}

/* Maps the shared memory open at fd when it is hooktrace's, of this run
 * when id is not 0; returns whether it did. */
static int map_shm(int fd, __u64 id)
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
static int init_process(void)
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
 * (rec_glibc_syscall) does not, so such chunks are checked like any other.
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
