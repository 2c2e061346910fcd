package analyzer

import (
	"math/rand"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// randomPairsStream is the worst case the cycle search was seen to meet:
// n heap mutexes (one class: one creation site), taken in random pairs by
// two threads under a gate lock, 2n pairs in all. The pairs make one huge
// strongly connected component with a vast number of cycles.
func randomPairsStream(n int, seed int64) []*events.Record {
	const pid = 5000
	recs := []*events.Record{{Kind: events.RecHeader, Header: &events.Header{Version: events.Version, PID: pid, Allocator: "glibc"}}}
	for id := uint32(1); id <= 3; id++ {
		recs = append(recs, &events.Record{Kind: events.RecStack, Stack: &events.Stack{ID: id, Frames: []events.Frame{
			{Addr: 0x7f0000001000, Function: "pthread_mutex_lock", Object: "/lib/libc.so.6"},
			{Addr: 0x401000 + uint64(id)*16, Function: "take_pair", Offset: uint64(id) * 16, Object: "/usr/bin/pairs"},
			{Addr: 0x400800, Function: "worker", Object: "/usr/bin/pairs"},
		}}})
	}
	const gate = 0x601000
	lock := func(i int) uint64 { return 0x7e0000000000 + uint64(i)*0x40 }
	var now uint64
	add := func(tid uint32, op events.Op, addr uint64, st uint32) {
		now += 10
		e := events.Event{Time: now, PID: pid, TID: tid, Op: op, Addr: addr, Stack: st}
		if op == events.OpMutexLock {
			e.Flags = events.FlagAcquired
		}
		recs = append(recs, &events.Record{Kind: events.RecEvent, Event: e})
	}
	for i := 0; i < n; i++ {
		add(pid+1, events.OpMutexInit, lock(i), 3)
	}
	for p, pair := range randomPairs(n, seed) {
		tid := uint32(pid + 1 + p%2)
		a, b := pair[0], pair[1]
		add(tid, events.OpMutexLock, gate, 1)
		add(tid, events.OpMutexLock, lock(a), 2)
		add(tid, events.OpMutexLock, lock(b), 2)
		add(tid, events.OpMutexUnlock, lock(b), 0)
		add(tid, events.OpMutexUnlock, lock(a), 0)
		add(tid, events.OpMutexUnlock, gate, 0)
	}
	return recs
}

// randomPairs draws 2n ordered pairs of distinct locks among n.
func randomPairs(n int, seed int64) [][2]int {
	rng := rand.New(rand.NewSource(seed))
	pairs := make([][2]int, 2*n)
	for p := range pairs {
		a := rng.Intn(n)
		b := rng.Intn(n - 1)
		if b >= a {
			b++
		}
		pairs[p] = [2]int{a, b}
	}
	return pairs
}

func analyzeRecords(recs []*events.Record) *Result {
	a := New(Options{})
	for _, r := range recs {
		a.Add(r)
	}
	return a.Result()
}

// BenchmarkCycleSearch100k analyzes the random-pairs graph of 100,000
// locks: the target is at most 30 s on one core (run with -cpu 1
// -benchtime 1x). It reports how many cycle dependencies were left
// unreported by the per-component cap.
func BenchmarkCycleSearch100k(b *testing.B) { benchCycles(b, 100000) }

// BenchmarkCycleSearch10k is the same at 10,000 locks.
func BenchmarkCycleSearch10k(b *testing.B) { benchCycles(b, 10000) }

func BenchmarkCycleSearch30k(b *testing.B) { benchCycles(b, 30000) }

func benchCycles(b *testing.B, n int) {
	recs := randomPairsStream(n, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := analyzeRecords(recs)
		if len(res.Findings) == 0 {
			b.Fatal("the random pairs make cycles, got no findings")
		}
	}
}
