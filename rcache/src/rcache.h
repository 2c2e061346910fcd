/*
 * rcache: a small registration cache modelled on Open MPI's rcache/base
 * VMA tree, in two variants of one code base.
 *
 * A registration cache remembers which address ranges are registered with
 * a network card (pinned, with a memory key), so that sending from the same
 * buffer again costs a lookup instead of a registration. It must forget a
 * registration as soon as the memory under it is released, or a later
 * send would use a key for pages that are no longer there. It learns of
 * releases by hooking libc's munmap and madvise, and those hooks run
 * inside whatever released the memory: very often glibc's free(), with
 * glibc's arena lock held.
 *
 *   RC_LEGACY: as Open MPI 2.0. Tree nodes are allocated and freed, and
 *              registrations pinned (which allocates their page lists),
 *              with vma_lock held; the memory hook takes vma_lock. A thread
 *              holding vma_lock that calls malloc, and a thread in free()
 *              whose hook waits for vma_lock, can deadlock (Open MPI issue
 *              1654).
 *   RC_FIXED:  no allocator call with vma_lock held (nodes come from a
 *              preallocated pool, pinning happens unlocked, removed nodes go
 *              on a lock-free list freed after unlocking), and the hook
 *              never blocks on vma_lock: it
 *              tries it, and when that fails it pushes the range on a
 *              lock-free queue that every operation drains, under
 *              vma_lock, before it trusts the tree.
 *
 * Both variants keep the cache's one promise: no registration is returned
 * for memory whose release (munmap, madvise(MADV_DONTNEED/REMOVE/FREE))
 * has completed.
 */
#ifndef RCACHE_H
#define RCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rc_variant {
	RC_LEGACY = 0,
	RC_FIXED = 1,
};

/* A registration: the page-aligned range [base, bound] (bound inclusive, as
 * Open MPI's) and its memory key. Handles are reference counted: every
 * rc_register and successful rc_find takes a reference, rc_deregister
 * drops one. */
typedef struct rc_reg {
	uintptr_t base;
	uintptr_t bound;
	uint64_t key;     /* stands for the NIC's memory key; unique per registration */
	int refcount;     /* under vma_lock */
	int flags;        /* RC_REG_* */
	/* The pinned pages, as a NIC driver's memory region keeps them (one
	 * entry a page): registering allocates this list. */
	uintptr_t *pages;
	size_t npages;
	struct rc_vma *node;
	struct rc_reg *next_gc;
} rc_reg_t;

#define RC_REG_INVALID 1 /* its memory was released: never returned again */
#define RC_REG_IN_TREE 2

struct rc_stats {
	uint64_t registrations; /* new registrations made */
	uint64_t hits;          /* rc_register calls served by a covering one */
	uint64_t lookups;
	uint64_t invalidated;   /* registrations dropped because memory was released */
	uint64_t hook_calls;    /* release hooks that ran */
	uint64_t hook_deferred; /* ... that could not take vma_lock (fixed) */
	uint64_t overflows;     /* hooks that found the deferred queue full */
	uint64_t flushes;       /* ... after which every registration was dropped */
	uint64_t evicted;
	uint64_t cached;        /* registrations in the tree now */
};

/* rc_init installs the munmap/madvise hooks (patching libc's entries) and
 * chooses the variant. Call it before creating threads; 0 or -1 (errno). */
int rc_init(enum rc_variant variant);
/* rc_finalize removes the hooks and frees every registration. */
void rc_finalize(void);
enum rc_variant rc_current_variant(void);
const char *rc_variant_name(enum rc_variant v);

/* rc_register registers [addr, addr+len), reusing a registration that
 * covers it. NULL with errno on failure. */
rc_reg_t *rc_register(void *addr, size_t len);
/* rc_deregister drops a reference. An unreferenced registration stays
 * cached until its memory is released or it is evicted. */
void rc_deregister(rc_reg_t *reg);
/* rc_find returns a referenced, valid registration covering the range, or
 * NULL. */
rc_reg_t *rc_find(void *addr, size_t len);

void rc_get_stats(struct rc_stats *out);

/* The memory-release hook (Open MPI: opal_mem_hooks_release_hook): called
 * by the patched munmap/madvise before the memory goes away. */
void rc_mem_release_hook(void *addr, size_t len);

#ifdef __cplusplus
}
#endif

#endif
