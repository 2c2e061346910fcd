//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/hang"
)

// hangFlags are run's and attach's hang-detection flags.
type hangFlags struct {
	timeout time.Duration
	onHang  string
}

func (h *hangFlags) register(fl *pflag.FlagSet) {
	fl.DurationVar(&h.timeout, "hang-timeout", 5*time.Second,
		"report a deadlock when threads stay blocked in a wait-for cycle of locks this long; one already there when attach starts is confirmed at once, by samples (0: never)")
	fl.StringVar(&h.onHang, "on-hang", "",
		"what to do with a deadlocked target: kill or detach (default: kill for run, detach for attach)")
}

// check validates the flags before any tracing.
func (h *hangFlags) check() error {
	if h.timeout < 0 {
		return usageError{fmt.Errorf("--hang-timeout %v: want a positive duration, or 0 to disable", h.timeout)}
	}
	switch h.onHang {
	case "", "kill", "detach":
		return nil
	}
	return usageError{fmt.Errorf("--on-hang %q: want kill or detach", h.onHang)}
}

// action is --on-hang, or the command's default.
func (h *hangFlags) action(def string) string {
	if h.onHang != "" {
		return h.onHang
	}
	return def
}

// hangWatch is a running hang detector; a nil one (detection disabled)
// never finds anything.
type hangWatch struct {
	w      *hang.Watcher
	action string
	pid    int
}

// watchHang starts hang detection on pid, unless --hang-timeout is 0.
func (s *recording) watchHang(pid int, defaultAction string) *hangWatch {
	f := &s.flags.hang
	if f.timeout <= 0 {
		return nil
	}
	action := f.action(defaultAction)
	return &hangWatch{
		w: hang.Watch(pid, hang.Options{
			Timeout:   f.timeout,
			ArenaHeld: analyzer.ArenaHeld,
			Action:    action,
			Hide:      hiddenObject(s.tr),
		}),
		action: action,
		pid:    pid,
	}
}

func (h *hangWatch) found() <-chan *events.Hang {
	if h == nil {
		return nil
	}
	return h.w.Found()
}

// settled is closed once hang detection knows that the threads blocked
// when it started are not deadlocked; at once without hang detection.
func (h *hangWatch) settled() <-chan struct{} {
	if h == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	return h.w.Settled()
}

func (h *hangWatch) stop() {
	if h != nil {
		h.w.Stop()
	}
}

// onHang records a deadlock for the footer, says so on stderr and acts:
// kill sends SIGKILL; detach leaves the target as it is. It returns the
// footer's reason.
func (s *recording) onHang(h *hangWatch, found *events.Hang) string {
	s.deadlock = found
	fmt.Fprintf(os.Stderr, "hooktrace: deadlock in pid %d: %s\n", h.pid, hangSummary(found))
	if h.action == "kill" {
		fmt.Fprintf(os.Stderr, "hooktrace: killing pid %d (--on-hang=kill)\n", h.pid)
		if p, err := os.FindProcess(h.pid); err == nil {
			p.Kill()
		}
		return "deadlock detected: target killed"
	}
	fmt.Fprintf(os.Stderr, "hooktrace: detaching; pid %d stays deadlocked (--on-hang=detach)\n", h.pid)
	return "deadlock detected: hooktrace detached, the target still hangs"
}

// hangSummary says which threads wait for what: "threads 12, 13 blocked
// for 2s: 12 waits for vma_lock (librcache.so) held by 13; ...", or, for
// a cycle already there when the watch began, "threads 12, 13 blocked
// since before hooktrace watched (none ran in 3 samples over 200ms): ...".
func hangSummary(h *events.Hang) string {
	var parts []string
	var blocked []string
	for _, t := range h.Threads {
		if t.Owner == 0 {
			continue
		}
		name := t.LockName
		if name == "" {
			name = fmt.Sprintf("%s at %#x", t.LockKind, t.Lock)
		}
		parts = append(parts, fmt.Sprintf("%d waits for %s held by %d", t.TID, name, t.Owner))
		blocked = append(blocked, fmt.Sprint(t.TID))
	}
	sort.Strings(blocked)
	how := fmt.Sprintf("for %v", time.Duration(h.Timeout))
	if h.AtStart {
		how = fmt.Sprintf("since before hooktrace watched (none ran in %d samples over %v)", h.Samples,
			time.Duration(h.Timeout).Round(time.Millisecond))
	}
	threads := "threads"
	if len(blocked) == 1 {
		threads = "thread"
	}
	return fmt.Sprintf("%s %s blocked %s: %s", threads, strings.Join(blocked, ", "), how, strings.Join(parts, "; "))
}

// waitTarget waits for run's target to exit while watching it for a
// deadlock. On one it kills the target and waits for it, or with
// --on-hang=detach stops waiting (the target runs on, deadlocked). It
// returns the footer's reason and Wait's error.
func (s *recording) waitTarget(pid int, wait func() error) (reason string, waitErr error) {
	h := s.watchHang(pid, "kill")
	if h == nil {
		return "target exited", wait()
	}
	defer h.stop()
	exited := make(chan error, 1)
	go func() { exited <- wait() }()
	select {
	case err := <-exited:
		return "target exited", err
	case found := <-h.found():
		reason := s.onHang(h, found)
		if h.action == "kill" {
			return reason, <-exited
		}
		return reason, nil
	}
}

// targetExit is the target's exit code or signal, from ws once wait
// returned; nothing after --on-hang=detach, when the target runs on (and
// ws is not to be read: the wait is still going on).
func (s *recording) targetExit(ws *syscall.WaitStatus) (*int, string) {
	if s.deadlock != nil && s.deadlock.Action == "detach" {
		return nil, ""
	}
	return exitStatus(*ws)
}
