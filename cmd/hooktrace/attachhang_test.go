//go:build linux && amd64

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/hang"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/rcache"
)

// Attach to a process that is already deadlocked, or that exits while
// attach starts.

// startHung starts argv as user nobody (when the tests run as root) and
// waits until hang detection sees it deadlocked. It returns the process,
// killed at the end of the test, or nil when it exited instead.
func startHung(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := asNobody(t, argv[0], argv...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	w := hang.Watch(cmd.Process.Pid, hang.Options{Timeout: 500 * time.Millisecond, ArenaHeld: analyzer.ArenaHeld})
	defer w.Stop()
	select {
	case <-w.Found():
		return cmd
	case <-exited:
		return nil
	case <-time.After(60 * time.Second):
		t.Fatal("neither a deadlock nor an exit in 60s")
	}
	return nil
}

// attachHung attaches to pid, already deadlocked, as user nobody, who may
// not load BPF programs, or as root, and checks what every such attach
// says: the deadlock found at once (--hang-timeout and --duration are
// longer than any test waits), reported and left as it was. It returns the
// deadlock finding.
func attachHung(t *testing.T, cmd *exec.Cmd, asRoot bool) *analyzer.Finding {
	t.Helper()
	pid := cmd.Process.Pid
	args := []string{"attach", "--pid", fmt.Sprint(pid), "--hang-timeout", "1h", "--duration", "1h", "--format", "json"}
	var stdout, stderr strings.Builder
	code := 0
	if asRoot {
		var out, errs string
		out, errs, code = hooktrace(t, nil, args...)
		stdout.WriteString(out)
		stderr.WriteString(errs)
	} else {
		// eBPF, which nobody may not use: hang detection alone watches
		// (auto would load the preload recorder instead).
		args = append(args, "--recorder", "ebpf")
		c := asNobody(t, hooktraceBin, append([]string{hooktraceBin}, args...)...)
		c.Stdout, c.Stderr = &stdout, &stderr
		var ee *exec.ExitError
		if err := c.Run(); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if code != exitFindings {
		t.Fatalf("exit %d, want %d\n%s", code, exitFindings, stderr.String())
	}
	for _, says := range []string{fmt.Sprintf("deadlock in pid %d", pid), "since before hooktrace watched", "detaching"} {
		if !strings.Contains(stderr.String(), says) {
			t.Errorf("stderr does not say %q:\n%s", says, stderr.String())
		}
	}
	rep, fs := findingsOf(t, stdout.String())
	f := findingOfKind(fs, analyzer.KindDeadlock)
	if f == nil {
		t.Fatalf("no deadlock finding:\n%s", stdout.String())
	}
	if !strings.Contains(f.Detail, "already blocked when hang detection started") {
		t.Errorf("the finding does not say how it was confirmed: %s", f.Detail)
	}
	if !asRoot {
		if os.Geteuid() == 0 && (!strings.Contains(stderr.String(), "no probes placed: not permitted to load BPF programs") ||
			!strings.Contains(stderr.String(), "watching for deadlocks only")) {
			t.Errorf("stderr does not say what attach cannot do, and why:\n%s", stderr.String())
		}
		if rep.Stats.Complete || !strings.Contains(rep.Stats.Incomplete, "no calls traced") {
			t.Errorf("stats: complete %v, %q: want it to say that no call was traced", rep.Stats.Complete, rep.Stats.Incomplete)
		}
	}
	// Detached, not killed.
	if state, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(state), ") Z") {
		t.Errorf("the target is not alive after a detach: %s %v", state, err)
	}
	return f
}

// TestAttachHungProcess: attach to a process whose threads are already
// deadlocked explains it at once, by samples of the threads taken as it
// starts, with no eBPF: as an ordinary user, who may not load BPF
// programs, and as root, with the same finding. The ABBA deadlock; a
// memory hook inside malloc waiting for a lock its own thread holds; and
// the registration cache's deadlock with glibc's arena lock, held by the
// thread inside free.
func TestAttachHungProcess(t *testing.T) {
	attachBoth := func(t *testing.T, cmd *exec.Cmd) *analyzer.Finding {
		t.Helper()
		f := attachHung(t, cmd, false)
		t.Run("root", func(t *testing.T) {
			testenv.RequireBPF(t)
			if root := attachHung(t, cmd, true); root.ID != f.ID {
				t.Errorf("as root %s %q, as nobody %s %q", root.ID, root.Title, f.ID, f.Title)
			}
		})
		return f
	}
	t.Run("abba", func(t *testing.T) {
		cmd := startHung(t, testenv.Program(t, "deadlock"))
		if cmd == nil {
			t.Fatal("testdata/deadlock.c exited")
		}
		checkDeadlockFinding(t, []analyzer.Finding{*attachBoth(t, cmd)})
	})
	t.Run("hook", func(t *testing.T) {
		cmd := startHung(t, testenv.Program(t, "hookhang"))
		if cmd == nil {
			t.Fatal("testdata/hookhang.c exited")
		}
		f := attachBoth(t, cmd)
		if !strings.Contains(f.Title, "which it holds itself") || len(f.Locks) != 1 || f.Locks[0] != "hook_lock (hookhang)" || len(f.Edges) != 1 {
			t.Fatalf("want hook_lock waited for by its own holder: %s %v", f.Title, f.Locks)
		}
		for _, fn := range []string{"pthread_mutex_lock", "munmap_hook", "malloc", "register_region"} {
			if !edgeStackHas(&f.Edges[0], fn) {
				t.Errorf("the stack lacks %s:%s", fn, edgeStackText(&f.Edges[0]))
			}
		}
	})
	t.Run("arena", func(t *testing.T) {
		if _, err := rcache.Compiler(); err != nil {
			testenv.Unavailable(t, "%v", err)
		}
		b, err := rcache.Build(nobodyDir(t))
		if err != nil {
			t.Fatal(err)
		}
		for attempt := 1; attempt <= 3; attempt++ {
			cmd := startHung(t, b.Workload, "--variant", "legacy", "--stress", "--seconds", "20", "--watchdog", "120")
			if cmd == nil {
				t.Logf("attempt %d: no deadlock this time", attempt)
				continue
			}
			f := attachBoth(t, cmd)
			if !sameSet(f.Locks, []string{"vma_lock (librcache.so)", "glibc malloc arena"}) {
				t.Fatalf("locks %v", f.Locks)
			}
			// The thread inside free holds the arena; its hook waits for
			// vma_lock.
			var hook *analyzer.Edge
			for i := range f.Edges {
				if f.Edges[i].From == "glibc malloc arena" && f.Edges[i].To == "vma_lock (librcache.so)" {
					hook = &f.Edges[i]
				}
			}
			if hook == nil {
				t.Fatalf("no edge from the arena to vma_lock: %+v", f.Edges)
			}
			for _, fn := range []string{"rc_mem_cb", "rc_intercept_madvise", "_int_free", "free"} {
				if !edgeStackHas(hook, fn) {
					t.Errorf("the arena holder's stack lacks %s:%s", fn, edgeStackText(hook))
				}
			}
			return
		}
		t.Fatal("the legacy variant did not deadlock in three stress runs")
	})
}

// TestAttachTargetExits: a target that exits while the probes are being
// placed is said to have done so, with exit 5, not reported as an
// unknown PID.
func TestAttachTargetExits(t *testing.T) {
	testenv.RequireBPF(t)
	target := exec.Command("sleep", "1h")
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer target.Wait()
	defer target.Process.Kill()
	ht := exec.Command(hooktraceBin, "attach", "--pid", fmt.Sprint(target.Process.Pid))
	var stderr strings.Builder
	ht.Stderr = &stderr
	if err := ht.Start(); err != nil {
		t.Fatal(err)
	}
	// attach holds the target by a pidfd from before it loads the probes:
	// the target is killed once that is open.
	for deadline := time.Now().Add(time.Minute); !holdsPidfd(ht.Process.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			ht.Process.Kill()
			ht.Wait()
			t.Fatalf("attach opened no pidfd in a minute:\n%s", stderr.String())
		}
	}
	target.Process.Kill()
	err := ht.Wait()
	var ee *exec.ExitError
	want := fmt.Sprintf("pid %d exited while hooktrace was attaching (after ", target.Process.Pid)
	if !errors.As(err, &ee) || ee.ExitCode() != exitNoProcess || !strings.Contains(stderr.String(), want) {
		t.Errorf("exit %v, want %d saying %q:\n%s", err, exitNoProcess, want, stderr.String())
	}
}

// holdsPidfd reports whether process pid has a pidfd open.
func holdsPidfd(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.Contains(l, "pidfd") {
			return true
		}
	}
	return false
}
