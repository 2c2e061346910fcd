/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the pthread mutex, rwlock, spinlock and condition interposers. */
#include "shim.h"

/* ---- locks -------------------------------------------------------------- */

#define ACQUIRE(op, field, call, lock)                              \
	ENSURE(field);                                              \
	struct tstate *t = enter_op(op);                                 \
	if (t) {                                                    \
		rec_acquire(t, op, (__u64)(lock), (__u64)real.field, FRAME); \
		leave(t);                                           \
	}                                                           \
	return call;

#define TRY(op, field, call, lock, addr2)                    \
	ENSURE(field);                                       \
	struct tstate *t = enter_op(op);                          \
	if (!t)                                              \
		return call;                                 \
	count_call(t, op);                                   \
	leave(t);                                            \
	int r = call;                                        \
	if (!t->guard) {                                     \
		t->guard = 1;                                \
		rec_try_result(t, op, (__u64)(lock), (__u64)(addr2), r, FRAME); \
		leave(t);                                    \
	}                                                    \
	return r;

#define RELEASE(op, field, call, lock)                                   \
	ENSURE(field);                                                   \
	struct tstate *t = enter_op(op);                                 \
	if (t) {                                                         \
		rec_release(t, op, (__u64)(lock), (__u64)real.field, FRAME); \
		leave(t);                                                \
	}                                                                \
	return call;

/* An init is recorded after the call, so that kind (read from the lock)
 * is what the attributes gave; a destroy before it. */
#define INIT(op, field, call, lock, kind)                                                  \
	ENSURE(field);                                                                     \
	int r = call;                                                                      \
	struct tstate *t = enter_op(op);                                                   \
	if (t) {                                                                           \
		rec_lifetime(t, op, (__u64)(lock), (kind), (__u64)real.field, FRAME);          \
		leave(t);                                                                  \
	}                                                                                  \
	return r;

#define DESTROY(op, field, call, lock, kind)                                        \
	ENSURE(field);                                                              \
	struct tstate *t = enter_op(op);                                            \
	if (t) {                                                                    \
		rec_destroy(t, op, (__u64)(lock), (kind), (__u64)real.field, FRAME); \
		leave(t);                                                           \
	}                                                                           \
	return call;

EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
	ACQUIRE(OP_MUTEX_LOCK, mutex_lock, real.mutex_lock(m), m)
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
	TRY(OP_MUTEX_TRYLOCK, mutex_trylock, real.mutex_trylock(m), m, 0)
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *at)
{
	TRY(OP_MUTEX_TIMEDLOCK, mutex_timedlock, real.mutex_timedlock(m, at), m, at)
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t c, const struct timespec *at)
{
	TRY(OP_MUTEX_CLOCKLOCK, mutex_clocklock, real.mutex_clocklock(m, c, at), m, c)
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
	RELEASE(OP_MUTEX_UNLOCK, mutex_unlock, real.mutex_unlock(m), m)
}

EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a)
{
	INIT(OP_MUTEX_INIT, mutex_init, real.mutex_init(m, a), m, mutex_kind(OP_MUTEX_INIT, (__u64)m))
}

EXPORT int pthread_mutex_destroy(pthread_mutex_t *m)
{
	DESTROY(OP_MUTEX_DESTROY, mutex_destroy, real.mutex_destroy(m), m, mutex_kind(OP_MUTEX_DESTROY, (__u64)m))
}

EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
	ACQUIRE(OP_RWLOCK_RDLOCK, rw_rdlock, real.rw_rdlock(l), l)
}

EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	ACQUIRE(OP_RWLOCK_WRLOCK, rw_wrlock, real.rw_wrlock(l), l)
}

EXPORT int pthread_rwlock_tryrdlock(pthread_rwlock_t *l)
{
	TRY(OP_RWLOCK_TRYRDLOCK, rw_tryrdlock, real.rw_tryrdlock(l), l, 0)
}

EXPORT int pthread_rwlock_trywrlock(pthread_rwlock_t *l)
{
	TRY(OP_RWLOCK_TRYWRLOCK, rw_trywrlock, real.rw_trywrlock(l), l, 0)
}

EXPORT int pthread_rwlock_timedrdlock(pthread_rwlock_t *l, const struct timespec *at)
{
	TRY(OP_RWLOCK_TIMEDRDLOCK, rw_timedrdlock, real.rw_timedrdlock(l, at), l, at)
}

EXPORT int pthread_rwlock_timedwrlock(pthread_rwlock_t *l, const struct timespec *at)
{
	TRY(OP_RWLOCK_TIMEDWRLOCK, rw_timedwrlock, real.rw_timedwrlock(l, at), l, at)
}

EXPORT int pthread_rwlock_clockrdlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	TRY(OP_RWLOCK_CLOCKRDLOCK, rw_clockrdlock, real.rw_clockrdlock(l, c, at), l, c)
}

EXPORT int pthread_rwlock_clockwrlock(pthread_rwlock_t *l, clockid_t c, const struct timespec *at)
{
	TRY(OP_RWLOCK_CLOCKWRLOCK, rw_clockwrlock, real.rw_clockwrlock(l, c, at), l, c)
}

EXPORT int pthread_rwlock_unlock(pthread_rwlock_t *l)
{
	RELEASE(OP_RWLOCK_UNLOCK, rw_unlock, real.rw_unlock(l), l)
}

/* The preference is read from the lock after the init (glibc copies the
 * attribute's kind into __flags): what the BPF side reads from the
 * attribute at entry, and the default's 0 without one. */
EXPORT int pthread_rwlock_init(pthread_rwlock_t *l, const pthread_rwlockattr_t *a)
{
	INIT(OP_RWLOCK_INIT, rw_init, real.rw_init(l, a), l, *(__u32 *)((__u64)l + GLIBC_RWLOCK_FLAGS_OFFSET))
}

EXPORT int pthread_rwlock_destroy(pthread_rwlock_t *l)
{
	DESTROY(OP_RWLOCK_DESTROY, rw_destroy, real.rw_destroy(l), l, 0)
}

EXPORT int pthread_spin_lock(pthread_spinlock_t *l)
{
	ACQUIRE(OP_SPIN_LOCK, spin_lock, real.spin_lock(l), l)
}

EXPORT int pthread_spin_trylock(pthread_spinlock_t *l)
{
	TRY(OP_SPIN_TRYLOCK, spin_trylock, real.spin_trylock(l), l, 0)
}

EXPORT int pthread_spin_unlock(pthread_spinlock_t *l)
{
	RELEASE(OP_SPIN_UNLOCK, spin_unlock, real.spin_unlock(l), l)
}

/* glibc 2.36's pthread_spin_init is pthread_spin_unlock's code; the BPF
 * side, which sees one address, tells them apart by whether the thread
 * holds the lock. The shim is called by name, so each counts as what the
 * program called. */
EXPORT int pthread_spin_init(pthread_spinlock_t *l, int pshared)
{
	INIT(OP_SPIN_INIT, spin_init, real.spin_init(l, pshared), l, 0)
}

EXPORT int pthread_spin_destroy(pthread_spinlock_t *l)
{
	DESTROY(OP_SPIN_DESTROY, spin_destroy, real.spin_destroy(l), l, 0)
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

#define COND(op, field, call)                                  \
	ENSURE(field);                                         \
	struct tstate *t = enter_op(op);                       \
	if (!t)                                                \
		return call;                                   \
	cond_enter(t, op, c, m, (__u64)real.field, FRAME);     \
	leave(t);                                              \
	struct cond_call w = {t, op, c, m, FRAME};             \
	int r;                                                 \
	pthread_cleanup_push(cond_cancelled, &w);              \
	r = call;                                              \
	pthread_cleanup_pop(0);                                \
	if (!t->guard) {                                       \
		t->guard = 1;                                  \
		cond_return(t, op, c, m, r, FRAME);            \
		leave(t);                                      \
	}                                                      \
	return r;

EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
	COND(OP_COND_WAIT, cond_wait, real.cond_wait(c, m))
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *at)
{
	COND(OP_COND_TIMEDWAIT, cond_timedwait, real.cond_timedwait(c, m, at))
}

/* The analyzer knows one timed wait: clockwait is one. */
EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk, const struct timespec *at)
{
	COND(OP_COND_TIMEDWAIT, cond_clockwait, real.cond_clockwait(c, m, clk, at))
}
