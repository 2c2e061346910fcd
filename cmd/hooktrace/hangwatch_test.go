package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// findingsOf decodes a JSON report's findings.
func findingsOf(t *testing.T, out string) (jsonReport, []analyzer.Finding) {
	t.Helper()
	rep := parseReport(t, out)
	var fs []analyzer.Finding
	for _, raw := range rep.Findings {
		var f analyzer.Finding
		if err := json.Unmarshal(raw, &f); err != nil {
			t.Fatalf("finding: %v\n%s", err, raw)
		}
		fs = append(fs, f)
	}
	return rep, fs
}

func findingOfKind(fs []analyzer.Finding, kind analyzer.Kind) *analyzer.Finding {
	for i := range fs {
		if fs[i].Kind == kind {
			return &fs[i]
		}
	}
	return nil
}

func edgeStackHas(e *analyzer.Edge, fn string) bool {
	for _, f := range e.Stack {
		if f.Function == fn {
			return true
		}
	}
	return false
}

func edgeStackText(e *analyzer.Edge) string {
	var b strings.Builder
	for _, f := range e.Stack {
		fmt.Fprintf(&b, "\n    %s (%s)", f.Function, filepath.Base(f.Object))
	}
	return b.String()
}

// checkDeadlockFinding: the real deadlock of testdata/deadlock.c, both
// locks by name, each thread's stack with its function.
func checkDeadlockFinding(t *testing.T, fs []analyzer.Finding) *analyzer.Finding {
	t.Helper()
	f := findingOfKind(fs, analyzer.KindDeadlock)
	if f == nil {
		t.Fatalf("no deadlock finding: %+v", fs)
	}
	locks := strings.Join(f.Locks, "; ")
	if f.Severity != analyzer.SeverityError || len(f.Locks) != 2 ||
		!strings.Contains(locks, "accounts_lock (deadlock)") || !strings.Contains(locks, "ledger_lock (deadlock)") {
		t.Errorf("deadlock finding: severity %s, locks %v", f.Severity, f.Locks)
	}
	if len(f.Edges) != 2 || len(f.Threads) != 2 {
		t.Fatalf("want 2 edges and 2 threads, got %+v", f)
	}
	seen := map[string]bool{}
	for i := range f.Edges {
		e := &f.Edges[i]
		for _, fn := range []string{"post_to_ledger", "audit_accounts"} {
			if edgeStackHas(e, fn) {
				seen[fn] = true
				if !edgeStackHas(e, "pthread_mutex_lock") || e.StackTruncated {
					t.Errorf("edge %d's stack (truncated=%v):%s", i, e.StackTruncated, edgeStackText(e))
				}
			}
		}
	}
	if !seen["post_to_ledger"] || !seen["audit_accounts"] {
		t.Errorf("the stacks do not show both threads' functions: %v", seen)
	}
	return f
}

// TestRunCatchesRealDeadlock: a target that deadlocks for good must not
// hang run: under either recorder, hang detection reports the deadlock
// (the same finding), kills the target, and the trace explains it offline
// just as live.
func TestRunCatchesRealDeadlock(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "deadlock")
	ids := map[string]string{}
	for _, recorder := range recorders {
		t.Run(recorder, func(t *testing.T) { ids[recorder] = catchDeadlock(t, prog, recorder) })
	}
	if ids["ebpf"] != "" && ids["preload"] != "" && ids["ebpf"] != ids["preload"] {
		t.Errorf("the recorders disagree: ebpf %s, preload %s", ids["ebpf"], ids["preload"])
	}
}

// catchDeadlock runs the deadlocking prog under recorder, checks what hang
// detection did, and returns the deadlock finding's ID.
func catchDeadlock(t *testing.T, prog, recorder string) string {
	trace := filepath.Join(t.TempDir(), "t.htr")
	start := time.Now()
	stdout, _, stderr, code := runJSON(t, "--recorder", recorder, "--hang-timeout", "2s", "-o", trace, "--", prog)
	took := time.Since(start)
	// Killed by hooktrace with SIGKILL: the status of a target so killed.
	if code != 128+9 || !strings.Contains(stderr, "the target deadlocked and was killed by SIGKILL: exit status 137") {
		t.Fatalf("exit %d, want 137, the status of a target killed by SIGKILL\n%s", code, stderr)
	}
	if took < 2*time.Second || took > 30*time.Second {
		t.Errorf("run took %v: want the 2s timeout and then a prompt end", took)
	}
	if !strings.Contains(stderr, "hooktrace: deadlock in pid") || !strings.Contains(stderr, "killing pid") {
		t.Errorf("stderr does not say what happened:\n%s", stderr)
	}
	rep, fs := findingsOf(t, stdout)
	live := checkDeadlockFinding(t, fs)
	if rep.Stats.Calls["pthread_mutex_lock"] < 4 {
		t.Errorf("calls %v: the four lock calls were not traced", rep.Stats.Calls)
	}

	r, err := events.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := r.Next(); err != nil {
			break
		}
	}
	foot := r.Footer()
	r.Close()
	if foot == nil || foot.Hang == nil || foot.ExitSignal == "" || !strings.Contains(foot.Reason, "deadlock") {
		t.Fatalf("footer: %+v", foot)
	}
	if foot.Hang.Action != "kill" || len(foot.Hang.Threads) < 2 {
		t.Errorf("hang record: %+v", foot.Hang)
	}

	stdout, stderr, code = hooktrace(t, nil, "analyze", "--format", "json", trace)
	if code != exitFindings {
		t.Fatalf("analyze: exit %d\n%s", code, stderr)
	}
	_, fs = findingsOf(t, stdout)
	offline := checkDeadlockFinding(t, fs)
	if offline.ID != live.ID || offline.Title != live.Title {
		t.Errorf("offline finding %s %q differs from live %s %q", offline.ID, offline.Title, live.ID, live.Title)
	}
	return live.ID
}

// TestAttachDetachesFromDeadlock: attach's default on a hang is to report
// and detach; the target is left as it was, still there. eBPF alone, as
// attach is.
func TestAttachDetachesFromDeadlock(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "deadlock")
	cmd := exec.Command(prog)
	stderrPipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	if line, _ := bufio.NewReader(stderrPipe).ReadString('\n'); !strings.Contains(line, "threads started") {
		t.Fatalf("target said %q", line)
	}
	stdout, stderr, code := hooktrace(t, nil, "attach", "--pid", fmt.Sprint(cmd.Process.Pid),
		"--hang-timeout", "1s", "--duration", "60s", "--format", "json")
	if code != exitFindings {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "detaching") {
		t.Errorf("stderr: %s", stderr)
	}
	_, fs := findingsOf(t, stdout)
	checkDeadlockFinding(t, fs)
	// Detached, not killed: the process is still there.
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the target is gone after a detach: %v", err)
	}
	if state, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err != nil || strings.Contains(string(state), ") Z") {
		t.Errorf("the target is not alive after a detach: %s %v", state, err)
	}
}

func TestHangFlagErrors(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "deadlock")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"run", "--on-hang", "ignore", "--", prog}, "--on-hang"},
		{[]string{"run", "--hang-timeout", "-1s", "--", prog}, "--hang-timeout"},
		{[]string{"run", "--hang-timeout", "soon", "--", prog}, "hang-timeout"},
	} {
		_, stderr, code := hooktrace(t, nil, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.says) {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, stderr)
		}
	}
}
