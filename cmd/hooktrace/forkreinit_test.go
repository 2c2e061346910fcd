//go:build linux && amd64

package main

import (
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestForkChildReinitialisesHeldLock: jemalloc's fork discipline (its
// own test/unit/fork showed it). pthread_atfork's prepare handler takes a
// library mutex, and the child's handler initialises it again instead of
// unlocking it; the child then takes it. The child's re-initialised lock
// starts unheld: every recorder and mode once reported "took lib_lock
// while holding it, and went on", a trace inconsistency.
func TestForkChildReinitialisesHeldLock(t *testing.T) {
	prog := testenv.Program(t, "forkreinit")
	for _, recorder := range []string{"preload", "ebpf"} {
		for _, mode := range []string{"full", "aggregate"} {
			t.Run(recorder+" "+mode, func(t *testing.T) {
				if recorder == "ebpf" {
					testenv.RequireBPF(t)
				}
				out, stdout, stderr, code := runJSON(t, "--recorder", recorder, "--mode", mode, "--follow-forks",
					"--fail-on", "info", "--", prog, "3")
				if code != 0 || stdout != "forks 3\n" {
					t.Fatalf("exit %d, output %q\n%s", code, stdout, stderr)
				}
				rep := parseReport(t, out)
				if len(rep.Findings) != 0 {
					t.Errorf("%d findings, want none\n%s", len(rep.Findings), stderr)
				}
				noTraceChecks(t, recorder+" "+mode, rep)
				noLockMisuse(t, recorder+" "+mode, rep)
				if c := rep.Stats.Calls; c["pthread_mutex_init"] != 3 || c["exec"] != 1 {
					t.Errorf("calls %v: want the 3 children's pthread_mutex_init", c)
				}
			})
		}
	}
}
