package analyzer

import (
	"fmt"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// Peer suites, in this repository's words: the scenarios of
// ThreadSanitizer's deadlock-detector stress test and liblockdep's test
// sequences, as event sequences. Where hooktrace deliberately answers
// otherwise, the case asserts hooktrace's answer and says why (see also
// the package documentation, "Peers").

// peerKind is how a scenario's locks are taken.
type peerKind int

const (
	peerMutex peerKind = iota
	peerSpin
	peerRwWrite
	peerRecursive
)

func (k peerKind) String() string {
	return [...]string{"mutex", "spinlock", "rwlock", "recursive mutex"}[k]
}

func peerAddr(i int) uint64 { return 0x700000 + uint64(i)*0x40 }

func peerLock(b *tracebuild.Trace, k peerKind, tid uint32, i int) {
	addr := peerAddr(i)
	fn := fmt.Sprintf("take_%d", i)
	switch k {
	case peerSpin:
		b.Event(events.Event{TID: tid, Op: events.OpSpinLock, Flags: events.FlagAcquired, Addr: addr}, "pthread_spin_lock"+libc, fn)
	case peerRwWrite:
		b.RWLock(tid, events.OpRwlockWrlock, addr, 0, "pthread_rwlock_wrlock"+libc, fn)
	case peerRecursive:
		b.LockKind(tid, addr, events.MutexRecursive, "pthread_mutex_lock"+libc, fn)
	default:
		b.Lock(tid, addr, "pthread_mutex_lock"+libc, fn)
	}
}

func peerUnlock(b *tracebuild.Trace, k peerKind, tid uint32, i int) {
	op := events.OpMutexUnlock
	switch k {
	case peerSpin:
		op = events.OpSpinUnlock
	case peerRwWrite:
		op = events.OpRwlockUnlock
	}
	b.Event(events.Event{TID: tid, Op: op, Addr: peerAddr(i)})
}

// pair: tid takes i, then j, and releases both.
func pair(b *tracebuild.Trace, k peerKind, tid uint32, i, j int) {
	peerLock(b, k, tid, i)
	peerLock(b, k, tid, j)
	peerUnlock(b, k, tid, j)
	peerUnlock(b, k, tid, i)
}

// TestPeerTSanStress: ThreadSanitizer's deadlock-detector stress
// scenarios, for every kind of lock it runs them with.
func TestPeerTSanStress(t *testing.T) {
	var cases []ruleCase
	for _, k := range []peerKind{peerMutex, peerSpin, peerRwWrite, peerRecursive} {
		k := k
		cases = append(cases,
			ruleCase{
				name:  k.String() + ": two locks inverted on two threads",
				build: func(b *tracebuild.Trace) { pair(b, k, 1, 0, 1); pair(b, k, 2, 1, 0) },
				want:  []want{{KindLockOrderCycle, SeverityError}},
			},
			ruleCase{
				name:  k.String() + ": two locks inverted on one thread",
				build: func(b *tracebuild.Trace) { pair(b, k, 1, 0, 1); pair(b, k, 1, 1, 0) },
				want:  []want{{KindLockOrderCycle, SeverityError}},
			},
			ruleCase{
				name:  k.String() + ": three locks in a ring",
				build: func(b *tracebuild.Trace) { pair(b, k, 1, 0, 1); pair(b, k, 2, 1, 2); pair(b, k, 3, 2, 0) },
				want:  []want{{KindLockOrderCycle, SeverityError}},
				check: lockCount(3),
			},
			ruleCase{
				name: k.String() + ": one order everywhere",
				build: func(b *tracebuild.Trace) {
					for tid := uint32(1); tid <= 4; tid++ {
						pair(b, k, tid, 0, 1)
						pair(b, k, tid, 1, 2)
						pair(b, k, tid, 0, 2)
					}
				},
			},
			ruleCase{
				// The same pair seen many times: one finding.
				name: k.String() + ": an inversion repeated",
				build: func(b *tracebuild.Trace) {
					for n := 0; n < 50; n++ {
						pair(b, k, 1, 0, 1)
						pair(b, k, 2, 1, 0)
					}
				},
				want: []want{{KindLockOrderCycle, SeverityError}},
			},
		)
	}
	trylock := func(b *tracebuild.Trace, tid uint32, i int, ok bool) {
		b.TryResult(tid, events.OpMutexTrylock, peerAddr(i), ok, "pthread_mutex_trylock"+libc, fmt.Sprintf("try_%d", i))
	}
	cases = append(cases,
		ruleCase{
			// A trylock cannot wait: no edge into the tried lock.
			name: "trylock under a lock adds no edge into it",
			build: func(b *tracebuild.Trace) {
				peerLock(b, peerMutex, 1, 0)
				trylock(b, 1, 1, true)
				peerUnlock(b, peerMutex, 1, 1)
				peerUnlock(b, peerMutex, 1, 0)
				pair(b, peerMutex, 2, 1, 0)
			},
		},
		ruleCase{
			// Once it succeeded the lock is held: later locks depend on it.
			name: "trylocked lock is held: edges out of it",
			build: func(b *tracebuild.Trace) {
				trylock(b, 1, 0, true)
				peerLock(b, peerMutex, 1, 1)
				peerUnlock(b, peerMutex, 1, 1)
				peerUnlock(b, peerMutex, 1, 0)
				pair(b, peerMutex, 2, 1, 0)
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
		},
		ruleCase{
			name: "failed trylock holds nothing",
			build: func(b *tracebuild.Trace) {
				trylock(b, 1, 0, false)
				peerLock(b, peerMutex, 1, 1)
				peerUnlock(b, peerMutex, 1, 1)
				pair(b, peerMutex, 2, 1, 0)
			},
		},
		ruleCase{
			// TSan reports read-lock inversions of any rwlock. glibc's
			// default rwlocks prefer readers: a reader never waits for a
			// reader, so this cannot deadlock, and hooktrace is silent.
			name: "read-read inversion of reader-preferring rwlocks (differs from TSan)",
			build: func(b *tracebuild.Trace) {
				for _, p := range [][2]int{{0, 1}, {1, 0}} {
					tid := uint32(p[0] + 1)
					b.RWLock(tid, events.OpRwlockRdlock, peerAddr(p[0]), 0, "pthread_rwlock_rdlock"+libc, "reader")
					b.RWLock(tid, events.OpRwlockRdlock, peerAddr(p[1]), 0, "pthread_rwlock_rdlock"+libc, "reader")
					b.RWUnlock(tid, peerAddr(p[1])).RWUnlock(tid, peerAddr(p[0]))
				}
			},
		},
		ruleCase{
			name: "read-read inversion of writer-preferring rwlocks",
			build: func(b *tracebuild.Trace) {
				for _, p := range [][2]int{{0, 1}, {1, 0}} {
					tid := uint32(p[0] + 1)
					b.RWLock(tid, events.OpRwlockRdlock, peerAddr(p[0]), rwlockPreferWriterNonrecursive, "pthread_rwlock_rdlock"+libc, "reader")
					b.RWLock(tid, events.OpRwlockRdlock, peerAddr(p[1]), rwlockPreferWriterNonrecursive, "pthread_rwlock_rdlock"+libc, "reader")
					b.RWUnlock(tid, peerAddr(p[1])).RWUnlock(tid, peerAddr(p[0]))
				}
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
		},
	)
	// Long cycles: lock i then i+1 on thread i, and the last back to the
	// first, for every length up to 30.
	for n := 2; n <= 30; n++ {
		n := n
		cases = append(cases, ruleCase{
			name: fmt.Sprintf("cycle of %d locks", n),
			build: func(b *tracebuild.Trace) {
				for i := 0; i < n; i++ {
					pair(b, peerMutex, uint32(i+1), i, (i+1)%n)
				}
			},
			want:  []want{{KindLockOrderCycle, SeverityError}},
			check: lockCount(n),
		})
	}
	// TSan's detector keeps a bounded lock graph and forgets its edges
	// once more than 4096 locks were seen; hooktrace keeps every edge, so
	// an inversion still shows after thousands of other locks.
	cases = append(cases, ruleCase{
		name: "inversion after 5000 other locks (differs from TSan)",
		build: func(b *tracebuild.Trace) {
			pair(b, peerMutex, 1, 0, 1)
			for i := 2; i < 5002; i++ {
				pair(b, peerMutex, 2, 2+(i%2), i+10)
			}
			pair(b, peerMutex, 3, 1, 0)
		},
		want:  []want{{KindLockOrderCycle, SeverityError}},
		check: lockCount(2),
	})
	runRuleCases(t, cases)
}

func lockCount(n int) func(t *testing.T, res *Result) {
	return func(t *testing.T, res *Result) {
		if f := res.Findings[0]; len(f.Locks) != n || len(f.Edges) != n {
			t.Errorf("want %d locks and edges, got %d / %d: %s", n, len(f.Locks), len(f.Edges), f.Title)
		}
	}
}

// seq runs liblockdep's notation on one thread: "AB" takes A then B and
// releases both, in pairs.
func seq(b *tracebuild.Trace, pairs ...string) {
	for _, p := range pairs {
		pair(b, peerMutex, 1, int(p[0]-'A'), int(p[1]-'A'))
	}
}

// TestPeerLiblockdep: liblockdep's sequences, each on one thread as
// liblockdep runs them.
func TestPeerLiblockdep(t *testing.T) {
	cycle := func(locks ...string) func(t *testing.T, res *Result) {
		return func(t *testing.T, res *Result) {
			f := ofKind(res, KindLockOrderCycle)[0]
			got := f.Locks
			if len(got) != len(locks) {
				t.Errorf("cycle %v, want %d locks %v", got, len(locks), locks)
			}
			for _, l := range locks {
				if !anyContains(got, l) {
					t.Errorf("cycle %v lacks %s", got, l)
				}
			}
		}
	}
	cases := []ruleCase{
		{
			name: "AA",
			build: func(b *tracebuild.Trace) {
				peerLock(b, peerMutex, 1, 0)
				peerLock(b, peerMutex, 1, 0)
			},
			want: []want{{KindSelfDeadlock, SeverityError}},
		},
		{name: "ABBA", build: func(b *tracebuild.Trace) { seq(b, "AB", "BA") }, want: []want{{KindLockOrderCycle, SeverityError}}},
		{name: "ABBCCA", build: func(b *tracebuild.Trace) { seq(b, "AB", "BC", "CA") }, want: []want{{KindLockOrderCycle, SeverityError}}},
		{name: "ABBCCDDA", build: func(b *tracebuild.Trace) { seq(b, "AB", "BC", "CD", "DA") }, want: []want{{KindLockOrderCycle, SeverityError}}},
		{name: "ABCABC", build: func(b *tracebuild.Trace) { seq(b, "AB", "CA", "BC") }, want: []want{{KindLockOrderCycle, SeverityError}}},
		{
			name:  "ABCDBCDA",
			build: func(b *tracebuild.Trace) { seq(b, "AB", "CD", "BC", "DA") },
			want:  []want{{KindLockOrderCycle, SeverityError}},
			check: cycle("take_0", "take_1", "take_2", "take_3"),
		},
		{
			// C → D is on no cycle: A → B → D → A is.
			name:  "ABCDBDDA",
			build: func(b *tracebuild.Trace) { seq(b, "AB", "CD", "BD", "DA") },
			want:  []want{{KindLockOrderCycle, SeverityError}},
			check: cycle("take_0", "take_1", "take_3"),
		},
		{
			// liblockdep reports a recursive write lock as a deadlock.
			// glibc's rwlock knows its writer and fails the second call
			// with EDEADLK: no hang, but code that ignores the result runs
			// unprotected, so hooktrace warns.
			name: "WW (differs from liblockdep: glibc returns EDEADLK)",
			build: func(b *tracebuild.Trace) {
				peerLock(b, peerRwWrite, 1, 0)
				peerLock(b, peerRwWrite, 1, 0)
			},
			want: []want{{KindSelfDeadlock, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				if !strings.Contains(res.Findings[0].Detail, "EDEADLK") {
					t.Errorf("detail %s", res.Findings[0].Detail)
				}
			},
		},
		{
			// An unlock of a lock the thread does not hold. liblockdep
			// calls it a bad unlock balance; so does hooktrace, in a
			// complete trace (lock misuse), and draws no other finding
			// from it.
			name:   "unlock balance",
			header: &events.Header{Command: []string{"./unlock_balance"}},
			build: func(b *tracebuild.Trace) {
				peerLock(b, peerMutex, 1, 0)
				peerUnlock(b, peerMutex, 1, 0)
				peerUnlock(b, peerMutex, 1, 0)
			},
			want: []want{{KindLockMisuse, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				if res.Stats.LockMisuse.UnheldUnlocks != 1 || res.Stats.TraceChecks.Total() != 0 {
					t.Errorf("misuse %+v, checks %+v", res.Stats.LockMisuse, res.Stats.TraceChecks)
				}
			},
		},
	}
	runRuleCases(t, cases)
}
