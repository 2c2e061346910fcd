package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/events"
)

// The lifecycle tests check what a CI job or a script sees of run and
// attach: the exit status, where the report goes, the ready file, and
// what is kept when hooktrace or its target is stopped.

// TestRunExitStatus: run exits with the target's status when it failed
// (128+N when signal N killed it), else 1 (--error-exitcode) when findings
// fail the gate, else 0; --ignore-target-status leaves the verdict alone.
// The target's stdout is its own: the report goes to stderr or a file.
// (A target killed by hang detection gives 137: TestRunCatchesRealDeadlock.)
func TestRunExitStatus(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	inversion := testenv.Program(t, "inversion")
	cases := []struct {
		name   string
		flags  []string
		argv   []string
		code   int
		stdout string // the target's, whole
		says   string // on stderr
	}{
		{"target exits 0", nil, []string{life, "exit", "0"}, 0, "exiting 0\n", "no findings"},
		{"target exits 3", nil, []string{life, "exit", "3"}, 3, "exiting 3\n", "the target exited with status 3"},
		{"target exits 3, ignored", []string{"--ignore-target-status"}, []string{life, "exit", "3"}, 0, "exiting 3\n", "no findings"},
		{"target killed by SIGSEGV", nil, []string{life, "segv"}, 128 + 11, "raising SIGSEGV\n", "killed by SIGSEGV: exit status 139"},
		{"target killed by SIGSEGV, ignored", []string{"--ignore-target-status"}, []string{life, "segv"}, 0, "raising SIGSEGV\n", "no findings"},
		{"findings fail the gate", nil, []string{inversion}, exitFindings, "", "lock order inversion"},
		{"findings, --error-exitcode", []string{"--error-exitcode", "42"}, []string{inversion}, 42, "", "lock order inversion"},
		{"findings under --fail-on none", []string{"--fail-on", "none"}, []string{inversion}, 0, "", "lock order inversion"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"run"}, c.flags...), "--")
			stdout, stderr, code := hooktrace(t, nil, append(args, c.argv...)...)
			if code != c.code || !strings.Contains(stderr, c.says) {
				t.Errorf("exit %d (want %d), stderr lacks %q:\n%s", code, c.code, c.says, stderr)
			}
			if stdout != c.stdout {
				t.Errorf("stdout %q: want the target's alone, %q", stdout, c.stdout)
			}
		})
	}
	t.Run("error-exitcode out of range", func(t *testing.T) {
		_, stderr, code := hooktrace(t, nil, "run", "--error-exitcode", "256", "--", life, "exit", "0")
		if code != exitUsage || !strings.Contains(stderr, "--error-exitcode") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
}

// TestRunReportNeverOnStdout: a machine-readable report of run goes to a
// file, and parses; asked for on stdout, it is a usage error, since the
// target writes there.
func TestRunReportNeverOnStdout(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	_, stderr, code := hooktrace(t, nil, "run", "--format", "json", "--", life, "exit", "0")
	if code != exitUsage || !strings.Contains(stderr, "--report json:FILE") {
		t.Errorf("run --format json: exit %d, stderr %q; want exit 2 naming --report", code, stderr)
	}
	report, stdout, stderr, code := runJSON(t, "--", life, "exit", "0")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if stdout != "exiting 0\n" {
		t.Errorf("stdout %q: want the target's alone", stdout)
	}
	r := parseReport(t, report)
	if r.Stats.ExitStatus == nil || *r.Stats.ExitStatus != 0 || r.Stats.Calls["pthread_mutex_lock"] < 3 {
		t.Errorf("report stats: %+v", r.Stats)
	}
	if !strings.Contains(stderr, "report written to") {
		t.Errorf("stderr lacks the one-line verdict:\n%s", stderr)
	}
}

// started is a hooktrace run or attach in the background.
type started struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	errf   *os.File // stderr: a file, as the target may outlive hooktrace
	done   chan error
}

func (s *started) stderr() string {
	b, _ := os.ReadFile(s.errf.Name())
	return string(b)
}

func startHooktrace(t *testing.T, name string, args ...string) *started {
	t.Helper()
	s := &started{cmd: exec.Command(name, args...), done: make(chan error, 1)}
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	s.errf = errf
	// Pipes of our own, not StdinPipe/StdoutPipe, which Wait closes when
	// hooktrace ends: the target may outlive it.
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = inR, outW, errf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	s.stdin, s.stdout = inW, bufio.NewReader(outR)
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		inW.Close()
		outR.Close()
		errf.Close()
	})
	go func() { s.done <- s.cmd.Wait() }()
	return s
}

// wait returns the exit status.
func (s *started) wait(t *testing.T) int {
	t.Helper()
	var ee *exec.ExitError
	err := <-s.done
	s.done <- err // for the cleanup
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// waitFile waits for path to exist and returns its content. The limit is
// only there to fail rather than hang.
func waitFile(t *testing.T, path string, s *started) string {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("ended before writing %s: %v\n%s", path, err, s.stderr())
		default:
		}
	}
	t.Fatalf("%s never appeared\n%s", path, s.stderr())
	return ""
}

// TestReadyFile: --ready-file appears with the traced PID once the probes
// are live; stderr says where they were placed. For run it is written
// before the target runs: a stale one is removed at start.
func TestReadyFile(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	t.Run("run", func(t *testing.T) {
		dir := t.TempDir()
		ready, report := filepath.Join(dir, "ready"), filepath.Join(dir, "r.json")
		// A stale ready file is removed first: a run that fails before
		// its probes are live leaves none.
		os.WriteFile(ready, []byte("stale\n"), 0o644)
		if _, stderr, code := hooktrace(t, nil, "run", "--ready-file", ready, "--probe", "no_such_fn", "--", life, "exit", "0"); code != exitNoSymbol {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
		if _, err := os.Stat(ready); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a stale ready file outlived a failed run: %v", err)
		}
		s := startHooktrace(t, hooktraceBin, "run", "--ready-file", ready, "--report", report, "--", life, "wait")
		content := waitFile(t, ready, s)
		pid, err := strconv.Atoi(strings.TrimSpace(content))
		if err != nil || pid <= 0 {
			t.Fatalf("ready file holds %q, want the target's PID", content)
		}
		if line, _ := s.stdout.ReadString('\n'); line != "waiting\n" {
			t.Fatalf("target said %q", line)
		}
		io.WriteString(s.stdin, "go on\n")
		if code := s.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s", code, s.stderr())
		}
		if !strings.Contains(s.stderr(), fmt.Sprintf("hooktrace: pid %d: ", pid)) || !(strings.Contains(s.stderr(), "libc.so.6 (") || strings.Contains(s.stderr(), "libhooktrace_preload.so (")) {
			t.Errorf("stderr does not say where the probes were placed:\n%s", s.stderr())
		}
		b, _ := os.ReadFile(report)
		// Every lock call of the target was seen: 3 before "waiting", 1 after.
		if r := parseReport(t, string(b)); r.Stats.Calls["pthread_mutex_lock"] < 4 {
			t.Errorf("calls %v: want the target's 4 pthread_mutex_lock", r.Stats.Calls)
		}
	})
	t.Run("attach", func(t *testing.T) {
		target := exec.Command(life, "wait")
		stdin, _ := target.StdinPipe()
		out, _ := target.StdoutPipe()
		if err := target.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			target.Process.Kill()
			target.Wait()
		}()
		if line, _ := bufio.NewReader(out).ReadString('\n'); line != "waiting\n" {
			t.Fatalf("target said %q", line)
		}
		dir := t.TempDir()
		ready := filepath.Join(dir, "ready")
		s := startHooktrace(t, hooktraceBin, "attach", "--pid", fmt.Sprint(target.Process.Pid), "--ready-file", ready, "--format", "json")
		if content := waitFile(t, ready, s); content != fmt.Sprintf("%d\n", target.Process.Pid) {
			t.Errorf("ready file holds %q", content)
		}
		// Live now: the one lock call the line triggers must be seen.
		io.WriteString(stdin, "go on\n")
		stdout, _ := io.ReadAll(s.stdout)
		if code := s.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s", code, s.stderr())
		}
		if r := parseReport(t, string(stdout)); r.Stats.Calls["pthread_mutex_lock"] < 1 {
			t.Errorf("calls %v: want the one pthread_mutex_lock made after the ready file", r.Stats.Calls)
		}
	})
}

// TestKilledTracerKeepsTrace: hooktrace killed with SIGKILL (an OOM kill,
// a lost node) leaves a readable trace: the header, and the records
// flushed within a second even though no more arrive. The target runs on.
func TestKilledTracerKeepsTrace(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	dir := t.TempDir()
	trace, ready := filepath.Join(dir, "t.htr"), filepath.Join(dir, "ready")
	s := startHooktrace(t, hooktraceBin, "run", "-o", trace, "--ready-file", ready, "--", life, "wait")
	waitFile(t, ready, s)
	if line, _ := s.stdout.ReadString('\n'); line != "waiting\n" {
		t.Fatalf("target said %q", line)
	}
	// The target now waits and sends nothing: its lock calls (their
	// pattern, in aggregate mode) must reach the file by the periodic
	// flush alone.
	locks := 0
	for deadline := time.Now().Add(time.Minute); locks == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		locks = countLocks(t, trace)
	}
	if locks == 0 {
		t.Fatalf("the trace holds no lock event after a minute")
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.wait(t)
	stdout, stderr, code := hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", trace)
	if code != 0 || !strings.Contains(stderr, "truncated") {
		t.Fatalf("analyze after SIGKILL: exit %d, stderr %q", code, stderr)
	}
	if r := parseReport(t, stdout); r.Stats.Complete {
		t.Errorf("a trace without a footer reported complete")
	}
	// The target, orphaned, is unharmed: it finishes when told to.
	io.WriteString(s.stdin, "go on\n")
	if rest, _ := io.ReadAll(s.stdout); string(rest) != "done\n" {
		t.Errorf("the target after hooktrace was killed said %q", rest)
	}
}

// countLocks counts the pthread_mutex_lock events of a trace, however far
// it was written.
func countLocks(t *testing.T, path string) int {
	r, err := events.Open(path)
	if err != nil {
		return 0
	}
	defer r.Close()
	n := 0
	for {
		rec, err := r.Next()
		if err != nil {
			return n
		}
		if rec.Kind == events.RecEvent && rec.Event.Op == events.OpMutexLock {
			n++
		}
	}
}

// TestStopRun: SIGTERM or SIGINT to run (timeout(1) sends SIGTERM) is
// passed on to the target; the trace and the report are finished after it
// exits and run exits with its status, 128+N.
func TestStopRun(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Fatalf("timeout(1) not found: %v", err)
	}
	cases := []struct {
		name string
		via  string // "timeout": signal timeout(1), which signals run; else run itself
		sig  syscall.Signal
	}{
		{"SIGTERM through timeout", "timeout", syscall.SIGTERM},
		{"SIGTERM to run alone", "", syscall.SIGTERM},
		{"SIGINT to run alone", "", syscall.SIGINT},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			trace, ready, report := filepath.Join(dir, "t.htr"), filepath.Join(dir, "ready"), filepath.Join(dir, "r.json")
			args := []string{"run", "-o", trace, "--ready-file", ready, "--report", report, "--", life, "wait"}
			var s *started
			if c.via == "timeout" {
				s = startHooktrace(t, "timeout", append([]string{"--preserve-status", "1h", hooktraceBin}, args...)...)
			} else {
				s = startHooktrace(t, hooktraceBin, args...)
			}
			waitFile(t, ready, s)
			if line, _ := s.stdout.ReadString('\n'); line != "waiting\n" {
				t.Fatalf("target said %q", line)
			}
			s.cmd.Process.Signal(c.sig)
			code := s.wait(t)
			if code != 128+int(c.sig) {
				t.Errorf("exit %d, want %d (the target killed by %v)\n%s", code, 128+int(c.sig), c.sig, s.stderr())
			}
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatalf("no report: %v\n%s", err, s.stderr())
			}
			r := parseReport(t, string(b))
			want := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}[c.sig]
			if r.Stats.ExitSignal != want || !r.Stats.Complete || r.Stats.Calls["pthread_mutex_lock"] < 3 {
				t.Errorf("report stats %+v: want the target killed by %s, a complete trace with its lock calls", r.Stats, want)
			}
			if _, _, rd := readTrace(t, trace); rd.Footer() == nil || rd.Footer().ExitSignal != want {
				t.Errorf("trace footer %+v", rd.Footer())
			}
		})
	}
}

// TestAttachErrors: attaching to a process that has exited (a zombie not
// yet reaped) is exit 5 saying so; a --probe that the target lacks is exit
// 7, before it runs, even when hooktrace's own binary has the symbol.
// eBPF alone, as attach is.
func TestAttachErrors(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	zombie := exec.Command(life, "exit", "0")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	pid := zombie.Process.Pid
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(st), ") Z ") {
			break
		}
	}
	_, stderr, code := hooktrace(t, nil, "attach", "--pid", fmt.Sprint(pid), "--duration", "1s")
	if code != exitNoProcess || !strings.Contains(stderr, fmt.Sprintf("process %d has exited", pid)) {
		t.Errorf("attach to a zombie: exit %d (want %d), stderr %q", code, exitNoProcess, stderr)
	}

	stdout, stderr, code := hooktrace(t, nil, "run", "--probe", "runtime.mallocgc", "--", life, "exit", "0")
	if code != exitNoSymbol || !strings.Contains(stderr, "runtime.mallocgc") || strings.Contains(stderr, hooktraceBin) {
		t.Errorf("--probe runtime.mallocgc on a C target: exit %d (want %d), stderr %q", code, exitNoSymbol, stderr)
	}
	if stdout != "" {
		t.Errorf("the target ran: %q", stdout)
	}
}

// TestExportSaysWhatIsCounted: the timeline of an aggregate trace says, in
// its metadata and on stderr, how many calls were only counted and how to
// record them; a full trace has none such.
func TestExportSaysWhatIsCounted(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	for _, mode := range []string{"aggregate", "full"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			trace, timeline := filepath.Join(dir, "t.htr"), filepath.Join(dir, "t.json")
			if _, stderr, code := hooktrace(t, nil, "run", "--mode", mode, "--ignore-target-status", "-o", trace, "--", prog); code != 0 {
				t.Fatalf("run: exit %d\n%s", code, stderr)
			}
			_, stderr, code := hooktrace(t, nil, "export", "-o", timeline, trace)
			if code != 0 {
				t.Fatalf("export: exit %d\n%s", code, stderr)
			}
			b, _ := os.ReadFile(timeline)
			var doc struct {
				Metadata struct {
					Hooktrace struct {
						Calls       uint64 `json:"calls"`
						CountedOnly uint64 `json:"counted_only"`
						Note        string `json:"note"`
					} `json:"hooktrace"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("the timeline is not JSON: %v", err)
			}
			m := doc.Metadata.Hooktrace
			if mode == "full" {
				if m.CountedOnly != 0 || strings.Contains(stderr, "only counted") {
					t.Errorf("full trace: %+v, stderr %q", m, stderr)
				}
				return
			}
			// 10,000 malloc(777) and their locks, sent once as a pattern.
			if m.CountedOnly < 10000 || m.CountedOnly >= m.Calls || !strings.Contains(m.Note, "--mode full") {
				t.Errorf("aggregate metadata %+v: want the ~30,000 repeats counted only, and --mode full named", m)
			}
			if !strings.Contains(stderr, fmt.Sprintf("%d calls were only counted", m.CountedOnly)) || !strings.Contains(stderr, "--mode full") {
				t.Errorf("stderr does not say what was only counted:\n%s", stderr)
			}
		})
	}
}

// TestRunLeavesDeadlockedTarget: with --on-hang detach, run reports the
// deadlock and exits 1 (--error-exitcode) without waiting: the target did
// not finish, whatever --fail-on says. It is left deadlocked, as asked.
func TestRunLeavesDeadlockedTarget(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "deadlock")
	dir := t.TempDir()
	ready, report := filepath.Join(dir, "ready"), filepath.Join(dir, "r.json")
	// The target outlives run, holding its stdout and stderr: files and
	// pipes of the test's own, not a buffer Wait would wait to fill.
	s := startHooktrace(t, hooktraceBin, "run", "--on-hang", "detach", "--hang-timeout", "1s", "--fail-on", "none",
		"--error-exitcode", "9", "--ready-file", ready, "--report", report, "--", prog)
	code := s.wait(t)
	stderr := s.stderr()
	b, err := os.ReadFile(ready)
	if err != nil {
		t.Fatalf("no ready file: %v\n%s", err, stderr)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	alive := pid > 0 && syscall.Kill(pid, 0) == nil
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if code != 9 || !strings.Contains(stderr, "the target deadlocked and was left hanging: exit status 9") {
		t.Errorf("exit %d, want 9 (--error-exitcode) for a target left deadlocked\n%s", code, stderr)
	}
	if !alive {
		t.Errorf("the target (pid %d) is gone: --on-hang detach must leave it", pid)
	}
	rb, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if r := parseReport(t, string(rb)); len(r.Findings) == 0 || r.Stats.ExitStatus != nil || r.Stats.ExitSignal != "" {
		t.Errorf("report: %d findings, stats %+v; want the deadlock and no exit status", len(r.Findings), r.Stats)
	}
}

// TestContinuedTarget: a SIGCONT to the target (timeout sends one after
// its SIGTERM; so do shells' bg and fg) must not leave it held in a
// ptrace stop: it runs on and finishes.
func TestContinuedTarget(t *testing.T) {
	testenv.RequireBPF(t)
	life := testenv.Program(t, "lifecycle")
	ready := filepath.Join(t.TempDir(), "ready")
	s := startHooktrace(t, hooktraceBin, "run", "--ready-file", ready, "--", life, "wait")
	pid, _ := strconv.Atoi(strings.TrimSpace(waitFile(t, ready, s)))
	if line, _ := s.stdout.ReadString('\n'); line != "waiting\n" {
		t.Fatalf("target said %q", line)
	}
	syscall.Kill(pid, syscall.SIGCONT)
	io.WriteString(s.stdin, "go on\n")
	if rest, _ := s.stdout.ReadString('\n'); rest != "done\n" {
		t.Errorf("the target after SIGCONT said %q", rest)
	}
	if code := s.wait(t); code != 0 {
		t.Errorf("exit %d\n%s", code, s.stderr())
	}
}
