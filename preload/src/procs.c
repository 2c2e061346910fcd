/* Part of the shim (shim.c includes it; shim.h declares what the parts share): threads and processes: create, exit, fork, vfork, exec and spawn. */
#include "shim.h"

/* ---- threads and processes ---------------------------------------------- */

/* What a new thread needs from its creator, in a static pool: the shim
 * must not allocate for it (a new thread's first allocator call creates
 * its arena, and that call must be the target's own). */
struct start {
	void *(*fn)(void *);
	void *arg;
	__u32 parent_tid;
	int busy;
	__u64 stack;
	__u64 stack_size; /* what the thread's stack is at least, 0 when unknown */
};

#define START_SLOTS 256
static struct start starts[START_SLOTS];

static struct start *start_get(void)
{
	for (int i = 0; i < START_SLOTS; i++) {
		int zero = 0;
		if (__atomic_compare_exchange_n(&starts[i].busy, &zero, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return &starts[i];
	}
	return NULL;
}

/* The live-thread mark of t's slot, or NULL for a thread on the shared
 * counter (past SHM_SLOTS threads). */
static __u32 *live_mark(struct tstate *t)
{
	if (!t->writing)
		return NULL;
	return &writing[((char *)t->writing - (char *)writing) / sizeof(writing[0])].live_tid;
}

/* Records thread tid's exit, written by t (tid itself, or the thread
 * that ends the process). */
static void send_thread_exit(struct tstate *t, __u32 tid, __s64 ret)
{
	count_call(t, OP_THREAD_EXIT);
	struct event e;
	event_init(&e, t, OP_THREAD_EXIT);
	e.tid = tid;
	e.ret = ret;
	event_send(&e);
}

void thread_exit_event(struct tstate *t, __s64 ret)
{
	if (t->exited)
		return;
	t->exited = 1;
	/* Once only: the process's end may have recorded it. */
	__u32 *mark = live_mark(t);
	if (mark && !__atomic_exchange_n(mark, 0, __ATOMIC_ACQ_REL))
		return;
	send_thread_exit(t, t->shared.tid, ret);
}

/* exit and _exit end the other threads where they are: their exits are
 * recorded by the ending thread, after their records under way
 * (end_writes). An exec ends them too, but may fail and leave them
 * running: there the kernel's view alone has their exits. */
void others_ended(struct tstate *self)
{
	__u32 n = slots_taken();
	for (__u32 i = 0; i < n; i++) {
		if (&writing[i].v == self->writing || !__atomic_load_n(&writing[i].live_tid, __ATOMIC_RELAXED))
			continue;
		__u32 tid = __atomic_exchange_n(&writing[i].live_tid, 0, __ATOMIC_ACQ_REL);
		if (tid)
			send_thread_exit(self, tid, 0);
	}
}

/* A thread that ends by cancellation (or pthread_exit) unwinds through
 * thread_start without returning to it. */
static void thread_unwound(void *unused)
{
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		leave(t);
	}
}

/* How much stack a thread created with attr gets at least, read without
 * allocating (glibc's pthread_getattr_np would, on the program's behalf,
 * and a thread's first malloc makes its arena). With no attribute glibc
 * takes RLIMIT_STACK (a larger size when unlimited, and whatever
 * pthread_setattr_default_np set, which is rare): the smaller of that and
 * 8 MiB. Too small only costs walks on the thread's deepest frames a
 * system call; too large would let them read past its guard page. */
static __u64 thread_stack_size(const pthread_attr_t *attr)
{
	size_t size = 0;
	if (attr)
		return pthread_attr_getstacksize(attr, &size) == 0 ? size : 0;
	return stack_limit(8 << 20);
}

/* The lowest address of a thread's own stack that walks and samples may
 * treat as its own: size bytes below hi, less a margin for what glibc
 * keeps above the thread's first frame (its TLS and struct pthread). */
static __u64 thread_stack_lo(__u64 hi, __u64 size)
{
	if (size >= (128 << 10))
		return hi - size + (64 << 10);
	return size ? hi - size / 2 : hi;
}

static void *thread_start(void *p)
{
	struct start *sp = p, s = *sp;
	__atomic_store_n(&sp->busy, 0, __ATOMIC_RELEASE);
	struct tstate *t = enter();
	if (t) {
		/* Above this frame are glibc's start_thread frame, then the
		 * thread's TLS and struct pthread (over 2 KiB): all mapped, so
		 * walks and samples may read that far and reach start_thread,
		 * as the BPF side's do. */
		t->stack_hi = (__u64)__builtin_frame_address(0) + 1024;
		t->stack_lo = thread_stack_lo(t->stack_hi, s.stack_size);
		/* The creation, as the BPF side's sched_process_fork reports it:
		 * by the creating thread, naming the new one. */
		count_call(t, OP_THREAD_CREATE);
		struct event e;
		event_init(&e, t, OP_THREAD_CREATE);
		e.tid = s.parent_tid;
		e.arg = t->shared.tid;
		e.addr = my_pid;
		e.stack = s.stack;
		event_send(&e);
		leave(t);
	}
	void *r;
	pthread_cleanup_push(thread_unwound, NULL);
	r = s.fn(s.arg);
	pthread_cleanup_pop(0);
	thread_unwound(NULL);
	return r;
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	ENSURE(create);
	struct tstate *t = enter();
	if (!t)
		return real.create(th, attr, fn, arg);
	struct start *s = start_get();
	if (!s) {
		/* 256 threads being started at once: this one goes unrecorded
		 * in its creation only. */
		leave(t);
		return real.create(th, attr, fn, arg);
	}
	s->fn = fn;
	s->arg = arg;
	s->parent_tid = t->shared.tid;
	s->stack = take_stack(t, (__u64)real.create, FRAME);
	s->stack_size = thread_stack_size(attr);
	leave(t);
	int r = real.create(th, attr, thread_start, s);
	if (r != 0)
		__atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
	return r;
}

EXPORT void pthread_exit(void *ret)
{
	ENSURE(exit);
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		leave(t);
	}
	real.exit(ret);
}

/* _exit ends the process wherever its other threads are: what they are
 * writing is finished first. A vfork child's _exit is its parent's
 * business only in that the parent resumes. */
static void process_end(void)
{
	if (vf.child)
		return;
	struct tstate *t = enter();
	if (t) {
		thread_exit_event(t, 0);
		end_writes(t);
		others_ended(t);
		leave(t);
	}
}

EXPORT void _exit(int status)
{
	ENSURE(_exit);
	process_end();
	real._exit(status);
}

EXPORT void _Exit(int status)
{
	ENSURE(_exit);
	process_end();
	real._exit(status);
}

/* The creation of a process, as the BPF side's sched_process_fork reports
 * it: by the parent, naming the child. */
static void process_created_from(struct tstate *t, __u32 pid, __u32 tid, pid_t child, __u64 stack)
{
	count_call(t, OP_THREAD_CREATE);
	struct event e;
	event_init(&e, t, OP_THREAD_CREATE);
	e.pid = pid;
	e.tid = tid;
	e.flags = F_PROCESS;
	e.arg = (__u64)child;
	e.addr = (__u64)child;
	e.stack = stack;
	event_send(&e);
}

static void process_created(struct tstate *t, pid_t child, __u64 fn, __u64 *frame)
{
	process_created_from(t, my_pid, t->shared.tid, child, take_stack(t, fn, frame));
}

/* In a child of fork: state starts afresh (the thread's held set and
 * counter slot were its parent's, and the threads that were writing are
 * not in the child), and without follow-forks the child records nothing. */
static void inherit_held(struct tstate *t, const struct held_lock *from, __u32 n);

void after_fork_child(void)
{
	/* The forking thread's held locks, its fork handlers' included: fork
	 * copies them locked, so the child's thread holds them. */
	struct held_lock held[MAX_HELD];
	__u32 nheld = ts.inited ? ts.nheld : 0;
	for (__u32 i = 0; i < nheld && i < MAX_HELD; i++)
		held[i] = ts.held_locks[i];
	forking = 0;
	my_pid = getpid();
	exits_after_fork();
	lives_after_fork();
	active = shm && (cfg_flags & SHM_F_FOLLOW);
	ts.inited = 0;
	ts.guard = 0;
	/* Only the flags that are set are written: the others stay shared
	 * with the parent, copied by no write. */
	for (__u32 i = 0; i < SHM_SLOTS; i++) {
		if (writing[i].v)
			writing[i].v = 0;
		if (writing[i].live_tid)
			writing[i].live_tid = 0;
	}
	writing_shared = 0;
	closing_tid = 0;
	reader_stalled = 0;
	if (active && fork_from.tid) {
		int saved = errno;
		ts.guard = 1;
		thread_init(&ts);
		process_created_from(&ts, fork_from.pid, fork_from.tid, (pid_t)my_pid, fork_from.stack);
		inherit_held(&ts, held, nheld);
		ts.guard = 0;
		errno = saved;
	}
	if (active)
		announce_shared();
}

/* The child's thread takes up the locks it holds from its first
 * instruction, as the BPF side's sched_fork tells them: one acquisition
 * each, with the stack of the parent's. */
static void inherit_held(struct tstate *t, const struct held_lock *from, __u32 n)
{
	for (__u32 i = 0; i < n && i < MAX_HELD; i++) {
		/* Taken by the child now: after its creation record. */
		struct held_lock h = from[i];
		h.time = 0;
		struct event e = send_held(t, &h, i);
		held_push(t, h.addr, h.op, (__u32)e.arg, h.stack, e.time, 1);
		t->held++;
	}
}

/* fork's entry and return, around the real call. At entry: who forks,
 * with its stack, for the creation record. At return (r the result): the
 * child's state starts afresh, unless a fork handler's call did that
 * already; a parent whose child does not record writes the creation. */
HOT void fork_enter(__u64 fn, __u64 *frame)
{
	fork_from.tid = 0;
	struct tstate *t = enter();
	if (t) {
		fork_from.pid = my_pid;
		fork_from.tid = t->shared.tid;
		fork_from.stack = take_stack(t, fn, frame);
		leave(t);
	}
	forking = 1;
}

HOT pid_t fork_exit(pid_t r)
{
	if (r == 0) {
		if (forking)
			after_fork_child();
		return 0;
	}
	forking = 0;
	if (r > 0 && fork_from.tid && !(cfg_flags & SHM_F_FOLLOW)) {
		int saved = errno;
		struct tstate *t = enter();
		if (t) {
			process_created_from(t, fork_from.pid, fork_from.tid, r, fork_from.stack);
			leave(t);
		}
		errno = saved;
	}
	return r;
}

EXPORT pid_t fork(void)
{
	ENSURE(fork);
	if (!real.fork) {
		errno = ENOSYS;
		return -1;
	}
	fork_enter((__u64)real.fork, FRAME);
	return fork_exit(real.fork());
}

EXPORT pid_t __fork(void)
{
	ENSURE(fork);
	if (!real.fork) {
		errno = ENOSYS;
		return -1;
	}
	fork_enter((__u64)real.fork, FRAME);
	return fork_exit(real.fork());
}

/* fork without the fork handlers (async-signal-safe). */
EXPORT pid_t _Fork(void)
{
	ENSURE(_Fork);
	if (!real._Fork) {
		errno = ENOSYS;
		return -1;
	}
	fork_enter((__u64)real._Fork, FRAME);
	return fork_exit(real._Fork());
}

/* vfork keeps its semantics (the child borrows the parent's memory and
 * runs first, the parent resumes at its exec or exit): treating it as
 * fork, as TSan does, would run the fork handlers, copy the address space
 * and let a parent's variable written by the child keep its old value.
 * The wrapper is an assembly trampoline because the child returns first
 * and then reuses the stack below its caller's frame: the wrapper's
 * return address cannot stay on the stack for the parent, so it is kept
 * in this thread's vfork levels. Between vfork and exec or exit the child
 * records nothing: it has no thread state of its own, and what it may
 * call there is async-signal-safe only. */
__attribute__((used, visibility("hidden"))) void *vfork_enter(__u64 ret)
{
	ENSURE(vfork);
	if (vf.depth >= VFORK_LEVELS)
		abort(); /* nowhere to keep the return address */
	struct vfork_level *l = &vf.levels[vf.depth++];
	l->ret = ret;
	l->guard = ts.guard;
	l->child = vf.child;
	l->map = NULL;
	return (void *)real.vfork;
}

struct vfork_back {
	__u64 ret;
	__s64 result;
};

/* After the real vfork, in the child and then in the parent; returns
 * where to return to and vfork's result (in rax:rdx). */
__attribute__((used, visibility("hidden"))) struct vfork_back vfork_leave(__s64 r)
{
	struct vfork_level *l = &vf.levels[vf.depth - 1];
	struct vfork_back b = {l->ret, r};
	if (r == 0) {
		ts.guard = 1;
		vf.child = 1;
		return b;
	}
	int saved = errno;
	vf.depth--;
	ts.guard = l->guard;
	vf.child = l->child;
	if (l->map)
		syscall(SYS_munmap, l->map, l->map_len);
	if (r > 0) {
		struct tstate *t = enter();
		if (t) {
			/* The stack as at the caller's vfork call: its return
			 * address, then its frame chain. */
			__u64 frame[2] = {FRAME[0], l->ret};
			process_created(t, (pid_t)r, (__u64)real.vfork, frame);
			leave(t);
		}
	}
	errno = saved;
	return b;
}

/* The stack is 16-byte aligned at each call: 8 off at entry, the return
 * address popped. */
__asm__(".text\n"
	".globl vfork\n"
	".globl __vfork\n"
	".type vfork,@function\n"
	".type __vfork,@function\n"
	"vfork:\n"
	"__vfork:\n"
	"\tpop %rdi\n"
	"\tcall vfork_enter\n"
	"\tcall *%rax\n"
	"\tmov %rax, %rdi\n"
	"\tcall vfork_leave\n"
	"\tpush %rax\n"
	"\tmov %rdx, %rax\n"
	"\tret\n"
	".size vfork, .-vfork\n"
	".size __vfork, .-__vfork\n");

/* ---- exec --------------------------------------------------------------- */

/* An exec's new image records when this one does and the environment
 * still preloads the library and names the shared memory. An environment
 * that dropped any of them (a clean envp, clearenv) gets them back; the rest
 * of it, argv and every result are the program's. The new environment is
 * built on the stack, or in a mapping when large, never with the target's
 * allocator (a vfork child shares its parent's heap), and is gone when
 * the exec fails. */
struct exec_env {
	char *const *envp;
	void *map;
	size_t map_len;
	int closing; /* the image's end was announced: undone if the exec fails */
	char buf[2048];
};

static int preload_has_shim(const char *list)
{
	size_t n = strlen(shim_path);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ": ");
		if (len == n && memcmp(p, shim_path, n) == 0)
			return 1;
		p += len;
		p += strspn(p, ": ");
	}
	return 0;
}

static void exec_env_done(struct exec_env *x);

/* child: the exec starts a new process (posix_spawn), which records only
 * when following. */
static char *const *exec_env(struct exec_env *x, char *const *envp, int child)
{
	x->envp = envp;
	x->map = NULL;
	x->closing = 0;
	if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2 || !active || !shim_path[0])
		return envp;
	if ((child || vf.child) && !(cfg_flags & SHM_F_FOLLOW))
		return envp;
	if (!child && !vf.child) {
		/* exec ends this image: what other threads write is finished
		 * first. */
		struct tstate *t = enter();
		if (t) {
			end_writes(t);
			x->closing = 1;
			leave(t);
		}
	}
	size_t n = 0, fd_at = (size_t)-1, name_at = (size_t)-1, pre_at = (size_t)-1;
	if (envp) {
		for (; envp[n]; n++) {
			if (strncmp(envp[n], "LD_PRELOAD=", 11) == 0)
				pre_at = n; /* the loader takes the last */
			else if (strncmp(envp[n], SHM_ENV "=", sizeof(SHM_ENV)) == 0)
				fd_at = n;
			else if (strncmp(envp[n], SHM_NAME_ENV "=", sizeof(SHM_NAME_ENV)) == 0)
				name_at = n;
		}
	}
	/* An entry this image was not given is neither required nor added. */
	int pre_ok = pre_at != (size_t)-1 && preload_has_shim(envp[pre_at] + 11);
	int fd_ok = !shm_env_entry[0] || (fd_at != (size_t)-1 && strcmp(envp[fd_at], shm_env_entry) == 0);
	int name_ok = !shm_name_entry[0] || (name_at != (size_t)-1 && strcmp(envp[name_at], shm_name_entry) == 0);
	if (pre_ok && fd_ok && name_ok)
		return envp;
	const char *old = pre_at != (size_t)-1 ? envp[pre_at] + 11 : "";
	size_t pre_len = 11 + strlen(shim_path) + 1 + strlen(old) + 1;
	size_t need = (n + 4) * sizeof(char *) + pre_len;
	char *mem = x->buf;
	if (need > sizeof(x->buf)) {
		size_t len = (need + 4095) & ~(size_t)4095;
		void *m = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) {
			exec_env_done(x);
			errno = E2BIG; /* as the kernel says of an environment too large */
			return NULL;
		}
		x->map = m;
		x->map_len = len;
		if (vf.child) {
			/* The exec that succeeds leaves it in the parent's memory. */
			vf.levels[vf.depth - 1].map = m;
			vf.levels[vf.depth - 1].map_len = len;
		}
		mem = m;
	}
	char **out = (char **)mem;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if ((i != fd_at || !shm_env_entry[0]) && (i != name_at || !shm_name_entry[0]) && (i != pre_at || pre_ok))
			out[k++] = envp[i];
	if (!pre_ok) {
		char *s = mem + (n + 4) * sizeof(char *);
		out[k++] = s;
		memcpy(s, "LD_PRELOAD=", 11);
		s += 11;
		size_t sl = strlen(shim_path);
		memcpy(s, shim_path, sl);
		s += sl;
		if (*old)
			*s++ = ':';
		strcpy(s, old);
	}
	if (shm_env_entry[0])
		out[k++] = shm_env_entry;
	if (shm_name_entry[0])
		out[k++] = shm_name_entry;
	out[k] = NULL;
	x->envp = out;
	return out;
}

/* After an exec that failed (or a spawn): errno stays the exec's. */
static void exec_env_done(struct exec_env *x)
{
	int saved = errno;
	if (x->map) {
		syscall(SYS_munmap, x->map, x->map_len);
		if (vf.child)
			vf.levels[vf.depth - 1].map = NULL;
	}
	if (x->closing)
		__atomic_store_n(&closing_tid, 0, __ATOMIC_RELEASE);
	errno = saved;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	ENSURE(execve);
	if (!real.execve) {
		errno = ENOSYS;
		return -1;
	}
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 0);
	if (envp && !env)
		return -1;
	int r = real.execve(path, argv, env);
	exec_env_done(&x);
	return r;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	ENSURE(execvpe);
	if (!real.execvpe) {
		errno = ENOSYS;
		return -1;
	}
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 0);
	if (envp && !env)
		return -1;
	int r = real.execvpe(file, argv, env);
	exec_env_done(&x);
	return r;
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	ENSURE(fexecve);
	if (!real.fexecve) {
		errno = ENOSYS;
		return -1;
	}
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 0);
	if (envp && !env)
		return -1;
	int r = real.fexecve(fd, argv, env);
	exec_env_done(&x);
	return r;
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	ENSURE(execveat);
	if (!real.execveat) {
		errno = ENOSYS;
		return -1;
	}
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 0);
	if (envp && !env)
		return -1;
	int r = real.execveat(dirfd, path, argv, env, flags);
	exec_env_done(&x);
	return r;
}

/* The calls that take the environment from environ are execve's and
 * execvpe's with it, as in glibc. */
EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

/* The argument lists of execl and friends are collected on the stack, as
 * glibc does: count_args counts the arguments after the first up to the
 * NULL that ends them (which argv keeps), and fill_args copies them after
 * the first. A list too long for the stack is E2BIG. */
#define MAX_LIST_ARGS (1 << 20)

static size_t count_args(va_list *ap)
{
	size_t n = 0;
	while (va_arg(*ap, char *) != NULL)
		n++;
	return n;
}

static void fill_args(char **argv, const char *arg, size_t n, va_list *ap)
{
	argv[0] = (char *)arg;
	for (size_t i = 1; i <= n + 1; i++)
		argv[i] = va_arg(*ap, char *);
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	size_t n = count_args(&ap);
	va_end(ap);
	if (n >= MAX_LIST_ARGS - 1) {
		errno = E2BIG;
		return -1;
	}
	char *argv[n + 2];
	va_start(ap, arg);
	fill_args(argv, arg, n, &ap);
	va_end(ap);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	size_t n = count_args(&ap);
	va_end(ap);
	if (n >= MAX_LIST_ARGS - 1) {
		errno = E2BIG;
		return -1;
	}
	char *argv[n + 2];
	va_start(ap, arg);
	fill_args(argv, arg, n, &ap);
	va_end(ap);
	return execvpe(file, argv, environ);
}

/* execle's environment follows the list's NULL. */
EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	size_t n = count_args(&ap);
	va_end(ap);
	if (n >= MAX_LIST_ARGS - 1) {
		errno = E2BIG;
		return -1;
	}
	char *argv[n + 2];
	va_start(ap, arg);
	fill_args(argv, arg, n, &ap);
	char *const *envp = va_arg(ap, char *const *);
	va_end(ap);
	return execve(path, argv, envp);
}

/* A spawn's child is a process created, as the kernel's
 * sched_process_fork reports it to the eBPF recorder: recorded by the
 * parent once the call returns (glibc's child has exec'd by then, and its
 * image records from its first instruction when following). */
static int spawned(int r, pid_t child, __u64 fn, __u64 *frame)
{
	if (r != 0)
		return r;
	int saved = errno;
	struct tstate *t = enter();
	if (t) {
		process_created(t, child, fn, frame);
		leave(t);
	}
	errno = saved;
	return r;
}

/* posix_spawn starts a new process: its image records only when following
 * (the child of a spawn, as of a fork). The child's pid is learned when
 * the caller does not ask for it. */
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENSURE(spawn);
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 1);
	if (envp && !env)
		return errno;
	pid_t child = 0;
	int r = real.spawn(pid ? pid : &child, path, fa, attr, argv, env);
	exec_env_done(&x);
	return spawned(r, pid ? *pid : child, (__u64)real.spawn, FRAME);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	ENSURE(spawnp);
	struct exec_env x;
	char *const *env = exec_env(&x, envp, 1);
	if (envp && !env)
		return errno;
	pid_t child = 0;
	int r = real.spawnp(pid ? pid : &child, file, fa, attr, argv, env);
	exec_env_done(&x);
	return spawned(r, pid ? *pid : child, (__u64)real.spawnp, FRAME);
}
