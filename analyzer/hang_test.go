package analyzer

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

func hangFrames(fns ...string) []events.Frame {
	var out []events.Frame
	for i, fn := range fns {
		out = append(out, events.Frame{Addr: uint64(0x1000 + i*0x10), Function: fn, Object: "/opt/app/librcache.so"})
	}
	return out
}

// hangFooter is what hang detection writes for the registration cache's
// real deadlock: thread 11 holds vma_lock and waits for the arena held by
// thread 12, whose hook waits for vma_lock; thread 13 waits for vma_lock
// too, off the cycle.
func hangFooter() *events.Footer {
	return &events.Footer{
		Reason: "deadlock detected: target killed",
		Hang: &events.Hang{
			PID: 7, Timeout: 2e9, Action: "kill",
			Threads: []events.HangThread{
				{TID: 11, Name: "producer", Lock: 0x7f0000000030, LockName: "glibc malloc arena", LockKind: "arena",
					Owner: 12, OwnerFrom: "stack", Stack: hangFrames("__lll_lock_wait_private", "malloc", "rc_reg_pin", "rc_register")},
				{TID: 12, Name: "consumer", Lock: 0x5000, LockName: "vma_lock (librcache.so)", LockKind: "mutex",
					Owner: 11, Stack: hangFrames("__lll_lock_wait", "pthread_mutex_lock", "rc_mem_cb", "rc_mem_release_hook",
						"rc_intercept_madvise", "_int_free", "free", "consumer")},
				{TID: 13, Lock: 0x5000, LockName: "vma_lock (librcache.so)", LockKind: "mutex",
					Owner: 11, Stack: hangFrames("__lll_lock_wait", "pthread_mutex_lock", "rc_deregister")},
			},
		},
	}
}

func checkHangResult(t *testing.T, res *Result) {
	t.Helper()
	var dl []Finding
	for _, f := range res.Findings {
		if f.Kind == KindDeadlock {
			dl = append(dl, f)
		}
	}
	if len(dl) != 1 {
		t.Fatalf("want 1 deadlock finding, got %d: %+v", len(dl), res.Findings)
	}
	f := dl[0]
	if f.Severity != SeverityError || len(f.Locks) != 2 || len(f.Edges) != 2 {
		t.Fatalf("finding: %+v", f)
	}
	if !strings.Contains(strings.Join(f.Locks, ";"), "vma_lock (librcache.so)") || !strings.Contains(strings.Join(f.Locks, ";"), "glibc malloc arena") {
		t.Errorf("locks %v", f.Locks)
	}
	if len(f.Threads) != 2 || f.Threads[0] != 11 || f.Threads[1] != 12 {
		t.Errorf("threads %v: thread 13 is not on the cycle", f.Threads)
	}
	if !strings.Contains(f.Detail, "hang detection") || !strings.Contains(f.Detail, "2s") || !strings.Contains(f.Detail, "killed") {
		t.Errorf("detail %q", f.Detail)
	}
	for _, e := range f.Edges {
		var fns []string
		for _, fr := range e.Stack {
			fns = append(fns, fr.Function)
		}
		s := strings.Join(fns, " ")
		switch e.Thread {
		case 11:
			if e.To != "glibc malloc arena" || !strings.Contains(s, "malloc rc_reg_pin") {
				t.Errorf("thread 11's edge: %+v", e)
			}
		case 12:
			if e.To != "vma_lock (librcache.so)" || !strings.Contains(s, "rc_intercept_madvise _int_free free") {
				t.Errorf("thread 12's edge: %+v", e)
			}
		}
	}
}

// TestHangFooterGivesDeadlock: the hang in a trace's footer becomes the
// deadlock finding, live and after a round trip through a trace file.
func TestHangFooterGivesDeadlock(t *testing.T) {
	h := &events.Header{Version: events.Version, PID: 7}
	a := New(Options{})
	a.Add(&events.Record{Kind: events.RecHeader, Header: h})
	a.Add(&events.Record{Kind: events.RecFooter, Footer: hangFooter()})
	checkHangResult(t, a.Result())

	var buf bytes.Buffer
	w := events.NewWriter(&buf)
	for _, r := range []*events.Record{{Kind: events.RecHeader, Header: h}, {Kind: events.RecFooter, Footer: hangFooter()}} {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := events.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	b := New(Options{})
	b.BeginStream("t.htr")
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b.Add(rec)
	}
	res := b.Result()
	checkHangResult(t, res)
	if res.Findings[0].Edges[0].Source != "t.htr" {
		t.Errorf("edge source %q", res.Findings[0].Edges[0].Source)
	}
	if ft := r.Footer(); ft == nil || ft.Hang == nil || ft.Hang.Threads[0].Stack[2].Function != "rc_reg_pin" {
		t.Errorf("footer after the round trip: %+v", ft)
	}
}

// TestHangAtStartUnrecorded: attach watching for deadlocks alone (no
// right to load BPF programs) found a deadlock already there when it
// began. The finding is the one the timeout gives, and says how it was
// confirmed; the stats say that no call was traced, and why.
func TestHangAtStartUnrecorded(t *testing.T) {
	timed := New(Options{})
	timed.Add(&events.Record{Kind: events.RecHeader, Header: &events.Header{Version: events.Version, PID: 7, Recorder: "ebpf"}})
	timed.Add(&events.Record{Kind: events.RecFooter, Footer: hangFooter()})

	foot := hangFooter()
	foot.Hang.AtStart, foot.Hang.Samples, foot.Hang.Timeout = true, 3, 2e8
	a := New(Options{})
	a.Add(&events.Record{Kind: events.RecHeader, Header: &events.Header{Version: events.Version, PID: 7, Recorder: "none",
		Unrecorded: "not permitted to load BPF programs"}})
	a.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	res := a.Result()
	var f *Finding
	for i := range res.Findings {
		if res.Findings[i].Kind == KindDeadlock {
			f = &res.Findings[i]
		}
	}
	if f == nil {
		t.Fatalf("no deadlock finding: %+v", res.Findings)
	}
	if want := timed.Result().Findings[0]; f.ID != want.ID || f.Title != want.Title {
		t.Errorf("finding %s %q, the timeout's %s %q", f.ID, f.Title, want.ID, want.Title)
	}
	if !strings.Contains(f.Detail, "already blocked when hang detection started, and none of them ran in 3 samples over 200ms") {
		t.Errorf("detail %q", f.Detail)
	}
	if res.Stats.Complete || res.Stats.Incomplete != "no calls traced, hang detection alone watched the process: not permitted to load BPF programs" {
		t.Errorf("stats: complete %v, %q", res.Stats.Complete, res.Stats.Incomplete)
	}
}

func TestHangFooterWithoutCycle(t *testing.T) {
	foot := hangFooter()
	foot.Hang.Threads[0].Owner = 0 // the arena's owner was not found
	a := New(Options{})
	a.Add(&events.Record{Kind: events.RecHeader, Header: &events.Header{Version: events.Version}})
	a.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	for _, f := range a.Result().Findings {
		if f.Kind == KindDeadlock {
			t.Errorf("a deadlock without a cycle: %+v", f)
		}
	}
}

func TestArenaHeld(t *testing.T) {
	for _, c := range []struct {
		fns           []string
		held, decided bool
	}{
		{[]string{"pthread_mutex_lock", "rc_mem_cb", "rc_intercept_madvise", "_int_free", "free"}, true, true},
		{[]string{"pthread_mutex_lock", "hook", "munmap_chunk", "free"}, false, true},
		{[]string{"pthread_mutex_lock", "rc_deregister", "main"}, false, false},
	} {
		held, decided := ArenaHeld(&events.Stack{Frames: hangFrames(c.fns...)})
		if held != c.held || decided != c.decided {
			t.Errorf("%v: held %v decided %v, want %v %v", c.fns, held, decided, c.held, c.decided)
		}
	}
}
