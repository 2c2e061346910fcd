package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	if err := g.Open(); err != nil {
		close(stop)
		<-done
		return fmt.Errorf("starting the target: %w", err)
	}
	waitErr := g.Cmd.Wait()
	close(stop)
	runErr := <-done
	exit, sig := exitStatus(g.Cmd.ProcessState, waitErr)
	foot, err := s.finish("target exited", exit, sig)
	if runErr != nil {
		return runErr
	}
	if err != nil {
		return err
	}
	return s.report(foot)
}

// exitStatus reads the target's exit code or killing signal.
func exitStatus(ps *os.ProcessState, err error) (*int, string) {
	if ps == nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			ps = ee.ProcessState
		}
	}
	if ps == nil {
		return nil, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return nil, ws.Signal().String()
	}
	code := ps.ExitCode()
	return &code, ""
}
