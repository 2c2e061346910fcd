//go:build linux && amd64

package bench

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

var lifeIters = flag.Int("life-iters", envInt("HOOKTRACE_BENCH_LIFE_ITERS", 2000),
	"BenchmarkLifetimes: iterations a thread, 20 lock calls each (env HOOKTRACE_BENCH_LIFE_ITERS)")

// lifeWorkloads are testdata/lifetimes.c's modes: mutex holds first, the
// baseline the lifetime workloads, with as many calls, are compared with.
var lifeWorkloads = []string{"mutex", "mutex-life", "rwlock-life", "spin-life"}

// lifeConfigs are the configurations BenchmarkLifetimes runs each
// workload in.
var lifeConfigs = []string{"untraced", "aggregate", "floor", "preload"}

// lifeLimit is what a lifetime workload may cost a recorder, against the
// mutex holds with as many calls.
const lifeLimit = 2.0

// BenchmarkLifetimes runs testdata/lifetimes.c (4 threads; locks made and
// destroyed in a loop, TSan's deadlock stress Test14, against mutex holds
// with the same number of calls) untraced, under the eBPF recorder in
// aggregate mode, at its floor and under the preload recorder, round-robin,
// and prints each workload's phase and its ratio to the mutex holds under
// the same configuration (per round, median and range). Counts are
// checked: the lock calls exactly, and each init and destroy.
func BenchmarkLifetimes(b *testing.B) {
	testenv.RequireBPF(b)
	var cfgs []Config
	for _, c := range Configs() {
		for _, k := range lifeConfigs {
			if c.Key == k {
				cfgs = append(cfgs, c)
			}
		}
	}
	dir := b.TempDir()
	r := &Runner{Plain: testenv.C{Source: filepath.Join("testdata", "lifetimes.c")}.Build(b), Dir: dir,
		Warn: func(s string) { fmt.Fprintln(os.Stderr, "warning:", s) }}
	if r.Hooktrace = *binary; r.Hooktrace == "" {
		r.Hooktrace = filepath.Join(dir, "hooktrace")
		if msg, err := exec.Command("go", "build", "-o", r.Hooktrace, "../cmd/hooktrace").CombinedOutput(); err != nil {
			b.Fatalf("building hooktrace: %v\n%s", err, msg)
		}
	}
	const threads = "4"
	iters := strconv.Itoa(*lifeIters)
	// phase[config][workload][round], and the workload's CPU time in it
	phase, cpu := map[string]map[string]map[int]time.Duration{}, map[string]map[string]map[int]time.Duration{}
	empty := map[string]map[string]Counts{}
	var failed []string
	for _, c := range cfgs {
		if why := r.Available(c); why != "" {
			fmt.Fprintf(os.Stderr, "%-9s not run: %s\n", c.Key, why)
			continue
		}
		phase[c.Key], cpu[c.Key], empty[c.Key] = map[string]map[int]time.Duration{}, map[string]map[int]time.Duration{}, map[string]Counts{}
		for _, w := range lifeWorkloads {
			phase[c.Key][w], cpu[c.Key][w] = map[int]time.Duration{}, map[int]time.Duration{}
			if c.Kind != Direct {
				res, err := r.Run(c, 0, []string{w, "0", threads})
				if err != nil {
					b.Fatalf("%s %s, no iterations: %v", c.Key, w, err)
				}
				empty[c.Key][w] = res.Traced
			}
		}
	}
	b.ResetTimer()
	for round := 1; round <= *rounds; round++ {
		for i, w := range lifeWorkloads {
			for j := range cfgs {
				c := cfgs[(i+j+round)%len(cfgs)]
				if phase[c.Key] == nil {
					continue
				}
				res, err := r.Run(c, round, []string{w, iters, threads})
				if err != nil {
					b.Fatalf("%s %s: %v", c.Key, w, err)
				}
				phase[c.Key][w][round], cpu[c.Key][w][round] = res.Phase, res.CPU
				check := ""
				if c.Kind != Direct {
					if m := lifeMismatch(res.Traced, empty[c.Key][w], res.Own); m != "" {
						failed = append(failed, fmt.Sprintf("round %d %s %s: %s", round, c.Key, w, m))
						check = "  counts differ: " + m
					}
				}
				fmt.Fprintf(os.Stderr, "round %d/%d  %-11s %-9s phase %8.3fs  lost %d%s\n",
					round, *rounds, w, c.Key, res.Phase.Seconds(), res.Lost, check)
			}
		}
	}
	b.StopTimer()

	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%s: 4 threads × %d iterations × 20 calls on 10 stack locks (lock + unlock each, or init + destroy each); %d rounds. "+
		"Phase median (range), and × the mutex holds under the same configuration, in wall time and in the workload's CPU time "+
		"(steadier on a shared machine; it includes the kernel's probe handling).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), *lifeIters, *rounds)
	sb.WriteString("| workload |")
	for _, c := range cfgs {
		if phase[c.Key] != nil {
			fmt.Fprintf(&sb, " %s | × mutex holds | CPU × mutex holds |", c.Name)
		}
	}
	sb.WriteString("\n|---|")
	for _, c := range cfgs {
		if phase[c.Key] != nil {
			sb.WriteString("---:|---:|---:|")
		}
	}
	sb.WriteString("\n")
	for _, w := range lifeWorkloads {
		fmt.Fprintf(&sb, "| %s |", w)
		for _, c := range cfgs {
			p := phase[c.Key]
			if p == nil {
				continue
			}
			pc := cpu[c.Key]
			fmt.Fprintf(&sb, " %s | %s | %s |", fmtPhases(p[w]), ratio(p[w], p["mutex"]), ratio(pc[w], pc["mutex"]))
			if c.Key != "untraced" && w != "mutex" {
				x, xc := ratio(p[w], p["mutex"]).Median, ratio(pc[w], pc["mutex"]).Median
				b.ReportMetric(x, c.Key+"-"+w+"-x")
				b.ReportMetric(xc, c.Key+"-"+w+"-cpu-x")
				if c.Key == "aggregate" || c.Key == "preload" {
					fmt.Fprintf(os.Stderr, "target: %s %s ≤ %.0fx the mutex holds: %s wall (%s), %s CPU (%s)\n",
						c.Key, w, lifeLimit, fmtX(x), yes(x <= lifeLimit), fmtX(xc), yes(xc <= lifeLimit))
				}
			}
		}
		sb.WriteString("\n")
	}
	fmt.Print(sb.String())
	for _, f := range failed {
		b.Error(f)
	}
}

// fmtPhases is the median and range of a workload's phases.
func fmtPhases(m map[int]time.Duration) string {
	var v []time.Duration
	for _, d := range m {
		v = append(v, d)
	}
	if len(v) == 0 {
		return "–"
	}
	slices.Sort(v)
	if len(v) == 1 {
		return fmtDur(v[0])
	}
	return fmt.Sprintf("%s (%s–%s)", fmtDur(medianOf(v)), fmtDur(v[0]), fmtDur(v[len(v)-1]))
}

// lifeMismatch compares a run's counts, less a run with no iterations,
// with the workload's own: the lock calls (Mismatch), and each init and
// destroy it made, exactly. The floor counts every hit as one.
func lifeMismatch(traced, empty, own Counts) string {
	if _, ok := traced["hits"]; ok {
		var want uint64
		for k, n := range own {
			if strings.HasPrefix(k, "pthread_") {
				want += n
			}
		}
		if got := traced["hits"] - empty["hits"]; got != want {
			return fmt.Sprintf("hits %d, want %d", got, want)
		}
		return ""
	}
	diffs := []string{}
	if m := Mismatch(traced, empty, own, 4); m != "" {
		diffs = append(diffs, m)
	}
	for k, n := range own {
		if strings.HasSuffix(k, "_init") || strings.HasSuffix(k, "_destroy") {
			if got := traced[k] - empty[k]; got != n {
				diffs = append(diffs, fmt.Sprintf("%s %d, want %d", k, got, n))
			}
		}
	}
	return strings.Join(diffs, ", ")
}
