//go:build linux && amd64

package bench

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/launch"
)

func init() {
	// This test binary is also the gate for the workloads it starts.
	if len(os.Args) > 1 && os.Args[1] == launch.GateArg {
		runtime.LockOSThread()
		launch.RunGate(os.Args[2:])
	}
}

// Flags, each also read from an environment variable (`make bench` sets
// them from its BENCH_* variables).
var (
	rounds  = flag.Int("rounds", envInt("HOOKTRACE_BENCH_ROUNDS", 3), "rounds; each runs every configuration once (env HOOKTRACE_BENCH_ROUNDS)")
	iters   = flag.Int("iters", envInt("HOOKTRACE_BENCH_ITERS", 100000), "lock+malloc+unlock+free rounds per thread (env HOOKTRACE_BENCH_ITERS)")
	threads = flag.Int("threads", envInt("HOOKTRACE_BENCH_THREADS", 4), "workload threads (env HOOKTRACE_BENCH_THREADS)")
	size    = flag.Int("size", envInt("HOOKTRACE_BENCH_SIZE", 64), "malloc size in bytes (env HOOKTRACE_BENCH_SIZE)")
	only    = flag.String("configs", os.Getenv("HOOKTRACE_BENCH_CONFIGS"), "comma-separated configurations to run (untraced always runs); empty: all (env HOOKTRACE_BENCH_CONFIGS)")
	work    = flag.String("workload", os.Getenv("HOOKTRACE_BENCH_WORKLOAD"), "workload: empty for one lock and one malloc per hold, locks for 4 locks and 3 malloc + 3 free per hold with a 256 KiB block every 1024 (env HOOKTRACE_BENCH_WORKLOAD)")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var benchOnce sync.Once

// BenchmarkOverhead runs the workload under every configuration,
// round-robin, and reports the medians. It runs the rounds once whatever
// b.N is: -benchtime 1x.
func BenchmarkOverhead(b *testing.B) {
	testenv.RequireBPF(b)
	ran := false
	benchOnce.Do(func() { ran = true })
	if !ran {
		b.Skip("the rounds already ran")
	}
	cfgs := selected(b)
	tsan := false
	for _, c := range cfgs {
		tsan = tsan || c.TSan
	}
	src, desc := "workload.c", fmt.Sprintf("%d threads × %d × (lock; malloc(%d); unlock; free)", *threads, *iters, *size)
	if *work == "locks" {
		src, desc = "workload_locks.c", fmt.Sprintf("%d threads × %d × (lock one of 4; 3 malloc + 3 free of 16–271 B; unlock), a 256 KiB block every 1024", *threads, *iters)
	} else if *work != "" {
		b.Fatalf("unknown workload %q (empty or locks)", *work)
	}
	prog, err := Build(filepath.Join("testdata", src), b.TempDir(), tsan)
	if err != nil {
		b.Fatal(err)
	}
	argv := []string{prog, strconv.Itoa(*iters), strconv.Itoa(*threads), strconv.Itoa(*size)}
	warned := map[string]bool{}
	warn := func(s string) {
		if !warned[s] {
			warned[s] = true
			b.Log("warning:", s)
		}
	}
	results := map[string][]Result{}
	b.ResetTimer()
	for round := 0; round < *rounds; round++ {
		// Rotate the starting configuration so none always runs first.
		for i := range cfgs {
			c := cfgs[(i+round)%len(cfgs)]
			r, err := Run(c, argv, warn)
			if err != nil {
				b.Fatalf("%s: %v", c.Name, err)
			}
			// Progress goes to stderr as it happens; the table to stdout.
			fmt.Fprintf(os.Stderr, "round %d/%d  %-32s wall %.3fs  cpu %.3fs  tracer cpu %.3fs  hits %d  records %d  lost %d\n",
				round+1, *rounds, c.Name, r.Wall.Seconds(), r.CPU.Seconds(), r.ReaderCPU.Seconds(), r.Hits, r.Records, r.Lost)
			results[c.Key] = append(results[c.Key], r)
		}
	}
	b.StopTimer()
	s := Summarize(cfgs, results)
	fmt.Printf("\n%s\n", s.Markdown(fmt.Sprintf("Workload: %s, %d cores, median of %d rounds.", desc, runtime.NumCPU(), *rounds)))
	for _, r := range s.Rows {
		b.ReportMetric(r.Wall.Seconds(), r.Config.Key+"-s")
		if r.Config.Traced {
			b.ReportMetric(s.Slowdown(r.Config.Key), r.Config.Key+"-x")
			w, _ := s.NsPerHit(r.Config.Key)
			b.ReportMetric(w, r.Config.Key+"-ns/hit")
		}
	}
	t := s.Targets()
	if _, ok := s.Row("floor"); ok {
		b.ReportMetric(t.VsFloor, "aggregate/floor")
	}
	if _, ok := s.Row("entry"); ok {
		b.ReportMetric(t.EntryVs, "entry/aggregate")
	}
	if _, ok := s.Row("aggregate"); ok {
		b.ReportMetric(float64(t.LostDefault), "lost-aggregate")
	}
}

func selected(b *testing.B) []Config {
	all := Configs()
	if *only == "" {
		return all
	}
	want := map[string]bool{"untraced": true}
	for _, k := range strings.FieldsFunc(*only, func(r rune) bool { return r == ',' || r == ' ' }) {
		want[k] = true
	}
	var out []Config
	for _, c := range all {
		if want[c.Key] {
			out = append(out, c)
			delete(want, c.Key)
		}
	}
	for k := range want {
		b.Fatalf("unknown configuration %q (untraced, floor, entry, aggregate, full, preload, preload-full, tsan)", k)
	}
	return out
}
