/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the pthread mutex, rwlock, spinlock and condition interposers. */
#include "shim.h"

/* A try, timed or clock lock's outcome, recorded once the real call
 * returned (the thread's guard was let go around it). */
HOT void try_exit(struct tstate *t, __u32 op, __u64 lock, __u64 addr2, int r, __u64 *frame)
{
	if (t->guard)
		return;
	t->guard = 1;
	rec_try_result(t, op, lock, addr2, r, frame);
	leave(t);
}

/* ---- locks -------------------------------------------------------------- */

EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
	ENSURE(mutex_lock);
	struct tstate *t = enter_op(OP_MUTEX_LOCK);
	if (t) {
		rec_acquire(t, OP_MUTEX_LOCK, (__u64)m, (__u64)real.mutex_lock, FRAME);
		leave(t);
	}
	return real.mutex_lock(m);
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
	ENSURE(mutex_trylock);
	struct tstate *t = enter_op(OP_MUTEX_TRYLOCK);
	if (!t)
		return real.mutex_trylock(m);
	count_call(t, OP_MUTEX_TRYLOCK);
	leave(t);
	int r = real.mutex_trylock(m);
	try_exit(t, OP_MUTEX_TRYLOCK, (__u64)m, 0, r, FRAME);
	return r;
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *at)
{
	ENSURE(mutex_timedlock);
	struct tstate *t = enter_op(OP_MUTEX_TIMEDLOCK);
	if (!t)
		return real.mutex_timedlock(m, at);
	count_call(t, OP_MUTEX_TIMEDLOCK);
	leave(t);
	int r = real.mutex_timedlock(m, at);
	try_exit(t, OP_MUTEX_TIMEDLOCK, (__u64)m, (__u64)at, r, FRAME);
	return r;
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t c, const struct timespec *at)
{
	ENSURE(mutex_clocklock);
	struct tstate *t = enter_op(OP_MUTEX_CLOCKLOCK);
	if (!t)
		return real.mutex_clocklock(m, c, at);
	count_call(t, OP_MUTEX_CLOCKLOCK);
	leave(t);
	int r = real.mutex_clocklock(m, c, at);
	try_exit(t, OP_MUTEX_CLOCKLOCK, (__u64)m, (__u64)c, r, FRAME);
	return r;
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
	ENSURE(mutex_unlock);
	struct tstate *t = enter_op(OP_MUTEX_UNLOCK);
	if (t) {
		rec_release(t, OP_MUTEX_UNLOCK, (__u64)m, (__u64)real.mutex_unlock, FRAME);
		leave(t);
	}
	return real.mutex_unlock(m);
}

/* An init is recorded after the call, so that the kind (read from the
 * lock) is what the attributes gave; a destroy before it. */
EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a)
{
	ENSURE(mutex_init);
	int r = real.mutex_init(m, a);
	struct tstate *t = enter_op(OP_MUTEX_INIT);
	if (t) {
		rec_lifetime(t, OP_MUTEX_INIT, (__u64)m, mutex_kind(OP_MUTEX_INIT, (__u64)m), (__u64)real.mutex_init, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_mutex_destroy(pthread_mutex_t *m)
{
	ENSURE(mutex_destroy);
	struct tstate *t = enter_op(OP_MUTEX_DESTROY);
	if (t) {
		rec_destroy(t, OP_MUTEX_DESTROY, (__u64)m, mutex_kind(OP_MUTEX_DESTROY, (__u64)m), (__u64)real.mutex_destroy, FRAME);
		leave(t);
	}
	return real.mutex_destroy(m);
}

EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
	ENSURE(rw_rdlock);
	struct tstate *t = enter_op(OP_RWLOCK_RDLOCK);
	if (t) {
		rec_acquire(t, OP_RWLOCK_RDLOCK, (__u64)l, (__u64)real.rw_rdlock, FRAME);
		leave(t);
	}
	return real.rw_rdlock(l);
}

EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	ENSURE(rw_wrlock);
	struct tstate *t = enter_op(OP_RWLOCK_WRLOCK);
	if (t) {
		rec_acquire(t, OP_RWLOCK_WRLOCK, (__u64)l, (__u64)real.rw_wrlock, FRAME);
		leave(t);
	}
	return real.rw_wrlock(l);
}

EXPORT int pthread_rwlock_tryrdlock(pthread_rwlock_t *l)
{
	ENSURE(rw_tryrdlock);
	struct tstate *t = enter_op(OP_RWLOCK_TRYRDLOCK);
	if (!t)
		return real.rw_tryrdlock(l);
	count_call(t, OP_RWLOCK_TRYRDLOCK);
	leave(t);
	int r = real.rw_tryrdlock(l);
	try_exit(t, OP_RWLOCK_TRYRDLOCK, (__u64)l, 0, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_trywrlock(pthread_rwlock_t *l)
{
	ENSURE(rw_trywrlock);
	struct tstate *t = enter_op(OP_RWLOCK_TRYWRLOCK);
	if (!t)
		return real.rw_trywrlock(l);
	count_call(t, OP_RWLOCK_TRYWRLOCK);
	leave(t);
	int r = real.rw_trywrlock(l);
	try_exit(t, OP_RWLOCK_TRYWRLOCK, (__u64)l, 0, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_timedrdlock(pthread_rwlock_t *l, const struct timespec *at)
{
	ENSURE(rw_timedrdlock);
	struct tstate *t = enter_op(OP_RWLOCK_TIMEDRDLOCK);
	if (!t)
		return real.rw_timedrdlock(l, at);
	count_call(t, OP_RWLOCK_TIMEDRDLOCK);
	leave(t);
	int r = real.rw_timedrdlock(l, at);
	try_exit(t, OP_RWLOCK_TIMEDRDLOCK, (__u64)l, (__u64)at, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_timedwrlock(pthread_rwlock_t *l, const struct timespec *at)
{
	ENSURE(rw_timedwrlock);
	struct tstate *t = enter_op(OP_RWLOCK_TIMEDWRLOCK);
	if (!t)
		return real.rw_timedwrlock(l, at);
	count_call(t, OP_RWLOCK_TIMEDWRLOCK);
	leave(t);
	int r = real.rw_timedwrlock(l, at);
	try_exit(t, OP_RWLOCK_TIMEDWRLOCK, (__u64)l, (__u64)at, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_clockrdlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	ENSURE(rw_clockrdlock);
	struct tstate *t = enter_op(OP_RWLOCK_CLOCKRDLOCK);
	if (!t)
		return real.rw_clockrdlock(l, c, at);
	count_call(t, OP_RWLOCK_CLOCKRDLOCK);
	leave(t);
	int r = real.rw_clockrdlock(l, c, at);
	try_exit(t, OP_RWLOCK_CLOCKRDLOCK, (__u64)l, (__u64)c, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_clockwrlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	ENSURE(rw_clockwrlock);
	struct tstate *t = enter_op(OP_RWLOCK_CLOCKWRLOCK);
	if (!t)
		return real.rw_clockwrlock(l, c, at);
	count_call(t, OP_RWLOCK_CLOCKWRLOCK);
	leave(t);
	int r = real.rw_clockwrlock(l, c, at);
	try_exit(t, OP_RWLOCK_CLOCKWRLOCK, (__u64)l, (__u64)c, r, FRAME);
	return r;
}

EXPORT int pthread_rwlock_unlock(pthread_rwlock_t *l)
{
	ENSURE(rw_unlock);
	struct tstate *t = enter_op(OP_RWLOCK_UNLOCK);
	if (t) {
		rec_release(t, OP_RWLOCK_UNLOCK, (__u64)l, (__u64)real.rw_unlock, FRAME);
		leave(t);
	}
	return real.rw_unlock(l);
}

/* The preference is read from the lock after the init (glibc copies the
 * attribute's kind into __flags): what the BPF side reads from the
 * attribute at entry, and the default's 0 without one. */
EXPORT int pthread_rwlock_init(pthread_rwlock_t *l, const pthread_rwlockattr_t *a)
{
	ENSURE(rw_init);
	int r = real.rw_init(l, a);
	struct tstate *t = enter_op(OP_RWLOCK_INIT);
	if (t) {
		rec_lifetime(t, OP_RWLOCK_INIT, (__u64)l, *(__u32 *)((__u64)l + GLIBC_RWLOCK_FLAGS_OFFSET), (__u64)real.rw_init, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_rwlock_destroy(pthread_rwlock_t *l)
{
	ENSURE(rw_destroy);
	struct tstate *t = enter_op(OP_RWLOCK_DESTROY);
	if (t) {
		rec_destroy(t, OP_RWLOCK_DESTROY, (__u64)l, 0, (__u64)real.rw_destroy, FRAME);
		leave(t);
	}
	return real.rw_destroy(l);
}

EXPORT int pthread_spin_lock(pthread_spinlock_t *l)
{
	ENSURE(spin_lock);
	struct tstate *t = enter_op(OP_SPIN_LOCK);
	if (t) {
		rec_acquire(t, OP_SPIN_LOCK, (__u64)l, (__u64)real.spin_lock, FRAME);
		leave(t);
	}
	return real.spin_lock(l);
}

EXPORT int pthread_spin_trylock(pthread_spinlock_t *l)
{
	ENSURE(spin_trylock);
	struct tstate *t = enter_op(OP_SPIN_TRYLOCK);
	if (!t)
		return real.spin_trylock(l);
	count_call(t, OP_SPIN_TRYLOCK);
	leave(t);
	int r = real.spin_trylock(l);
	try_exit(t, OP_SPIN_TRYLOCK, (__u64)l, 0, r, FRAME);
	return r;
}

EXPORT int pthread_spin_unlock(pthread_spinlock_t *l)
{
	ENSURE(spin_unlock);
	struct tstate *t = enter_op(OP_SPIN_UNLOCK);
	if (t) {
		rec_release(t, OP_SPIN_UNLOCK, (__u64)l, (__u64)real.spin_unlock, FRAME);
		leave(t);
	}
	return real.spin_unlock(l);
}

/* glibc 2.36's pthread_spin_init is pthread_spin_unlock's code; the BPF
 * side, which sees one address, tells them apart by whether the thread
 * holds the lock. The shim is called by name, so each counts as what the
 * program called. */
EXPORT int pthread_spin_init(pthread_spinlock_t *l, int pshared)
{
	ENSURE(spin_init);
	int r = real.spin_init(l, pshared);
	struct tstate *t = enter_op(OP_SPIN_INIT);
	if (t) {
		rec_lifetime(t, OP_SPIN_INIT, (__u64)l, 0, (__u64)real.spin_init, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_spin_destroy(pthread_spinlock_t *l)
{
	ENSURE(spin_destroy);
	struct tstate *t = enter_op(OP_SPIN_DESTROY);
	if (t) {
		rec_destroy(t, OP_SPIN_DESTROY, (__u64)l, 0, (__u64)real.spin_destroy, FRAME);
		leave(t);
	}
	return real.spin_destroy(l);
}

/* cond_wait releases its mutex at entry and holds it again at return,
 * whatever the result (as the BPF side's entry and return probes say). */
static void cond_enter(struct tstate *t, __u32 op, pthread_cond_t *c, pthread_mutex_t *m, __u64 fn, __u64 *frame)
{
	count_call(t, op);
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.addr = (__u64)c;
	e.addr2 = (__u64)m;
	held_pop(t, (__u64)m);
	if (t->held > 0)
		t->held--;
	send_with_stack(t, &e, fn, frame);
}

static void cond_return(struct tstate *t, __u32 op, pthread_cond_t *c, pthread_mutex_t *m, int ret, __u64 *frame)
{
	flush_held(t);
	struct event e;
	event_init(&e, t, op);
	e.flags = F_RETURN | F_ACQUIRED;
	e.addr = (__u64)c;
	e.addr2 = (__u64)m;
	e.ret = ret;
	t->held++;
	if (t->held > 1)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	life_use(t, (__u64)m, e.time);
	send_with_stack(t, &e, 0, frame);
	held_push(t, (__u64)m, OP_MUTEX_LOCK, 0, e.stack, e.time, 1);
	lock_page_add((__u64)m);
}

/* A wait is a cancellation point: a thread cancelled in it has the mutex
 * back when its cleanup handlers run (and one of them usually unlocks
 * it), but the wait never returns. Its return is recorded by a handler of
 * the shim's own, which runs first. */
struct cond_call {
	struct tstate *t;
	__u32 op;
	pthread_cond_t *c;
	pthread_mutex_t *m;
	__u64 *frame;
};

static void cond_cancelled(void *p)
{
	struct cond_call *w = p;
	struct tstate *t = w->t;
	if (t->guard)
		return;
	t->guard = 1;
	cond_return(t, w->op, w->c, w->m, ECANCELED, w->frame);
	leave(t);
}

EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
	ENSURE(cond_wait);
	struct tstate *t = enter_op(OP_COND_WAIT);
	if (!t)
		return real.cond_wait(c, m);
	cond_enter(t, OP_COND_WAIT, c, m, (__u64)real.cond_wait, FRAME);
	leave(t);
	struct cond_call w = {t, OP_COND_WAIT, c, m, FRAME};
	int r;
	pthread_cleanup_push(cond_cancelled, &w);
	r = real.cond_wait(c, m);
	pthread_cleanup_pop(0);
	if (!t->guard) {
		t->guard = 1;
		cond_return(t, OP_COND_WAIT, c, m, r, FRAME);
		leave(t);
	}
	return r;
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *at)
{
	ENSURE(cond_timedwait);
	struct tstate *t = enter_op(OP_COND_TIMEDWAIT);
	if (!t)
		return real.cond_timedwait(c, m, at);
	cond_enter(t, OP_COND_TIMEDWAIT, c, m, (__u64)real.cond_timedwait, FRAME);
	leave(t);
	struct cond_call w = {t, OP_COND_TIMEDWAIT, c, m, FRAME};
	int r;
	pthread_cleanup_push(cond_cancelled, &w);
	r = real.cond_timedwait(c, m, at);
	pthread_cleanup_pop(0);
	if (!t->guard) {
		t->guard = 1;
		cond_return(t, OP_COND_TIMEDWAIT, c, m, r, FRAME);
		leave(t);
	}
	return r;
}

/* The analyzer knows one timed wait: clockwait is one. */
EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk, const struct timespec *at)
{
	ENSURE(cond_clockwait);
	struct tstate *t = enter_op(OP_COND_TIMEDWAIT);
	if (!t)
		return real.cond_clockwait(c, m, clk, at);
	cond_enter(t, OP_COND_TIMEDWAIT, c, m, (__u64)real.cond_clockwait, FRAME);
	leave(t);
	struct cond_call w = {t, OP_COND_TIMEDWAIT, c, m, FRAME};
	int r;
	pthread_cleanup_push(cond_cancelled, &w);
	r = real.cond_clockwait(c, m, clk, at);
	pthread_cleanup_pop(0);
	if (!t->guard) {
		t->guard = 1;
		cond_return(t, OP_COND_TIMEDWAIT, c, m, r, FRAME);
		leave(t);
	}
	return r;
}
