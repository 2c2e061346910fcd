package main

import (
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

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
