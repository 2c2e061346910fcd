//go:build linux && amd64

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/rcache"
	"github.com/hooktrace/hooktrace/reports"
	"github.com/hooktrace/hooktrace/source"
)

// The names the demo's verdicts look for, as the analysis names them.
const (
	demoCacheLock = "vma_lock (" + rcache.LibraryName + ")"
	demoArenaLock = "glibc malloc arena"
)

type demoFlags struct {
	format      string
	stress      bool
	seconds     float64
	hangTimeout time.Duration
	traceDir    string
	cacheDir    string
	recorder    string
}

func newDemoCmd() *cobra.Command {
	f := &demoFlags{}
	c := &cobra.Command{
		Use:   "demo [--format text|json] [--stress]",
		Short: "Trace the reference registration cache, legacy and fixed, and show what hooktrace finds",
		Long: `demo builds the reference registration cache (rcache: Open MPI's rcache/base
VMA tree, in its legacy and fixed variants) with the system C compiler, runs
its workload under the tracer once per variant and prints the verdicts side
by side: the legacy variant has a potential deadlock between vma_lock and
glibc's malloc arena lock, the fixed one has none. With --stress the legacy
variant deadlocks for real, and hang detection catches it.

Exit status 0 when both verdicts are as expected, 1 otherwise.`,
		Example: `  hooktrace demo
  hooktrace demo --format json
  hooktrace demo --stress`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(c *cobra.Command, args []string) error {
			return runDemo(c.OutOrStdout(), f)
		},
	}
	fl := c.Flags()
	fl.StringVarP(&f.format, "format", "f", "text", "text, or json: {\"legacy\": REPORT, \"fixed\": REPORT} in the JSON report format")
	fl.BoolVar(&f.stress, "stress", false, "run the workload that makes the legacy variant deadlock for real, and catch it with hang detection")
	fl.Float64Var(&f.seconds, "seconds", 0, "how long each workload runs (default 2; with --stress, up to 30 for legacy and 3 for fixed)")
	fl.DurationVar(&f.hangTimeout, "hang-timeout", 2*time.Second, "hang detection's timeout")
	fl.StringVar(&f.traceDir, "trace-dir", "", "keep the traces there (legacy.htr, fixed.htr) for hooktrace analyze")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "where the compiled cache is kept (default: the user's cache directory)")
	registerRecorder(c, &f.recorder)
	return c
}

// demoRun is one variant's traced run.
type demoRun struct {
	variant string
	res     *analyzer.Result
	foot    *events.Footer
	sum     workloadSummary
	wall    time.Duration
	startNS uint64 // CLOCK_MONOTONIC when the target was let go, as Hang.Time
	ok      bool
	verdict string
}

// workloadSummary is what the workload writes with --summary.
type workloadSummary struct {
	Variant       string  `json:"variant"`
	Mode          string  `json:"mode"`
	Seconds       float64 `json:"seconds"`
	Registrations uint64  `json:"registrations"`
	Hits          uint64  `json:"hits"`
	Invalidated   uint64  `json:"invalidated"`
	HookCalls     uint64  `json:"hook_calls"`
	HookDeferred  uint64  `json:"hook_deferred"`
	TrimBatches   uint64  `json:"trim_batches"`
	present       bool
}

func runDemo(w io.Writer, f *demoFlags) error {
	if f.format != "text" && f.format != "json" {
		return usageError{fmt.Errorf("--format %q: want text or json", f.format)}
	}
	if f.seconds < 0 || f.hangTimeout <= 0 {
		return usageError{fmt.Errorf("--seconds and --hang-timeout must be positive")}
	}
	cacheDir := f.cacheDir
	if cacheDir == "" {
		d, err := rcache.DefaultCacheDir()
		if err != nil {
			return err
		}
		cacheDir = d
	}
	t0 := time.Now()
	built, err := rcache.Build(cacheDir)
	if err != nil {
		return err
	}
	how := "compiled"
	if built.Cached {
		how = "cached"
	}
	fmt.Fprintf(os.Stderr, "hooktrace demo: reference cache %s with %s in %s (%v)\n", how, built.Compiler, built.Dir,
		time.Since(t0).Round(time.Millisecond))
	if f.traceDir != "" {
		if err := os.MkdirAll(f.traceDir, 0o755); err != nil {
			return fmt.Errorf("--trace-dir: %w", err)
		}
	}
	scratch, err := os.MkdirTemp("", "hooktrace-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	var runs []*demoRun
	for _, variant := range []string{"legacy", "fixed"} {
		fmt.Fprintf(os.Stderr, "hooktrace demo: tracing the %s variant%s...\n", variant, map[bool]string{true: " (--stress)"}[f.stress])
		r, err := traceDemoVariant(built, variant, f, scratch)
		if err != nil {
			return fmt.Errorf("%s variant: %w", variant, err)
		}
		runs = append(runs, r)
	}
	if f.format == "json" {
		if err := writeDemoJSON(w, runs); err != nil {
			return err
		}
	} else {
		writeDemoText(w, runs, f)
	}
	for _, r := range runs {
		if !r.ok {
			return &exitError{code: exitFindings}
		}
	}
	return nil
}

// traceDemoVariant runs the workload under the tracer as run does, and
// judges the result.
func traceDemoVariant(b *rcache.Built, variant string, f *demoFlags, scratch string) (*demoRun, error) {
	secs := f.seconds
	summary := filepath.Join(scratch, variant+".json")
	argv := []string{b.Workload, "--variant", variant, "--summary", summary}
	ring := 16
	if f.stress {
		if secs == 0 {
			secs = 30 // the legacy run ends at its deadlock, long before
			if variant == "fixed" {
				secs = 3
			}
		}
		// The watchdog is the workload's own last resort; hang detection
		// must come first.
		watchdog := int(f.hangTimeout.Seconds()*3) + 10
		argv = append(argv, "--stress", "--watchdog", fmt.Sprint(watchdog))
		ring = 64
	} else if secs == 0 {
		secs = 2
	}
	argv = append(argv, "--seconds", fmt.Sprint(secs))
	tf := &traceFlags{
		mode:     source.ModeAggregate,
		ringSize: fmt.Sprintf("%dM", ring),
		format:   "json",
		failOn:   "none",
		hang:     hangFlags{timeout: f.hangTimeout, onHang: "kill"},
		recorder: f.recorder,
	}
	if f.traceDir != "" {
		tf.output = filepath.Join(f.traceDir, variant+".htr")
	}
	start := time.Now()
	res, foot, startNS, err := traceCommand(tf, argv)
	if err != nil {
		return nil, err
	}
	r := &demoRun{variant: variant, res: res, foot: foot, wall: time.Since(start), startNS: startNS}
	if data, err := os.ReadFile(summary); err == nil && json.Unmarshal(data, &r.sum) == nil {
		r.sum.present = true
	}
	judgeDemo(r, f.stress)
	return r, nil
}

// traceCommand runs argv traced from its first instruction to its exit,
// as run does, and returns the analysis (the footer already added) and
// when the target was let go to exec (CLOCK_MONOTONIC).
func traceCommand(f *traceFlags, argv []string) (*analyzer.Result, *events.Footer, uint64, error) {
	s, foot, launched, err := runGated(f, argv)
	if err != nil {
		return nil, nil, 0, err
	}
	an := s.sink.Analyzer()
	an.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	return an.Result(), foot, launched, nil
}

// judgeDemo sets a run's verdict. Without --stress: legacy must show the
// potential deadlock (an error lock-order cycle through vma_lock and the
// arena), fixed no error finding, both from complete traces. With
// --stress: legacy must have deadlocked for real (a deadlock finding
// through both locks), fixed must have run to its end without one.
func judgeDemo(r *demoRun, stress bool) {
	st := &r.res.Stats
	switch {
	case r.variant == "legacy" && stress:
		if f := findCycle(r.res, analyzer.KindDeadlock); f != nil {
			r.ok, r.verdict = true, "DEADLOCKED, caught by hang detection (as expected)"
		} else {
			r.verdict = "did not deadlock this time (it is a race: run again)"
		}
	case r.variant == "legacy":
		if f := findCycle(r.res, analyzer.KindLockOrderCycle); f != nil {
			r.ok, r.verdict = true, "POTENTIAL DEADLOCK (as expected)"
		} else {
			r.verdict = "no potential deadlock found (NOT as expected)"
		}
	default:
		if n := errorFindings(r.res); n > 0 {
			r.verdict = fmt.Sprintf("%d error finding(s) (NOT as expected)", n)
		} else if stress && st.ExitStatus == nil {
			r.verdict = "did not run to its end (NOT as expected)"
		} else {
			r.ok, r.verdict = true, "no deadlock possible (as expected)"
		}
	}
	if r.ok && !st.Complete && !(stress && r.variant == "legacy") {
		r.ok = false
		r.verdict += ", but the trace is INCOMPLETE: " + st.Incomplete
	}
}

// findCycle returns the error finding of kind through vma_lock and the
// arena lock.
func findCycle(res *analyzer.Result, kind analyzer.Kind) *analyzer.Finding {
	for i := range res.Findings {
		f := &res.Findings[i]
		if f.Kind != kind || f.Severity != analyzer.SeverityError {
			continue
		}
		cache, arena := false, false
		for _, l := range f.Locks {
			cache = cache || l == demoCacheLock
			arena = arena || strings.Contains(l, "arena")
		}
		if cache && arena {
			return f
		}
	}
	return nil
}

func errorFindings(res *analyzer.Result) int {
	n := 0
	for _, f := range res.Findings {
		if f.Severity == analyzer.SeverityError {
			n++
		}
	}
	return n
}

// writeDemoJSON prints {"legacy": REPORT, "fixed": REPORT}.
func writeDemoJSON(w io.Writer, runs []*demoRun) error {
	var b bytes.Buffer
	b.WriteString("{")
	for i, r := range runs {
		var rep bytes.Buffer
		if err := reports.JSON(&rep, r.res); err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "\n%q: %s", r.variant, bytes.TrimSpace(rep.Bytes()))
	}
	b.WriteString("\n}\n")
	if !json.Valid(b.Bytes()) {
		return fmt.Errorf("writing the report: the combined report is not valid JSON")
	}
	_, err := w.Write(b.Bytes())
	return err
}

// writeDemoText prints the side-by-side verdict and the stacks that tell
// the story.
func writeDemoText(w io.Writer, runs []*demoRun, f *demoFlags) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	if f.stress {
		p("hooktrace demo --stress: Open MPI's registration-cache deadlock (issue 1654), for real")
		p("")
		p("Producers register buffers with the cache and hand them to consumers, which free them:")
		p("a consumer's free() holds the producer's arena lock while the cache's madvise hook waits")
		p("for vma_lock, and the producer holds vma_lock while it allocates or frees from that arena.")
	} else {
		p("hooktrace demo: Open MPI's registration-cache deadlock (issue 1654), traced for real")
		p("")
		p("A communication thread registers buffers with the cache; an application thread frees")
		p("memory of its own, and glibc trims its arena with madvise from inside free(), where the")
		p("cache's hook runs. Neither thread waits for the other, so these runs cannot hang: what")
		p("hooktrace reports is what could.")
	}
	p("")
	col := func(label string, val func(r *demoRun) string) {
		line := fmt.Sprintf("  %-16s", label)
		for _, r := range runs {
			line += fmt.Sprintf("%-40s", val(r))
		}
		p("%s", strings.TrimRight(line, " "))
	}
	col("", func(r *demoRun) string {
		if r.variant == "legacy" {
			return "legacy (as Open MPI 2.0)"
		}
		return "fixed"
	})
	col("ran", func(r *demoRun) string {
		s := fmt.Sprintf("%.1f s traced", r.wall.Seconds())
		if r.sum.present {
			s = fmt.Sprintf("%.1f s (%.1f s traced)", r.sum.Seconds, r.wall.Seconds())
		}
		return s
	})
	col("events", func(r *demoRun) string {
		st := &r.res.Stats
		s := fmt.Sprintf("%d", st.Events)
		if st.Complete {
			s += " (complete)"
		} else {
			s += fmt.Sprintf(" (%d lost)", st.LostEvents)
		}
		return s
	})
	col("registrations", func(r *demoRun) string {
		if !r.sum.present {
			return "-"
		}
		return fmt.Sprintf("%d new, %d reused", r.sum.Registrations, r.sum.Hits)
	})
	col("hooks run", func(r *demoRun) string {
		if !r.sum.present {
			return "- (killed)"
		}
		return fmt.Sprintf("%d (%d deferred)", r.sum.HookCalls, r.sum.HookDeferred)
	})
	col("target", func(r *demoRun) string {
		st := &r.res.Stats
		switch {
		case st.ExitSignal != "" && r.foot != nil && r.foot.Hang != nil:
			return "killed by hang detection"
		case st.ExitSignal != "":
			return "signal: " + st.ExitSignal
		case st.ExitStatus != nil:
			return fmt.Sprintf("exit status %d", *st.ExitStatus)
		}
		return "-"
	})
	col("findings", func(r *demoRun) string { return findingCount(r.res.Findings) })
	col("verdict", func(r *demoRun) string {
		v, _, _ := strings.Cut(r.verdict, " (")
		return v
	})
	for _, r := range runs {
		p("")
		writeDemoStory(p, r, f.stress)
	}
	p("")
	all := true
	for _, r := range runs {
		all = all && r.ok
	}
	if all {
		p("verdict: both as expected")
	} else {
		for _, r := range runs {
			if !r.ok {
				p("verdict: %s: %s", r.variant, r.verdict)
			}
		}
	}
}

// writeDemoStory prints what decided a run's verdict: the cycle and the
// stack of each of its edges.
func writeDemoStory(p func(string, ...any), r *demoRun, stress bool) {
	kind := analyzer.KindLockOrderCycle
	if stress {
		kind = analyzer.KindDeadlock
	}
	f := findCycle(r.res, kind)
	if f == nil {
		p("%s: %s.", r.variant, r.verdict)
		if r.variant == "fixed" {
			p("  The hook only tries vma_lock (a trylock cannot wait) and queues the range when it is")
			p("  taken; nothing allocates or frees with vma_lock held. No dependency joins the two locks.")
		}
		for _, g := range r.res.Findings {
			p("  %s %s: %s", strings.ToUpper(string(g.Severity)), g.Kind, g.Title)
		}
		return
	}
	p("%s: %s", r.variant, f.Title)
	if r.foot != nil && r.foot.Hang != nil {
		h := r.foot.Hang
		var blocked uint64
		for _, t := range h.Threads {
			if t.Owner != 0 {
				blocked = max(blocked, t.BlockedNS)
			}
		}
		if h.Time > r.startNS+blocked {
			p("  deadlocked about %.1f s after the workload started; hang detection reported it %.1f s later",
				float64(h.Time-blocked-r.startNS)/1e9, float64(blocked)/1e9)
		}
		p("  (every thread on the cycle blocked for at least %v), and the target was %s",
			time.Duration(h.Timeout), map[string]string{"kill": "killed", "detach": "left running"}[h.Action])
	}
	for i := range f.Edges {
		e := &f.Edges[i]
		letter := string(rune('A' + i))
		owner := ""
		if f.Kind == analyzer.KindDeadlock {
			owner = fmt.Sprintf(", which thread %s holds", string(rune('A'+(i+1)%len(f.Edges))))
		}
		switch {
		case strings.Contains(e.To, "arena") && owner == "":
			p("  thread %s (tid %d) holds %s and calls the allocator, which may need the arena lock:", letter, e.Thread, e.From)
		case strings.Contains(e.To, "arena"):
			p("  thread %s (tid %d) holds %s and waits in the allocator for the arena lock%s:", letter, e.Thread, e.From, owner)
		case owner == "":
			p("  thread %s (tid %d) holds %s and takes %s:", letter, e.Thread, e.From, e.To)
		default:
			p("  thread %s (tid %d) holds %s and waits for %s%s:", letter, e.Thread, e.From, e.To, owner)
		}
		for _, fr := range demoFrames(e.Stack) {
			p("      %s", fr)
		}
	}
}

// demoFrames shortens a stack for the story: up to the thread's start.
func demoFrames(frames []analyzer.Frame) []string {
	var out []string
	for _, fr := range frames {
		fn := fr.Function
		if fn == "start_thread" || strings.HasPrefix(fn, "clone") || fn == "__libc_start_call_main" {
			break
		}
		if fn == "" {
			fn = fr.Address
		}
		loc := ""
		if fr.File != "" {
			loc = fmt.Sprintf("%s:%d", filepath.Base(fr.File), fr.Line)
		} else if fr.Object != "" {
			loc = filepath.Base(fr.Object)
		}
		out = append(out, fmt.Sprintf("%-24s %s", fn, loc))
		if len(out) == 12 {
			break
		}
	}
	return out
}

// findingCount says "1 error, 2 info", or "none".
func findingCount(fs []analyzer.Finding) string {
	if len(fs) == 0 {
		return "none"
	}
	counts := map[analyzer.Severity]int{}
	for _, f := range fs {
		counts[f.Severity]++
	}
	var parts []string
	for _, s := range []analyzer.Severity{analyzer.SeverityError, analyzer.SeverityWarning, analyzer.SeverityInfo} {
		switch n := counts[s]; {
		case n == 1 || (n > 1 && s == analyzer.SeverityInfo):
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		case n > 1:
			parts = append(parts, fmt.Sprintf("%d %ss", n, s))
		}
	}
	return strings.Join(parts, ", ")
}
