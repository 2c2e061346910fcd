package analyzer

import (
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// nestings enters user_callback inside progress n times on thread tid.
func nestings(b *tracebuild.Trace, tid uint32, n int) {
	for range n {
		b.Probe(tid, events.OpProbeEnter, 0, "progress", "wait_all")
		b.Probe(tid, events.OpProbeEnter, 1, "user_callback", "dispatch", "progress", "wait_all")
		b.Probe(tid, events.OpProbeExit, 1)
		b.Probe(tid, events.OpProbeExit, 0)
	}
}

// TestSeenPerProcess: a finding seen in two ranks' traces lists both
// processes, each with its count and threads, and says it was merged.
func TestSeenPerProcess(t *testing.T) {
	r0 := tracebuild.New(100, mixHeader()).Thread(100, "app").Thread(101, "worker")
	nestings(r0, 100, 2)
	nestings(r0, 101, 1)
	r0.Footer(&events.Footer{Ranks: map[uint32]int{100: 0}})
	r1 := tracebuild.New(200, mixHeader()).Thread(200, "app")
	nestings(r1, 200, 4)
	r1.Footer(&events.Footer{Ranks: map[uint32]int{200: 1}})
	fs := ofKind(analyze(Options{}, r0, r1), KindForbiddenNesting)
	if len(fs) != 1 {
		t.Fatalf("want 1 forbidden nesting, got %d", len(fs))
	}
	f := fs[0]
	if f.Occurrences != 7 || len(f.Seen) != 2 {
		t.Fatalf("occurrences %d, seen %+v", f.Occurrences, f.Seen)
	}
	p0, p1 := f.Seen[0], f.Seen[1]
	if p0.PID != 100 || p0.Count != 3 || len(p0.Threads) != 2 || p0.Threads[0].Count != 2 || p0.Threads[1].Count != 1 ||
		p0.Rank == nil || *p0.Rank != 0 {
		t.Errorf("rank 0: %+v", p0)
	}
	if p1.PID != 200 || p1.Count != 4 || len(p1.Threads) != 1 || p1.Rank == nil || *p1.Rank != 1 {
		t.Errorf("rank 1: %+v", p1)
	}
	if f.Merged != "merged from 2 processes in 2 traces" {
		t.Errorf("merged %q", f.Merged)
	}
	text := strings.Join(f.SeenText(), "\n")
	for _, want := range []string{"pid 100 (rank 0, app, trace0): 3 times; threads 100 (app) 2x, 101 (worker) 1x", "pid 200 (rank 1, app, trace1): 4 times; thread 200 (app)"} {
		if !strings.Contains(text, want) {
			t.Errorf("seen text lacks %q:\n%s", want, text)
		}
	}
}

// TestSeenSelfDeadlock: a self-deadlock seen in two ranks' traces is
// counted in each process.
func TestSeenSelfDeadlock(t *testing.T) {
	var traces []*tracebuild.Trace
	for _, pid := range []uint32{100, 200} {
		b := named(tracebuild.New(pid, &events.Header{})).Thread(pid, "app")
		b.Lock(pid, lockA, "pthread_mutex_lock"+libc, "take_twice", "main")
		b.Lock(pid, lockA, "pthread_mutex_lock"+libc, "take_again", "take_twice", "main")
		traces = append(traces, b.Footer(nil))
	}
	fs := ofKind(analyze(Options{}, traces...), KindSelfDeadlock)
	if len(fs) != 1 {
		t.Fatalf("want 1 self-deadlock, got %d", len(fs))
	}
	f := fs[0]
	if len(f.Seen) != 2 || f.Seen[0].PID != 100 || f.Seen[0].Count != 1 || f.Seen[1].PID != 200 || f.Seen[1].Count != 1 ||
		f.Merged != "merged from 2 processes in 2 traces" {
		t.Errorf("seen %+v, merged %q", f.Seen, f.Merged)
	}
}

// TestSeenCyclesAndHooksPerRank: lock-order cycles, hook-lock findings and
// hook-context hazards seen in several ranks list every rank with its
// count and threads, folded or not.
func TestSeenCyclesAndHooksPerRank(t *testing.T) {
	for _, fold := range []bool{true, false} {
		a := New(Options{})
		a.noFold = !fold
		for r := range 3 {
			a.BeginStream("rank" + itoa(uint64(r)))
			for _, rec := range rankTrace(uint32(r)).Records() {
				a.Add(rec)
			}
		}
		res := a.Result()
		checked := map[Kind]int{}
		for _, f := range res.Findings {
			if f.Kind != KindLockOrderCycle && f.Kind != KindHookLock && f.Kind != KindSelfDeadlock {
				continue
			}
			if len(f.Seen) != 3 || f.Merged != "merged from 3 processes in 3 traces" {
				t.Errorf("fold %v: %s %q seen in %+v, %q", fold, f.Kind, f.Title, f.Seen, f.Merged)
				continue
			}
			var total uint64
			for r, sn := range f.Seen {
				total += sn.Count
				if sn.PID != uint32(1000+r) || sn.Count == 0 || len(sn.Threads) == 0 {
					t.Errorf("fold %v: %s %q in rank %d: %+v", fold, f.Kind, f.Title, r, sn)
				}
				for _, th := range sn.Threads {
					if th.TID/100 != uint32(r) || th.Count == 0 {
						t.Errorf("fold %v: %s %q in rank %d lists thread %+v", fold, f.Kind, f.Title, r, th)
					}
				}
			}
			if total != f.Occurrences {
				t.Errorf("fold %v: %s %q: %d occurrences, %d counted by process: %+v", fold, f.Kind, f.Title, f.Occurrences, total, f.Seen)
			}
			checked[f.Kind]++
		}
		// The inversion and the Open MPI cycle; the hook's lock; the hook
		// taking the lock its thread holds.
		if checked[KindLockOrderCycle] != 2 || checked[KindHookLock] == 0 || checked[KindSelfDeadlock] == 0 {
			t.Errorf("fold %v: checked %v", fold, checked)
		}
	}
	// The inversion's threads: each rank's threads 1 and 2, once each.
	a := New(Options{})
	for r := range 2 {
		a.BeginStream("rank" + itoa(uint64(r)))
		for _, rec := range rankTrace(uint32(r)).Records() {
			a.Add(rec)
		}
	}
	inversions := 0
	for _, f := range ofKind(a.Result(), KindLockOrderCycle) {
		if !strings.HasPrefix(f.Title, "lock order inversion") {
			continue
		}
		inversions++
		text := strings.Join(f.SeenText(), "\n")
		for _, want := range []string{"pid 1000 (rank0): once; threads 1, 2", "pid 1001 (rank1): once; threads 101, 102"} {
			if !strings.Contains(text, want) {
				t.Errorf("inversion's seen text lacks %q:\n%s", want, text)
			}
		}
	}
	if inversions != 1 {
		t.Errorf("%d inversions", inversions)
	}
}

// probeWith enters probe index with first argument arg0.
func probeWith(b *tracebuild.Trace, tid uint32, index, arg0 uint64, frames ...string) {
	b.Event(events.Event{TID: tid, Op: events.OpProbeEnter, Arg: index, Addr: arg0}, frames...)
}

// TestRuleOnArgumentStandsIn: "internal_fn > progress if arg0 == 1 unless
// burst_user" counts progress only with its argument 1, and only in a
// process that never entered burst_user, where the rule on burst_user
// reports instead: an opt build (no burst_user) and a debug build of the
// same program each give one finding, never two.
func TestRuleOnArgumentStandsIn(t *testing.T) {
	h := func() *events.Header {
		return &events.Header{UserProbes: []string{"internal_fn", "?progress", "?burst_user"},
			Forbid: []string{"internal_fn > burst_user # spec", "internal_fn > progress if arg0 == 1 unless burst_user # spec"}}
	}
	// The opt build: burst_user inlined into progress.
	opt := tracebuild.New(100, h()).Thread(100, "opt")
	for range 3 {
		opt.Probe(100, events.OpProbeEnter, 0, "internal_fn", "main")
		probeWith(opt, 100, 1, 0, "progress", "internal_fn", "main") // internal progress: allowed
		opt.Probe(100, events.OpProbeExit, 1)
		opt.Probe(100, events.OpProbeExit, 0)
	}
	opt.Probe(100, events.OpProbeEnter, 0, "internal_fn", "main")
	probeWith(opt, 100, 1, 1, "progress", "wait", "internal_fn", "main") // user progress: broken
	opt.Probe(100, events.OpProbeExit, 1)
	opt.Probe(100, events.OpProbeExit, 0)
	// The debug build: progress(user) enters burst_user.
	dbg := tracebuild.New(200, h()).Thread(200, "debug")
	for range 2 {
		dbg.Probe(200, events.OpProbeEnter, 0, "internal_fn", "main")
		probeWith(dbg, 200, 1, 1, "progress", "wait", "internal_fn", "main")
		dbg.Probe(200, events.OpProbeEnter, 2, "burst_user", "progress", "wait", "internal_fn", "main")
		dbg.Probe(200, events.OpProbeExit, 2)
		dbg.Probe(200, events.OpProbeExit, 1)
		dbg.Probe(200, events.OpProbeExit, 0)
	}
	// The debug trace first: its process is finished when the result is built.
	fs := ofKind(analyze(Options{}, dbg, opt), KindForbiddenNesting)
	if len(fs) != 2 {
		t.Fatalf("want 2 forbidden nestings, got %d: %v", len(fs), fs)
	}
	byTitle := map[string]Finding{}
	for _, f := range fs {
		byTitle[f.Title] = f
	}
	f, ok := byTitle["forbidden nesting: burst_user ran inside internal_fn"]
	if !ok || f.Occurrences != 2 || len(f.Seen) != 1 || f.Seen[0].PID != 200 {
		t.Errorf("burst_user rule: %+v", f)
	}
	f, ok = byTitle["forbidden nesting: progress if arg0 == 1 ran inside internal_fn"]
	if !ok || f.Occurrences != 1 || len(f.Seen) != 1 || f.Seen[0].PID != 100 || f.Seen[0].Count != 1 ||
		!strings.Contains(f.Detail, "stands in for the rules on burst_user") {
		t.Errorf("fallback rule: %+v", f)
	}
	if len(f.Edges) != 1 || len(f.Edges[0].Stack) < 2 || f.Edges[0].Stack[1].Function != "wait" {
		t.Errorf("fallback rule's stack: %+v", f.Edges)
	}
}
