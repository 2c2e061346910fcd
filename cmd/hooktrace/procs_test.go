package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// Processes and threads from birth to end under the preload recorder: an
// exec into an environment that dropped the recorder, vfork, a thread
// cancelled in a condition wait, a process that ends while its threads are
// busy. Where the kernel's view compares, the eBPF recorder runs the same
// program and must agree.

// procRun is what a test checks of one traced run.
type procRun struct {
	rep    jsonReport
	cycles []string // the lock-order-cycle errors' locks, "a+b", sorted
	checks uint64   // trace_checks, all kinds
	stderr string
}

// traceProc runs prog under recorder. The program's own checks are its
// exit status, which run passes on; the trace must be complete and, unless
// contradictions are expected, must not contradict itself.
func traceProc(t *testing.T, recorder string, flags []string, prog string, args ...string) procRun {
	t.Helper()
	r := traceProcChecked(t, recorder, flags, prog, args...)
	if r.checks != 0 {
		t.Errorf("%s %v: %d trace checks", recorder, args, r.checks)
	}
	return r
}

func traceProcChecked(t *testing.T, recorder string, flags []string, prog string, args ...string) procRun {
	t.Helper()
	argv := append([]string{"--recorder", recorder, "--fail-on", "none"}, flags...)
	argv = append(append(argv, "--", prog), args...)
	report, _, stderr, code := runJSON(t, argv...)
	if code != 0 {
		t.Fatalf("%s %v: exit %d\n%s", recorder, args, code, stderr)
	}
	r := procRun{rep: parseReport(t, report), stderr: stderr}
	if r.rep.Stats.LostEvents != 0 || !r.rep.Stats.Complete {
		t.Errorf("%s %v: lost %d, complete %v", recorder, args, r.rep.Stats.LostEvents, r.rep.Stats.Complete)
	}
	var checks struct {
		Stats struct {
			TraceChecks map[string]uint64 `json:"trace_checks"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(report), &checks); err != nil {
		t.Fatal(err)
	}
	for _, n := range checks.Stats.TraceChecks {
		r.checks += n
	}
	for _, f := range ofKind(findings(t, report), "lock-order-cycle", "error") {
		locks := slices.Clone(f.Locks)
		slices.Sort(locks)
		r.cycles = append(r.cycles, strings.Join(locks, "+"))
	}
	slices.Sort(r.cycles)
	return r
}

const inversionCycle = "lock_a (inversion)+lock_b (inversion)"

// TestPreloadExecEnvironment: a program that execs with an environment of
// its own (empty, cleared, custom) or spawns with one still has its new
// image recorded: the recorder's variables are put back, the program's
// own are kept (its LD_PRELOAD after the recorder's), one exec is one exec
// record, and an exec that fails fails as untraced (errno, argv, no
// mapping left behind). A spawned child records only with --follow-forks,
// as a forked one; its creation is one process created, as the kernel
// counts it.
func TestPreloadExecEnvironment(t *testing.T) {
	envexec, inversion := testenv.Program(t, "envexec"), testenv.Program(t, "inversion")
	cases := []struct {
		name    string
		follow  bool
		args    []string
		cycles  []string
		execs   uint64 // the gate's exec into envexec included
		created uint64 // threads and processes: the spawned child, inversion's 2 threads
	}{
		{"execve empty", false, []string{"empty", inversion}, []string{inversionCycle}, 2, 2},
		{"execle empty", false, []string{"execle", inversion}, []string{inversionCycle}, 2, 2},
		{"clearenv execvp", false, []string{"clearenv", inversion}, []string{inversionCycle}, 2, 2},
		{"custom", false, []string{"custom", inversion}, []string{inversionCycle}, 3, 2},
		{"spawn", false, []string{"spawn", inversion}, nil, 1, 1},
		{"spawn followed", true, []string{"spawn", inversion}, []string{inversionCycle}, 2, 3},
		{"failing", false, []string{"fail"}, nil, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var flags []string
			if c.follow {
				flags = []string{"--follow-forks"}
			}
			check := func(rec string, r procRun) {
				calls := r.rep.Stats.Calls
				if !slices.Equal(r.cycles, c.cycles) || calls["exec"] != c.execs || calls["thread_create"] != c.created {
					t.Errorf("%s: cycles %q, %d execs, %d created; want %q, %d, %d", rec, r.cycles, calls["exec"],
						calls["thread_create"], c.cycles, c.execs, c.created)
				}
			}
			p := traceProc(t, "preload", flags, envexec, c.args...)
			check("preload", p)
			if want := uint64(4 * len(c.cycles)); p.rep.Stats.Calls["pthread_mutex_lock"] != want {
				t.Errorf("preload: %d locks, want the exec'd program's %d", p.rep.Stats.Calls["pthread_mutex_lock"], want)
			}
			if c.name == "custom" {
				// Its own LD_PRELOAD stays, after the recorder's.
				line := preloadLine(p.stderr)
				if !strings.Contains(line, "libhooktrace_preload") || !strings.HasSuffix(line, ":libm.so.6") {
					t.Errorf("preload: the exec'd program's LD_PRELOAD is %q", line)
				}
			}
			t.Run("ebpf", func(t *testing.T) {
				testenv.RequireBPF(t)
				e := traceProc(t, "ebpf", flags, envexec, c.args...)
				check("ebpf", e)
				if c.name == "custom" && preloadLine(e.stderr) != "libm.so.6" {
					t.Errorf("ebpf: the exec'd program's LD_PRELOAD is %q", preloadLine(e.stderr))
				}
			})
		})
	}
}

// preloadLine is what envexec's check stage says of its LD_PRELOAD.
func preloadLine(stderr string) string {
	for _, line := range strings.Split(stderr, "\n") {
		if v, ok := strings.CutPrefix(line, "preload: "); ok {
			return v
		}
	}
	return ""
}

// TestPreloadVfork: vfork keeps its semantics (the program checks that its
// child wrote the parent's variable), the parent goes on recording as
// itself, and the child is never recorded as its parent: its vf_c then
// vf_a would close a second cycle with the parent's vf_a then vf_c. With
// --follow-forks the child's exec'd image records (its empty environment
// gets the recorder back); without, nothing of the child is recorded.
//
// The preload recorder does not record a vfork child before its exec or
// _exit (it has no thread state of its own there), so with --follow-forks
// the eBPF recorder counts the exiting child's two locks and the preload
// recorder does not: the findings agree.
func TestPreloadVfork(t *testing.T) {
	vforker, inversion := testenv.Program(t, "vforker"), testenv.Program(t, "inversion")
	const vfCycle = "vf_a (vforker)+vf_b (vforker)"
	cases := []struct {
		name             string
		follow           bool
		args             []string
		cycles           []string
		locks, processes uint64
	}{
		{"exit", false, []string{"exit"}, []string{vfCycle}, 6, 1},
		{"exit followed", true, []string{"exit"}, []string{vfCycle}, 6, 1},
		{"exec", false, []string{"exec", inversion}, []string{vfCycle}, 6, 1},
		// The child's image: 4 locks, 2 threads, and an exec.
		{"exec followed", true, []string{"exec", inversion}, []string{inversionCycle, vfCycle}, 10, 3},
		// An environment too large for the recorder's stack buffer: the
		// child's exec maps one, and the parent, which would keep it,
		// unmaps it (the program checks its mappings).
		{"exec large followed", true, []string{"exec-large", inversion}, []string{inversionCycle, vfCycle}, 10, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var flags []string
			if c.follow {
				flags = []string{"--follow-forks"}
			}
			p := traceProc(t, "preload", flags, vforker, c.args...)
			calls := p.rep.Stats.Calls
			if !slices.Equal(p.cycles, c.cycles) || calls["pthread_mutex_lock"] != c.locks || calls["thread_create"] != c.processes {
				t.Errorf("preload: cycles %q, calls %v; want %q, %d locks, %d creations", p.cycles, calls, c.cycles, c.locks, c.processes)
			}
			t.Run("ebpf", func(t *testing.T) {
				testenv.RequireBPF(t)
				e := traceProc(t, "ebpf", flags, vforker, c.args...)
				if !slices.Equal(e.cycles, p.cycles) || e.rep.Stats.Calls["exec"] != calls["exec"] ||
					e.rep.Stats.Calls["thread_create"] != calls["thread_create"] {
					t.Errorf("ebpf: cycles %q, calls %v; preload: %q, %v", e.cycles, e.rep.Stats.Calls, p.cycles, calls)
				}
			})
		})
	}
}

// TestPreloadCondWaitCancelled: threads cancelled in pthread_cond_wait,
// timedwait and clockwait get the mutex back before their cleanup handler
// unlocks it; the wait never returns. The trace has no unheld unlock, the
// program sees what it would untraced (each thread cancelled, the mutex
// free after), and every call and thread exit is counted.
func TestPreloadCondWaitCancelled(t *testing.T) {
	prog := testenv.Program(t, "condcancel")
	p := traceProc(t, "preload", nil, prog)
	calls := p.rep.Stats.Calls
	want := map[string]uint64{"pthread_cond_wait": 1, "pthread_cond_timedwait": 2, "pthread_mutex_lock": 6,
		"pthread_mutex_trylock": 3, "pthread_mutex_unlock": 9, "thread_create": 3, "thread_exit": 4}
	for op, n := range want {
		if calls[op] != n {
			t.Errorf("preload: calls.%s = %d, want %d (all: %v)", op, calls[op], n, calls)
		}
	}
	if len(p.cycles) != 0 {
		t.Errorf("preload: cycles %q", p.cycles)
	}
	t.Run("ebpf", func(t *testing.T) {
		testenv.RequireBPF(t)
		// (Its uprobes do not cover pthread_cond_clockwait.)
		e := traceProc(t, "ebpf", nil, prog)
		if len(e.cycles) != 0 || e.rep.Stats.Calls["pthread_cond_wait"] != 1 || e.rep.Stats.Calls["thread_exit"] != calls["thread_exit"] {
			t.Errorf("ebpf: cycles %q, calls %v", e.cycles, e.rep.Stats.Calls)
		}
	})
}

// TestPreloadProcessEndsWithThreads: the image ends (exit, _exit, exec)
// while three threads lock and allocate without end; in full mode every
// call is a record, so the end comes in the middle of some. What was
// recorded all arrives, and the report is complete. Three runs each: the
// end's moment is the scheduler's. An exit or _exit ends four threads, and
// both recorders count four exits (the kernel reports each; the preload
// recorder's ending thread records the others').
func TestPreloadProcessEndsWithThreads(t *testing.T) {
	prog, inversion := testenv.Program(t, "exitrace"), testenv.Program(t, "inversion")
	for _, end := range [][]string{{"exit"}, {"_exit"}, {"exec", inversion}} {
		var cycles []string
		if end[0] == "exec" {
			cycles = []string{inversionCycle}
		}
		t.Run(end[0], func(t *testing.T) {
			for range 3 {
				p := traceProc(t, "preload", []string{"--mode", "full"}, prog, end...)
				// Every worker made 1000 rounds of two locks first.
				if calls := p.rep.Stats.Calls; calls["pthread_mutex_lock"] < 6000 || p.rep.Stats.Events < 6000 ||
					!slices.Equal(p.cycles, cycles) {
					t.Errorf("calls %v, %d events, cycles %q: want 6000 locks and as many events at least, cycles %q",
						calls, p.rep.Stats.Events, p.cycles, cycles)
				}
				if n := p.rep.Stats.Calls["thread_exit"]; end[0] != "exec" && n != 4 {
					t.Errorf("%d thread exits, want 4", n)
				}
			}
			t.Run("ebpf", func(t *testing.T) {
				testenv.RequireBPF(t)
				e := traceProc(t, "ebpf", []string{"--mode", "full"}, prog, end...)
				if !slices.Equal(e.cycles, cycles) || e.rep.Stats.Calls["pthread_mutex_lock"] < 6000 ||
					(end[0] != "exec" && e.rep.Stats.Calls["thread_exit"] != 4) {
					t.Errorf("ebpf: calls %v, cycles %q; want 4 thread exits", e.rep.Stats.Calls, e.cycles)
				}
			})
		})
	}
}

// TestPreloadForkHandlers: fork in a multi-threaded process whose fork
// handlers lock. The child's handler runs in the child before fork returns
// there: without --follow-forks it is not recorded (as the parent's, it
// would release the parent's lock twice); with it, the child's records
// reach hooktrace, named. The child's thread holds from its start the lock
// the prepare handler took in the parent (fork copies it locked): its
// handler's release is consistent, and the lock it takes inside closes a
// cycle with the child's later order. Both recorders, both modes.
func TestPreloadForkHandlers(t *testing.T) {
	prog := testenv.Program(t, "forkhandlers")
	childCycles := []string{"fh_guard (forkhandlers)+fh_x (forkhandlers)", "fh_x (forkhandlers)+fh_y (forkhandlers)"}
	for _, c := range []struct {
		name   string
		flags  []string
		cycles []string
	}{
		{"not followed", nil, nil},
		{"followed", []string{"--follow-forks"}, childCycles},
	} {
		for _, mode := range []string{"aggregate", "full"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				flags := append([]string{"--mode", mode}, c.flags...)
				check := func(rec string, r procRun) {
					// The worker thread and the child.
					if !slices.Equal(r.cycles, c.cycles) || r.checks != 0 || r.rep.Stats.Calls["thread_create"] != 2 {
						t.Errorf("%s: cycles %q, %d trace checks, calls %v; want %q, none, 2 creations", rec, r.cycles, r.checks, r.rep.Stats.Calls, c.cycles)
					}
				}
				check("preload", traceProcChecked(t, "preload", flags, prog))
				t.Run("ebpf", func(t *testing.T) {
					testenv.RequireBPF(t)
					check("ebpf", traceProcChecked(t, "ebpf", flags, prog))
				})
			})
		}
	}
}

// systemPython is the python3 to run: the system's, where a version
// manager's shim (pyenv's is a shell script that execs the interpreter it
// picks) comes first in PATH.
func systemPython(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return testenv.Tool(t, "apt-get install -y python3", "python3")
}

// TestFollowedChildClosedDescriptor: a process that closes the descriptors
// it inherited before an exec (Python's subprocess does by default, a
// shell's `exec 4>&-`) still has the new image recorded: its library
// opens the shared memory again by the name the environment carries. The
// exec'd program's inversion is found, as the eBPF recorder finds it, and
// the trace is complete. A followed child that cannot record (a static
// program: the loader preloads nothing into it) is counted, on stderr and
// in the report, which says it is incomplete.
func TestFollowedChildClosedDescriptor(t *testing.T) {
	inversion := testenv.Program(t, "inversion")
	python := systemPython(t)
	bash := testenv.Tool(t, "apt-get install -y bash", "bash")
	follow := []string{"--follow-forks"}
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"python subprocess", []string{python, "-c", "import subprocess, sys; subprocess.run([sys.argv[1]], check=True)", inversion}},
		{"bash child", []string{bash, "-c", `exec 4>&-; "$0"; exit $?`, inversion}},
		{"bash exec", []string{bash, "-c", `exec 4>&-; exec "$0"`, inversion}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, rec := range []string{"preload", "ebpf"} {
				if rec == "ebpf" {
					testenv.RequireBPF(t)
				}
				r := traceProc(t, rec, follow, c.argv[0], c.argv[1:]...)
				if !slices.Equal(r.cycles, []string{inversionCycle}) || r.rep.Stats.Calls["exec"] != 2 {
					t.Errorf("%s: cycles %q, %d execs; want the child's %q, 2 execs", rec, r.cycles, r.rep.Stats.Calls["exec"], inversionCycle)
				}
			}
		})
	}
	t.Run("static child", func(t *testing.T) {
		static := testenv.Program(t, "inversion", "-static")
		report, _, stderr, code := runJSON(t, "--recorder", "preload", "--follow-forks", "--fail-on", "none", "--",
			python, "-c", "import subprocess, sys; subprocess.run([sys.argv[1]], check=True)", static)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
		st := parseReport(t, report).Stats
		if st.Unrecorded != 1 || st.Complete || !strings.Contains(st.Incomplete, "1 process could not record") {
			t.Errorf("report: %d processes could not record, complete %v (%q); want 1, incomplete", st.Unrecorded, st.Complete, st.Incomplete)
		}
		if !strings.Contains(stderr, "1 process could not record (pid ") {
			t.Errorf("stderr does not say a process could not record:\n%s", stderr)
		}
	})
}
