//go:build linux && amd64

package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// TestRecursiveSpinlockInMunmapHook: UCX's pattern (a recursive spinlock
// over pthread_spin_lock/trylock, taken inside a munmap hook by several
// threads, some already holding it) under attach, then under run in both
// modes, with each recorder and auto. The program finishes, so no
// error-level finding can be true; a self-deadlock on the spinlock was
// reported here because glibc's pthread_spin_lock retries through its
// entry and its probe, past the entry, fired once per retry. The preload
// recorder sees neither the hook's recursive re-entry nor libc's call of
// munmap: it records the munmap free made once free returns. Under auto
// the kernel's tracepoint records that munmap too, and it was reported as
// outside the free (the allocator call ending there): a self-deadlock
// again, until the tracepoint read the shim's allocator state.
func TestRecursiveSpinlockInMunmapHook(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "ucxlock")
	cmd := exec.Command(prog)
	stdin, _ := cmd.StdinPipe()
	stderrPipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stderrPipe)
	if line, _ := out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("target said %q", line)
	}
	// Default settings: the test is only worth something on a complete
	// trace, and the default ring must give one (each hook path's raw
	// stack is copied once).
	stdout, stderr, code := hooktrace(t, nil, "attach", "--pid", fmt.Sprint(cmd.Process.Pid),
		"--duration", "2s", "--format", "json", "--fail-on", "none")
	io.WriteString(stdin, "stop\n")
	rest, _ := io.ReadAll(out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("target: %v\n%s", err, rest)
	}
	if code != 0 {
		t.Fatalf("attach exit %d\n%s", code, stderr)
	}
	checkNoErrors(t, "attach", parseReport(t, stdout), findings(t, stdout))

	for _, r := range traceRunsUnder(t, withAuto, nil, prog, "3000") {
		checkNoErrors(t, "run "+r.String(), r.rep, r.fs)
	}
}

// checkNoErrors holds a complete report of a program that finished to no
// error-level finding, and checks the spinlock was seen at work.
func checkNoErrors(t *testing.T, what string, rep jsonReport, fs []finding) {
	t.Helper()
	if rep.Stats.LostEvents != 0 {
		t.Fatalf("%s: %d events lost: the trace cannot show the findings are right", what, rep.Stats.LostEvents)
	}
	if rep.Stats.Calls["pthread_spin_lock"] == 0 || rep.Stats.Calls["munmap"] == 0 {
		t.Errorf("%s: no spin locks or munmaps seen: %v", what, rep.Stats.Calls)
	}
	for _, f := range fs {
		if f.Severity == "error" {
			t.Errorf("%s: impossible finding in a program that finished: %s", what, f.Title)
		}
	}
	// The wrapper is recursive: the hook taking it inside an allocator
	// call its holder made is a warning (the hook runs inside the critical
	// section), or the info-level sighting when no call under it was seen.
	hook := append(ofKind(fs, "hook-lock", "warning"), ofKind(fs, "hook-lock", "info")...)
	if len(hook) == 0 || !strings.Contains(strings.Join(hook[0].Locks, " "), "event_lock") {
		var seen []string
		for _, f := range fs {
			seen = append(seen, f.Severity+" "+f.Kind+": "+f.Title)
		}
		t.Errorf("%s: the hook's event_lock inside free was not reported; findings: %q", what, seen)
	}
}
