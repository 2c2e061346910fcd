package analyzer

import (
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"reflect"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// churn feeds a the lock churn that made memory grow without bound: four
// threads each create a heap mutex, take it under a table lock with a
// malloc inside, destroy it and free it, iterations times; the chunk
// addresses cycle through a few per thread, as malloc reuses them. Around
// it: an inversion of two static locks and the Open MPI hook pattern, so
// there are findings to keep.
func churn(a *Analyzer, b *tracebuild.Trace, from, iterations int) {
	feed := func() {
		for _, r := range b.Drain() {
			a.Add(r)
		}
	}
	const table = 0x601300
	if from == 0 {
		named(b).Name(table, "table_lock (prog)")
		lk(b, 1, lockA, "f")
		lk(b, 1, lockB, "f")
		b.Unlock(1, lockB).Unlock(1, lockA)
		lk(b, 2, lockB, "g")
		lk(b, 2, lockA, "g")
		b.Unlock(2, lockA).Unlock(2, lockB)
		openMPIThreadA(b, 3)
		b.Alloc(4, events.OpFree, 0x7e0000000000, 4096, "free"+libc, "release_buffers")
		b.InAlloc(4, events.OpMadvise, 0x7e0000000000, events.OpFree, "madvise"+libc, "_int_free"+libc, "free"+libc)
		b.InAlloc(4, events.OpMutexLock, vma, events.OpFree, "pthread_mutex_lock"+libc, "mca_rcache_base_vma_delete"+rcache, "intercept_madvise"+rcache)
		b.Unlock(4, vma)
		feed()
	}
	for i := from; i < from+iterations; i++ {
		for tid := uint32(1); tid <= 4; tid++ {
			m := 0x7f5000000000 + uint64(tid)*0x10000 + uint64(i%8)*0x40
			b.Op(tid, events.OpMutexInit, m, 0, "pthread_mutex_init"+libc, "obj_new")
			b.Lock(tid, table, "pthread_mutex_lock"+libc, "table_insert")
			b.Lock(tid, m, "pthread_mutex_lock"+libc, "table_insert")
			b.Alloc(tid, events.OpMalloc, 0, 48, "malloc"+libc, "table_insert")
			b.Unlock(tid, m).Unlock(tid, table)
			b.Op(tid, events.OpMutexDestroy, m, 0, "pthread_mutex_destroy"+libc, "obj_free")
			b.Alloc(tid, events.OpFree, m, 64, "free"+libc, "obj_free")
		}
		feed()
	}
}

// retained is what the analyzer keeps per lock instance and dependency.
type retained struct{ instances, edges, edgeList, twins, deferred int }

func retainedBy(a *Analyzer) retained {
	r := retained{edges: len(a.edges), edgeList: len(a.edgeList), twins: len(a.twins), deferred: len(a.deferred)}
	for _, inst := range a.instances {
		if inst != nil {
			r.instances++
		}
	}
	return r
}

// TestLockChurnBounded: under lock churn the analyzer's memory is bounded
// by classes, dependencies and stacks, not by the instances that came and
// went: what it retains after 20,000 rounds is no more than after 200, and
// small. The findings and statistics are those of an analyzer that keeps
// every instance.
func TestLockChurnBounded(t *testing.T) {
	a, b := New(Options{}), tracebuild.New(1, &events.Header{Allocator: "glibc"})
	churn(a, b, 0, 200)
	early := retainedBy(a)
	churn(a, b, 200, 19800)
	late := retainedBy(a)
	t.Logf("retained after 200 rounds %+v, after 20,000 %+v", early, late)
	if late.instances > early.instances || late.edges > early.edges || late.twins > early.twins {
		t.Errorf("retained state grew with the churn: %+v, then %+v", early, late)
	}
	// The static locks, the arena, the live heap mutexes and one folded
	// representative per way a dead one was used; their dependencies.
	if late.instances > 32 || late.edges > 64 || late.edgeList > 2*64+1024 || late.deferred > 128 {
		t.Errorf("retained %+v: want a few dozen at most", late)
	}

	whole, wb := New(Options{}), tracebuild.New(1, &events.Header{Allocator: "glibc"})
	whole.noFold = true
	churn(whole, wb, 0, 20000)
	if n := retainedBy(whole).instances; n < 80000 {
		t.Fatalf("without folding %d instances are kept, want every one of the 80,000", n)
	}
	got, want := a.Result(), whole.Result()
	if len(want.Findings) < 2 {
		t.Fatalf("want the inversion and the hook findings, got %+v", want.Findings)
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
	if want.Stats.Locks < 80000 {
		t.Errorf("stats count %d locks, want the 80,000 churned ones too", want.Stats.Locks)
	}
}

// BenchmarkLockChurn is the cost of the churn per round (four lock
// lifetimes, 28 events), folding included.
func BenchmarkLockChurn(b *testing.B) {
	a, tb := New(Options{}), tracebuild.New(1, &events.Header{Allocator: "glibc"})
	churn(a, tb, 0, 100)
	b.ResetTimer()
	churn(a, tb, 100, b.N)
}

// TestFoldedCycles: a thousand short-lived objects, each with a pair of
// locks taken in both orders and then destroyed, at reused addresses. The
// dead pairs fold into one, yet the finding is the one an analyzer that
// keeps every instance gives: the same cycle, edges and stacks, seen 1000
// times. Only its instance list, capped anyway, names fewer sets.
func TestFoldedCycles(t *testing.T) {
	build := func() *tracebuild.Trace {
		b := tracebuild.New(1, nil)
		for i := uint64(0); i < 1000; i++ {
			p, q := 0x7f0000000000+(i%4)*0x100, 0x7f0000000040+(i%4)*0x100
			b.Op(1, events.OpMutexInit, p, 0, "pthread_mutex_init"+libc, "conn_new")
			b.Op(1, events.OpMutexInit, q, 0, "pthread_mutex_init"+libc, "conn_new_queue")
			b.Lock(1, p, "pthread_mutex_lock"+libc, "conn_send")
			b.Lock(1, q, "pthread_mutex_lock"+libc, "conn_send")
			b.Unlock(1, q).Unlock(1, p)
			b.Lock(2, q, "pthread_mutex_lock"+libc, "conn_recv")
			b.Lock(2, p, "pthread_mutex_lock"+libc, "conn_recv")
			b.Unlock(2, p).Unlock(2, q)
			b.Op(1, events.OpMutexDestroy, p, 0, "pthread_mutex_destroy"+libc, "conn_free")
			b.Op(1, events.OpMutexDestroy, q, 0, "pthread_mutex_destroy"+libc, "conn_free")
		}
		return b.Footer(nil)
	}
	folded, whole := New(Options{}), New(Options{})
	whole.noFold = true
	for _, r := range build().Records() {
		folded.Add(r)
	}
	for _, r := range build().Records() {
		whole.Add(r)
	}
	if n := retainedBy(folded).instances; n > 8 {
		t.Errorf("%d instances kept for 2,000 dead ones folding into a pair", n)
	}
	got, want := folded.Result(), whole.Result()
	if len(got.Findings) != 1 || len(want.Findings) != 1 {
		t.Fatalf("want one finding each, got %d and %d", len(got.Findings), len(want.Findings))
	}
	g, w := got.Findings[0], want.Findings[0]
	if w.Occurrences != 1000 || g.Occurrences != w.Occurrences {
		t.Errorf("occurrences: folded %d, whole %d, want 1000", g.Occurrences, w.Occurrences)
	}
	g.Instances, w.Instances = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("finding changed by folding:\n got %+v\nwant %+v", g, w)
	}
	if !reflect.DeepEqual(got.Stats, want.Stats) {
		t.Errorf("stats changed by folding:\n got %+v\nwant %+v", got.Stats, want.Stats)
	}
}
