package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"path/filepath"
	"strings"
	"testing"
)

// TestHookStormLosesNothing: four threads free memory so that glibc's
// free calls madvise, patched with a hook that takes a lock, from inside
// the allocator, about 50,000 times. Every such lock used to carry an
// 8 KiB raw stack sample and the default 16 MiB ring overflowed (a false
// self-deadlock from the lost unlocks came with it). At default settings
// nothing is lost now, every hook lock is counted, and the findings are
// what a lossless run gives: one arena-lock cycle, error, whose hook edge
// is unwound through glibc (shrink_heap: the arena lock is held), and
// nothing else but its one-thread hazard.
func TestHookStormLosesNothing(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "hookstorm")
	trace := filepath.Join(t.TempDir(), "h.htr")
	stdout, _, stderr, code := runJSON(t, "--recorder", "ebpf", "--fail-on", "none", "-o", trace, "--", prog, "400", "4")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	rep := parseReport(t, stdout)
	if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
		t.Fatalf("lost %d events, complete=%v", rep.Stats.LostEvents, rep.Stats.Complete)
	}
	// One lock per hook run, plus register_block's.
	madvise, locks := rep.Stats.Calls["madvise"], rep.Stats.Calls["pthread_mutex_lock"]
	if madvise < 10000 || locks < madvise {
		t.Errorf("calls: %d madvise, %d locks: want every hook's lock counted", madvise, locks)
	}
	// Besides the cycle, the hazard of the same story on one thread
	// (malloc under hook_lock can run the hook); a self-deadlock from lost
	// unlocks, or anything else, is wrong.
	var fs []finding
	for _, f := range findings(t, stdout) {
		if f.Kind == "self-deadlock" && strings.HasPrefix(f.Title, "self-deadlock hazard") &&
			sameSet(f.Locks, []string{"hook_lock (hookstorm)"}) {
			continue
		}
		fs = append(fs, f)
	}
	if len(fs) != 1 {
		t.Fatalf("want exactly the arena-lock cycle, got %v", fs)
	}
	f := fs[0]
	if f.Kind != "lock-order-cycle" || f.Severity != "error" || !sameSet(f.Locks, []string{"hook_lock (hookstorm)", "glibc malloc arena"}) {
		t.Fatalf("want an error cycle of hook_lock and the glibc arena, got %v", f)
	}
	var under, hook bool
	for i := range f.Edges {
		under = under || f.edgeStackHas(i, "malloc", "register_block")
		hook = hook || f.edgeStackHas(i, "pthread_mutex_lock", "storm_hook", "shrink_heap", "heap_trim", "_int_free", "free", "release_batch")
	}
	if !under || !hook {
		t.Errorf("want register_block → malloc and release_batch → free → … → shrink_heap → storm_hook → pthread_mutex_lock:\n%v", f)
	}
}
