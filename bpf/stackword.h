/* SPDX-License-Identifier: GPL-2.0 */
/* Reading words of the current thread's own stack without a helper call.
 *
 * The allocator probes read the caller's return address on every call (it
 * keys the chain cache and tells a live allocator call from one that
 * returned). bpf_probe_read_user costs about 90 ns a read on the machines
 * hooktrace was measured on: a chain of kernel calls, each returning
 * through the speculation mitigations' return thunk, and the user-copy
 * checks. Half of what a hit costs over the bare uprobe.
 *
 * Instead, each thread remembers where its stack page is in the kernel's
 * direct map of physical memory, and the page-table entry that maps it.
 * A read is then three plain loads, which the verifier lets through with
 * bpf_rdonly_cast (a faulting load reads 0): the entry, the word, the
 * entry again.
 *
 * Why the word is the thread's: the kernel clears a page's entry, and
 * flushes it, before the page can be freed, migrated or copied on write.
 * x86 keeps loads in order, so an entry that still holds after the word
 * was loaded means the word came from the page the thread maps.
 * Hardware may set the accessed and dirty bits at any time (and DAMON
 * clears the first), which changes nothing the check needs, so those two
 * bits are not compared.
 *
 * Where the direct map starts is randomised at boot. It is found once:
 * mm->pgd is the direct-map address of the page directory, so the base is
 * the 1 GiB-aligned candidate below it at which walking pgd's own address
 * through the page tables lands on pgd's own physical page.
 *
 * Anything unexpected falls back to bpf_probe_read_user, as before: an
 * entry that is not present or changed, a word that is not 8-aligned, a
 * machine with 5-level paging or a kernel without bpf_rdonly_cast (before
 * 6.2; the tracer then passes no address mask), no candidate that fits. A thread's first page walk, and one walk in 64
 * after, also read the word with bpf_probe_read_user and compare; one
 * disagreement turns the direct path off for every thread. A walk is
 * otherwise four loads, so a thread that moves between stacks (user-level
 * threads, a signal stack) pays little for leaving its remembered page. */
#ifndef STACKWORD_H
#define STACKWORD_H

/* Weak: kernels before 6.2 lack it, and the loader then leaves the call
 * unresolved. The tracer passes phys_addr_mask = 0 there, which makes every
 * call to it dead code the verifier drops. */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/* Set by the tracer before load: the bits of a page-table entry that hold
 * a physical address; 0 keeps every read on bpf_probe_read_user (and no
 * bpf_rdonly_cast call reachable). */
const volatile __u64 phys_addr_mask = 0;

#define DIRECT_MAP_UNKNOWN 0
#define DIRECT_MAP_OFF 1
/* The direct map's base, once found; or one of the two above. */
volatile __u64 direct_map = DIRECT_MAP_UNKNOWN;
/* Page walks made (a thread's first read of a page, or its entry changed),
 * and checked walks whose word disagreed with bpf_probe_read_user. */
volatile __u64 stack_walks = 0;
volatile __u64 stack_mismatches = 0;

/* Where the thread's last stack page read is. */
struct stack_page {
	__u64 vbase; /* the page's user address (4K, 2M or 1G aligned) */
	__u64 vmask; /* ~(page size - 1) */
	__u64 entry_at; /* direct-map address of the leaf entry mapping it; 0 none */
	__u64 entry;    /* that entry's value, accessed and dirty bits cleared */
	__u64 kbase;    /* the page's direct-map address */
	__u64 pgd;      /* the thread's page directory (an mm's never moves); 0 before its first walk */
};

#define PTE_PRESENT 0x1ULL
#define PTE_LARGE 0x80ULL /* a 1G or 2M leaf above the last level */
#define PTE_ACCESSED_DIRTY 0x60ULL

/* A load from a kernel address, 0 if it faults. */
static __always_inline __u64 kernel_word(__u64 addr)
{
	struct timespec64 *w = bpf_rdonly_cast((void *)addr, bpf_core_type_id_kernel(struct timespec64));
	return *(volatile long long *)&w->tv_sec;
}

/* Whether the entry sp remembers still maps its page (a load that faults
 * reads 0, which no remembered entry is). */
static __always_inline int stack_entry_holds(struct stack_page *sp)
{
	return (kernel_word(sp->entry_at) & ~PTE_ACCESSED_DIRTY) == sp->entry;
}

/* Walks va through the 4-level page tables at pgd, reading them through
 * the direct map at base. Returns 0 and the leaf entry (its address, its
 * value and the page's mask), or -1 when va is not mapped. */
static __always_inline int page_walk(__u64 base, __u64 pgd, __u64 va, __u64 *at, __u64 *entry, __u64 *mask)
{
	__u64 addr = pgd + 8 * ((va >> 39) & 511);
	__u64 e = kernel_word(addr);
	for (int shift = 30; shift >= 12; shift -= 9) {
		if (!(e & PTE_PRESENT))
			return -1;
		addr = base + (e & phys_addr_mask) + 8 * ((va >> shift) & 511);
		e = kernel_word(addr);
		if (shift == 12 || ((e & PTE_LARGE) && (e & PTE_PRESENT))) {
			if (!(e & PTE_PRESENT))
				return -1;
			*at = addr;
			*entry = e;
			*mask = ~((1ULL << shift) - 1);
			return 0;
		}
	}
	return -1;
}

struct direct_map_search {
	__u64 pgd;
	__u64 base;
};

/* Tries the k-th 1 GiB-aligned candidate below pgd: the direct map's base
 * is the one at which pgd's own address translates to pgd minus it. */
static long direct_map_candidate(__u32 k, void *ctx)
{
	struct direct_map_search *s = ctx;
	__u64 base = (s->pgd & ~((1ULL << 30) - 1)) - ((__u64)k << 30);
	__u64 phys = s->pgd - base;
	if (phys > phys_addr_mask)
		return 1;
	__u64 at = 0, e = 0, mask = 0;
	if (page_walk(base, s->pgd, s->pgd, &at, &e, &mask))
		return 0;
	if ((e & phys_addr_mask & mask) != (phys & mask))
		return 0;
	s->base = base;
	return 1;
}

/* Finds va's page for the thread (sp), checking the direct read of va
 * against bpf_probe_read_user at the thread's first walk and one in 64.
 * Returns 0 when sp now maps va. */
static __noinline int stack_page_walk(struct stack_page *sp, __u64 va)
{
	if (!sp)
		return -1;
	sp->entry_at = 0;
	__u64 base = direct_map;
	if (base == DIRECT_MAP_OFF || !phys_addr_mask || (va & 7))
		return -1;
	__u64 pgd = sp->pgd;
	int check = !pgd;
	if (!pgd) {
		struct task_struct *task = bpf_get_current_task_btf();
		if (bpf_probe_read_kernel(&pgd, sizeof(pgd), &task->mm->pgd) || !pgd)
			return -1;
		sp->pgd = pgd;
	}
	if (base == DIRECT_MAP_UNKNOWN) {
		struct direct_map_search s = {pgd, DIRECT_MAP_OFF};
		/* Every 1 GiB step of physical address space below pgd: the
		 * first that fits is taken, within pgd's own offset in RAM. */
		bpf_loop(1 << 23, direct_map_candidate, &s, 0);
		base = s.base;
		direct_map = base;
		if (base == DIRECT_MAP_OFF)
			return -1;
	}
	if ((__sync_fetch_and_add(&stack_walks, 1) & 63) == 0)
		check = 1;
	__u64 at = 0, e = 0, mask = 0;
	if (page_walk(base, pgd, va, &at, &e, &mask))
		return -1;
	__u64 kbase = base + (e & phys_addr_mask & mask);
	if (check) {
		__u64 direct = kernel_word(kbase + (va & ~mask)), user = 0;
		if (bpf_probe_read_user(&user, sizeof(user), (void *)va))
			return -1;
		/* An entry that changed meanwhile (the page migrated, or
		 * copied on write) proves nothing either way. */
		if ((kernel_word(at) & ~PTE_ACCESSED_DIRTY) != (e & ~PTE_ACCESSED_DIRTY))
			return -1;
		if (direct != user) {
			__sync_fetch_and_add(&stack_mismatches, 1);
			direct_map = DIRECT_MAP_OFF;
			return -1;
		}
	}
	sp->vbase = va & mask;
	sp->vmask = mask;
	sp->entry = e & ~PTE_ACCESSED_DIRTY;
	sp->kbase = kbase;
	sp->entry_at = at;
	return 0;
}

/* The 8-byte word at va (8-aligned) of the current thread's stack; 0 if it
 * cannot be read, as bpf_probe_read_user leaves it. */
static __always_inline __u64 stack_word(struct stack_page *sp, __u64 va)
{
	__u64 v;
	if (!phys_addr_mask)
		goto user;
	if (!sp->entry_at || (va & sp->vmask) != sp->vbase || (va & 7) || !stack_entry_holds(sp)) {
		if (stack_page_walk(sp, va))
			goto user;
	}
	v = kernel_word(sp->kbase + (va & ~sp->vmask));
	if (stack_entry_holds(sp))
		return v;
user:
	v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)va);
	return v;
}

#endif
