package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// TestFollowForks: a child process's lock inversion is seen only with
// --follow-forks; its probes are placed before it runs.
func TestFollowForks(t *testing.T) {
	requireBPF(t)
	prog := buildC(t, "forker")
	fs := ofKind(traceFindings(t, []string{"--follow-forks"}, prog), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"fork_a (forker)", "fork_b (forker)"}) || !fs[0].edgeStackHas(0, "both_orders") {
		t.Fatalf("--follow-forks: want the child's fork_a/fork_b inversion from both_orders, got %v", fs)
	}
	if fs := ofKind(traceFindings(t, nil, prog), "lock-order-cycle", "error"); len(fs) != 0 {
		t.Errorf("without --follow-forks the child is not traced, got %v", fs)
	}
}

// TestExecMidTrace: the target execs another program; the trace goes on
// in the new image (same PID) and finds its inversion, named after the new
// image's symbols.
func TestExecMidTrace(t *testing.T) {
	requireBPF(t)
	execer, inversion := buildC(t, "execer"), buildC(t, "inversion")
	fs := ofKind(traceFindings(t, nil, execer, inversion), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"lock_a (inversion)", "lock_b (inversion)"}) {
		t.Fatalf("want the exec'd program's inversion, got %v", fs)
	}
}

// TestDamagedTraces: a trace cut short (the tracer was killed) is analyzed
// up to its last whole block with a warning, and the report says it is
// incomplete; a corrupted one fails with the offset, exit 3.
func TestDamagedTraces(t *testing.T) {
	requireBPF(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "whole.htr")
	if _, stderr, code := hooktrace(t, nil, "run", "--mode", "full", "-o", trace, "--fail-on", "none", "--", buildC(t, "mallocs")); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.htr")
	os.WriteFile(cut, data[:len(data)*2/3], 0o644)
	stdout, stderr, code := hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", cut)
	if code != 0 || !strings.Contains(stderr, "truncated") {
		t.Fatalf("cut trace: exit %d, stderr %q", code, stderr)
	}
	rep := parseReport(t, stdout)
	if rep.Stats.Complete || rep.Stats.Events == 0 {
		t.Errorf("cut trace: complete=%v events=%d; want incomplete with the events before the cut", rep.Stats.Complete, rep.Stats.Events)
	}

	bad := append([]byte(nil), data...)
	bad[len(bad)/2] ^= 0x40
	corrupt := filepath.Join(dir, "corrupt.htr")
	os.WriteFile(corrupt, bad, 0o644)
	_, stderr, code = hooktrace(t, nil, "analyze", corrupt)
	if code != exitFailure || !strings.Contains(stderr, "corrupt at offset") {
		t.Errorf("corrupt trace: exit %d (want %d), stderr %q", code, exitFailure, stderr)
	}
}

// TestGoTarget: a Go program gets no return probes (they corrupt Go
// stacks), is told so, and runs to its right answer.
func TestGoTarget(t *testing.T) {
	requireBPF(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	os.WriteFile(src, []byte("package main\n\nimport \"fmt\"\n\nfunc main() {\n\tsum := 0\n\tfor i := 1; i <= 100; i++ {\n\t\tsum += i\n\t}\n\tfmt.Println(\"sum\", sum)\n}\n"), 0o644)
	bin := filepath.Join(dir, "goprog")
	build := exec.Command("go", "build", "-o", bin, src)
	build.Dir = dir
	build.Env = append(os.Environ(), "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(hooktraceBin, "run", "--format", "json", "--", bin)
	out, err := cmd.Output()
	stderr := ""
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
		t.Fatalf("exit %d\n%s", ee.ExitCode(), stderr)
	}
	if !strings.HasPrefix(string(out), "sum 5050\n") {
		t.Errorf("the Go program's answer: %q", out)
	}
	cmd = exec.Command(hooktraceBin, "run", "--format", "json", "--", bin)
	b, _ := cmd.CombinedOutput()
	if !strings.Contains(string(b), "is a Go program: no return probes") {
		t.Errorf("no warning about return probes in a Go target:\n%s", b)
	}
}

// TestCxxProbe: --probe takes a demangled C++ name; every call of it is
// traced at entry and exit, with the demangled name in the stack.
func TestCxxProbe(t *testing.T) {
	requireBPF(t)
	prog := filepath.Join(t.TempDir(), "cxx")
	if b, err := exec.Command("g++", "-O2", "-g", "-fno-omit-frame-pointer", "-o", prog,
		filepath.Join("..", "..", "testdata", "cxx.cc")).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, b)
	}
	trace := filepath.Join(t.TempDir(), "c.htr")
	if _, stderr, code := hooktrace(t, nil, "run", "--mode", "full", "-o", trace, "--probe", "rc::Cache::insert", "--", prog); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	evs, stacks, r := readTrace(t, trace)
	if h := r.Header(); h == nil || len(h.UserProbes) != 1 || h.UserProbes[0] != "rc::Cache::insert" {
		t.Errorf("header's user probes: %+v", h)
	}
	enters, exits := 0, 0
	for _, e := range evs {
		switch e.Op {
		case events.OpProbeEnter:
			enters++
			if s := stacks[e.Stack]; s == nil || len(s.Frames) == 0 || s.Frames[0].Function != "rc::Cache::insert(long)" || !stackHas(s, "main") {
				t.Errorf("probe entry stack:%s", stackString(s))
			}
		case events.OpProbeExit:
			exits++
		}
	}
	if enters != 3 || exits != 3 {
		t.Errorf("rc::Cache::insert: %d entries and %d exits, want 3 and 3", enters, exits)
	}
}

// TestConstructorsAndStatic: locks taken in a constructor, before main,
// are traced (run starts at the first instruction), in a dynamic binary
// and in a static one whose allocator and pthreads are in the executable.
func TestConstructorsAndStatic(t *testing.T) {
	requireBPF(t)
	for _, static := range []bool{false, true} {
		name := "ctor"
		var extra []string
		if static {
			name, extra = "ctor_static", []string{"-static"}
		}
		t.Run(name, func(t *testing.T) {
			prog := filepath.Join(t.TempDir(), name)
			args := append([]string{"-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", prog,
				filepath.Join("..", "..", "testdata", "ctor.c")}, extra...)
			if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
				t.Fatalf("gcc: %v\n%s", err, b)
			}
			trace := filepath.Join(t.TempDir(), "c.htr")
			if _, stderr, code := hooktrace(t, nil, "run", "--mode", "full", "-o", trace, "--", prog); code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			r, err := events.Open(trace)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var early uint64
			stacks := map[uint32]*events.Stack{}
			locks, inCtor, mallocInCtor := 0, 0, 0
			for {
				rec, err := r.Next()
				if err != nil {
					break
				}
				switch rec.Kind {
				case events.RecStack:
					s := *rec.Stack
					stacks[s.ID] = &s
				case events.RecLockName:
					if rec.LockName.Name == "early_lock ("+name+")" {
						early = rec.LockName.Addr
					}
				case events.RecEvent:
					e := rec.Event
					if e.Op == events.OpMutexLock && e.Addr == early && early != 0 {
						locks++
						if stackHas(stacks[e.Stack], "before_main") {
							inCtor++
						}
					}
					if e.Op == events.OpMalloc && e.Size == 4321 && stackHas(stacks[e.Stack], "before_main") && e.Has(events.FlagLocksHeld) {
						mallocInCtor++
					}
				}
			}
			if locks != 3 || inCtor != 2 || mallocInCtor != 1 {
				t.Errorf("early_lock taken %d times (%d in the constructor), malloc(4321) under it in the constructor %d times; want 3, 2, 1", locks, inCtor, mallocInCtor)
			}
		})
	}
}

// TestPreloadedJemalloc: with jemalloc preloaded, malloc is jemalloc's (the
// first definition in the loader's search order), every call is traced
// there, and the trace says which allocator it is.
func TestPreloadedJemalloc(t *testing.T) {
	requireBPF(t)
	const je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	if _, err := os.Stat(je); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("libjemalloc2 is not installed: %v", err)
		}
		t.Skip("libjemalloc2 is not installed")
	}
	trace := filepath.Join(t.TempDir(), "je.htr")
	cmd := exec.Command(hooktraceBin, "run", "--mode", "full", "-o", trace, "--", buildC(t, "mallocs"))
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+je)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	evs, stacks, r := readTrace(t, trace)
	if h := r.Header(); h == nil || h.Allocator != "jemalloc" {
		t.Errorf("header allocator: %+v", h)
	}
	n := 0
	for _, e := range evs {
		if e.Op == events.OpMalloc && e.Size == 777 {
			n++
			if s := stacks[e.Stack]; s == nil || len(s.Frames) == 0 || !strings.Contains(s.Frames[0].Object, "jemalloc") {
				t.Fatalf("malloc(777) not in jemalloc:%s", stackString(s))
			}
		}
	}
	if n != 10000 {
		t.Errorf("malloc(777) in jemalloc: %d events, want 10000", n)
	}
}

// TestLostEventsReported: a ring buffer too small for the event rate drops
// records; the drops are counted, stored in the footer, and every report
// says the analysis is incomplete rather than clean.
func TestLostEventsReported(t *testing.T) {
	requireBPF(t)
	prog := buildC(t, "mallocs")
	trace := filepath.Join(t.TempDir(), "lossy.htr")
	stdout, stderr, code := hooktrace(t, nil, "run", "--recorder", "ebpf", "--mode", "full", "--ring", "4K", "--fail-on", "none",
		"--format", "json", "-o", trace, "--", prog)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	rep := parseReport(t, stdout)
	if rep.Stats.LostEvents == 0 || rep.Stats.Complete {
		t.Fatalf("a 4K ring under 40,000 events: lost %d, complete %v", rep.Stats.LostEvents, rep.Stats.Complete)
	}
	_, _, r := readTrace(t, trace)
	if f := r.Footer(); f == nil || f.Lost != rep.Stats.LostEvents {
		t.Errorf("footer lost events %+v, report %d", f, rep.Stats.LostEvents)
	}
	text, _, _ := hooktrace(t, nil, "analyze", "--fail-on", "none", trace)
	if !strings.Contains(text, "INCOMPLETE") {
		t.Errorf("text report does not say INCOMPLETE:\n%s", text)
	}
}
