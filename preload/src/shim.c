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
#define SHIM_UNITY
#include "shim.h"

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
