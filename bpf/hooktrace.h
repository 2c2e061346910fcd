/* Types shared by the BPF programs and, through bpf2go, the Go tracer.
 * Keep every struct 8-byte aligned and free of implicit padding: Go reads
 * these bytes as they are. */
#ifndef HOOKTRACE_H
#define HOOKTRACE_H

#define MAX_FRAMES 48
#define SAMPLE_BYTES 8192
#define SCAN_SLOTS 512 /* return-slot scan: 4 KiB of stack */

/* Record types at the start of every ring-buffer record. */
enum rec_type {
	REC_EVENT = 1,
	REC_STACK = 2,
	REC_SAMPLE = 3,
};

/* Ops: the same numbering as events.Op in Go (events/event.go). */
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
	OP_COUNT,
};

/* Event flags: the same bits as events.Flags. */
#define F_RETURN (1 << 0)
#define F_ACQUIRED (1 << 1)
#define F_IN_ALLOC (1 << 2)
#define F_PROCESS (1 << 3)
#define F_LOCKS_HELD (1 << 4)

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

#endif
