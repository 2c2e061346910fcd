//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/source"
)

func newAttachCmd() *cobra.Command {
	f := &traceFlags{}
	var pid int
	var duration time.Duration
	c := &cobra.Command{
		Use:     "attach --pid PID [flags]",
		Short:   "Trace a running process until Ctrl-C, SIGTERM, --duration or its exit",
		Example: `  hooktrace attach --pid 1234 --duration 30s -o live.htr`,
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, args []string) error {
			if pid <= 0 {
				return usageError{fmt.Errorf("--pid is required")}
			}
			return attachTraced(f, pid, duration)
		},
	}
	f.register(c)
	c.Flags().IntVarP(&pid, "pid", "p", 0, "the process to trace")
	c.Flags().DurationVarP(&duration, "duration", "d", 0, "stop after this long (0: until Ctrl-C or the target exits)")
	return c
}

func attachTraced(f *traceFlags, pid int, duration time.Duration) error {
	s, err := newSession(f)
	if err != nil {
		return err
	}
	if err := s.clearReady(); err != nil {
		s.tr.Close()
		return err
	}
	// A pidfd tells when the target exits, even though it is not our child.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		s.tr.Close()
		if err == unix.ESRCH {
			return fmt.Errorf("pid %d: %w", pid, source.ErrNoProcess)
		}
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	s.header.PID = uint32(pid)
	s.header.Exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err := s.tr.Attach(pid, ""); err != nil {
		s.tr.Close()
		return err
	}
	if err := s.checkPlaced(pid, s.header.Exe); err != nil {
		s.tr.Close()
		return err
	}
	s.header.Allocator = s.tr.Allocator()
	reading, err := s.start()
	if err != nil {
		s.tr.Close()
		return err
	}
	if err := s.writeReady(pid); err != nil {
		reading.Stop()
		s.finish(err.Error(), nil, "")
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	exited := make(chan struct{})
	go func() {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == unix.EINTR {
				continue
			}
			if n > 0 || err != nil {
				close(exited)
				return
			}
		}
	}()
	var timeout <-chan time.Time
	if duration > 0 {
		timeout = time.After(duration)
	}
	hang := s.watchHang(pid, "detach")
	var reason string
	select {
	case h := <-hang.found():
		reason = s.onHang(hang, h)
		if hang.action == "kill" {
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
			}
		}
	case sig := <-sigs:
		reason = "stopped by " + sig.String()
	case <-timeout:
		reason = "duration elapsed"
	case <-exited:
		reason = "target exited"
	}
	hang.stop()
	runErr := reading.Stop()
	foot, err := s.finish(reason, nil, "")
	if runErr != nil {
		return runErr
	}
	if err != nil {
		return err
	}
	return s.report(foot, os.Stdout)
}
