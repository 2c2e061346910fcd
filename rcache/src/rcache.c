/*
 * The registration cache: an interval tree of registrations under
 * vma_lock, and the memory-release callback that invalidates them. One
 * code base, two variants chosen at rc_init (see rcache.h); every place
 * where they differ says which rule it follows:
 *
 *   rule 1 (fixed): no allocator call while vma_lock is held.
 *   rule 2 (fixed): the memory hook never waits for vma_lock.
 *   rule 3 (fixed): deferred invalidations are applied before the tree is
 *                   trusted (that is what keeps rule 2 correct).
 *
 * Names follow Open MPI's rcache/base so a reader can map them:
 *   rc_vma_tree_insert/_delete/_find   mca_rcache_base_vma_tree_insert/...
 *   rc_mem_cb                          mca_rcache_base_mem_cb
 *   rc_mem_release_hook                opal_mem_hooks_release_hook
 *   rc_intercept_munmap/_madvise       the patcher's intercept_munmap/...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rcache.h"
#include "rcache_internal.h"

#define RC_EXPORT __attribute__((visibility("default"), noinline))

/* A tree node: one registration's range. The tree is an AVL tree ordered
 * by (base, key) and augmented with each subtree's largest bound, so both
 * "a registration covering this range" and "every registration overlapping
 * this range" are found without visiting the whole tree. */
typedef struct rc_vma {
	uintptr_t base, bound, max_bound;
	uint64_t key;
	struct rc_vma *left, *right;
	int height;
	rc_reg_t *reg;
	struct rc_vma *next; /* node pool and garbage lists */
} rc_vma_t;

/* The cache's lock: a global so that it has a symbol, and reports name it
 * "vma_lock (librcache.so)". Legacy makes it recursive, as Open MPI's
 * opal_recursive_mutex_t; fixed makes it a normal mutex, so that a trylock
 * by a hook on the thread that holds it fails instead of entering the tree
 * in the middle of an update. */
RC_EXPORT_DATA pthread_mutex_t vma_lock;

static rc_vma_t *vma_root;         /* under vma_lock */
static enum rc_variant variant;
static atomic_int rc_active;        /* hooks may act */
static uint64_t next_key = 1;       /* under vma_lock */
static uint64_t cached;             /* registrations in the tree, under vma_lock */

/* Fault injection, to show that the --check test catches a cache that
 * breaks its promise: RCACHE_TEST_FAULT=ignore-releases makes the hook do
 * nothing. Never set it otherwise. (RCACHE_TEST_QUEUE=N, below, shrinks
 * the deferred queue so that tests reach its overflow path.) */
static int fault_ignore_releases;

/* Unreferenced registrations stay cached (that is the point of the cache)
 * up to this many; beyond, deregistering the last reference evicts. */
#define RC_MAX_CACHED 4096

static struct {
	atomic_ulong registrations, hits, lookups, invalidated, hook_calls, hook_deferred, overflows, flushes, evicted;
} stats;

#define STAT_ADD(f) atomic_fetch_add_explicit(&stats.f, 1, memory_order_relaxed)

/* ---- The tree ----------------------------------------------------------- */

static int height(rc_vma_t *n) { return n ? n->height : 0; }

static void update(rc_vma_t *n)
{
	int hl = height(n->left), hr = height(n->right);
	n->height = 1 + (hl > hr ? hl : hr);
	n->max_bound = n->bound;
	if (n->left && n->left->max_bound > n->max_bound)
		n->max_bound = n->left->max_bound;
	if (n->right && n->right->max_bound > n->max_bound)
		n->max_bound = n->right->max_bound;
}

static rc_vma_t *rotate_right(rc_vma_t *n)
{
	rc_vma_t *l = n->left;
	n->left = l->right;
	l->right = n;
	update(n);
	update(l);
	return l;
}

static rc_vma_t *rotate_left(rc_vma_t *n)
{
	rc_vma_t *r = n->right;
	n->right = r->left;
	r->left = n;
	update(n);
	update(r);
	return r;
}

static rc_vma_t *rebalance(rc_vma_t *n)
{
	update(n);
	int bf = height(n->left) - height(n->right);
	if (bf > 1) {
		if (height(n->left->left) < height(n->left->right))
			n->left = rotate_left(n->left);
		return rotate_right(n);
	}
	if (bf < -1) {
		if (height(n->right->right) < height(n->right->left))
			n->right = rotate_right(n->right);
		return rotate_left(n);
	}
	return n;
}

static int before(uintptr_t base, uint64_t key, const rc_vma_t *n)
{
	return base < n->base || (base == n->base && key < n->key);
}

static rc_vma_t *avl_insert(rc_vma_t *root, rc_vma_t *n)
{
	if (!root)
		return n;
	if (before(n->base, n->key, root))
		root->left = avl_insert(root->left, n);
	else
		root->right = avl_insert(root->right, n);
	return rebalance(root);
}

static rc_vma_t *avl_remove_min(rc_vma_t *root, rc_vma_t **min)
{
	if (!root->left) {
		*min = root;
		return root->right;
	}
	root->left = avl_remove_min(root->left, min);
	return rebalance(root);
}

static rc_vma_t *avl_remove(rc_vma_t *root, uintptr_t base, uint64_t key, rc_vma_t **out)
{
	if (!root)
		return NULL;
	if (root->base == base && root->key == key) {
		*out = root;
		if (!root->left)
			return root->right;
		if (!root->right)
			return root->left;
		rc_vma_t *succ;
		rc_vma_t *right = avl_remove_min(root->right, &succ);
		succ->left = root->left;
		succ->right = right;
		return rebalance(succ);
	}
	if (before(base, key, root))
		root->left = avl_remove(root->left, base, key, out);
	else
		root->right = avl_remove(root->right, base, key, out);
	return rebalance(root);
}

static rc_vma_t *find_covering(rc_vma_t *n, uintptr_t base, uintptr_t bound)
{
	while (n) {
		if (n->max_bound < bound)
			return NULL;
		rc_vma_t *l = find_covering(n->left, base, bound);
		if (l)
			return l;
		if (n->base <= base && n->bound >= bound)
			return n;
		if (n->base > base)
			return NULL; /* everything to the right starts later still */
		n = n->right;
	}
	return NULL;
}

static rc_vma_t *find_overlap(rc_vma_t *n, uintptr_t base, uintptr_t bound)
{
	while (n) {
		if (n->max_bound < base)
			return NULL;
		rc_vma_t *l = find_overlap(n->left, base, bound);
		if (l)
			return l;
		if (n->base > bound)
			return NULL;
		if (n->bound >= base)
			return n;
		n = n->right;
	}
	return NULL;
}

/* rc_vma_tree_insert adds reg to the tree. node is the node to use; legacy
 * passes none and allocates it here, with vma_lock held. */
RC_EXPORT int rc_vma_tree_insert(rc_reg_t *reg, struct rc_vma *node)
{
	if (!node) {
		node = malloc(sizeof(*node)); /* legacy: malloc with vma_lock held */
		if (!node)
			return -1;
	}
	memset(node, 0, sizeof(*node));
	node->base = reg->base;
	node->bound = reg->bound;
	node->key = reg->key;
	node->reg = reg;
	node->height = 1;
	node->max_bound = reg->bound;
	vma_root = avl_insert(vma_root, node);
	reg->node = node;
	reg->flags |= RC_REG_IN_TREE;
	cached++;
	return 0;
}

/* rc_vma_tree_delete takes reg out of the tree and returns its node. */
RC_EXPORT struct rc_vma *rc_vma_tree_delete(rc_reg_t *reg)
{
	rc_vma_t *out = NULL;
	vma_root = avl_remove(vma_root, reg->base, reg->key, &out);
	reg->flags &= ~RC_REG_IN_TREE;
	reg->node = NULL;
	if (out)
		cached--;
	return out;
}

/* rc_vma_tree_find returns a registration covering [base, bound]. */
RC_EXPORT rc_reg_t *rc_vma_tree_find(uintptr_t base, uintptr_t bound)
{
	rc_vma_t *n = find_covering(vma_root, base, bound);
	return n ? n->reg : NULL;
}

/* rc_vma_tree_find_overlap returns a registration overlapping [base, bound]. */
RC_EXPORT rc_reg_t *rc_vma_tree_find_overlap(uintptr_t base, uintptr_t bound)
{
	rc_vma_t *n = find_overlap(vma_root, base, bound);
	return n ? n->reg : NULL;
}

/* ---- Lock-free lists (fixed) -------------------------------------------- */

/* Lists that many threads push to and one drains at a time by taking the
 * whole list (atomic exchange): neither side can suffer ABA, and neither
 * waits. */
static _Atomic(rc_vma_t *) node_pool;     /* spare nodes */
static _Atomic(rc_vma_t *) garbage_nodes; /* removed under vma_lock, freed after unlocking */
static _Atomic(rc_reg_t *) garbage_regs;

static void push_nodes(_Atomic(rc_vma_t *) *head, rc_vma_t *first, rc_vma_t *last)
{
	rc_vma_t *old = atomic_load(head);
	do {
		last->next = old;
	} while (!atomic_compare_exchange_weak(head, &old, first));
}

static void push_reg(_Atomic(rc_reg_t *) *head, rc_reg_t *r)
{
	rc_reg_t *old = atomic_load(head);
	do {
		r->next_gc = old;
	} while (!atomic_compare_exchange_weak(head, &old, r));
}

/* rc_node_get returns a node for the next insert, taken before vma_lock:
 * from the pool when it has one, else from malloc (rule 1: before locking). */
static rc_vma_t *rc_node_get(void)
{
	rc_vma_t *list = atomic_exchange(&node_pool, NULL);
	if (!list)
		return malloc(sizeof(rc_vma_t));
	rc_vma_t *rest = list->next;
	if (rest) {
		rc_vma_t *last = rest;
		while (last->next)
			last = last->next;
		push_nodes(&node_pool, rest, last);
	}
	return list;
}

static void rc_node_put(rc_vma_t *n) { push_nodes(&node_pool, n, n); }

/* Deferred invalidations: ranges a hook could not apply because vma_lock
 * was taken. Their entries come from a static array (a hook may run inside
 * malloc or free and must not allocate); a hook that finds no free entry
 * sets overflow, which makes the next drain drop every registration. */
#define RC_DEFER_SLOTS 1024

struct rc_deferred {
	uintptr_t base, bound;
	struct rc_deferred *next;
	atomic_int busy;
};

static struct rc_deferred deferred_slots[RC_DEFER_SLOTS];
static int defer_slots = RC_DEFER_SLOTS; /* RCACHE_TEST_QUEUE=N uses fewer, to test overflows */
static _Atomic(struct rc_deferred *) deferred_head;
static atomic_int deferred_overflow;

RC_EXPORT void rc_defer_invalidation(uintptr_t base, uintptr_t bound)
{
	STAT_ADD(hook_deferred);
	for (int i = 0; i < defer_slots; i++) {
		struct rc_deferred *d = &deferred_slots[i];
		int idle = 0;
		if (!atomic_compare_exchange_strong(&d->busy, &idle, 1))
			continue;
		d->base = base;
		d->bound = bound;
		struct rc_deferred *old = atomic_load(&deferred_head);
		do {
			d->next = old;
		} while (!atomic_compare_exchange_weak(&deferred_head, &old, d));
		return;
	}
	STAT_ADD(overflows);
	atomic_store(&deferred_overflow, 1);
}

/* ---- Invalidation and the variants' disposal rules --------------------- */

static void rc_reg_free(rc_reg_t *reg);
static long page_size;

/* Legacy: what hooks removed, freed by the next operation (with vma_lock
 * held, as Open MPI 2.0 did): a hook itself runs inside free() and must not
 * call free(). Under vma_lock. */
static rc_vma_t *legacy_gc_nodes;
static rc_reg_t *legacy_gc_regs;

static void dispose_node(rc_vma_t *n, int in_hook)
{
	if (!n)
		return;
	if (variant == RC_FIXED) {
		push_nodes(&garbage_nodes, n, n); /* rule 1: freed after unlocking */
	} else if (in_hook) {
		n->next = legacy_gc_nodes;
		legacy_gc_nodes = n;
	} else {
		free(n); /* legacy: free with vma_lock held */
	}
}

static void dispose_reg(rc_reg_t *r, int in_hook)
{
	if (variant == RC_FIXED) {
		push_reg(&garbage_regs, r);
	} else if (in_hook) {
		r->next_gc = legacy_gc_regs;
		legacy_gc_regs = r;
	} else {
		rc_reg_free(r); /* legacy: free with vma_lock held */
	}
}

/* rc_invalidate_locked drops every registration overlapping [base, bound].
 * A registration still referenced is marked invalid and freed by its last
 * rc_deregister. Under vma_lock. */
static void rc_invalidate_locked(uintptr_t base, uintptr_t bound, int in_hook)
{
	rc_reg_t *reg;
	while ((reg = rc_vma_tree_find_overlap(base, bound)) != NULL) {
		rc_vma_t *node = rc_vma_tree_delete(reg);
		reg->flags |= RC_REG_INVALID;
		STAT_ADD(invalidated);
		dispose_node(node, in_hook);
		if (reg->refcount == 0)
			dispose_reg(reg, in_hook);
	}
}

/* rc_sync_locked runs at the start of every operation, under vma_lock.
 * Fixed: apply the deferred invalidations before the tree is trusted
 * (rule 3). Legacy: free what the hooks removed. */
RC_EXPORT void rc_sync_locked(void)
{
	if (variant == RC_FIXED) {
		struct rc_deferred *d = atomic_exchange(&deferred_head, NULL);
		while (d) {
			struct rc_deferred *next = d->next;
			rc_invalidate_locked(d->base, d->bound, 0);
			atomic_store(&d->busy, 0);
			d = next;
		}
		if (atomic_exchange(&deferred_overflow, 0)) {
			STAT_ADD(flushes);
			rc_invalidate_locked(0, UINTPTR_MAX, 0);
		}
		return;
	}
	while (legacy_gc_nodes) {
		rc_vma_t *n = legacy_gc_nodes;
		legacy_gc_nodes = n->next;
		free(n);
	}
	while (legacy_gc_regs) {
		rc_reg_t *r = legacy_gc_regs;
		legacy_gc_regs = r->next_gc;
		rc_reg_free(r);
	}
}

/* rc_collect_garbage frees what the last critical sections removed: after
 * unlocking, and never from a hook (rule 1). */
static void rc_collect_garbage(void)
{
	if (variant != RC_FIXED)
		return;
	rc_vma_t *n = atomic_exchange(&garbage_nodes, NULL);
	while (n) {
		rc_vma_t *next = n->next;
		rc_node_put(n);
		n = next;
	}
	rc_reg_t *r = atomic_exchange(&garbage_regs, NULL);
	while (r) {
		rc_reg_t *next = r->next_gc;
		rc_reg_free(r);
		r = next;
	}
}

/* ---- The API ------------------------------------------------------------ */

static int range_of(void *addr, size_t len, uintptr_t *base, uintptr_t *bound)
{
	uintptr_t a = (uintptr_t)addr;
	if (len == 0 || a + len < a)
		return -1;
	*base = a & ~(uintptr_t)(page_size - 1);
	*bound = ((a + len + page_size - 1) & ~(uintptr_t)(page_size - 1)) - 1;
	return 0;
}

/* rc_reg_pin stands for the NIC registration (ibv_reg_mr): it pins the
 * range and records its pages, in a list it allocates. */
RC_EXPORT int rc_reg_pin(rc_reg_t *reg)
{
	size_t n = (reg->bound - reg->base + 1) / (uintptr_t)page_size;
	uintptr_t *pages = malloc(n * sizeof(*pages));
	if (!pages)
		return -1;
	for (size_t i = 0; i < n; i++)
		pages[i] = reg->base + i * (uintptr_t)page_size;
	reg->pages = pages;
	reg->npages = n;
	return 0;
}

static void rc_reg_free(rc_reg_t *reg)
{
	if (reg) {
		free(reg->pages);
		free(reg);
	}
}

RC_EXPORT rc_reg_t *rc_register(void *addr, size_t len)
{
	uintptr_t base, bound;
	if (range_of(addr, len, &base, &bound) != 0) {
		errno = EINVAL;
		return NULL;
	}
	rc_reg_t *fresh = calloc(1, sizeof(*fresh));
	rc_vma_t *spare_node = NULL;
	if (variant == RC_FIXED)
		spare_node = rc_node_get(); /* rule 1: before locking */
	if (!fresh || (variant == RC_FIXED && !spare_node)) {
		free(fresh);
		if (spare_node)
			rc_node_put(spare_node);
		errno = ENOMEM;
		return NULL;
	}
	fresh->base = base;
	fresh->bound = bound;
	fresh->refcount = 1;
	int failed = 0;

	pthread_mutex_lock(&vma_lock);
	rc_sync_locked();
	rc_reg_t *reg = rc_vma_tree_find(base, bound);
	if (!reg && variant == RC_FIXED) {
		/* Rule 1: pinning allocates, so it happens unlocked; then look
		 * again, another thread may have registered the range meanwhile. */
		pthread_mutex_unlock(&vma_lock);
		failed = rc_reg_pin(fresh);
		pthread_mutex_lock(&vma_lock);
		rc_sync_locked();
		reg = rc_vma_tree_find(base, bound);
	}
	if (reg) {
		reg->refcount++;
		STAT_ADD(hits);
	} else if (!failed) {
		fresh->key = next_key++;
		/* Legacy: the node is malloc'ed in here, with vma_lock held. */
		if (rc_vma_tree_insert(fresh, spare_node) == 0) {
			spare_node = NULL;
			reg = fresh;
			fresh = NULL;
			/* Legacy: pinned with vma_lock held, as Open MPI 2.0's grdma
			 * called register_mem under the lock; that allocates too. */
			if (!reg->pages && rc_reg_pin(reg) != 0) {
				dispose_node(rc_vma_tree_delete(reg), 0);
				fresh = reg;
				reg = NULL;
			} else {
				STAT_ADD(registrations);
			}
		}
	}
	pthread_mutex_unlock(&vma_lock);

	rc_reg_free(fresh);
	if (variant == RC_FIXED) {
		rc_collect_garbage();
		if (spare_node)
			rc_node_put(spare_node);
	}
	if (!reg)
		errno = ENOMEM;
	return reg;
}

RC_EXPORT void rc_deregister(rc_reg_t *reg)
{
	if (!reg)
		return;
	pthread_mutex_lock(&vma_lock);
	rc_sync_locked();
	if (--reg->refcount == 0) {
		if (reg->flags & RC_REG_INVALID) {
			dispose_reg(reg, 0);
		} else if (cached > RC_MAX_CACHED) {
			STAT_ADD(evicted);
			dispose_node(rc_vma_tree_delete(reg), 0);
			dispose_reg(reg, 0);
		}
	}
	pthread_mutex_unlock(&vma_lock);
	rc_collect_garbage();
}

RC_EXPORT rc_reg_t *rc_find(void *addr, size_t len)
{
	uintptr_t base, bound;
	if (range_of(addr, len, &base, &bound) != 0)
		return NULL;
	STAT_ADD(lookups);
	pthread_mutex_lock(&vma_lock);
	rc_sync_locked();
	rc_reg_t *reg = rc_vma_tree_find(base, bound);
	if (reg)
		reg->refcount++;
	pthread_mutex_unlock(&vma_lock);
	rc_collect_garbage();
	return reg;
}

/* rc_mem_cb invalidates what a memory release takes away. It runs inside
 * the patched munmap/madvise, and so inside whatever called them: glibc's
 * free() among others, with the arena lock held. */
RC_EXPORT void rc_mem_cb(uintptr_t base, uintptr_t bound)
{
	if (variant == RC_LEGACY) {
		/* Legacy: wait for vma_lock inside free(). A thread holding
		 * vma_lock that calls malloc() waits for this thread's arena. */
		pthread_mutex_lock(&vma_lock);
		rc_invalidate_locked(base, bound, 1);
		pthread_mutex_unlock(&vma_lock);
		return;
	}
	/* Rule 2: never wait for vma_lock here. */
	if (pthread_mutex_trylock(&vma_lock) == 0) {
		rc_invalidate_locked(base, bound, 1);
		pthread_mutex_unlock(&vma_lock);
		return;
	}
	rc_defer_invalidation(base, bound);
}

RC_EXPORT void rc_mem_release_hook(void *addr, size_t len)
{
	uintptr_t base, bound;
	if (!atomic_load_explicit(&rc_active, memory_order_acquire) || fault_ignore_releases)
		return;
	if (range_of(addr, len, &base, &bound) != 0)
		return;
	STAT_ADD(hook_calls);
	rc_mem_cb(base, bound);
}

RC_EXPORT int rc_init(enum rc_variant v)
{
	if (v != RC_LEGACY && v != RC_FIXED) {
		errno = EINVAL;
		return -1;
	}
	if (atomic_load(&rc_active)) {
		errno = EBUSY;
		return -1;
	}
	page_size = sysconf(_SC_PAGESIZE);
	variant = v;
	const char *fault = getenv("RCACHE_TEST_FAULT");
	fault_ignore_releases = fault && !strcmp(fault, "ignore-releases");
	const char *queue = getenv("RCACHE_TEST_QUEUE");
	if (queue && atoi(queue) >= 1 && atoi(queue) <= RC_DEFER_SLOTS)
		defer_slots = atoi(queue);
	pthread_mutexattr_t attr;
	pthread_mutexattr_init(&attr);
	pthread_mutexattr_settype(&attr, v == RC_LEGACY ? PTHREAD_MUTEX_RECURSIVE : PTHREAD_MUTEX_NORMAL);
	pthread_mutex_init(&vma_lock, &attr);
	pthread_mutexattr_destroy(&attr);
	if (v == RC_FIXED) {
		/* A preallocated node pool: most registrations never call malloc. */
		for (int i = 0; i < 256; i++) {
			rc_vma_t *n = malloc(sizeof(*n));
			if (!n)
				break;
			rc_node_put(n);
		}
	}
	atomic_store_explicit(&rc_active, 1, memory_order_release);
	if (rc_install_hooks() != 0) {
		int e = errno;
		atomic_store(&rc_active, 0);
		errno = e;
		return -1;
	}
	return 0;
}

static void free_tree(rc_vma_t *n)
{
	if (!n)
		return;
	free_tree(n->left);
	free_tree(n->right);
	rc_reg_free(n->reg);
	free(n);
}

RC_EXPORT void rc_finalize(void)
{
	if (!atomic_load(&rc_active))
		return;
	rc_remove_hooks();
	atomic_store(&rc_active, 0);
	pthread_mutex_lock(&vma_lock);
	rc_sync_locked();
	/* Registrations still referenced by the application are freed too:
	 * finalize ends every handle's life. */
	free_tree(vma_root);
	vma_root = NULL;
	cached = 0;
	pthread_mutex_unlock(&vma_lock);
	rc_collect_garbage();
	rc_vma_t *n = atomic_exchange(&node_pool, NULL);
	while (n) {
		rc_vma_t *next = n->next;
		free(n);
		n = next;
	}
	pthread_mutex_destroy(&vma_lock);
}

RC_EXPORT enum rc_variant rc_current_variant(void) { return variant; }

RC_EXPORT const char *rc_variant_name(enum rc_variant v)
{
	return v == RC_LEGACY ? "legacy" : v == RC_FIXED ? "fixed" : "unknown";
}

RC_EXPORT void rc_get_stats(struct rc_stats *out)
{
	out->registrations = atomic_load(&stats.registrations);
	out->hits = atomic_load(&stats.hits);
	out->lookups = atomic_load(&stats.lookups);
	out->invalidated = atomic_load(&stats.invalidated);
	out->hook_calls = atomic_load(&stats.hook_calls);
	out->hook_deferred = atomic_load(&stats.hook_deferred);
	out->overflows = atomic_load(&stats.overflows);
	out->flushes = atomic_load(&stats.flushes);
	out->evicted = atomic_load(&stats.evicted);
	pthread_mutex_lock(&vma_lock);
	out->cached = cached;
	pthread_mutex_unlock(&vma_lock);
}
