package events

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// synthTrace returns the records of a plausible trace: nEvents malloc, free,
// lock and unlock events from 8 threads of one process, with 50 distinct
// stacks of symbolized frames, thread and lock names, a lost-event record,
// a header and a footer.
func synthTrace(nEvents int) []Record {
	rng := rand.New(rand.NewPCG(1, 2))
	const (
		pid      = 4242
		nThreads = 8
		nStacks  = 50
		nLocks   = 16
	)
	exit := 0
	recs := []Record{{Kind: RecHeader, Header: &Header{
		Version: Version, Tool: "hooktrace test", Command: []string{"./server", "--port", "8080"},
		PID: pid, Exe: "/usr/bin/server", Host: "build-1", Kernel: "6.8.0-45-generic",
		Clock: "CLOCK_MONOTONIC", StartNS: 1_234_567_890_000, StartUnix: 1_700_000_000_000_000_000,
		Mode: "full", Allocator: "glibc",
		Probes: []ProbeSite{
			{Name: "malloc", Object: "/lib/x86_64-linux-gnu/libc.so.6", Address: 0xa50a0, Kind: "uprobe"},
			{Name: "free", Object: "/lib/x86_64-linux-gnu/libc.so.6", Address: 0xa5460, Kind: "uprobe"},
			{Name: "pthread_mutex_lock", Object: "/lib/x86_64-linux-gnu/libc.so.6", Address: 0x97f10, Kind: "uprobe"},
		},
	}}}

	// Stacks: frames from a pool of functions in three objects.
	objects := []string{"/usr/bin/server", "/usr/lib/libcache.so.2", "/lib/x86_64-linux-gnu/libc.so.6"}
	objectBase := []uint64{0x55d0_1234_0000, 0x7f3a_8800_0000, 0x7f3a_9000_0000}
	type fn struct {
		name, file string
		obj        int
		start      uint64
	}
	var funcs []fn
	for i := range 120 {
		obj := i % len(objects)
		funcs = append(funcs, fn{
			name:  fmt.Sprintf("ns::Component%d::handle_request_%d(std::string const&)", i/7, i),
			file:  fmt.Sprintf("src/component%d.cc", i/7),
			obj:   obj,
			start: objectBase[obj] + uint64(i)*0x340,
		})
	}
	for id := uint32(1); id <= nStacks; id++ {
		s := &Stack{ID: id, Truncated: id%9 == 0}
		depth := 6 + rng.IntN(12)
		for range depth {
			f := funcs[rng.IntN(len(funcs))]
			off := uint64(rng.IntN(0x300))
			s.Frames = append(s.Frames, Frame{
				Addr: f.start + off, Function: f.name, Offset: off,
				File: f.file, Line: uint32(10 + rng.IntN(2000)), Object: objects[f.obj],
			})
		}
		recs = append(recs, Record{Kind: RecStack, Stack: s})
	}

	type thread struct {
		tid    uint32
		heap   uint64 // next fresh address in this thread's arena
		live   []uint64
		sizes  map[uint64]uint64
		locked []uint64
	}
	threads := make([]*thread, nThreads)
	for i := range threads {
		t := &thread{tid: pid + uint32(i), heap: 0x7f3a_0000_0000 + uint64(i)<<26, sizes: map[uint64]uint64{}}
		threads[i] = t
		recs = append(recs, Record{Kind: RecThread, Thread: Thread{PID: pid, TID: t.tid, Name: fmt.Sprintf("worker-%d", i)}})
	}
	locks := make([]uint64, nLocks)
	for i := range locks {
		locks[i] = 0x55d0_1250_0000 + uint64(i)*64
		if i%2 == 1 {
			locks[i] = 0x55d0_3f00_0000 + uint64(i)*0x1230 // on the heap
		}
		recs = append(recs, Record{Kind: RecLockName, LockName: LockName{PID: pid, Addr: locks[i], Name: fmt.Sprintf("lock_%d (server)", i)}})
	}

	now := uint64(1_234_567_890_000)
	// Each op keeps to a few call sites, as real code does.
	stackFor := func(op Op) uint32 {
		return uint32(int(op)*7%nStacks + rng.IntN(6) + 1)
	}
	for n := 0; n < nEvents; n++ {
		now += 50 + uint64(rng.IntN(400))
		t := threads[rng.IntN(nThreads)]
		e := Event{Time: now, PID: pid, TID: t.tid}
		switch r := rng.IntN(100); {
		case r < 35 || (r < 70 && len(t.live) == 0):
			size := uint64(16 + rng.IntN(240))
			if rng.IntN(20) == 0 {
				size = uint64(4096 + rng.IntN(1<<16))
			}
			p := t.heap
			t.heap += (size + 31) &^ 15
			t.live = append(t.live, p)
			t.sizes[p] = size
			e.Op, e.Size, e.Ret = OpMalloc, size, int64(p)
		case r < 70:
			i := rng.IntN(len(t.live))
			p := t.live[i]
			t.live[i] = t.live[len(t.live)-1]
			t.live = t.live[:len(t.live)-1]
			e.Op, e.Addr, e.Size = OpFree, p, (t.sizes[p]+31)&^15
			delete(t.sizes, p)
		case r < 85 || len(t.locked) == 0:
			l := locks[rng.IntN(nLocks)]
			t.locked = append(t.locked, l)
			e.Op, e.Addr, e.Flags = OpMutexLock, l, FlagAcquired
		default:
			l := t.locked[len(t.locked)-1]
			t.locked = t.locked[:len(t.locked)-1]
			e.Op, e.Addr = OpMutexUnlock, l
		}
		if len(t.locked) > 0 {
			e.Flags |= FlagLocksHeld
		}
		e.Stack = stackFor(e.Op)
		recs = append(recs, Record{Kind: RecEvent, Event: e})
		if n == nEvents/2 {
			recs = append(recs, Record{Kind: RecLost, Lost: Lost{Time: now, Count: 17}})
		}
	}
	recs = append(recs, Record{Kind: RecFooter, Footer: &Footer{
		EndNS: now, Events: uint64(nEvents), Lost: 17,
		Calls:      map[string]uint64{"malloc": uint64(nEvents) / 3, "free": uint64(nEvents) / 3},
		ExitStatus: &exit, Reason: "target exited",
	}})
	return recs
}

// encode writes recs as a trace file.
func encode(t testing.TB, recs []Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatalf("writing record %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("closing writer: %v", err)
	}
	return buf.Bytes()
}

// decodeAll reads every record of a trace file, and the error that ended it
// (io.EOF at a clean end).
func decodeAll(data []byte) ([]Record, error) {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	var recs []Record
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, err
		}
		recs = append(recs, *rec)
	}
}
