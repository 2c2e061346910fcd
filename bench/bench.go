//go:build linux && amd64

// Package bench measures what tracing costs a multi-threaded malloc + mutex
// workload: untraced, under hooktrace (aggregate and full modes), and under
// two floors — the same probe sites attached to a BPF program that only
// counts, and that program at the functions' first instructions, where a
// naive uprobe tracer puts its probes. `make bench` runs it.
package bench

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/tracer"
)

// Config is one way of running the workload.
type Config struct {
	Key    string // short name, for metrics
	Name   string // for the table
	Traced bool
	Opts   tracer.Options // hooktrace's, when traced and not a floor
	// Floor runs the counting-only program of floor.c instead of
	// hooktrace, at hooktrace's sites or, with AtEntry, at the functions'
	// first instructions.
	Floor, AtEntry bool
	// Preload records with the preloaded library instead of eBPF.
	Preload bool
	// TSan runs the workload rebuilt with -fsanitize=thread, untraced: the
	// reference a user would otherwise reach for.
	TSan bool
}

// Configs are the configurations, in the order they run in each round.
func Configs() []Config {
	return []Config{
		{Key: "untraced", Name: "untraced"},
		{Key: "floor", Name: "floor at hooktrace's sites", Traced: true, Floor: true},
		{Key: "entry", Name: "floor at function entries", Traced: true, Floor: true, AtEntry: true},
		{Key: "aggregate", Name: "hooktrace (aggregate, default)", Traced: true,
			Opts: tracer.Options{Mode: tracer.ModeAggregate}},
		{Key: "full", Name: "hooktrace (full)", Traced: true,
			Opts: tracer.Options{Mode: tracer.ModeFull}},
		{Key: "preload", Name: "hooktrace --recorder preload (aggregate)", Traced: true, Preload: true,
			Opts: tracer.Options{Mode: tracer.ModeAggregate}},
		{Key: "preload-full", Name: "hooktrace --recorder preload (full)", Traced: true, Preload: true,
			Opts: tracer.Options{Mode: tracer.ModeFull}},
		{Key: "tsan", Name: "TSan rebuild (-fsanitize=thread), untraced", TSan: true},
	}
}

// Result is one run of one configuration.
type Result struct {
	Wall time.Duration // from letting the target exec to its exit
	CPU  time.Duration // the target's user + system time (probe handling included)
	// ReaderCPU is this process's own CPU time while the target ran: the
	// tracer reading, converting and encoding the stream.
	ReaderCPU time.Duration
	Hits      uint64 // uprobe hits: the floor's counter, or hooktrace's per-op counts
	Lost      uint64
	Records   uint64 // records the tracer handed out
	Bytes     int64  // their size encoded as a trace file
	// What crossed the kernel's ring buffer: records (events, stacks, raw
	// stack samples) and bytes.
	RingRecords, RingBytes uint64
}

// countingWriter counts what the trace-file writer produces.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	return len(b), nil
}

// Run runs argv once under cfg. The target always starts behind the gate,
// traced or not, so every configuration pays the same start-up.
func Run(cfg Config, argv []string, warn func(string)) (Result, error) {
	var res Result
	if cfg.TSan {
		argv = append([]string{argv[0] + TSanSuffix}, argv[1:]...)
	}
	var (
		src session.Recorder
		tr  *tracer.Tracer
		err error
	)
	if cfg.Traced && !cfg.Floor {
		opts := cfg.Opts
		opts.Warn = warn
		if cfg.Preload {
			var pre *tracer.Preload
			pre, err = tracer.NewPreload(opts)
			src = pre
		} else {
			tr, err = tracer.New(opts)
			src = tr
		}
		if err != nil {
			return res, err
		}
		defer src.Close()
	}
	t, err := session.Launch(src, argv)
	if err != nil {
		return res, err
	}
	var fl *floor
	if cfg.Floor {
		if fl, err = attachFloor(t.Gated, cfg.AtEntry, warn); err != nil {
			t.Abort()
			return res, err
		}
		defer fl.close()
	}
	var (
		reading  *session.Reading
		sink     countingWriter
		w        *events.Writer
		writeErr error
	)
	if src != nil {
		if err := t.Attach(); err != nil {
			t.Abort()
			return res, err
		}
		// What a real run does with the stream: encode it as a trace file.
		w = events.NewWriter(&sink)
		mode := cfg.Opts.Mode
		if mode == "" {
			mode = tracer.ModeAggregate
		}
		h := &events.Header{Version: events.Version, Tool: "hooktrace bench", Clock: "CLOCK_MONOTONIC", Mode: mode}
		t.Header(h)
		if err := w.Write(&events.Record{Kind: events.RecHeader, Header: h}); err != nil {
			t.Abort()
			return res, err
		}
		reading, err = session.Record(src, func(r *events.Record) error {
			res.Records++
			if err := w.Write(r); err != nil && writeErr == nil {
				writeErr = err
			}
			return nil
		})
		if err != nil {
			t.Abort()
			return res, err
		}
	}
	self0 := selfCPU()
	start := time.Now()
	// Unheld: the workload is timed alone, as it runs untraced.
	ps, waitErr := t.WaitUnheld()
	res.Wall = time.Since(start)
	res.ReaderCPU = selfCPU() - self0
	if ps != nil {
		res.CPU = ps.UserTime() + ps.SystemTime()
	}
	if ps == nil && waitErr != nil {
		// The target never ran.
		if reading != nil {
			reading.Stop()
		}
		return res, waitErr
	}
	if src != nil {
		err := reading.Stop()
		if err == nil {
			err = w.Write(&events.Record{Kind: events.RecFooter, Footer: session.Footer(src)})
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("tracing: %w", err)
		}
		if writeErr != nil {
			return res, fmt.Errorf("encoding the trace: %w", writeErr)
		}
		res.Lost = src.Lost()
		res.Bytes = sink.n
		if tr != nil {
			res.RingRecords, res.RingBytes = tr.RingRead()
		}
		res.Hits = uprobeHits(src.Calls())
	}
	if fl != nil {
		if res.Hits, err = fl.hits(); err != nil {
			return res, err
		}
	}
	if waitErr != nil {
		return res, fmt.Errorf("the workload: %w", waitErr)
	}
	return res, nil
}

// selfCPU is this process's user + system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// uprobeHits sums the counts of the calls seen by uprobes: the memory
// syscalls and thread events come from tracepoints, which the floors do
// not attach.
func uprobeHits(calls map[string]uint64) uint64 {
	var n uint64
	for name, c := range calls {
		op, ok := events.OpByName(name)
		if !ok || op.IsMemSyscall() || op == events.OpThreadCreate || op == events.OpThreadExit || op == events.OpExec {
			continue
		}
		n += c
	}
	return n
}

// Row is one configuration's medians.
type Row struct {
	Config  Config
	Runs    int
	Wall    time.Duration
	CPU     time.Duration
	Reader  time.Duration
	Hits    uint64
	Lost    uint64 // the largest of any run
	Records uint64
	Bytes   int64
}

// Summary is a whole benchmark's result.
type Summary struct {
	Rows []Row
}

// Summarize takes each configuration's medians, in the order of cfgs.
func Summarize(cfgs []Config, results map[string][]Result) Summary {
	var s Summary
	for _, c := range cfgs {
		rs := results[c.Key]
		if len(rs) == 0 {
			continue
		}
		row := Row{Config: c, Runs: len(rs),
			Wall:    median(rs, func(r Result) time.Duration { return r.Wall }),
			CPU:     median(rs, func(r Result) time.Duration { return r.CPU }),
			Reader:  median(rs, func(r Result) time.Duration { return r.ReaderCPU }),
			Hits:    median(rs, func(r Result) uint64 { return r.Hits }),
			Records: median(rs, func(r Result) uint64 { return r.Records }),
			Bytes:   median(rs, func(r Result) int64 { return r.Bytes }),
		}
		for _, r := range rs {
			row.Lost = max(row.Lost, r.Lost)
		}
		s.Rows = append(s.Rows, row)
	}
	return s
}

// median is the median of f over rs (the mean of the middle two for an
// even count).
func median[T int64 | uint64 | time.Duration](rs []Result, f func(Result) T) T {
	v := make([]T, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return v[n/2-1] + (v[n/2]-v[n/2-1])/2
}

// Row returns the row of the configuration named key.
func (s Summary) Row(key string) (Row, bool) {
	for _, r := range s.Rows {
		if r.Config.Key == key {
			return r, true
		}
	}
	return Row{}, false
}

// Overhead is what a configuration adds to the untraced run: wall time,
// and the target's CPU time.
func (s Summary) Overhead(key string) (wall, cpu time.Duration) {
	base, ok1 := s.Row("untraced")
	r, ok2 := s.Row(key)
	if !ok1 || !ok2 {
		return 0, 0
	}
	return r.Wall - base.Wall, r.CPU - base.CPU
}

// Slowdown is a configuration's wall time over the untraced one's.
func (s Summary) Slowdown(key string) float64 {
	base, ok1 := s.Row("untraced")
	r, ok2 := s.Row(key)
	if !ok1 || !ok2 || base.Wall <= 0 {
		return 0
	}
	return float64(r.Wall) / float64(base.Wall)
}

// NsPerHit is a configuration's overhead divided by its probe hits, in
// wall and in CPU time.
func (s Summary) NsPerHit(key string) (wall, cpu float64) {
	r, ok := s.Row(key)
	if !ok || r.Hits == 0 {
		return 0, 0
	}
	w, c := s.Overhead(key)
	return float64(w.Nanoseconds()) / float64(r.Hits), float64(c.Nanoseconds()) / float64(r.Hits)
}

// Ratio is overhead(a)/overhead(b), in wall and in CPU time.
func (s Summary) Ratio(a, b string) (wall, cpu float64) {
	aw, ac := s.Overhead(a)
	bw, bc := s.Overhead(b)
	if bw > 0 {
		wall = float64(aw) / float64(bw)
	}
	if bc > 0 {
		cpu = float64(ac) / float64(bc)
	}
	return wall, cpu
}

// Targets are the goals the table is judged by.
type Targets struct {
	VsFloor     float64 // overhead(aggregate)/overhead(floor), want ≤ 1.2
	VsFloorCPU  float64
	EntryVs     float64 // overhead(entry floor)/overhead(aggregate), want ≥ 5
	EntryVsCPU  float64
	LostDefault uint64 // want 0
}

// Targets computes the goals from the medians.
func (s Summary) Targets() Targets {
	var t Targets
	t.VsFloor, t.VsFloorCPU = s.Ratio("aggregate", "floor")
	t.EntryVs, t.EntryVsCPU = s.Ratio("entry", "aggregate")
	if r, ok := s.Row("aggregate"); ok {
		t.LostDefault = r.Lost
	}
	return t
}

// Markdown renders the table and the targets.
func (s Summary) Markdown(workload string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", workload)
	b.WriteString("| configuration | wall (median) | × untraced | target CPU | tracer CPU | probe hits | ns/hit (wall) | ns/hit (target CPU) | records | trace | lost |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Rows {
		hits, perWall, perCPU, recs, size, lost, reader := "–", "–", "–", "–", "–", "–", "–"
		if r.Config.Traced {
			reader = fmtDur(r.Reader)
			hits = fmt.Sprint(r.Hits)
			w, c := s.NsPerHit(r.Config.Key)
			perWall, perCPU = fmt.Sprintf("%.0f", w), fmt.Sprintf("%.0f", c)
			lost = fmt.Sprint(r.Lost)
			if !r.Config.Floor {
				recs = fmt.Sprint(r.Records)
				size = fmt.Sprintf("%.1f MiB", float64(r.Bytes)/(1<<20))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.1fx | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Config.Name, fmtDur(r.Wall), s.Slowdown(r.Config.Key), fmtDur(r.CPU), reader, hits, perWall, perCPU, recs, size, lost)
	}
	b.WriteString("\nOverhead is a configuration's median minus the untraced median; ns/hit is " +
		"overhead over probe hits. Target CPU is the workload's user + system time (the kernel's " +
		"probe handling included); tracer CPU is the tracing process's own, while the workload ran.\n")
	t := s.Targets()
	_, floor := s.Row("floor")
	_, entry := s.Row("entry")
	_, agg := s.Row("aggregate")
	if !agg {
		s.preloadTargets(&b)
		return b.String()
	}
	b.WriteString("\n| target | wall | CPU | goal | met |\n|---|---:|---:|---:|---|\n")
	if floor {
		fmt.Fprintf(&b, "| hooktrace overhead / floor overhead (same sites) | %.2f | %.2f | ≤ 1.2 | %s |\n",
			t.VsFloor, t.VsFloorCPU, yes(t.VsFloor > 0 && t.VsFloor <= 1.2))
	}
	if entry {
		fmt.Fprintf(&b, "| entry-floor overhead / hooktrace overhead | %.1f | %.1f | ≥ 5 | %s |\n",
			t.EntryVs, t.EntryVsCPU, yes(t.EntryVs >= 5))
	}
	fmt.Fprintf(&b, "| lost events at default settings (worst run) | %d | | 0 | %s |\n", t.LostDefault, yes(t.LostDefault == 0))
	s.preloadTargets(&b)
	return b.String()
}

// preloadTargets adds the preload recorder's goals: within 3x of the
// untraced run, and at least 5x faster than a TSan rebuild.
func (s Summary) preloadTargets(b *strings.Builder) {
	base, ok1 := s.Row("untraced")
	pre, ok2 := s.Row("preload")
	if !ok1 || !ok2 || base.Wall <= 0 || base.CPU <= 0 {
		return
	}
	wall, cpu := float64(pre.Wall)/float64(base.Wall), float64(pre.CPU)/float64(base.CPU)
	fmt.Fprintf(b, "| preload (aggregate) / untraced | %.2f | %.2f | ≤ 3 | %s |\n", wall, cpu, yes(wall <= 3))
	if ts, ok := s.Row("tsan"); ok && pre.Wall > 0 && pre.CPU > 0 {
		w, c := float64(ts.Wall)/float64(pre.Wall), float64(ts.CPU)/float64(pre.CPU)
		fmt.Fprintf(b, "| TSan rebuild / preload | %.1f | %.1f | ≥ 5 | %s |\n", w, c, yes(w >= 5))
	}
	if a, ok := s.Row("aggregate"); ok && pre.Wall > 0 {
		fmt.Fprintf(b, "| eBPF aggregate / preload | %.1f | %.1f | | |\n", float64(a.Wall)/float64(pre.Wall), float64(a.CPU)/float64(pre.CPU))
	}
	fmt.Fprintf(b, "| preload lost events (worst run) | %d | | 0 | %s |\n", pre.Lost, yes(pre.Lost == 0))
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.3f s", d.Seconds())
}

// TSanSuffix names the -fsanitize=thread build next to the workload.
const TSanSuffix = "-tsan"

// Build compiles the workload C file with gcc into dir, and with tsan also
// a -fsanitize=thread build (libtsan) named with TSanSuffix.
func Build(src, dir string, tsan bool) (string, error) {
	out := dir + "/workload"
	b, err := exec.Command("gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", out, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("gcc: %v\n%s", err, b)
	}
	if tsan {
		b, err := exec.Command("gcc", "-O2", "-g", "-fsanitize=thread", "-pthread", "-o", out+TSanSuffix, src).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("gcc -fsanitize=thread (needs libtsan): %v\n%s", err, b)
		}
	}
	return out, nil
}
