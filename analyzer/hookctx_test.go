package analyzer

import (
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// The hook-context rule: a lock held around an allocator call orders
// before every lock a memory hook was seen taking inside an allocator call
// of the process, when the call can run the hook.

var (
	// A munmap hook inside a thread's first malloc: no arena lock held.
	newArenaHook = []string{"pthread_mutex_lock" + libc, "vma_iterate" + rcache, "_intercept_munmap" + rcache,
		"alloc_new_heap" + libc, "new_heap" + libc, "_int_new_arena" + libc, "arena_get2" + libc, "malloc" + libc, "worker_start"}
	// An mremap hook inside realloc of an mmapped chunk.
	mremapHook = []string{"pthread_mutex_lock" + libc, "vma_iterate" + rcache, "_intercept_mremap" + rcache,
		"mremap_chunk" + libc, "realloc" + libc, "grow_buffer"}
)

// hookInMalloc: thread tid's malloc runs the munmap hook, which takes addr.
func hookInMalloc(b *tracebuild.Trace, tid uint32, addr uint64, kind events.MutexKind) {
	b.Alloc(tid, events.OpMalloc, 0, 64, "malloc"+libc, "worker_start")
	b.Event(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired | events.FlagInAlloc,
		Addr: addr, Addr2: uint64(events.OpMalloc), Arg: uint64(kind)}, newArenaHook...)
	b.Unlock(tid, addr)
}

// mallocUnder: thread tid calls op holding addr.
func mallocUnder(b *tracebuild.Trace, tid uint32, addr uint64, kind events.MutexKind, op events.Op) {
	b.LockKind(tid, addr, kind, "pthread_mutex_lock"+libc, "register_node")
	b.Alloc(tid, op, 0x7f3000000010, 48, op.String()+libc, "insert_node", "register_node")
	b.Unlock(tid, addr)
}

func hookCtxCases() []ruleCase {
	return []ruleCase{
		{
			name: "same lock, non-recursive: self-deadlock hazard",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexNormal)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Title, "hazard") || len(f.Locks) != 1 || f.Locks[0] != "vma_lock (librcache.so)" {
					t.Fatalf("finding %q locks %v", f.Title, f.Locks)
				}
				e0, e1 := f.Edges[0], f.Edges[1]
				if e0.Thread != 1 || !contains(stackFunctions(e0.Stack), "insert_node") || !contains(stackFunctions(e0.HeldStack), "register_node") {
					t.Errorf("edge 0 (the lock held around malloc): thread %d %v / %v", e0.Thread, stackFunctions(e0.Stack), stackFunctions(e0.HeldStack))
				}
				if e1.Thread != 2 || !contains(stackFunctions(e1.Stack), "_intercept_munmap") {
					t.Errorf("edge 1 (the hook): thread %d %v", e1.Thread, stackFunctions(e1.Stack))
				}
				// The glibc path connecting them.
				if !strings.Contains(f.Detail, "_int_new_arena → new_heap → alloc_new_heap → munmap") {
					t.Errorf("detail lacks the glibc path: %s", f.Detail)
				}
			},
		},
		{
			name: "same lock, hook seen after the call under the lock",
			build: func(b *tracebuild.Trace) {
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
				hookInMalloc(b, 2, vma, events.MutexNormal)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			// UCX's pattern: the lock is a recursive wrapper over a pthread
			// spinlock or mutex. The hook's munmap was seen running inside
			// a free made with the lock held, and the hook did not call
			// the lock again: it re-enters through the wrapper.
			name: "same lock, the hook seen passing under it without re-taking it: warning",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexNormal)
				b.LockKind(1, vma, events.MutexNormal, "pthread_mutex_lock"+libc, "wrapper_lock", "unregister_all")
				b.Alloc(1, events.OpFree, 0x7f6000000010, 1<<22, "free"+libc, "unregister_all")
				b.InAlloc(1, events.OpMunmap, 0x7f6000000000, events.OpFree, "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc, "unregister_all")
				b.Unlock(1, vma)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
			},
			// One per allocator entry held around: free, malloc.
			want: []want{{KindHookLock, SeverityWarning}, {KindHookLock, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "recursive wrapper") {
					t.Errorf("detail %s", res.Findings[0].Detail)
				}
			},
		},
		{
			// The same, but the syscall that passed is not the hook's.
			name: "same lock, another syscall passing under it proves nothing",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexNormal)
				b.LockKind(1, vma, events.MutexNormal, "pthread_mutex_lock"+libc, "register_node")
				b.Alloc(1, events.OpMalloc, 0, 1<<16, "malloc"+libc, "register_node")
				b.InAlloc(1, events.OpBrk, 0, events.OpMalloc, "brk"+libc, "sysmalloc"+libc, "malloc"+libc, "register_node")
				b.Unlock(1, vma)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			name: "same lock, recursive: warning",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexRecursive)
				mallocUnder(b, 1, vma, events.MutexRecursive, events.OpMalloc)
			},
			want: []want{{KindHookLock, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "recursive mutex") {
					t.Errorf("detail %s", res.Findings[0].Detail)
				}
			},
		},
		{
			name: "same lock, free under it: free can munmap too",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexNormal)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpFree)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			name: "mremap hook: only realloc makes mremap",
			build: func(b *tracebuild.Trace) {
				b.Alloc(2, events.OpRealloc, 0x7f4000000010, 1<<22, "realloc"+libc, "grow_buffer")
				b.InAlloc(2, events.OpMutexLock, vma, events.OpRealloc, mremapHook...)
				b.Unlock(2, vma)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpFree)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
		{
			name: "mremap hook, realloc under the lock",
			build: func(b *tracebuild.Trace) {
				b.Alloc(2, events.OpRealloc, 0x7f4000000010, 1<<22, "realloc"+libc, "grow_buffer")
				b.InAlloc(2, events.OpMutexLock, vma, events.OpRealloc, mremapHook...)
				b.Unlock(2, vma)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpRealloc)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "realloc → mremap_chunk → mremap") {
					t.Errorf("detail %s", res.Findings[0].Detail)
				}
			},
		},
		{
			name: "other lock: cycle through the hook",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, lockM, events.MutexNormal)
				mallocUnder(b, 1, lockA, events.MutexNormal, events.OpMalloc)
				lk(b, 3, lockM, "flush_queue")
				lk(b, 3, lockA, "flush_queue")
				b.Unlock(3, lockA).Unlock(3, lockM)
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Title, "through a memory hook") || !contains(f.Locks, "lock_a (libx.so)") || !contains(f.Locks, "queue_mutex (libx.so)") {
					t.Fatalf("finding %q locks %v", f.Title, f.Locks)
				}
				var hook *Edge
				for i := range f.Edges {
					if f.Edges[i].From == "lock_a (libx.so)" {
						hook = &f.Edges[i]
					}
				}
				if hook == nil || !strings.Contains(hook.Context, "can run the memory hook in munmap") ||
					!contains(stackFunctions(hook.Stack), "_intercept_munmap") || !contains(stackFunctions(hook.HeldStack), "insert_node") {
					t.Errorf("hook edge %+v", hook)
				}
				if !anyContains(actions(f), "malloc() runs the munmap hook: lock(queue_mutex (libx.so))") {
					t.Errorf("scenario %v", f.Scenario)
				}
			},
		},
		{
			name: "other lock, same order elsewhere: quiet",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, lockM, events.MutexNormal)
				mallocUnder(b, 1, lockA, events.MutexNormal, events.OpMalloc)
				lk(b, 3, lockA, "flush_queue")
				lk(b, 3, lockM, "flush_queue")
				b.Unlock(3, lockM).Unlock(3, lockA)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
		{
			name: "rwlock read held, recursive read in the hook: nothing blocks",
			build: func(b *tracebuild.Trace) {
				b.Alloc(2, events.OpMalloc, 0, 64, "malloc"+libc, "worker_start")
				b.Event(events.Event{TID: 2, Op: events.OpRwlockRdlock, Flags: events.FlagAcquired | events.FlagInAlloc,
					Addr: lockA, Addr2: uint64(events.OpMalloc)}, newArenaHook...)
				b.RWUnlock(2, lockA)
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "lookup")
				b.Alloc(1, events.OpMalloc, 0, 48, "malloc"+libc, "lookup")
				b.RWUnlock(1, lockA)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
		{
			name:   "jemalloc: only what it was seen to do",
			header: &events.Header{Allocator: "jemalloc"},
			build: func(b *tracebuild.Trace) {
				// The hook ran inside free; malloc was never seen making a
				// memory syscall.
				openMPIThreadB(b, 2, munmapChunkHookStack...)
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
		{
			name:   "jemalloc: malloc seen making munmap",
			header: &events.Header{Allocator: "jemalloc"},
			build: func(b *tracebuild.Trace) {
				openMPIThreadB(b, 2, munmapChunkHookStack...)
				b.Alloc(3, events.OpMalloc, 0, 1<<20, "malloc@libjemalloc.so.2", "big_alloc")
				b.InAlloc(3, events.OpMunmap, 0x7f5000000000, events.OpMalloc, "munmap"+libc, "je_pages_unmap@libjemalloc.so.2", "malloc@libjemalloc.so.2")
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "malloc was seen making munmap in this process") {
					t.Errorf("detail %s", res.Findings[0].Detail)
				}
			},
		},
		{
			name: "another process's hook does not count",
			build: func(b *tracebuild.Trace) {
				hookInMalloc(b, 2, vma, events.MutexNormal)
				b.PID = 101
				mallocUnder(b, 1, vma, events.MutexNormal, events.OpMalloc)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
	}
}

func TestHookContextRules(t *testing.T) {
	runRuleCases(t, hookCtxCases())
}
