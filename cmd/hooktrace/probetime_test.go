//go:build linux && amd64

package main

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestProbeTime: while the kernel counts BPF programs' time, the eBPF
// recorder's report gives its probe programs' runs and time: the entry
// probes ran at least once for each of the program's 10,000 malloc calls
// and the mutex calls around them. Without the counting it says nothing.
// (The program exits with 3 on purpose.)
func TestProbeTime(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	if b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err == nil && strings.TrimSpace(string(b)) == "0" {
		rep := traceProc(t, "ebpf", []string{"--ignore-target-status"}, prog).rep
		if len(rep.Stats.Traces) != 1 || rep.Stats.Traces[0].ProbeTime != nil {
			t.Errorf("without the kernel's counting: traces %+v, want one without probe_time", rep.Stats.Traces)
		}
	}
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		t.Fatalf("enabling the kernel's BPF statistics: %v", err)
	}
	defer stats.Close()
	rep := traceProc(t, "ebpf", []string{"--ignore-target-status"}, prog).rep
	if len(rep.Stats.Traces) != 1 {
		t.Fatalf("%d traces, want 1", len(rep.Stats.Traces))
	}
	c := rep.Stats.Calls
	hook := rep.Stats.Traces[0].ProbeTime["uprobe_hook"]
	if c["malloc"] < 10000 || hook.Runs < c["malloc"]+c["pthread_mutex_lock"]+c["pthread_mutex_unlock"] || hook.NS == 0 {
		t.Errorf("uprobe_hook %+v for calls %v: want a run for every malloc and mutex call, and their time", hook, c)
	}
}
