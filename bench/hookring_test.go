package bench

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var hookRounds = flag.Int("hook-rounds", envInt("HOOKTRACE_BENCH_HOOK_ROUNDS", 1000),
	"batches of frees per thread in the hook workload (env HOOKTRACE_BENCH_HOOK_ROUNDS)")

// BenchmarkHookRing measures the ring buffer's bandwidth under a memory-hook
// workload (../testdata/hookstorm.c): threads whose frees trim the heap,
// so free calls madvise, patched with a hook that takes a lock, from
// inside the allocator. Every such lock used to carry a raw stack sample;
// at default settings the ring must keep up and lose nothing. It reports
// records/s and bytes/s through the ring, over the workload's wall time,
// and the records lost. Run with -benchtime 1x.
func BenchmarkHookRing(b *testing.B) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			b.Fatal("eBPF unavailable under CI: not root")
		}
		b.Skip("eBPF unavailable: not root")
	}
	prog, err := Build(filepath.Join("..", "testdata", "hookstorm.c"), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	argv := []string{prog, strconv.Itoa(*hookRounds), strconv.Itoa(*threads)}
	for _, cfg := range Configs() {
		if cfg.Key != "aggregate" && cfg.Key != "full" {
			continue
		}
		r, err := Run(cfg, argv, func(s string) { b.Log("warning:", s) })
		if err != nil {
			b.Fatalf("%s: %v", cfg.Name, err)
		}
		secs := r.Wall.Seconds()
		fmt.Fprintf(os.Stderr, "hook workload, %-30s wall %.3fs  ring %d records (%.0f/s)  %.1f MB (%.1f MB/s)  lost %d  hits %d\n",
			cfg.Name, secs, r.RingRecords, float64(r.RingRecords)/secs, float64(r.RingBytes)/1e6,
			float64(r.RingBytes)/1e6/secs, r.Lost, r.Hits)
		b.ReportMetric(float64(r.RingRecords)/secs, cfg.Key+"-ring-records/s")
		b.ReportMetric(float64(r.RingBytes)/secs, cfg.Key+"-ring-bytes/s")
		b.ReportMetric(float64(r.Lost), cfg.Key+"-lost")
	}
}
