//go:build linux && amd64

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/rcache"
)

// attach --recorder preload: the recorder library injected into a running
// process through ptrace, as an ordinary user (as root, the tests run
// both as user nobody).

// commandTarget is testdata/attached.c running, as user nobody when the
// tests run as root: told what to do on stdin, answering on stdout.
type commandTarget struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	lines []string // everything it printed
}

func startCommandTarget(t *testing.T) *commandTarget {
	t.Helper()
	prog := testenv.Program(t, "attached")
	c := &commandTarget{t: t, cmd: asNobody(t, prog, prog)}
	var err error
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.out = bufio.NewReader(stdout)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	c.expect("ready")
	return c
}

func (c *commandTarget) pid() int { return c.cmd.Process.Pid }

// expect reads the target's next line, which must start with prefix.
func (c *commandTarget) expect(prefix string) string {
	c.t.Helper()
	line, err := c.out.ReadString('\n')
	if err != nil {
		c.t.Fatalf("the target's output ended (%v) before %q", err, prefix)
	}
	line = strings.TrimSuffix(line, "\n")
	c.lines = append(c.lines, line)
	if !strings.HasPrefix(line, prefix) {
		c.t.Fatalf("the target said %q, want %q", line, prefix)
	}
	return line
}

// phase runs a phase of n iterations (n malloc, n free, 4n locks) and
// waits for its end.
func (c *commandTarget) phase(n int) {
	c.t.Helper()
	fmt.Fprintf(c.in, "phase %d\n", n)
	c.expect(fmt.Sprintf("phase %d ", n))
}

// exit ends the target and returns its exit status.
func (c *commandTarget) exit() int {
	c.t.Helper()
	io.WriteString(c.in, "exit\n")
	rest, _ := io.ReadAll(c.out)
	err := c.cmd.Wait()
	if len(rest) > 0 {
		c.t.Errorf("the target said more before it exited: %q", rest)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return 0
}

// liveAttach is `hooktrace attach` running as the target's user.
type liveAttach struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	trace          string
	done           chan error
}

// startAttach attaches to pid with args, as the target's user, and waits
// for its ready file: recording is on.
func startAttach(t *testing.T, pid int, args ...string) *liveAttach {
	t.Helper()
	return startAttachAs(t, pid, false, args...)
}

// startAttachAs is startAttach as root when asRoot is set.
func startAttachAs(t *testing.T, pid int, asRoot bool, args ...string) *liveAttach {
	t.Helper()
	dir := nobodyDir(t)
	ready := filepath.Join(dir, "ready")
	a := &liveAttach{trace: filepath.Join(dir, "live.htr"), done: make(chan error, 1)}
	argv := append([]string{hooktraceBin, "attach", "--pid", fmt.Sprint(pid), "--ready-file", ready,
		"-o", a.trace, "--format", "json", "--fail-on", "none", "--hang-timeout", "0"}, args...)
	if asRoot {
		a.cmd = exec.Command(argv[0], argv[1:]...)
	} else {
		a.cmd = asNobody(t, hooktraceBin, argv...)
	}
	a.cmd.Stdout, a.cmd.Stderr = &a.stdout, &a.stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(func() { a.cmd.Process.Kill() })
	for {
		if _, err := os.Stat(ready); err == nil {
			return a
		}
		select {
		case err := <-a.done:
			t.Fatalf("attach ended before it was ready (%v):\n%s", err, a.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the attach as Ctrl-C does and returns its report.
func (a *liveAttach) stop(t *testing.T) jsonReport {
	t.Helper()
	// setpriv execs hooktrace: the process is hooktrace's.
	a.cmd.Process.Signal(os.Interrupt)
	if err := <-a.done; err != nil {
		t.Fatalf("attach: %v\n%s", err, a.stderr.String())
	}
	return parseReport(t, a.stdout.String())
}

// checkPhaseCounts checks the calls of one phase of n, exactly.
func checkPhaseCounts(t *testing.T, what string, calls map[string]uint64, n uint64) {
	t.Helper()
	for name, want := range map[string]uint64{"malloc": n, "free": n, "pthread_mutex_lock": 4 * n, "pthread_mutex_unlock": 4 * n} {
		if calls[name] != want {
			t.Errorf("%s: %s counted %d times, want %d (all: %v)", what, name, calls[name], want, calls)
		}
	}
}

// TestAttachPreload: an ordinary user attaches to a running program with
// the preload recorder (the library injected with ptrace), while it is
// blocked in read(2); a phase run while attached is counted exactly, in
// the report and in analyze of the trace, with the inversion between its
// two threads and their stacks; the program runs on after the detach and
// ends as it would have.
func TestAttachPreload(t *testing.T) {
	c := startCommandTarget(t)
	a := startAttach(t, c.pid(), "--recorder", "preload")
	c.phase(1000)
	rep := a.stop(t)
	checkPhaseCounts(t, "attach", rep.Stats.Calls, 1000)
	noTraceChecks(t, "attach", rep)
	if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
		t.Errorf("lost %d, complete %v (%s)", rep.Stats.LostEvents, rep.Stats.Complete, rep.Stats.Incomplete)
	}
	if len(rep.Stats.Traces) != 1 || !strings.HasPrefix(rep.Stats.Traces[0].Recorder, "preload") {
		t.Errorf("traces: %+v, want one recorded by preload", rep.Stats.Traces)
	}
	_, fs := findingsOf(t, a.stdout.String())
	checkAttachedInversion(t, fs)

	out, stderr, code := hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", a.trace)
	if code != 0 {
		t.Fatalf("analyze: exit %d\n%s", code, stderr)
	}
	checkPhaseCounts(t, "analyze", parseReport(t, out).Stats.Calls, 1000)

	c.phase(10)
	if code := c.exit(); code != 7 {
		t.Errorf("the target exited %d after the detach, want 7", code)
	}
}

// checkAttachedInversion wants the lock-order cycle of attached.c's two threads,
// with the functions that took each lock.
func checkAttachedInversion(t *testing.T, fs []analyzer.Finding) {
	t.Helper()
	f := findingOfKind(fs, analyzer.KindLockOrderCycle)
	if f == nil {
		t.Fatalf("no lock-order-cycle finding in %d findings", len(fs))
	}
	if !strings.Contains(f.Title, "lock_a") || !strings.Contains(f.Title, "lock_b") {
		t.Errorf("finding %q does not name lock_a and lock_b", f.Title)
	}
	var a, b bool
	for i := range f.Edges {
		a = a || edgeStackHas(&f.Edges[i], "a_then_b")
		b = b || edgeStackHas(&f.Edges[i], "b_then_a")
	}
	if !a || !b {
		t.Errorf("the cycle's stacks lack a_then_b (%v) or b_then_a (%v)", a, b)
	}
}

// TestAttachPreloadCycles: ten attaches and detaches of one running
// program, each counting its phase exactly (the second and later find the
// library loaded and reuse it), leave the program's output and exit status
// what an untraced run of the same commands gives.
func TestAttachPreloadCycles(t *testing.T) {
	c := startCommandTarget(t)
	ref := startCommandTarget(t)
	for i := range 10 {
		a := startAttach(t, c.pid(), "--recorder", "preload")
		c.phase(100 + i)
		rep := a.stop(t)
		checkPhaseCounts(t, fmt.Sprintf("attach %d", i+1), rep.Stats.Calls, uint64(100+i))
		ref.phase(100 + i)
	}
	if n := mappedInjected(t, c.pid(), "libhooktrace_inject-"); n != 1 {
		t.Errorf("the recorder library is mapped from %d files after 10 attaches, want 1", n)
	}
	// No thread was in the library at any attach: each let the earlier
	// memories go, and the last detach's stays.
	if n := mappedInjected(t, c.pid(), "hooktrace-ring"); n != 1 {
		t.Errorf("%d shared memories mapped after 10 attaches, want 1", n)
	}
	c.phase(1000)
	ref.phase(1000)
	if code, want := c.exit(), ref.exit(); code != want {
		t.Errorf("exit status %d after the attaches, %d untraced", code, want)
	}
	if got, want := strings.Join(c.lines, "\n"), strings.Join(ref.lines, "\n"); got != want {
		t.Errorf("output after the attaches:\n%s\nuntraced:\n%s", got, want)
	}
}

// mappedInjected counts what pid maps from offset 0 of files whose name
// has name in it: the loads of a library, the shared memories.
func mappedInjected(t *testing.T, pid int, name string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 6 && f[2] == "00000000" && strings.Contains(f[5], name) {
			n++
		}
	}
	return n
}

// TestAttachPreloadKilled: an attach killed with SIGKILL, whose ring then
// fills with no reader, leaves the program running at full speed to its
// normal end: its writers drop records instead of waiting.
func TestAttachPreloadKilled(t *testing.T) {
	c := startCommandTarget(t)
	ref := startCommandTarget(t)
	a := startAttach(t, c.pid(), "--recorder", "preload", "--mode", "full", "--ring", "4K")
	a.cmd.Process.Kill()
	<-a.done
	c.phase(20000)
	ref.phase(20000)
	if code, want := c.exit(), ref.exit(); code != want {
		t.Errorf("exit status %d after the attach was killed, %d untraced", code, want)
	}
	if got, want := strings.Join(c.lines, "\n"), strings.Join(ref.lines, "\n"); got != want {
		t.Errorf("output after the attach was killed:\n%s\nuntraced:\n%s", got, want)
	}
}

// runAttachAsNobody runs attach to pid as the target's (unprivileged)
// user, with hang detection off, and returns stderr and the exit status.
func runAttachAsNobody(t *testing.T, pid int, args ...string) (string, int) {
	t.Helper()
	argv := append([]string{hooktraceBin, "attach", "--pid", fmt.Sprint(pid), "--hang-timeout", "0", "--duration", "1s",
		"-o", filepath.Join(nobodyDir(t), "t.htr")}, args...)
	c := asNobody(t, hooktraceBin, argv...)
	var stderr strings.Builder
	c.Stderr = &stderr
	err := c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return stderr.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return stderr.String(), 0
}

// TestAttachPreloadUnsafe: a thread that stays inside malloc (a memory
// hook, run by glibc's munmap inside malloc, waits for a lock its own
// thread holds) is never a safe point to load the library: attach tries
// again for a bounded time, then says which thread is where. auto then
// needs eBPF, which an ordinary user may not load: exit 4, with both
// reasons.
func TestAttachPreloadUnsafe(t *testing.T) {
	cmd := startHung(t, testenv.Program(t, "hookhang"))
	if cmd == nil {
		t.Fatal("testdata/hookhang.c exited")
	}
	pid := cmd.Process.Pid
	stderr, code := runAttachAsNobody(t, pid, "--recorder", "preload")
	if code != exitFailure || !strings.Contains(stderr, "no safe point to load the recorder") ||
		!strings.Contains(stderr, "inside the allocator") {
		t.Errorf("--recorder preload: exit %d, want %d, saying that a thread is inside the allocator:\n%s", code, exitFailure, stderr)
	}
	if os.Geteuid() != 0 {
		return
	}
	stderr, code = runAttachAsNobody(t, pid)
	if code != exitPermission || !strings.Contains(stderr, "inside the allocator") || !strings.Contains(stderr, "not permitted to load BPF") {
		t.Errorf("auto: exit %d, want %d, with both reasons:\n%s", code, exitPermission, stderr)
	}
	if state, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(state), ") Z") {
		t.Errorf("the target is not alive after the attempts: %s %v", state, err)
	}
}

// TestAttachPreloadStatic: a static program has no loader to load a
// library: --recorder preload says so; auto says it would need eBPF, which
// an ordinary user may not load (exit 4).
func TestAttachPreloadStatic(t *testing.T) {
	prog := testenv.C{Source: filepath.Join(testenv.RepoRoot(t), "testdata", "attached.c"), Name: "attached_static",
		Flags: append(append([]string(nil), testenv.CFlags...), "-static")}.Build(t)
	c := &commandTarget{t: t, cmd: asNobody(t, prog, prog)}
	var err error
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, _ := c.cmd.StdoutPipe()
	c.out = bufio.NewReader(stdout)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c.cmd.Process.Kill(); c.cmd.Wait() }()
	c.expect("ready")
	stderr, code := runAttachAsNobody(t, c.pid(), "--recorder", "preload")
	if code != exitFailure || !strings.Contains(stderr, "maps no libc (a static program)") {
		t.Errorf("--recorder preload: exit %d, want %d, saying the program is static:\n%s", code, exitFailure, stderr)
	}
	if os.Geteuid() == 0 {
		stderr, code = runAttachAsNobody(t, c.pid())
		if code != exitPermission || !strings.Contains(stderr, "a static program") || !strings.Contains(stderr, "not permitted to load BPF") {
			t.Errorf("auto: exit %d, want %d, with both reasons:\n%s", code, exitPermission, stderr)
		}
	}
	c.phase(10)
}

// TestAttachPreloadParity: root attaches to an ordinary user's program
// with each recorder in turn (the injected library reaches its shared
// memory whoever runs it), and each finds the same inversion, with the
// same ID, and counts the same calls of its phase; auto, as root, is the
// injected library plus the kernel's syscall tracepoint.
func TestAttachPreloadParity(t *testing.T) {
	testenv.RequireBPF(t)
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "needs root, to attach to another user's process")
	}
	c := startCommandTarget(t)
	ids := map[string]string{}
	for _, rec := range []string{"ebpf", "preload", "auto"} {
		a := startAttachAs(t, c.pid(), true, "--recorder", rec)
		c.phase(500)
		rep := a.stop(t)
		for name, want := range map[string]uint64{"malloc": 500, "free": 500, "pthread_mutex_lock": 2000, "pthread_mutex_unlock": 2000} {
			// A uprobe on malloc also sees glibc's internal calls.
			if got := rep.Stats.Calls[name]; got != want && (rec != "ebpf" || got < want) {
				t.Errorf("%s: %s counted %d times, want %d", rec, name, got, want)
			}
		}
		want := map[string]string{"ebpf": "ebpf", "preload": "preload", "auto": "preload+sys_enter"}[rec]
		if len(rep.Stats.Traces) != 1 || rep.Stats.Traces[0].Recorder != want {
			t.Errorf("%s: traces %+v, want one recorded by %s", rec, rep.Stats.Traces, want)
		}
		_, fs := findingsOf(t, a.stdout.String())
		checkAttachedInversion(t, fs)
		if f := findingOfKind(fs, analyzer.KindLockOrderCycle); f != nil {
			ids[rec] = f.ID
		}
	}
	if ids["ebpf"] != ids["preload"] || ids["ebpf"] != ids["auto"] {
		t.Errorf("the inversion's ID differs by recorder: %v", ids)
	}
	if code := c.exit(); code != 7 {
		t.Errorf("the target exited %d, want 7", code)
	}
}

// TestAttachPreloadSeedCase: the registration cache's legacy variant,
// attached while it runs, as an ordinary user with the injected library:
// its memory hook takes vma_lock inside glibc's free, with the arena held,
// and the cycle through the arena is found, as eBPF attach finds it (same
// ID, as root).
func TestAttachPreloadSeedCase(t *testing.T) {
	if _, err := rcache.Compiler(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	b, err := rcache.Build(nobodyDir(t))
	if err != nil {
		t.Fatal(err)
	}
	attachSeed := func(t *testing.T, asRoot bool, rec string) *analyzer.Finding {
		t.Helper()
		cmd := asNobody(t, b.Workload, b.Workload, "--variant", "legacy", "--seconds", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		a := startAttachAs(t, cmd.Process.Pid, asRoot, "--recorder", rec)
		time.Sleep(2 * time.Second)
		rep := a.stop(t)
		_, fs := findingsOf(t, a.stdout.String())
		for i := range fs {
			f := &fs[i]
			if f.Kind == analyzer.KindLockOrderCycle && sameSet(f.Locks, []string{"vma_lock (librcache.so)", "glibc malloc arena"}) {
				return f
			}
		}
		t.Fatalf("%s: no cycle through vma_lock and the arena in %d findings (calls %v)\n%s", rec, len(fs), rep.Stats.Calls, a.stderr.String())
		return nil
	}
	pre := attachSeed(t, false, "preload")
	t.Run("ebpf", func(t *testing.T) {
		testenv.RequireBPF(t)
		if os.Geteuid() != 0 {
			testenv.Unavailable(t, "needs root, to attach to another user's process")
		}
		if f := attachSeed(t, true, "ebpf"); f.ID != pre.ID {
			t.Errorf("eBPF attach found %s %q, preload %s %q", f.ID, f.Title, pre.ID, pre.Title)
		}
	})
}

// TestAttachPreloadBlockedInWrapper: a thread that entered
// pthread_cond_wait through the library during one attach, and still
// waits in it, does not keep the next attach from loading (it is not
// running the library's code), nor the detach after it; the program ends
// as it would have.
func TestAttachPreloadBlockedInWrapper(t *testing.T) {
	c := startCommandTarget(t)
	a := startAttach(t, c.pid(), "--recorder", "preload")
	io.WriteString(c.in, "hold\n")
	c.expect("held")
	a.stop(t)
	a = startAttach(t, c.pid(), "--recorder", "preload")
	// The holder waits inside the library's wrapper: the first attach's
	// memory stays, as does the second's.
	if n := mappedInjected(t, c.pid(), "hooktrace-ring"); n != 2 {
		t.Errorf("%d shared memories mapped, want 2", n)
	}
	c.phase(300)
	io.WriteString(c.in, "release\n")
	c.expect("released")
	rep := a.stop(t)
	// A lock taken before the attach and released in it is what eBPF
	// attach sees too: no contradiction.
	noTraceChecks(t, "second attach", rep)
	// The phase's, then the release's: main locks and unlocks, the
	// holder returns from its wait and unlocks.
	for name, want := range map[string]uint64{"malloc": 300, "free": 300, "pthread_mutex_lock": 1201, "pthread_mutex_unlock": 1202} {
		if got := rep.Stats.Calls[name]; got != want {
			t.Errorf("%s counted %d times, want %d (all: %v)", name, got, want, rep.Stats.Calls)
		}
	}
	if code := c.exit(); code != 7 {
		t.Errorf("the target exited %d, want 7", code)
	}
}

// TestAttachPreloadExec: a program that execs while attached leaves no
// library to take out: the detach finds the new image (a shell, then
// cat) without it and leaves it alone, and it runs on.
func TestAttachPreloadExec(t *testing.T) {
	c := startCommandTarget(t)
	a := startAttach(t, c.pid(), "--recorder", "preload")
	c.phase(100)
	io.WriteString(c.in, "exec\n")
	c.expect("execd")
	io.WriteString(c.in, "echoed\n")
	c.expect("echoed")
	rep := a.stop(t)
	checkPhaseCounts(t, "before the exec", rep.Stats.Calls, 100)
	io.WriteString(c.in, "after the detach\n")
	c.expect("after the detach")
	c.in.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("cat after the detach: %v", err)
	}
}

// seccompProg installs an allow-all seccomp filter, says "ready" and
// waits for stdin to close.
const seccompProg = `#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(void)
{
	struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
	struct sock_fprog prog = {1, allow};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return 1;
	printf("ready\n");
	fflush(stdout);
	char c;
	while (read(0, &c, 1) == 1)
		;
	return 0;
}
`

// TestAttachPreloadSeccomp: a process under a seccomp filter is not
// injected (the library's system calls might break the filter):
// --recorder preload says so, and auto, as an ordinary user, exits 4
// naming it and eBPF's want of privilege.
func TestAttachPreloadSeccomp(t *testing.T) {
	prog := testenv.C{Code: seccompProg, Name: "seccomped"}.Build(t)
	cmd := asNobody(t, prog, prog)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the program said %q", line)
	}
	stderr, code := runAttachAsNobody(t, cmd.Process.Pid, "--recorder", "preload")
	if code != exitFailure || !strings.Contains(stderr, "runs under seccomp") {
		t.Errorf("--recorder preload: exit %d, want %d, saying the process runs under seccomp:\n%s", code, exitFailure, stderr)
	}
	if os.Geteuid() == 0 {
		stderr, code = runAttachAsNobody(t, cmd.Process.Pid)
		if code != exitPermission || !strings.Contains(stderr, "runs under seccomp") || !strings.Contains(stderr, "not permitted to load BPF") {
			t.Errorf("auto: exit %d, want %d, with both reasons:\n%s", code, exitPermission, stderr)
		}
	}
}

// TestAttachPreloadProbe: --probe under attach needs eBPF's uprobes (the
// injected library places no breakpoints): --recorder preload is a usage
// error, auto says it records with eBPF.
func TestAttachPreloadProbe(t *testing.T) {
	c := startCommandTarget(t)
	stderr, code := runAttachAsNobody(t, c.pid(), "--recorder", "preload", "--probe", "a_then_b")
	if code != exitUsage || !strings.Contains(stderr, "--probe and --forbid need the eBPF recorder") {
		t.Errorf("--recorder preload --probe: exit %d, want %d:\n%s", code, exitUsage, stderr)
	}
	stderr, _ = runAttachAsNobody(t, c.pid(), "--probe", "a_then_b")
	if !strings.Contains(stderr, "recording with eBPF: --probe and --forbid need the eBPF recorder") {
		t.Errorf("auto --probe does not say it records with eBPF:\n%s", stderr)
	}
	c.phase(10)
}

// TestAttachPreloadStopped: a process the user stopped (SIGSTOP) is not
// run by attach's calls: it says so, and the process stays stopped until
// continued, then runs on.
func TestAttachPreloadStopped(t *testing.T) {
	c := startCommandTarget(t)
	c.cmd.Process.Signal(syscall.SIGSTOP)
	for !strings.Contains(procState(t, c.pid()), ") T") {
		time.Sleep(5 * time.Millisecond)
	}
	stderr, code := runAttachAsNobody(t, c.pid(), "--recorder", "preload")
	if code != exitFailure || !strings.Contains(stderr, "is stopped (SIGSTOP, Ctrl-Z)") {
		t.Errorf("exit %d, want %d, saying the process is stopped:\n%s", code, exitFailure, stderr)
	}
	if st := procState(t, c.pid()); !strings.Contains(st, ") T") {
		t.Errorf("the process is no longer stopped: %s", st)
	}
	c.cmd.Process.Signal(syscall.SIGCONT)
	c.phase(10)
}

func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
