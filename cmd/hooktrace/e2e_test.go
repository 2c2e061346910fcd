package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The end-to-end tests run the real hooktrace binary, with real probes,
// against C programs they build. They need root and eBPF; with CI set they
// fail rather than skip when those are missing.

var hooktraceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hooktrace-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by all: one test runs it as an unprivileged user.
	os.Chmod(dir, 0o755)
	hooktraceBin = filepath.Join(dir, "hooktrace")
	// The binary users get: static, as `make build` makes it. Not a race
	// build even when the tests are one: the race runtime needs cgo, so
	// the gate would run libc (its calls traced before the target's exec)
	// and the race runtime re-execs itself (a second exec in every trace).
	// The tracer's shared state is raced in-process by its own tests.
	//
	// HOOKTRACE_TEST_BIN names one built already (the kernel matrix runs
	// this test binary in VMs, where building is slow).
	if bin := os.Getenv("HOOKTRACE_TEST_BIN"); bin != "" {
		hooktraceBin = bin
	} else {
		build := exec.Command("go", "build", "-o", hooktraceBin, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building hooktrace: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := testenv.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// hooktrace runs the binary and returns stdout, stderr and the exit code.
func hooktrace(t *testing.T, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(hooktraceBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running hooktrace: %v", err)
	}
	return stdout.String(), stderr.String(), code
}

// runJSON runs `hooktrace run ARGS...` (its flags, "--", the command) with
// the JSON report written to a file, as run's stdout and stderr are the
// target's, and returns the report ("" when none was written), stdout,
// stderr and the exit status.
func runJSON(t *testing.T, args ...string) (report, stdout, stderr string, code int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.json")
	stdout, stderr, code = hooktrace(t, nil, append([]string{"run", "--report", "json:" + path}, args...)...)
	if b, err := os.ReadFile(path); err == nil {
		report = string(b)
	}
	return report, stdout, stderr, code
}

type jsonReport struct {
	Version int `json:"version"`
	Stats   struct {
		Events     uint64            `json:"events"`
		LostEvents uint64            `json:"lost_events"`
		Threads    int               `json:"threads"`
		Complete   bool              `json:"complete"`
		Incomplete string            `json:"incomplete"`
		Unrecorded uint64            `json:"unrecorded_processes"`
		ExitStatus *int              `json:"exit_status"`
		ExitSignal string            `json:"exit_signal"`
		Calls      map[string]uint64 `json:"calls"`
		// TraceChecks counts what contradicts the rest of the trace.
		TraceChecks map[string]uint64 `json:"trace_checks"`
		// LockMisuse counts the program's misused lock calls.
		LockMisuse map[string]uint64 `json:"lock_misuse"`
		Traces     []struct {
			Recorder   string `json:"recorder"`
			Allocator  string `json:"allocator"`
			StackReads string `json:"stack_reads"`
			ProbeTime  map[string]struct {
				Runs uint64 `json:"runs"`
				NS   uint64 `json:"ns"`
			} `json:"probe_time"`
		} `json:"traces"`
	} `json:"stats"`
	Findings []json.RawMessage `json:"findings"`
}

// noTraceChecks fails for a trace that contradicts itself: a nonzero count
// means the recorder lost or misattributed events.
func noTraceChecks(t *testing.T, what string, rep jsonReport) {
	t.Helper()
	for check, n := range rep.Stats.TraceChecks {
		if n != 0 {
			t.Errorf("%s: trace checks: %d %s", what, n, check)
		}
	}
}

// noLockMisuse fails for a trace of a program that uses its locks right
// but shows lock misuse: a recorder that misread a call (an init taken
// for an unlock) shows there in a complete trace.
func noLockMisuse(t *testing.T, what string, rep jsonReport) {
	t.Helper()
	for misuse, n := range rep.Stats.LockMisuse {
		if n != 0 {
			t.Errorf("%s: lock misuse: %d %s", what, n, misuse)
		}
	}
}

func parseReport(t *testing.T, out string) jsonReport {
	t.Helper()
	var r jsonReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	return r
}

// readTrace returns every record of a trace file, stacks by ID.
func readTrace(t *testing.T, path string) (evs []events.Event, stacks map[uint32]*events.Stack, r *events.Reader) {
	t.Helper()
	r, err := events.Open(path)
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	t.Cleanup(func() { r.Close() })
	stacks = map[uint32]*events.Stack{}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		switch rec.Kind {
		case events.RecEvent:
			evs = append(evs, rec.Event)
		case events.RecStack:
			s := *rec.Stack
			s.Frames = append([]events.Frame(nil), s.Frames...)
			stacks[s.ID] = &s
		}
	}
	return evs, stacks, r
}

func stackHas(s *events.Stack, fn string) bool {
	if s == nil {
		return false
	}
	for _, f := range s.Frames {
		if f.Function == fn {
			return true
		}
	}
	return false
}

func stackString(s *events.Stack) string {
	if s == nil {
		return "<none>"
	}
	var b strings.Builder
	for _, f := range s.Frames {
		fmt.Fprintf(&b, "\n  %#x %s+%#x (%s)", f.Addr, f.Function, f.Offset, filepath.Base(f.Object))
	}
	return b.String()
}

// TestRunCountsEveryMalloc: 4 threads make 2,500 malloc(777) calls each
// under a lock. Both recorders in both modes count every call; full mode
// sends each as an event, on a worker thread, with the caller in the
// stack. The aggregate mode sends the pattern (lock, malloc under it, from
// worker_alloc) once and counts its repeats where it is recorded, as
// lockdep's chain cache does.
func TestRunCountsEveryMalloc(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	for _, run := range []traced{{recorder: "ebpf", mode: "full"}, {recorder: "ebpf", mode: "aggregate"},
		{recorder: "preload", mode: "full"}, {recorder: "preload", mode: "aggregate"}} {
		mode := run.mode
		t.Run(run.String(), func(t *testing.T) {
			trace := filepath.Join(t.TempDir(), "m.htr")
			stdout, _, stderr, code := runJSON(t, "--recorder", run.recorder, "--mode", mode, "-o", trace, "--", prog)
			// The program exits 3: so does run.
			if code != 3 || !strings.Contains(stderr, "the target exited with status 3") {
				t.Fatalf("exit %d, want the target's 3\n%s", code, stderr)
			}
			tids := map[uint32]int{}
			for _, line := range strings.Split(stderr, "\n") {
				var tid uint32
				if _, err := fmt.Sscanf(line, "tid %d", &tid); err == nil {
					tids[tid] = 0
				}
			}
			if len(tids) != 4 {
				t.Fatalf("want 4 worker TIDs from the target, got %v\n%s", tids, stderr)
			}
			run.rep = parseReport(t, stdout)
			// The program's only malloc calls are these (glibc's own
			// start-up allocations use calloc and the loader's allocator).
			checkCalls(t, run, map[string]uint64{"malloc": 10000, "pthread_mutex_lock": 10000, "pthread_mutex_unlock": 10000, "thread_create": 4})
			if n := run.rep.Stats.Calls["malloc"]; n != 10000 {
				t.Errorf("calls.malloc = %d, want 10000", n)
			}
			evs, stacks, r := readTrace(t, trace)
			if f := r.Footer(); f == nil || f.ExitStatus == nil || *f.ExitStatus != 3 {
				t.Errorf("footer exit status: want 3, got %+v", f)
			}
			n777 := 0
			for i := range evs {
				e := &evs[i]
				if e.Op != events.OpMalloc || e.Size != 777 {
					continue
				}
				n777++
				if _, ok := tids[e.TID]; !ok {
					t.Fatalf("malloc(777) on thread %d, not a worker", e.TID)
				}
				tids[e.TID]++
				if !e.Has(events.FlagLocksHeld) {
					t.Fatalf("malloc(777) without FlagLocksHeld: %+v", e)
				}
				if !stackHas(stacks[e.Stack], "worker_alloc") {
					t.Fatalf("malloc(777) stack lacks worker_alloc:%s", stackString(stacks[e.Stack]))
				}
			}
			if mode == "aggregate" {
				if n777 == 0 || n777 > 4 {
					t.Errorf("aggregate: %d malloc(777) events, want the pattern once per process (at most once a thread)", n777)
				}
				return
			}
			if n777 != 10000 {
				t.Errorf("malloc(777) events = %d, want exactly 10000", n777)
			}
			for tid, n := range tids {
				if n != 2500 {
					t.Errorf("thread %d made %d malloc(777) calls, want 2500", tid, n)
				}
			}
		})
	}
}

// TestAttachLeavesTargetRight attaches to a program that checks its own
// arithmetic, detaches, and the program must still give the right answer.
// eBPF alone: attach has no other recorder (nothing can be preloaded into
// a running process).
func TestAttachLeavesTargetRight(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "arith")
	cmd := exec.Command(prog)
	stdin, _ := cmd.StdinPipe()
	stdoutPipe, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdoutPipe)
	if line, _ := out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("target said %q", line)
	}
	trace := filepath.Join(t.TempDir(), "a.htr")
	stdout, stderr, code := hooktrace(t, nil, "attach", "--pid", fmt.Sprint(cmd.Process.Pid),
		"--duration", "2s", "--format", "json", "-o", trace)
	if code != 0 {
		t.Fatalf("attach exit %d\n%s", code, stderr)
	}
	rep := parseReport(t, stdout)
	if rep.Stats.Calls["pthread_mutex_lock"] == 0 || rep.Stats.Calls["malloc"] == 0 {
		t.Errorf("attach saw no locks or mallocs: %v", rep.Stats.Calls)
	}
	// The target runs on, untraced, and must still be right.
	time.Sleep(200 * time.Millisecond)
	io.WriteString(stdin, "stop\n")
	rest, _ := io.ReadAll(out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("target after detach: %v\n%s", err, rest)
	}
	if !strings.HasPrefix(string(rest), "right: ") {
		t.Fatalf("target's answer after detach: %q", rest)
	}
	evs, _, _ := readTrace(t, trace)
	locks := 0
	for _, e := range evs {
		if e.Op == events.OpMutexLock {
			locks++
		}
	}
	if locks == 0 {
		t.Errorf("no pthread_mutex_lock events in the trace")
	}
}

// TestUserErrors: each error a user will hit gets one clear line and its
// own exit code.
func TestUserErrors(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no such pid", []string{"attach", "--pid", "999999999", "--duration", "1s"}, exitNoProcess, "no such process"},
		{"kernel thread", []string{"attach", "--pid", "2", "--duration", "1s"}, exitKernelTask, "kernel thread"},
		{"missing symbol", []string{"run", "--probe", "no_such_function_here", "--", prog}, exitNoSymbol, "no_such_function_here"},
		{"bad flag", []string{"run", "--no-such-flag", "--", prog}, exitUsage, "unknown flag"},
		{"missing pid flag", []string{"attach"}, exitUsage, "--pid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := hooktrace(t, nil, c.args...)
			if code != c.code || !strings.Contains(stderr, c.says) {
				t.Errorf("exit %d (want %d), stderr %q (want it to say %q)", code, c.code, stderr, c.says)
			}
		})
	}
	// Without privileges: as user nobody, no CAP_BPF (the preload
	// recorder needs none: TestPreloadUnprivileged).
	t.Run("not root", func(t *testing.T) {
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			hooktraceBin, "run", "--recorder", "ebpf", "--", "/bin/true").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitPermission || !strings.Contains(string(out), "CAP_BPF") {
			t.Errorf("as nobody: %v, %q; want exit %d naming CAP_BPF", err, out, exitPermission)
		}
	})
}
