/* The few kernel types the probes use, instead of a full vmlinux.h: x86-64
 * user registers as the kernel saves them, and the task fields read through
 * CO-RE (relocated against the running kernel's BTF at load time). */
#ifndef VMLINUX_MIN_H
#define VMLINUX_MIN_H
/* Tells bpf_tracing.h to use the kernel's pt_regs field names. */
#define __VMLINUX_H__

#include <linux/types.h>
#include <linux/bpf.h>

struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
};

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live; /* threads still running; 0 once the last is exiting */
} __attribute__((preserve_access_index));

/* x86-64: the user thread pointer (%fs base), where the preloaded
 * recorder's thread-local state is found. */
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct file;

struct vm_area_struct {
	struct file *vm_file; /* NULL for anonymous memory (heap, stacks) */
} __attribute__((preserve_access_index));

/* The page directory, at its direct-map address (stackword.h). */
typedef struct {
	unsigned long pgd;
} pgd_t;

struct mm_struct {
	pgd_t *pgd;
} __attribute__((preserve_access_index));

/* Any kernel struct that starts with a 64-bit integer: the type through
 * which stackword.h loads a word of kernel memory. */
struct timespec64 {
	long long tv_sec;
} __attribute__((preserve_access_index));

struct task_struct {
	int exit_code;
	int pid;
	int tgid;
	struct signal_struct *signal;
	struct thread_struct thread;
	struct mm_struct *mm; /* a child that shares it shares its parent's memory */
} __attribute__((preserve_access_index));

#endif
