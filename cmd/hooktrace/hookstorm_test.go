package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"strings"
	"testing"
)

// TestHookStormLosesNothing: four threads free memory so that glibc's
// free calls madvise, patched with a hook that takes a lock, from inside
// the allocator, about 50,000 times. Every such lock used to carry an
// 8 KiB raw stack sample and the default 16 MiB ring overflowed (a false
// self-deadlock from the lost unlocks came with it). At default settings
// (the aggregate mode), under both recorders, nothing is lost now, every
// hook lock is counted, and the findings are what a lossless run gives:
// one arena-lock cycle, error, whose hook edge is unwound through glibc
// (shrink_heap: the arena lock is held), and nothing else but its
// one-thread hazard.
func TestHookStormLosesNothing(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "hookstorm")
	for _, r := range traceRuns(t, []string{"--mode", "aggregate"}, prog, "400", "4") {
		t.Run(r.recorder, func(t *testing.T) {
			if r.rep.Stats.LostEvents != 0 || !r.rep.Stats.Complete {
				t.Fatalf("lost %d events, complete=%v", r.rep.Stats.LostEvents, r.rep.Stats.Complete)
			}
			// One lock per hook run, plus register_block's. Only the
			// kernel sees glibc's own madvise (see sameFindings).
			madvise, locks := r.rep.Stats.Calls["madvise"], r.rep.Stats.Calls["pthread_mutex_lock"]
			if locks < 10000 || (r.recorder == "ebpf" && locks < madvise) {
				t.Errorf("calls: %d madvise, %d locks: want every hook's lock counted", madvise, locks)
			}
			// Besides the cycle, the hazard of the same story on one
			// thread (malloc under hook_lock can run the hook); a
			// self-deadlock from lost unlocks, or anything else, is wrong.
			var fs []finding
			for _, f := range r.fs {
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
		})
	}
}
