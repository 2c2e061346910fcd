package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer"
)

// traceFlags are the flags run and attach share.
type traceFlags struct {
	output      string
	mode        string
	followForks bool
	probes      []string
	forbid      []string
	ringSize    string
	noSamples   bool
	format      string
	failOn      string
	rep         reportFlags
	hang        hangFlags
	recorder    string // ebpf or preload once resolved; run's --recorder
	autoWhy     string // why --recorder auto could not preload
}

func (f *traceFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.output, "output", "o", "", "write the trace to this file (.htr); %p, %h, %r, %t expand to the PID, host, MPI rank, start time")
	fl.StringVar(&f.mode, "mode", tracer.ModeAggregate, "aggregate: send what the analysis needs and count the rest in the kernel; full: every call")
	fl.BoolVar(&f.followForks, "follow-forks", false, "trace child processes too")
	fl.StringArrayVar(&f.probes, "probe", nil, "also trace entry and exit of this function (SYMBOL or SYMBOL@object; repeatable)")
	fl.StringArrayVar(&f.forbid, "forbid", nil, "OUTER>INNER: INNER must never run while OUTER is on the thread's stack (implies --probe on both)")
	fl.StringVar(&f.ringSize, "ring", "16M", "ring buffer size, a power of two from 4K (K and M suffixes)")
	fl.BoolVar(&f.noSamples, "no-samples", false, "do not copy raw stacks inside allocator calls (no unwinding through glibc)")
	fl.StringVarP(&f.format, "format", "f", "text", formatHelp)
	fl.StringVar(&f.failOn, "fail-on", "error", "exit 1 when a finding is at or above this severity (error, warning, info, none)")
	f.rep.register(fl)
	f.hang.register(fl)
}

// userProbes is --probe plus both sides of every --forbid rule.
func (f *traceFlags) userProbes() ([]string, error) {
	out := append([]string(nil), f.probes...)
	have := map[string]bool{}
	for _, p := range out {
		have[p] = true
	}
	for _, r := range f.forbid {
		outer, inner, ok := strings.Cut(r, ">")
		outer, inner = strings.TrimSpace(outer), strings.TrimSpace(inner)
		if !ok || outer == "" || inner == "" {
			return nil, usageError{fmt.Errorf("--forbid %q: want OUTER>INNER", r)}
		}
		for _, p := range []string{outer, inner} {
			if !have[p] {
				have[p] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// session is one tracing run: the tracer, the trace file, the live status.
type session struct {
	flags  *traceFlags
	tr     recorder
	header events.Header
	sink   *recordSink
	status *statusLine
	hang   *events.Hang // the deadlock hang detection found, if any
}

func newSession(f *traceFlags) (*session, error) {
	probes, err := f.userProbes()
	if err != nil {
		return nil, err
	}
	if err := f.hang.check(); err != nil {
		return nil, err
	}
	if err := f.rep.check(f.format, f.failOn); err != nil {
		return nil, err
	}
	ring, err := parseRingSize(f.ringSize)
	if err != nil {
		return nil, usageError{err}
	}
	tr, err := newRecorder(f, tracer.Options{
		Mode:        f.mode,
		FollowForks: f.followForks,
		RingBytes:   ring,
		NoSamples:   f.noSamples,
		UserProbes:  probes,
		Forbid:      f.forbid,
		Warn:        func(s string) { slog.Warn(s) },
	})
	if err != nil {
		return nil, explainRecorderError(f, err)
	}
	s := &session{flags: f, tr: tr}
	s.header = events.Header{
		Version:    events.Version,
		Tool:       "hooktrace " + version,
		Host:       hostname(),
		Kernel:     kernelRelease(),
		Clock:      "CLOCK_MONOTONIC",
		StartUnix:  time.Now().UnixNano(),
		StartNS:    tracer.MonotonicNow(),
		Mode:       f.mode,
		Recorder:   recorderName(tr),
		UserProbes: probes,
		Forbid:     f.forbid,
	}
	return s, nil
}

// start opens the output and runs the reader until stop closes; the
// returned channel yields Run's error.
func (s *session) start(stop <-chan struct{}) (<-chan error, error) {
	s.header.Probes = s.tr.Sites()
	output, err := expandOutputPath(s.flags.output, &s.header)
	if err != nil {
		return nil, err
	}
	sink, err := newRecordSink(output, &s.header)
	if err != nil {
		return nil, err
	}
	s.sink = sink
	s.status = newStatusLine(s.tr)
	done := make(chan error, 1)
	go func() { done <- s.tr.Run(stop, s.sink.add) }()
	return done, nil
}

// finish writes the footer and closes the trace.
func (s *session) finish(reason string, exit *int, signal string) (*events.Footer, error) {
	s.status.stop()
	foot := &events.Footer{
		EndNS:      tracer.MonotonicNow(),
		Events:     s.tr.Events(),
		Lost:       s.tr.Lost(),
		Calls:      s.tr.Calls(),
		ExitStatus: exit,
		ExitSignal: signal,
		Reason:     reason,
		Hang:       s.hang,
	}
	err := s.sink.close(foot)
	s.tr.Close()
	return foot, err
}

// statusLine prints a one-line live status on a terminal, nothing elsewhere.
type statusLine struct {
	tr   recorder
	quit chan struct{}
	done chan struct{}
}

func newStatusLine(tr recorder) *statusLine {
	s := &statusLine{tr: tr, quit: make(chan struct{}), done: make(chan struct{})}
	if !term.IsTerminal(int(os.Stderr.Fd())) {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		// Calls are every probe hit; events what was sent (in aggregate
		// mode, repeats are only counted).
		var last, lastCalls uint64
		for {
			select {
			case <-s.quit:
				fmt.Fprint(os.Stderr, "\r\033[K")
				return
			case <-tick.C:
				n, calls := tr.Events(), sumCalls(tr.Calls())
				threads, locks := tr.Seen()
				fmt.Fprintf(os.Stderr, "\r\033[Khooktrace: %d calls/s, %d events/s, %d threads, %d locks, %d lost",
					calls-lastCalls, n-last, threads, locks, tr.Lost())
				last, lastCalls = n, calls
			}
		}
	}()
	return s
}

func sumCalls(calls map[string]uint64) uint64 {
	var n uint64
	for _, v := range calls {
		n += v
	}
	return n
}

func (s *statusLine) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

// recordSink receives the live stream: it feeds the analyzer and writes the
// trace file.
type recordSink struct {
	an   *analyzer.Analyzer
	f    *os.File
	w    *events.Writer
	last time.Time
}

func newRecordSink(path string, h *events.Header) (*recordSink, error) {
	s := &recordSink{an: analyzer.New(analyzer.Options{})}
	s.an.BeginStream("live")
	s.an.Add(&events.Record{Kind: events.RecHeader, Header: h})
	if path == "" {
		return s, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating the trace file: %w", err)
	}
	s.f = f
	s.w = events.NewWriter(f)
	if err := s.w.Write(&events.Record{Kind: events.RecHeader, Header: h}); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	s.last = time.Now()
	return s, nil
}

func (s *recordSink) add(r *events.Record) error {
	s.an.Add(r)
	if s.w == nil {
		return nil
	}
	if err := s.w.Write(r); err != nil {
		return fmt.Errorf("writing the trace: %w", err)
	}
	// Flush now and then, so a tracer killed mid-run loses little.
	if time.Since(s.last) > time.Second {
		s.last = time.Now()
		return s.w.Flush()
	}
	return nil
}

func (s *recordSink) close(foot *events.Footer) error {
	if s.w == nil {
		return nil
	}
	err := s.w.Write(&events.Record{Kind: events.RecFooter, Footer: foot})
	if cerr := s.w.Close(); err == nil {
		err = cerr
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("closing the trace file: %w", err)
	}
	return nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// parseRingSize reads --ring: a power of two from a page (4K) up, with an
// optional K or M suffix.
func parseRingSize(v string) (int, error) {
	n, unit := v, 1
	switch {
	case strings.HasSuffix(v, "K"):
		n, unit = strings.TrimSuffix(v, "K"), 1<<10
	case strings.HasSuffix(v, "M"):
		n, unit = strings.TrimSuffix(v, "M"), 1<<20
	}
	size, err := strconv.Atoi(n)
	size *= unit
	if err != nil || size < 4096 || size > 1<<30 || size&(size-1) != 0 {
		return 0, fmt.Errorf("--ring %q: want a power of two from 4K to 1024M", v)
	}
	return size, nil
}
