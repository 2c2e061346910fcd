package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// TestForkStorm: the target forks children in quick succession, each
// locking a mutex (with a malloc inside) a fixed number of times.
// --follow-forks holds each child at its birth until its probes are
// placed, so every lock call of every child is counted, in both modes, and
// full mode has each child's events. Run with -race it also checks that
// the gate placing a child's probes and the reader converting its events
// share no state unguarded (this crashed with "concurrent map writes").
// Under the preload recorder each child inherits the shared memory and
// writes its own records there. Both recorders, both modes.
func TestForkStorm(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "forkstorm")
	const children, iters = 50, 200
	run := func(t *testing.T, recorder, mode, trace string, args ...string) jsonReport {
		t.Helper()
		argv := append([]string{"--recorder", recorder, "--follow-forks", "--mode", mode, "--fail-on", "none", "-o", trace, "--", prog}, args...)
		stdout, _, stderr, code := runJSON(t, argv...)
		if code != 0 || strings.Contains(stderr, "DATA RACE") || strings.Contains(stderr, "fatal error") {
			t.Fatalf("run: exit %d\n%s", code, stderr)
		}
		rep := parseReport(t, stdout)
		if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
			t.Fatalf("lost %d events, complete=%v", rep.Stats.LostEvents, rep.Stats.Complete)
		}
		return rep
	}
	for _, recorder := range recorders {
		// The parent alone: its 100 locks and whatever glibc adds, the
		// same in both modes (stats.calls is exact in both).
		base := run(t, recorder, "aggregate", filepath.Join(t.TempDir(), "base.htr"), "0", "0").Stats.Calls
		for _, mode := range []string{"full", "aggregate"} {
			t.Run(recorder+" "+mode, func(t *testing.T) {
				trace := filepath.Join(t.TempDir(), "storm.htr")
				calls := run(t, recorder, mode, trace, fmt.Sprint(children), fmt.Sprint(iters)).Stats.Calls
				for _, op := range []string{"pthread_mutex_lock", "pthread_mutex_unlock", "malloc", "free"} {
					if want := base[op] + children*iters; calls[op] != want {
						t.Errorf("calls.%s = %d, want %d (%d + %d children x %d)", op, calls[op], want, base[op], children, iters)
					}
				}
				if calls["thread_create"] != children {
					t.Errorf("calls.thread_create = %d, want %d forks", calls["thread_create"], children)
				}
				if mode != "full" {
					return
				}
				evs, stacks, r := readTrace(t, trace)
				perPID := map[uint32]int{}
				for i := range evs {
					e := &evs[i]
					if e.Op == events.OpMutexLock && stackHas(stacks[e.Stack], "churn") {
						perPID[e.PID]++
					}
				}
				seen := 0
				for pid, n := range perPID {
					if pid == r.Header().PID {
						continue
					}
					seen++
					if n != iters {
						t.Errorf("child %d: %d lock events, want %d", pid, n, iters)
					}
				}
				if seen != children {
					t.Errorf("lock events from %d children, want %d", seen, children)
				}
			})
		}
	}
}
