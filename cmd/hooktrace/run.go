//go:build linux && amd64

package main

import (
	"fmt"
	"github.com/hooktrace/hooktrace/internal/proc"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/session"
)

func newRunCmd() *cobra.Command {
	f := &traceFlags{}
	c := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARGS...]",
		Short: "Run a command traced from its first instruction to its exit",
		Long: `run starts COMMAND traced from its first instruction to its exit. Its stdout
and stderr are its own: the text report goes to stderr once it has exited,
and the other formats only to files (--report). hooktrace exits with the
target's status when the target failed (128+N when signal N killed it),
else 1 when findings fail the gate, else 0. SIGINT and SIGTERM are passed
on to the target; the trace and the report are finished after it exits.`,
		Example: `  hooktrace run -o app.htr -- ./app args
  hooktrace run --report app.json --probe my_hook -- ./app`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			return runTraced(f, args)
		},
	}
	f.register(c)
	c.Flags().BoolVar(&f.ignoreTargetStatus, "ignore-target-status", false,
		"exit with the findings' verdict alone, whatever the target's own exit status")
	registerRecorder(c, &f.recorder)
	return c
}

func runTraced(f *traceFlags, argv []string) error {
	// stdout and stderr are the target's: a machine-readable report
	// printed after it would be mixed with whatever the target wrote.
	if f.format != "text" {
		return usageError{fmt.Errorf("run --format %s: stdout and stderr belong to the target; write the report to a file with --report %s:FILE",
			f.format, f.format)}
	}
	s, foot, _, err := runGated(f, argv)
	if err != nil {
		return err
	}
	return s.runStatus(foot, s.report(foot, os.Stderr))
}

// runGated runs argv traced from its first instruction to its exit (or
// to its hang, with hang detection) and returns the finished recording, its
// footer, and when the target was let go to exec (CLOCK_MONOTONIC).
func runGated(f *traceFlags, argv []string) (*recording, *events.Footer, uint64, error) {
	if err := resolveRecorder(f, argv); err != nil {
		return nil, nil, 0, err
	}
	s, err := newRecording(f)
	if err != nil {
		return nil, nil, 0, err
	}
	if err := s.clearReady(); err != nil {
		s.tr.Close()
		return nil, nil, 0, err
	}
	t, err := session.Launch(s.tr, argv)
	if err != nil {
		s.tr.Close()
		return nil, nil, 0, err
	}
	pid := t.PID
	// From here on the target exists: SIGINT and SIGTERM must reach it
	// and not end hooktrace, which finishes the trace once it exits.
	stopForwarding := forwardSignals(pid)
	defer stopForwarding()
	if err := t.Attach(); err != nil {
		t.Abort()
		s.tr.Close()
		return nil, nil, 0, err
	}
	if err := s.checkPlaced(pid, t.Path); err != nil {
		t.Abort()
		s.tr.Close()
		return nil, nil, 0, err
	}
	t.Header(&s.header)
	reading, err := s.start()
	if err == nil {
		// The probes are placed and tracing is on; the target has not
		// run its first instruction yet.
		err = s.writeReady(pid)
	}
	if err != nil {
		t.Abort()
		if reading != nil {
			reading.Stop()
			s.finish(err.Error(), nil, "")
		} else {
			s.tr.Close()
		}
		return nil, nil, 0, err
	}
	var ws syscall.WaitStatus
	wait := func() (err error) {
		// With --follow-forks a child's probes are placed before it runs
		// its first instruction.
		ws, err = t.Wait(f.followForks, func(s string) { slog.Warn(s) })
		return err
	}
	launched := proc.Now()
	reason, waitErr := s.waitTarget(pid, wait)
	runErr := reading.Stop()
	if waitErr != nil {
		s.finish(waitErr.Error(), nil, "")
		return nil, nil, 0, waitErr
	}
	exit, sig := s.targetExit(&ws)
	foot, err := s.finish(reason, exit, sig)
	if runErr != nil {
		return nil, nil, 0, runErr
	}
	if err != nil {
		return nil, nil, 0, err
	}
	return s, foot, launched, nil
}

// forwardSignals passes SIGINT and SIGTERM on to pid until the returned
// function is called; SIGQUIT is ignored (the terminal sends it to the
// target too). A SIGINT typed at the terminal reaches the target already,
// as the whole foreground process group gets it: it is not sent twice.
// (timeout(1) signals the group as well as hooktrace, so a target gets
// its SIGTERM twice; a second SIGTERM to a dying process is harmless.)
func forwardSignals(pid int) func() {
	signal.Ignore(syscall.SIGQUIT)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		for {
			select {
			case <-quit:
				return
			case sig := <-sigs:
				if sig == os.Interrupt && fromTerminal() {
					continue
				}
				fmt.Fprintf(os.Stderr, "hooktrace: %v: passed on to pid %d; the report follows its exit\n", sig, pid)
				syscall.Kill(pid, sig.(syscall.Signal))
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(quit)
	}
}

// fromTerminal reports whether hooktrace runs in its terminal's
// foreground process group, where a typed Ctrl-C reaches every process.
func fromTerminal() bool {
	for _, fd := range []int{0, 1, 2} {
		if !term.IsTerminal(fd) {
			continue
		}
		if pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && pg == unix.Getpgrp() {
			return true
		}
	}
	return false
}

// exitStatus reads the target's exit code or killing signal.
func exitStatus(ws syscall.WaitStatus) (*int, string) {
	if ws.Signaled() {
		// "SIGKILL", not Go's "killed": reports say "killed by SIGKILL".
		return nil, unix.SignalName(ws.Signal())
	}
	code := ws.ExitStatus()
	return &code, ""
}

// runStatus is run's exit status, given the report's (gateErr: nil, or a
// failing gate, or an error writing the report):
//
//   - hooktrace's own failure (writing the report), with its code;
//   - the target's own status when it failed: its exit code, or 128+N
//     when signal N killed it (SIGKILL, 137, when hang detection killed
//     it), or 1 (--error-exitcode) when it was left deadlocked
//     (--on-hang=detach) — unless --ignore-target-status;
//   - 1 (--error-exitcode) when findings fail the gate;
//   - 0.
func (s *recording) runStatus(foot *events.Footer, gateErr error) error {
	if gateErr != nil && !isGateFailure(gateErr) {
		return gateErr
	}
	if s.flags.ignoreTargetStatus {
		return gateErr
	}
	code, why := targetFailure(foot, s.flags.rep.exitCode())
	if code == 0 {
		return gateErr
	}
	if foot.ExitSignal == "SIGTRAP" && strings.HasPrefix(s.header.Recorder, recorderPreload) && len(s.header.UserProbes) > 0 {
		// The kernel kills a process whose breakpoint traps with
		// SIGTRAP blocked; glibc blocks every signal while a thread
		// exits, and then calls madvise, where runtimes hook.
		why += "; a --probe breakpoint of the preload recorder is fatal in code that runs with signals blocked (a memory hook, which a thread's exit calls so); probe it with --recorder ebpf"
	}
	return &exitError{code: code, err: fmt.Errorf("%s (--ignore-target-status for the findings' verdict alone)", why)}
}

// targetFailure is the status a failed target gives run, and why; 0 when
// it succeeded.
func targetFailure(foot *events.Footer, hungCode int) (int, string) {
	switch {
	case foot.ExitSignal != "":
		n := int(unix.SignalNum(foot.ExitSignal))
		if n == 0 {
			n = int(syscall.SIGKILL)
		}
		if foot.Hang != nil {
			return 128 + n, fmt.Sprintf("the target deadlocked and was killed by %s: exit status %d", foot.ExitSignal, 128+n)
		}
		return 128 + n, fmt.Sprintf("the target was killed by %s: exit status %d", foot.ExitSignal, 128+n)
	case foot.ExitStatus != nil && *foot.ExitStatus != 0:
		return *foot.ExitStatus, fmt.Sprintf("the target exited with status %d: so does hooktrace", *foot.ExitStatus)
	case foot.ExitStatus == nil && foot.Hang != nil:
		return hungCode, fmt.Sprintf("the target deadlocked and was left hanging: exit status %d", hungCode)
	}
	return 0, ""
}
