/* The shared-memory layout between the preloaded recorder (shim.c) and
 * hooktrace (../shm_layout.go, generated from this header by
 * ../internal/shmlayout: every SHM_ macro, enumerator and struct field).
 * One memfd: a header page, per-thread call counters, then a ring of
 * records. */
#ifndef HOOKTRACE_SHM_H
#define HOOKTRACE_SHM_H

#define SHM_MAGIC 0x314d48534b4f4f48ULL /* "HOOKSHM1" */
#define SHM_VERSION 1

/* The environment variable naming the memfd's descriptor in the target. */
#define SHM_ENV "HOOKTRACE_SHM_FD"
/* The one naming it in hooktrace, "ID:PATH": ID the run's (16 hex digits,
 * as at SHM_OFF_ID), PATH /proc/PID/fd/N of hooktrace's own descriptor. A
 * process whose inherited descriptor was closed before it exec'd (Python's
 * subprocess closes every descriptor by default) opens the memory again
 * by it. */
#define SHM_NAME_ENV "HOOKTRACE_SHM"

/* Counter slots: a thread claims one and is its only writer, so counting a
 * call is a plain store, exact even if the process is killed. Threads past
 * the last slot share one counted with atomic adds. */
#define SHM_SLOTS 1024
#define SHM_SLOT_OPS 64 /* >= OP_COUNT */

/* Byte offsets in the header. head and tail sit on their own cache lines:
 * every writer moves head, only the reader moves tail. */
enum shm_offsets {
	SHM_OFF_MAGIC = 0,      /* u64 */
	SHM_OFF_VERSION = 8,    /* u32 */
	SHM_OFF_TRACED = 12,    /* u32: the traced PID (set before the target execs) */
	SHM_OFF_FLAGS = 16,     /* u32: SHM_F_* */
	SHM_OFF_DATA_SIZE = 24, /* u64: ring bytes, a power of two */
	SHM_OFF_DATA = 32,      /* u64: where the ring starts */
	SHM_OFF_ID = 40,        /* u64: the run's id, never 0 (SHM_NAME_ENV) */
	SHM_OFF_HEAD = 64,      /* u64: bytes reserved by writers, ever */
	SHM_OFF_TAIL = 128,     /* u64: bytes consumed by the reader, ever */
	SHM_OFF_LOST = 192,     /* u64[4]: records dropped, by record type */
	SHM_OFF_NEXT_SLOT = 256, /* u32: counter slots claimed */
	SHM_OFF_NPROBES = 260,  /* u32: entries in the probe table */
	SHM_OFF_SHARED = 512,   /* u64[SHM_SLOT_OPS]: calls of threads without a slot */
	SHM_OFF_SLOTS = 1024,   /* u64[SHM_SLOTS][SHM_SLOT_OPS] */
};

/* The probe table (--probe/--forbid): functions whose entry the shim
 * breaks on (int3, handled in the process) and runs displaced, since a
 * call inside one object does not go through the PLT. hooktrace decodes
 * the first instruction and checks it can run elsewhere. */
#define SHM_OFF_PROBES (SHM_OFF_SLOTS + SHM_SLOTS * SHM_SLOT_OPS * 8)
#define SHM_PROBES 64
#define SHM_PROBE_BYTES 128
struct shm_probe {
	char object[80]; /* the object's file name; empty for the executable */
	__u64 vaddr;     /* the function's address in the object */
	__u32 index;     /* its index in the header's user probes */
	__u8 len;        /* length of its first instruction */
	__u8 disp_at;    /* where its rip-relative displacement is, 0 for none */
	__u8 pad[2];
	__u8 insn[16]; /* that instruction, as in the file */
	__u8 pad2[16];
};

#define SHM_HEADER_BYTES (SHM_OFF_PROBES + SHM_PROBES * SHM_PROBE_BYTES)

/* Configuration flags. */
#define SHM_F_FULL 1    /* record every call */
#define SHM_F_FOLLOW 2  /* record in forked children */
#define SHM_F_SAMPLES 4 /* raw stack samples inside allocator calls */
/* The kernel's sys_enter tracepoint records every memory syscall: the
 * shim leaves the GOT slots of libc's memory wrappers alone, so no call is
 * recorded twice. */
#define SHM_F_SYSCALLS 8
/* The reader detached (attach ended): a writer finding the ring full
 * drops its record at once instead of waiting for room. */
#define SHM_F_DETACHED 16

/* Every ring record starts with this, 16-byte aligned; the body (a record
 * of hooktrace.h) follows. seq is stored last, with release order: the
 * record is complete when seq equals its own position + 1. A pad record
 * fills the end of the ring when the next record would not fit there. */
#define SHM_REC_HDR 16
#define SHM_KIND_DATA 0
#define SHM_KIND_PAD 1

#endif
