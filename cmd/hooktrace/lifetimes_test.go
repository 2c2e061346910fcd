//go:build linux && amd64

package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// Lock lifetimes for every kind of lock, traced with real probes and with
// the preloaded recorder, in both modes: the chain cache (aggregate) must
// not hide a new lock at an old lock's address, so every way of recording
// gives the same findings (traceRuns).

// traceLifetimes runs testdata/lifetimes.c in mode each way and returns
// the runs, which agree, and the first run's findings.
func traceLifetimes(t *testing.T, prog, mode string) ([]traced, []finding) {
	t.Helper()
	runs := traceRuns(t, nil, prog, mode)
	return runs, runs[0].fs
}

// TestLockReuseAfterDestroy: spinlocks and rwlocks a, b taken a -> b, then
// destroyed and freed; new locks c, d at b's and a's addresses taken
// c -> d. The addresses were taken in both orders, by different locks: no
// cycle. Taking the same a, b in both orders is one. Mutexes that are
// zeroed memory, never initialised nor destroyed, end with their free.
func TestLockReuseAfterDestroy(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "lifetimes")
	for _, kind := range []string{"spin", "rwlock", "zeroed"} {
		if _, fs := traceLifetimes(t, prog, kind); len(ofKind(fs, "lock-order-cycle", "error")) != 0 {
			t.Errorf("%s: new locks at old addresses make a cycle: %v", kind, fs)
		}
		if _, fs := traceLifetimes(t, prog, kind+"-same"); len(ofKind(fs, "lock-order-cycle", "error")) != 1 {
			t.Errorf("%s-same: want one lock-order-cycle error, got %v", kind, fs)
		}
	}
}

// TestSpinInitIsNotUnlock: glibc 2.36's pthread_spin_init is
// pthread_spin_unlock's address; a program that only initialises
// spinlocks unlocks none.
func TestSpinInitIsNotUnlock(t *testing.T) {
	testenv.RequireBPF(t)
	runs, _ := traceLifetimes(t, testenv.Program(t, "lifetimes"), "spininit")
	for _, r := range runs {
		how, calls := r.String(), r.rep.Stats.Calls
		if calls["pthread_spin_unlock"] != 0 || calls["pthread_spin_lock"] != 0 {
			t.Errorf("%s: spin lock/unlock calls counted in a program that makes none: %v", how, calls)
		}
		if calls["pthread_spin_init"] != 1000 || calls["pthread_spin_destroy"] != 1000 {
			t.Errorf("%s: pthread_spin_init %d, pthread_spin_destroy %d; want 1000 each",
				how, calls["pthread_spin_init"], calls["pthread_spin_destroy"])
		}
	}
}

// TestWriterPreferringRwlock: a rwlock initialised with
// PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP queues readers behind
// writers, so one thread reading it twice is a hazard; with the default
// attribute it is not.
func TestWriterPreferringRwlock(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "lifetimes")
	_, fs := traceLifetimes(t, prog, "writer")
	var twice []finding
	for _, f := range ofKind(fs, "self-deadlock", "warning") {
		if strings.Contains(f.Title, "read lock of") && strings.Contains(f.Title, "taken twice") {
			twice = append(twice, f)
		}
	}
	if len(twice) != 1 || !strings.Contains(strings.Join(twice[0].Locks, " "), "table_lock") {
		t.Errorf("writer-preferring rwlock read twice: want one warning on table_lock, got %v", fs)
	}
	if _, fs := traceLifetimes(t, prog, "reader"); len(fs) != 0 {
		t.Errorf("reader-preferring rwlock read twice: want no finding, got %v", fs)
	}
}

// TestReinitialisedMutex: a -> b, destroy and re-initialise both in place,
// then a -> b and b -> a: a cycle between the new mutexes, in both modes
// (the kernel's chain cache once hid the new a -> b).
func TestReinitialisedMutex(t *testing.T) {
	testenv.RequireBPF(t)
	_, fs := traceLifetimes(t, testenv.Program(t, "lifetimes"), "remutex")
	cycles := ofKind(fs, "lock-order-cycle", "error")
	// The second lifetimes are named #2: the first ones took no b -> a.
	if len(cycles) != 1 || !sameSet(cycles[0].Locks, []string{"mutex_a (lifetimes) #2", "mutex_b (lifetimes) #2"}) {
		t.Errorf("want one cycle between the new mutex_a and mutex_b, got %v", fs)
	}
}

// TestLockInUnmappedMemory: zeroed mutexes a -> b in a mapping the
// program unmaps and maps again at the same address; new mutexes there
// taken c -> d (a's and b's addresses: the pattern a -> b was) and d -> c.
// That is a cycle between the new mutexes, and only the munmap tells them
// from the old: in aggregate mode a chain cache that missed it would hide
// c -> d as a repeat. The eBPF recorder sees the syscall, the preload
// recorder its libc wrapper, and under auto, where the kernel records it,
// the wrapper still ends the old mutexes in the library's chain cache.
func TestLockInUnmappedMemory(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "lifetimes")
	for _, r := range traceRunsUnder(t, withAuto, nil, prog, "unmapped") {
		cs := ofKind(r.fs, "lock-order-cycle", "error")
		if len(cs) != 1 || !strings.Contains(strings.Join(cs[0].Locks, " "), "#2") {
			t.Errorf("%s: want one cycle between the second lifetimes, got %v", r, r.fs)
		}
		if r.rep.Stats.Calls["munmap"] == 0 {
			t.Errorf("%s: the program's munmap was not seen: %v", r, r.rep.Stats.Calls)
		}
	}
}

// TestLockOnPageTheHeapTookOver: a mutex in a file's mapping, which the
// eBPF recorder classifies as static data (no free can end a lock there);
// the mapping unmapped and the heap grown over its page; zeroed mutexes in
// chunks on that page taken a -> b, freed, and made again at each other's
// addresses, taken c -> d. No cycle, in every mode: the page was once
// classified as static data, and the chain cache must not keep that past
// the munmap, or in aggregate mode the frees go unsent and c -> d closes a
// cycle with a -> b.
func TestLockOnPageTheHeapTookOver(t *testing.T) {
	testenv.RequireBPF(t)
	runs, _ := traceLifetimes(t, testenv.Program(t, "lifetimes"), "reheaped")
	for _, r := range runs {
		if cs := ofKind(r.fs, "lock-order-cycle", "error"); len(cs) != 0 {
			t.Errorf("%s: new mutexes at old addresses make a cycle: %v", r, r.fs)
		}
		if r.rep.Stats.Calls["munmap"] == 0 {
			t.Errorf("%s: the program's munmap was not seen: %v", r, r.rep.Stats.Calls)
		}
	}
}

// TestKeptInitUsedByAnotherThread: in aggregate mode the eBPF recorder
// keeps an init back at an address whose last lifetime ended, until
// something uses the lock. A mutex made and destroyed unused at one heap
// address, then made there again and taken by another thread, which made
// no call since it was made: the init goes first, so every way of
// recording finds the one cycle with the mutex named by where it was made.
func TestKeptInitUsedByAnotherThread(t *testing.T) {
	testenv.RequireBPF(t)
	runs, _ := traceLifetimes(t, testenv.Program(t, "lifetimes"), "handoff")
	for _, r := range runs {
		cs := ofKind(r.fs, "lock-order-cycle", "error")
		// make_shared's call is a tail call: the init's caller is handoff.
		if len(cs) != 1 || len(r.fs) != 1 || len(cs[0].Locks) != 2 || !slices.ContainsFunc(cs[0].Locks, func(l string) bool {
			return strings.HasPrefix(l, "mutex initialised at handoff+") && strings.HasSuffix(l, " (lifetimes)")
		}) || !slices.Contains(cs[0].Locks, "order_y (lifetimes)") {
			t.Errorf("%s: want one cycle between the made mutex and order_y, got%s %v", r, verdicts(r.fs), cs)
		}
		if c := r.rep.Stats.Calls; c["pthread_mutex_init"] != 5 || c["pthread_mutex_destroy"] != 5 {
			t.Errorf("%s: calls %v, want 5 inits and 5 destroys", r, c)
		}
	}
}
