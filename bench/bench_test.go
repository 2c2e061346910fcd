//go:build linux && amd64

package bench

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/launch"
)

func init() {
	// This test binary is also the gate for the floor's workloads.
	if len(os.Args) > 1 && os.Args[1] == launch.GateArg {
		runtime.LockOSThread()
		launch.RunGate(os.Args[2:])
	}
}

// Flags, each also read from an environment variable (`make bench` sets
// them from its BENCH_* variables).
var (
	rounds  = flag.Int("rounds", envInt("HOOKTRACE_BENCH_ROUNDS", 3), "rounds; each runs every configuration once (env HOOKTRACE_BENCH_ROUNDS)")
	iters   = flag.Int("iters", envInt("HOOKTRACE_BENCH_ITERS", 100000), "lock holds per thread (env HOOKTRACE_BENCH_ITERS)")
	threads = flag.Int("threads", envInt("HOOKTRACE_BENCH_THREADS", 2), "workload threads (env HOOKTRACE_BENCH_THREADS)")
	mutexes = flag.Int("mutexes", envInt("HOOKTRACE_BENCH_MUTEXES", 4), "mutexes the threads share (env HOOKTRACE_BENCH_MUTEXES)")
	only    = flag.String("configs", os.Getenv("HOOKTRACE_BENCH_CONFIGS"),
		"comma-separated configurations to run (untraced always runs); empty: the defaults (env HOOKTRACE_BENCH_CONFIGS)")
	binary = flag.String("hooktrace", os.Getenv("HOOKTRACE_BENCH_BIN"),
		"the hooktrace binary to measure; empty: build ../cmd/hooktrace (env HOOKTRACE_BENCH_BIN)")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var benchOnce sync.Once

// BenchmarkOverhead runs the workload under every selected configuration,
// round-robin, and prints the table. It runs the rounds once whatever b.N
// is: -benchtime 1x. A configuration that cannot run here (a tool not
// installed, a recorder the binary lacks) gets a row that says why; one
// that fails gets a row with its error, and the benchmark fails after the
// table.
func BenchmarkOverhead(b *testing.B) {
	testenv.RequireBPF(b)
	ran := false
	benchOnce.Do(func() { ran = true })
	if !ran {
		b.Skip("the rounds already ran")
	}
	cfgs, err := Select(*only)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	src := filepath.Join("testdata", "workload.c")
	r := &Runner{
		Plain: testenv.C{Source: src}.Build(b),
		Dir:   dir,
		Warn: func(s string) {
			fmt.Fprintln(os.Stderr, "warning:", s)
		},
	}
	if slices.ContainsFunc(cfgs, func(c Config) bool { return c.TSan }) {
		// libtsan missing is a row that says so, not a failed bench.
		out := filepath.Join(dir, "workload-tsan")
		flags := append(slices.Clone(testenv.CFlags), "-fsanitize=thread", "-o", out, src)
		if msg, err := exec.Command("gcc", flags...).CombinedOutput(); err == nil {
			r.TSan = out
		} else {
			fmt.Fprintf(os.Stderr, "no TSan build: %v\n%s", err, msg)
		}
	}
	r.Hooktrace = hooktraceBinary(b, dir)
	args := []string{strconv.Itoa(*iters), strconv.Itoa(*threads), strconv.Itoa(*mutexes)}

	out := map[string]Outcome{}
	empty := map[string]Result{}
	var active []Config
	for _, c := range cfgs {
		if why := r.Available(c); why != "" {
			out[c.Key] = Outcome{Skip: why}
			fmt.Fprintf(os.Stderr, "%-9s not run: %s\n", c.Key, why)
			continue
		}
		if c.Kind != Direct {
			// What the tracer counts outside the workload's phase.
			res, err := r.Run(c, 0, []string{"0", args[1], args[2]})
			if err != nil {
				out[c.Key] = Outcome{Failed: err.Error()}
				fmt.Fprintf(os.Stderr, "%-9s failed: %v\n", c.Key, err)
				continue
			}
			empty[c.Key] = res
		}
		active = append(active, c)
	}
	if len(active) == 0 || active[0].Key != "untraced" {
		b.Fatalf("the untraced workload cannot run: %s", out["untraced"].Skip+out["untraced"].Failed)
	}

	b.ResetTimer()
	for round := 1; round <= *rounds; round++ {
		// Rotate the starting configuration so none always runs first.
		for i := range active {
			c := active[(i+round)%len(active)]
			o := out[c.Key]
			if o.Failed != "" {
				continue
			}
			res, err := r.Run(c, round, args)
			if err != nil {
				o.Failed = err.Error()
				out[c.Key] = o
				fmt.Fprintf(os.Stderr, "round %d/%d  %-9s failed: %v\n", round, *rounds, c.Key, err)
				continue
			}
			o.Results = append(o.Results, res)
			check := ""
			if c.Kind != Direct {
				o.Checked++
				if m := Mismatch(res.Traced, empty[c.Key].Traced, res.Own, uint64(*threads)); m != "" {
					o.Mismatches = append(o.Mismatches, m)
					check = "  counts differ: " + m
				}
			}
			out[c.Key] = o
			// Progress goes to stderr as it happens; the table to stdout.
			fmt.Fprintf(os.Stderr, "round %d/%d  %-9s phase %8.3fs  lost %d%s\n",
				round, *rounds, c.Key, res.Phase.Seconds(), res.Lost, check)
		}
	}
	probes := probeTimes(r, active, out, args)
	b.StopTimer()

	s := Summarize(cfgs, out)
	host, _ := os.Hostname()
	fmt.Printf("\n%s\n", s.Markdown(fmt.Sprintf("%s, %s, %d cores (load average %s): %d threads × %d lock holds over %d mutexes, "+
		"each hold 3 malloc + 3 free of 16–271 B, a 256 KiB mapped block every 1024th; %d rounds.",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), loadavg(),
		*threads, *iters, *mutexes, *rounds)))
	if len(probes) > 0 {
		fmt.Printf("\n%s", probeTable(cfgs, probes))
		if a, f := probes["aggregate"].PerRun(), probes["floor"].PerRun(); a > 0 && f > 0 {
			b.ReportMetric(float64(a.Nanoseconds()), "aggregate-probe-ns")
			b.ReportMetric(float64(f.Nanoseconds()), "floor-probe-ns")
		}
	}
	for _, row := range s.Rows {
		if len(row.Outcome.Results) == 0 {
			continue
		}
		b.ReportMetric(row.Phase.Seconds(), row.Config.Key+"-s")
		if row.Config.Key != "untraced" {
			b.ReportMetric(row.VsUntraced.Median, row.Config.Key+"-x")
		}
	}
	for _, c := range cfgs {
		if f := out[c.Key].Failed; f != "" {
			b.Errorf("%s failed: %s", c.Key, f)
		}
	}
}

// loadavg is the 1-minute load average, to say how busy the machine was.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := string(b)
	for i, c := range f {
		if c == ' ' {
			return f[:i]
		}
	}
	return f
}

// probeTimes runs each eBPF configuration once more with the kernel's BPF
// statistics on and returns its entry probes' program time. Not in the
// rounds: counting adds two clock reads to every program run, which would
// move the ratios to the floor.
func probeTimes(r *Runner, active []Config, out map[string]Outcome, args []string) map[string]ProbeTime {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe program time not measured: %v\n", err)
		return nil
	}
	defer stats.Close()
	probes := map[string]ProbeTime{}
	for _, c := range active {
		if out[c.Key].Failed != "" || (c.Kind != Floor && (c.Kind != Hooktrace || c.Recorder != "ebpf")) {
			continue
		}
		res, err := r.Run(c, 0, args)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%-9s probe time not measured: %v\n", c.Key, err)
			continue
		}
		if res.Probe.Runs > 0 {
			probes[c.Key] = res.Probe
		}
	}
	return probes
}

// probeTable is the Markdown table of probeTimes' results: the program's
// own time a hit, steadier than the phase times, and its part over the
// floor's program.
func probeTable(cfgs []Config, probes map[string]ProbeTime) string {
	var sb strings.Builder
	sb.WriteString("| entry probes' BPF program (kernel.bpf_stats, one more run) | ns a hit | hits | ns over the floor's |\n|---|---:|---:|---:|\n")
	floor := probes["floor"].PerRun()
	for _, c := range cfgs {
		p, ok := probes[c.Key]
		if !ok {
			continue
		}
		over := "–"
		if c.Key != "floor" && floor > 0 {
			over = fmt.Sprint((p.PerRun() - floor).Nanoseconds())
		}
		fmt.Fprintf(&sb, "| %s | %d | %d | %s |\n", c.Name, p.PerRun().Nanoseconds(), p.Runs, over)
	}
	return sb.String()
}
