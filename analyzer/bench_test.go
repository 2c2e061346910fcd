package analyzer

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// syntheticStream is a realistic mix of a threaded runtime: every thread
// allocates and frees, takes one of a few shared locks, and nests a global
// lock with its own heap lock. Threads interleave in short runs, as events
// from a per-CPU ring buffer do.
func syntheticStream(threads, iterations int) []*events.Record {
	const pid = 4000
	recs := []*events.Record{{Kind: events.RecHeader, Header: &events.Header{Version: events.Version, PID: pid, Allocator: "glibc"}}}
	for id := uint32(1); id <= 16; id++ {
		recs = append(recs, &events.Record{Kind: events.RecStack, Stack: &events.Stack{ID: id, Frames: []events.Frame{
			{Addr: 0x7f0000001000 + uint64(id), Function: "pthread_mutex_lock", Object: "/lib/libc.so.6"},
			{Addr: 0x401000 + uint64(id)*16, Function: "worker_step", Offset: uint64(id) * 16, Object: "/usr/bin/app"},
			{Addr: 0x400800, Function: "worker_main", Object: "/usr/bin/app"},
		}}})
	}
	shared := []uint64{0x601000, 0x601040, 0x601080, 0x6010c0}
	const global = 0x601100
	var blocks [][]events.Event
	for t := 0; t < threads; t++ {
		tid := uint32(pid + 1 + t)
		own := uint64(0x7e0000000000 + t*0x1000) // a heap lock of the thread's
		var evs []events.Event
		for i := 0; i < iterations; i++ {
			chunk := uint64(0x7f1000000000 + (t*iterations+i)*0x100)
			lockEv := func(addr uint64, st uint32) events.Event {
				return events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr, Stack: st}
			}
			unlockEv := func(addr uint64) events.Event {
				return events.Event{TID: tid, Op: events.OpMutexUnlock, Addr: addr}
			}
			s := shared[(i+t)%len(shared)]
			evs = append(evs,
				events.Event{TID: tid, Op: events.OpMalloc, Size: 64, Stack: 9},
				lockEv(s, uint32(1+i%4)),
				events.Event{TID: tid, Op: events.OpMalloc, Size: 256, Stack: 10},
				unlockEv(s),
				events.Event{TID: tid, Op: events.OpFree, Addr: chunk, Size: 80, Stack: 11},
				lockEv(global, 5),
				lockEv(own, 6),
				unlockEv(own),
				unlockEv(global),
				events.Event{TID: tid, Op: events.OpFree, Addr: chunk + 0x80, Size: 272, Stack: 12},
			)
		}
		blocks = append(blocks, evs)
	}
	// Interleave: runs of 5 events per thread, round robin.
	var now uint64
	for off := 0; off < len(blocks[0]); off += 5 {
		for _, evs := range blocks {
			for _, e := range evs[off : off+5] {
				now += 50
				e.Time, e.PID = now, pid
				recs = append(recs, &events.Record{Kind: events.RecEvent, Event: e})
			}
		}
	}
	return recs
}

// BenchmarkAnalyze reports the analyzer's throughput on one core, in
// events/s (run with -cpu 1).
func BenchmarkAnalyze(b *testing.B) {
	recs := syntheticStream(8, 12500) // 1M events
	var header []*events.Record
	var evs []*events.Record
	for _, r := range recs {
		if r.Kind == events.RecEvent {
			evs = append(evs, r)
		} else {
			header = append(header, r)
		}
	}
	a := New(Options{})
	for _, r := range header {
		a.Add(r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.Add(evs[i%len(evs)])
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if res := a.Result(); len(res.Findings) != 0 {
		b.Fatalf("the synthetic stream has no bugs, got %d findings", len(res.Findings))
	}
}

// BenchmarkAnalyzeFile is what `hooktrace analyze` does: read a trace file
// and analyze it, on one core (run with -cpu 1). It reports events/s.
func BenchmarkAnalyzeFile(b *testing.B) {
	recs := syntheticStream(8, 12500) // 1M events
	path := filepath.Join(b.TempDir(), "synthetic.htr")
	w, err := events.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			b.Fatal(err)
		}
		if r.Kind == events.RecEvent {
			n++
		}
	}
	if err := w.Write(&events.Record{Kind: events.RecFooter, Footer: &events.Footer{Events: uint64(n)}}); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := events.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		a := New(Options{})
		var rec events.Record
		for {
			err := r.NextInto(&rec)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			a.Add(&rec)
		}
		r.Close()
		if res := a.Result(); res.Stats.Events != uint64(n) {
			b.Fatalf("analyzed %d events, want %d", res.Stats.Events, n)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
