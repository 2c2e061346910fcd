package analyzer

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

const (
	lockA  = 0x601000
	lockB  = 0x601040
	lockC  = 0x601080
	lockM  = 0x6010c0
	condV  = 0x601100
	vma    = 0x601200
	heapP  = 0x7f0000001010
	heapQ  = 0x7f0000002010
	libc   = "@libc.so.6"
	rcache = "@librcache.so"
)

// named gives the static locks their symbols.
func named(b *tracebuild.Trace) *tracebuild.Trace {
	return b.Name(lockA, "lock_a (libx.so)").
		Name(lockB, "lock_b (libx.so)").
		Name(lockC, "lock_c (libx.so)").
		Name(lockM, "queue_mutex (libx.so)").
		Name(vma, "vma_lock (librcache.so)")
}

// openMPIThreadA holds vma_lock across malloc.
func openMPIThreadA(b *tracebuild.Trace, tid uint32) {
	b.Thread(tid, "mpi-send")
	b.Lock(tid, vma, "pthread_mutex_lock"+libc, "mca_rcache_base_vma_insert"+rcache, "mca_rcache_register"+rcache)
	b.Alloc(tid, events.OpMalloc, 0, 64, "malloc"+libc, "vma_tree_insert"+rcache, "mca_rcache_base_vma_insert"+rcache)
	b.Unlock(tid, vma)
}

// openMPIThreadB frees; glibc trims the heap and its madvise runs the
// hook, which takes vma_lock. stack is the hook's lock stack.
func openMPIThreadB(b *tracebuild.Trace, tid uint32, stack ...string) {
	b.Thread(tid, "progress")
	b.Alloc(tid, events.OpFree, 0x7f1000000010, 0x20000, "free"+libc, "release_buffers", "progress_loop")
	b.InAlloc(tid, events.OpMutexLock, vma, events.OpFree, stack...)
	b.Unlock(tid, vma)
}

var shrinkHeapHookStack = []string{
	"pthread_mutex_lock" + libc, "vma_tree_iterate" + rcache, "mca_rcache_base_vma_iterate" + rcache,
	"_intercept_madvise" + rcache, "shrink_heap" + libc, "heap_trim" + libc, "_int_free" + libc,
	"free" + libc, "release_buffers", "progress_loop",
}

var munmapChunkHookStack = []string{
	"pthread_mutex_lock" + libc, "vma_tree_iterate" + rcache, "_intercept_munmap" + rcache,
	"munmap_chunk" + libc, "free" + libc, "release_buffers", "progress_loop",
}

type want struct {
	kind     Kind
	severity Severity
}

type ruleCase struct {
	name   string
	opts   Options
	header *events.Header
	build  func(b *tracebuild.Trace)
	want   []want
	check  func(t *testing.T, res *Result)
}

func lk(b *tracebuild.Trace, tid uint32, addr uint64, fn string) {
	b.Lock(tid, addr, "pthread_mutex_lock"+libc, fn)
}

func ruleCases() []ruleCase {
	cycleErr := []want{{KindLockOrderCycle, SeverityError}}
	cycleWarn := []want{{KindLockOrderCycle, SeverityWarning}}
	// The Open MPI pattern's thread A holds vma_lock around malloc, which
	// can run the hook thread B was seen in: vma_lock on itself.
	hookSelf := want{KindSelfDeadlock, SeverityError}
	cycleErrSelf := append(cycleErr, hookSelf)
	return []ruleCase{
		{
			name: "inversion on two threads",
			build: func(b *tracebuild.Trace) {
				b.Thread(1, "alpha").Thread(2, "beta")
				lk(b, 1, lockA, "take_a_first")
				lk(b, 1, lockB, "take_b_under_a")
				b.Unlock(1, lockB).Unlock(1, lockA)
				lk(b, 2, lockB, "take_b_first")
				lk(b, 2, lockA, "take_a_under_b")
				b.Unlock(2, lockA).Unlock(2, lockB)
			},
			want: cycleErr,
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if got := strings.Join(f.Locks, ","); got != "lock_a (libx.so),lock_b (libx.so)" {
					t.Errorf("locks = %q", got)
				}
				if len(f.Edges) != 2 {
					t.Fatalf("edges = %d", len(f.Edges))
				}
				e0, e1 := f.Edges[0], f.Edges[1]
				if e0.From != "lock_a (libx.so)" || e0.To != "lock_b (libx.so)" || e0.Thread != 1 || e0.ThreadName != "alpha" {
					t.Errorf("edge 0 = %+v", e0)
				}
				if !contains(stackFunctions(e0.Stack), "take_b_under_a") || !contains(stackFunctions(e0.HeldStack), "take_a_first") {
					t.Errorf("edge 0 stacks: %v / %v", stackFunctions(e0.Stack), stackFunctions(e0.HeldStack))
				}
				if e1.Thread != 2 || !contains(stackFunctions(e1.Stack), "take_a_under_b") || !contains(stackFunctions(e1.HeldStack), "take_b_first") {
					t.Errorf("edge 1 = %+v", e1)
				}
				if fmt.Sprint(f.Threads) != "[1 2]" || len(f.Scenario) != 4 {
					t.Errorf("threads %v scenario %v", f.Threads, f.Scenario)
				}
			},
		},
		{
			name: "consistent order",
			build: func(b *tracebuild.Trace) {
				for tid := uint32(1); tid <= 2; tid++ {
					lk(b, tid, lockA, "f")
					lk(b, tid, lockB, "g")
					b.Unlock(tid, lockB).Unlock(tid, lockA)
				}
			},
		},
		{
			name: "malloc under a lock alone",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				b.Alloc(1, events.OpMalloc, 0, 32, "malloc"+libc, "f")
				b.Alloc(1, events.OpFree, 0x7f00, 32, "free"+libc, "f")
				b.Unlock(1, lockA)
			},
		},
		{
			name: "trylock against the order",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				lk(b, 2, lockB, "h")
				b.TryResult(2, events.OpMutexTrylock, lockA, true, "pthread_mutex_trylock"+libc, "h")
				b.Unlock(2, lockA).Unlock(2, lockB)
			},
		},
		{
			name: "blocking lock against the order",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				lk(b, 2, lockB, "h")
				lk(b, 2, lockA, "h")
				b.Unlock(2, lockA).Unlock(2, lockB)
			},
			want: cycleErr,
		},
		{
			name: "trylocked lock is the source of later edges",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				b.TryResult(2, events.OpMutexTrylock, lockB, true, "pthread_mutex_trylock"+libc, "h")
				lk(b, 2, lockA, "h")
				b.Unlock(2, lockA).Unlock(2, lockB)
			},
			want: cycleErr,
		},
		{
			name: "failed trylock holds nothing",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				b.TryResult(2, events.OpMutexTrylock, lockB, false, "pthread_mutex_trylock"+libc, "h")
				lk(b, 2, lockA, "h")
				b.Unlock(2, lockA)
			},
		},
		{
			name: "timed lock held on success",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				lk(b, 2, lockB, "h")
				b.TryResult(2, events.OpMutexTimedlock, lockA, true, "pthread_mutex_timedlock"+libc, "h")
				b.Unlock(2, lockA).Unlock(2, lockB)
			},
			want: cycleWarn,
		},
		{
			name: "timed lock not held on timeout",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				lk(b, 1, lockB, "g")
				b.Unlock(1, lockB).Unlock(1, lockA)
				b.TryResult(2, events.OpMutexTimedlock, lockB, false, "pthread_mutex_timedlock"+libc, "h")
				lk(b, 2, lockA, "h")
				b.Unlock(2, lockA)
			},
		},
		{
			name: "rwlock read-read cycle",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockRdlock, lockB, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWUnlock(1, lockB).RWUnlock(1, lockA)
				b.RWLock(2, events.OpRwlockRdlock, lockB, 0, "pthread_rwlock_rdlock"+libc, "g")
				b.RWLock(2, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "g")
				b.RWUnlock(2, lockA).RWUnlock(2, lockB)
			},
		},
		{
			name: "rwlock read-write cycle",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockWrlock, lockB, 0, "pthread_rwlock_wrlock"+libc, "f")
				b.RWUnlock(1, lockB).RWUnlock(1, lockA)
				b.RWLock(2, events.OpRwlockWrlock, lockB, 0, "pthread_rwlock_wrlock"+libc, "g")
				b.RWLock(2, events.OpRwlockWrlock, lockA, 0, "pthread_rwlock_wrlock"+libc, "g")
				b.RWUnlock(2, lockA).RWUnlock(2, lockB)
			},
			want: cycleErr,
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Detail, "Read/write rule") {
					t.Errorf("detail lacks the rwlock rule: %s", f.Detail)
				}
				if !anyContains(actions(f), "read_lock(lock_a") || !anyContains(actions(f), "write_lock(lock_b") {
					t.Errorf("scenario %v", f.Scenario)
				}
			},
		},
		{
			name: "rwlock recursive read beside a reader",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockWrlock, lockB, 0, "pthread_rwlock_wrlock"+libc, "f")
				b.RWUnlock(1, lockB).RWUnlock(1, lockA)
				b.RWLock(2, events.OpRwlockWrlock, lockB, 0, "pthread_rwlock_wrlock"+libc, "g")
				b.RWLock(2, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "g")
				b.RWUnlock(2, lockA).RWUnlock(2, lockB)
			},
		},
		{
			name: "rwlock writer-preferring reads queue behind writers",
			build: func(b *tracebuild.Trace) {
				const writerPref = rwlockPreferWriterNonrecursive
				b.RWLock(1, events.OpRwlockRdlock, lockA, writerPref, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockRdlock, lockB, writerPref, "pthread_rwlock_rdlock"+libc, "f")
				b.RWUnlock(1, lockB).RWUnlock(1, lockA)
				b.RWLock(2, events.OpRwlockWrlock, lockB, writerPref, "pthread_rwlock_wrlock"+libc, "g")
				b.RWLock(2, events.OpRwlockRdlock, lockA, writerPref, "pthread_rwlock_rdlock"+libc, "g")
				b.RWUnlock(2, lockA).RWUnlock(2, lockB)
			},
			want: cycleErr,
		},
		{
			name: "rwlock reader-preferring twin of the above",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockRdlock, lockB, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWUnlock(1, lockB).RWUnlock(1, lockA)
				b.RWLock(2, events.OpRwlockWrlock, lockB, 0, "pthread_rwlock_wrlock"+libc, "g")
				b.RWLock(2, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "g")
				b.RWUnlock(2, lockA).RWUnlock(2, lockB)
			},
		},
		{
			name: "cond_wait retakes its mutex under another lock",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockM, "consumer")
				lk(b, 1, lockA, "consumer")
				b.CondWait(1, condV, lockM)
				b.CondReturn(1, condV, lockM, "pthread_cond_wait"+libc, "consumer")
				b.Unlock(1, lockM).Unlock(1, lockA)
			},
			want: cycleErr,
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !anyContains(edgeContexts(f), "pthread_cond_wait returned and took queue_mutex (libx.so) back while holding lock_a") {
					t.Errorf("contexts %v", edgeContexts(f))
				}
			},
		},
		{
			name: "cond_wait releases its mutex",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockM, "consumer")
				b.CondWait(1, condV, lockM)
				b.CondReturn(1, condV, lockM, "pthread_cond_wait"+libc, "consumer")
				lk(b, 1, lockA, "consumer")
				b.Unlock(1, lockA).Unlock(1, lockM)
				// Another thread takes them in the same order.
				lk(b, 2, lockM, "producer")
				lk(b, 2, lockA, "producer")
				b.Unlock(2, lockA).Unlock(2, lockM)
			},
			check: func(t *testing.T, res *Result) {
				if res.Stats.UnbalancedUnlocks != 0 {
					t.Errorf("unbalanced unlocks %d", res.Stats.UnbalancedUnlocks)
				}
			},
		},
		{
			name: "a wait left by cancellation: its cleanup handler's unlock is consistent",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockM, "waiter")
				b.CondWait(1, condV, lockM)
				// No return: the thread was cancelled in the wait, got
				// the mutex back, and its cleanup handler unlocks it.
				b.Unlock(1, lockM)
				b.Event(events.Event{TID: 1, Op: events.OpThreadExit})
				// An unlock of a mutex not held is still one.
				lk(b, 2, lockA, "twice")
				b.Unlock(2, lockA).Unlock(2, lockA)
			},
			want: []want{{KindLockMisuse, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				if c := res.Stats.LockMisuse; c.UnheldUnlocks != 1 || res.Stats.UnbalancedUnlocks != 1 {
					t.Errorf("misuse %+v, unbalanced %d: want the second unlock of lock_a", c, res.Stats.UnbalancedUnlocks)
				}
			},
		},
		{
			name: "recursive mutex taken twice",
			build: func(b *tracebuild.Trace) {
				b.LockKind(1, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "outer")
				b.LockKind(1, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "inner")
				b.Unlock(1, lockM)
				lk(b, 1, lockB, "still_held") // lockM is still held: M → B
				b.Unlock(1, lockB).Unlock(1, lockM)
				lk(b, 1, lockC, "released") // not held any more: no M → C
				b.Unlock(1, lockC)
				lk(b, 2, lockC, "other")
				b.LockKind(2, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "other")
				b.Unlock(2, lockM).Unlock(2, lockC)
			},
		},
		{
			name: "recursive mutex depth keeps it held",
			build: func(b *tracebuild.Trace) {
				b.LockKind(1, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "outer")
				b.LockKind(1, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "inner")
				b.Unlock(1, lockM)
				lk(b, 1, lockB, "still_held")
				b.Unlock(1, lockB).Unlock(1, lockM)
				lk(b, 2, lockB, "other")
				b.LockKind(2, lockM, events.MutexRecursive, "pthread_mutex_lock"+libc, "other")
				b.Unlock(2, lockM).Unlock(2, lockB)
			},
			want: cycleErr,
		},
		{
			name: "normal mutex taken twice",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockM, "outer")
				lk(b, 1, lockM, "inner")
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			// B is trylocked so that only A → C could close a cycle.
			name: "unlock out of order releases the right lock",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				b.TryResult(1, events.OpMutexTrylock, lockB, true, "pthread_mutex_trylock"+libc, "f")
				b.Unlock(1, lockA)
				lk(b, 1, lockC, "f")
				b.Unlock(1, lockC).Unlock(1, lockB)
				lk(b, 2, lockC, "g")
				lk(b, 2, lockA, "g")
				b.Unlock(2, lockA).Unlock(2, lockC)
			},
		},
		{
			name: "lock held across the out-of-order unlock",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				b.TryResult(1, events.OpMutexTrylock, lockB, true, "pthread_mutex_trylock"+libc, "f")
				b.Unlock(1, lockB)
				lk(b, 1, lockC, "f")
				b.Unlock(1, lockC).Unlock(1, lockA)
				lk(b, 2, lockC, "g")
				lk(b, 2, lockA, "g")
				b.Unlock(2, lockA).Unlock(2, lockC)
			},
			want: cycleErr,
		},
		lifetimeCase("destroyed and reused address", func(b *tracebuild.Trace) {
			b.Op(1, events.OpMutexDestroy, heapP, 0, "pthread_mutex_destroy"+libc, "obj_free")
			b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "obj_new")
		}, nil),
		lifetimeCase("address kept alive", func(b *tracebuild.Trace) {}, cycleErr),
		lifetimeCase("freed and reused address", func(b *tracebuild.Trace) {
			b.Alloc(1, events.OpFree, heapP-0x10, 0x40, "free"+libc, "obj_free")
			b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "obj_new")
		}, nil),
		lifetimeCase("freed chunk of unknown size", func(b *tracebuild.Trace) {
			b.Alloc(1, events.OpFree, heapP-0x10, 0, "free"+libc, "obj_free")
		}, cycleErr),
		lifetimeCase("freed chunk elsewhere", func(b *tracebuild.Trace) {
			b.Alloc(1, events.OpFree, heapP+0x100, 0x40, "free"+libc, "obj_free")
		}, cycleErr),
		lifetimeCase("unmapped and reused address", func(b *tracebuild.Trace) {
			b.Op(1, events.OpMunmap, heapP&^0xfff, 0x1000, "munmap"+libc, "obj_free")
		}, nil),
		{
			name: "ring of three locks",
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f1")
				lk(b, 1, lockB, "f1")
				b.Unlock(1, lockB).Unlock(1, lockA)
				lk(b, 2, lockB, "f2")
				lk(b, 2, lockC, "f2")
				b.Unlock(2, lockC).Unlock(2, lockB)
				lk(b, 3, lockC, "f3")
				lk(b, 3, lockA, "f3")
				b.Unlock(3, lockA).Unlock(3, lockC)
			},
			want: cycleErr,
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if len(f.Locks) != 3 || len(f.Edges) != 3 || !strings.Contains(f.Title, "3 locks") {
					t.Errorf("finding %q locks %v", f.Title, f.Locks)
				}
				if fmt.Sprint(f.Threads) != "[1 2 3]" || len(f.Scenario) != 6 {
					t.Errorf("threads %v scenario %v", f.Threads, f.Scenario)
				}
			},
		},
		{
			name: "Open MPI: hook under shrink_heap",
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				openMPIThreadB(b, 2, shrinkHeapHookStack...)
			},
			// malloc makes no madvise (see glibcReach): no lock on itself.
			want:  cycleErr,
			check: checkOpenMPI("held"),
		},
		{
			name: "Open MPI: hook under munmap_chunk",
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				openMPIThreadB(b, 2, munmapChunkHookStack...)
			},
			// No arena lock on the hook's path, but malloc can munmap too.
			want: []want{hookSelf},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Detail, "_int_new_arena") || !strings.Contains(f.Title, "hazard") {
					t.Errorf("title %q detail %q", f.Title, f.Detail)
				}
			},
		},
		{
			name: "Open MPI: truncated hook stack",
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				openMPIThreadB(b, 2, "pthread_mutex_lock"+libc, "vma_tree_iterate"+rcache, "...")
			},
			want:  append(cycleWarn, hookSelf),
			check: checkOpenMPI("may hold"),
		},
		{
			name: "Open MPI: truncated hook stack, decided by the madvise",
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				openMPIThreadB(b, 2, "pthread_mutex_lock"+libc, "vma_tree_iterate"+rcache, "...")
				b.InAlloc(2, events.OpMadvise, 0x7f1000020000, events.OpFree,
					"madvise"+libc, "shrink_heap"+libc, "heap_trim"+libc, "_int_free"+libc, "free"+libc, "release_buffers")
			},
			// The hook's own call is not known: malloc may make it.
			want:  cycleErrSelf,
			check: checkOpenMPI("held"),
		},
		{
			name: "Open MPI: hook path never meets a malloc under the lock",
			build: func(b *tracebuild.Trace) {
				openMPIThreadB(b, 2, shrinkHeapHookStack...)
			},
			want: []want{{KindHookLock, SeverityInfo}},
		},
		{
			name:   "Open MPI pattern under jemalloc",
			header: &events.Header{Allocator: "jemalloc"},
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				openMPIThreadB(b, 2, shrinkHeapHookStack...)
			},
			want: []want{{KindHookLock, SeverityInfo}},
			check: func(t *testing.T, res *Result) {
				if anyContains(res.Findings[0].Locks, "arena") {
					t.Errorf("jemalloc has no arena pseudo-lock: %v", res.Findings[0].Locks)
				}
			},
		},
		{
			name: "self-deadlock: hook takes the held lock inside malloc",
			build: func(b *tracebuild.Trace) {
				b.Lock(1, vma, "pthread_mutex_lock"+libc, "vma_insert"+rcache)
				b.Alloc(1, events.OpMalloc, 0, 64, "malloc"+libc, "vma_insert"+rcache)
				b.InAlloc(1, events.OpMutexLock, vma, events.OpMalloc,
					"pthread_mutex_lock"+libc, "vma_iterate"+rcache, "_intercept_munmap"+rcache, "alloc_new_heap"+libc,
					"new_heap"+libc, "_int_new_arena"+libc, "arena_get2"+libc, "malloc"+libc, "vma_insert"+rcache)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if len(f.Edges) != 2 || !anyContains(f.Locks, "vma_lock") || !strings.Contains(f.Title, "malloc") {
					t.Fatalf("finding %+v", f)
				}
				if !contains(stackFunctions(f.Edges[1].Stack), "_intercept_munmap") || !contains(stackFunctions(f.Edges[0].Stack), "malloc") {
					t.Errorf("stacks %v / %v", stackFunctions(f.Edges[0].Stack), stackFunctions(f.Edges[1].Stack))
				}
			},
		},
		{
			name: "re-entrancy: hook takes a held recursive lock inside malloc",
			build: func(b *tracebuild.Trace) {
				b.LockKind(1, vma, events.MutexRecursive, "pthread_mutex_lock"+libc, "vma_insert"+rcache)
				b.Alloc(1, events.OpMalloc, 0, 64, "malloc"+libc, "vma_insert"+rcache)
				b.Event(events.Event{TID: 1, Op: events.OpMutexLock, Flags: events.FlagAcquired | events.FlagInAlloc,
					Addr: vma, Addr2: uint64(events.OpMalloc), Arg: uint64(events.MutexRecursive)},
					"pthread_mutex_lock"+libc, "vma_iterate"+rcache, "_intercept_munmap"+rcache, "malloc"+libc)
				b.Unlock(1, vma).Unlock(1, vma)
			},
			want: []want{{KindHookLock, SeverityWarning}},
		},
		{
			name: "allocator re-entry from a hook",
			build: func(b *tracebuild.Trace) {
				b.Alloc(1, events.OpFree, 0x7f1000000010, 0x20000, "free"+libc, "release_buffers")
				b.InAlloc(1, events.OpMalloc, 0, events.OpFree, "malloc"+libc, "hook_record_region"+rcache,
					"_intercept_madvise"+rcache, "shrink_heap"+libc, "free"+libc, "release_buffers")
			},
			want: []want{{KindAllocatorReentry, SeverityError}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Title, "malloc called by a hook (in madvise) inside free") {
					t.Errorf("title %q", f.Title)
				}
			},
		},
		{
			// glibc's posix_memalign relays to malloc for small alignments:
			// the allocator calling itself, no hook, nothing to report.
			name: "allocator calling its own entry point",
			build: func(b *tracebuild.Trace) {
				b.Alloc(1, events.OpPosixMemalign, 0, 64, "posix_memalign"+libc, "fi_setup"+"@libfabric.so.1")
				b.InAlloc(1, events.OpMalloc, 0, events.OpPosixMemalign, "malloc"+libc, "__posix_memalign"+libc,
					"posix_memalign"+libc, "fi_setup"+"@libfabric.so.1")
			},
		},
		{
			name: "allocator calls one after another",
			build: func(b *tracebuild.Trace) {
				b.Alloc(1, events.OpMalloc, 0, 64, "malloc"+libc, "f")
				b.Alloc(1, events.OpFree, 0x7f00, 64, "free"+libc, "f")
				b.Alloc(1, events.OpMalloc, 0, 64, "malloc"+libc, "f")
			},
		},
		{
			name:   "forbidden nesting",
			header: &events.Header{UserProbes: []string{"progress", "user_callback"}},
			opts:   Options{Forbid: []Rule{{Outer: "progress", Inner: "user_callback"}}},
			build: func(b *tracebuild.Trace) {
				b.Probe(1, events.OpProbeEnter, 0, "progress", "wait_all")
				b.Probe(1, events.OpProbeEnter, 1, "user_callback", "dispatch", "progress", "wait_all")
				b.Probe(1, events.OpProbeExit, 1)
				b.Probe(1, events.OpProbeExit, 0)
			},
			want: []want{{KindForbiddenNesting, SeverityError}},
			check: func(t *testing.T, res *Result) {
				e := res.Findings[0].Edges[0]
				if !contains(stackFunctions(e.Stack), "dispatch") || !contains(stackFunctions(e.HeldStack), "wait_all") {
					t.Errorf("edge %+v", e)
				}
			},
		},
		{
			name:   "allowed nesting",
			header: &events.Header{UserProbes: []string{"progress", "user_callback"}},
			opts:   Options{Forbid: []Rule{{Outer: "progress", Inner: "user_callback"}}},
			build: func(b *tracebuild.Trace) {
				b.Probe(1, events.OpProbeEnter, 0, "progress", "wait_all")
				b.Probe(1, events.OpProbeExit, 0)
				b.Probe(1, events.OpProbeEnter, 1, "user_callback", "dispatch", "main")
				b.Probe(1, events.OpProbeExit, 1)
				b.Probe(2, events.OpProbeEnter, 0, "progress", "wait_all")
				b.Probe(3, events.OpProbeEnter, 1, "user_callback", "dispatch", "main")
			},
		},
		{
			name:   "forbidden nesting seen on the stack only",
			header: &events.Header{UserProbes: []string{"progress", "user_callback"}},
			opts:   Options{Forbid: []Rule{{Outer: "progress", Inner: "user_callback"}}},
			build: func(b *tracebuild.Trace) {
				b.Probe(1, events.OpProbeEnter, 1, "user_callback", "dispatch", "progress", "wait_all")
			},
			want: []want{{KindForbiddenNesting, SeverityError}},
		},
		{
			name:   "probed hook function inside free decides the arena",
			header: &events.Header{UserProbes: []string{"vma_hook"}},
			build: func(b *tracebuild.Trace) {
				openMPIThreadA(b, 1)
				b.Alloc(2, events.OpFree, 0x7f1000000010, 0x20000, "free"+libc, "release_buffers")
				b.Event(events.Event{TID: 2, Op: events.OpProbeEnter, Flags: events.FlagInAlloc, Addr2: uint64(events.OpFree)},
					"vma_hook"+rcache, "_intercept_madvise"+rcache, "shrink_heap"+libc, "_int_free"+libc, "free"+libc, "release_buffers")
				b.Lock(2, vma, "pthread_mutex_lock"+libc, "vma_hook"+rcache, "...")
				b.Unlock(2, vma)
				b.Probe(2, events.OpProbeExit, 0)
			},
			want: cycleErrSelf,
			check: func(t *testing.T, res *Result) {
				e := res.Findings[0].Edges[1]
				if e.Arena != "held" || !strings.Contains(e.Context, "seen on the entry of vma_hook") {
					t.Errorf("edge %s: %s", e.Arena, e.Context)
				}
			},
		},
		{
			name: "spinlock taken twice",
			build: func(b *tracebuild.Trace) {
				b.Event(events.Event{TID: 1, Op: events.OpSpinLock, Flags: events.FlagAcquired, Addr: lockA}, "pthread_spin_lock"+libc, "f")
				b.Event(events.Event{TID: 1, Op: events.OpSpinLock, Flags: events.FlagAcquired, Addr: lockA}, "pthread_spin_lock"+libc, "g")
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			name: "rwlock write lock after own read lock",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockWrlock, lockA, 0, "pthread_rwlock_wrlock"+libc, "g")
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			name: "rwlock read lock twice",
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "f")
				b.RWLock(1, events.OpRwlockRdlock, lockA, 0, "pthread_rwlock_rdlock"+libc, "g")
				b.RWUnlock(1, lockA).RWUnlock(1, lockA)
			},
		},
		{
			name:   "forbidden nesting from the trace header",
			header: &events.Header{UserProbes: []string{"progress", "user_callback"}, Forbid: []string{"progress>user_callback"}},
			build: func(b *tracebuild.Trace) {
				b.Probe(1, events.OpProbeEnter, 0, "progress", "wait_all")
				b.Probe(1, events.OpProbeEnter, 1, "user_callback", "dispatch", "progress", "wait_all")
			},
			want: []want{{KindForbiddenNesting, SeverityError}},
		},
	}
}

// lifetimeCase: thread 1 takes P then Q; between, P's lifetime may end and
// a new lock take its address; thread 2 then takes Q then P.
func lifetimeCase(name string, between func(b *tracebuild.Trace), w []want) ruleCase {
	return ruleCase{
		name: name,
		build: func(b *tracebuild.Trace) {
			b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "obj_new")
			b.Lock(1, heapP, "pthread_mutex_lock"+libc, "obj_update")
			b.Lock(1, heapQ, "pthread_mutex_lock"+libc, "obj_update")
			b.Unlock(1, heapQ).Unlock(1, heapP)
			between(b)
			b.Lock(2, heapQ, "pthread_mutex_lock"+libc, "list_walk")
			b.Lock(2, heapP, "pthread_mutex_lock"+libc, "list_walk")
			b.Unlock(2, heapP).Unlock(2, heapQ)
		},
		want: w,
	}
}

func checkOpenMPI(hold string) func(t *testing.T, res *Result) {
	return func(t *testing.T, res *Result) {
		f := ofKind(res, KindLockOrderCycle)[0]
		if len(f.Locks) != 2 || !contains(f.Locks, "vma_lock (librcache.so)") || !anyContains(f.Locks, "arena") {
			t.Fatalf("locks %v", f.Locks)
		}
		if len(f.Edges) != 2 {
			t.Fatalf("edges %d", len(f.Edges))
		}
		e1, e2 := f.Edges[0], f.Edges[1]
		if e1.From != "vma_lock (librcache.so)" || e1.To != "glibc malloc arena" || e1.Thread != 1 {
			t.Errorf("edge 1 %s → %s thread %d", e1.From, e1.To, e1.Thread)
		}
		if !contains(stackFunctions(e1.Stack), "vma_tree_insert") || !contains(stackFunctions(e1.HeldStack), "mca_rcache_base_vma_insert") {
			t.Errorf("edge 1 stacks %v / %v", stackFunctions(e1.Stack), stackFunctions(e1.HeldStack))
		}
		if e2.From != "glibc malloc arena" || e2.To != "vma_lock (librcache.so)" || e2.Thread != 2 || e2.Arena != hold {
			t.Errorf("edge 2 %s → %s thread %d arena %q", e2.From, e2.To, e2.Thread, e2.Arena)
		}
		if !contains(stackFunctions(e2.Stack), "vma_tree_iterate") || !contains(stackFunctions(e2.HeldStack), "release_buffers") {
			t.Errorf("edge 2 stacks %v / %v", stackFunctions(e2.Stack), stackFunctions(e2.HeldStack))
		}
		if hold == "held" && !strings.Contains(e2.Context, "shrink_heap") {
			t.Errorf("edge 2 context %q", e2.Context)
		}
		if !strings.Contains(f.Title, "allocator") || !anyContains(actions(f), "malloc(): lock(glibc malloc arena)") {
			t.Errorf("title %q scenario %v", f.Title, f.Scenario)
		}
	}
}

func actions(f Finding) []string {
	var out []string
	for _, s := range f.Scenario {
		out = append(out, s.Thread+": "+s.Action)
	}
	return out
}

func edgeContexts(f Finding) []string {
	var out []string
	for _, e := range f.Edges {
		out = append(out, e.Context)
	}
	return out
}

func TestRules(t *testing.T) {
	runRuleCases(t, ruleCases())
}

// runRuleCases builds each case's trace, analyses it and checks the kinds
// and severities of every finding, then the case's own checks.
func runRuleCases(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := named(tracebuild.New(100, c.header))
			c.build(b)
			b.Footer(nil)
			res := analyze(c.opts, b)
			var got, exp []string
			for _, f := range res.Findings {
				got = append(got, string(f.Kind)+"/"+string(f.Severity))
			}
			for _, w := range c.want {
				exp = append(exp, string(w.kind)+"/"+string(w.severity))
			}
			sort.Strings(got)
			sort.Strings(exp)
			if strings.Join(got, " ") != strings.Join(exp, " ") {
				for _, f := range res.Findings {
					t.Logf("%s %s: %s\n  %s", f.Severity, f.Kind, f.Title, f.Detail)
				}
				t.Fatalf("findings %v, want %v", got, exp)
			}
			if !res.Stats.Complete {
				t.Errorf("stats incomplete: %s", res.Stats.Incomplete)
			}
			if c.check != nil {
				c.check(t, res)
			}
		})
	}
}
