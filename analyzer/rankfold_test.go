package analyzer

import (
	"reflect"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// rankTrace is one rank of a job: its own PID, TIDs and addresses, the
// same code. It has a finding of every kind the analysis keeps sightings
// of: an inversion, the Open MPI hook deadlock and the hazard of the
// hook's lock on itself, a hook-lock, an error-checking mutex taken
// twice, an allocator re-entry, lock misuse, two heap locks of one class
// and a mutex initialised and never taken.
func rankTrace(rank uint32) *tracebuild.Trace {
	b := tracebuild.New(1000+rank, &events.Header{Command: []string{"./app"}, Allocator: "glibc"})
	b.TIDBase, b.AddrBase = 100*rank, uint64(rank)<<32
	named(b)
	lk(b, 1, lockA, "f")
	lk(b, 1, lockB, "f")
	b.Unlock(1, lockB).Unlock(1, lockA)
	lk(b, 2, lockB, "g")
	lk(b, 2, lockA, "g")
	b.Unlock(2, lockA).Unlock(2, lockB)
	openMPIThreadA(b, 3)
	openMPIThreadB(b, 4, shrinkHeapHookStack...)
	b.Alloc(5, events.OpFree, 0x7f2000000010, 0x200000, "free"+libc, "drop")
	b.InAlloc(5, events.OpMutexLock, lockC, events.OpFree, "pthread_mutex_lock"+libc, "stats_note", "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc)
	b.Unlock(5, lockC)
	b.InAlloc(5, events.OpMalloc, 0, events.OpFree, "malloc"+libc, "hook_log"+rcache, "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc)
	b.LockKind(6, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "enqueue")
	b.LockKind(6, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "enqueue_again")
	b.Unlock(6, lockM)
	unlockAt(b, 6, events.OpMutexUnlock, lockM, 0, "dequeue")
	for _, p := range []uint64{heapP, heapQ} {
		b.Op(7, events.OpMutexInit, p, 0, "pthread_mutex_init"+libc, "pool_create")
		lk(b, 7, p, "pool_get")
		b.Unlock(7, p)
	}
	b.Op(7, events.OpMutexInit, heapP+0x100, 0, "pthread_mutex_init"+libc, "spare_create")
	if rank%10 == 7 {
		// Some ranks take another path: a shape of their own.
		lk(b, 8, lockC, "rare")
		lk(b, 8, lockA, "rare")
		b.Unlock(8, lockA).Unlock(8, lockC)
	}
	return b.Footer(nil)
}

// TestFoldFinishedTraces: a job's ranks fold into one per shape: what is
// kept after 50 ranks is what is kept after 20, and the result is that of
// an analyzer that keeps every rank's instances: the same findings, seen
// as often, the same statistics and lock graph.
func TestFoldFinishedTraces(t *testing.T) {
	feed := func(a *Analyzer, ranks int) {
		for r := range ranks {
			a.BeginStream("rank" + itoa(uint64(r)))
			for _, rec := range rankTrace(uint32(r)).Records() {
				a.Add(rec)
			}
		}
	}
	few, many, whole := New(Options{}), New(Options{}), New(Options{})
	whole.noFold = true
	feed(few, 20)
	feed(many, 50)
	feed(whole, 50)
	f, m := retainedBy(few), retainedBy(many)
	t.Logf("retained after 20 ranks %+v, after 50 %+v; %d stacks", f, m, many.nstacks)
	if m.instances != f.instances || m.edges != f.edges || m.edgeList > f.edgeList || len(many.selfList) != len(few.selfList) ||
		len(many.inconList) != len(few.inconList) || len(many.hookSelfList) != len(few.hookSelfList) ||
		len(many.reentryList) != len(few.reentryList) {
		t.Errorf("retained state grew with the ranks: %+v, then %+v; sightings %d %d %d %d, then %d %d %d %d", f, m,
			len(few.selfList), len(few.inconList), len(few.hookSelfList), len(few.reentryList),
			len(many.selfList), len(many.inconList), len(many.hookSelfList), len(many.reentryList))
	}
	if many.nstacks != few.nstacks {
		t.Errorf("%d stacks kept for 50 ranks, %d for 20: each distinct stack is kept once", many.nstacks, few.nstacks)
	}
	got, want := many.Result(), whole.Result()
	kinds := map[Kind]bool{}
	for _, f := range want.Findings {
		kinds[f.Kind] = true
	}
	for _, k := range []Kind{KindLockOrderCycle, KindSelfDeadlock, KindHookLock, KindAllocatorReentry, KindLockMisuse} {
		if !kinds[k] {
			t.Errorf("no %s finding in the ranks: %v", k, findingIDs(want))
		}
	}
	for i := range got.Findings {
		got.Findings[i].Instances = nil
	}
	for i := range want.Findings {
		want.Findings[i].Instances = nil
	}
	if !reflect.DeepEqual(got.Findings, want.Findings) {
		t.Errorf("findings changed by folding:\n got %+v\nwant %+v", got.Findings, want.Findings)
	}
	if !reflect.DeepEqual(got.Stats, want.Stats) {
		t.Errorf("stats changed by folding:\n got %+v\nwant %+v", got.Stats, want.Stats)
	}
	if !reflect.DeepEqual(got.Graph, want.Graph) {
		t.Errorf("lock graph changed by folding:\n got %+v\nwant %+v", got.Graph, want.Graph)
	}
	for _, f := range want.Findings {
		if f.Occurrences%5 != 0 {
			t.Errorf("%s %s seen %d times in 50 ranks", f.Kind, f.Title, f.Occurrences)
		}
	}
}
