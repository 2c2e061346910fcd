package main

import (
	"slices"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestLockMisuse traces each case of testdata/misuse.c (Helgrind's and
// liblockdep's misuse cases) under both recorders and both modes: one
// lock-misuse warning, the same everywhere, naming the lock, the function
// that made the call and, where a thread held the lock, the one that took
// it; counted in stats.lock_misuse, with no trace check. The same locks
// used right give nothing.
func TestLockMisuse(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "misuse")
	for _, c := range []struct {
		arg   string
		title string // "" for no finding
		call  string // on the call's stack
		held  string // on the holder's acquisition stack; "" for no holder
		count string // the stats.lock_misuse counter
	}{
		{"never", "unlock of never_locked (misuse), which no thread held", "bogus_unlock", "", "unheld_unlocks"},
		{"twice", "unlock of balance_mu (misuse), which no thread held", "unbalanced_unlock", "", "unheld_unlocks"},
		{"foreign", "unlock of handoff_mu (misuse), held by another thread", "handoff_release", "handoff_take", "foreign_unlocks"},
		{"destroy", "destroy of doomed_mu (misuse), held by the destroying thread", "doomed_teardown", "main", "held_destroys"},
		{"rwdestroy", "destroy of table_rw (misuse), held by another thread", "table_drop", "table_write", "held_destroys"},
		{"rwnever", "unlock of idle_rw (misuse), which no thread held", "idle_unlock", "", "unheld_unlocks"},
		{"spinforeign", "unlock of handoff_spin (misuse), held by another thread", "spin_release", "spin_take", "foreign_unlocks"},
		{"clean", "", "", "", ""},
	} {
		t.Run(c.arg, func(t *testing.T) {
			for _, r := range traceRuns(t, nil, prog, c.arg) {
				if r.rep.Stats.LostEvents != 0 || !r.rep.Stats.Complete {
					t.Fatalf("%s: lost %d, complete %v", r, r.rep.Stats.LostEvents, r.rep.Stats.Complete)
				}
				var total uint64
				for _, n := range r.rep.Stats.LockMisuse {
					total += n
				}
				if c.title == "" {
					if len(r.fs) != 0 || total != 0 {
						t.Errorf("%s: the locks used right gave%s, misuse %v", r, verdicts(r.fs), r.rep.Stats.LockMisuse)
					}
					continue
				}
				if len(r.fs) != 1 || total != 1 || r.rep.Stats.LockMisuse[c.count] != 1 {
					t.Fatalf("%s: want one lock-misuse warning counted as %s, got%s, misuse %v", r, c.count, verdicts(r.fs), r.rep.Stats.LockMisuse)
				}
				f := r.fs[0]
				if f.Kind != "lock-misuse" || f.Severity != "warning" || f.Title != c.title || len(f.Edges) != 1 || !f.edgeStackHas(0, c.call) {
					t.Errorf("%s: %s %s: %s (want %q, %s on the call's stack) %v", r, f.Severity, f.Kind, f.Title, c.title, c.call, f.Edges)
				}
				held := f.Edges[0].HeldStack
				if has := slices.ContainsFunc(held, func(fr frame) bool { return fr.Function == c.held }); (c.held == "") != (len(held) == 0) || (c.held != "" && !has) {
					t.Errorf("%s: the holder's stack %v, want %q on it", r, held, c.held)
				}
			}
		})
	}
}
