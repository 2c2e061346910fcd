package analyzer

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// Lock misuse as the recorders send it: an unlock of a lock the thread
// does not hold, with its stack and the holder the lock's word names
// (Addr2); a destroy of a held lock with FlagBusy, its stack and that
// holder.

func unlockAt(b *tracebuild.Trace, tid uint32, op events.Op, addr uint64, wordHolder uint32, fn string) {
	b.Event(events.Event{TID: tid, Op: op, Addr: addr, Addr2: uint64(wordHolder)}, op.String()+libc, fn)
}

func destroyAt(b *tracebuild.Trace, tid uint32, op events.Op, addr uint64, busy bool, wordHolder uint32, fn string) {
	e := events.Event{TID: tid, Op: op, Addr: addr}
	if !busy {
		b.Event(e)
		return
	}
	e.Flags, e.Addr2 = events.FlagBusy, uint64(wordHolder)
	b.Event(e, op.String()+libc, fn)
}

// misuseWant is what a test reads of a lock-misuse finding.
type misuseWant struct {
	title   string   // in the title
	lock    string   // its lock
	stack   string   // on the offending call's stack
	held    string   // on the holder's acquisition stack; "" for none
	action  string   // the edge's action
	threads []uint32 // the finding's threads
	checks  LockMisuse
	detail  string // in the detail
}

func checkMisuse(t *testing.T, res *Result, w misuseWant) {
	t.Helper()
	fs := ofKind(res, KindLockMisuse)
	if len(fs) == 0 {
		t.Fatalf("no lock-misuse finding")
	}
	f := fs[0]
	e := f.Edges[0]
	if !strings.Contains(f.Title, w.title) || f.Locks[0] != w.lock || e.Action != w.action ||
		!contains(stackFunctions(e.Stack), w.stack) || (w.held == "") != (len(e.HeldStack) == 0) ||
		(w.held != "" && !contains(stackFunctions(e.HeldStack), w.held)) || !reflect.DeepEqual(f.Threads, w.threads) ||
		!strings.Contains(f.Detail, w.detail) {
		t.Errorf("%s\n  locks %v, threads %v, action %q, stack %v, held %v\n  %s", f.Title, f.Locks, f.Threads, e.Action,
			stackFunctions(e.Stack), stackFunctions(e.HeldStack), f.Detail)
	}
	if !strings.HasPrefix(f.ID, "lock-misuse-") || f.Severity != SeverityWarning {
		t.Errorf("ID %s severity %s", f.ID, f.Severity)
	}
	if res.Stats.LockMisuse != w.checks || res.Stats.TraceChecks.Total() != 0 {
		t.Errorf("misuse %+v (want %+v), trace checks %+v", res.Stats.LockMisuse, w.checks, res.Stats.TraceChecks)
	}
}

func misuseCases() []ruleCase {
	misuse := []want{{KindLockMisuse, SeverityWarning}}
	return []ruleCase{
		{
			// Helgrind's tc09/tc10: an unlock of a mutex never locked.
			name:   "unlock of a never-locked mutex",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "setup")
				unlockAt(b, 1, events.OpMutexUnlock, heapP, 0, "bogus_unlock")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "unlock of mutex initialised at setup+0x8 (prog), which no thread held",
					lock: "mutex initialised at setup+0x8 (prog)", stack: "bogus_unlock", action: "unlocked", threads: []uint32{1},
					checks: LockMisuse{UnheldUnlocks: 1}, detail: "pthread_mutex_destroy fails with EBUSY"})
			},
		},
		{
			name:   "unlock of a mutex nothing names is named by that unlock",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				unlockAt(b, 1, events.OpMutexUnlock, heapP, 0, "bogus_unlock")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "which no thread held", lock: "mutex first used at bogus_unlock+0x8 (prog)",
					stack: "bogus_unlock", action: "unlocked", threads: []uint32{1}, checks: LockMisuse{UnheldUnlocks: 1}})
				if n := res.Graph.Nodes; len(n) != 1 || n[0].Name != "mutex first used at bogus_unlock+0x8 (prog)" || len(n[0].Misuse) != 1 {
					t.Errorf("graph nodes %+v", n)
				}
			},
		},
		{
			// liblockdep's unlock_balance: lock, unlock, unlock.
			name:   "unlock twice",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "balance")
				b.Unlock(1, lockA)
				unlockAt(b, 1, events.OpMutexUnlock, lockA, 0, "unbalance")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "unlock of lock_a (libx.so), which no thread held", lock: "lock_a (libx.so)",
					stack: "unbalance", action: "unlocked", threads: []uint32{1}, checks: LockMisuse{UnheldUnlocks: 1}})
			},
		},
		{
			// Helgrind's tc09/tc12: an unlock of a mutex another thread
			// holds. glibc releases a normal mutex whoever calls: the
			// holder's own unlock later is one of an unlocked mutex.
			name:   "unlock of a mutex held by another thread",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Thread(1, "main").Thread(2, "child")
				lk(b, 1, lockA, "take_it")
				unlockAt(b, 2, events.OpMutexUnlock, lockA, 1, "child_fn")
				lk(b, 1, lockB, "then_b") // lock_a is no longer held: no lock_a → lock_b
				b.Unlock(1, lockB)
				unlockAt(b, 1, events.OpMutexUnlock, lockA, 0, "main_unlocks")
			},
			want: append(misuse, misuse...),
			check: func(t *testing.T, res *Result) {
				var foreign *Finding
				for i, f := range res.Findings {
					if strings.Contains(f.Title, "held by") {
						foreign = &res.Findings[i]
					}
				}
				if foreign == nil || foreign.Title != "unlock of lock_a (libx.so), held by another thread" ||
					!strings.Contains(foreign.Detail, "held by thread 1 (main) when thread 2 (child) called pthread_mutex_unlock") ||
					!contains(stackFunctions(foreign.Edges[0].Stack), "child_fn") || !contains(stackFunctions(foreign.Edges[0].HeldStack), "take_it") ||
					!reflect.DeepEqual(foreign.Threads, []uint32{1, 2}) {
					t.Errorf("the child's unlock: %+v", foreign)
				}
				if c := res.Stats; c.Dependencies != 0 || c.LockMisuse != (LockMisuse{UnheldUnlocks: 1, ForeignUnlocks: 1}) {
					t.Errorf("dependencies %d, misuse %+v", c.Dependencies, c.LockMisuse)
				}
			},
		},
		{
			// An error-checking mutex knows its owner: another thread's
			// unlock fails with EPERM and the holder still holds it.
			name:   "unlock of an error-checking mutex held by another thread",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.LockKind(1, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "take_it")
				unlockAt(b, 2, events.OpMutexUnlock, lockM, 1, "child_fn")
				lk(b, 1, lockB, "then_b")
				b.Unlock(1, lockB).Unlock(1, lockM)
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "unlock of queue_mutex (libx.so), held by another thread", lock: "queue_mutex (libx.so)",
					stack: "child_fn", held: "take_it", action: "unlocked", threads: []uint32{1, 2},
					checks: LockMisuse{ForeignUnlocks: 1}, detail: "EPERM"})
				if res.Stats.Dependencies != 1 {
					t.Errorf("dependencies %d: want queue_mutex → lock_b", res.Stats.Dependencies)
				}
			},
		},
		{
			// The holder's acquisition was only counted (aggregate mode's
			// chain cache): the lock's own word names it.
			name:   "unlock of a mutex whose holder only the lock names",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				unlockAt(b, 2, events.OpMutexUnlock, lockA, 7, "child_fn")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "unlock of lock_a (libx.so), held by another thread", lock: "lock_a (libx.so)",
					stack: "child_fn", action: "unlocked", threads: []uint32{2, 7}, checks: LockMisuse{ForeignUnlocks: 1},
					detail: "held by thread 7 (as the lock's own word says"})
			},
		},
		{
			// glibc refuses to destroy a held mutex (EBUSY): it stays held,
			// and its holder's unlock is sound.
			name:   "destroy of a mutex its thread holds",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "setup")
				lk(b, 1, heapP, "take_it")
				destroyAt(b, 1, events.OpMutexDestroy, heapP, true, 1, "teardown")
				b.Unlock(1, heapP)
				destroyAt(b, 1, events.OpMutexDestroy, heapP, false, 0, "")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "destroy of mutex initialised at setup+0x8 (prog), held by the destroying thread",
					lock: "mutex initialised at setup+0x8 (prog)", stack: "teardown", held: "take_it", action: "destroyed",
					threads: []uint32{1}, checks: LockMisuse{HeldDestroys: 1}, detail: "EBUSY"})
			},
		},
		{
			name:   "destroy of a rwlock another thread holds",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.RWLock(1, events.OpRwlockWrlock, lockC, 0, "pthread_rwlock_wrlock"+libc, "writer")
				destroyAt(b, 2, events.OpRwlockDestroy, lockC, true, 1, "teardown")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "destroy of lock_c (libx.so), held by another thread", lock: "lock_c (libx.so)",
					stack: "teardown", held: "writer", action: "destroyed", threads: []uint32{1, 2},
					checks: LockMisuse{HeldDestroys: 1}, detail: "destroyed lock"})
			},
		},
		{
			// Readers hold it: the word names no thread.
			name:   "destroy of a rwlock its word says is held",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				destroyAt(b, 2, events.OpRwlockDestroy, lockC, true, 0, "teardown")
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "destroy of lock_c (libx.so), which is held", lock: "lock_c (libx.so)",
					stack: "teardown", action: "destroyed", threads: []uint32{2}, checks: LockMisuse{HeldDestroys: 1}})
			},
		},
		{
			// glibc's pthread_spin_init is pthread_spin_unlock's code: the
			// eBPF recorder sends a call there by a thread that does not
			// hold the lock, whose word said held (0), as an init with
			// FlagBusy. Another thread holds it: its release.
			name:   "spinlock init flagged held, another thread holding it",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Thread(1, "main").Thread(2, "child")
				b.Event(events.Event{TID: 1, Op: events.OpSpinLock, Flags: events.FlagAcquired, Addr: lockA}, "pthread_spin_lock"+libc, "take_it")
				b.Event(events.Event{TID: 2, Op: events.OpSpinInit, Flags: events.FlagBusy, Addr: lockA}, "pthread_spin_init"+libc, "child_fn")
				lk(b, 1, lockB, "then_b") // lock_a is no longer held: no lock_a → lock_b
				b.Unlock(1, lockB)
			},
			want: misuse,
			check: func(t *testing.T, res *Result) {
				checkMisuse(t, res, misuseWant{title: "unlock of lock_a (libx.so), held by another thread", lock: "lock_a (libx.so)",
					stack: "child_fn", held: "take_it", action: "unlocked", threads: []uint32{1, 2},
					checks: LockMisuse{ForeignUnlocks: 1}, detail: "called pthread_spin_unlock"})
				if len(res.Graph.Edges) != 0 {
					t.Errorf("graph edges %+v", res.Graph.Edges)
				}
			},
		},
		{
			// The same call on zeroed memory nobody holds: an init, which
			// names the lock.
			name:   "spinlock init flagged held, nobody holding it: an init",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				b.Event(events.Event{TID: 1, Op: events.OpSpinInit, Flags: events.FlagBusy, Addr: heapP}, "pthread_spin_init"+libc, "make_lock")
				b.Event(events.Event{TID: 1, Op: events.OpSpinLock, Flags: events.FlagAcquired, Addr: heapP}, "pthread_spin_lock"+libc, "use_lock")
				b.Event(events.Event{TID: 1, Op: events.OpSpinUnlock, Addr: heapP})
			},
			check: func(t *testing.T, res *Result) {
				if res.Stats.LockMisuse.Total() != 0 || res.Stats.UnbalancedUnlocks != 0 {
					t.Errorf("misuse %+v, unbalanced %d", res.Stats.LockMisuse, res.Stats.UnbalancedUnlocks)
				}
				if n := res.Graph.Nodes; len(n) != 0 && !strings.Contains(n[0].Name, "initialised at make_lock") {
					t.Errorf("graph nodes %+v", n)
				}
			},
		},
		{
			name:   "destroy of an unheld lock, unlock of a held one: nothing",
			header: runHeader(),
			build: func(b *tracebuild.Trace) {
				lk(b, 1, lockA, "f")
				b.Unlock(1, lockA)
				destroyAt(b, 1, events.OpMutexDestroy, lockA, false, 0, "")
				lk(b, 2, lockA, "g")
				b.Unlock(2, lockA)
			},
			check: func(t *testing.T, res *Result) {
				if res.Stats.LockMisuse.Total() != 0 {
					t.Errorf("misuse %+v", res.Stats.LockMisuse)
				}
			},
		},
	}
}

func TestLockMisuse(t *testing.T) {
	runRuleCases(t, misuseCases())
}

// TestLockMisuseIncomplete: in a trace that lost events or was cut short,
// an unlock of an unheld lock may be a lost lock call: a trace
// inconsistency that says so, counted in the trace checks.
func TestLockMisuseIncomplete(t *testing.T) {
	for _, c := range []struct {
		name   string
		end    func(b *tracebuild.Trace)
		reason string
	}{
		{"events lost", func(b *tracebuild.Trace) { b.Lost(3).Footer(nil) }, "3 events lost"},
		{"cut short", func(b *tracebuild.Trace) {}, "trace cut short: no footer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := named(tracebuild.New(100, runHeader()))
			lk(b, 1, lockA, "balance")
			b.Unlock(1, lockA)
			unlockAt(b, 1, events.OpMutexUnlock, lockA, 0, "unbalance")
			c.end(b)
			res := analyze(Options{}, b)
			if len(res.Findings) != 1 {
				t.Fatalf("%d findings", len(res.Findings))
			}
			f := res.Findings[0]
			if f.Kind != KindTraceInconsistency || f.Severity != SeverityWarning || f.Title != "trace inconsistency: unlock of lock_a (libx.so), which no thread held" ||
				!strings.Contains(f.Detail, "In a complete trace this would be lock misuse, but this trace is not ("+c.reason+")") ||
				!strings.Contains(f.Detail, "may be among the events lost") || !contains(stackFunctions(f.Edges[0].Stack), "unbalance") {
				t.Errorf("%s %s: %s\n%s", f.Kind, f.Severity, f.Title, f.Detail)
			}
			if res.Stats.TraceChecks.UnheldUnlocks != 1 || res.Stats.LockMisuse.Total() != 0 {
				t.Errorf("checks %+v, misuse %+v", res.Stats.TraceChecks, res.Stats.LockMisuse)
			}
		})
	}
}

// TestLockMisuseID: an unlock at one site is one finding whether another
// thread still held the lock (the order of two threads' calls) or not.
func TestLockMisuseID(t *testing.T) {
	build := func(holderFirst bool) string {
		b := named(tracebuild.New(100, runHeader()))
		lk(b, 1, lockA, "take_it")
		if holderFirst {
			b.Unlock(1, lockA)
		}
		unlockAt(b, 2, events.OpMutexUnlock, lockA, 0, "child_fn")
		if !holderFirst {
			b.Unlock(1, lockA)
		}
		for _, f := range analyze(Options{}, b.Footer(nil)).Findings {
			if contains(stackFunctions(f.Edges[0].Stack), "child_fn") {
				t.Logf("%s: %s", f.ID, f.Title)
				return f.ID
			}
		}
		t.Fatal("no finding of the child's unlock")
		return ""
	}
	if held, free := build(false), build(true); held != free {
		t.Errorf("IDs %s (held by another thread) and %s (held by none)", held, free)
	}
}
