//go:build linux && amd64

package main

import (
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestSpinlockWords traces testdata/spinlocks.c under both recorders and
// both modes. glibc 2.36's pthread_spin_init is pthread_spin_unlock's
// code, storing 1 (unlocked); the eBPF recorder must take a call there
// for a release only when a thread holds the lock. Read the other way,
// each init of reused memory (TSan's Test14 and Test18, locks on reused
// stack) was an unlock of an unheld lock, and locks at reused stack
// addresses one lock whose order two functions reversed: a cycle. Every
// run must count each call as the program made it, find no misuse (the
// trace helpers check it), and agree with the others (traceRuns).
func TestSpinlockWords(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "spinlocks")
	const n = 200
	type calls struct{ init, destroy, lock, unlock uint64 }
	create := calls{init: 4 * n * 10, destroy: 4 * n * 10}
	reinit := calls{init: 4 * (4 + n*4), destroy: 4 * (n*4 + 4), lock: 4 * n * 4, unlock: 4 * n * 4}
	stack := calls{init: n * 4, lock: n * 4, unlock: n * 4}
	zeroed := calls{init: 2, lock: 2, unlock: 2}
	inverse := calls{init: 2, lock: 4, unlock: 4}
	sum := func(cs ...calls) calls {
		var s calls
		for _, c := range cs {
			s.init, s.destroy, s.lock, s.unlock = s.init+c.init, s.destroy+c.destroy, s.lock+c.lock, s.unlock+c.unlock
		}
		return s
	}
	for _, c := range []struct {
		mode   string
		calls  calls
		cycles int // lock-order-cycle errors, between spin_a and spin_b
	}{
		{"create", create, 0},
		{"reinit", reinit, 0},
		{"stack", stack, 0},
		{"zeroed", zeroed, 0},
		{"all", sum(create, reinit, stack, zeroed, inverse), 1},
	} {
		t.Run(c.mode, func(t *testing.T) {
			for _, r := range traceRuns(t, nil, prog, c.mode, "200") {
				got := r.rep.Stats.Calls
				if g := (calls{got["pthread_spin_init"], got["pthread_spin_destroy"], got["pthread_spin_lock"], got["pthread_spin_unlock"]}); g != c.calls {
					t.Errorf("%s: calls %+v, want %+v", r, g, c.calls)
				}
				// Aggregate mode sends no lifetime nobody used, under
				// either recorder: two records an address, not two a
				// lifetime.
				if c.mode == "create" && r.mode == "aggregate" && r.rep.Stats.Events > c.calls.init/10 {
					t.Errorf("%s: %d events for %d unused lifetimes", r, r.rep.Stats.Events, c.calls.init)
				}
				cycles := ofKind(r.fs, "lock-order-cycle", "error")
				if len(cycles) != c.cycles || len(r.fs) != c.cycles {
					t.Errorf("%s: want %d lock-order-cycle errors and nothing else, got%s", r, c.cycles, verdicts(r.fs))
					continue
				}
				for _, f := range cycles {
					if locks := strings.Join(f.Locks, " "); !strings.Contains(locks, "spin_a") || !strings.Contains(locks, "spin_b") {
						t.Errorf("%s: a cycle between %v, want spin_a and spin_b", r, f.Locks)
					}
				}
			}
		})
	}
}
