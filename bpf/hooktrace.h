/* The contract between the BPF programs and the Go tracer: every number
 * both sides use is here, as an enum so that it reaches the object's BTF
 * and, through bpf2go -type, the generated Go (tracer/contract_test.go
 * checks the Go side against it). Keep every struct 8-byte aligned and free
 * of implicit padding: Go reads these bytes as they are.
 *
 * The probes are x86-64 only: they read pt_regs and syscall numbers of
 * that ABI and glibc's x86-64 structure layouts (glibc.h). */
#ifndef HOOKTRACE_H
#define HOOKTRACE_H

enum limits {
	MAX_FRAMES = 48,
	SAMPLE_BYTES = 8192,
	SCAN_SLOTS = 512, /* return-slot scan: 4 KiB of stack */
	MAX_HELD = 8,     /* locks a thread's state tracks one by one */
	/* Patterns a thread remembers itself (a power of two): a registration
	 * cache's hot loop has a few dozen (each lock, and each allocator call
	 * site under each lock). */
	PATTERN_CACHE = 64,
	FREE_PAGES = 4,   /* pages of a freed chunk checked for locks, one by one */
	OBJECT_PATH = 256, /* bytes of a loaded library's path kept */
};

/* Record types at the start of every ring-buffer record. */
enum rec_type {
	REC_EVENT = 1,
	REC_STACK = 2,
	REC_SAMPLE = 3,
	REC_OBJECT = 4,
	REC_SLOTS, /* the lost map's size: indexed by record type */
};

/* A process's state in the traced map. */
enum trace_state {
	TRACED = 1,
	GATED = 2, /* a child that has not exec'd its target yet */
};

/* Ops: the numbering of events.Op in Go (events/event.go), a file format:
 * append only. */
enum op {
	OP_MALLOC = 1,
	OP_CALLOC,
	OP_REALLOC,
	OP_FREE,
	OP_POSIX_MEMALIGN,
	OP_ALIGNED_ALLOC,
	OP_MEMALIGN,
	OP_VALLOC,
	OP_PVALLOC,
	OP_MADVISE,
	OP_MUNMAP,
	OP_MREMAP,
	OP_BRK,
	OP_MMAP,
	OP_MUTEX_LOCK,
	OP_MUTEX_TRYLOCK,
	OP_MUTEX_TIMEDLOCK,
	OP_MUTEX_CLOCKLOCK,
	OP_MUTEX_UNLOCK,
	OP_MUTEX_INIT,
	OP_MUTEX_DESTROY,
	OP_RWLOCK_RDLOCK,
	OP_RWLOCK_WRLOCK,
	OP_RWLOCK_TRYRDLOCK,
	OP_RWLOCK_TRYWRLOCK,
	OP_RWLOCK_TIMEDRDLOCK,
	OP_RWLOCK_TIMEDWRLOCK,
	OP_RWLOCK_CLOCKRDLOCK,
	OP_RWLOCK_CLOCKWRLOCK,
	OP_RWLOCK_UNLOCK,
	OP_SPIN_LOCK,
	OP_SPIN_TRYLOCK,
	OP_SPIN_UNLOCK,
	OP_COND_WAIT,
	OP_COND_TIMEDWAIT,
	OP_THREAD_CREATE,
	OP_THREAD_EXIT,
	OP_EXEC,
	OP_PROBE_ENTER,
	OP_PROBE_EXIT,
	OP_RWLOCK_INIT,
	OP_RWLOCK_DESTROY,
	OP_SPIN_INIT,
	OP_SPIN_DESTROY,
	OP_COUNT,
};

/* Event flags: the bits of events.Flags. */
enum event_flag {
	F_RETURN = 1 << 0,
	F_ACQUIRED = 1 << 1,
	F_IN_ALLOC = 1 << 2,
	F_PROCESS = 1 << 3,
	F_LOCKS_HELD = 1 << 4,
	/* A mutex or rwlock destroy that found the lock held (its word says
	 * so): addr2 is the holder's TID where the word names one. On a
	 * spinlock init seen at pthread_spin_unlock's address (alias_op): the
	 * word said held (0 or below), or was memory not yet a lock. */
	F_BUSY = 1 << 5,
};

/* The cookie of a uprobe: op in the low 16 bits, the stack adjustment at the
 * probe site (bytes pushed since the function's entry) above it. Allocator
 * probes also carry where the allocator's code lies relative to the probe:
 * the distance back to its start (24 bits) and its length in 64 KiB units
 * (8 bits), so the range is known from the first call, before user space
 * could read the process's maps. User and return probes carry a user-probe
 * index in the high 32 bits, other lock probes an alias op there, and the
 * flags above it. Go's side is tracer/cookie.go. */
enum cookie_layout {
	COOKIE_OP_SHIFT = 0,
	COOKIE_OP_BITS = 16,
	COOKIE_ADJ_SHIFT = 16,
	COOKIE_ADJ_BITS = 16,
	COOKIE_USER_SHIFT = 32, /* 32 bits */
	/* An unlock probe whose address another entry point shares (glibc
	 * 2.36's pthread_spin_init is pthread_spin_unlock) names it here. */
	COOKIE_ALIAS_SHIFT = 32,
	COOKIE_ALIAS_BITS = 16,
	/* A lock probe past the entry that a branch back to the entry makes
	 * fire again within one call (placement.Site.Refires). */
	COOKIE_REFIRES_SHIFT = 48,
	/* A lock probe on a call of the function in its caller, not on the
	 * function: the call instruction's length. The return address is not
	 * on the stack yet: it is the address after the call. (A tail call's
	 * jmp leaves the stack as the entry finds it: 0, as an entry.) */
	COOKIE_CALL_SHIFT = 49,
	COOKIE_CALL_BITS = 4,
	COOKIE_BACK_SHIFT = 32,
	COOKIE_BACK_BITS = 24,
	COOKIE_LEN_SHIFT = 56,
	COOKIE_LEN_BITS = 8,
	COOKIE_LEN_UNIT_SHIFT = 16, /* the length counts 64 KiB units */
};

#define COOKIE_FIELD(c, f) (((__u64)(c) >> f##_SHIFT) & ((1ULL << f##_BITS) - 1))
#define COOKIE_OP(c) ((__u32)COOKIE_FIELD(c, COOKIE_OP))
#define COOKIE_ADJ(c) ((__u32)COOKIE_FIELD(c, COOKIE_ADJ))
#define COOKIE_USER(c) ((__u32)((__u64)(c) >> COOKIE_USER_SHIFT))
#define COOKIE_ALIAS(c) ((__u32)COOKIE_FIELD(c, COOKIE_ALIAS))
#define COOKIE_REFIRES(c) (((__u64)(c) >> COOKIE_REFIRES_SHIFT) & 1)
#define COOKIE_CALL(c) ((__u32)COOKIE_FIELD(c, COOKIE_CALL))
#define COOKIE_RANGE_BACK(c) COOKIE_FIELD(c, COOKIE_BACK)
#define COOKIE_RANGE_LEN(c) (COOKIE_FIELD(c, COOKIE_LEN) << COOKIE_LEN_UNIT_SHIFT)

/* A lock a thread holds, as a recorder saw it taken: the BPF side's
 * thread_state and the shim's thread state keep the same entries. */
struct held_lock {
	__u64 addr;
	__u64 stack; /* hash of the stack it was taken with */
	__u64 time;
	__u32 kind;
	__u16 op;
	__u16 sent; /* its acquisition event was sent */
};

struct event {
	__u32 type; /* REC_EVENT */
	__u16 op;
	__u16 flags;
	__u32 pid;
	__u32 tid;
	__u64 time;
	__u64 addr;
	__u64 addr2;
	__u64 size;
	__u64 arg;
	__s64 ret;
	__u64 stack; /* hash of the stack sent as a REC_STACK, 0 for none */
};

/* A user stack, sent once per distinct hash (per process). */
struct stack {
	__u32 type; /* REC_STACK */
	__u32 nr;
	__u32 pid;
	__u32 truncated;
	__u64 hash;
	__u64 ips[MAX_FRAMES];
};

/* Raw stack memory for events inside an allocator call, unwound in user
 * space with the objects' call-frame information: glibc has no frame
 * pointers, and the path through it decides whether it holds its arena
 * lock. Sent with the event that follows it, which names it by hash. */
struct sample {
	__u32 type; /* REC_SAMPLE */
	__u32 len;
	__u32 pid;
	__u32 pad;
	__u64 hash; /* the id the event's stack field carries */
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u8 data[SAMPLE_BYTES];
};

/* A library the process loaded (what dlopen returned) or is unloading
 * (what dlclose was given): its load bias, as the loader's link_map says
 * (l_addr, the library's base), and the path the loader opened (l_name).
 * Stacks are named behind the process, by which time a library unloaded
 * may have another in its place: with these, its code keeps its names. */
struct object {
	__u32 type; /* REC_OBJECT */
	__u32 pid;
	__u64 time;
	__u64 base;
	__u32 gone; /* 1: the library is being unloaded */
	__u32 len;  /* bytes of path, without the NUL */
	char path[OBJECT_PATH];
};

/* Whether a thread is inside an allocator call, as the preloaded recorder
 * (preload/src/shim.c) keeps it in the thread's thread-local state. With
 * the preload recorder the BPF side has only its sys_enter tracepoint and
 * no allocator probes; it reads this to flag a memory syscall made inside
 * free or malloc as the shim flags its own records. The shim names the
 * offset from the thread pointer (initial-exec TLS: one offset for every
 * thread of a process) once per process image that records, by a syscall
 * the tracepoint sees: madvise(offset, SHIM_READY_LEN, SHIM_READY_ADVICE),
 * which the kernel refuses (there is no such advice). A uprobe on a
 * function of the shim did it before, and its attach and detach (about
 * 0.1 s) were most of a short program's start-up under the auto recorder.
 * tid tells a thread's own state from one a fork child inherited. */
enum shim_ready {
	SHIM_READY_LEN = 0x68747264,    /* "htrd" */
	SHIM_READY_ADVICE = 0x68747264, /* no madvise advice: EINVAL */
};

struct shim_alloc_state {
	__u32 tid;
	__u32 alloc_depth; /* allocator calls live on this thread */
	__u32 alloc_op;
	__u32 alloc_seq; /* counts the thread's outermost allocator calls */
	__u64 alloc_sp;  /* the outermost call's return-address slot: how much stack a sample needs */
};

#endif
