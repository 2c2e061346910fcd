// SPDX-License-Identifier: GPL-2.0
/* hooktrace's user-space recorder: a library preloaded into the target
 * (LD_PRELOAD) that interposes the allocator, the pthread lock calls and
 * thread start and exit, and writes the records of ../bpf/hooktrace.h into
 * a ring in shared memory that hooktrace reads. The records are exactly the
 * BPF side's, with the same aggregate-mode semantics (a per-thread held set
 * and a chain cache), so everything downstream is shared.
 *
 * Rules of the hot path: no syscall, no allocation inside an interposed
 * allocator function, errno and return values untouched, and a thread-local
 * guard so the shim's own calls (and a signal handler that lands inside the
 * shim) are forwarded unrecorded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <elf.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/auxv.h>
#include <ucontext.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h> /* __u32 and friends, as hooktrace.h uses them */
#include "hooktrace.h"
#include "glibc.h"
#include "shm.h"

#define EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
/* The hot path of every interposer: what a call that is only counted runs. */
#define HOT static inline __attribute__((always_inline))
/* The injected build (HOOKTRACE_INJECT, inject.c) is loaded into a running
 * process by dlopen, where initial-exec TLS must fit in the static TLS
 * block's surplus (about 1.5 KiB with glibc's defaults): its per-thread
 * caches are smaller. The preloaded build's pattern cache is the BPF
 * side's (hooktrace.h). */
#ifdef HOOKTRACE_INJECT
#define SHIM_PATTERN_CACHE (PATTERN_CACHE / 4)
#define SHADOW_SLOTS 8
#define VFORK_LEVELS 2
#define INJECTED 1
#else
#define INJECTED 0
#define SHIM_PATTERN_CACHE PATTERN_CACHE
#define SHADOW_SLOTS 32
#define VFORK_LEVELS 8
#endif

/* The shim is one translation unit, so that its hot path inlines across
 * what each part owns; the parts are included here, in this order. */
#include "real.c"
#include "state.c"
#include "ring.c"
#include "record.c"
#include "alloc.c"
#include "locks.c"
#include "procs.c"
#include "memcalls.c"
#include "probes.c"
#include "inject.c"
