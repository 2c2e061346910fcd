package analyzer

import (
	"sort"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/tracebuild"

	"github.com/hooktrace/hooktrace/events"
)

// The analyzer checks its own evidence: a finding the trace contradicts
// is a trace inconsistency (warning), never an error, and is counted.

func spin(b *tracebuild.Trace, tid uint32, op events.Op, addr uint64, fn string) {
	e := events.Event{TID: tid, Op: op, Addr: addr}
	if op == events.OpSpinLock {
		e.Flags = events.FlagAcquired
	}
	if op == events.OpSpinUnlock {
		b.Event(e)
		return
	}
	b.Event(e, "pthread_spin_lock"+libc, fn)
}

var runHeader = func() *events.Header { return &events.Header{Command: []string{"./app"}} }

func evidenceCases() []ruleCase {
	return []ruleCase{
		{
			// UCX's pattern with one lost event: the thread "takes" its
			// spinlock twice and goes on to unlock it twice.
			name:   "self-deadlock the thread outlived",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Thread(1, "ucx-async")
				spin(b, 1, events.OpSpinLock, lockA, "ucs_recursive_spin_lock")
				spin(b, 1, events.OpSpinLock, lockA, "ucm_event_dispatch")
				spin(b, 1, events.OpSpinUnlock, lockA, "")
				spin(b, 1, events.OpSpinUnlock, lockA, "")
			},
			want: []want{{KindTraceInconsistency, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.Contains(f.Title, "thread 1 (ucx-async)") || f.Locks[0] != "lock_a (libx.so)" {
					t.Errorf("title %q locks %v", f.Title, f.Locks)
				}
				// The events around it: before, this, after.
				for _, w := range []string{"before, pthread_spin_lock", "this, pthread_spin_lock", "ucm_event_dispatch", "after, pthread_spin_unlock"} {
					if !strings.Contains(f.Detail, w) {
						t.Errorf("detail lacks %q: %s", w, f.Detail)
					}
				}
				if c := res.Stats.TraceChecks; c.ImpossibleSelfDeadlocks != 1 || c.UnheldUnlocks != 0 || c.ForeignUnlocks != 0 {
					t.Errorf("checks %+v", c)
				}
			},
		},
		{
			name:   "self-deadlock the thread did not outlive stays an error",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				spin(b, 1, events.OpSpinLock, lockA, "f")
				spin(b, 1, events.OpSpinLock, lockA, "g")
				lk(b, 2, lockB, "other_thread_goes_on")
				b.Unlock(2, lockB)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if res.Stats.TraceChecks.Total() != 0 {
					t.Errorf("checks %+v", res.Stats.TraceChecks)
				}
			},
		},
		{
			name:   "a thread killed while it waits for itself still exits",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				spin(b, 1, events.OpSpinLock, lockA, "f")
				spin(b, 1, events.OpSpinLock, lockA, "g")
				b.Event(events.Event{TID: 1, Op: events.OpThreadExit})
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{
			name:   "one sighting outlived, one not: the error stands",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				spin(b, 1, events.OpSpinLock, lockA, "f")
				spin(b, 1, events.OpSpinLock, lockA, "g")
				spin(b, 1, events.OpSpinUnlock, lockA, "")
				spin(b, 1, events.OpSpinUnlock, lockA, "")
				spin(b, 2, events.OpSpinLock, lockA, "f")
				spin(b, 2, events.OpSpinLock, lockA, "g")
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "1 of 2 sightings") || res.Stats.TraceChecks.ImpossibleSelfDeadlocks != 1 {
					t.Errorf("detail %s checks %+v", res.Findings[0].Detail, res.Stats.TraceChecks)
				}
			},
		},
		{
			name:   "unlock of a lock nobody holds (run)",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockB, "f")
				b.Unlock(1, lockB)
				b.Event(events.Event{TID: 1, Op: events.OpSpinUnlock, Addr: lockA}, "pthread_spin_unlock"+libc, "spin_setup")
			},
			want: []want{{KindLockMisuse, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if f.Title != "unlock of lock_a (libx.so), which no thread held" ||
					!contains(stackFunctions(f.Edges[0].Stack), "spin_setup") {
					t.Errorf("%s: %s %v", f.Title, f.Detail, stackFunctions(f.Edges[0].Stack))
				}
				if c := res.Stats; c.LockMisuse.UnheldUnlocks != 1 || c.TraceChecks.Total() != 0 {
					t.Errorf("misuse %+v, checks %+v", c.LockMisuse, c.TraceChecks)
				}
			},
		},
		{
			name:   "attach: a lock taken before the attach, released after",
			header: &events.Header{}, // no command: attached
			build: func(b *tracebuild.Trace) {
				b.Unlock(1, lockA)
				lk(b, 1, lockB, "f")
				b.Unlock(1, lockB)
			},
			check: func(t *testing.T, res *Result) {
				if res.Stats.TraceChecks.Total() != 0 {
					t.Errorf("checks %+v", res.Stats.TraceChecks)
				}
			},
		},
		{
			name:   "attach: a lock seen held by nobody, unlocked",
			header: &events.Header{},
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				b.Unlock(1, lockA)
				b.Unlock(1, lockA)
			},
			want: []want{{KindLockMisuse, SeverityWarning}},
		},
		{
			// Thread 1 took lock_a before the attach; thread 2's lock call,
			// traced at its entry, waits for it. Thread 1's unlock is not
			// another thread's lock being released.
			name:   "attach: a waiter is not the holder",
			header: &events.Header{},
			build: func(b *tracebuild.Trace) {
				lk(b, 2, lockA, "waiter")
				b.Unlock(1, lockA)
				lk(b, 2, lockB, "waiter")
				b.Unlock(2, lockB).Unlock(2, lockA)
			},
			check: func(t *testing.T, res *Result) {
				if res.Stats.TraceChecks.Total() != 0 || res.Stats.Dependencies != 1 {
					t.Errorf("checks %+v, dependencies %d (want lock_a → lock_b)", res.Stats.TraceChecks, res.Stats.Dependencies)
				}
			},
		},
		{
			name:   "lock released by another thread",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Thread(1, "owner").Thread(2, "releaser")
				lk(b, 1, lockA, "take_a")
				b.Unlock(2, lockA)
				// Thread 1 no longer holds lock_a: no lock_a → lock_b.
				lk(b, 1, lockB, "take_b")
				b.Unlock(1, lockB)
				lk(b, 3, lockB, "b_then_a")
				lk(b, 3, lockA, "b_then_a")
				b.Unlock(3, lockA).Unlock(3, lockB)
			},
			want: []want{{KindLockMisuse, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if f.Title != "unlock of lock_a (libx.so), held by another thread" ||
					!strings.Contains(f.Detail, "held by thread 1 (owner) when thread 2 (releaser) called pthread_mutex_unlock") {
					t.Errorf("%s: %s", f.Title, f.Detail)
				}
				if !contains(stackFunctions(f.Edges[0].HeldStack), "take_a") {
					t.Errorf("held stack %v", stackFunctions(f.Edges[0].HeldStack))
				}
				if c := res.Stats.LockMisuse; c.ForeignUnlocks != 1 || c.UnheldUnlocks != 0 {
					t.Errorf("misuse %+v", c)
				}
			},
		},
	}
}

func TestEvidenceChecks(t *testing.T) {
	runRuleCases(t, evidenceCases())
}

// TestLossySelfDeadlock: an attach to a busy rank that lost events (the
// unlocks are among them) sees a spinlock re-taken by a thread that went
// on, then once more as the thread's last event before the attach ended.
// No sighting is better evidence than the others: one trace inconsistency,
// no error. The same records without the loss keep the error (one sighting
// did stop its thread).
func TestLossySelfDeadlock(t *testing.T) {
	for _, lost := range []uint64{0, 40} {
		b := named(tracebuild.New(100, &events.Header{}))
		spin(b, 1, events.OpSpinLock, lockA, "f")
		spin(b, 1, events.OpSpinLock, lockA, "f")
		lk(b, 1, lockB, "g")
		b.Unlock(1, lockB)
		spin(b, 1, events.OpSpinLock, lockA, "f")
		if lost > 0 {
			b.Lost(lost)
		}
		b.Footer(nil)
		res := analyze(Options{}, b)
		var got []string
		for _, f := range res.Findings {
			got = append(got, string(f.Kind)+"/"+string(f.Severity))
		}
		want := "self-deadlock/error"
		if lost > 0 {
			want = "trace-inconsistency/warning"
		}
		sort.Strings(got)
		if strings.Join(got, " ") != want || res.Stats.TraceChecks.ImpossibleSelfDeadlocks != 1 {
			t.Errorf("%d lost: findings %v (want %s), checks %+v", lost, got, want, res.Stats.TraceChecks)
		}
	}
}
