package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// CFlags are how the programs the tests trace are built: optimised, as the
// HPC code hooktrace traces is, with frame pointers and DWARF so that the
// tests can check stacks and source lines.
var CFlags = []string{"-O2", "-g", "-fno-omit-frame-pointer", "-pthread"}

// C is one C (or C++) program to build.
type C struct {
	// Compiler is "gcc" when empty (g++, mpicc...).
	Compiler string
	// Source is the source file; Code, when set, is the source text
	// instead, for programs small enough to live in their test.
	Source string
	Code   string
	// Name is the executable's name (what ps and stacks show); the
	// source's base name without its extension when empty.
	Name string
	// Flags are the compiler flags; CFlags when nil.
	Flags []string
}

// Program builds the repository's testdata/NAME.c with CFlags and extra.
func Program(tb testing.TB, name string, extra ...string) string {
	tb.Helper()
	return C{Source: filepath.Join(RepoRoot(tb), "testdata", name+".c"), Flags: append(slices.Clone(CFlags), extra...)}.Build(tb)
}

// Build compiles c and returns the executable's path. The compiler missing
// stops the test as Unavailable does. Under Main the executable is shared by
// every test of the binary that builds the same thing (same compiler, flags,
// name and source text), and must not be modified; otherwise it is built in
// the test's temporary directory.
func (c C) Build(tb testing.TB) string {
	tb.Helper()
	if c.Compiler == "" {
		c.Compiler = "gcc"
	}
	if c.Flags == nil {
		c.Flags = CFlags
	}
	compiler := Tool(tb, "apt-get install -y gcc g++ (mpicc: openmpi-bin libopenmpi-dev)", c.Compiler)
	code := []byte(c.Code)
	ext := ".c"
	if c.Code == "" {
		var err error
		if code, err = os.ReadFile(c.Source); err != nil {
			tb.Fatalf("reading the test program: %v", err)
		}
		ext = filepath.Ext(c.Source)
	}
	if c.Name == "" {
		if c.Source == "" {
			tb.Fatal("testenv.C: a program given as Code needs a Name")
		}
		c.Name = strings.TrimSuffix(filepath.Base(c.Source), ext)
	}

	h := sha256.New()
	for _, part := range append([]string{compiler, c.Name, string(code)}, c.Flags...) {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]

	cache.Lock()
	defer cache.Unlock()
	dir := cache.dir
	if dir == "" {
		dir = tb.TempDir()
	} else if out, ok := cache.built[key]; ok {
		return out
	}
	dir = filepath.Join(dir, key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	src := c.Source
	if c.Code != "" {
		src = filepath.Join(dir, c.Name+ext)
		if err := os.WriteFile(src, code, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	out := filepath.Join(dir, c.Name)
	args := append(slices.Clone(c.Flags), "-o", out, src)
	if b, err := exec.Command(compiler, args...).CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %s %s: %v\n%s", c.Name, c.Compiler, strings.Join(args, " "), err, b)
	}
	if cache.dir != "" {
		cache.built[key] = out
	}
	return out
}

// cache holds what Build compiled during this test binary's run, when the
// package's TestMain went through Main or Run.
var cache struct {
	sync.Mutex
	dir   string
	built map[string]string
}

// Main runs the tests with a build cache for Build, removes it, and exits:
// compiling is the slowest part of many tests, and several share a program.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that does more around the tests: it returns
// the exit code instead of exiting.
func Run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hooktrace-test-programs")
	if err != nil {
		panic(err)
	}
	// Readable by all: some tests run a program as an unprivileged user.
	os.Chmod(dir, 0o755)
	cache.Lock()
	cache.dir, cache.built = dir, map[string]string{}
	cache.Unlock()
	code := m.Run()
	os.RemoveAll(dir)
	return code
}

// RepoRoot is the directory of the repository's go.mod, found upward from
// the test's working directory (its package directory).
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			tb.Fatalf("finding the repository root from %s: no go.mod above", dir)
		}
	}
}
