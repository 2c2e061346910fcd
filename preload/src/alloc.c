/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the allocator's interposers. */
#include "shim.h"

/* ---- the allocator ------------------------------------------------------ */

/* An allocator call's entry and exit, around the real call: recorded at
 * entry (rec_alloc), then the call runs inside alloc_depth, so that what
 * the allocator does meanwhile (a hook it runs) is flagged. frame is the
 * interposer's own: the caller's return address is frame[1]. */
HOT void alloc_enter(struct tstate *t, __u32 op, __u64 fn, __u64 *frame, __u64 addr, __u64 size, __u64 arg)
{
	rec_alloc(t, op, fn, frame, addr, size, arg);
	t->shared.alloc_depth++;
	leave(t);
}

HOT void alloc_exit(struct tstate *t)
{
	t->shared.alloc_depth--;
	if (!t->shared.alloc_depth)
		t->shared.alloc_sp = 0;
}

static void rec_alloc_mmap(struct tstate *t, void *p, __u64 fn, __u64 *frame);

EXPORT void *malloc(size_t n)
{
	if (unlikely(!real.malloc)) {
		if (resolving)
			return boot_alloc(n);
		resolve_real();
	}
	struct tstate *t = enter_op(OP_MALLOC);
	if (!t)
		return real.malloc(n);
	alloc_enter(t, OP_MALLOC, (__u64)real.malloc, FRAME, 0, n, 0);
	void *r = real.malloc(n);
	rec_alloc_mmap(t, r, (__u64)real.malloc, FRAME);
	alloc_exit(t);
	return r;
}

EXPORT void *calloc(size_t n, size_t m)
{
	if (unlikely(!real.calloc)) {
		if (resolving)
			return boot_alloc(n * m);
		resolve_real();
	}
	struct tstate *t = enter_op(OP_CALLOC);
	if (!t)
		return real.calloc(n, m);
	alloc_enter(t, OP_CALLOC, (__u64)real.calloc, FRAME, 0, n * m, 0);
	void *r = real.calloc(n, m);
	rec_alloc_mmap(t, r, (__u64)real.calloc, FRAME);
	alloc_exit(t);
	return r;
}

/* realloc as called from the interposer whose frame is frame. */
HOT void *realloc_at(void *p, size_t n, __u64 *frame)
{
	if (unlikely(!real.realloc)) {
		if (resolving)
			return boot_alloc(n);
		resolve_real();
	}
	if (unlikely(is_boot(p))) {
		/* From the bootstrap heap: move it to the real allocator. */
		size_t had = boot_size(p);
		void *q = real.malloc(n);
		if (q)
			memcpy(q, p, n < had ? n : had);
		return q;
	}
	struct tstate *t = enter_op(OP_REALLOC);
	if (!t)
		return real.realloc(p, n);
	alloc_enter(t, OP_REALLOC, (__u64)real.realloc, frame, (__u64)p, n, 0);
	void *r = real.realloc(p, n);
	alloc_exit(t); /* no rec_alloc_mmap: see there */
	return r;
}

EXPORT void *realloc(void *p, size_t n)
{
	return realloc_at(p, n, FRAME);
}

/* glibc's reallocarray is realloc behind an overflow check, and calls
 * realloc through libc's PLT, which leads back here: forwarded, one call
 * would be recorded twice, the second inside the first, as if a hook the
 * allocator ran had re-entered it. So it is glibc's here: the check, then
 * one realloc, from the program's caller, as the eBPF recorder sees it (its
 * probe is on realloc, which glibc's reallocarray jumps to). Another
 * allocator's reallocarray (jemalloc has none) is the same call. */
EXPORT void *reallocarray(void *p, size_t n, size_t m)
{
	size_t bytes;
	if (__builtin_mul_overflow(n, m, &bytes)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc_at(p, bytes, FRAME);
}

/* The size free releases, from glibc's chunk header (as the BPF side reads
 * it); 0 for another allocator's pointers would be wrong, so only glibc's
 * layout is assumed where the BPF side assumes it. */
static size_t chunk_size(void *p)
{
	if (!p || !glibc_free)
		return 0;
	return glibc_chunk_freed(*(__u64 *)((char *)p - GLIBC_CHUNK_SIZE_AT));
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
	__u64 size = *(__u64 *)((char *)p - GLIBC_CHUNK_SIZE_AT);
	if (likely(!glibc_chunk_mmapped(size)))
		return m;
	__u64 chunk = (__u64)p - GLIBC_CHUNK_HEADER, prev = *(__u64 *)chunk;
	m.addr = chunk - prev;
	m.len = prev + glibc_chunk_bytes(size);
	return m;
}

/* A system call glibc made inside an allocator call, which no
 * interposition sees (its own mmap of a chunk above the mmap threshold in
 * malloc, its munmap of one in free), read from the chunk's header and
 * sent once the call returns, still inside it, with the fields the BPF
 * side's sys_enter gives it. A hook the call ran meanwhile (a runtime's
 * patched munmap entry) is recorded already, as it precedes the system
 * call the BPF side sees; this tells the analysis the hook ran under the
 * locks held around the call without taking them again. Its stack is the
 * allocator call's own, which tells the analysis glibc holds no arena lock
 * there. Under the kernel's tracepoint the kernel records it, flagged
 * inside the call. */
static void rec_glibc_syscall(struct tstate *t, __u32 op, __u64 addr, __u64 size, __u64 arg, __u64 fn, __u64 *frame)
{
	if ((cfg_flags & SHM_F_SYSCALLS) || t->guard)
		return;
	t->guard = 1;
	struct event e;
	mem_event(t, &e, op, addr, size, arg);
	e.stack = take_stack(t, fn, frame);
	event_send(&e);
	leave(t);
}

/* The mmap of a fresh chunk (realloc is left out: it may move a mapped
 * chunk with mremap instead): no address asked for, the mapping's length,
 * read-write, private and anonymous. */
static void rec_alloc_mmap(struct tstate *t, void *p, __u64 fn, __u64 *frame)
{
	struct mapping m = mmapped_chunk(p);
	if (likely(!m.len))
		return;
	rec_glibc_syscall(t, OP_MMAP, 0, m.len, (__u64)(PROT_READ | PROT_WRITE) | ((__u64)(MAP_PRIVATE | MAP_ANONYMOUS) << 32),
			  fn, frame);
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
	alloc_enter(t, OP_FREE, (__u64)real.free, FRAME, (__u64)p, chunk_size(p), 0);
	struct mapping unmapped = mmapped_chunk(p);
	real.free(p);
	if (unmapped.len)
		rec_glibc_syscall(t, OP_MUNMAP, unmapped.addr, unmapped.len, 0, (__u64)real.free, FRAME);
	alloc_exit(t);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	ENSURE(posix_memalign);
	struct tstate *t = enter_op(OP_POSIX_MEMALIGN);
	if (!t)
		return real.posix_memalign(out, align, n);
	alloc_enter(t, OP_POSIX_MEMALIGN, (__u64)real.posix_memalign, FRAME, 0, n, align);
	int r = real.posix_memalign(out, align, n);
	rec_alloc_mmap(t, r ? NULL : *out, (__u64)real.posix_memalign, FRAME);
	alloc_exit(t);
	return r;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	ENSURE(aligned_alloc);
	struct tstate *t = enter_op(OP_ALIGNED_ALLOC);
	if (!t)
		return real.aligned_alloc(align, n);
	alloc_enter(t, OP_ALIGNED_ALLOC, (__u64)real.aligned_alloc, FRAME, 0, n, align);
	void *r = real.aligned_alloc(align, n);
	rec_alloc_mmap(t, r, (__u64)real.aligned_alloc, FRAME);
	alloc_exit(t);
	return r;
}

EXPORT void *memalign(size_t align, size_t n)
{
	ENSURE(memalign);
	struct tstate *t = enter_op(OP_MEMALIGN);
	if (!t)
		return real.memalign(align, n);
	alloc_enter(t, OP_MEMALIGN, (__u64)real.memalign, FRAME, 0, n, align);
	void *r = real.memalign(align, n);
	rec_alloc_mmap(t, r, (__u64)real.memalign, FRAME);
	alloc_exit(t);
	return r;
}

EXPORT void *valloc(size_t n)
{
	ENSURE(valloc);
	struct tstate *t = enter_op(OP_VALLOC);
	if (!t)
		return real.valloc(n);
	alloc_enter(t, OP_VALLOC, (__u64)real.valloc, FRAME, 0, n, 0);
	void *r = real.valloc(n);
	rec_alloc_mmap(t, r, (__u64)real.valloc, FRAME);
	alloc_exit(t);
	return r;
}

EXPORT void *pvalloc(size_t n)
{
	ENSURE(pvalloc);
	struct tstate *t = enter_op(OP_PVALLOC);
	if (!t)
		return real.pvalloc(n);
	alloc_enter(t, OP_PVALLOC, (__u64)real.pvalloc, FRAME, 0, n, 0);
	void *r = real.pvalloc(n);
	rec_alloc_mmap(t, r, (__u64)real.pvalloc, FRAME);
	alloc_exit(t);
	return r;
}
