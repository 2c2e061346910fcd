package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestFollowForks: a child process's lock inversion is seen only with
// --follow-forks: its probes are placed before it runs, or, preloaded, it
// keeps writing to the shared memory it inherits (without the flag it
// records nothing).
func TestFollowForks(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "forker")
	fs := ofKind(traceFindings(t, []string{"--follow-forks"}, prog), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"fork_a (forker)", "fork_b (forker)"}) || !fs[0].edgeStackHas(0, "both_orders") {
		t.Fatalf("--follow-forks: want the child's fork_a/fork_b inversion from both_orders, got %v", fs)
	}
	if fs := ofKind(traceFindings(t, nil, prog), "lock-order-cycle", "error"); len(fs) != 0 {
		t.Errorf("without --follow-forks the child is not traced, got %v", fs)
	}
}

// TestExecMidTrace: the target execs another program; the trace goes on
// in the new image (same PID; preloaded again by the loader) and finds its
// inversion, named after the new image's symbols.
func TestExecMidTrace(t *testing.T) {
	testenv.RequireBPF(t)
	execer, inversion := testenv.Program(t, "execer"), testenv.Program(t, "inversion")
	fs := ofKind(traceFindings(t, nil, execer, inversion), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"lock_a (inversion)", "lock_b (inversion)"}) {
		t.Fatalf("want the exec'd program's inversion, got %v", fs)
	}
}

// TestScriptTarget: the target is a script whose interpreter execs a
// program: both recorders trace the interpreter (the kernel's exec of a
// script is its interpreter's) and the program it execs, and find the
// program's inversion.
func TestScriptTarget(t *testing.T) {
	testenv.RequireBPF(t)
	script := writeFile(t, "run-inversion", "#!/bin/sh\nexec "+testenv.Program(t, "inversion")+"\n")
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	fs := ofKind(traceFindings(t, nil, script), "lock-order-cycle", "error")
	if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"lock_a (inversion)", "lock_b (inversion)"}) {
		t.Fatalf("want the exec'd program's inversion, got %v", fs)
	}
}

// TestDamagedTraces: a trace cut short (the tracer was killed) is analyzed
// up to its last whole block with a warning, and the report says it is
// incomplete; so is a damaged one (a flipped byte), up to the block the
// damage is in, with the offset.
func TestDamagedTraces(t *testing.T) {
	testenv.RequireBPF(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "whole.htr")
	if _, stderr, code := hooktrace(t, nil, "run", "--mode", "full", "-o", trace, "--fail-on", "none", "--ignore-target-status", "--", testenv.Program(t, "mallocs")); code != 0 {
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
	stdout, stderr, code = hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", corrupt)
	if code != 0 || !strings.Contains(stderr, "corrupt at offset") || !strings.Contains(stderr, "analyzing the whole blocks before it") {
		t.Fatalf("corrupt trace: exit %d (want 0, salvaged with a warning), stderr %q", code, stderr)
	}
	wholeOut, _, _ := hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", trace)
	whole := parseReport(t, wholeOut)
	if damaged := parseReport(t, stdout); damaged.Stats.Complete || damaged.Stats.Events == 0 || damaged.Stats.Events >= whole.Stats.Events {
		t.Errorf("corrupt trace: complete=%v events=%d of %d; want incomplete with the events before the damage",
			damaged.Stats.Complete, damaged.Stats.Events, whole.Stats.Events)
	}
	// export salvages the same blocks.
	if _, stderr, code := hooktrace(t, nil, "export", "-o", filepath.Join(dir, "corrupt.json"), corrupt); code != 0 {
		t.Errorf("export of a corrupt trace: exit %d\n%s", code, stderr)
	}
}

// TestGoTarget: a Go program gets no return probes (they corrupt Go
// stacks), is told so, and runs to its right answer. One without cgo has
// no pthread lock to trace: run refuses it, exit 3, before it runs. eBPF
// alone: a Go program calls no libc a preloaded library could interpose.
func TestGoTarget(t *testing.T) {
	testenv.RequireBPF(t)
	dir := t.TempDir()
	build := func(name, src string) string {
		os.WriteFile(filepath.Join(dir, name+".go"), []byte(src), 0o644)
		bin := filepath.Join(dir, name)
		build := exec.Command("go", "build", "-o", bin, name+".go")
		build.Dir = dir
		build.Env = append(os.Environ(), "GO111MODULE=off", "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return bin
	}
	cgo := build("cgoprog", "package main\n\n// int twice(int x) { return 2 * x; }\nimport \"C\"\nimport \"fmt\"\n\nfunc main() {\n\tsum := 0\n\tfor i := 1; i <= 100; i++ {\n\t\tsum += i\n\t}\n\tfmt.Println(\"sum\", int(C.twice(C.int(sum/2))))\n}\n")
	stdout, stderr, code := hooktrace(t, nil, "run", "--", cgo)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if stdout != "sum 5050\n" {
		t.Errorf("the Go program's answer: %q", stdout)
	}
	if !strings.Contains(stderr, "is a Go program: no return probes") {
		t.Errorf("no warning about return probes in a Go target:\n%s", stderr)
	}

	pure := build("pureprog", "package main\n\nimport (\n\t\"bufio\"\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"waiting\")\n\tbufio.NewReader(os.Stdin).ReadString('\\n')\n\tfmt.Println(\"ran\")\n}\n")
	stdout, stderr, code = hooktrace(t, nil, "run", "--", pure)
	if code != exitFailure || !strings.Contains(stderr, "no probe placed in pid") || !strings.Contains(stderr, "Go program without cgo") {
		t.Errorf("pure Go target: exit %d (want %d naming why)\n%s", code, exitFailure, stderr)
	}
	if stdout != "" || strings.Contains(stderr, "no findings") {
		t.Errorf("pure Go target: it ran, or an empty report was given: stdout %q\n%s", stdout, stderr)
	}
	// attach says the same, and leaves the target as it was.
	target := exec.Command(pure)
	stdin, _ := target.StdinPipe()
	out, _ := target.StdoutPipe()
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer target.Process.Kill()
	rd := bufio.NewReader(out)
	if line, _ := rd.ReadString('\n'); line != "waiting\n" {
		t.Fatalf("target said %q", line)
	}
	stdout, stderr, code = hooktrace(t, nil, "attach", "--pid", fmt.Sprint(target.Process.Pid), "--duration", "30s")
	if code != exitFailure || !strings.Contains(stderr, "no probe placed in pid") || stdout != "" {
		t.Errorf("attach to a pure Go target: exit %d (want %d naming why), stdout %q\n%s", code, exitFailure, stdout, stderr)
	}
	io.WriteString(stdin, "go on\n")
	if rest, _ := io.ReadAll(rd); string(rest) != "ran\n" {
		t.Errorf("the target after the refused attach said %q", rest)
	}
	if err := target.Wait(); err != nil {
		t.Errorf("the target after the refused attach: %v", err)
	}
}

// TestCxxProbe: --probe takes a demangled C++ name; every call of it is
// traced at entry and exit, with the demangled name in the stack, under
// both recorders (a uprobe, or the preloaded library's breakpoint).
func TestCxxProbe(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.C{Compiler: "g++", Source: filepath.Join("..", "..", "testdata", "cxx.cc"),
		Flags: []string{"-O2", "-g", "-fno-omit-frame-pointer"}}.Build(t)
	for _, recorder := range recorders {
		t.Run(recorder, func(t *testing.T) { traceCxxProbe(t, prog, recorder) })
	}
}

func traceCxxProbe(t *testing.T, prog, recorder string) {
	trace := filepath.Join(t.TempDir(), "c.htr")
	if _, stderr, code := hooktrace(t, nil, "run", "--recorder", recorder, "--mode", "full", "-o", trace, "--probe", "rc::Cache::insert", "--", prog); code != 0 {
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
// are traced (run starts at the first instruction; the preloaded library's
// own constructor runs before the program's), in a dynamic binary under
// both recorders, and in a static one whose allocator and pthreads are in
// the executable, under eBPF alone: no loader can preload a library into
// it.
func TestConstructorsAndStatic(t *testing.T) {
	testenv.RequireBPF(t)
	for _, c := range []struct {
		name, recorder string
		static         bool
	}{{"ctor", "ebpf", false}, {"ctor", "preload", false}, {"ctor_static", "ebpf", true}} {
		var extra []string
		if c.static {
			extra = []string{"-static"}
		}
		name := c.name
		t.Run(name+" "+c.recorder, func(t *testing.T) {
			prog := testenv.C{Source: filepath.Join("..", "..", "testdata", "ctor.c"), Name: name,
				Flags: append(slices.Clone(testenv.CFlags), extra...)}.Build(t)
			trace := filepath.Join(t.TempDir(), "c.htr")
			if _, stderr, code := hooktrace(t, nil, "run", "--recorder", c.recorder, "--mode", "full", "-o", trace, "--", prog); code != 0 {
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
			if h := r.Header(); h == nil || h.Recorder != c.recorder {
				t.Errorf("header: %+v, want recorder %s", h, c.recorder)
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
	testenv.RequireBPF(t)
	traceJemalloc(t, "ebpf")
}

// traceJemalloc runs testdata/mallocs.c with LD_PRELOAD=libjemalloc under
// recorder, in full mode: the header names jemalloc, and each of the
// program's 10000 malloc(777) is an event whose stack starts in jemalloc.
func traceJemalloc(t *testing.T, recorder string) {
	t.Helper()
	const je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	testenv.File(t, je, "apt-get install -y libjemalloc2")
	trace := filepath.Join(t.TempDir(), "je.htr")
	cmd := exec.Command(hooktraceBin, "run", "--recorder", recorder, "--mode", "full", "--ignore-target-status",
		"-o", trace, "--", testenv.Program(t, "mallocs"))
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
// says the analysis is incomplete rather than clean. eBPF alone: the
// preload recorder's writers wait for the reader instead of dropping
// (TestPreloadRingFull).
func TestLostEventsReported(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	trace := filepath.Join(t.TempDir(), "lossy.htr")
	stdout, _, stderr, code := runJSON(t, "--recorder", "ebpf", "--mode", "full", "--ring", "4K", "--fail-on", "none", "--ignore-target-status",
		"-o", trace, "--", prog)
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
