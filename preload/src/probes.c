/* Part of the shim (shim.c includes it; shim.h declares what the parts share): --probe: breakpoints handled in the process. */
#include "shim.h"

/* ---- --probe: breakpoints handled in the process ---------------------- */

/* A function the user named, reached by calls inside its own object as
 * well as through the PLT: its first byte is an int3, the SIGTRAP handler
 * records the entry and resumes at a copy of the first instruction, which
 * jumps back after it. Nothing is restored in between, so other threads
 * never run past an unarmed entry. */
static struct probe {
	__u64 addr; /* where it traps: 0 while its object is unloaded */
	__u64 home; /* where it was armed, and its displaced copy fits */
	__u8 *displaced;
	__u32 index;
} probes[SHM_PROBES];
static int nprobes;
static struct sigaction old_trap;

/* Return addresses of probed functions, swapped for the exit stub while
 * they run: one table for the process, not one a thread, since a
 * user-level thread (Argobots, Qthreads, Boost.Context) may enter a probed
 * function on one thread and return on another. A spinlock owned by a
 * thread guards it. A signal handler that interrupts the holder and
 * reaches a probe on the same thread cannot wait for it: that entry's
 * exit goes unrecorded, counted lost. Entries are in the order they were
 * made. Two live frames share a return address's slot only when a probed
 * function tail-calls another (its jmp leaves the stub in the slot): the
 * newer entry's return address is then the stub, and the exit goes
 * through it twice, once for each. */
#define EXITS_MAX 1024
static struct exit_entry {
	__u64 slot; /* where on the stack */
	__u64 ret;  /* what was there */
	__u32 index;
} exits[EXITS_MAX];
static __u32 nexits;
static __u64 exits_owner; /* the holder's &ts, 0 when free */

/* exit_find is the newest entry of slot, or -1; the table is held. */
static int exit_find(__u64 slot)
{
	for (__u32 i = nexits; i-- > 0;)
		if (exits[i].slot == slot)
			return (int)i;
	return -1;
}

static void exit_remove(int i)
{
	for (__u32 j = (__u32)i; j + 1 < nexits; j++)
		exits[j] = exits[j + 1];
	nexits--;
}

static void exits_prune(void);

static void probe_hit(struct tstate *t, struct probe *pr, ucontext_t *uc)
{
	__u64 sp = (__u64)uc->uc_mcontext.gregs[REG_RSP];
	__u64 bp = (__u64)uc->uc_mcontext.gregs[REG_RBP];
	count_call(t, OP_PROBE_ENTER);
	flush_held(t);
	struct event e;
	event_init(&e, t, OP_PROBE_ENTER);
	e.arg = pr->index;
	/* The first integer argument, for rules on it ("NAME if arg0 == V"):
	 * the breakpoint is at the entry, where rdi still holds it. */
	e.addr = (__u64)uc->uc_mcontext.gregs[REG_RDI];
	/* Where its return address is: its exit names the same slot, on
	 * whichever thread it returns. */
	e.size = sp;
	if (t->held > 0)
		e.flags |= F_LOCKS_HELD;
	alloc_context(t, &e);
	/* The whole stack, unwound by hooktrace with .eh_frame: the rule
	 * OUTER>INNER looks for OUTER among INNER's callers. */
	if (cfg_flags & SHM_F_SAMPLES)
		e.stack = take_sample_regs(t, pr->addr, sp, bp, 0);
	if (!e.stack) {
		struct stack r;
		__u32 n = 0;
		r.ips[n++] = pr->addr;
		if (t->stack_hi)
			r.ips[n++] = real_ret(sp, *(__u64 *)sp);
		__u64 lo = sp, fp = bp, hi = readable_top(t, sp, WALK_SPAN);
		while (n < MAX_FRAMES && fp > lo && fp + 16 <= hi && !(fp & 7)) {
			__u64 *f = (__u64 *)fp;
			__u64 ra = real_ret(fp + 8, f[1]);
			if (!ra)
				break;
			r.ips[n++] = ra;
			lo = fp;
			fp = f[0];
		}
		e.stack = send_stack(&r, n, n == MAX_FRAMES);
	}
	event_send(&e);
	/* The exit: the return address goes through the exit stub, as a
	 * uretprobe's does through the kernel's trampoline. */
	if (!t->stack_hi)
		return;
	if (!owner_lock(&exits_owner)) {
		count_lost(REC_EVENT); /* its exit goes unrecorded */
		return;
	}
	/* A call wrote a return address over the stub: the entries of this
	 * slot are of frames a longjmp left. */
	if (*(__u64 *)sp != (__u64)probe_exit_stub)
		for (int old; (old = exit_find(sp)) >= 0;)
			exit_remove(old);
	if (nexits == EXITS_MAX)
		exits_prune();
	if (nexits < EXITS_MAX) {
		exits[nexits++] = (struct exit_entry){sp, *(__u64 *)sp, pr->index};
		*(__u64 *)sp = (__u64)probe_exit_stub;
	} else {
		count_lost(REC_EVENT);
	}
	owner_unlock(&exits_owner);
}

/* The return address in a stack slot, as the program put it there: a
 * probed function's is swapped for the exit stub while it runs. */
__u64 real_ret(__u64 slot, __u64 v)
{
	if (v != (__u64)probe_exit_stub || !owner_lock(&exits_owner))
		return v;
	/* The oldest entry of the slot: a tail call's newer one holds the
	 * stub. */
	for (__u32 i = 0; i < nexits; i++)
		if (exits[i].slot == slot) {
			v = exits[i].ret;
			break;
		}
	owner_unlock(&exits_owner);
	return v;
}

/* Puts the program's return addresses back into copy, a copy of the
 * stack from sp, len bytes long, where probed functions run. */
void restore_returns(__u8 *copy, __u64 sp, __u64 len)
{
	if (__atomic_load_n(&nexits, __ATOMIC_RELAXED) == 0 || !owner_lock(&exits_owner))
		return;
	for (__u32 i = 0; i < nexits; i++) {
		__u64 slot = exits[i].slot;
		if (slot >= sp && slot + 8 <= sp + len && exits[i].ret != (__u64)probe_exit_stub)
			memcpy(copy + (slot - sp), &exits[i].ret, 8);
	}
	owner_unlock(&exits_owner);
}

/* In a fork child, the table's holder, if any, is a thread the child does
 * not have. Its entries stay: the forking thread's frames return in the
 * child too; the others' stacks never run again and are pruned when the
 * table fills. */
void exits_after_fork(void)
{
	exits_owner = 0;
}

/* Whether the word at slot still holds the exit stub, read without
 * faulting: the slot of an entry a longjmp left, or of a user-level
 * thread's stack that was freed, may be unmapped. */
static int holds_exit_stub(__u64 slot)
{
	__u64 v = 0;
	struct iovec local = {&v, sizeof(v)}, remote = {(void *)slot, sizeof(v)};
	if (syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) != sizeof(v))
		return 0;
	return v == (__u64)probe_exit_stub;
}

/* Drops the entries whose slot no longer holds the exit stub: frames a
 * longjmp left, whose stack was reused since, or of a thread that exited.
 * An entry of another stack (a user-level thread switched out) still
 * holds it and stays, whatever its address. The table is held. */
static void exits_prune(void)
{
	for (__u32 i = nexits; i-- > 0;)
		if (!holds_exit_stub(exits[i].slot))
			exit_remove((int)i);
}

/* Called by the exit stub with the function's return value and the slot
 * its return address was in; returns where to go back to. The thread may
 * not be the one that entered the function (a user-level thread moved),
 * and may have switched stacks or left newer frames by longjmp since. */
__attribute__((used, visibility("hidden"))) __u64 probe_exit_c(__u64 rax, __u64 slot)
{
	struct tstate *t = &ts;
	/* This thread cannot hold the table here: it is taken only for a
	 * few instructions, which call no probed function. */
	int locked = owner_lock(&exits_owner);
	int i = exit_find(slot);
	if (i < 0) {
		/* Only a program that wrote the stub's address into its own
		 * frame gets here: nothing says where to return. */
		static const char msg[] = "hooktrace: a probed function returned through a slot it never used; aborting\n";
		if (write(2, msg, sizeof(msg) - 1) < 0) {
		}
		abort();
	}
	struct exit_entry sh = exits[i];
	exit_remove(i);
	if (locked)
		owner_unlock(&exits_owner);
	int saved = errno;
	if (!t->guard && active) {
		t->guard = 1;
		count_call(t, OP_PROBE_EXIT);
		struct event e;
		event_init(&e, t, OP_PROBE_EXIT);
		e.flags = F_RETURN;
		e.arg = sh.index;
		e.ret = (__s64)rax;
		e.size = slot;
		event_send(&e);
		t->guard = 0;
	}
	errno = saved;
	return sh.ret;
}

/* The exit stub: keeps every register and the flags (a caller compiled
 * with interprocedural register allocation may keep values in
 * caller-saved registers across a call it knows), asks probe_exit_c where
 * to go back to, and goes there with ret through a slot reserved first.
 * The stack is 16-byte aligned at the call. */
__asm__(".text\n"
	".type probe_exit_stub,@function\n"
	"probe_exit_stub:\n"
	"\tsub $8, %rsp\n"
	"\tpushfq\n"
	"\tpush %rax\n"
	"\tpush %rcx\n"
	"\tpush %rdx\n"
	"\tpush %rsi\n"
	"\tpush %rdi\n"
	"\tpush %r8\n"
	"\tpush %r9\n"
	"\tpush %r10\n"
	"\tpush %r11\n"
	"\tsub $264, %rsp\n"
	"\tmovdqu %xmm0, 0(%rsp)\n"
	"\tmovdqu %xmm1, 16(%rsp)\n"
	"\tmovdqu %xmm2, 32(%rsp)\n"
	"\tmovdqu %xmm3, 48(%rsp)\n"
	"\tmovdqu %xmm4, 64(%rsp)\n"
	"\tmovdqu %xmm5, 80(%rsp)\n"
	"\tmovdqu %xmm6, 96(%rsp)\n"
	"\tmovdqu %xmm7, 112(%rsp)\n"
	"\tmovdqu %xmm8, 128(%rsp)\n"
	"\tmovdqu %xmm9, 144(%rsp)\n"
	"\tmovdqu %xmm10, 160(%rsp)\n"
	"\tmovdqu %xmm11, 176(%rsp)\n"
	"\tmovdqu %xmm12, 192(%rsp)\n"
	"\tmovdqu %xmm13, 208(%rsp)\n"
	"\tmovdqu %xmm14, 224(%rsp)\n"
	"\tmovdqu %xmm15, 240(%rsp)\n"
	"\tmov 328(%rsp), %rdi\n"
	"\tlea 344(%rsp), %rsi\n"
	"\tcall probe_exit_c\n"
	"\tmov %rax, 344(%rsp)\n"
	"\tmovdqu 0(%rsp), %xmm0\n"
	"\tmovdqu 16(%rsp), %xmm1\n"
	"\tmovdqu 32(%rsp), %xmm2\n"
	"\tmovdqu 48(%rsp), %xmm3\n"
	"\tmovdqu 64(%rsp), %xmm4\n"
	"\tmovdqu 80(%rsp), %xmm5\n"
	"\tmovdqu 96(%rsp), %xmm6\n"
	"\tmovdqu 112(%rsp), %xmm7\n"
	"\tmovdqu 128(%rsp), %xmm8\n"
	"\tmovdqu 144(%rsp), %xmm9\n"
	"\tmovdqu 160(%rsp), %xmm10\n"
	"\tmovdqu 176(%rsp), %xmm11\n"
	"\tmovdqu 192(%rsp), %xmm12\n"
	"\tmovdqu 208(%rsp), %xmm13\n"
	"\tmovdqu 224(%rsp), %xmm14\n"
	"\tmovdqu 240(%rsp), %xmm15\n"
	"\tadd $264, %rsp\n"
	"\tpop %r11\n"
	"\tpop %r10\n"
	"\tpop %r9\n"
	"\tpop %r8\n"
	"\tpop %rdi\n"
	"\tpop %rsi\n"
	"\tpop %rdx\n"
	"\tpop %rcx\n"
	"\tpop %rax\n"
	"\tpopfq\n"
	"\tret\n"
	".size probe_exit_stub, .-probe_exit_stub\n");

static void on_trap(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	__u64 at = (__u64)uc->uc_mcontext.gregs[REG_RIP] - 1;
	int armed = __atomic_load_n(&nprobes, __ATOMIC_ACQUIRE);
	for (int i = 0; i < armed; i++) {
		if (__atomic_load_n(&probes[i].addr, __ATOMIC_ACQUIRE) != at)
			continue;
		int saved = errno;
		struct tstate *t = enter();
		if (t) {
			probe_hit(t, &probes[i], uc);
			leave(t);
		}
		errno = saved;
		uc->uc_mcontext.gregs[REG_RIP] = (greg_t)probes[i].displaced;
		return;
	}
	/* Not ours: what the program would have had. */
	if (old_trap.sa_flags & SA_SIGINFO) {
		old_trap.sa_sigaction(sig, si, ucv);
	} else if (old_trap.sa_handler != SIG_DFL && old_trap.sa_handler != SIG_IGN) {
		old_trap.sa_handler(sig);
	} else {
		sigaction(SIGTRAP, &old_trap, NULL);
		raise(SIGTRAP);
	}
}

struct probe_search {
	const struct shm_probe *want;
	__u64 addr;
};

static const char *base_name(const char *p)
{
	const char *b = p;
	for (; *p; p++)
		if (*p == '/')
			b = p + 1;
	return b;
}

/* The loader names a library by the path it opened, mostly its soname's
 * link (libopen-pal.so.40); hooktrace names the file that holds the code
 * (libopen-pal.so.40.30.2): either is the object. */
static int object_named(const char *name, const char *want)
{
	char real[PATH_MAX];
	if (strcmp(base_name(name), want) == 0)
		return 1;
	return realpath(name, real) && strcmp(base_name(real), want) == 0;
}

static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct probe_search *ps = data;
	const char *name = info->dlpi_name ? info->dlpi_name : "";
	int is_exe = name[0] == 0 && !ps->addr;
	if ((ps->want->object[0] == 0 && is_exe) ||
	    (ps->want->object[0] && name[0] && object_named(name, ps->want->object))) {
		ps->addr = info->dlpi_addr + ps->want->vaddr;
		return 1;
	}
	return 0;
}

/* Arms the table's probes in the objects loaded so far: in the
 * constructor (before main, before any thread but this one runs), then
 * after each dlopen for a library loaded later, or loaded again after a
 * dlclose unmapped it (the new mapping has the file's bytes, not the
 * int3). A function whose live first bytes are not the file's (a runtime
 * patched it) is left alone. */
static int probe_entry[SHM_PROBES]; /* table entry i's slot in probes[] + 1, 0 if none yet */
static int trap_installed;

/* A displaced copy of the probed instruction at addr, followed by a jump
 * back after it, or NULL. It goes within 2 GiB of the function, so a
 * rip-relative operand can still reach its target. */
static __u8 *displace(const struct shm_probe *sp, __u64 addr, long page)
{
	__u8 *tramp = MAP_FAILED;
	for (__u64 k = 1; k <= 512 && tramp == MAP_FAILED; k++) {
		__u64 hint = (addr & ~(__u64)(page - 1)) - k * (1ULL << 20);
		tramp = mmap((void *)hint, (size_t)page, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	}
	if (tramp == MAP_FAILED)
		return NULL;
	memcpy(tramp, sp->insn, sp->len);
	if (sp->disp_at) {
		__s32 disp;
		memcpy(&disp, tramp + sp->disp_at, 4);
		__s64 moved = (__s64)disp + (__s64)addr - (__s64)(__u64)tramp;
		if (moved != (__s32)moved) {
			munmap(tramp, (size_t)page);
			return NULL;
		}
		disp = (__s32)moved;
		memcpy(tramp + sp->disp_at, &disp, 4);
	}
	/* Then jmp *0(%rip) back to the next instruction. */
	__u8 *j = tramp + sp->len;
	j[0] = 0xff, j[1] = 0x25, j[2] = j[3] = j[4] = j[5] = 0;
	__u64 back = addr + sp->len;
	memcpy(j + 6, &back, 8);
	mprotect(tramp, (size_t)page, PROT_READ | PROT_EXEC);
	return tramp;
}

void arm_probes(void)
{
	__u32 n = *H32(SHM_OFF_NPROBES);
	if (n == 0 || n > SHM_PROBES)
		return;
	long page = sysconf(_SC_PAGESIZE);
	__u64 arm[SHM_PROBES];
	int narm = 0;
	for (__u32 i = 0; i < n; i++) {
		const struct shm_probe *sp = (const struct shm_probe *)(shm + SHM_OFF_PROBES + i * SHM_PROBE_BYTES);
		struct probe_search ps = {sp, 0};
		dl_iterate_phdr(find_object, &ps);
		struct probe *old = probe_entry[i] ? &probes[probe_entry[i] - 1] : NULL;
		if (!ps.addr) {
			/* Not loaded (yet, or any more). An unloaded object's
			 * entry must not take the traps of another library
			 * loaded where it was: on_trap would name the wrong
			 * probe and resume in the wrong displaced copy. Its int3
			 * is written after this loop. */
			if (old)
				__atomic_store_n(&old->addr, 0, __ATOMIC_RELEASE);
			continue;
		}
		if (old && old->addr == ps.addr && *(volatile __u8 *)ps.addr == 0xcc)
			continue; /* armed, and still mapped */
		if (sp->len == 0 || sp->len > 15 || memcmp((void *)ps.addr, sp->insn, sp->len) != 0)
			continue;
		if (old && old->home == ps.addr) {
			/* Loaded again where it was: its displaced copy still
			 * fits, only the int3 is new. */
			__atomic_store_n(&old->addr, ps.addr, __ATOMIC_RELEASE);
			arm[narm++] = ps.addr;
			continue;
		}
		if (nprobes >= SHM_PROBES)
			continue;
		__u8 *tramp = displace(sp, ps.addr, page);
		if (!tramp)
			continue;
		probes[nprobes] = (struct probe){ps.addr, ps.addr, tramp, sp->index};
		/* Published whole: other threads may be trapping already. */
		__atomic_store_n(&nprobes, nprobes + 1, __ATOMIC_RELEASE);
		/* The old entry's code is gone: nothing traps there for it. */
		if (old)
			__atomic_store_n(&old->addr, 0, __ATOMIC_RELEASE);
		probe_entry[i] = nprobes;
		arm[narm++] = ps.addr;
	}
	if (narm == 0)
		return;
	if (!trap_installed) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_trap;
		sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
		sigfillset(&sa.sa_mask);
		sigaction(SIGTRAP, &sa, &old_trap);
		trap_installed = 1;
	}
	/* One byte, written whole: a thread already running the function
	 * (a library's constructor started it) sees the old byte or the
	 * int3, either of which runs right. */
	for (int i = 0; i < narm; i++) {
		__u64 pg = arm[i] & ~(__u64)(page - 1);
		if (mprotect((void *)pg, (size_t)page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0)
			continue;
		*(volatile __u8 *)arm[i] = 0xcc;
		mprotect((void *)pg, (size_t)page, PROT_READ | PROT_EXEC);
	}
}

/* A new process image is an exec, as the BPF side's sched_process_exec
 * reports it: the first record of each image. */
void exec_event(struct tstate *t)
{
	count_call(t, OP_EXEC);
	struct event e;
	event_init(&e, t, OP_EXEC);
	event_send(&e);
}

/* Recording starts here if no interposed call came first. The main
 * thread's exit is recorded at exit() or _exit(). */
__attribute__((constructor)) static void shim_init(void)
{
#ifdef HOOKTRACE_INJECT
	return; /* hooktrace_attach starts it */
#endif
	struct tstate *t = enter();
	if (t) {
		instrument_objects();
		leave(t);
	}
}

/* exit: the other threads' records under way are finished before the
 * process ends; later ones are counted, not written. */
__attribute__((destructor)) static void shim_fini(void)
{
	struct tstate *t = enter();
	if (!t)
		return;
	thread_exit_event(t, 0);
	end_writes(t);
	if (!vf.child)
		others_ended(t);
	leave(t);
}
