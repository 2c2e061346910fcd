//go:build linux && amd64

package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestAllocatorsOwnLocks: an allocator library that takes its own mutex
// inside malloc, as jemalloc and tcmalloc do (testdata/libpoolalloc.c).
// Those lock calls are the allocator at work, not a memory hook: a thread
// that holds the allocator's lock around a re-entrant malloc (jemalloc's
// arena creation running a hook, as jemalloc's own thread_arena test
// does) cannot deadlock with them. Both recorders once reported that as a
// self-deadlock ERROR. A hook the program sets in the allocator, which
// takes the program's lock inside malloc, is still one: with the
// allocator's lock taken in the opposite order by a thread holding the
// program's lock, it is a real lock-order cycle and a self-deadlock
// hazard. Every recorder and mode gives the same findings and counts.
func TestAllocatorsOwnLocks(t *testing.T) {
	dir := t.TempDir()
	lib := testenv.C{Source: filepath.Join(testenv.RepoRoot(t), "testdata", "libpoolalloc.c"), Name: "libpoolalloc.so",
		Flags: append(slices.Clone(testenv.CFlags), "-fPIC", "-shared")}.Build(t)
	copyFile(t, lib, filepath.Join(dir, "libpoolalloc.so"), 0o755)
	prog := testenv.Program(t, "poolown", "-Wl,--no-as-needed", "-L"+dir, "-lpoolalloc", "-Wl,-rpath,"+dir)
	type finding struct {
		ID    string   `json:"id"`
		Kind  string   `json:"kind"`
		Locks []string `json:"locks"`
	}
	for _, c := range []struct {
		name    string
		args    []string
		mallocs uint64
		want    []string // kind: locks, sorted
	}{
		{"own locks", []string{"200"}, 401, nil},
		{"hook", []string{"200", "hook"}, 601, []string{
			"lock-order-cycle: pool_lock (libpoolalloc.so), prog_lock (poolown)",
			"self-deadlock: prog_lock (poolown)",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids := map[string]string{}
			for _, recorder := range []string{"preload", "ebpf"} {
				for _, mode := range []string{"full", "aggregate"} {
					run := recorder + " " + mode
					if recorder == "ebpf" {
						testenv.RequireBPF(t)
					}
					out, _, stderr, code := runJSON(t, append([]string{"--recorder", recorder, "--mode", mode,
						"--fail-on", "none", "--"}, append([]string{prog}, c.args...)...)...)
					if code != 0 {
						t.Fatalf("%s: exit %d\n%s", run, code, stderr)
					}
					rep := parseReport(t, out)
					if got := rep.Stats.Calls["malloc"]; got != c.mallocs {
						t.Errorf("%s: %d malloc calls, want %d", run, got, c.mallocs)
					}
					if a := rep.Stats.Traces[0].Allocator; a != "libpoolalloc" {
						t.Errorf("%s: allocator %q, want libpoolalloc", run, a)
					}
					var got []string
					for _, raw := range rep.Findings {
						var f finding
						if err := json.Unmarshal(raw, &f); err != nil {
							t.Fatal(err)
						}
						locks := slices.Clone(f.Locks)
						slices.Sort(locks)
						got = append(got, f.Kind+": "+strings.Join(locks, ", "))
						if id, ok := ids[f.Kind]; ok && id != f.ID {
							t.Errorf("%s: %s finding %s, another run's is %s", run, f.Kind, f.ID, id)
						}
						ids[f.Kind] = f.ID
					}
					slices.Sort(got)
					if !slices.Equal(got, c.want) {
						t.Errorf("%s: findings\n  %s\nwant\n  %s\n%s", run, strings.Join(got, "\n  "), strings.Join(c.want, "\n  "), stderr)
					}
				}
			}
		})
	}
}
