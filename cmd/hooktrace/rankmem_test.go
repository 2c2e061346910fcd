package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestMergeRanksMemory: merging the traces of many ranks of one program
// holds what the program's locks, dependencies and stacks need, not a copy
// per rank. Two runs ("ranks") of testdata/manylocks.c (a table lock, 256
// objects' mutexes of one class, a memory hook that takes the table lock
// inside free) are recorded by the preloaded library, then merged as 16
// and as 128 copies, as `analyze trace-*.htr` does. The live heap at its
// highest (after each trace, and with the result built) for 128 must stay
// within twice that for 16, and the merged result must count every rank:
// the same findings, each seen 8 times as often, 8 times the locks and
// dependencies.
func TestMergeRanksMemory(t *testing.T) {
	prog := testenv.Program(t, "manylocks")
	dir := t.TempDir()
	var ranks []string
	for r := range 2 {
		trace := filepath.Join(dir, fmt.Sprintf("rank-%d.htr", r))
		_, _, stderr, code := runJSON(t, "--recorder", "preload", "--fail-on", "none", "-o", trace, "--", prog)
		if code != 0 {
			t.Fatalf("rank %d: exit %d\n%s", r, code, stderr)
		}
		ranks = append(ranks, trace)
	}
	merge := func(n int) (peak uint64, res *analyzer.Result) {
		copies := filepath.Join(dir, fmt.Sprint(n))
		if err := os.Mkdir(copies, 0o755); err != nil {
			t.Fatal(err)
		}
		var paths []string
		for i := range n {
			data, err := os.ReadFile(ranks[i%2])
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(copies, fmt.Sprintf("trace-%d.htr", i))
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		base := liveHeap()
		a := analyzer.New(analyzer.Options{})
		for _, p := range paths {
			if err := analyzeFile(a, p); err != nil {
				t.Fatal(err)
			}
			peak = max(peak, liveHeap())
		}
		res = a.Result()
		peak = max(peak, liveHeap())
		runtime.KeepAlive(a)
		return peak - min(base, peak), res
	}
	peak16, res16 := merge(16)
	peak128, res128 := merge(128)
	t.Logf("live heap at its highest: 16 ranks %.1f MB, 128 ranks %.1f MB (%.2fx); %d events a rank",
		float64(peak16)/(1<<20), float64(peak128)/(1<<20), float64(peak128)/float64(peak16), res16.Stats.Events/16)
	if peak128 > 2*peak16 {
		t.Errorf("merging 128 ranks took %.2fx the memory of 16 (want at most 2x)", float64(peak128)/float64(peak16))
	}

	if len(res16.Findings) == 0 {
		t.Fatal("the legacy cache's ranks gave no finding")
	}
	ids := func(res *analyzer.Result) []string {
		var out []string
		for _, f := range res.Findings {
			out = append(out, f.ID)
		}
		slices.Sort(out)
		return out
	}
	if a, b := ids(res16), ids(res128); !slices.Equal(a, b) {
		t.Fatalf("16 ranks found %v, 128 found %v", a, b)
	}
	for i, f := range res16.Findings {
		g := res128.Findings[i]
		if g.ID != f.ID || g.Occurrences != 8*f.Occurrences {
			t.Errorf("%s %s: seen %d times in 16 ranks, %d in 128 (want 8 times as often)", f.Kind, f.Title, f.Occurrences, g.Occurrences)
		}
	}
	s16, s128 := res16.Stats, res128.Stats
	if s128.Locks != 8*s16.Locks || s128.Dependencies != 8*s16.Dependencies || s128.Events != 8*s16.Events ||
		len(s128.Traces) != 128 || s128.LockClasses != s16.LockClasses {
		t.Errorf("16 ranks: %d locks (%d classes), %d dependencies, %d events; 128: %d locks (%d classes), %d dependencies, %d events, %d traces",
			s16.Locks, s16.LockClasses, s16.Dependencies, s16.Events, s128.Locks, s128.LockClasses, s128.Dependencies, s128.Events, len(s128.Traces))
	}
}

// liveHeap is the heap in use once garbage is collected.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
