package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer"
)

func newRunCmd() *cobra.Command {
	f := &traceFlags{}
	c := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARGS...]",
		Short: "Run a command traced from its first instruction to its exit",
		Example: `  hooktrace run -o app.htr -- ./app args
  hooktrace run --format json --probe my_hook -- ./app`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return runTraced(f, args)
		},
	}
	f.register(c)
	f.registerRecorder(c)
	return c
}

func runTraced(f *traceFlags, argv []string) error {
	// The terminal's Ctrl-C reaches the target too; hooktrace waits for the
	// target to act on it and reports what was traced.
	signal.Ignore(os.Interrupt, syscall.SIGQUIT)
	s, foot, _, err := runGated(f, argv)
	if err != nil {
		return err
	}
	return s.report(foot)
}

// runGated runs argv traced from its first instruction to its exit (or
// to its hang, with hang detection) and returns the finished session, its
// footer, and when the target was let go to exec (CLOCK_MONOTONIC).
func runGated(f *traceFlags, argv []string) (*session, *events.Footer, uint64, error) {
	if err := resolveRecorder(f, argv); err != nil {
		return nil, nil, 0, err
	}
	s, err := newSession(f)
	if err != nil {
		return nil, nil, 0, err
	}
	g, err := startGated(s, argv)
	if err != nil {
		s.tr.Close()
		return nil, nil, 0, err
	}
	pid := g.Cmd.Process.Pid
	s.header.Command = argv
	s.header.PID = uint32(pid)
	s.header.Exe = g.Path
	if err := s.tr.Attach(pid, g.Path); err != nil {
		g.Abort()
		s.tr.Close()
		return nil, nil, 0, err
	}
	s.header.Allocator = s.tr.Allocator()
	stop := make(chan struct{})
	done, err := s.start(stop)
	if err != nil {
		g.Abort()
		s.tr.Close()
		return nil, nil, 0, err
	}
	var onFork func(int)
	if f.followForks {
		// Place a child's probes before it runs its first instruction.
		onFork = func(child int) {
			if err := s.tr.Attach(child, ""); err != nil {
				slog.Warn(fmt.Sprintf("following child %d: %v", child, err))
			}
		}
	}
	var ws syscall.WaitStatus
	wait := func() (err error) {
		ws, err = g.RunToExit(s.tr.Exiting, onFork, s.tr.Exec)
		return err
	}
	launched := tracer.MonotonicNow()
	reason, waitErr := s.waitTarget(pid, wait)
	close(stop)
	runErr := <-done
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

// exitStatus reads the target's exit code or killing signal.
func exitStatus(ws syscall.WaitStatus) (*int, string) {
	if ws.Signaled() {
		// "SIGKILL", not Go's "killed": reports say "killed by SIGKILL".
		return nil, unix.SignalName(ws.Signal())
	}
	code := ws.ExitStatus()
	return &code, ""
}
