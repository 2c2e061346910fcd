package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The preload recorder's own tests: what it alone promises (no privilege,
// a ring that waits instead of dropping, a SIGKILLed target's records, the
// user's own LD_PRELOAD, the target's behaviour). The findings tests run
// every program under both recorders and compare them (traceRuns).

// asNobody returns argv run as user nobody when this test runs as root (an
// unprivileged user already is one), with prog made reachable.
func asNobody(t *testing.T, prog string, argv ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		return exec.Command(argv[0], argv[1:]...)
	}
	for d := filepath.Dir(prog); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	return exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, argv...)...)
}

// nobodyDir is a temporary directory user nobody can write to.
func nobodyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o777)
	}
	return dir
}

// nobodyReport is a path an ordinary user can write a JSON report to (run's
// stdout is the target's), and a reader of it.
func nobodyReport(t *testing.T) (path string, read func() string) {
	t.Helper()
	path = filepath.Join(nobodyDir(t), "report.json")
	return path, func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("reading the report: %v", err)
		}
		return string(b)
	}
}

// TestPreloadUnprivileged: an ordinary user runs hooktrace on the inversion
// program and gets the lock-order-cycle error, lock names and the functions
// that took each pair, recorded by the preloaded library.
func TestPreloadUnprivileged(t *testing.T) {
	prog := testenv.Program(t, "inversion")
	for _, recorder := range []string{"preload", "auto"} {
		t.Run(recorder, func(t *testing.T) {
			report, read := nobodyReport(t)
			cmd := asNobody(t, prog, hooktraceBin, "run", "--recorder", recorder, "--report", "json:"+report, "--fail-on", "none", "--", prog)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("hooktrace as nobody: %v", err)
			}
			out := read()
			rep := parseReport(t, out)
			if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
				t.Errorf("lost %d, complete %v", rep.Stats.LostEvents, rep.Stats.Complete)
			}
			if rep.Stats.Calls["pthread_mutex_lock"] != 4 || rep.Stats.Calls["pthread_mutex_unlock"] != 4 ||
				rep.Stats.Calls["thread_create"] != 2 {
				t.Errorf("calls %v: want 4 locks, 4 unlocks, 2 thread creations", rep.Stats.Calls)
			}
			checkInversion(t, findings(t, out))
		})
	}
}

// TestPreloadRingFull: a 4K ring under 40,000 events in full mode. The
// preload recorder's writers wait for the reader instead of dropping, so
// the trace is complete and every malloc is an event.
func TestPreloadRingFull(t *testing.T) {
	prog := testenv.Program(t, "mallocs")
	stdout, _, stderr, code := runJSON(t, "--recorder", "preload", "--mode", "full", "--ring", "4K", "--ignore-target-status",
		"--fail-on", "none", "--", prog)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	rep := parseReport(t, stdout)
	if rep.Stats.LostEvents != 0 || !rep.Stats.Complete || rep.Stats.Calls["malloc"] != 10000 {
		t.Errorf("lost %d, complete %v, calls %v: want nothing lost and 10000 mallocs", rep.Stats.LostEvents, rep.Stats.Complete, rep.Stats.Calls)
	}
	if rep.Stats.Events < 40000 {
		t.Errorf("%d events in full mode, want at least 40000 (10000 malloc, free, lock, unlock)", rep.Stats.Events)
	}
}

// TestPreloadJemalloc: the user's own LD_PRELOAD is kept after the
// recorder's: jemalloc stays the allocator, the shim forwards to it, and
// every call is counted.
func TestPreloadJemalloc(t *testing.T) {
	traceJemalloc(t, "preload")
}

// TestPreloadSIGKILL: a target that dies by SIGKILL runs no exit handler;
// everything it recorded is in the shared memory and reaches the report.
func TestPreloadSIGKILL(t *testing.T) {
	prog := testenv.Program(t, "killself")
	stdout, _, stderr, code := runJSON(t, "--recorder", "preload", "--fail-on", "none", "--", prog)
	// The target's own death is run's status: 128+SIGKILL.
	if code != 137 {
		t.Fatalf("exit %d, want 137\n%s", code, stderr)
	}
	fs := ofKind(findings(t, stdout), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"kill_a (killself)", "kill_b (killself)"}) {
		t.Errorf("want the kill_a/kill_b inversion, got %v", fs)
	}
	var r struct {
		Stats struct {
			Calls  map[string]uint64 `json:"calls"`
			Traces []struct {
				ExitSignal string `json:"exit_signal"`
				Recorder   string `json:"recorder"`
			} `json:"traces"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Stats.Traces) != 1 || r.Stats.Traces[0].ExitSignal != "SIGKILL" || r.Stats.Traces[0].Recorder != "preload" {
		t.Errorf("traces %+v: want one, killed by SIGKILL, recorded by preload", r.Stats.Traces)
	}
	if r.Stats.Calls["pthread_mutex_lock"] != 4 || r.Stats.Calls["malloc"] != 1 {
		t.Errorf("calls %v: want 4 locks and 1 malloc", r.Stats.Calls)
	}
}

// TestPreloadHangUnprivileged: hang detection needs no privilege either
// (hooktrace is its own child's ptrace parent): as an ordinary user, a
// target that deadlocks for good is reported, with both threads' stacks
// and no frame of the recorder's library, and killed.
func TestPreloadHangUnprivileged(t *testing.T) {
	prog := testenv.Program(t, "deadlock")
	report, read := nobodyReport(t)
	cmd := asNobody(t, prog, hooktraceBin, "run", "--recorder", "preload", "--hang-timeout", "2s", "--report", "json:"+report, "--", prog)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	// Killed by hang detection: 128+SIGKILL, as the README says.
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 137 {
		t.Fatalf("exit %v, want 137\n%s", err, stderr.String())
	}
	out := read()
	if !strings.Contains(stderr.String(), "hooktrace: deadlock in pid") {
		t.Errorf("stderr does not say what happened:\n%s", stderr.String())
	}
	_, fs := findingsOf(t, out)
	f := checkDeadlockFinding(t, fs)
	for i := range f.Edges {
		if text := edgeStackText(&f.Edges[i]); strings.Contains(text, "libhooktrace_preload") {
			t.Errorf("edge %d shows the recorder's own frames:%s", i, text)
		}
	}
}

// TestPreloadBehaves: under the recorder, errno and the return values of
// the allocator and lock calls are the untraced ones, and a signal handler
// that locks while the main thread is inside the recorder runs normally
// and is counted exactly.
func TestPreloadBehaves(t *testing.T) {
	prog := testenv.Program(t, "behaves")
	stdout, _, stderr, code := runJSON(t, "--recorder", "preload", "--fail-on", "none", "--", prog)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	var handled uint64
	if _, err := fmt.Sscanf(stderr[strings.Index(stderr, "handled "):], "handled %d", &handled); err != nil || handled == 0 {
		t.Fatalf("no signal handler runs reported (%v):\n%s", err, stderr)
	}
	var r struct {
		Stats struct {
			Calls  map[string]uint64 `json:"calls"`
			Traces []struct {
				ExitStatus *int `json:"exit_status"`
			} `json:"traces"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Stats.Traces) != 1 || r.Stats.Traces[0].ExitStatus == nil || *r.Stats.Traces[0].ExitStatus != 0 {
		t.Errorf("the program's own checks failed:\n%s", stderr)
	}
	// The main thread's trylock, then one per handler run; its unlocks:
	// one, 300000 in the loop, and one per handler run.
	if c := r.Stats.Calls; c["pthread_mutex_trylock"] != handled+1 || c["pthread_mutex_unlock"] != 300001+handled {
		t.Errorf("%d handler runs; calls %v", handled, c)
	}
}

// TestRecorderErrors: what cannot be recorded says why, in one line.
func TestRecorderErrors(t *testing.T) {
	prog := testenv.Program(t, "inversion")
	for _, c := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"unknown recorder", []string{"run", "--recorder", "bogus", "--", prog}, exitUsage, "want ebpf, preload or auto"},
		// progress_user is a tail call: its first instruction is a jump,
		// which would not do the same from a displaced copy.
		{"probe not displaceable", []string{"run", "--recorder", "preload", "--probe", "progress_user", "--", testenv.Program(t, "progress")}, exitFailure, "transfers control; use --recorder ebpf"},
		// The breakpoint cannot reach its handler: the kernel kills the
		// target with SIGTRAP (128+5), and run says why.
		{"probe with signals blocked", []string{"run", "--recorder", "preload", "--probe", "release_hook", "--", testenv.Program(t, "sigblocked")}, 133, "fatal in code that runs with signals blocked"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := hooktrace(t, nil, c.args...)
			if code != c.code || !strings.Contains(stderr, c.says) {
				t.Errorf("exit %d (want %d), stderr %q (want it to say %q)", code, c.code, stderr, c.says)
			}
		})
	}
	// What auto cannot preload: TestAutoNeedsEBPF.
}

// TestDemoUnprivileged: an ordinary user runs the demo and gets the same
// two verdicts as root: the legacy cache's cycle through vma_lock and the
// arena lock, through the hook inside free, and none for the fixed one.
func TestDemoUnprivileged(t *testing.T) {
	cache := t.TempDir()
	cmd := asNobody(t, cache+"/x", hooktraceBin, "demo", "--format", "json", "--cache-dir", cache)
	os.Chmod(cache, 0o777) // the demo compiles its cache there
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo as nobody: %v\n%s", err, stderr.String())
	}
	var both map[string]json.RawMessage
	if err := json.Unmarshal(out, &both); err != nil {
		t.Fatalf("demo output is not JSON: %v\n%s", err, out)
	}
	_, legacy := findingsOf(t, string(both["legacy"]))
	_, fixed := findingsOf(t, string(both["fixed"]))
	found := false
	for i := range legacy {
		f := &legacy[i]
		locks := strings.Join(f.Locks, "; ")
		if f.Kind == "lock-order-cycle" && f.Severity == "error" && strings.Contains(locks, "vma_lock (librcache.so)") && strings.Contains(locks, "arena") {
			found = true
			for j := range f.Edges {
				if strings.Contains(f.Edges[j].From, "arena") && (!edgeStackHas(&f.Edges[j], "rc_intercept_madvise") || !edgeStackHas(&f.Edges[j], "_int_free")) {
					t.Errorf("arena → vma_lock edge lacks the hook inside free:%s", edgeStackText(&f.Edges[j]))
				}
			}
		}
	}
	if !found {
		t.Errorf("legacy: no error cycle through vma_lock and the arena: %+v", legacy)
	}
	for _, f := range fixed {
		if f.Severity == "error" {
			t.Errorf("fixed: error finding %s: %s", f.Kind, f.Title)
		}
	}
}

// TestPreloadForbidUnprivileged: the UPC++ progress-level rule for an
// ordinary user. run_user_rpcs is called inside the executable (no PLT):
// the shim breaks on its entry in the process and resumes at a displaced
// copy of its first instruction (a rip-relative load, relocated), and
// swaps the return address for its exit. The finding is eBPF's: three
// nested calls, the stack through verify_segment to main; the fixed twin
// has none, and the program computes the same.
func TestPreloadForbidUnprivileged(t *testing.T) {
	prog := testenv.Program(t, "progress")
	run := func(args ...string) ([]finding, string) {
		report, read := nobodyReport(t)
		argv := append([]string{hooktraceBin, "run", "--recorder", "preload", "--forbid", "verify_segment>run_user_rpcs",
			"--report", "json:" + report, "--fail-on", "none", "--", prog}, args...)
		cmd := asNobody(t, prog, argv...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("hooktrace as nobody: %v\n%s", err, stderr.String())
		}
		out := read()
		return findings(t, out), stderr.String()
	}
	fs, stderr := run()
	if !strings.Contains(stderr, "rpcs 4") {
		t.Errorf("the program did not run as untraced:\n%s", stderr)
	}
	nest := ofKind(fs, "forbidden-nesting", "error")
	if len(nest) != 1 || !nest[0].edgeStackHas(0, "run_user_rpcs", "verify_segment", "main") {
		t.Fatalf("want 1 forbidden-nesting error through verify_segment and main, got %v", fs)
	}
	if fs, stderr := run("fixed"); len(ofKind(fs, "forbidden-nesting", "error")) != 0 || !strings.Contains(stderr, "rpcs 1") {
		t.Errorf("fixed: want no finding and rpcs 1, got %v\n%s", fs, stderr)
	}
}
