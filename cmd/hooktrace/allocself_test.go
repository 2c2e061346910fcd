package main

import (
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestAllocatorCallsCountedOnce: glibc's allocator entry points that call
// another one (reallocarray → realloc through libc's PLT, realloc(NULL, n)
// → malloc, realloc(p, 0) → free, memalign → malloc, posix_memalign →
// malloc) are one call each, counted once, under every recorder and mode,
// and no finding: the inner call is neither a second call nor a hook
// re-entering the allocator. glibc 2.36's aligned_alloc is memalign's
// code, which the eBPF recorder, probing it once, counts as aligned_alloc.
// A malloc libc's strdup makes is the program's, even where the stack
// still holds an earlier malloc call's return address.
func TestAllocatorCallsCountedOnce(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "allocself")
	for _, r := range traceRunsUnder(t, withAuto, nil, prog, "calls") {
		t.Run(r.String(), func(t *testing.T) {
			if len(r.fs) != 0 {
				t.Errorf("want no finding, got%s", verdicts(r.fs))
			}
			c := r.rep.Stats.Calls
			got := map[string]uint64{
				"realloc":                c["realloc"],
				"malloc":                 c["malloc"],
				"free":                   c["free"],
				"memalign+aligned_alloc": c["memalign"] + c["aligned_alloc"],
				"posix_memalign":         c["posix_memalign"],
			}
			want := map[string]uint64{"realloc": 300, "malloc": 200, "free": 501, "memalign+aligned_alloc": 200, "posix_memalign": 100}
			for name, n := range want {
				if got[name] != n {
					t.Errorf("calls.%s = %d, the program makes %d", name, got[name], n)
				}
			}
		})
	}
}

// TestHookInsideReallocarray: a hook that allocates, patched into libc's
// mremap, runs inside reallocarray (glibc's realloc of a mapped chunk
// calls mremap): an allocator-reentry error under every recorder, named
// as the one allocator call the program made, realloc, called by main.
func TestHookInsideReallocarray(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "allocself")
	for _, r := range traceRunsUnder(t, withAuto, nil, prog, "hook") {
		t.Run(r.String(), func(t *testing.T) {
			fs := ofKind(r.fs, "allocator-reentry", "error")
			if len(fs) != len(r.fs) {
				t.Errorf("want allocator-reentry errors only, got%s", verdicts(r.fs))
			}
			found := false
			for _, f := range fs {
				if !strings.Contains(f.Title, "malloc called by a hook") || !strings.HasSuffix(f.Title, "inside realloc") {
					continue
				}
				found = true
				if !f.edgeStackHas(0, "malloc", "mremap_hook", "realloc", "main") {
					t.Errorf("want the hook's malloc inside main's realloc:\n%v", f)
				}
			}
			if !found {
				t.Errorf("want malloc called by a hook inside realloc, got%s", verdicts(r.fs))
			}
			if c := r.rep.Stats.Calls; c["realloc"] != 1 || c["malloc"] != 2 {
				t.Errorf("calls: realloc %d, malloc %d; the program makes 1 and 2", c["realloc"], c["malloc"])
			}
		})
	}
}
