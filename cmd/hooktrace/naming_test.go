package main

import (
	"github.com/hooktrace/hooktrace/internal/testenv"

	"debug/elf"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestStrippedLibraryNames: locks and frames in a stripped library, with
// no symbol to name them, are named by their place in the library,
// "libx.so+0x113d" as TSan and perf write it: the same in every run
// (addresses are randomized) under either recorder, inside the function
// the unstripped copy says, and with the same finding ID.
func TestStrippedLibraryNames(t *testing.T) {
	testenv.RequireBPF(t)
	dir := t.TempDir()
	full, lib := filepath.Join(dir, "libx.full.so"), filepath.Join(dir, "libx.so")
	prog := filepath.Join(dir, "stripped")
	for _, args := range [][]string{
		{"gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-fPIC", "-shared", "-pthread", "-o", full, filepath.Join("..", "..", "testdata", "stripped_lib.c")},
		{"strip", "--strip-all", "-o", lib, full},
		{"gcc", "-O2", "-fno-omit-frame-pointer", "-pthread", "-o", prog, filepath.Join("..", "..", "testdata", "stripped_main.c"), "-L" + dir, "-lx", "-Wl,-rpath," + dir},
	} {
		if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, b)
		}
	}
	// Where the hidden functions are, from the copy that kept its symbols.
	f, err := elf.Open(full)
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	f.Close()
	within := map[string][2]uint64{}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "hidden_") {
			within[s.Name] = [2]uint64{s.Value, s.Value + s.Size}
		}
	}
	if len(within) != 2 {
		t.Fatalf("hidden functions in %s: %v", full, within)
	}
	inHidden := func(off uint64) string {
		for name, r := range within {
			if off >= r[0] && off < r[1] {
				return name
			}
		}
		return ""
	}
	place := regexp.MustCompile(`^mutex first taken at libx\.so\+0x([0-9a-f]+)$`)
	// Four runs: both recorders, both modes, each its own address space.
	var first *finding
	for _, run := range traceRuns(t, nil, prog) {
		fs := ofKind(run.fs, "lock-order-cycle", "error")
		if len(fs) != 1 {
			t.Fatalf("run %s: %d lock-order cycles, want 1: %v", run, len(fs), fs)
		}
		fd := fs[0]
		for _, l := range fd.Locks {
			m := place.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("run %s: lock named %q, want \"mutex first taken at libx.so+0xOFFSET\"", run, l)
			}
			off, _ := strconv.ParseUint(m[1], 16, 64)
			if inHidden(off) == "" {
				t.Errorf("run %s: %s is not inside %v", run, l, within)
			}
		}
		frames := 0
		for _, e := range fd.Edges {
			for _, fr := range e.Stack {
				if fr.Function == "" {
					frames++
				}
			}
		}
		if frames == 0 {
			t.Errorf("run %s: no unnamed frame in the edges' stacks", run)
		}
		if first == nil {
			first = &fd
		} else if fd.ID != first.ID || strings.Join(fd.Locks, ";") != strings.Join(first.Locks, ";") {
			t.Errorf("run %s: %s %v, first %s %v: want the same ID and names", run, fd.ID, fd.Locks, first.ID, first.Locks)
		}
	}
	// The text report names the frames the same way.
	_, stderr, _ := hooktrace(t, nil, "run", "--", prog)
	if !regexp.MustCompile(`#1  libx\.so\+0x[0-9a-f]+\n`).MatchString(stderr) || regexp.MustCompile(`0x[0-9a-f]+ \(libx\.so\)`).MatchString(stderr) {
		t.Errorf("text report frames:\n%s", stderr)
	}
}
