//go:build linux && amd64

// Package session traces a command with a recorder, whichever recorder it
// is: it launches the target behind the gate, has the recorder place its
// probes before the target's first instruction, reads the events while
// the target runs, and holds the target at its exec, forks and exit so
// that the recorder sees each new image and reads the mappings before
// they go. run, demo, the benchmark and the tracer's tests all trace a
// command this way; what they do with the events (a trace file and the
// analyzer, a byte count, a slice) is theirs.
package session

import (
	"fmt"
	"os"
	"syscall"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/launch"
)

// Recorder is a source of events: the BPF tracer (uprobes and
// tracepoints) or the preloaded user-space recorder. Both turn what they
// see into the same records.
type Recorder interface {
	// Attach places the probes in pid, whose executable is exe ("": read
	// it from /proc).
	Attach(pid int, exe string) error
	// On starts recording; the target must not run before it.
	On() error
	// Exec places the probes the new image of pid needs.
	Exec(pid int)
	// Exiting reads what pid's stacks need before its memory goes.
	Exiting(pid int)
	// Run hands each record to emit until stop is closed, then drains.
	Run(stop <-chan struct{}, emit func(*events.Record) error) error
	Sites() []events.ProbeSite
	Allocator() string
	Events() uint64
	Lost() uint64
	Calls() map[string]uint64
	Close() error
}

// Launcher is a recorder that sets up the target's environment and
// descriptors before it execs (the preloaded library and its buffer).
type Launcher interface {
	Env(environ []string) []string
	Files() []*os.File
}

// Target is a command launched behind the gate, held before its exec.
type Target struct {
	Argv []string
	PID  int
	Path string // the resolved executable it will exec
	// Gated is the held process, for what attaches to it besides the
	// recorder (the benchmark's floor programs).
	Gated *launch.Gated
	rec   Recorder
}

// Launch starts argv behind the gate with what rec needs in its
// environment. rec may be nil: the target then runs untraced, started
// the same way (the benchmark's baseline).
func Launch(rec Recorder, argv []string) (*Target, error) {
	var (
		g   *launch.Gated
		err error
	)
	if l, ok := rec.(Launcher); ok {
		g, err = launch.StartEnv(argv, l.Env(os.Environ()), l.Files())
	} else {
		g, err = launch.Start(argv)
	}
	if err != nil {
		return nil, err
	}
	return &Target{Argv: argv, PID: g.Cmd.Process.Pid, Path: g.Path, Gated: g, rec: rec}, nil
}

// Attach places the recorder's probes in the held target.
func (t *Target) Attach() error {
	if t.rec == nil {
		return nil
	}
	return t.rec.Attach(t.PID, t.Path)
}

// Header fills in what the target and the recorder say about the trace;
// call it once the probes are placed.
func (t *Target) Header(h *events.Header) {
	h.Command = t.Argv
	h.PID = uint32(t.PID)
	h.Exe = t.Path
	if t.rec != nil {
		h.Probes = t.rec.Sites()
		h.Allocator = t.rec.Allocator()
	}
}

// Wait lets the target exec and waits for it to exit, held at each exec
// (the recorder places the new image's probes), at each exit (the
// recorder reads the mappings first) and, with followForks, at each fork
// (the child's probes are placed before it runs; warn says why one could
// not be).
func (t *Target) Wait(followForks bool, warn func(string)) (syscall.WaitStatus, error) {
	if t.rec == nil {
		return t.Gated.RunToExit(func(int) {}, nil, nil)
	}
	var onFork func(int)
	if followForks {
		onFork = func(child int) {
			if err := t.rec.Attach(child, ""); err != nil {
				warn(fmt.Sprintf("following child %d: %v", child, err))
			}
		}
	}
	return t.Gated.RunToExit(t.rec.Exiting, onFork, t.rec.Exec)
}

// WaitUnheld lets the target exec and waits for it without the holds: the
// benchmark times the workload alone, and reads its CPU time from the
// returned state. A short-lived target's last stacks may lose their
// mappings.
func (t *Target) WaitUnheld() (*os.ProcessState, error) {
	if err := t.Gated.Open(); err != nil {
		t.Gated.Cmd.Process.Kill()
		t.Gated.Cmd.Wait()
		return nil, fmt.Errorf("starting the target: %w", err)
	}
	err := t.Gated.Cmd.Wait()
	return t.Gated.Cmd.ProcessState, err
}

// Abort kills the held target without letting it exec.
func (t *Target) Abort() { t.Gated.Abort() }

// Reading is a recorder's reader running.
type Reading struct {
	stop chan struct{}
	done chan error
}

// Record turns rec on and hands its records to emit until Stop: on before
// it returns, so that a target let go, or a ready file written, finds
// the probes live.
func Record(rec Recorder, emit func(*events.Record) error) (*Reading, error) {
	if err := rec.On(); err != nil {
		return nil, err
	}
	r := &Reading{stop: make(chan struct{}), done: make(chan error, 1)}
	go func() { r.done <- rec.Run(r.stop, emit) }()
	return r, nil
}

// Stop ends the reading once the target is gone: the recorder drains
// what is left, and Stop returns its error.
func (r *Reading) Stop() error {
	close(r.stop)
	return <-r.done
}

// Footer is the recorder's account of the trace: events sent, lost,
// calls seen per operation, the processes that could not record, and,
// from a recorder of BPF programs whose time the kernel counted, that
// time.
func Footer(rec Recorder) *events.Footer {
	f := &events.Footer{Events: rec.Events(), Lost: rec.Lost(), Calls: rec.Calls()}
	if p, ok := rec.(interface {
		ProbeTime() map[string]events.ProgramTime
	}); ok {
		f.ProbeTime = p.ProbeTime()
	}
	if p, ok := rec.(interface{ StackReadMethod() string }); ok {
		f.StackReads = p.StackReadMethod()
	}
	if p, ok := rec.(interface{ Unrecorded() []int }); ok {
		f.Unrecorded = uint64(len(p.Unrecorded()))
	}
	return f
}
