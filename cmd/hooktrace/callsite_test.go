//go:build linux && amd64

package main

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/placement"
)

// callSiteFuncs are the functions the eBPF recorder probes at their calls
// on glibc 2.36, whose entries the kernel must single-step, and
// pthread_spin_lock, probed as its unlock is.
var callSiteFuncs = []string{"pthread_rwlock_init", "pthread_rwlock_destroy", "pthread_spin_init", "pthread_spin_lock", "pthread_spin_unlock", "pthread_spin_destroy"}

// TestCallSiteProbes: testdata/calls.c calls the call-probed functions
// through its PLT, directly and by tail calls, and through the PLT of a
// library of its own (libcalls.c), with pthread_spin_lock and the rwlock
// lock calls among them; two rwlocks made through the library's tail call
// are taken in both orders. The eBPF recorder places those functions'
// probes on the calls, in both objects, and none on their entries; it
// counts every call as the preloaded recorder does, and in full mode every
// event of those lock calls comes with the very stack the preloaded
// recorder gives it (the function called by name: the eBPF probes on the
// rwlock lock calls sit past their entries). In aggregate mode
// each stack it sends is one of those. Every run finds the one cycle,
// between locks named by where they were made.
func TestCallSiteProbes(t *testing.T) {
	testenv.RequireBPF(t)
	dir, prog, _ := buildCalls(t)
	const n = 10
	want := map[string]uint64{
		"pthread_spin_init": 4 * n / 2, "pthread_spin_lock": 2 * n, "pthread_spin_unlock": 2 * n, "pthread_spin_destroy": 2 * n,
		"pthread_rwlock_init": n + 2, "pthread_rwlock_destroy": n + 2, "pthread_rwlock_rdlock": n,
		"pthread_rwlock_wrlock": 4, "pthread_rwlock_unlock": n + 4,
	}
	stacks := map[string]map[string]int{} // recorder mode -> op and stack -> events
	var first []finding
	for _, rec := range []string{"preload", "ebpf"} {
		for _, mode := range []string{"full", "aggregate"} {
			run := rec + " " + mode
			trace := filepath.Join(dir, rec+"-"+mode+".htr")
			rep, fs := traceOnce(t, []string{"--recorder", rec, "--mode", mode, "-o", trace}, prog, fmt.Sprint(n))
			for name, w := range want {
				if got := rep.Stats.Calls[name]; got != w {
					t.Errorf("%s: %s called %d times, want %d", run, name, got, w)
				}
			}
			cycles := ofKind(fs, "lock-order-cycle", "error")
			if len(fs) != 1 || len(cycles) != 1 || !slices.ContainsFunc(cycles[0].Locks, func(l string) bool {
				return strings.HasPrefix(l, "rwlock initialised at main+") && strings.HasSuffix(l, " (calls)")
			}) {
				t.Errorf("%s: want one cycle between rwlocks initialised in main, got%s", run, verdicts(fs))
			}
			if first == nil {
				first = fs
			} else if !sameFindings(first, fs) {
				t.Errorf("%s finds otherwise than preload full:%s\nand%s", run, verdicts(fs), verdicts(first))
			}
			probes, got := traceStacks(t, trace)
			stacks[run] = got
			if rec == "ebpf" {
				checkCallProbes(t, run, probes, filepath.Base(prog), "libcalls.so")
			}
		}
	}
	if p, e := stacks["preload full"], stacks["ebpf full"]; !mapsEqual(p, e) {
		t.Errorf("the recorders' stacks differ in full mode:\npreload:%s\nebpf:%s", fmtStacks(p), fmtStacks(e))
	}
	for k := range stacks["ebpf aggregate"] {
		if _, ok := stacks["preload full"][k]; !ok {
			t.Errorf("ebpf aggregate sent a stack no call had under preload: %s", k)
		}
	}
}

// buildCalls builds testdata/calls.c linked with libcalls.c, which it
// copies into dir: the program, and the library as built.
func buildCalls(t *testing.T) (dir, prog, lib string) {
	t.Helper()
	dir = t.TempDir()
	lib = testenv.C{Source: filepath.Join(testenv.RepoRoot(t), "testdata", "libcalls.c"), Name: "libcalls.so",
		Flags: append(slices.Clone(testenv.CFlags), "-fPIC", "-shared")}.Build(t)
	copyFile(t, lib, filepath.Join(dir, "libcalls.so"), 0o755)
	prog = testenv.Program(t, "calls", "-Wl,--no-as-needed", "-L"+dir, "-lcalls", "-Wl,-rpath,"+dir)
	return dir, prog, lib
}

// checkCallProbes checks that the call-probed functions are probed on
// their calls in each of objects, and nowhere else.
func checkCallProbes(t *testing.T, run string, probes []events.ProbeSite, objects ...string) {
	t.Helper()
	in := map[string]map[string]bool{} // function -> objects probed in
	for _, p := range probes {
		if !slices.Contains(callSiteFuncs, p.Name) {
			continue
		}
		if in[p.Name] == nil {
			in[p.Name] = map[string]bool{}
		}
		in[p.Name][filepath.Base(p.Object)] = true
		if !strings.Contains(p.Note, "call of "+p.Name) {
			t.Errorf("%s: %s probed at %s+%#x: %s; want its calls", run, p.Name, filepath.Base(p.Object), p.Address, p.Note)
		}
	}
	for _, fn := range callSiteFuncs {
		for _, o := range objects {
			if !in[fn][o] {
				t.Errorf("%s: no call of %s probed in %s (probed in %v)", run, fn, o, in[fn])
			}
		}
	}
}

// traceStacks reads a trace's probe sites and, for each event of a lock
// call, its op and stack, counted: the probed function's frames (the
// first address, and functions inlined there) by function, the others by
// function, offset, object and line.
func traceStacks(t *testing.T, path string) ([]events.ProbeSite, map[string]int) {
	t.Helper()
	r, err := events.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var probes []events.ProbeSite
	frames := map[uint32]string{}
	out := map[string]int{}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		switch rec.Kind {
		case events.RecHeader:
			probes = append(probes, rec.Header.Probes...)
		case events.RecStack:
			var b strings.Builder
			for i, f := range rec.Stack.Frames {
				if f.Addr == rec.Stack.Frames[0].Addr {
					// The probed function, and what is inlined there.
					if i > 0 {
						b.WriteString(" <- ")
					}
					b.WriteString(f.Function)
					continue
				}
				fmt.Fprintf(&b, " <- %s+%#x (%s:%d, %s)", f.Function, f.Offset, filepath.Base(f.File), f.Line, filepath.Base(f.Object))
			}
			frames[rec.Stack.ID] = b.String()
		case events.RecEvent:
			e := rec.Event
			if !strings.HasPrefix(e.Op.String(), "pthread_spin_") && !strings.HasPrefix(e.Op.String(), "pthread_rwlock_") {
				continue
			}
			stack := "no stack"
			if e.Stack != 0 {
				stack = frames[e.Stack]
			}
			out[e.Op.String()+": "+stack]++
		}
	}
	return probes, out
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func fmtStacks(m map[string]int) string {
	var lines []string
	for k, v := range m {
		lines = append(lines, fmt.Sprintf("\n  %4d %s", v, k))
	}
	slices.Sort(lines)
	return strings.Join(lines, "")
}

// TestCallSiteProbesInLoadedLibrary: a library the program loads with
// dlopen is probed on its calls once the tracer hears of it (the program
// waits until the probes show in its code), and then its spinlock lives
// are counted as the preloaded recorder counts them.
func TestCallSiteProbesInLoadedLibrary(t *testing.T) {
	testenv.RequireBPF(t)
	dir, prog, lib := buildCalls(t)
	// Another file: the copy the program links is probed from the start.
	loaded := filepath.Join(dir, "libcalls-loaded.so")
	copyFile(t, lib, loaded, 0o755)
	const n = 10
	for _, rec := range []string{"preload", "ebpf"} {
		for _, mode := range []string{"full", "aggregate"} {
			run := rec + " " + mode
			sites := "0"
			if rec == "ebpf" {
				sites = fmt.Sprint(callsBetween(t, loaded, "lib_spin_life", "lib_probes_end", 32))
			}
			rep, fs := traceOnce(t, []string{"--recorder", rec, "--mode", mode}, prog, fmt.Sprint(n), "dlopen", loaded, sites)
			for _, name := range []string{"pthread_spin_init", "pthread_spin_lock", "pthread_spin_unlock", "pthread_spin_destroy"} {
				if got := rep.Stats.Calls[name]; got != n {
					t.Errorf("%s: %s called %d times, want %d", run, name, got, n)
				}
			}
			if len(fs) != 0 {
				t.Errorf("%s: want no finding, got%s", run, verdicts(fs))
			}
		}
	}
}

// callsBetween counts the calls of traced functions the eBPF recorder
// probes in lib from function from to n bytes into function to.
func callsBetween(t *testing.T, lib, from, to string, n uint64) int {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := uint64(0), uint64(0)
	for _, s := range syms {
		switch s.Name {
		case from:
			lo = s.Value
		case to:
			hi = s.Value + n
		}
	}
	imp, err := placement.CallSites(f, callSiteFuncs)
	if err != nil || lo == 0 || hi <= lo {
		t.Fatalf("finding the calls in %s from %s to %s: %v", lib, from, to, err)
	}
	count := 0
	for _, c := range imp.Sites {
		if c.Addr >= lo && c.Addr < hi {
			count++
		}
	}
	if count == 0 {
		t.Fatalf("no call probed from %s to %s in %s", from, to, lib)
	}
	return count
}

// TestCallSiteProbesOnAttach: attach probes the calls in the objects a
// running process maps; once attach says its probes are on (--ready-file)
// the program makes its calls, every one counted, with the stacks of a run.
func TestCallSiteProbesOnAttach(t *testing.T) {
	testenv.RequireBPF(t)
	dir, prog, _ := buildCalls(t)
	const n = 10
	for _, mode := range []string{"full", "aggregate"} {
		ready := filepath.Join(dir, "ready-"+mode)
		cmd := exec.Command(prog, fmt.Sprint(n), "await", ready)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
			t.Fatalf("the program said %q", line)
		}
		trace := filepath.Join(dir, "attach-"+mode+".htr")
		out, stderr, code := hooktrace(t, nil, "attach", "--recorder", "ebpf", "--mode", mode, "--pid", fmt.Sprint(cmd.Process.Pid),
			"--format", "json", "--fail-on", "none", "-o", trace, "--ready-file", ready)
		if code != 0 {
			t.Fatalf("%s: attach exit %d\n%s", mode, code, stderr)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: the program: %v", mode, err)
		}
		rep := parseReport(t, out)
		for _, name := range []string{"pthread_spin_init", "pthread_spin_lock", "pthread_spin_unlock", "pthread_spin_destroy"} {
			if got := rep.Stats.Calls[name]; got != n {
				t.Errorf("%s: %s called %d times, want %d", mode, name, got, n)
			}
		}
		probes, stacks := traceStacks(t, trace)
		checkCallProbes(t, "attach "+mode, probes, filepath.Base(prog), "libcalls.so")
		inits := 0
		for k, v := range stacks {
			if !strings.HasPrefix(k, "pthread_spin_init: ") {
				continue
			}
			inits += v
			if !strings.HasPrefix(k, "pthread_spin_init: pthread_spin_init <- lib_spin_life+") {
				t.Errorf("%s: an init's stack: %s", mode, k)
			}
		}
		// Aggregate mode keeps unused lifetimes back.
		if mode == "full" && inits != n {
			t.Errorf("%s: %d inits in the trace, want %d:%s", mode, inits, n, fmtStacks(stacks))
		}
	}
}
