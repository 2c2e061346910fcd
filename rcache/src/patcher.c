/*
 * Memory hooks installed the way HPC runtimes install them: the first
 * bytes of libc's munmap and madvise are overwritten with
 *
 *     movabs $intercept, %r11     49 bb <imm64>
 *     jmp    *%r11                41 ff e3
 *
 * so that every call lands in the intercept, including glibc's internal
 * calls from inside free() (an LD_PRELOAD wrapper would see only calls made
 * through the PLT, never those). The intercept runs the release hook, then
 * makes the system call itself: the original entry is gone.
 *
 * Patching is not atomic: install and remove the hooks while no other
 * thread can call munmap or madvise (before threads start, after they end).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rcache.h"
#include "rcache_internal.h"

#define RC_EXPORT __attribute__((visibility("default"), noinline))
#define PATCH_LEN 13

struct rc_patch {
	const char *symbol;
	void *hook;
	unsigned char *target;
	unsigned char saved[PATCH_LEN];
	int installed;
};

/* The system call, without libc: its wrappers are what is patched. */
static long raw_syscall3(long nr, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
}

static int syscall_result(long r)
{
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return (int)r;
}

RC_EXPORT int rc_intercept_munmap(void *addr, size_t len)
{
	rc_mem_release_hook(addr, len);
	return syscall_result(raw_syscall3(SYS_munmap, (long)addr, (long)len, 0));
}

RC_EXPORT int rc_intercept_madvise(void *addr, size_t len, int advice)
{
	/* The advice values that give the pages back (Open MPI's patcher
	 * hooks the same ones). */
	if (advice == MADV_DONTNEED || advice == MADV_REMOVE
#ifdef MADV_FREE
	    || advice == MADV_FREE
#endif
	)
		rc_mem_release_hook(addr, len);
	return syscall_result(raw_syscall3(SYS_madvise, (long)addr, (long)len, advice));
}

static struct rc_patch patches[] = {
	{"munmap", (void *)rc_intercept_munmap, NULL, {0}, 0},
	{"madvise", (void *)rc_intercept_madvise, NULL, {0}, 0},
};

#define NPATCHES (sizeof(patches) / sizeof(patches[0]))

/* write_code writes n bytes of code at at: make the pages writable (and
 * still executable: other code on them may run meanwhile), write, restore. */
static int write_code(unsigned char *at, const unsigned char *bytes, size_t n)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)at & ~(uintptr_t)(pg - 1);
	uintptr_t end = ((uintptr_t)at + n + pg - 1) & ~(uintptr_t)(pg - 1);
	if (mprotect((void *)start, end - start, PROT_READ | PROT_WRITE | PROT_EXEC) != 0)
		return -1;
	memcpy(at, bytes, n);
	__builtin___clear_cache((char *)at, (char *)at + n);
	if (mprotect((void *)start, end - start, PROT_READ | PROT_EXEC) != 0)
		return -1;
	return 0;
}

int rc_install_hooks(void)
{
	for (size_t i = 0; i < NPATCHES; i++) {
		struct rc_patch *p = &patches[i];
		p->target = dlsym(RTLD_DEFAULT, p->symbol);
		if (!p->target) {
			rc_remove_hooks();
			errno = ENOENT;
			return -1;
		}
		unsigned char code[PATCH_LEN] = {0x49, 0xbb};
		uint64_t hook = (uint64_t)(uintptr_t)p->hook;
		memcpy(code + 2, &hook, sizeof(hook));
		code[10] = 0x41;
		code[11] = 0xff;
		code[12] = 0xe3;
		memcpy(p->saved, p->target, PATCH_LEN);
		if (write_code(p->target, code, PATCH_LEN) != 0) {
			int e = errno;
			rc_remove_hooks();
			errno = e;
			return -1;
		}
		p->installed = 1;
	}
	return 0;
}

void rc_remove_hooks(void)
{
	for (size_t i = 0; i < NPATCHES; i++) {
		struct rc_patch *p = &patches[i];
		if (!p->installed)
			continue;
		write_code(p->target, p->saved, PATCH_LEN);
		p->installed = 0;
	}
}
