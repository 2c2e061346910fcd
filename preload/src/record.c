/* Part of the shim (shim.c includes it; shim.h declares what the parts share): threads' state, stacks and events: the held set and the chain cache. */
#include "shim.h"

/* ---- threads ------------------------------------------------------------ */

/* Sets up a thread's state for this process: its TID (one syscall per
 * thread), its counter slot. */
void thread_init(struct tstate *t)
{
	int saved = errno, guard = t->guard;
	memset(t, 0, sizeof(*t));
	t->guard = guard; /* the caller is inside the shim */
	t->shared.tid = (__u32)syscall(SYS_gettid);
	__u32 slot = __atomic_fetch_add(H32(SHM_OFF_NEXT_SLOT), 1, __ATOMIC_RELAXED);
	if (slot < SHM_SLOTS) {
		t->calls = H64(SHM_OFF_SLOTS) + (__u64)slot * SHM_SLOT_OPS;
		t->writing = &writing[slot].v;
		__atomic_store_n(&writing[slot].live_tid, t->shared.tid, __ATOMIC_RELAXED);
	}
	if (t->shared.tid == my_pid) {
		/* The main thread's stack grows down to its limit, and the
		 * kernel keeps mmaps at least that far below it. */
		t->stack_hi = (__u64)__libc_stack_end;
		t->stack_lo = t->stack_hi - stack_limit(1ULL << 30);
	} else if (INJECTED) {
		/* A thread that was running before the library was (an
		 * injected attach): its stack is the mapping that holds sp. */
		__u64 lo, hi;
		int w;
		if (find_mapping((__u64)__builtin_frame_address(0), &lo, &hi, &w) && w) {
			t->stack_hi = hi;
			t->stack_lo = lo;
		}
	}
	t->inited = shim_gen;
	errno = saved;
}

/* enter's first call in a process, after a fork, or on a new thread. */
__attribute__((noinline, cold)) struct tstate *enter_slow(struct tstate *t)
{
	int first = 0;
	if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2) {
		t->guard = 1;
		first = init_process();
		t->guard = 0;
		if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2)
			return NULL;
	}
	if (unlikely(forking) && (__u32)getpid() != my_pid)
		after_fork_child();
	if (!active)
		return NULL;
	t->guard = 1;
	if (t->inited != shim_gen)
		thread_init(t);
	if (first)
		exec_event(t);
	return t;
}

/* ---- stacks ------------------------------------------------------------- */

/* The frame-pointer chain from an interposer's frame: fn (the real
 * function, where the BPF side's probe would be), the caller's return
 * address, then the caller's chain. Every frame read is checked to lie on
 * the live stack, so code built without frame pointers (which leaves
 * anything in rbp) ends the walk instead of faulting. At a return (fn 0)
 * the caller comes first, as at the BPF side's return probes. */
static __u32 walk(struct tstate *t, __u64 *ips, __u64 fn, __u64 *frame, int *truncated)
{
	__u32 n = 0;
	if (fn)
		ips[n++] = fn;
	ips[n++] = frame[1];
	__u64 lo = (__u64)frame, hi = readable_top(t, lo, WALK_SPAN);
	__u64 fp = frame[0];
	while (n < MAX_FRAMES) {
		if (!hi || fp <= lo || fp + 16 > hi || (fp & 7))
			break;
		__u64 *f = (__u64 *)fp;
		__u64 ra = real_ret(fp + 8, f[1]);
		if (!ra)
			break;
		if (!in_shim(ra))
			ips[n++] = ra;
		lo = fp;
		fp = f[0];
	}
	*truncated = n == MAX_FRAMES;
	return n;
}

/* Sends the stack in r (once per hash, as far as this process knows) and
 * returns its hash. */
__u64 send_stack(struct stack *r, __u32 nr, int truncated)
{
	__u64 hash = 0xcbf29ce484222325ULL ^ my_pid;
	for (__u32 i = 0; i < nr; i++) {
		hash ^= r->ips[i];
		hash *= 0x100000001b3ULL;
	}
	hash &= ~(1ULL << 63); /* the top bit marks sample ids */
	if (!hash)
		hash = 1;
	__u64 *slot = &stacks_sent[hash & ((1 << 12) - 1)];
	if (__atomic_load_n(slot, __ATOMIC_RELAXED) == hash)
		return hash;
	r->type = REC_STACK;
	r->nr = nr;
	r->pid = my_pid;
	r->truncated = truncated;
	r->hash = hash;
	memset(&r->ips[nr], 0, (MAX_FRAMES - nr) * sizeof(__u64));
	ring_output(r, sizeof(*r), REC_STACK);
	__atomic_store_n(slot, hash, __ATOMIC_RELAXED);
	return hash;
}

__u64 take_stack(struct tstate *t, __u64 fn, __u64 *frame)
{
	struct stack r;
	int truncated;
	__u32 nr = walk(t, r.ips, fn, frame, &truncated);
	return send_stack(&r, nr, truncated);
}

/* Raw stack memory from sp up, with the registers a probe at ip would
 * see, for hooktrace's .eh_frame unwinder; returns its id (top bit set). */
__u64 take_sample_regs(struct tstate *t, __u64 ip, __u64 sp, __u64 bp, __u64 until)
{
	__u64 len = SAMPLE_BYTES;
	if (until > sp && until - sp + 2048 < len)
		len = until - sp + 2048;
	/* Only the live stack may be read. */
	__u64 top = t->stack_hi ? readable_top(t, sp, len) : (until > sp ? until : sp) + 16;
	if (sp + len > top)
		len = top > sp ? top - sp : 0;
	len &= ~7ULL;
	if (len < 16)
		return 0;
	if (!write_begin())
		return 0;
	__u64 pos;
	unsigned char *p = ring_reserve(sizeof(struct sample), &pos);
	if (!p) {
		count_lost(REC_SAMPLE);
		write_end();
		return 0;
	}
	struct sample *r = (struct sample *)p;
	__u64 id = (1ULL << 63) | ((__u64)t->shared.tid << 32) |
		   (__atomic_fetch_add(&sample_seq, 1, __ATOMIC_RELAXED) & 0xffffffff);
	r->type = REC_SAMPLE;
	r->len = (__u32)len;
	r->pid = my_pid;
	r->pad = 0;
	r->hash = id;
	r->ip = ip;
	r->sp = sp;
	r->bp = bp;
	memcpy(r->data, (void *)sp, len);
	restore_returns(r->data, sp, len);
	ring_commit(p, pos);
	write_end();
	return id;
}

/* A sample from an interposer's return-address slot up, with the
 * registers a probe at fn's entry would see. */
static __u64 take_sample(struct tstate *t, __u64 fn, __u64 *frame)
{
	return take_sample_regs(t, fn, (__u64)&frame[1], frame[0], t->shared.alloc_sp);
}

/* ---- events ------------------------------------------------------------- */

void event_init(struct event *e, struct tstate *t, __u32 op)
{
	memset(e, 0, sizeof(*e));
	e->type = REC_EVENT;
	e->op = op;
	e->pid = my_pid;
	e->tid = t->shared.tid;
	e->time = now();
}

void event_send(struct event *e)
{
	ring_output(e, sizeof(*e), REC_EVENT);
}

/* A sample inside an allocator call, a frame-pointer stack otherwise. */
void send_with_stack(struct tstate *t, struct event *e, __u64 fn, __u64 *frame)
{
	if ((e->flags & F_IN_ALLOC) && (cfg_flags & SHM_F_SAMPLES) && fn)
		e->stack = take_sample(t, fn, frame);
	if (!e->stack)
		e->stack = take_stack(t, fn, frame);
	event_send(e);
}

/* The lock's attributes the analyzer uses, as Event.Arg: a mutex's type
 * (__kind), a rwlock's preference (__flags:
 * PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP makes reads queue behind
 * writers). */
__u32 mutex_kind(__u32 op, __u64 lock)
{
	if (!lock)
		return 0;
	if (op >= OP_MUTEX_LOCK && op <= OP_MUTEX_DESTROY)
		return *(__u32 *)(lock + GLIBC_MUTEX_KIND_OFFSET);
	if (op >= OP_RWLOCK_RDLOCK && op <= OP_RWLOCK_CLOCKWRLOCK)
		return *(__u32 *)(lock + GLIBC_RWLOCK_FLAGS_OFFSET);
	return 0;
}

int held_pop(struct tstate *t, __u64 addr)
{
	for (int i = (int)t->nheld - 1; i >= 0; i--) {
		if (t->held_locks[i].addr != addr)
			continue;
		int sent = t->held_locks[i].sent;
		for (__u32 j = i; j + 1 < t->nheld; j++)
			t->held_locks[j] = t->held_locks[j + 1];
		t->nheld--;
		t->held_sum -= held_mix(addr);
		return sent;
	}
	return -1;
}

/* Whether op is recorded at its return, where its result says whether it
 * acquired: a try or a timed acquisition. */
static int acquired_at_return(__u32 op)
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

/* Sends the acquisition of h, the i-th lock t holds, at its own time if
 * it has one; returns the event sent. A try or timed acquisition is its
 * successful return, as rec_try_result sends it. */
struct event send_held(struct tstate *t, const struct held_lock *h, __u32 i)
{
	struct event e;
	event_init(&e, t, h->op);
	if (h->time)
		e.time = h->time;
	e.addr = h->addr;
	e.arg = mutex_kind(h->op, h->addr);
	e.stack = h->stack;
	e.flags = F_ACQUIRED | (i > 0 ? F_LOCKS_HELD : 0);
	if (acquired_at_return(h->op))
		e.flags |= F_RETURN;
	event_send(&e);
	return e;
}

void flush_held(struct tstate *t)
{
	for (__u32 i = 0; i < t->nheld; i++) {
		struct held_lock *h = &t->held_locks[i];
		if (h->sent)
			continue;
		send_held(t, h, i);
		h->sent = 1;
	}
}

void pattern_sent(struct tstate *t, __u64 key, __u64 stack)
{
	for (__u32 i = 0; i < 8; i++) {
		__u32 at = (key + i) & CHAIN_MASK;
		__u64 zero = 0;
		if (__atomic_compare_exchange_n(&chain_keys[at], &zero, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED) ||
		    zero == key) {
			__atomic_store_n(&chain_vals[at], stack, __ATOMIC_RELAXED);
			break;
		}
	}
	__u32 c = key & (SHIM_PATTERN_CACHE - 1);
	t->cache_key[c] = key;
	t->cache_stack[c] = stack | (1ULL << 62);
	if (!__atomic_load_n(&epoch_used, __ATOMIC_RELAXED))
		__atomic_store_n(&epoch_used, 1, __ATOMIC_RELEASE);
}

void alloc_context(struct tstate *t, struct event *e)
{
	if (!t->shared.alloc_depth)
		return;
	e->flags |= F_IN_ALLOC;
	e->addr2 = t->shared.alloc_op | ((__u64)t->shared.alloc_seq << 16);
}

/* A memory system call's event, counted, with the fields the BPF side's
 * sys_enter gives it; the caller adds its stack. */
void mem_event(struct tstate *t, struct event *e, __u32 op, __u64 addr, __u64 size, __u64 arg)
{
	count_call(t, op);
	event_init(e, t, op);
	e->addr = addr;
	e->size = size;
	e->arg = arg;
	if (t->held > 0)
		e->flags |= F_LOCKS_HELD;
	alloc_context(t, e);
}

/* An allocator call's event, once rec_alloc found it must be sent; key is
 * its pattern, 0 when it is not one (nested, or a free that may end a
 * lock's lifetime, or held locks that overflowed). Out of line, so that the
 * call that is only counted pays no frame for the event. */
__attribute__((noinline)) void send_alloc(struct tstate *t, __u32 op, __u64 fn, __u64 *frame, __u64 addr,
						 __u64 size, __u64 arg, __u64 outer, __u64 key)
{
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	if (outer) {
		e.flags |= F_IN_ALLOC;
		e.addr2 = outer;
	}
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	e.addr = addr;
	e.size = size;
	e.arg = arg;
	send_with_stack(t, &e, fn, frame);
	if (key)
		pattern_sent(t, key, e.stack);
}

/* An acquisition rec_acquire found new: sent with its stack. Out of line,
 * as send_alloc. */
__attribute__((noinline)) void send_acquire(struct tstate *t, __u32 op, __u64 lock, __u64 fn, __u64 *frame,
						   __u64 key)
{
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	e.arg = mutex_kind(op, lock);
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	e.flags |= F_ACQUIRED;
	alloc_context(t, &e);
	life_use(t, lock, e.time);
	send_with_stack(t, &e, fn, frame);
	held_push(t, lock, op, (__u32)e.arg, e.stack, e.time, 1);
	t->held++;
	lock_page_add(lock);
	if (key)
		pattern_sent(t, key, e.stack);
}

/* A release whose acquisition was sent. */
__attribute__((noinline)) void send_release(struct tstate *t, __u32 op, __u64 lock)
{
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	life_use(t, lock, e.time);
	event_send(&e);
}

/* A call that misuses a lock: an unlock by a thread that does not hold
 * it, or a destroy of a held one. What the lock's word says then, as the
 * BPF side reads it: whether it is held, and by which thread where it
 * names one (a mutex's __owner, a rwlock's writer; 0 for readers, nobody,
 * or a spinlock, whose word is 1 when unlocked). */
int lock_word_holder(__u32 op, __u64 lock, __u32 *holder)
{
	*holder = 0;
	if (op == OP_SPIN_UNLOCK) /* a spinlock's word names no holder */
		return glibc_spin_held(*(const volatile __s32 *)lock);
	return glibc_lock_held(op >= OP_MUTEX_LOCK && op <= OP_MUTEX_DESTROY, (const __u32 *)lock, holder);
}

/* A misuse: sent with its stack and the holder the lock's word names. */
__attribute__((noinline)) void send_misuse(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u16 flags,
						  __u32 holder, __u64 fn, __u64 *frame)
{
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	e.addr2 = holder;
	e.arg = arg;
	e.flags = flags;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	life_use(t, lock, e.time);
	send_with_stack(t, &e, fn, frame);
}

/* A try, timed or clock acquisition's result (counted at entry). In
 * aggregate mode a failure is only counted (the analysis takes nothing
 * from it: no lock is held, no order is implied), and a success whose
 * pattern was sent is held unsent, as rec_acquire holds a known
 * acquisition: a lock taken by trylock in a hot loop (jemalloc's mutexes
 * are) costs what a lock call does. */
void rec_try_result(struct tstate *t, __u32 op, __u64 lock, __u64 addr2, int ret, __u64 *frame)
{
	__u64 key = 0;
	if (dedupable(t) && !t->shared.alloc_depth) {
		if (ret != 0)
			return;
		if (t->nheld < MAX_HELD && held_known(t, op, lock, &key))
			return;
	}
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.flags = F_RETURN;
	e.addr = lock;
	e.addr2 = addr2;
	e.ret = ret;
	if (ret == 0) {
		e.flags |= F_ACQUIRED;
		t->held++;
	}
	e.arg = mutex_kind(op, lock);
	if (t->held > 1 || (!(e.flags & F_ACQUIRED) && t->held > 0))
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	if (e.flags & F_ACQUIRED)
		life_use(t, lock, e.time);
	send_with_stack(t, &e, 0, frame);
	if (e.flags & F_ACQUIRED) {
		held_push(t, lock, op, (__u32)e.arg, e.stack, e.time, 1);
		lock_page_add(lock);
	}
	if (key)
		pattern_sent(t, key, e.stack);
}

/* An init or destroy: the lock's lifetime ends (re-initialising a live
 * lock ends it too), so every pattern is new again. An init is sent with
 * its stack, which names a heap lock, and registers the lock's page; a
 * destroy goes without (rec_destroy says when not), as on the BPF side. In
 * aggregate mode a lifetime nothing used is not sent (life_keep,
 * life_end). */
void rec_lifetime(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	lifetime_changed();
	if (!frame && life_end(lock))
		return;
	__u64 stack = 0;
	if (frame) {
		stack = take_stack(t, fn, frame);
		lock_page_add(lock);
		if (life_keep(op, lock, (__u32)arg, 0, stack))
			return;
	}
	struct event e;
	event_init(&e, t, op);
	e.addr = lock;
	e.arg = arg;
	e.stack = stack;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	event_send(&e);
}

/* A destroy: the lock's lifetime ends. One of a held mutex or rwlock is
 * sent with its stack, after the thread's held locks whose acquisitions
 * were only counted (the analysis names the holder's acquisition), as the
 * BPF side does; the others go without. */
void rec_destroy(struct tstate *t, __u32 op, __u64 lock, __u64 arg, __u64 fn, __u64 *frame)
{
	__u32 holder;
	if (op != OP_SPIN_DESTROY && lock_word_holder(op, lock, &holder)) {
		count_call(t, op);
		lifetime_changed();
		flush_held(t);
		send_misuse(t, op, lock, arg, F_BUSY, holder, fn, frame);
		return;
	}
	rec_lifetime(t, op, lock, arg, 0, NULL);
}
