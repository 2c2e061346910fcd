package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The Open MPI tests run a real job, two ranks of a ping-pong with a
// thread per rank whose frees make glibc unmap and madvise memory, in each
// point-to-point configuration Debian's Open MPI 4.1 runs on one machine:
// the shared-memory BTL (vader), UCX, and libfabric (ofi). Open MPI's
// patcher and UCX's ucm patch libc's munmap and madvise entries so that
// their memory hooks see every unmap; hooktrace places no uprobe on
// patched code and sees those calls through the sys_enter tracepoint.

// What the release hook does inside free differs:
//   - vader: Open MPI's hooks take no pthread lock;
//   - UCX: ucm_vm_munmap dispatches the event under UCX's recursive
//     spinlock wrapper (libucs, over pthread_spin_lock);
//   - ofi: libfabric's ofi_import_monitor_notify takes mm_list_rwlock (read)
//     then mm_lock (the stripped library's locks are named by address).
//
// Both run while glibc holds the freeing thread's arena lock when free
// trims a non-main heap (shrink_heap → madvise).
var mpiConfigs = []struct {
	name string
	mca  []string
	// hookLock is in the name of a lock the release hook takes inside
	// free, with the arena held; empty when it takes none. hookPath is on
	// that stack whichever call it was first seen in (aggregate mode
	// reports the first: a trim of the heap by sbrk in the main thread or
	// of a thread's heap by madvise).
	hookLock string
	hookPath []string
}{
	{"vader", []string{"--mca", "pml", "ob1", "--mca", "btl", "self,vader"}, "", nil},
	{"ucx", []string{"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"},
		"libucs", []string{"pthread_spin_lock", "ucm_event_dispatch", "free"}},
	{"ofi", []string{"--mca", "pml", "cm", "--mca", "mtl", "ofi"},
		"libfabric", []string{"pthread_mutex_lock", "opal_mem_hooks_release_hook", "free"}},
}

// mpiReport is what the tests read of a JSON report.
type mpiReport struct {
	Stats struct {
		Events      uint64            `json:"events"`
		LostEvents  uint64            `json:"lost_events"`
		Complete    bool              `json:"complete"`
		Incomplete  string            `json:"incomplete"`
		Calls       map[string]uint64 `json:"calls"`
		ExitStatus  *int              `json:"exit_status"`
		TraceChecks map[string]uint64 `json:"trace_checks"`
		Traces      []struct {
			Source     string `json:"source"`
			Recorder   string `json:"recorder"`
			Events     uint64 `json:"events"`
			LostEvents uint64 `json:"lost_events"`
			Complete   bool   `json:"complete"`
			ExitStatus *int   `json:"exit_status"`
		} `json:"traces"`
	} `json:"stats"`
	Findings []struct {
		Kind        string   `json:"kind"`
		Severity    string   `json:"severity"`
		Title       string   `json:"title"`
		Detail      string   `json:"detail"`
		Locks       []string `json:"locks"`
		Occurrences int      `json:"occurrences"`
		Edges       []struct {
			Context string `json:"context"`
			Arena   string `json:"arena"`
			Stack   []struct {
				Function string `json:"function"`
				Object   string `json:"object"`
			} `json:"stack"`
		} `json:"edges"`
	} `json:"findings"`
}

// mpirunArgs is mpirun's command line for cfg's two ranks of argv.
func mpirunArgs(mca []string, argv ...string) []string {
	args := append([]string{"--allow-run-as-root", "--oversubscribe", "-n", "2"}, mca...)
	return append(args, argv...)
}

// mpiEnv lets mpirun run as root (CI containers do), whatever the flags.
func mpiEnv() []string {
	return append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
}

// rankLine is one rank's result: an even rank checks the payloads, so it
// also counts bad values.
var rankLine = regexp.MustCompile(`(?m)^rank (\d+): (\d+) round trips, (?:(\d+) bad values, )?(\d+) churns$`)

// checkJob checks the job's own output: each of its ranks printed one
// result, each pair played the same number of round trips, each even rank
// found every payload right, and every rank churned. It returns each
// rank's round trips.
func checkJob(t *testing.T, out string, ranks int) map[int]int {
	t.Helper()
	type result struct{ rounds, bad, churns int }
	got := map[int]result{}
	for _, m := range rankLine.FindAllStringSubmatch(out, -1) {
		var r, rounds, bad, churns int
		fmt.Sscan(m[1], &r)
		fmt.Sscan(m[2], &rounds)
		fmt.Sscan(m[3], &bad)
		fmt.Sscan(m[4], &churns)
		got[r] = result{rounds, bad, churns}
	}
	if len(got) != ranks {
		t.Fatalf("the job did not print its %d ranks' results:\n%s", ranks, out)
	}
	rounds := map[int]int{}
	for r := 0; r < ranks; r += 2 {
		lead, peer := got[r], got[r+1]
		if lead.rounds != peer.rounds || lead.rounds == 0 || lead.bad != 0 || lead.churns == 0 || peer.churns == 0 {
			t.Errorf("the job went wrong: ranks %d and %d: %+v, %+v", r, r+1, lead, peer)
		}
		rounds[r], rounds[r+1] = lead.rounds, peer.rounds
	}
	t.Logf("job: %s", strings.Join(rankLine.FindAllString(out, -1), "; "))
	return rounds
}

// checkMPIReport checks one rank's report: the memory syscalls the hooks
// see were counted, and no error contradicts a job that finished.
func checkMPIReport(t *testing.T, what string, rep *mpiReport) {
	t.Helper()
	checkMPIFindings(t, what, rep)
	if c := rep.Stats.Calls; c["madvise"] == 0 || c["munmap"] == 0 || c["free"] == 0 {
		t.Errorf("%s: the frees' madvise and munmap calls were not seen: %v", what, c)
	}
}

// checkMPIFindings logs the counts and checks that no error contradicts a
// job that finished:
//   - A self-deadlock on a non-recursive lock would have hung it: one seen
//     in a trace is a trace inconsistency (a warning), never an error.
//   - Open MPI's release hooks do not allocate, nor take a lock their
//     thread may hold around an allocator call: an allocator re-entry or a
//     self-deadlock hazard through the hook context in a complete trace is
//     a misreading (glibc's posix_memalign calls malloc itself). With
//     events lost, the holes make such findings (a lost unlock leaves a
//     lock held for ever): they are logged, and the report says INCOMPLETE.
//
// Lock-order cycles are hazards a finished job does not contradict (here,
// libfabric's lock and the dynamic loader's, taken in both orders by
// dlopen and dlclose on one thread): they are logged.
func checkMPIFindings(t *testing.T, what string, rep *mpiReport) {
	t.Helper()
	c := rep.Stats.Calls
	t.Logf("%s: %d events, %d lost; madvise=%d munmap=%d mmap=%d brk=%d free=%d malloc=%d mutex_lock=%d rwlock_rdlock=%d spin_lock=%d spin_unlock=%d; trace checks %v",
		what, rep.Stats.Events, rep.Stats.LostEvents, c["madvise"], c["munmap"], c["mmap"], c["brk"], c["free"], c["malloc"],
		c["pthread_mutex_lock"], c["pthread_rwlock_rdlock"], c["pthread_spin_lock"]+c["pthread_spin_trylock"], c["pthread_spin_unlock"], rep.Stats.TraceChecks)
	count := map[string]int{}
	for _, f := range rep.Findings {
		count[f.Severity+" "+f.Kind]++
		switch {
		case f.Severity == "error" && f.Kind == "self-deadlock" && !strings.HasPrefix(f.Title, "self-deadlock hazard"):
			t.Errorf("%s: impossible finding in a job that finished: %s\n%s", what, f.Title, f.Detail)
		case f.Severity == "error" && (f.Kind == "allocator-reentry" || f.Kind == "self-deadlock") && rep.Stats.LostEvents == 0:
			t.Errorf("%s: %s in a complete trace: %s\n%s", what, f.Kind, f.Title, f.Detail)
			for _, e := range f.Edges {
				t.Logf("    %s%s", e.Context, frames(e.Stack))
			}
		case f.Severity == "error":
			t.Logf("%s: error (%d events lost): %s", what, rep.Stats.LostEvents, f.Title)
		case f.Kind == "hook-lock" || f.Kind == "trace-inconsistency" || f.Kind == "lock-misuse":
			t.Logf("%s: %s %s: %s", what, f.Severity, f.Kind, f.Title)
			for _, e := range f.Edges {
				if e.Context != "" {
					t.Logf("    %s (arena %s)%s", e.Context, e.Arena, frames(e.Stack))
				}
			}
		}
	}
	t.Logf("%s: findings %v", what, count)
}

// checkHook checks, in a complete trace, the hook-lock finding of the
// release hook inside free: a lock named with lock, the arena held, the
// hook's path on its stack. With events lost its first sighting may be
// among them.
func checkHook(t *testing.T, what string, rep *mpiReport, lock string, path []string) {
	t.Helper()
	if lock == "" || rep.Stats.LostEvents != 0 {
		return
	}
	for _, f := range rep.Findings {
		if f.Kind != "hook-lock" || !strings.Contains(strings.Join(f.Locks, " "), lock) {
			continue
		}
		for _, e := range f.Edges {
			have := map[string]bool{}
			for _, fr := range e.Stack {
				have[fr.Function] = true
			}
			all := e.Arena == "held"
			for _, fn := range path {
				all = all && have[fn]
			}
			if all {
				return
			}
		}
	}
	t.Errorf("%s: no hook-lock finding of a %s lock taken inside free with the arena held, through %v", what, lock, path)
}

// frames shows a stack as the functions (or objects) on it, innermost first.
func frames(stack []struct {
	Function string `json:"function"`
	Object   string `json:"object"`
}) string {
	var b strings.Builder
	for i, f := range stack {
		if i == 12 {
			b.WriteString(" ← ...")
			break
		}
		name := f.Function
		if name == "" {
			name = "(" + filepath.Base(f.Object) + ")"
		}
		b.WriteString(" ← " + name)
	}
	return b.String()
}

func readMPIReport(t *testing.T, data []byte, what string) *mpiReport {
	t.Helper()
	var rep mpiReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("%s: report is not JSON: %v\n%s", what, err, data)
	}
	return &rep
}

// TestOpenMPIJob runs the ping-pong job in each configuration, once with
// hooktrace attached to rank 0 for 2 s, once with every rank run under
// hooktrace by mpirun. The job must be unharmed, the frees' munmap and
// madvise calls seen, and no error may contradict the job's finishing.
func TestOpenMPIJob(t *testing.T) {
	testenv.RequireBPF(t)
	mpirun := testenv.Tool(t, "apt-get install -y openmpi-bin libopenmpi-dev libucx0", "mpirun")
	prog := testenv.C{Compiler: "mpicc", Source: filepath.Join("testdata", "mpi_pingpong.c")}.Build(t)
	for _, cfg := range mpiConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			check := func(t *testing.T, what string, rep *mpiReport) {
				checkMPIReport(t, what, rep)
				checkHook(t, what, rep, cfg.hookLock, cfg.hookPath)
			}
			// auto as root: the preload recorder injected, plus the
			// syscall tracepoint; then eBPF's uprobes, for the same
			// hook findings.
			t.Run("attach", func(t *testing.T) { mpiAttach(t, mpirun, cfg.mca, prog, "auto", check) })
			t.Run("attach-ebpf", func(t *testing.T) { mpiAttach(t, mpirun, cfg.mca, prog, "ebpf", check) })
			t.Run("run", func(t *testing.T) { mpiRun(t, mpirun, cfg.mca, prog, check) })
		})
	}
}

// mpiAttach starts the job playing until told to stop on its stdin,
// attaches to rank 0 for 2 s, then stops the job.
func mpiAttach(t *testing.T, mpirun string, mca []string, prog, recorder string, check func(*testing.T, string, *mpiReport)) {
	cmd := exec.Command(mpirun, mpirunArgs(mca, prog, "30", "stdin")...)
	cmd.Env = mpiEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdout)
	var seen strings.Builder
	pid := 0
	for pid == 0 {
		line, err := out.ReadString('\n')
		seen.WriteString(line)
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the job ended before printing rank 0's PID: %v\n%s%s", err, seen.String(), stderr.String())
		}
		fmt.Sscanf(line, "rank 0 pid %d", &pid)
	}
	trace := filepath.Join(t.TempDir(), "attach.htr")
	report, stderrA, code := hooktrace(t, nil, "attach", "--pid", fmt.Sprint(pid), "--duration", "2s",
		"--format", "json", "--fail-on", "none", "-o", trace, "--recorder", recorder)
	// Rank 0 plays until told to stop (or for 30 s): attach ended at its
	// --duration, though the rank kept the ring busy, and left it playing.
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("attach --duration 2s returned after rank 0 ended (%v): it waited for the target", err)
	}
	// Stop the job whatever attach did, and check it.
	io.WriteString(stdin, "stop\n")
	stdin.Close()
	rest, _ := io.ReadAll(out)
	seen.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the job after attach: %v\n%s%s", err, seen.String(), stderr.String())
	}
	checkJob(t, seen.String(), 2)
	if code != 0 {
		t.Fatalf("attach exit %d\n%s", code, stderrA)
	}
	if s := strings.TrimSpace(stderrA); s != "" {
		t.Logf("attach's stderr:\n%s", s)
	}
	rep := readMPIReport(t, []byte(report), "attach")
	want := map[string]string{"auto": "preload+sys_enter", "ebpf": "ebpf"}[recorder]
	if len(rep.Stats.Traces) != 1 || rep.Stats.Traces[0].Recorder != want {
		t.Errorf("attach --recorder %s: traces %+v, want one recorded by %s", recorder, rep.Stats.Traces, want)
	}
	checkNoLoss(t, "attach to rank 0", rep)
	check(t, "attach to rank 0", rep)
}

// checkNoLoss checks that the ring kept up at default settings. The hooks
// run inside free thousands of times a second, each lock and memory
// syscall there with the arena question to answer from a raw stack: each
// (site, held locks, path) is copied once, and the job loses nothing.
func checkNoLoss(t *testing.T, what string, rep *mpiReport) {
	t.Helper()
	if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
		t.Errorf("%s: %d events lost at default settings; incomplete: %s", what, rep.Stats.LostEvents, rep.Stats.Incomplete)
	}
}

// mpiRun runs the job for a second with each rank under hooktrace run,
// reports to files so that stdout is the job's alone.
func mpiRun(t *testing.T, mpirun string, mca []string, prog string, check func(*testing.T, string, *mpiReport)) {
	dir := t.TempDir()
	cmd := exec.Command(mpirun, mpirunArgs(mca, hooktraceBin, "run", "--fail-on", "none",
		"--report", "rank-%r.json", "-o", "trace-%r.htr", "--", prog, "1")...)
	cmd.Env = mpiEnv()
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("mpirun: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	checkJob(t, stdout.String(), 2)
	for _, r := range []string{"0", "1"} {
		data, err := os.ReadFile(filepath.Join(dir, "rank-"+r+".json"))
		if err != nil {
			t.Fatalf("rank %s: %v\n%s", r, err, stderr.String())
		}
		rep := readMPIReport(t, data, "rank "+r)
		checkNoLoss(t, "rank "+r, rep)
		if rep.Stats.ExitStatus == nil || *rep.Stats.ExitStatus != 0 {
			t.Errorf("rank %s: exit status %v in the report", r, rep.Stats.ExitStatus)
		}
		if rep.Stats.Calls["exec"] != 1 {
			t.Errorf("rank %s: %d execs seen, want the rank's one", r, rep.Stats.Calls["exec"])
		}
		check(t, "run rank "+r, rep)
		if _, err := os.Stat(filepath.Join(dir, "trace-"+r+".htr")); err != nil {
			t.Errorf("rank %s: %v", r, err)
		}
	}
}

// TestMPIUnprivileged runs the ping-pong job on 4 ranks as an ordinary
// user in each configuration, every rank under hooktrace run with the
// recorder auto picks without privileges, the preloaded library:
//
//	mpirun -n 4 <mca> hooktrace run --recorder auto --probe MPI_Send -o DIR/trace-%r.htr -- pingpong 1
//
// The job must print what it prints untraced; each rank must leave a
// complete trace from the preload recorder that counts its allocator and
// lock calls, and each of its MPI_Send calls (in libmpi.so.40.30.4, which
// the loader knows as libmpi.so.40); analyze, as that user too, of the
// four traces merged must
// find no error that the job's finishing contradicts. Without the syscall
// tracepoint the recorder does not see free's own munmap and madvise
// (glibc makes them inside libc, past any PLT), but it sees what a
// runtime's release hook, patched into them, does there: UCX's spinlock
// and libfabric's locks, taken inside free with the arena held, as the
// eBPF recorder does.
func TestMPIUnprivileged(t *testing.T) {
	mpirun := testenv.Tool(t, "apt-get install -y openmpi-bin libopenmpi-dev libucx0", "mpirun")
	prog := testenv.C{Compiler: "mpicc", Source: filepath.Join("testdata", "mpi_pingpong.c")}.Build(t)
	const ranks = 4
	for _, cfg := range mpiConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			dir := nobodyDir(t)
			job := func(argv ...string) string {
				t.Helper()
				args := append([]string{mpirun, "--oversubscribe", "-n", fmt.Sprint(ranks)}, cfg.mca...)
				cmd := asNobody(t, prog, append(args, argv...)...)
				// mpirun keeps its session directory in TMPDIR and
				// reads settings from HOME: both must be the user's.
				cmd.Env = append(os.Environ(), "HOME="+dir, "TMPDIR="+dir)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				start := time.Now()
				if err := cmd.Run(); err != nil {
					t.Fatalf("mpirun %v: %v\n%s%s", argv, err, stdout.String(), stderr.String())
				}
				t.Logf("%s: %.1f s", filepath.Base(argv[0]), time.Since(start).Seconds())
				return stdout.String()
			}
			untraced := job(prog, "1")
			checkJob(t, untraced, ranks)
			traced := job(hooktraceBin, "run", "--recorder", "auto", "--fail-on", "none", "--probe", "MPI_Send",
				"-o", filepath.Join(dir, "trace-%r.htr"), "--report", filepath.Join(dir, "rank-%r.json"), "--", prog, "1")
			rounds := checkJob(t, traced, ranks)
			if a, b := jobShape(untraced), jobShape(traced); a != b {
				t.Errorf("traced, the job printed\n%s\nuntraced\n%s", b, a)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "hooktrace-*")); len(left) != 0 {
				t.Errorf("left behind in TMPDIR: %v", left)
			}

			traces := make([]string, ranks)
			for r := range traces {
				what := fmt.Sprintf("rank %d", r)
				traces[r] = filepath.Join(dir, fmt.Sprintf("trace-%d.htr", r))
				data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.json", r)))
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				rep := readMPIReport(t, data, what)
				checkPreloadTraces(t, what, rep, 1)
				c := rep.Stats.Calls
				if c["exec"] != 1 || c["malloc"] == 0 || c["free"] == 0 || c["pthread_mutex_lock"] == 0 ||
					c["pthread_mutex_lock"] != c["pthread_mutex_unlock"] {
					t.Errorf("%s: calls %v: want the rank's one exec, its mallocs and frees, balanced mutex locks", what, c)
				}
				// One send a round trip, and the last one's, which ends
				// the play.
				if want := uint64(rounds[r] + 1); c["probe_enter"] != want || c["probe_exit"] != want {
					t.Errorf("%s: MPI_Send entered %d times, left %d times; want %d", what, c["probe_enter"], c["probe_exit"], want)
				}
				checkMPIFindings(t, what, rep)
				checkHook(t, what, rep, cfg.hookLock, cfg.hookPath)
			}

			cmd := asNobody(t, prog, append([]string{hooktraceBin, "analyze", "--format", "json", "--fail-on", "none"}, traces...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("analyze of the merged ranks: %v\n%s", err, stderr.String())
			}
			rep := readMPIReport(t, out, "merged")
			checkPreloadTraces(t, "merged", rep, ranks)
			checkMPIFindings(t, "merged", rep)
			checkHook(t, "merged", rep, cfg.hookLock, cfg.hookPath)
			for _, f := range rep.Findings {
				if cfg.hookLock != "" && f.Kind == "hook-lock" && strings.Contains(strings.Join(f.Locks, " "), cfg.hookLock) &&
					strings.Contains(f.Title, "free") && f.Occurrences != ranks {
					t.Errorf("merged: %q seen in %d ranks, want all %d", f.Title, f.Occurrences, ranks)
				}
			}
		})
	}
}

// jobShape is the job's output with the numbers taken out, in order: what
// a job prints, whoever runs it and however fast.
func jobShape(out string) string {
	lines := strings.Split(strings.TrimSpace(regexp.MustCompile(`\d+`).ReplaceAllString(out, "N")), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// checkPreloadTraces checks that a report covers n traces, each recorded
// by the preloaded library, complete, nothing lost, its rank exiting 0.
func checkPreloadTraces(t *testing.T, what string, rep *mpiReport, n int) {
	t.Helper()
	checkNoLoss(t, what, rep)
	if len(rep.Stats.Traces) != n {
		t.Fatalf("%s: %d traces, want %d", what, len(rep.Stats.Traces), n)
	}
	for _, tr := range rep.Stats.Traces {
		if tr.Recorder != "preload" || !tr.Complete || tr.LostEvents != 0 || tr.ExitStatus == nil || *tr.ExitStatus != 0 {
			t.Errorf("%s: trace %s: recorder %q, complete %v, %d lost, exit status %v; want preload, complete, 0, 0",
				what, tr.Source, tr.Recorder, tr.Complete, tr.LostEvents, tr.ExitStatus)
		}
	}
}

// TestMPIFindingIDsStable runs the ping-pong job three times in each
// configuration whose release hook takes a lock, every rank under
// hooktrace run, and gates each run's merged ranks against the first's
// report as a CI job would against a baseline made in an earlier run:
// the same finding IDs every time, nothing new, nothing fixed. Which
// allocator call and which hooked call a hook is first seen in changes
// from run to run (the rank's threads race); a finding's ID does not
// depend on it.
func TestMPIFindingIDsStable(t *testing.T) {
	mpirun := testenv.Tool(t, "apt-get install -y openmpi-bin libopenmpi-dev libucx0", "mpirun")
	prog := testenv.C{Compiler: "mpicc", Source: filepath.Join("testdata", "mpi_pingpong.c")}.Build(t)
	const runs = 3
	for _, cfg := range mpiConfigs {
		if cfg.hookLock == "" {
			continue
		}
		t.Run(cfg.name, func(t *testing.T) {
			var first string
			var firstIDs []string
			for i := 0; i < runs; i++ {
				dir := t.TempDir()
				cmd := exec.Command(mpirun, mpirunArgs(cfg.mca, hooktraceBin, "run", "--fail-on", "none",
					"-o", "trace-%r.htr", "--", prog, "1")...)
				cmd.Env = mpiEnv()
				cmd.Dir = dir
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil {
					t.Fatalf("run %d: mpirun: %v\n%s%s", i, err, stdout.String(), stderr.String())
				}
				checkJob(t, stdout.String(), 2)
				traces := []string{filepath.Join(dir, "trace-0.htr"), filepath.Join(dir, "trace-1.htr")}
				args := []string{"analyze", "--format", "json", "--fail-on", "info"}
				if first != "" {
					args = append(args, "--baseline", first)
				}
				out, stderrA, code := hooktrace(t, nil, append(args, traces...)...)
				var rep struct {
					mpiReport
					Gate *struct {
						New   []string          `json:"new"`
						Fixed []json.RawMessage `json:"fixed"`
					} `json:"gate"`
				}
				if err := json.Unmarshal([]byte(out), &rep); err != nil {
					t.Fatalf("run %d: analyze exit %d: %v\n%s", i, code, err, stderrA)
				}
				checkNoLoss(t, fmt.Sprintf("run %d", i), &rep.mpiReport)
				ids := reportIDs(out)
				t.Logf("run %d: %v", i, ids)
				for _, f := range rep.Findings {
					t.Logf("run %d: %s %s: %s", i, f.Severity, f.Kind, f.Title)
				}
				if first == "" {
					if !anyHookLock(&rep.mpiReport, cfg.hookLock) {
						t.Fatalf("run %d: no hook-lock finding of a %s lock: nothing to compare", i, cfg.hookLock)
					}
					first = filepath.Join(t.TempDir(), "baseline.json")
					if err := os.WriteFile(first, []byte(out), 0o644); err != nil {
						t.Fatal(err)
					}
					firstIDs = ids
					continue
				}
				if strings.Join(ids, " ") != strings.Join(firstIDs, " ") || rep.Gate == nil || len(rep.Gate.New) != 0 ||
					len(rep.Gate.Fixed) != 0 || code != 0 {
					t.Errorf("run %d against run 0 as baseline: exit %d, IDs %v, want %v (gate %+v)\n%s", i, code, ids, firstIDs, rep.Gate, stderrA)
				}
			}
		})
	}
}

// reportIDs is the sorted finding IDs of a JSON report.
func reportIDs(report string) []string {
	var rep struct {
		Findings []struct {
			ID string `json:"id"`
		} `json:"findings"`
	}
	json.Unmarshal([]byte(report), &rep)
	var ids []string
	for _, f := range rep.Findings {
		ids = append(ids, f.ID)
	}
	sort.Strings(ids)
	return ids
}

// anyHookLock reports whether rep has a hook-lock finding of a lock named
// with lock.
func anyHookLock(rep *mpiReport, lock string) bool {
	for _, f := range rep.Findings {
		if f.Kind == "hook-lock" && strings.Contains(strings.Join(f.Locks, " "), lock) {
			return true
		}
	}
	return false
}
