//go:build linux && amd64

package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/probesite"
	"github.com/hooktrace/hooktrace/rules"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
)

// traceFlags are the flags run and attach share.
type traceFlags struct {
	output      string
	mode        string
	followForks bool
	probes      []string
	forbid      []string
	rules       []string      // --rules: pack names or files
	packs       []*rules.Pack // loaded from rules by userProbes
	ringSize    string
	noSamples   bool
	format      string
	failOn      string
	readyFile   string
	rep         reportFlags
	hang        hangFlags
	recorder    string // ebpf or preload once resolved; run's --recorder
	autoWhy     string // why --recorder auto could not preload
	// noEBPF is why auto records with preload alone: the kernel cannot
	// run the eBPF recorder (tracer.KernelError's Missing, for the
	// trace header), and noEBPFLine says it on stderr (its Line).
	noEBPF, noEBPFLine string

	ignoreTargetStatus bool // run only
}

func (f *traceFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.output, "output", "o", "", "write the trace to this file (.htr); %p, %h, %r, %t expand to the PID, host, MPI rank, start time")
	fl.StringVar(&f.mode, "mode", source.ModeAggregate, "aggregate: send what the analysis needs and count the rest in the kernel; full: every call")
	fl.BoolVar(&f.followForks, "follow-forks", false, "trace child processes too")
	fl.StringArrayVar(&f.probes, "probe", nil, "also trace entry and exit of this function (SYMBOL or SYMBOL@object; a library loaded later with dlopen by its path; repeatable)")
	fl.StringArrayVar(&f.forbid, "forbid", nil, "OUTER>INNER: INNER must never run while OUTER is on the thread's stack (implies --probe on both)")
	fl.StringArrayVar(&f.rules, "rules", nil, "check a rule pack: upcxx (built in: UPC++ progress levels) or a rules file in the same format (docs/rules.md); repeatable")
	fl.StringVar(&f.ringSize, "ring", "16M", "ring buffer size, a power of two from 4K to 1G (K, M and G suffixes)")
	fl.BoolVar(&f.noSamples, "no-samples", false, "do not copy raw stacks inside allocator calls (no unwinding through glibc)")
	fl.StringVarP(&f.format, "format", "f", "text", formatHelp)
	fl.StringVar(&f.failOn, "fail-on", "error", "exit 1 when a finding is at or above this severity (error, warning, info, none)")
	fl.StringVar(&f.readyFile, "ready-file", "", "write the target's PID to this file once every probe is placed and tracing is on (for run: before the target's first instruction)")
	f.rep.register(fl)
	f.hang.register(fl)
}

// userProbes is --probe plus both sides of every --forbid rule, read by
// the analyzer's own parser so that run, attach and analyze accept the
// same rules, plus the INNER side of every --rules pack's rules, which a
// program may lack (probesite.OptionalProbe).
func (f *traceFlags) userProbes() ([]string, error) {
	out := append([]string(nil), f.probes...)
	have := map[string]bool{}
	for _, p := range out {
		have[p] = true
	}
	rules, err := parseRules(f.forbid)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		for _, p := range append([]string{r.Outer}, r.Probed()...) {
			if !have[p] {
				have[p] = true
				out = append(out, p)
			}
		}
	}
	f.packs, err = loadPacks(f.rules)
	if err != nil {
		return nil, err
	}
	for _, pk := range f.packs {
		for _, p := range pk.Probed() {
			if !have[p] {
				have[p] = true
				out = append(out, probesite.OptionalProbe+p)
			}
		}
	}
	return out, nil
}

// forbidSpecs are the rules the trace's header records: --forbid's and
// the packs', with their reasons, so that analyze checks them again.
func (f *traceFlags) forbidSpecs() []string {
	out := slices.Clone(f.forbid)
	for _, pk := range f.packs {
		for _, r := range pk.Rules {
			out = append(out, r.Spec())
		}
	}
	return out
}

// warn logs what the recorder says. A pack's function missing from the
// program is a warning when the pack says what its absence means (an
// optimised build), and otherwise only a debug message: most programs use
// a few of the functions a pack knows.
func (f *traceFlags) warn(msg string) {
	if strings.HasPrefix(msg, probesite.MissingRulePrefix) {
		for _, pk := range f.packs {
			for fn, why := range pk.Missing {
				if strings.HasPrefix(msg, probesite.MissingRulePrefix+fn+" ") {
					slog.Warn(msg + ": " + why)
					return
				}
			}
		}
		slog.Debug(msg + ": the rules on it are not checked")
		return
	}
	slog.Warn(msg)
}

// recording is one tracing run: the tracer, the trace file, the live status.
type recording struct {
	flags    *traceFlags
	tr       recorder
	header   events.Header
	sink     *session.Sink
	status   *statusLine
	deadlock *events.Hang // what hang detection found, if any
	ranks    *jobRanks    // which process was which rank, for the footer
}

func newRecording(f *traceFlags) (*recording, error) {
	s, opts, err := prepareRecording(f)
	if err != nil {
		return nil, err
	}
	tr, err := openRecorder(f, opts)
	if err != nil {
		return nil, err
	}
	s.useRecorder(tr)
	return s, nil
}

// prepareRecording checks the flags and starts the trace's header; the
// recorder is opened with the returned options.
func prepareRecording(f *traceFlags) (*recording, source.Options, error) {
	if err := source.CheckMode(f.mode); err != nil {
		return nil, source.Options{}, usageError{fmt.Errorf("--mode %w", err)}
	}
	probes, err := f.userProbes()
	if err != nil {
		return nil, source.Options{}, err
	}
	if err := f.hang.check(); err != nil {
		return nil, source.Options{}, err
	}
	if err := f.rep.check(f.format, f.failOn); err != nil {
		return nil, source.Options{}, err
	}
	ring, err := parseRingSize(f.ringSize)
	if err != nil {
		return nil, source.Options{}, usageError{err}
	}
	opts := source.Options{
		Mode:        f.mode,
		FollowForks: f.followForks,
		RingBytes:   ring,
		NoSamples:   f.noSamples,
		UserProbes:  probes,
		Warn:        f.warn,
	}
	s := &recording{flags: f}
	s.header = events.Header{
		Version:    events.Version,
		Tool:       "hooktrace " + version,
		Host:       hostname(),
		Kernel:     proc.KernelRelease(),
		Clock:      "CLOCK_MONOTONIC",
		StartUnix:  time.Now().UnixNano(),
		StartNS:    proc.Now(),
		Mode:       f.mode,
		UserProbes: probes,
		Forbid:     f.forbidSpecs(),
	}
	return s, opts, nil
}

// openRecorder opens the recorder f names, saying on stderr why auto
// chose eBPF.
func openRecorder(f *traceFlags, opts source.Options) (recorder, error) {
	tr, err := newRecorder(f, opts)
	if err != nil {
		return nil, explainRecorderError(f, err)
	}
	if f.autoWhy != "" {
		fmt.Fprintf(os.Stderr, "hooktrace: recording with eBPF: %s\n", f.autoWhy)
	}
	if f.noEBPF != "" {
		fmt.Fprintf(os.Stderr, "hooktrace: warning: %s: recording with the preload recorder alone\n", f.noEBPFLine)
	}
	return tr, nil
}

// useRecorder makes tr the recording's recorder.
func (s *recording) useRecorder(tr recorder) {
	s.tr = tr
	s.header.Recorder = recorderName(tr)
	s.header.NoEBPF = s.flags.noEBPF
}

// start opens the output and runs the reader until the returned reading
// is stopped.
func (s *recording) start() (*session.Reading, error) {
	s.header.Probes = s.tr.Sites()
	output, err := expandOutputPath(s.flags.output, &s.header)
	if err != nil {
		return nil, err
	}
	sink, err := session.NewSink(output, &s.header)
	if err != nil {
		return nil, err
	}
	s.sink = sink
	s.status = newStatusLine(s.tr)
	s.ranks = newJobRanks(os.Getenv)
	reading, err := session.Record(s.tr, func(r *events.Record) error {
		s.ranks.observe(r)
		return s.sink.Add(r)
	})
	if err != nil {
		sink.Abandon()
		return nil, err
	}
	return reading, nil
}

// startUnrecorded opens the output of a recording that records nothing,
// and says why: hang detection alone watches the process.
func (s *recording) startUnrecorded(why string) error {
	s.header.Recorder = recorderNone
	s.header.Unrecorded = why
	output, err := expandOutputPath(s.flags.output, &s.header)
	if err != nil {
		return err
	}
	s.sink, err = session.NewSink(output, &s.header)
	return err
}

// finish writes the footer and closes the trace.
func (s *recording) finish(reason string, exit *int, signal string) (*events.Footer, error) {
	foot := &events.Footer{Calls: map[string]uint64{}}
	if s.tr != nil {
		s.status.stop()
		foot = session.Footer(s.tr)
	}
	foot.EndNS = proc.Now()
	foot.ExitStatus, foot.ExitSignal = exit, signal
	foot.Reason = reason
	foot.Hang = s.deadlock
	if s.ranks != nil {
		foot.Ranks = s.ranks.ranks(s.header.PID)
	}
	err := s.sink.Close(foot)
	if s.tr != nil {
		s.tr.Close()
	}
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

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// parseRingSize reads --ring: a power of two from a page (4K) to 1G, with
// an optional K, M or G suffix.
func parseRingSize(v string) (int, error) {
	n, unit := v, 1
	switch {
	case strings.HasSuffix(v, "K"):
		n, unit = strings.TrimSuffix(v, "K"), 1<<10
	case strings.HasSuffix(v, "M"):
		n, unit = strings.TrimSuffix(v, "M"), 1<<20
	case strings.HasSuffix(v, "G"):
		n, unit = strings.TrimSuffix(v, "G"), 1<<30
	}
	size, err := strconv.Atoi(n)
	if err != nil || size <= 0 || size > 1<<30/unit || size*unit < 4096 || size&(size-1) != 0 {
		return 0, fmt.Errorf("--ring %q: want a power of two from 4K to 1G", v)
	}
	return size * unit, nil
}

// report prints the analysis of what the recording traced on w: stdout
// for attach, stderr for run (whose stdout is the target's).
func (s *recording) report(foot *events.Footer, w io.Writer) error {
	an := s.sink.Analyzer()
	an.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	expand := func(p string) (string, error) { return expandOutputPath(p, &s.header) }
	return writeReport(w, an.Result(), s.flags.format, s.flags.failOn, &s.flags.rep, expand)
}
