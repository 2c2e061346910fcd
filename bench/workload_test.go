//go:build linux && amd64

package bench

import (
	"path/filepath"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The workload counts what it was asked to do, whatever runs it.
func TestWorkloadCounts(t *testing.T) {
	r := &Runner{Plain: testenv.C{Source: filepath.Join("testdata", "workload.c")}.Build(t), Dir: t.TempDir()}
	cfgs, err := Select("")
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(cfgs[0], 1, []string{"3000", "3", "2"})
	if err != nil {
		t.Fatal(err)
	}
	// 3 threads × 3000 holds, 3 small blocks each, a big one every
	// 1024th hold (2 a thread).
	want := Counts{"pthread_mutex_lock": 9000, "pthread_mutex_unlock": 9000, "malloc": 27006, "free": 27006, "mmap": 6, "munmap": 6}
	for k, n := range want {
		if res.Own[k] != n {
			t.Errorf("%s: the workload counted %d, want %d", k, res.Own[k], n)
		}
	}
	if res.Phase <= 0 || res.CPU <= 0 {
		t.Errorf("phase %v, CPU %v", res.Phase, res.CPU)
	}
}

// The floor's probes, at hooktrace's sites, see exactly the workload's
// lock, unlock, malloc and free calls beyond an empty run's.
func TestFloorCounts(t *testing.T) {
	testenv.RequireBPF(t)
	r := &Runner{Plain: testenv.C{Source: filepath.Join("testdata", "workload.c")}.Build(t), Dir: t.TempDir(),
		Warn: func(s string) { t.Log("warning:", s) }}
	floor := Config{Key: "floor", Kind: Floor}
	empty, err := r.Run(floor, 0, []string{"0", "2", "4"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(floor, 1, []string{"2000", "2", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Own["malloc"] != 12002 {
		t.Errorf("the workload counted %d mallocs, want 12002", res.Own["malloc"])
	}
	if m := Mismatch(res.Traced, empty.Traced, res.Own, 2); m != "" {
		t.Errorf("floor counts differ from the workload's: %s", m)
	}
}
