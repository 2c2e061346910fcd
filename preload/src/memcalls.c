/* Part of the shim (shim.c includes it; shim.h declares what the parts share): libc's memory wrappers through rewritten GOT slots, and dlopen. */
#include "shim.h"

/* ---- libc's memory wrappers: rewritten GOT slots ----------------------- */

/* madvise, munmap, mmap, mremap, brk and sbrk are not exported by the
 * shim: runtimes that patch libc's memory entry points (Open MPI's
 * patcher, UCX) look them up by name or take their address, and must find
 * libc's, or glibc's own calls (free -> madvise) would miss their hooks.
 * Instead the shim rewrites the objects' R_X86_64_JUMP_SLOT slots (data,
 * not code) for these functions, where a slot still holds libc's function
 * or is not bound yet: a slot a runtime redirected is left alone, and
 * R_X86_64_GLOB_DAT slots are never touched, so &madvise and dlsym still
 * give libc's function. What these wrappers do not see is glibc calling
 * itself (free -> shrink_heap -> madvise): the kernel's tracepoint does,
 * when hooktrace may use it. */

/* A memory call, recorded at entry with the fields the BPF side's
 * sys_enter gives it, never deduplicated (as there). */
static void rec_mem(struct tstate *t, __u32 op, __u64 addr, __u64 size, __u64 arg, __u64 fn, __u64 *frame)
{
	struct event e;
	mem_event(t, &e, op, addr, size, arg);
	send_with_stack(t, &e, fn, frame);
}

/* munmap and mremap: the one place where the memory they give up ends the
 * lifetimes of the locks in it (the BPF side bumps lock_epoch there). */
static void rec_unmap(struct tstate *t, __u32 op, __u64 addr, __u64 size, __u64 arg, __u64 fn, __u64 *frame)
{
	lifetime_changed();
	rec_mem(t, op, addr, size, arg, fn, frame);
}

static int wrap_madvise(void *a, size_t n, int advice)
{
	struct tstate *t = enter_op(OP_MADVISE);
	if (t) {
		int saved = errno; /* the caller's until the real call sets it */
		rec_mem(t, OP_MADVISE, (__u64)a, n, (__u64)advice, (__u64)real.madvise, FRAME);
		errno = saved;
		leave(t);
	}
	return real.madvise(a, n, advice);
}

static int wrap_munmap(void *a, size_t n)
{
	if (cfg_flags & SHM_F_SYSCALLS) { /* the kernel records it */
		lifetime_changed();
		return real.munmap(a, n);
	}
	struct tstate *t = enter_op(OP_MUNMAP);
	if (t) {
		int saved = errno; /* the caller's until the real call sets it */
		rec_unmap(t, OP_MUNMAP, (__u64)a, n, 0, (__u64)real.munmap, FRAME);
		errno = saved;
		leave(t);
	}
	return real.munmap(a, n);
}

static void *wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
	struct tstate *t = enter_op(OP_MMAP);
	if (t) {
		int saved = errno; /* the caller's until the real call sets it */
		rec_mem(t, OP_MMAP, (__u64)a, n, (__u64)(__u32)prot | ((__u64)(__u32)flags << 32), (__u64)real.mmap, FRAME);
		errno = saved;
		leave(t);
	}
	return real.mmap(a, n, prot, flags, fd, off);
}

static void *wrap_mremap(void *a, size_t old, size_t n, int flags, ...)
{
	/* The new address is passed only with MREMAP_FIXED; reading it
	 * otherwise reads a register, harmlessly. */
	va_list ap;
	va_start(ap, flags);
	void *at = va_arg(ap, void *);
	va_end(ap);
	if (cfg_flags & SHM_F_SYSCALLS) { /* the kernel records it */
		lifetime_changed();
		return real.mremap(a, old, n, flags, at);
	}
	struct tstate *t = enter_op(OP_MREMAP);
	if (t) {
		int saved = errno; /* the caller's until the real call sets it */
		rec_unmap(t, OP_MREMAP, (__u64)a, old, n, (__u64)real.mremap, FRAME);
		errno = saved;
		leave(t);
	}
	return real.mremap(a, old, n, flags, at);
}

static int wrap_brk(void *a)
{
	struct tstate *t = enter_op(OP_BRK);
	if (t) {
		int saved = errno; /* the caller's until the real call sets it */
		rec_mem(t, OP_BRK, (__u64)a, 0, 0, (__u64)real.brk, FRAME);
		errno = saved;
		leave(t);
	}
	return real.brk(a);
}

/* sbrk is a brk call to the current break plus the increment, as the
 * kernel would see it (sbrk(0) makes none, but is the program's call). */
static void *wrap_sbrk(intptr_t incr)
{
	struct tstate *t = enter_op(OP_BRK);
	if (t) {
		int saved = errno;
		__u64 cur = (__u64)real.sbrk(0);
		rec_mem(t, OP_BRK, cur + (__u64)incr, 0, 0, (__u64)real.sbrk, FRAME);
		errno = saved;
		leave(t);
	}
	return real.sbrk(incr);
}

/* ends_locks: under the kernel's tracepoint, which records every memory
 * syscall itself, only these are wrapped: the memory they give up ends the
 * lifetimes of the locks in it, in the shim's chain cache too. */
const struct memcall memcalls[] = {
	{"madvise", (void *)wrap_madvise, (void **)&real.madvise, 0},
	{"munmap", (void *)wrap_munmap, (void **)&real.munmap, 1},
	{"mmap", (void *)wrap_mmap, (void **)&real.mmap, 0},
	{"mmap64", (void *)wrap_mmap, (void **)&real.mmap, 0},
	{"mremap", (void *)wrap_mremap, (void **)&real.mremap, 1},
	{"brk", (void *)wrap_brk, (void **)&real.brk, 0},
	{"sbrk", (void *)wrap_sbrk, (void **)&real.sbrk, 0},
};
const size_t nmemcalls = sizeof(memcalls) / sizeof(memcalls[0]);

/* The mapping of /proc/self/maps that holds addr (read without
 * allocating): its bounds and whether it is writable now. Returns 0 when
 * unknown. */
int find_mapping(__u64 addr, __u64 *lo_out, __u64 *hi_out, int *writable)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char buf[4096];
	size_t have = 0;
	int found = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		char *line = buf, *nl;
		while ((nl = strchr(line, '\n')) != NULL) {
			char *p = line;
			__u64 lo = 0, hi = 0;
			for (; *p && *p != '-'; p++)
				lo = lo * 16 + (__u64)(*p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10);
			for (p++; *p && *p != ' '; p++)
				hi = hi * 16 + (__u64)(*p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10);
			if (addr >= lo && addr < hi && p + 2 < nl) {
				*lo_out = lo;
				*hi_out = hi;
				*writable = p[2] == 'w';
				found = 1;
				break;
			}
			line = nl + 1;
		}
		if (found)
			break;
		have = (size_t)(buf + have - line);
		memmove(buf, line, have);
		if (have == sizeof(buf) - 1)
			have = 0; /* a line longer than the buffer: no mapping line is */
	}
	close(fd);
	return found;
}

/* Whether the page at addr is writable now. Full RELRO makes a GOT
 * read-only once, after its object is relocated: a page seen writable is
 * one the loader may still be writing, and must not be made read-only
 * under it. -1 when unknown. */
static int page_writable(__u64 addr)
{
	__u64 lo, hi;
	int w;
	return find_mapping(addr, &lo, &hi, &w) ? w : -1;
}

/* Whether a lies in a segment of info's object of type (PT_LOAD: the
 * object's own memory; PT_GNU_RELRO: what the loader makes read-only once
 * the object is relocated). */
int in_segment(struct dl_phdr_info *info, __u64 a, __u32 type)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == type && a >= info->dlpi_addr + ph->p_vaddr &&
		    a < info->dlpi_addr + ph->p_vaddr + ph->p_memsz)
			return 1;
	}
	return 0;
}

/* Stores v in the GOT slot at slot, through a read-only page if need be
 * (relro: the slot lies in the object's RELRO segment), restoring its
 * protection. A slot outside RELRO (lazy binding's .got.plt) is writable
 * as the object was loaded: the maps are read only for one inside. */
int store_slot(__u64 slot, __u64 v, int relro)
{
	long page = sysconf(_SC_PAGESIZE);
	void *pg = (void *)(slot & ~(__u64)(page - 1));
	int w = relro ? page_writable(slot) : 1;
	if (w < 0)
		return 0;
	if (w) {
		__atomic_store_n((__u64 *)slot, v, __ATOMIC_RELEASE);
		return 1;
	}
	if (mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE) != 0)
		return 0;
	__atomic_store_n((__u64 *)slot, v, __ATOMIC_RELEASE);
	mprotect(pg, (size_t)page, PROT_READ);
	return 1;
}

static int write_slot(struct dl_phdr_info *info, __u64 slot, __u64 v)
{
	return store_slot(slot, v, in_segment(info, slot, PT_GNU_RELRO));
}

/* An address of the object's own (a lazily bound slot points at its PLT). */
static int in_object(struct dl_phdr_info *info, __u64 a)
{
	return in_segment(info, a, PT_LOAD);
}

/* Calls slot(info, address of the slot, symbol name, data) for each
 * R_X86_64_JUMP_SLOT of info's object that names a symbol the object does
 * not define (an executable's canonical PLT entry, whose address the
 * program took, is left alone). */
void each_jump_slot(struct dl_phdr_info *info, void (*slot)(struct dl_phdr_info *, __u64, const char *, void *),
			   void *data)
{
	__u64 base = info->dlpi_addr;
	const ElfW(Dyn) *dyn = NULL;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
	if (!dyn)
		return;
	__u64 jmprel = 0, pltrelsz = 0, symtab = 0, strtab = 0, pltrel = 0;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_JMPREL:
			jmprel = dyn->d_un.d_ptr;
			break;
		case DT_PLTRELSZ:
			pltrelsz = dyn->d_un.d_val;
			break;
		case DT_SYMTAB:
			symtab = dyn->d_un.d_ptr;
			break;
		case DT_STRTAB:
			strtab = dyn->d_un.d_ptr;
			break;
		case DT_PLTREL:
			pltrel = dyn->d_un.d_val;
			break;
		}
	}
	if (!jmprel || !symtab || !strtab || pltrel != DT_RELA)
		return;
	/* The loader relocated these in place; an executable at 0 needs no
	 * relocation. */
	if (jmprel < base)
		jmprel += base, symtab += base, strtab += base;
	const ElfW(Rela) *r = (const ElfW(Rela) *)jmprel;
	const ElfW(Sym) *syms = (const ElfW(Sym) *)symtab;
	for (size_t i = 0; i < pltrelsz / sizeof(*r); i++) {
		if (ELF64_R_TYPE(r[i].r_info) != R_X86_64_JUMP_SLOT)
			continue;
		const ElfW(Sym) *sym = &syms[ELF64_R_SYM(r[i].r_info)];
		if (sym->st_shndx != SHN_UNDEF || sym->st_value != 0)
			continue;
		slot(info, base + r[i].r_offset, (const char *)strtab + sym->st_name, data);
	}
}

/* Whether the GOT slot at slot, of info's object, holds what the program
 * bound name to (real) or is not bound yet (lazy binding: it points at
 * the object's own PLT): anything else is a runtime's redirection, left
 * alone. */
int slot_unredirected(struct dl_phdr_info *info, __u64 slot, void *real_fn)
{
	__u64 cur = __atomic_load_n((__u64 *)slot, __ATOMIC_ACQUIRE);
	return cur == (__u64)real_fn || (cur && in_object(info, cur));
}

static void patch_memcall(struct dl_phdr_info *info, __u64 slot, const char *name, void *data)
{
	for (size_t k = 0; k < nmemcalls; k++) {
		if (strcmp(name, memcalls[k].name) != 0)
			continue;
		if ((cfg_flags & SHM_F_SYSCALLS) && !memcalls[k].ends_locks)
			return;
		if (__atomic_load_n((__u64 *)slot, __ATOMIC_ACQUIRE) == (__u64)memcalls[k].wrapper)
			return;
		if (slot_unredirected(info, slot, *memcalls[k].real))
			write_slot(info, slot, (__u64)memcalls[k].wrapper);
		return;
	}
}

/* Whether info's object is libc (whose own calls are direct anyway), the
 * loader, the vDSO or the shim itself. */
int is_libc(struct dl_phdr_info *info)
{
	return in_object(info, (__u64)real.madvise) || in_object(info, (__u64)gnu_get_libc_version);
}

int not_patched(struct dl_phdr_info *info)
{
	__u64 base = info->dlpi_addr;
	return base == getauxval(AT_BASE) || base == getauxval(AT_SYSINFO_EHDR) || in_object(info, (__u64)each_jump_slot);
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
	if (is_libc(info) || not_patched(info))
		return 0;
	each_jump_slot(info, patch_memcall, NULL);
	return 0;
}

static int patch_lock;

/* The objects loaded so far: their memory calls and the probes in them.
 * Under the kernel's tracepoint the memory calls are its to record. */
void instrument_objects(void)
{
	while (__atomic_exchange_n(&patch_lock, 1, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	if (real.madvise)
		dl_iterate_phdr(INJECTED ? inject_patch_object : patch_object, NULL);
	arm_probes();
	__atomic_store_n(&patch_lock, 0, __ATOMIC_RELEASE);
}

/* dlopen and dlmopen: what they loaded is instrumented as what was there
 * at start. (Exporting these is safe: no runtime patches them.)
 *
 * glibc's dlopen takes its caller from its return address: the caller's
 * RUNPATH and $ORIGIN find the library, its namespace receives it. So the
 * real dlopen must see the program's return address, not the shim's, yet
 * return to the shim. It is entered with a return address inside the
 * caller's object that holds a ret instruction, and that ret returns to
 * the shim (a return-address swap like the --probe exit stub's; neither
 * works under a hardware shadow stack, which glibc 2.36 does not enable). */
__attribute__((used, visibility("hidden"))) void *dl_real_fn[2];

struct gadget_search {
	__u64 pc;
	__u64 found;
};

static int find_gadget(struct dl_phdr_info *info, size_t size, void *data)
{
	struct gadget_search *gs = data;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		__u64 lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_filesz;
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || gs->pc < lo || gs->pc >= hi)
			continue;
		for (__u64 a = lo; a < hi; a++)
			if (*(const __u8 *)a == 0xc3) {
				gs->found = a;
				break;
			}
		return 1;
	}
	return 0;
}

/* Where the real dlopen should return to for a call from caller (0 when
 * the caller is in no object: JIT code, which glibc treats as the
 * executable's anyway); resolves the real functions first. */
__attribute__((used, visibility("hidden"))) __u64 dl_gadget(__u64 caller)
{
	int saved = errno;
	if (!real.dlopen || !real.dlmopen)
		resolve_real();
	dl_real_fn[0] = (void *)real.dlopen;
	dl_real_fn[1] = (void *)real.dlmopen;
	struct gadget_search gs = {caller, 0};
	if (!in_shim(caller))
		dl_iterate_phdr(find_gadget, &gs);
	errno = saved;
	return gs.found;
}

/* Records the library a loader handle (struct link_map *) names: loaded,
 * or about to be unloaded. hooktrace names stacks behind the process, and
 * a library unloaded by then may have another one in its place. */
static void send_object(void *h, __u32 gone)
{
	const struct link_map *lm = h;
	if (!lm || !lm->l_name || !lm->l_name[0])
		return;
	struct object r;
	memset(&r, 0, sizeof(r));
	r.type = REC_OBJECT;
	r.pid = my_pid;
	r.time = now();
	r.base = lm->l_addr;
	r.gone = gone;
	size_t n = strnlen(lm->l_name, sizeof(r.path) - 1);
	memcpy(r.path, lm->l_name, n);
	r.len = (__u32)n;
	ring_output(&r, sizeof(r), REC_OBJECT);
}

__attribute__((used, visibility("hidden"))) void dl_loaded(void *h)
{
	if (!h)
		return;
	int saved = errno;
	struct tstate *t = enter();
	if (t) {
		send_object(h, 0);
		instrument_objects();
		leave(t);
	}
	errno = saved;
}

/* The pages of the object loaded at base, as the loader unmaps them. */
struct object_extent {
	__u64 base, lo, hi;
};

static int find_extent(struct dl_phdr_info *info, size_t size, void *data)
{
	struct object_extent *x = data;
	if (info->dlpi_addr != x->base)
		return 0;
	__u64 page = (__u64)getpagesize();
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		__u64 lo = (x->base + ph->p_vaddr) & ~(page - 1), hi = (x->base + ph->p_vaddr + ph->p_memsz + page - 1) & ~(page - 1);
		if (!x->hi || lo < x->lo)
			x->lo = lo;
		if (hi > x->hi)
			x->hi = hi;
	}
	return 1;
}

/* dlclose: the library is recorded as going before anything is unmapped.
 * If it is unloaded, the loader unmaps it with one munmap, inside libc
 * where no wrapper sees it: it is recorded here instead (or, under the
 * kernel's tracepoint, only ends the chain cache's patterns, as
 * wrap_munmap does), so that the locks in its data end there too. */
EXPORT int dlclose(void *h)
{
	if (!real.dlclose)
		resolve_real();
	int saved = errno;
	struct object_extent x = {0, 0, 0};
	struct tstate *t = enter();
	if (t) {
		send_object(h, 1);
		const struct link_map *lm = h; /* declared nonnull, not always so */
		if (lm) {
			x.base = lm->l_addr;
			dl_iterate_phdr(find_extent, &x);
		}
		leave(t);
	}
	errno = saved;
	int r = real.dlclose(h);
	struct object_extent after = {x.base, 0, 0};
	if (x.hi > x.lo && !dl_iterate_phdr(find_extent, &after)) {
		saved = errno;
		if (cfg_flags & SHM_F_SYSCALLS) {
			lifetime_changed();
		} else if ((t = enter_op(OP_MUNMAP))) {
			rec_unmap(t, OP_MUNMAP, x.lo, x.hi - x.lo, 0, (__u64)real.dlclose, FRAME);
			leave(t);
		}
		errno = saved;
	}
	return r;
}

/* The stubs: keep the arguments (dlmopen has three), find the gadget, and
 * enter the real function with the gadget, then the continuation, as the
 * return addresses; the stack is as at a call (rsp+8 16-byte aligned).
 * At the continuation, or after a plain call when there is no gadget,
 * dl_loaded gets the handle, which is then returned. */
#define DL_STUB(name, index)                                       \
	".text\n"                                                  \
	".globl " name "\n"                                        \
	".type " name ",@function\n" name ":\n"                    \
	"\t.cfi_startproc\n"                                       \
	"\tpush %rbp\n"                                            \
	"\t.cfi_def_cfa_offset 16\n"                               \
	"\t.cfi_offset %rbp, -16\n"                                \
	"\tmov %rsp, %rbp\n"                                       \
	"\t.cfi_def_cfa_register %rbp\n"                           \
	"\tsub $32, %rsp\n"                                        \
	"\tmov %rdi, -8(%rbp)\n"                                   \
	"\tmov %rsi, -16(%rbp)\n"                                  \
	"\tmov %rdx, -24(%rbp)\n"                                  \
	"\tmov 8(%rbp), %rdi\n"                                    \
	"\tcall dl_gadget\n"                                       \
	"\tmov -8(%rbp), %rdi\n"                                   \
	"\tmov -16(%rbp), %rsi\n"                                  \
	"\tmov -24(%rbp), %rdx\n"                                  \
	"\tmov dl_real_fn+" index "(%rip), %r11\n"                 \
	"\ttest %rax, %rax\n"                                      \
	"\tjz 1f\n"                                                \
	"\tlea 2f(%rip), %rcx\n"                                   \
	"\tmov %rcx, -16(%rbp)\n"                                  \
	"\tmov %rax, -24(%rbp)\n"                                  \
	"\tlea -24(%rbp), %rsp\n"                                  \
	"\tjmp *%r11\n"                                            \
	"1:\tcall *%r11\n"                                         \
	"2:\tmov %rax, -8(%rbp)\n"                                 \
	"\tand $-16, %rsp\n"                                       \
	"\tmov %rax, %rdi\n"                                       \
	"\tcall dl_loaded\n"                                       \
	"\tmov -8(%rbp), %rax\n"                                   \
	"\tleave\n"                                                \
	"\t.cfi_def_cfa %rsp, 8\n"                                 \
	"\tret\n"                                                  \
	"\t.cfi_endproc\n"                                         \
	".size " name ", .-" name "\n"

__asm__(DL_STUB("dlopen", "0") DL_STUB("dlmopen", "8"));
