package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

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
	return c
}

func runTraced(f *traceFlags, argv []string) error {
	s, err := newSession(f)
	if err != nil {
		return err
	}
	g, err := tracer.StartGated(argv)
	if err != nil {
		s.tr.Close()
		return err
	}
	pid := g.Cmd.Process.Pid
	s.header.Command = argv
	s.header.PID = uint32(pid)
	s.header.Exe = g.Path
	if err := s.tr.Attach(pid, g.Path); err != nil {
		g.Abort()
		s.tr.Close()
		return err
	}
	// The terminal's Ctrl-C reaches the target too; hooktrace waits for the
	// target to act on it and reports what was traced.
	signal.Ignore(os.Interrupt, syscall.SIGQUIT)
	stop := make(chan struct{})
	done, err := s.start(stop)
	if err != nil {
		g.Abort()
		s.tr.Close()
		return err
	}
	var ws syscall.WaitStatus
	wait := func() (err error) {
		var onFork func(int)
		if f.followForks {
			// Place a child's probes before it runs its first instruction.
			onFork = func(child int) {
				if err := s.tr.Attach(child, ""); err != nil {
					slog.Warn(fmt.Sprintf("following child %d: %v", child, err))
				}
			}
		}
		ws, err = g.RunToExit(s.tr.Exiting, onFork)
		return err
	}
	reason, waitErr := s.waitTarget(pid, wait)
	close(stop)
	runErr := <-done
	if waitErr != nil {
		s.finish(waitErr.Error(), nil, "")
		return waitErr
	}
	exit, sig := s.targetExit(&ws)
	foot, err := s.finish(reason, exit, sig)
	if runErr != nil {
		return runErr
	}
	if err != nil {
		return err
	}
	return s.report(foot)
}

// exitStatus reads the target's exit code or killing signal.
func exitStatus(ws syscall.WaitStatus) (*int, string) {
	if ws.Signaled() {
		return nil, ws.Signal().String()
	}
	code := ws.ExitStatus()
	return &code, ""
}
