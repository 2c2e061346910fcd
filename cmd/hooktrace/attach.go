//go:build linux && amd64

package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/hang"
	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/tracer"
)

func newAttachCmd() *cobra.Command {
	f := &traceFlags{}
	var pid int
	var duration time.Duration
	c := &cobra.Command{
		Use:   "attach --pid PID [flags]",
		Short: "Trace a running process until Ctrl-C, SIGTERM, --duration or its exit",
		Long: `attach traces a running process until Ctrl-C, SIGTERM, --duration or its
exit, and prints the report on stdout. Hang detection watches it from the
start: threads already blocked in a wait-for cycle of locks are reported
at once, threads that block later after --hang-timeout. By default (--recorder auto) attach loads
hooktrace's recorder library into the process, as a debugger calls a
function in it, and records at user-space speed without privilege; where
it cannot (a static or Go program, seccomp), it places eBPF probes. With
neither, attach watches for deadlocks only. It needs the right to ptrace
the process, as a debugger does.`,
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
	c.Flags().StringVar(&f.recorder, "recorder", recorderAuto,
		"ebpf: uprobes (needs root or CAP_BPF+CAP_PERFMON); preload: the recorder library loaded into the process through ptrace, unprivileged; auto: preload where it can, else ebpf")
	c.Flags().IntVarP(&pid, "pid", "p", 0, "the process to trace")
	c.Flags().DurationVarP(&duration, "duration", "d", 0, "stop after this long (0: until Ctrl-C or the target exits)")
	return c
}

// attachment is attach's hold on a running process: the recording, the
// process's exit, the signals that end the attach, and hang detection,
// which runs from the start, before and whatever the probes.
type attachment struct {
	s      *recording
	pid    int
	began  time.Time
	pidfd  int
	exited <-chan struct{}
	sigs   chan os.Signal
	hang   *hangWatch
	// hangOff says why hang detection cannot watch the process (no right
	// to read it); nil when it watches, or --hang-timeout is 0.
	hangOff error
	// unpermitted is why no probes could be placed, when hang detection
	// watches alone for want of privilege or of a kernel that runs them.
	unpermitted error
}

func attachTraced(f *traceFlags, pid int, duration time.Duration) error {
	began := time.Now()
	s, opts, err := prepareRecording(f)
	if err != nil {
		return err
	}
	if err := source.CheckProcess(pid); err != nil {
		return err
	}
	if err := s.clearReady(); err != nil {
		return err
	}
	// A pidfd tells when the target exits, even though it is not our child.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ESRCH {
			return fmt.Errorf("pid %d: %w", pid, source.ErrNoProcess)
		}
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	s.header.PID = uint32(pid)
	s.header.Exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	a := &attachment{s: s, pid: pid, began: began, pidfd: pidfd, exited: watchExit(pidfd),
		sigs: make(chan os.Signal, 1)}
	signal.Notify(a.sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(a.sigs)
	// Placing the probes takes seconds (the BPF verifier); a process that
	// is already deadlocked is explained before that.
	if f.hang.timeout > 0 {
		if a.hangOff = hang.Check(pid); a.hangOff == nil {
			a.hang = s.watchHang(pid, "detach")
		}
	}
	defer a.hang.stop()

	reading, reason, err := a.place(opts)
	if err != nil {
		return err
	}
	if reason == "" {
		if a.hangOff != nil {
			fmt.Fprintf(os.Stderr, "hooktrace: hang detection is off: %v\n", a.hangOff)
		}
		if err := s.writeReady(pid); err != nil {
			if reading != nil {
				reading.Stop()
			}
			s.finish(err.Error(), nil, "")
			return err
		}
		reason = a.wait(duration)
	}
	a.hang.stop()
	var runErr error
	if reading != nil {
		runErr = reading.Stop()
	}
	foot, err := s.finish(reason, nil, "")
	if runErr != nil {
		return runErr
	}
	if err != nil {
		return err
	}
	if err := s.report(foot, os.Stdout); err != nil || a.unpermitted == nil || s.deadlock != nil {
		return err
	}
	// Watched for deadlocks only, and none was found: what was asked for,
	// tracing, was not permitted, or this kernel cannot run it.
	code := exitPermission
	if errors.Is(a.unpermitted, tracer.ErrKernel) {
		code = exitFailure
	}
	return &exitError{code: code, err: fmt.Errorf("no calls traced in pid %d: %w; hang detection found no deadlock",
		pid, a.unpermitted)}
}

// placing is the recorder opened and its probes placed, or why not.
type placing struct {
	tr  recorder
	err error
}

// place opens the recorder and places its probes in the process while
// hang detection watches it (once it has ruled out a deadlock already
// there, if threads were waiting for each other's locks). It returns the reading (nil when nothing
// records: eBPF not permitted, which hang detection alone then makes up
// for), or the footer's reason when the attach ended before the probes
// were live: a deadlock found, a signal.
func (a *attachment) place(opts source.Options) (*session.Reading, string, error) {
	placed := make(chan placing, 1)
	cancel := make(chan struct{})
	// Read before the goroutine: opening the recorder settles the flag.
	injecting := a.s.flags.recorder != recorderEBPF
	go func() {
		// Threads that may already be deadlocked are diagnosed first: the
		// BPF loader's work would slow that down. Without the privileges
		// for it, the recorder fails at once and says why.
		// Injecting the recorder stops the threads, which must not be
		// deadlocked already either.
		if proc.MayLoadBPF() || injecting {
			select {
			case <-a.hang.settled():
			case <-cancel:
				placed <- placing{}
				return
			}
		}
		select {
		case <-cancel:
			placed <- placing{}
			return
		default:
		}
		tr, err := a.openAttached(opts, cancel)
		placed <- placing{tr, err}
	}()
	// Attach ends before the probes are live: they are closed once placed.
	abandon := func(why string) error {
		close(cancel)
		closePlaced := func() {
			if p := <-placed; p.tr != nil {
				p.tr.Close()
			}
		}
		if !injecting {
			go closePlaced()
		} else {
			// A library being loaded into the process must be finished
			// with, and taken out again, before hooktrace exits: a
			// thread left in the middle of a call would crash it.
			closePlaced()
		}
		return a.s.startUnrecorded(why)
	}
	select {
	case p := <-placed:
		reading, err := a.record(p)
		return reading, "", err
	case found := <-a.hang.found():
		if err := abandon("the deadlock was found before the probes were placed"); err != nil {
			return nil, "", err
		}
		return nil, a.onHang(found), nil
	case sig := <-a.sigs:
		if err := abandon("stopped by " + sig.String() + " before the probes were placed"); err != nil {
			return nil, "", err
		}
		return nil, "stopped by " + sig.String(), nil
	case <-a.exited:
		return nil, "", a.exitedWhileAttaching()
	}
}

// record starts the recording with the recorder placed, or, where eBPF is
// not permitted, with hang detection alone, saying so.
func (a *attachment) record(p placing) (*session.Reading, error) {
	s := a.s
	if p.err == nil {
		s.useRecorder(p.tr)
		err := s.checkPlaced(a.pid, s.header.Exe)
		if err == nil {
			s.header.Allocator = p.tr.Allocator()
			var reading *session.Reading
			if reading, err = s.start(); err == nil {
				return reading, nil
			}
		}
		p.tr.Close()
		s.tr = nil
		p.err = err
	}
	noProbes := errors.Is(p.err, tracer.ErrPermission) || errors.Is(p.err, tracer.ErrKernel)
	switch {
	case noProbes && a.hang != nil:
		a.unpermitted = p.err
		fmt.Fprintf(os.Stderr, "hooktrace: pid %d: no probes placed: %v\n", a.pid, p.err)
		fmt.Fprintf(os.Stderr, "hooktrace: pid %d: watching for deadlocks only (hang detection reads /proc and the process's memory, as a debugger does)\n", a.pid)
		return nil, s.startUnrecorded(p.err.Error())
	case noProbes && a.hangOff != nil:
		return nil, fmt.Errorf("%w; and hang detection cannot watch it either: %v", p.err, a.hangOff)
	case a.gone():
		return nil, a.exitedWhileAttaching()
	}
	return nil, p.err
}

// wait waits for what ends the attach once the probes are live (or hang
// detection alone watches) and returns the footer's reason.
func (a *attachment) wait(duration time.Duration) string {
	var timeout <-chan time.Time
	if duration > 0 {
		timeout = time.After(duration)
	}
	select {
	case h := <-a.hang.found():
		return a.onHang(h)
	case sig := <-a.sigs:
		return "stopped by " + sig.String()
	case <-timeout:
		return "duration elapsed"
	case <-a.exited:
		return "target exited"
	}
}

// onHang reports the deadlock and acts on it (with --on-hang kill, it
// gives the target a moment to die); it returns the footer's reason.
func (a *attachment) onHang(h *events.Hang) string {
	reason := a.s.onHang(a.hang, h)
	if a.hang.action == "kill" {
		select {
		case <-a.exited:
		case <-time.After(5 * time.Second):
		}
	}
	return reason
}

// gone reports whether the process has exited, allowing it a moment: an
// attach fails on a process in the middle of exiting (its memory already
// gone) just before its pidfd says so.
func (a *attachment) gone() bool {
	fds := []unix.PollFd{{Fd: int32(a.pidfd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, 100)
	return n > 0
}

// exitedWhileAttaching says what happened to a target that exited before
// its probes were live: not an unknown PID.
func (a *attachment) exitedWhileAttaching() error {
	return &exitError{code: exitNoProcess, err: fmt.Errorf("pid %d exited while hooktrace was attaching (after %.1f s)",
		a.pid, time.Since(a.began).Seconds())}
}

// watchExit returns a channel closed when the process of pidfd exits.
func watchExit(pidfd int) <-chan struct{} {
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
	return exited
}
