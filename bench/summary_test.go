//go:build linux && amd64

package bench

import (
	"strings"
	"testing"
	"time"
)

func TestSelect(t *testing.T) {
	keys := func(cs []Config) string {
		var k []string
		for _, c := range cs {
			k = append(k, c.Key)
		}
		return strings.Join(k, ",")
	}
	all, err := Select("")
	if err != nil || keys(all) != "untraced,aggregate,full,preload,attach-preload,attach-ebpf,floor,tsan,helgrind" {
		t.Errorf("defaults %q, %v", keys(all), err)
	}
	some, err := Select("entry, aggregate")
	if err != nil || keys(some) != "untraced,aggregate,entry" {
		t.Errorf("entry,aggregate gave %q, %v", keys(some), err)
	}
	if _, err := Select("aggregate,bogus"); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("bogus: %v", err)
	}
}

func TestParseOwn(t *testing.T) {
	own, err := ParseOwn("phase_ns=31798237 cpu_ns=9251000 pthread_mutex_lock=200000 pthread_mutex_unlock=200000 malloc=600194 free=600194 big=194")
	if err != nil {
		t.Fatal(err)
	}
	if own.Phase != 31798237 || own.CPU != 9251000 || own.Calls["malloc"] != 600194 || own.Calls["mmap"] != 194 || own.Calls["munmap"] != 194 {
		t.Errorf("%+v", own)
	}
	for _, bad := range []string{"", "phase_ns=1 malloc=2", "phase_ns=1 pthread_mutex_lock=1 pthread_mutex_unlock=1 malloc=1 free=1 big=1", "phase_ns=x", "phase_ns"} {
		if _, err := ParseOwn(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestMismatch(t *testing.T) {
	own := Counts{"pthread_mutex_lock": 10, "pthread_mutex_unlock": 10, "malloc": 30, "free": 30, "mmap": 1, "munmap": 1}
	empty := Counts{"pthread_mutex_lock": 3, "pthread_mutex_unlock": 3, "malloc": 4, "free": 4, "mmap": 12, "munmap": 4}
	traced := Counts{"pthread_mutex_lock": 13, "pthread_mutex_unlock": 13, "malloc": 34, "free": 34, "mmap": 13, "munmap": 5, "brk": 3}
	if m := Mismatch(traced, empty, own, 2); m != "" {
		t.Errorf("equal counts: %s", m)
	}
	// An arena mapped with one munmap fewer than in the empty run.
	traced["munmap"] = 3
	if m := Mismatch(traced, empty, own, 2); m != "" {
		t.Errorf("arena slack: %s", m)
	}
	traced["munmap"] = 2
	traced["free"] = 134
	if m := Mismatch(traced, empty, own, 2); m != "free 130, want 30, munmap -2, want 1±2" {
		t.Errorf("extra frees, missing munmaps: %q", m)
	}
	if m := Mismatch(Counts{"hits": 90}, Counts{"hits": 10}, own, 2); m != "" {
		t.Errorf("floor: %s", m)
	}
	if m := Mismatch(Counts{"hits": 91}, Counts{"hits": 10}, own, 2); m != "hits 81, want 80" {
		t.Errorf("floor off by one: %q", m)
	}
}

func TestSummary(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	own := Counts{"pthread_mutex_lock": 1000, "pthread_mutex_unlock": 1000, "malloc": 3000, "free": 3000, "mmap": 1, "munmap": 1}
	run := func(round, phase int, lost uint64) Result {
		// CPU is half the wall time.
		return Result{Round: round, Phase: ms(phase), CPU: ms(phase) / 2, Own: own, Lost: lost, Complete: lost == 0}
	}
	cfgs, err := Select("")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Outcome{
		// Round 2 ran on a busier machine: per-round ratios cancel it.
		"untraced":  {Results: []Result{run(1, 10, 0), run(2, 20, 0), run(3, 10, 0)}},
		"aggregate": {Results: []Result{run(1, 1200, 0), run(2, 2400, 5), run(3, 1300, 0)}, Checked: 3},
		"floor":     {Results: []Result{run(1, 1000, 0), run(2, 2000, 0), run(3, 1000, 0)}, Checked: 3, Mismatches: []string{"hits 1, want 2"}},
		"tsan":      {Results: []Result{run(1, 180, 0), run(2, 360, 0), run(3, 200, 0)}},
		"full":      {Failed: "hooktrace run: exit status 4\nmore"},
		"preload":   {Skip: "this hooktrace has no --recorder flag, so no preload recorder"},
		"helgrind":  {Skip: "valgrind is not installed"},
	}
	s := Summarize(cfgs, out)
	agg, _ := s.Row("aggregate")
	if agg.Phase != ms(1300) || agg.Min != ms(1200) || agg.Max != ms(2400) {
		t.Errorf("aggregate phase %v (%v–%v), want 1.3s (1.2–2.4s)", agg.Phase, agg.Min, agg.Max)
	}
	if v := agg.VsUntraced; v.Median != 120 || v.Min != 120 || v.Max != 130 || v.N != 3 {
		t.Errorf("aggregate/untraced %+v, want 120 (120–130)", v)
	}
	if v := agg.VsFloor; v.Median != 1.2 || v.Max != 1.3 {
		t.Errorf("aggregate/floor %+v, want 1.2 (1.2–1.3)", v)
	}
	// (1300 - 10) ms over 8000 calls.
	if agg.NsPerCall != 161250 || agg.Lost != 5 || agg.Incomplete != 1 {
		t.Errorf("aggregate ns/call %v lost %d incomplete %d", agg.NsPerCall, agg.Lost, agg.Incomplete)
	}
	if _, ok := s.Row("full"); ok {
		t.Error("full has a row with results")
	}
	md := s.Markdown("w")
	for _, want := range []string{
		"| untraced | 10.0 ms (10.0 ms–20.0 ms) | 1 | – | – | 5.0 ms | 1 | – | – | – | – |",
		"| hooktrace eBPF, aggregate (default mode) | 1.30 s (1.20 s–2.40 s) | 120x (120x–130x) | 1 | 1.20x (1.20x–1.30x) | 650.0 ms | 120x (120x–130x) | 1.20x (1.20x–1.30x) | 161250 | 5 (1 INCOMPLETE) | yes (3/3) |",
		"| hooktrace eBPF, full | failed: hooktrace run: exit status 4 |",
		"| hooktrace preload recorder, aggregate | not run: this hooktrace has no --recorder flag, so no preload recorder |",
		"| floor: counting uprobes at hooktrace's sites | 1.00 s (1.00 s–2.00 s) | 100x (100x–100x) | 0.83x (0.77x–0.83x) | 1 | 500.0 ms | 100x (100x–100x) | 1 | 123750 | – | **no** (2/3): hits 1, want 2 |",
		"| TSan (-fsanitize=thread build) | 200.0 ms (180.0 ms–360.0 ms) | 18.0x (18.0x–20.0x) |",
		"| Helgrind (valgrind --tool=helgrind) | not run: valgrind is not installed |",
		"| eBPF aggregate ≤ 1.2x its floor | 1.20x (1.20x–1.30x) wall, 1.20x (1.20x–1.30x) CPU | yes |",
		"| hooktrace eBPF, aggregate (default mode): 0 lost events | 5 (worst round) | **no** |",
		"| hooktrace eBPF, aggregate (default mode): counts equal the workload's | 3 of 3 rounds | yes |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "preload ≤ 3x") {
		t.Errorf("a target for a recorder that did not run:\n%s", md)
	}
}
