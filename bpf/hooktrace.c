// SPDX-License-Identifier: GPL-2.0
/* hooktrace's probes: allocator and pthread lock calls (uprobes), memory
 * syscalls (the raw sys_enter tracepoint, which sees a call however it was
 * made, even through a patched libc entry), and thread/process lifecycle
 * (raw sched tracepoints). Everything goes to one ring buffer as records of
 * hooktrace.h; per-thread state lives in maps. */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <asm/unistd_64.h>
#include <asm-generic/mman-common.h>
#include "hooktrace.h"
#include "glibc.h"
#include "stackword.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the tracer before load. */
const volatile __u32 full_mode = 0;   /* emit every call, not only what the analysis needs */
const volatile __u32 follow_forks = 0;
const volatile __u32 want_samples = 1; /* raw stack samples inside allocator calls */

/* Set by the tracer once every probe is attached, cleared before any is
 * detached: probes attached one by one would otherwise see, say, a lock
 * without its unlock and make a thread look as if it held it forever. */
volatile __u32 tracing_on = 0;

/* Counts lock lifetimes ended (init, destroy, munmap, mremap, exec, a free
 * of a chunk on a page holding a lock) in any traced process; mixed into
 * every chain-cache key. A lock re-made at an address is a new lock to the
 * analysis, and the patterns the old one was in must be sent again for it.
 * One global read is the acquisition hot path's whole cost; the price is
 * that every lifetime end makes each pattern of every traced process new
 * once. */
volatile __u64 lock_epoch = 0;

/* Counts changes to which code is mapped where (munmap, mremap, an
 * executable mmap, exec) in any traced process: the probe cookies a thread
 * remembers by address (thread_state.sites) hold only within one. */
volatile __u64 code_epoch = 0;

/* Counts execs in any traced process: a lock lifetime left pending (lives)
 * by an earlier image is not this one's. */
volatile __u64 exec_epoch = 0;

/* Processes being traced (tgid -> TRACED, or GATED for a child that has
 * not exec'd its target yet: its own start-up is not the target's). uprobes
 * are PID-filtered by the kernel; the raw tracepoints are global and filter
 * here. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

/* What a child of fork holds from its first instruction: the forking
 * thread's held locks (fork copies them locked), by the child's TID, from
 * sched_fork until the child's first probe hit takes them. */
struct inherited_locks {
	__u32 n;
	__u32 pad;
	struct held_lock locks[MAX_HELD];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct inherited_locks);
} inherited SEC(".maps");

/* inherited_locks is too large for the BPF stack: built here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct inherited_locks);
} inherit_buf SEC(".maps");

static __always_inline int is_traced(__u32 pid)
{
	__u8 *v = bpf_map_lookup_elem(&traced, &pid);
	return v && *v == TRACED;
}

/* The calling task's pid_tgid in *id, and whether tracing is on and the
 * task's process is traced: the raw tracepoints fire for every task. */
static __always_inline int current_traced(__u64 *id)
{
	*id = bpf_get_current_pid_tgid();
	return tracing_on && is_traced(*id >> 32);
}

/* Probe sites a thread remembers (a power of two): a hot loop hits a few
 * (its lock, its unlock, malloc, free). */
#define SITE_CACHE 8

/* A probe's address and its attach cookie, as of code_epoch. */
struct site_cookie {
	__u64 ip;
	__u64 cookie;
	__u64 epoch;
};

struct thread_state {
	__u64 alloc_sp;  /* where the outermost live allocator call's return address is */
	__u64 alloc_ret; /* ... and that return address */
	__u64 alloc_ip;  /* ... and where its probe fired */
	__u64 pend_addr; /* lock (or cond) address saved at entry for the return probe */
	__u64 pend_addr2;
	__u32 alloc_op;
	__s32 held; /* locks held, as far as the probes saw */
	__u32 pend_op;
	__u32 alloc_seq; /* counts the thread's outermost allocator calls */
	/* Return probes armed and not yet fired: each swapped a return address
	 * on the stack for the kernel's trampoline, which only the kernel's
	 * own unwinder (bpf_get_stack) puts back. */
	__u32 uret_pending;
	__u32 nheld; /* entries in held_locks; held counts all, this the first MAX_HELD */
	/* The process whose allocator range this thread saw registered: saves
	 * a map lookup per allocator call. Cleared at exec (a new image). */
	__u32 range_pid;
	/* The allocator call this thread's last one makes next by a jump
	 * from its caller's frame (tail_op, 0 for none), with its size, its
	 * return slot and the return address there (see allocator_own). */
	__u32 tail_op;
	__u64 tail_size, tail_slot, tail_ret;
	/* The task's bpf_get_current_pid_tgid(), saved at its first hit: a
	 * task's ids change only at exec (a thread that execs takes the
	 * leader's), where sched_exec saves them again. */
	__u64 pid_tgid;
	struct held_lock held_locks[MAX_HELD];
	/* The last patterns this thread found in seen_acq, by key's low bits: a hot
	 * loop repeats a few patterns, and this saves the shared map lookup. */
	__u64 cache_key[PATTERN_CACHE];
	__u64 cache_stack[PATTERN_CACHE];
	/* The last acquisition at a site that can fire twice in one call. */
	__u64 refire_lock, refire_sp, refire_ret;
	/* The cookies of the probes this thread hit last, by address: asking
	 * the kernel (bpf_get_attach_cookie) is a helper call, about 12 ns of
	 * a hit's 200 here, and a hot loop hits the same few probes. */
	struct site_cookie sites[SITE_CACHE];
	struct stack_page stack_page; /* where stack_word finds the thread's stack */
};

/* Acquisition patterns already sent, lockdep's chain cache: (lock, locks
 * held) for acquisitions, (call site, locks held) for allocator calls ->
 * the stack hash sent with it the first time. A
 * pattern seen before adds nothing to the lock graph, so in aggregate mode
 * its acquisition and release are only counted; they are sent after all
 * (flush_held) if something new happens while the lock is held. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} seen_acq SEC(".maps");

/* Pages that hold a lock the analysis was sent, by process: a free that
 * covers one must be sent (and the chain cache emptied) even in aggregate
 * mode, or a lock freed without destroy and re-made at its address (a
 * zeroed mutex needs no init) would merge with the old one. Only sent
 * acquisitions register their page, so the hot path pays nothing; an
 * evicted page makes a later free of it go unsent, as before. */
struct page_key {
	__u32 pid;
	__u32 pad;
	__u64 page;
};

/* What lock_pages says of a page: its kind in the low byte, and above it
 * the code_epoch it was classified in. Static data stays static only while
 * no mapping goes (code_epoch): a library's data page, unmapped with the
 * library, may be the heap's next. */
#define LOCK_PAGE_HEAP 1   /* a free may span it */
#define LOCK_PAGE_STATIC 2 /* an object's static data: no free spans it */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct page_key);
	__type(value, __u64);
} lock_pages SEC(".maps");

/* Lock lifetimes in aggregate mode. A program that makes and destroys
 * locks in a loop (TSan's Test14: locks on the stack of a loop's body)
 * sent two records a lifetime, an init with its stack and a destroy: most
 * of what such a loop cost. A lifetime nobody used changes no finding (the
 * analysis names and numbers only used locks), so at an address whose last
 * lifetime the analysis saw end (LIFE_ENDED: its destroy was sent), an
 * init is kept here instead (LIFE_PENDING), and its destroy, if nothing
 * used the lock, drops both. Any record sent that uses the lock sends the
 * init first (life_use): the init and the destroy bump lock_epoch, so the
 * lock's next acquisition by any thread is sent. */
enum life_state {
	LIFE_ENDED = 1,
	LIFE_PENDING = 2,
};

struct life_key {
	__u32 pid;
	__u32 pad;
	__u64 addr;
};

struct life {
	__u64 stack; /* the pending init's */
	__u64 arg;
	__u64 exec_epoch;
	__u32 state;
	__u16 op;
	__u16 flags;
};

/* A full map sends every lifetime, as without it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct life_key);
	__type(value, struct life);
} lives SEC(".maps");

/* Where life_use builds the init it sends. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event);
} life_buf SEC(".maps");

/* A filter in front of lock_pages, one bit per hash of (process, page),
 * never cleared: most freed chunks share no page with any lock, and this
 * tells them so without a hash-map lookup. A set bit only means "look". */
#define LOCK_PAGE_BITS (1 << 16)
__u64 lock_page_filter[LOCK_PAGE_BITS / 64];

static __always_inline __u32 lock_page_bit(__u32 pid, __u64 page)
{
	return (__u32)(((page ^ ((__u64)pid << 40)) * 0x9e3779b97f4a7c15ULL) >> 48) & (LOCK_PAGE_BITS - 1);
}

static __always_inline int lock_page_maybe(__u32 pid, __u64 page)
{
	__u32 bit = lock_page_bit(pid, page);
	return (lock_page_filter[bit / 64] >> (bit % 64)) & 1;
}

/* The highest LOCK_PAGE_HEAP page in lock_pages, in any traced process:
 * a chunk that starts above it spans no lock a free can end, and its free
 * needs no read of its header. A program whose locks are all in static
 * data reads no header at all. */
volatile __u64 lock_page_top = 0;

static long vma_file_backed(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	*(int *)ctx = vma->vm_file != 0;
	return 0;
}

static __always_inline void lock_page_add(__u32 pid, __u64 lock)
{
	__u64 page = lock >> 12, epoch = code_epoch;
	struct page_key k = {.pid = pid, .pad = 0, .page = page};
	__u64 *was = lock_page_maybe(pid, page) ? bpf_map_lookup_elem(&lock_pages, &k) : 0;
	if (was && ((*was & 0xff) == LOCK_PAGE_HEAP || *was >> 8 == epoch))
		return;
	/* Static data (a file's mapping) is never a chunk's: free cannot end
	 * a lock there. Unknown (the mappings' lock is taken) counts as heap.
	 * Either is remembered, so the mappings are looked up once a page
	 * (static data once a page and code_epoch). */
	int file_backed = 0;
	if (bpf_find_vma(bpf_get_current_task_btf(), lock, vma_file_backed, &file_backed, 0) != 0)
		file_backed = 0;
	__u64 kind = (file_backed ? LOCK_PAGE_STATIC : LOCK_PAGE_HEAP) | epoch << 8;
	bpf_map_update_elem(&lock_pages, &k, &kind, BPF_ANY);
	__u32 bit = lock_page_bit(pid, page);
	__sync_fetch_and_or(&lock_page_filter[bit / 64], 1ULL << (bit % 64));
	if (file_backed)
		return;
	__u64 top = lock_page_top;
	for (int i = 0; i < 16 && page > top; i++) {
		__u64 seen = __sync_val_compare_and_swap(&lock_page_top, top, page);
		if (seen == top)
			return;
		top = seen;
	}
	/* Lost every race (never seen): no bound, rather than a wrong one. */
	if (page > top)
		__sync_fetch_and_or(&lock_page_top, ~0ULL);
}

/* Whether freeing the chunk at p may end a lock's lifetime: a page it spans
 * holds a lock, or it spans more pages than are checked. glibc's chunk
 * header gives the size; a chunk glibc mmapped goes back with munmap, which
 * is always sent. */
static __always_inline int free_covers_lock(__u32 pid, __u64 p)
{
	__u64 sz = 0;
	if (!p || p >> 12 > lock_page_top || bpf_probe_read_user(&sz, sizeof(sz), (void *)(p - GLIBC_CHUNK_SIZE_AT)))
		return 0;
	if (glibc_chunk_mmapped(sz))
		return 0;
	sz = glibc_chunk_bytes(sz);
	if (sz < GLIBC_CHUNK_HEADER)
		return 0;
	__u64 first = p >> 12, last = (p - GLIBC_CHUNK_HEADER + sz) >> 12;
	if (last - first >= FREE_PAGES)
		return 1;
	for (__u32 i = 0; i < FREE_PAGES; i++) {
		if (first + i > last)
			break;
		if (!lock_page_maybe(pid, first + i))
			continue;
		/* A page of static data that a free covers is no longer
		 * static: it was unmapped, and the heap grew over it. */
		struct page_key k = {.pid = pid, .pad = 0, .page = first + i};
		if (bpf_map_lookup_elem(&lock_pages, &k))
			return 1;
	}
	return 0;
}

/* Per-thread state in task-local storage: found from the task itself,
 * cheaper than a hash lookup by TID on every probe hit, and freed with the
 * task. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} ring SEC(".maps");

/* Stacks already sent, by hash (the hash covers the pid). LRU: an evicted
 * stack is sent again, and user space deduplicates. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} seen_stacks SEC(".maps");

/* Every probe hit counted by op, emitted or not: the footer's call counts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OP_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

/* Records the ring buffer had no room for, by record type. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REC_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

struct scratch {
	__u64 ips[MAX_FRAMES + 1];
	__u64 slots[SCAN_SLOTS];
};

/* Where the allocator's code lies in each traced process: return addresses
 * in this range between a thread's stack pointer and its allocator call's
 * return slot prove the call is still live. */
struct alloc_range {
	__u64 lo;
	__u64 hi;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct alloc_range);
} alloc_ranges SEC(".maps");

/* Where each traced process's preloaded recorder keeps a thread's
 * struct shim_alloc_state: its offset from the thread pointer (pid ->
 * offset), as the recorder names it (enum shim_ready). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __s64);
} shim_tls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_map SEC(".maps");

/* A sample is built here, then copied to the ring at its used length: a
 * reservation is of a constant size, and most samples need far less than
 * SAMPLE_BYTES. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample);
} sample_buf SEC(".maps");

/* Samples already sent, by what decides their unwound stack (sample_key):
 * the raw-stack counterpart of the chain cache. A hook inside free that
 * runs thousands of times a second on one path is sampled once; a sample
 * is 1-8 KiB, and copying one per lock filled the ring. LRU: an evicted
 * pattern is sampled again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64);
} seen_samples SEC(".maps");

static __always_inline void count(__u32 *slot, void *map)
{
	__u64 *v = bpf_map_lookup_elem(map, slot);
	if (v)
		(*v)++;
}

static __always_inline void count_call(__u32 op)
{
	count(&op, &calls);
}

static __always_inline void count_lost(__u32 type)
{
	count(&type, &lost);
}

static __always_inline struct thread_state *thread_get(void)
{
	return bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
}

static __always_inline struct thread_state *thread_find(void)
{
	return bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
}

/* The calling task's pid_tgid, from its state once saved there: one
 * helper call less on every probe hit. */
static __always_inline __u64 thread_ids(struct thread_state *st)
{
	if (!st->pid_tgid) {
		/* The thread's first hit: a child of fork starts with what its
		 * parent's thread held. */
		st->pid_tgid = bpf_get_current_pid_tgid();
		__u32 tid = (__u32)st->pid_tgid;
		struct inherited_locks *in = bpf_map_lookup_elem(&inherited, &tid);
		if (in) {
			for (__u32 i = 0; i < MAX_HELD; i++) {
				if (i >= in->n)
					break;
				st->held_locks[i] = in->locks[i];
			}
			st->nheld = in->n < MAX_HELD ? in->n : MAX_HELD;
			st->held = st->nheld;
			bpf_map_delete_elem(&inherited, &tid);
		}
	}
	return st->pid_tgid;
}

/* Whether the thread's process is past its gate. The uprobes are placed
 * while the gate (hooktrace's own binary, about to exec the target) waits,
 * and a gate that runs libc code (a test binary built with cgo) calls the
 * probed functions: those calls are not the target's. A thread's ids are
 * saved at its first traced hit (thread_ids) or at its exec (sched_exec);
 * until then the filter says. */
static __always_inline int gate_passed(struct thread_state *st)
{
	if (st->pid_tgid)
		return 1;
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	__u8 *v = bpf_map_lookup_elem(&traced, &pid);
	return !v || *v != GATED;
}

/* Never filled: a program that may tail-call gets no private stack. The
 * verifier gives a uprobe program whose frame is 64 bytes or more a
 * per-CPU private stack, and every bpf_probe_read_user into a variable
 * there pays the hardened-usercopy heap-object checks (is_vmalloc_addr,
 * virt_addr_valid), a seventh of a hit's cost on the bench; on the
 * task's own stack the check is two comparisons. A tail call into this empty
 * array falls through. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} no_private_stack SEC(".maps");

/* The verifier checks a global (non-static, noinline) function once, on
 * its own, where it checks an inlined one at every call site and on every
 * path that reaches it: the stack walk and the allocator-call test are
 * called from every probe, up to a dozen times in uprobe_hook. Their
 * arguments are scalars or pointers to map values (checked for NULL
 * inside), so they run from any program type. */
#define GLOBAL_FUNC __attribute__((noinline))

/* One scan of scratch_map's slots, len bytes of them read: slots holding
 * a value in [lo, hi) are folded into h. A bpf_loop callback, verified
 * once, not a bounded loop: 6.1's verifier walked each of the loop's 512
 * iterations apart on every path and stopped uprobe_hook at its million
 * instructions, and 6.18's verifies uprobe_hook in half the instructions
 * so. (bpf_loop is 5.17's, as bpf_find_vma, which the probes need too.) */
struct slot_scan {
	__u64 len;
	__u64 lo;
	__u64 hi;
	__u64 h;
	__u32 found;
	__u32 first; /* stop at the first such slot */
};

static long slot_scan_step(__u32 i, void *ctx)
{
	struct slot_scan *c = ctx;
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s || i >= SCAN_SLOTS || i * 8 >= c->len)
		return 1;
	/* The mask, not the test (which clang checks on a copy of i), bounds
	 * the index for the verifier; barrier_var keeps clang from dropping it. */
	barrier_var(i);
	__u64 v = s->slots[i & (SCAN_SLOTS - 1)];
	if (v >= c->lo && v < c->hi) {
		c->found = 1;
		c->h = (c->h ^ v ^ ((__u64)i << 48)) * 0x100000001b3ULL;
		return c->first ? 1 : 0;
	}
	return 0;
}

/* Whether a return address into the allocator lies on the live stack
 * between sp and top. */
static __always_inline int alloc_frame_between(__u32 pid, __u64 sp, __u64 top)
{
	struct alloc_range *r = bpf_map_lookup_elem(&alloc_ranges, &pid);
	if (!r)
		return 1; /* range unknown: trust the return slot */
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s)
		return 1;
	__u64 len = top - sp;
	if (len > sizeof(s->slots))
		len = sizeof(s->slots);
	len &= ~7ULL;
	if (len == 0 || bpf_probe_read_user(s->slots, len, (void *)sp))
		return 1;
	struct slot_scan c = {.len = len, .lo = r->lo, .hi = r->hi, .first = 1};
	bpf_loop(SCAN_SLOTS, slot_scan_step, &c, 0);
	return c.found;
}

/* Whether the thread is still inside the allocator call recorded in st,
 * without a return probe (which would trap on the single-stepped first
 * instruction of free): the call is live while the current stack is deeper
 * and the recorded return-address slot still holds the same address. A
 * tail call defeats that test (free tail-called from f leaves f's return
 * address in the slot, and the next call of f puts it back), so the live
 * frames in between must also hold a return address into the allocator.
 * User space confirms with the unwound stack. */
GLOBAL_FUNC int in_alloc(struct thread_state *st, __u32 pid, __u64 sp)
{
	if (!st || !st->alloc_sp || !st->alloc_ret)
		return 0;
	/* A call made inside the allocator call has its return slot below
	 * the allocator's: a probe passes its own return slot as sp, so the
	 * next call from the same frame (the usual case: malloc, then free,
	 * then a lock) is told apart without reading the stack. */
	if (sp >= st->alloc_sp || stack_word(&st->stack_page, st->alloc_sp) != st->alloc_ret ||
	    !alloc_frame_between(pid, sp, st->alloc_sp)) {
		st->alloc_sp = 0;
		return 0;
	}
	return 1;
}

/* How far past its probe an allocator entry function makes its own calls
 * (glibc's realloc is 1.2 KiB long), and how far before it the probe may
 * sit (a few instructions in). */
#define OWN_CALL_AFTER 4096
#define OWN_CALL_BEFORE 256

/* glibc's allocator calls itself through its entry points, where the
 * probes are. realloc(NULL, n) jumps to malloc, and so do memalign and
 * aligned_alloc (one function) asking less alignment than malloc gives:
 * from the caller's frame, so the inner call looks like the caller's next
 * one. realloc(p, 0), realloc of a mapped chunk and posix_memalign call
 * free or malloc from inside: from the entry function's own code, near its
 * probe (the allocator's range is too coarse to tell: it is rounded up to
 * 64 KiB, and takes in strdup). The program made one call, and the
 * preloaded library, which sees only the program's calls, counts one:
 * these inner calls are neither counted nor sent. Called at an allocator
 * probe, before in_alloc (a jump's slot is the outer call's, which would
 * end it); remembers the jump the call at hand will make, if any. */
static __always_inline int allocator_own(struct thread_state *st, __u32 pid, __u32 op, __u64 ret_slot, __u64 a0,
					 __u64 a1)
{
	__u32 tail = st->tail_op;
	st->tail_op = 0;
	if (tail && tail == op && a0 == st->tail_size && ret_slot == st->tail_slot &&
	    stack_word(&st->stack_page, ret_slot) == st->tail_ret)
		return 1;
	if (st->alloc_sp && ret_slot < st->alloc_sp) {
		/* Inside an allocator call: a call from the entry function's
		 * own code is the allocator's (a hook's is from elsewhere). */
		__u64 ret = stack_word(&st->stack_page, ret_slot);
		if (ret + OWN_CALL_BEFORE - st->alloc_ip < OWN_CALL_BEFORE + OWN_CALL_AFTER && in_alloc(st, pid, ret_slot))
			return 1;
	}
	if ((op == OP_REALLOC && a0 == 0) ||
	    ((op == OP_MEMALIGN || op == OP_ALIGNED_ALLOC) && a0 <= GLIBC_MALLOC_ALIGNMENT)) {
		st->tail_op = OP_MALLOC;
		st->tail_size = a1;
		st->tail_slot = ret_slot;
		st->tail_ret = stack_word(&st->stack_page, ret_slot);
	}
	return 0;
}

/* The reader is woken only once this much is waiting, and polls for the
 * rest: a wake-up per record (an irq_work, an IPI in a VM) costs more than
 * the record. */
#define WAKE_BYTES (256 << 10)

static __always_inline __u64 ring_flags(void)
{
	/* A small ring must not fill before the batch would wake the reader. */
	__u64 wake = bpf_ringbuf_query(&ring, BPF_RB_RING_SIZE) / 4;
	if (wake > WAKE_BYTES)
		wake = WAKE_BYTES;
	return bpf_ringbuf_query(&ring, BPF_RB_AVAIL_DATA) >= wake ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* The frame-pointer chain from (ip, fp) into ips (MAX_FRAMES slots), read
 * here a frame at a time: far cheaper than bpf_get_stack on a short stack.
 * The walk stops where the chain stops going up the stack (code built
 * without frame pointers leaves anything in rbp). Returns the count. */
static __always_inline __u32 walk_fp(__u64 *ips, __u64 ip, __u64 fp)
{
	__u32 n = 1;
	ips[0] = ip;
	for (__u32 i = 1; i < MAX_FRAMES; i++) {
		__u64 fr[2];
		if (!fp || (fp & 7) || bpf_probe_read_user(fr, sizeof(fr), (void *)fp) || !fr[1])
			break;
		ips[i] = fr[1];
		n = i + 1;
		if (fr[0] <= fp)
			break;
		fp = fr[0];
	}
	return n;
}

/* The frame-pointer chain from (ip, fp) into the scratch buffer's ips[1..];
 * returns its size in bytes, as bpf_get_stack does. */
GLOBAL_FUNC long walk_stack(__u64 ip, __u64 fp)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s)
		return 0;
	return walk_fp(&s->ips[1], ip, fp) * sizeof(__u64);
}

/* Sends the stack of n bytes in the scratch buffer's ips[1..], with the
 * immediate caller put back (at a probe before the function's own frame is
 * built, the caller's return address sits at ret_slot, not in the chain;
 * at a probe on the call, it is ret, the address after the call), once
 * per distinct hash; returns the hash. */
/* All ones when i < n, else 0, computed without a branch: the empty asm
 * keeps the compiler from turning the mask back into a comparison and a
 * jump. */
static __always_inline __u64 below_mask(__u32 i, __u32 n)
{
	__s64 d = (__s64)i - (__s64)n;
	asm volatile("" : "+r"(d));
	__u64 m = (__u64)(d >> 63);
	asm volatile("" : "+r"(m));
	return m;
}

GLOBAL_FUNC __u64 send_stack(__u32 pid, __u64 ret_slot, __u64 ret, long n)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s || n <= 0)
		return 0;
	__u32 nr = n / sizeof(__u64);
	if (nr > MAX_FRAMES)
		nr = MAX_FRAMES;
	__u32 start = 1;
	if (ret || ret_slot) {
		if ((ret || !bpf_probe_read_user(&ret, sizeof(ret), (void *)ret_slot)) &&
		    (nr < 2 || s->ips[2] != ret)) {
			s->ips[0] = s->ips[1];
			s->ips[1] = ret;
			start = 0;
			nr++;
		}
	}
	if (nr > MAX_FRAMES)
		nr = MAX_FRAMES;

	/* The loops run over every slot and keep the first nr by a mask, not
	 * a branch: a branch on nr made the verifier check the rest of the
	 * function once for each value it may have (48 times over). */
	__u64 hash = 0xcbf29ce484222325ULL ^ pid;
	for (__u32 i = 0; i < MAX_FRAMES; i++) {
		__u64 keep = below_mask(i, nr);
		__u64 next = (hash ^ s->ips[start + i]) * 0x100000001b3ULL;
		hash = (next & keep) | (hash & ~keep);
	}
	/* The top bit marks sample ids. */
	hash &= ~(1ULL << 63);
	if (!hash)
		hash = 1;
	if (bpf_map_lookup_elem(&seen_stacks, &hash))
		return hash;

	struct stack *r = bpf_ringbuf_reserve(&ring, sizeof(*r), 0);
	if (!r) {
		count_lost(REC_STACK);
		return hash;
	}
	r->type = REC_STACK;
	r->nr = nr;
	r->pid = pid;
	r->truncated = n == MAX_FRAMES * sizeof(__u64);
	r->hash = hash;
	for (__u32 i = 0; i < MAX_FRAMES; i++) {
		__u64 keep = below_mask(i, nr);
		r->ips[i] = s->ips[start + i] & keep;
	}
	bpf_ringbuf_submit(r, ring_flags());
	__u8 one = 1;
	bpf_map_update_elem(&seen_stacks, &hash, &one, BPF_ANY);
	return hash;
}

/* Takes the user stack: the frame-pointer chain from uregs, or the
 * kernel's unwinder's where there are none (or a return probe is pending
 * and has swapped a return address), and sends it (send_stack). */
static __always_inline __u64 take_stack(void *ctx, __u32 pid, __u64 ret_slot, __u64 ret, struct pt_regs *uregs)
{
	long n;
	if (uregs) {
		n = walk_stack(PT_REGS_IP(uregs), PT_REGS_FP(uregs));
	} else {
		__u32 zero = 0;
		struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
		if (!s)
			return 0;
		n = bpf_get_stack(ctx, &s->ips[1], MAX_FRAMES * sizeof(__u64), BPF_F_USER_STACK);
	}
	return send_stack(pid, ret_slot, ret, n);
}

/* What decides a sample's unwound stack, hashed: the process and its
 * allocator's place (a new image has another), the probe site (ip) and its
 * caller (the return address at ret_slot), the locks held, the allocator
 * call (op and its caller), and the path from there to here: the distance
 * to the allocator call's return slot and every return address into the
 * allocator's code on the live stack between, with its depth. 0 when the
 * allocator's range is unknown: then every event is sampled. */
static __always_inline __u64 sample_key(struct thread_state *st, __u32 pid, __u32 op, __u64 ip,
					__u64 sp, __u64 ret_slot)
{
	struct alloc_range *r = bpf_map_lookup_elem(&alloc_ranges, &pid);
	if (!r || !st->alloc_sp || st->alloc_sp <= sp)
		return 0;
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s)
		return 0;
	__u64 ret = 0;
	if (ret_slot)
		bpf_probe_read_user(&ret, sizeof(ret), (void *)ret_slot);
	__u64 dist = st->alloc_sp - sp;
	__u64 h = 0xcbf29ce484222325ULL ^ pid;
	h = (h ^ r->lo) * 0x100000001b3ULL;
	h = (h ^ op) * 0x100000001b3ULL;
	h = (h ^ ip) * 0x100000001b3ULL;
	h = (h ^ ret) * 0x100000001b3ULL;
	h = (h ^ st->alloc_op) * 0x100000001b3ULL;
	h = (h ^ st->alloc_ret) * 0x100000001b3ULL;
	h = (h ^ dist) * 0x100000001b3ULL;
	for (__u32 i = 0; i < MAX_HELD; i++) {
		if (i >= st->nheld)
			break;
		h = (h ^ st->held_locks[i].addr) * 0x100000001b3ULL;
	}
	__u64 len = dist;
	if (len > sizeof(s->slots))
		len = sizeof(s->slots);
	len &= ~7ULL;
	if (len == 0 || bpf_probe_read_user(s->slots, len, (void *)sp))
		return 0;
	struct slot_scan c = {.len = len, .lo = r->lo, .hi = r->hi, .h = h};
	bpf_loop(SCAN_SLOTS, slot_scan_step, &c, 0);
	return c.h ? c.h : 1;
}

/* Sends raw stack memory for user-space unwinding, once per sample_key;
 * returns its id (top bit set, which no frame-pointer stack hash has), or
 * 0. An event whose key was sampled before names that sample again: user
 * space keeps a sample's stack while the kernel may still name it. */
/* Where a sample is taken: the registers and the probe's caller slot. */
struct sample_at {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 ret_slot;
	__u32 pid;
	__u32 op;
	__u64 until; /* the allocator call's return slot, when st has none */
};

/* A global function: the verifier checks it once, not at each of the
 * probes' call sites (its loops made uprobe_hook's verification approach
 * the one-million-instruction limit). */
__attribute__((noinline)) __u64 take_sample(struct thread_state *st, struct sample_at *at)
{
	if (!want_samples || !st || !at)
		return 0;
	__u32 pid = at->pid;
	__u64 ip = at->ip, sp = at->sp, bp = at->bp;
	__u64 until = at->until ? at->until : st->alloc_sp;
	__u64 key = sample_key(st, pid, at->op, ip, sp, at->ret_slot);
	if (key) {
		__u64 *known = bpf_map_lookup_elem(&seen_samples, &key);
		if (known)
			return *known;
	}
	__u32 zero = 0;
	struct sample *r = bpf_map_lookup_elem(&sample_buf, &zero);
	if (!r)
		return 0;
	/* Up to the allocator call's return slot and a little beyond: the
	 * unwinder needs the frames down to the allocator's entry, and the
	 * margin gives it the callers' frames too. */
	__u64 len = SAMPLE_BYTES;
	if (until > sp && until - sp + 2048 < SAMPLE_BYTES)
		len = until - sp + 2048;
	/* clang sees that the test above already bounds len and drops the
	 * mask and the test below; the verifiers of 6.1 and 6.12 cannot
	 * follow that bound to the copy of len it made before the test, and
	 * rejected the program ("R2 min value is negative"). Hide len from
	 * clang so that both stay. */
	barrier_var(len);
	len &= SAMPLE_BYTES - 1;
	if (len < 64)
		len = SAMPLE_BYTES - 8;
	/* The top of a thread's stack may be closer than len: shrink until
	 * the read succeeds. */
	long err = bpf_probe_read_user(r->data, len, (void *)sp);
	if (err) {
		len = 1024;
		err = bpf_probe_read_user(r->data, len, (void *)sp);
	}
	if (err)
		return 0;
	__u64 id = (1ULL << 63) | ((__u64)bpf_get_prandom_u32() << 20) | (bpf_ktime_get_ns() & 0xfffff);
	r->type = REC_SAMPLE;
	r->len = len;
	r->pid = pid;
	r->pad = 0;
	r->hash = id;
	r->ip = ip;
	r->sp = sp;
	r->bp = bp;
	__u64 size = __builtin_offsetof(struct sample, data) + len;
	if (size > sizeof(*r))
		size = sizeof(*r);
	if (bpf_ringbuf_output(&ring, r, size, ring_flags())) {
		count_lost(REC_SAMPLE);
		return 0;
	}
	if (key)
		bpf_map_update_elem(&seen_samples, &key, &id, BPF_ANY);
	return id;
}

/* Events are built on the BPF stack and copied into the ring when done:
 * the ring is read in reservation order, and the stack (or sample) record
 * an event names must come before it. */
static __always_inline void event_init(struct event *e, __u32 op, __u64 id)
{
	e->type = REC_EVENT;
	e->op = op;
	e->flags = 0;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->time = bpf_ktime_get_ns();
	e->addr = 0;
	e->addr2 = 0;
	e->size = 0;
	e->arg = 0;
	e->ret = 0;
	e->stack = 0;
}

static __always_inline void event_send(struct event *e)
{
	if (bpf_ringbuf_output(&ring, e, sizeof(*e), ring_flags()))
		count_lost(REC_EVENT);
}

/* A record about to be sent (aggregate mode) uses the lock at addr (see
 * lives): a kept init of it goes first, in the sending thread's name (no
 * finding depends on which thread made an init), and the lifetime is live
 * again. */
static __always_inline void life_use(struct event *e, __u64 addr)
{
	struct life_key k = {.pid = e->pid, .pad = 0, .addr = addr};
	struct life *l = bpf_map_lookup_elem(&lives, &k);
	if (!l)
		return;
	__u32 zero = 0;
	struct event *init = l->state == LIFE_PENDING && l->exec_epoch == exec_epoch ?
				     bpf_map_lookup_elem(&life_buf, &zero) : 0;
	if (init) {
		/* Built in a map, not on the stack: the verifier then finds the
		 * paths through here alike, and does not walk what follows once
		 * for each. */
		event_init(init, l->op, ((__u64)e->pid << 32) | e->tid);
		init->time = e->time;
		init->flags = l->flags;
		init->addr = addr;
		init->arg = l->arg;
		init->stack = l->stack;
		event_send(init);
	}
	bpf_map_delete_elem(&lives, &k);
}

static __always_inline int is_mutex(__u32 op)
{
	return op >= OP_MUTEX_LOCK && op <= OP_MUTEX_DESTROY;
}

static __always_inline int is_rwlock(__u32 op)
{
	return op >= OP_RWLOCK_RDLOCK && op <= OP_RWLOCK_UNLOCK;
}

/* A call that misuses a mutex or rwlock: an unlock by a thread that does
 * not hold it, or a destroy of a held one. What the lock's word says then:
 * whether it is held, and by which thread where it names one (a mutex's
 * __owner, a rwlock's writer; 0 for readers or nobody). Read on these rare
 * calls only; spinlocks are not read. */
static __always_inline int lock_word_holder(__u32 op, __u64 lock, __u32 *holder)
{
	__u32 w[GLIBC_LOCK_WORDS] = {};
	*holder = 0;
	if (bpf_probe_read_user(w, sizeof(w), (void *)lock))
		return 0;
	return glibc_lock_held(is_mutex(op), w, holder);
}

/* What the analysis needs to know of a lock's type, read from the lock: a
 * mutex's __kind, a rwlock's preference (__flags); 0 for spinlocks. */
static __always_inline __u32 lock_kind(__u32 op, __u64 lock)
{
	__u32 kind = 0;
	if (is_mutex(op))
		bpf_probe_read_user(&kind, sizeof(kind), (void *)(lock + GLIBC_MUTEX_KIND_OFFSET));
	else if (is_rwlock(op))
		bpf_probe_read_user(&kind, sizeof(kind), (void *)(lock + GLIBC_RWLOCK_FLAGS_OFFSET));
	return kind;
}

static __always_inline void held_push(struct thread_state *st, __u64 addr, __u32 op, __u32 kind,
				      __u64 stack, __u64 time, __u16 sent)
{
	__u32 i = st->nheld;
	if (i >= MAX_HELD)
		return;
	st->held_locks[i].addr = addr;
	st->held_locks[i].stack = stack;
	st->held_locks[i].time = time;
	st->held_locks[i].kind = kind;
	st->held_locks[i].op = op;
	st->held_locks[i].sent = sent;
	st->nheld = i + 1;
}

/* Removes the innermost entry for addr: -1 when there is none, else
 * whether its acquisition was sent. */
static __always_inline int held_pop(struct thread_state *st, __u64 addr)
{
	/* Locks are mostly released innermost first. */
	__u32 top = st->nheld - 1;
	if (top < MAX_HELD && st->held_locks[top].addr == addr) {
		st->nheld = top;
		return st->held_locks[top].sent;
	}
	int found = -1, sent = -1;
	for (int i = MAX_HELD - 1; i >= 0; i--) {
		if ((__u32)i < st->nheld && st->held_locks[i].addr == addr) {
			found = i;
			sent = st->held_locks[i].sent;
			break;
		}
	}
	if (found < 0)
		return -1;
	for (int i = 0; i < MAX_HELD - 1; i++) {
		if (i >= found && (__u32)(i + 1) < st->nheld)
			st->held_locks[i] = st->held_locks[i + 1];
	}
	st->nheld--;
	return sent;
}

/* The chain-cache key of an acquisition (or of an allocator call, lock 0)
 * at site with the thread's held locks. */
static __always_inline __u64 pattern_key(struct thread_state *st, __u32 pid, __u32 op, __u64 lock, __u64 site)
{
	__u64 h = 0xcbf29ce484222325ULL ^ pid;
	h = (h ^ lock_epoch) * 0x100000001b3ULL;
	h = (h ^ op) * 0x100000001b3ULL;
	h = (h ^ lock) * 0x100000001b3ULL;
	h = (h ^ site) * 0x100000001b3ULL;
	for (__u32 i = 0; i < MAX_HELD; i++) {
		if (i >= st->nheld)
			break;
		h = (h ^ st->held_locks[i].addr) * 0x100000001b3ULL;
	}
	return h;
}

/* Sends the acquisition of h, the i-th lock held, in thread id's name,
 * at its own time if it has one; returns the lock's kind. Global: the
 * loops over the held locks call it up to MAX_HELD times. */
GLOBAL_FUNC __u32 send_held(const struct held_lock *h, __u32 i, __u64 id)
{
	if (!h)
		return 0;
	struct event e;
	event_init(&e, h->op, id);
	if (h->time)
		e.time = h->time;
	e.addr = h->addr;
	e.arg = lock_kind(h->op, h->addr);
	e.stack = h->stack;
	e.flags = F_ACQUIRED | (i > 0 ? F_LOCKS_HELD : 0);
	event_send(&e);
	return e.arg;
}

/* Sends the acquisitions of held locks that were only counted: something
 * new is about to be sent, and the analysis must know what is held. */
GLOBAL_FUNC int flush_held(struct thread_state *st, __u64 id)
{
	if (!st)
		return 0;
	for (__u32 i = 0; i < MAX_HELD; i++) {
		if (i >= st->nheld)
			break;
		if (st->held_locks[i].sent)
			continue;
		send_held(&st->held_locks[i], i, id);
		st->held_locks[i].sent = 1;
	}
	return 0;
}

/* Looks a pattern up in the thread's cache, then in the shared chain
 * cache; returns the stack hash it was sent with, or 0 when it is new. */
static __always_inline __u64 pattern_seen(struct thread_state *st, __u64 key)
{
	__u32 i = key & (PATTERN_CACHE - 1);
	if (st->cache_key[i] == key)
		return st->cache_stack[i];
	__u64 *stack = bpf_map_lookup_elem(&seen_acq, &key);
	if (!stack)
		return 0;
	st->cache_key[i] = key;
	st->cache_stack[i] = *stack | (1ULL << 62); /* never 0, even for a stackless first sighting */
	return st->cache_stack[i];
}

static __always_inline void pattern_sent(struct thread_state *st, __u64 key, __u64 stack)
{
	bpf_map_update_elem(&seen_acq, &key, &stack, BPF_ANY);
	__u32 i = key & (PATTERN_CACHE - 1);
	st->cache_key[i] = key;
	st->cache_stack[i] = stack | (1ULL << 62);
}

/* Whether the chain cache may hide this call: aggregate mode, and every
 * held lock is in the array, so the key covers them all. */
static __always_inline int dedupable(struct thread_state *st)
{
	return !full_mode && st->held >= 0 && (__u32)st->held == st->nheld;
}

/* Marks an event made inside an allocator call (a hook the allocator ran). */
static __always_inline void alloc_context(struct event *e, struct thread_state *st, __u64 sp)
{
	if (!in_alloc(st, e->pid, sp))
		return;
	e->flags |= F_IN_ALLOC;
	e->addr2 = st->alloc_op | ((__u64)st->alloc_seq << 16);
}

static __always_inline int is_unlock(__u32 op)
{
	return op == OP_MUTEX_UNLOCK || op == OP_RWLOCK_UNLOCK || op == OP_SPIN_UNLOCK;
}

/* The entry to keep an init in instead of sending it (its stack is the
 * caller's to fill), at an address whose last lifetime ended, or whose
 * last init is still kept (see lives); NULL to send it. */
static __always_inline struct life *life_keep(struct event *e)
{
	if (full_mode)
		return 0;
	struct life_key k = {.pid = e->pid, .pad = 0, .addr = e->addr};
	struct life *l = bpf_map_lookup_elem(&lives, &k);
	if (!l)
		return 0;
	l->arg = e->arg;
	l->op = e->op;
	l->flags = e->flags & F_BUSY;
	l->exec_epoch = exec_epoch;
	l->state = LIFE_PENDING;
	return l;
}

/* A destroy (not a misuse): whether it ends a kept init's lifetime, which
 * nothing used, so that neither is sent. */
static __always_inline int life_unused(struct event *e)
{
	if (full_mode)
		return 0;
	struct life_key k = {.pid = e->pid, .pad = 0, .addr = e->addr};
	struct life *l = bpf_map_lookup_elem(&lives, &k);
	if (!l || l->state != LIFE_PENDING)
		return 0;
	l->state = LIFE_ENDED;
	return 1;
}

/* A destroy was sent: the analysis ends the lock's lifetime. */
static __always_inline void life_ended(struct event *e)
{
	if (full_mode)
		return;
	struct life_key k = {.pid = e->pid, .pad = 0, .addr = e->addr};
	struct life v = {.state = LIFE_ENDED};
	bpf_map_update_elem(&lives, &k, &v, BPF_ANY);
}

/* Whether the thread may hold lock: it is in the held array, or the array
 * overflowed and cannot say. */
static __always_inline int may_hold(struct thread_state *st, __u64 lock)
{
	if (st->held < 0 || (__u32)st->held > st->nheld)
		return 1;
	for (__u32 i = 0; i < MAX_HELD; i++) {
		if (i >= st->nheld)
			break;
		if (st->held_locks[i].addr == lock)
			return 1;
	}
	return 0;
}

/* What a call at the address glibc 2.36's pthread_spin_unlock shares with
 * pthread_spin_init (or any unlock sharing its code with an init) is: both
 * store GLIBC_SPIN_UNLOCKED, and releasing a lock nobody holds is
 * undefined, so the call is a release only when a thread holds the lock.
 * When this thread's record says it may, it is. Otherwise it is an init,
 * unless the word, read before the store, says held: 0 (pthread_spin_lock
 * took it) or below (threads have tried it since). Memory about to become
 * a lock says that too (zeroed memory; a reused chunk's allocator pointers
 * are any value), so such an init is flagged F_BUSY, and the analysis
 * takes it for a release when another thread holds the lock in its
 * record. 1 is unlocked: memory of an earlier lock, reused. (A lock taken
 * before an attach, unknown to both, gives nothing either way.) */
static __always_inline __u32 alias_op(struct thread_state *st, __u64 lock, __u32 op, __u32 alias, __u16 *flags)
{
	if (may_hold(st, lock))
		return op;
	if (op != OP_SPIN_UNLOCK)
		return alias;
	__s32 word = GLIBC_SPIN_UNLOCKED;
	bpf_probe_read_user(&word, sizeof(word), (void *)lock);
	if (glibc_spin_held(word))
		*flags = F_BUSY;
	return alias;
}

/* Whether this hit is the same call's probe firing again: glibc's
 * pthread_spin_lock cannot be probed at its lock-prefixed entry, and its
 * spin loop jumps back to that entry, so the probe past it fires on every
 * retry. A retry has the same lock, stack pointer and return address as
 * the hit before, and the lock is held (it was recorded as taken then). A
 * thread that really calls the lock twice from one call site, holding it,
 * spins forever on its own lock: that second call is missed. */
static __always_inline int refired(struct thread_state *st, __u64 lock, __u64 sp, __u64 ret_slot)
{
	__u64 ret = stack_word(&st->stack_page, ret_slot);
	if (st->refire_lock == lock && st->refire_sp == sp && st->refire_ret == ret && may_hold(st, lock))
		return 1;
	st->refire_lock = lock;
	st->refire_sp = sp;
	st->refire_ret = ret;
	return 0;
}

static __always_inline int is_try_or_timed(__u32 op)
{
	switch (op) {
	case OP_MUTEX_TRYLOCK:
	case OP_MUTEX_TIMEDLOCK:
	case OP_MUTEX_CLOCKLOCK:
	case OP_RWLOCK_TRYRDLOCK:
	case OP_RWLOCK_TRYWRLOCK:
	case OP_RWLOCK_TIMEDRDLOCK:
	case OP_RWLOCK_TIMEDWRLOCK:
	case OP_RWLOCK_CLOCKRDLOCK:
	case OP_RWLOCK_CLOCKWRLOCK:
	case OP_SPIN_TRYLOCK:
		return 1;
	}
	return 0;
}

/* Sends the event with the right stack: a raw sample inside an allocator
 * call (glibc frames need CFI unwinding), a frame-pointer stack otherwise.
 * call_ret: the probe is on a call, which returns there (see COOKIE_CALL);
 * a sample is unwound from the caller then, whose ip names the call. */
static __always_inline void send_with_stack(void *ctx, struct event *e, struct pt_regs *regs,
					    __u64 ret_slot, __u64 call_ret, struct thread_state *st)
{
	if ((e->flags & F_IN_ALLOC) && want_samples) {
		struct sample_at at = {PT_REGS_IP(regs), PT_REGS_SP(regs), PT_REGS_FP(regs), call_ret ? 0 : ret_slot,
				       e->pid, e->op};
		e->stack = take_sample(st, &at);
	}
	if (!e->stack)
		e->stack = take_stack(ctx, e->pid, ret_slot, call_ret, st->uret_pending ? 0 : regs);
	event_send(e);
}

/* The attach cookie of the probe that fired: the thread's memory of it,
 * while the code at that address has not changed since (code_epoch is read
 * first, so a change racing with the helper call leaves the entry stale). */
static __always_inline __u64 probe_cookie(struct pt_regs *ctx, struct thread_state *st)
{
	__u64 ip = PT_REGS_IP(ctx);
	__u64 epoch = code_epoch;
	struct site_cookie *c = &st->sites[(ip ^ (ip >> 5)) & (SITE_CACHE - 1)];
	if (c->ip == ip && c->epoch == epoch)
		return c->cookie;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	c->ip = ip;
	c->cookie = cookie;
	c->epoch = epoch;
	return cookie;
}

SEC("uprobe.multi")
int uprobe_hook(struct pt_regs *ctx)
{
	if (!tracing_on)
		return 0;
	struct thread_state *st = thread_get();
	if (!st) {
		count_call(COOKIE_OP(bpf_get_attach_cookie(ctx)));
		bpf_tail_call(ctx, &no_private_stack, 0);
		return 0;
	}
	if (!gate_passed(st))
		return 0;
	__u64 cookie = probe_cookie(ctx, st);
	__u32 op = COOKIE_OP(cookie);
	__u64 sp = PT_REGS_SP(ctx);
	__u64 ret_slot = sp + COOKIE_ADJ(cookie);
	/* On a call: where its return address will be, and what it will be.
	 * The high half means this only for lock probes. */
	__u64 call_ret = 0;
	if (((op >= OP_MUTEX_LOCK && op <= OP_COND_TIMEDWAIT) || (op >= OP_RWLOCK_INIT && op <= OP_SPIN_DESTROY)) &&
	    COOKIE_CALL(cookie)) {
		ret_slot = sp - 8;
		call_ret = PT_REGS_IP(ctx) + COOKIE_CALL(cookie);
	}
	__u64 id = thread_ids(st);
	__u16 alias_flags = 0;
	if (is_unlock(op) && COOKIE_ALIAS(cookie))
		op = alias_op(st, PT_REGS_PARM1(ctx), op, COOKIE_ALIAS(cookie), &alias_flags);
	/* The high half means this only for lock probes. */
	if (op >= OP_MUTEX_LOCK && op <= OP_SPIN_UNLOCK && COOKIE_REFIRES(cookie) &&
	    refired(st, PT_REGS_PARM1(ctx), sp, ret_slot))
		return 0;

	if (op >= OP_MALLOC && op <= OP_PVALLOC) {
		__u32 pid = id >> 32;
		if (COOKIE_RANGE_LEN(cookie) && st->range_pid != pid) {
			struct alloc_range r;
			r.lo = PT_REGS_IP(ctx) - COOKIE_RANGE_BACK(cookie);
			r.hi = r.lo + COOKIE_RANGE_LEN(cookie);
			bpf_map_update_elem(&alloc_ranges, &pid, &r, BPF_NOEXIST);
			st->range_pid = pid;
		}
		if (allocator_own(st, pid, op, ret_slot, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)))
			return 0;
		count_call(op);
		int nested = in_alloc(st, pid, ret_slot);
		__u64 outer = st->alloc_op | ((__u64)st->alloc_seq << 16);
		if (!nested) {
			st->alloc_seq++;
			st->alloc_sp = ret_slot;
			st->alloc_ret = stack_word(&st->stack_page, ret_slot);
			st->alloc_ip = PT_REGS_IP(ctx);
			st->alloc_op = op;
		}
		int covers = 0;
		if (!full_mode && !nested && op == OP_FREE &&
		    (covers = free_covers_lock(pid, PT_REGS_PARM1(ctx))))
			__sync_fetch_and_add(&lock_epoch, 1);
		if (!full_mode && !nested && !covers && st->held <= 0)
			return 0;
		__u64 key = 0;
		if (!nested && !covers && dedupable(st)) {
			key = pattern_key(st, pid, op, 0, st->alloc_ret);
			if (pattern_seen(st, key))
				return 0;
		}
		flush_held(st, id);
		struct event ev, *e = &ev;
		event_init(e, op, id);
		if (nested) {
			e->flags |= F_IN_ALLOC;
			e->addr2 = outer;
		}
		if (st->held > 0)
			e->flags |= F_LOCKS_HELD;
		__u64 a0 = PT_REGS_PARM1(ctx), a1 = PT_REGS_PARM2(ctx), a2 = PT_REGS_PARM3(ctx);
		switch (op) {
		case OP_MALLOC:
		case OP_VALLOC:
		case OP_PVALLOC:
			e->size = a0;
			break;
		case OP_CALLOC:
			e->size = a0 * a1;
			break;
		case OP_REALLOC:
			e->addr = a0;
			e->size = a1;
			break;
		case OP_FREE:
			e->addr = a0;
			if (a0) {
				__u64 sz = 0;
				if (!bpf_probe_read_user(&sz, sizeof(sz), (void *)(a0 - GLIBC_CHUNK_SIZE_AT)))
					e->size = glibc_chunk_freed(sz);
			}
			break;
		case OP_POSIX_MEMALIGN:
			e->arg = a1;
			e->size = a2;
			break;
		case OP_ALIGNED_ALLOC:
		case OP_MEMALIGN:
			e->arg = a0;
			e->size = a1;
			break;
		}
		send_with_stack(ctx, e, ctx, ret_slot, call_ret, st);
		if (key)
			pattern_sent(st, key, e->stack);
		return 0;
	}

	count_call(op);
	if (op == OP_PROBE_ENTER) {
		st->uret_pending++;
		flush_held(st, id);
		struct event ev, *e = &ev;
		event_init(e, op, id);
		e->arg = COOKIE_USER(cookie);
		/* The first integer argument: a rule may count the function only
		 * with one value ("NAME if arg0 == V"). User probes sit at the
		 * entry, where rdi still holds it. */
		e->addr = PT_REGS_PARM1(ctx);
		/* Where its return address is: its exit names the same slot, on
		 * whichever thread it returns. */
		e->size = ret_slot;
		alloc_context(e, st, ret_slot);
		if (st->held > 0)
			e->flags |= F_LOCKS_HELD;
		send_with_stack(ctx, e, ctx, ret_slot, call_ret, st);
		return 0;
	}

	/* Calls whose result matters are finished by the return probe. */
	if (is_try_or_timed(op) || op == OP_COND_WAIT || op == OP_COND_TIMEDWAIT) {
		st->uret_pending++;
		st->pend_op = op;
		st->pend_addr = PT_REGS_PARM1(ctx);
		st->pend_addr2 = PT_REGS_PARM2(ctx);
		if (op != OP_COND_WAIT && op != OP_COND_TIMEDWAIT)
			return 0;
		/* cond_wait releases its mutex now. */
		flush_held(st, id);
		struct event ev, *e = &ev;
		event_init(e, op, id);
		e->addr = st->pend_addr;
		e->addr2 = st->pend_addr2;
		held_pop(st, e->addr2);
		if (st->held > 0)
			st->held--;
		send_with_stack(ctx, e, ctx, ret_slot, call_ret, st);
		return 0;
	}

	__u64 lock = PT_REGS_PARM1(ctx);
	/* A mutex or rwlock call that misuses the lock (see lock_word_holder)
	 * is sent with its stack, and the holder its word names. */
	int misuse = 0;
	__u32 holder = 0;
	switch (op) {
	case OP_MUTEX_UNLOCK:
	case OP_RWLOCK_UNLOCK:
	case OP_SPIN_UNLOCK: {
		int sent = held_pop(st, lock);
		if (st->held > 0)
			st->held--;
		/* Its acquisition was only counted: so is its release. */
		if (sent == 0)
			return 0;
		/* At a spinlock's shared entry such a call was an init
		 * (alias_op); a probe on a call of pthread_spin_unlock (no
		 * alias) knows it for an unlock. A spinlock's word names no
		 * holder. */
		if (sent < 0 && op != OP_SPIN_UNLOCK) {
			misuse = 1;
			lock_word_holder(op, lock, &holder);
		} else if (sent < 0 && !COOKIE_ALIAS(cookie)) {
			misuse = 1;
		}
		break;
	}
	case OP_MUTEX_INIT:
	case OP_MUTEX_DESTROY:
	case OP_RWLOCK_INIT:
	case OP_RWLOCK_DESTROY:
	case OP_SPIN_INIT:
	case OP_SPIN_DESTROY:
		/* A lifetime ends (re-initialising a live lock ends it too). */
		__sync_fetch_and_add(&lock_epoch, 1);
		if ((op == OP_MUTEX_DESTROY || op == OP_RWLOCK_DESTROY) && lock_word_holder(op, lock, &holder)) {
			/* Destroyed while held: the analysis names the holder's
			 * acquisition, which may have been only counted. */
			misuse = 1;
			flush_held(st, id);
		}
		break;
	default: { /* blocking acquisitions */
		/* A pattern seen before is only counted, unless a hook takes
		 * it inside the allocator (those carry the arena question). */
		__u64 key = 0;
		if (dedupable(st) && st->nheld < MAX_HELD && !in_alloc(st, id >> 32, ret_slot)) {
			/* As lockdep's chain key: the lock and what is held, not
			 * the call site (the lock graph's edges do not depend on
			 * it, and a lock taken from many places would be sent
			 * once for each). */
			key = pattern_key(st, id >> 32, op, lock, 0);
			__u64 known = pattern_seen(st, key);
			if (known) {
				/* The mutex kind is read if the acquisition is ever
				 * sent, and the clock too (flush_held stamps it then),
				 * as the preload recorder does: a repeated acquisition
				 * reads no clock. */
				held_push(st, lock, op, 0, known & ~(1ULL << 62), 0, 0);
				st->held++;
				return 0;
			}
		}
		flush_held(st, id);
		struct event ev, *e = &ev;
		event_init(e, op, id);
		e->addr = lock;
		e->arg = lock_kind(op, lock);
		if (st->held > 0)
			e->flags |= F_LOCKS_HELD;
		e->flags |= F_ACQUIRED;
		alloc_context(e, st, ret_slot);
		if (!full_mode)
			life_use(e, lock);
		send_with_stack(ctx, e, ctx, ret_slot, call_ret, st);
		held_push(st, lock, op, e->arg, e->stack, e->time, 1);
		st->held++;
		lock_page_add(id >> 32, lock);
		if (key)
			pattern_sent(st, key, e->stack);
		return 0;
	}
	}
	struct event ev, *e = &ev;
	event_init(e, op, id);
	e->addr = lock;
	if (op == OP_RWLOCK_INIT) {
		__u64 attr = PT_REGS_PARM2(ctx);
		__u32 pref = 0;
		if (attr)
			bpf_probe_read_user(&pref, sizeof(pref), (void *)(attr + GLIBC_RWLOCKATTR_KIND_OFFSET));
		e->arg = pref;
	} else if (op != OP_MUTEX_UNLOCK) {
		e->arg = lock_kind(op, lock);
	}
	if (st->held > 0)
		e->flags |= F_LOCKS_HELD;
	/* Inits are sent with their stack: it names heap locks. */
	if (op == OP_MUTEX_INIT || op == OP_RWLOCK_INIT || op == OP_SPIN_INIT) {
		e->flags |= alias_flags;
		/* As send_with_stack: an init is never inside an allocator call. */
		struct life *kept = life_keep(e);
		e->stack = take_stack(ctx, e->pid, ret_slot, call_ret, st->uret_pending ? 0 : ctx);
		if (kept)
			kept->stack = e->stack;
		else
			event_send(e);
		lock_page_add(id >> 32, lock);
		return 0;
	}
	int destroy = op == OP_MUTEX_DESTROY || op == OP_RWLOCK_DESTROY || op == OP_SPIN_DESTROY;
	/* A release (sent: its lock's acquisition was, or nobody held it) or
	 * a misuse uses the lock. */
	if (!full_mode && (misuse || !destroy))
		life_use(e, lock);
	if (misuse) {
		if (destroy)
			e->flags |= F_BUSY;
		e->addr2 = holder;
		send_with_stack(ctx, e, ctx, ret_slot, call_ret, st);
		return 0;
	}
	if (destroy && life_unused(e))
		return 0;
	event_send(e);
	if (destroy)
		life_ended(e);
	return 0;
}

SEC("uretprobe.multi")
int uretprobe_hook(struct pt_regs *ctx)
{
	if (!tracing_on)
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 op = COOKIE_OP(cookie);
	struct thread_state *st = thread_find();
	if (!st) {
		bpf_tail_call(ctx, &no_private_stack, 0);
		return 0;
	}
	if (!gate_passed(st))
		return 0;
	__u64 id = thread_ids(st);
	if (st->uret_pending > 0)
		st->uret_pending--;
	__s64 ret = PT_REGS_RC(ctx);

	if (op == OP_PROBE_EXIT) {
		count_call(op);
		struct event ev, *e = &ev;
		event_init(e, op, id);
		e->flags |= F_RETURN;
		e->arg = COOKIE_USER(cookie);
		e->ret = ret;
		e->size = PT_REGS_SP(ctx) - 8; /* its ret popped the slot */
		event_send(e);
		return 0;
	}
	if (st->pend_op != op)
		return 0;
	st->pend_op = 0;
	flush_held(st, id);
	struct event ev, *e = &ev;
	event_init(e, op, id);
	e->flags |= F_RETURN;
	e->addr = st->pend_addr;
	e->addr2 = st->pend_addr2;
	e->ret = (int)ret;
	__u64 sp = PT_REGS_SP(ctx);
	if (op == OP_COND_WAIT || op == OP_COND_TIMEDWAIT) {
		/* The mutex is held again whatever the wait's result. */
		e->flags |= F_ACQUIRED;
		st->held++;
	} else if ((int)ret == 0) {
		e->flags |= F_ACQUIRED;
		st->held++;
	}
	e->arg = lock_kind(op, e->addr);
	if (st->held > 1 || ((e->flags & F_ACQUIRED) == 0 && st->held > 0))
		e->flags |= F_LOCKS_HELD;
	alloc_context(e, st, sp);
	if (!full_mode && (e->flags & F_ACQUIRED))
		life_use(e, (op == OP_COND_WAIT || op == OP_COND_TIMEDWAIT) ? e->addr2 : e->addr);
	/* At the return the caller's frame is whole: no slot to put back. */
	send_with_stack(ctx, e, ctx, 0, 0, st);
	if (e->flags & F_ACQUIRED) {
		int cond = op == OP_COND_WAIT || op == OP_COND_TIMEDWAIT;
		held_push(st, cond ? e->addr2 : e->addr, cond ? OP_MUTEX_LOCK : op, e->arg, e->stack, e->time, 1);
		lock_page_add(id >> 32, cond ? e->addr2 : e->addr);
	}
	return 0;
}

/* Sends the library a loader handle (struct link_map *, whose first fields
 * are the load bias and the path) names: loaded, or about to be unloaded. */
static __always_inline void send_object(__u64 handle, __u32 gone)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	if (!handle || !is_traced(pid))
		return;
	struct {
		__u64 l_addr;
		__u64 l_name;
	} lm = {};
	if (bpf_probe_read_user(&lm, sizeof(lm), (void *)handle) || !lm.l_name)
		return;
	struct object *r = bpf_ringbuf_reserve(&ring, sizeof(*r), 0);
	if (!r) {
		count_lost(REC_OBJECT);
		return;
	}
	r->type = REC_OBJECT;
	r->pid = pid;
	r->time = bpf_ktime_get_ns();
	r->base = lm.l_addr;
	r->gone = gone;
	long n = bpf_probe_read_user_str(r->path, sizeof(r->path), (void *)lm.l_name);
	r->len = n > 0 ? n - 1 : 0;
	/* At once: a library just loaded may call functions probed on their
	 * calls, which the tracer probes in it when it reads this. */
	bpf_ringbuf_submit(r, gone ? ring_flags() : BPF_RB_FORCE_WAKEUP);
}

/* The loader's entry points, told apart by the cookie (one link for all):
 * dlclose's (1) sends its argument before anything is unmapped; dlopen's
 * and dlmopen's (0) count their return probe as pending, since it swaps
 * the return address, so the frame-pointer walks of the calls made inside
 * (the library's constructors) go through the kernel's unwinder, which
 * puts it back (see thread_state.uret_pending). */
SEC("uprobe.multi")
int uprobe_loader(struct pt_regs *ctx)
{
	if (bpf_get_attach_cookie(ctx)) {
		send_object(PT_REGS_PARM1(ctx), 1);
		return 0;
	}
	struct thread_state *st = thread_get();
	if (st)
		st->uret_pending++;
	return 0;
}

/* dlopen's and dlmopen's result: the library is mapped, its constructors
 * have run. */
SEC("uretprobe.multi")
int uretprobe_dlopen(struct pt_regs *ctx)
{
	struct thread_state *st = thread_find();
	if (st && st->uret_pending)
		st->uret_pending--;
	send_object(PT_REGS_RC(ctx), 0);
	return 0;
}

/* Marks a memory syscall made inside an allocator call, as the preloaded
 * recorder tells it: its state for the calling thread, at the thread
 * pointer plus the offset it named. Without allocator probes in_alloc
 * knows no call. The state must be the thread's own (a fork child's copy
 * of its parent's is not until it records). Returns the allocator call's
 * return slot, where a sample may end, or 0. */
static __always_inline __u64 shim_alloc_context(struct event *e, __u64 id)
{
	__u32 pid = id >> 32;
	__s64 *off = bpf_map_lookup_elem(&shim_tls, &pid);
	if (!off)
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	struct shim_alloc_state s;
	if (!tp || bpf_probe_read_user(&s, sizeof(s), (void *)(tp + *off)))
		return 0;
	if (s.tid != (__u32)id || !s.alloc_depth)
		return 0;
	e->flags |= F_IN_ALLOC;
	e->addr2 = s.alloc_op | ((__u64)s.alloc_seq << 16);
	return s.alloc_sp;
}

/* Whether the madvise at regs is the preloaded recorder naming where its
 * per-thread state lies (enum shim_ready), before the process's first
 * interposed call; remembers it for a process in the traced map (gated
 * before its exec, or followed at its fork). Not gated on tracing_on: the
 * target may start before the reader turns tracing on. */
static __always_inline int is_shim_ready(struct pt_regs *regs)
{
	__u64 len = 0, advice = 0;
	if (bpf_probe_read_kernel(&len, sizeof(len), &regs->si) || len != SHIM_READY_LEN ||
	    bpf_probe_read_kernel(&advice, sizeof(advice), &regs->dx) || advice != SHIM_READY_ADVICE)
		return 0;
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	__s64 off = 0;
	if (bpf_map_lookup_elem(&traced, &pid) && !bpf_probe_read_kernel(&off, sizeof(off), &regs->di))
		bpf_map_update_elem(&shim_tls, &pid, &off, BPF_ANY);
	return 1;
}

/* Memory syscalls, from the raw tracepoint: sees calls made through a
 * patched libc entry or a raw syscall instruction, and costs no trap. */
SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	/* The syscall's number first: the tracepoint fires for every
	 * syscall of every process, and the futex calls of a contended
	 * target are most of its own. */
	long nr = ctx->args[1];
	__u32 op;
	switch (nr) {
	case __NR_mmap:
		op = OP_MMAP;
		break;
	case __NR_munmap:
		op = OP_MUNMAP;
		break;
	case __NR_brk:
		op = OP_BRK;
		break;
	case __NR_mremap:
		op = OP_MREMAP;
		break;
	case __NR_madvise:
		op = OP_MADVISE;
		break;
	default:
		return 0;
	}
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	if (op == OP_MADVISE && is_shim_ready(regs))
		return 0;
	__u64 id;
	if (!current_traced(&id))
		return 0;
	__u32 pid = id >> 32;
	count_call(op);
	struct pt_regs r = {};
	if (bpf_probe_read_kernel(&r, sizeof(r), regs))
		return 0;
	struct thread_state *st = thread_get();
	if (!st)
		return 0;
	struct event ev, *e = &ev;
	event_init(e, op, id);
	/* Syscall arguments: rdi, rsi, rdx, r10, r8. */
	e->addr = r.di;
	switch (op) {
	case OP_MADVISE:
		e->size = r.si;
		e->arg = r.dx;
		break;
	case OP_MUNMAP:
		e->size = r.si;
		__sync_fetch_and_add(&lock_epoch, 1); /* may end locks' lifetimes */
		__sync_fetch_and_add(&code_epoch, 1); /* and unmap probed code */
		break;
	case OP_MREMAP:
		e->size = r.si;
		e->arg = r.dx;
		__sync_fetch_and_add(&lock_epoch, 1);
		__sync_fetch_and_add(&code_epoch, 1);
		break;
	case OP_MMAP:
		e->size = r.si;
		e->arg = r.dx | (r.r10 << 32);
		if (r.dx & PROT_EXEC) /* code, perhaps where other code was */
			__sync_fetch_and_add(&code_epoch, 1);
		break;
	}
	if (st->held > 0)
		e->flags |= F_LOCKS_HELD;
	alloc_context(e, st, r.sp);
	__u64 until = 0;
	if (!(e->flags & F_IN_ALLOC))
		until = shim_alloc_context(e, id);
	if ((e->flags & F_IN_ALLOC) && want_samples) {
		struct sample_at at = {r.ip, r.sp, r.bp, r.sp, pid, op, until};
		e->stack = take_sample(st, &at);
	}
	if (!e->stack)
		e->stack = take_stack(ctx, pid, r.sp, 0, st->uret_pending ? 0 : &r);
	event_send(e);
	return 0;
}

SEC("raw_tracepoint/sched_process_fork")
int sched_fork(struct bpf_raw_tracepoint_args *ctx)
{
	if (!tracing_on)
		return 0;
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	__u32 ppid = BPF_CORE_READ(parent, tgid);
	if (!is_traced(ppid))
		return 0;
	__u32 ctid = BPF_CORE_READ(child, pid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	int process = ctgid != ppid;
	if (process && follow_forks) {
		__u8 v = TRACED;
		bpf_map_update_elem(&traced, &ctgid, &v, BPF_ANY);
	}
	__u64 id = bpf_get_current_pid_tgid();
	count_call(OP_THREAD_CREATE);
	struct event ev, *e = &ev;
	event_init(e, OP_THREAD_CREATE, id);
	e->arg = ctid;
	e->addr = ctgid;
	if (process)
		e->flags |= F_PROCESS;
	e->stack = take_stack(ctx, e->pid, 0, 0, 0);
	event_send(e);
	/* A followed child of fork holds the locks the forking thread held
	 * (its fork handlers' included): the analysis is told they are the
	 * child's, and the child's state takes them at its first hit. A child
	 * that shares its parent's memory (vfork, posix_spawn, clone with
	 * CLONE_VM) shares the locks too and holds none of them. */
	if (!process || !follow_forks || BPF_CORE_READ(child, mm) == BPF_CORE_READ(parent, mm))
		return 0;
	struct thread_state *st = thread_find();
	if (!st || !st->nheld)
		return 0;
	__u32 zero = 0;
	struct inherited_locks *in = bpf_map_lookup_elem(&inherit_buf, &zero);
	if (!in)
		return 0;
	in->n = 0;
	for (__u32 i = 0; i < MAX_HELD; i++) {
		if (i >= st->nheld)
			break;
		/* Taken by the child now, as far as its records go. */
		struct held_lock h = st->held_locks[i];
		h.time = 0;
		h.kind = send_held(&h, i, ((__u64)ctgid << 32) | ctid);
		h.sent = 1;
		in->locks[i] = h;
		in->n = i + 1;
	}
	bpf_map_update_elem(&inherited, &ctid, in, BPF_ANY);
	return 0;
}

SEC("raw_tracepoint/sched_process_exit")
int sched_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id;
	if (!current_traced(&id))
		return 0;
	__u32 pid = id >> 32;
	count_call(OP_THREAD_EXIT);
	struct event ev, *e = &ev;
	event_init(e, OP_THREAD_EXIT, id);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	e->ret = BPF_CORE_READ(task, exit_code);
	event_send(e);
	/* A child of fork that ends before its first hit. */
	__u32 tid = (__u32)id;
	bpf_map_delete_elem(&inherited, &tid);
	/* The last thread is going: the PID may be reused by a process we must
	 * not trace. */
	if (BPF_CORE_READ(task, signal, live.counter) == 0) {
		bpf_map_delete_elem(&alloc_ranges, &pid);
		bpf_map_delete_elem(&shim_tls, &pid);
		bpf_map_delete_elem(&traced, &pid);
	}
	return 0;
}

SEC("raw_tracepoint/sched_process_exec")
int sched_exec(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u8 *state = bpf_map_lookup_elem(&traced, &pid);
	if (!state)
		return 0;
	/* The gate became the target: trace from here on. This holds even
	 * before tracing is turned on (the reader starts concurrently with the
	 * gate's release): a target left GATED would lose every syscall and
	 * thread event of its run. */
	*state = TRACED;
	/* A new image: the allocator is elsewhere now, and every lock is new. */
	bpf_map_delete_elem(&alloc_ranges, &pid);
	bpf_map_delete_elem(&shim_tls, &pid);
	/* A new image holds no lock: not those a child of fork inherited and
	 * had not taken up yet. */
	__u32 tid = (__u32)id;
	bpf_map_delete_elem(&inherited, &tid);
	struct thread_state *st = thread_find();
	if (st) {
		st->range_pid = 0;
		st->alloc_sp = 0;
		st->stack_page.entry_at = 0; /* the old image's page tables */
		st->stack_page.pgd = 0;
		st->pid_tgid = id;
		st->nheld = 0;
		st->held = 0;
	}
	__sync_fetch_and_add(&lock_epoch, 1);
	__sync_fetch_and_add(&code_epoch, 1);
	__sync_fetch_and_add(&exec_epoch, 1);
	if (!tracing_on)
		return 0;
	count_call(OP_EXEC);
	struct event ev, *e = &ev;
	event_init(e, OP_EXEC, id);
	event_send(e);
	return 0;
}

/* Keep the record types and the contract's enums in BTF for bpf2go's
 * generated Go types. */
const struct event *unused_event __attribute__((unused));
const struct stack *unused_stack __attribute__((unused));
const struct sample *unused_sample __attribute__((unused));
const struct object *unused_object __attribute__((unused));
const struct shim_alloc_state *unused_shim_alloc_state __attribute__((unused));
const enum limits *unused_limits __attribute__((unused));
const enum rec_type *unused_rec_type __attribute__((unused));
const enum trace_state *unused_trace_state __attribute__((unused));
const enum op *unused_op __attribute__((unused));
const enum event_flag *unused_event_flag __attribute__((unused));
const enum cookie_layout *unused_cookie_layout __attribute__((unused));
const enum glibc_layout *unused_glibc_layout __attribute__((unused));
