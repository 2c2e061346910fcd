package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestAllocatorAsTheLoaderFindsIt: testdata/mallocs.c with jemalloc found
// the ways the loader finds a library: a RUNPATH relative to the working
// directory (not the executable's: the loader resolves it there), an
// $ORIGIN RUNPATH, a relative LD_LIBRARY_PATH and a relative LD_PRELOAD.
// jemalloc is a copy in the test's lib/ directory, so a run that took the
// system's would show it. Under both recorders (the relative RUNPATH in
// both modes): the trace names jemalloc the allocator, every malloc(777)
// the trace has starts in the copy (all 10,000 in full mode), the counts
// are the same in every run, and there is no finding.
func TestAllocatorAsTheLoaderFindsIt(t *testing.T) {
	testenv.RequireBPF(t)
	const je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	testenv.File(t, je, "apt-get install -y libjemalloc2")
	src := filepath.Join(testenv.RepoRoot(t), "testdata", "mallocs.c")
	// The program in its own directory, with jemalloc in lib/ there.
	install := func(t *testing.T, link ...string) string {
		flags := append(slices.Clone(testenv.CFlags), "-Wl,--no-as-needed")
		exe := testenv.C{Source: src, Flags: append(flags, link...)}.Build(t)
		dir := t.TempDir()
		copyFile(t, exe, filepath.Join(dir, "mallocs"), 0o755)
		copyFile(t, je, filepath.Join(dir, "lib", "libjemalloc.so.2"), 0o644)
		return dir
	}
	jemalloc := []string{"-L" + filepath.Dir(je), "-l:libjemalloc.so.2"}
	cases := []struct {
		name  string
		link  []string
		env   []string
		modes []string
		inDir bool // run from the program's directory
	}{
		{"relative RUNPATH", append(jemalloc, "-Wl,-rpath,lib"), nil, []string{"full", "aggregate"}, true},
		{"$ORIGIN RUNPATH", append(jemalloc, "-Wl,-rpath,$ORIGIN/lib"), nil, []string{"aggregate"}, false},
		{"relative LD_LIBRARY_PATH", jemalloc, []string{"LD_LIBRARY_PATH=lib"}, []string{"aggregate"}, true},
		{"relative LD_PRELOAD", nil, []string{"LD_PRELOAD=lib/libjemalloc.so.2"}, []string{"aggregate"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := install(t, c.link...)
			copied, err := filepath.EvalSymlinks(filepath.Join(dir, "lib", "libjemalloc.so.2"))
			if err != nil {
				t.Fatal(err)
			}
			cwd := dir
			if !c.inDir {
				cwd = t.TempDir()
			}
			var mallocs []uint64
			for _, rec := range recorders {
				for _, mode := range c.modes {
					what := rec + " " + mode
					trace := filepath.Join(t.TempDir(), "je.htr")
					report := filepath.Join(t.TempDir(), "report.json")
					cmd := exec.Command(hooktraceBin, "run", "--recorder", rec, "--mode", mode, "--ignore-target-status",
						"--report", "json:"+report, "-o", trace, "--", filepath.Join(dir, "mallocs"))
					cmd.Dir = cwd
					cmd.Env = append(os.Environ(), c.env...)
					var stderr bytes.Buffer
					cmd.Stderr = &stderr
					if err := cmd.Run(); err != nil {
						var ee *exec.ExitError
						if !errors.As(err, &ee) {
							t.Fatal(err)
						}
						t.Fatalf("%s: exit %d\n%s", what, ee.ExitCode(), stderr.String())
					}
					b, err := os.ReadFile(report)
					if err != nil {
						t.Fatal(err)
					}
					rep := parseReport(t, string(b))
					if fs := findings(t, string(b)); len(fs) != 0 {
						t.Errorf("%s: want no finding, got%s", what, verdicts(fs))
					}
					for _, tr := range rep.Stats.Traces {
						if tr.Allocator != "jemalloc" {
							t.Errorf("%s: allocator %q, want jemalloc", what, tr.Allocator)
						}
					}
					mallocs = append(mallocs, rep.Stats.Calls["malloc"])
					evs, stacks, _ := readTrace(t, trace)
					n := 0
					for _, e := range evs {
						if e.Op != events.OpMalloc || e.Size != 777 {
							continue
						}
						n++
						if s := stacks[e.Stack]; s == nil || len(s.Frames) == 0 || s.Frames[0].Object != copied {
							t.Fatalf("%s: malloc(777) not in %s:%s", what, copied, stackString(s))
						}
					}
					if (mode == "full" && n != 10000) || n == 0 {
						t.Errorf("%s: %d malloc(777) events", what, n)
					}
				}
			}
			if mallocs[0] < 10000 || slices.Max(mallocs) != slices.Min(mallocs) {
				t.Errorf("calls.malloc by run: %v, want the same, at least the program's 10000", mallocs)
			}
		})
	}
}

// copyFile copies src to dst (making dst's directory) with mode perm.
func copyFile(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		t.Fatal(err)
	}
}
