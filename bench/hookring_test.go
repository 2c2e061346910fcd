//go:build linux && amd64

package bench

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/source"
)

var (
	hookRounds = flag.Int("hook-rounds", envInt("HOOKTRACE_BENCH_HOOK_ROUNDS", 1000),
		"batches of frees per thread in the hook workload (env HOOKTRACE_BENCH_HOOK_ROUNDS)")
	hookThreads = flag.Int("hook-threads", envInt("HOOKTRACE_BENCH_HOOK_THREADS", 4),
		"threads of the hook workload (env HOOKTRACE_BENCH_HOOK_THREADS)")
)

// BenchmarkHookRing measures the ring buffer's bandwidth under a memory-hook
// workload (../testdata/hookstorm.c): threads whose frees trim the heap,
// so free calls madvise, patched with a hook that takes a lock, from
// inside the allocator. Every such lock used to carry a raw stack sample;
// at default settings the ring must keep up and lose nothing. It reports
// records/s and bytes/s through the ring, over the workload's wall time,
// and the records lost. Run with -benchtime 1x.
func BenchmarkHookRing(b *testing.B) {
	testenv.RequireBPF(b)
	prog := testenv.Program(b, "hookstorm")
	argv := []string{prog, strconv.Itoa(*hookRounds), strconv.Itoa(*hookThreads)}
	for _, mode := range []string{source.ModeAggregate, source.ModeFull} {
		r, err := RunRing(source.Options{Mode: mode, Warn: func(s string) { b.Log("warning:", s) }}, argv)
		if err != nil {
			b.Fatalf("%s: %v", mode, err)
		}
		secs := r.Wall.Seconds()
		fmt.Fprintf(os.Stderr, "hook workload, %-10s wall %.3fs  ring %d records (%.0f/s)  %.1f MB (%.1f MB/s)  lost %d\n",
			mode, secs, r.RingRecords, float64(r.RingRecords)/secs, float64(r.RingBytes)/1e6,
			float64(r.RingBytes)/1e6/secs, r.Lost)
		b.ReportMetric(float64(r.RingRecords)/secs, mode+"-ring-records/s")
		b.ReportMetric(float64(r.RingBytes)/secs, mode+"-ring-bytes/s")
		b.ReportMetric(float64(r.Lost), mode+"-lost")
	}
}
