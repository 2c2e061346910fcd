// Package rcache holds the reference registration cache, a small C
// library modelled on Open MPI's rcache/base VMA tree in a legacy variant
// (Open MPI 2.0's, which can deadlock with glibc's arena lock) and a fixed
// one, and the workload that drives it. See README.md.
//
// The C sources are embedded so that the hooktrace binary, built without
// cgo, can build them on the machine that runs the demo: Build compiles
// them with the system C compiler into a directory keyed by the hash of
// the sources, the compiler and the flags, and reuses it from then on.
package rcache

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// The C sources live in src/: Go refuses C files in a package directory
// built without cgo.
//
//go:embed src/*.c src/*.h
var sources embed.FS

// Names of what Build makes.
const (
	LibraryName  = "librcache.so"
	WorkloadName = "rcache-workload"
)

// cflags: frame pointers and DWARF, as HPC code is built for debugging,
// and no sibling calls, so every layer of the hook shows in stacks.
var cflags = []string{"-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-pthread", "-Wall"}

// Built is a compiled cache and workload.
type Built struct {
	Dir      string // holds both
	Library  string
	Workload string
	Cached   bool   // found already built
	Compiler string // the compiler used
}

// ErrNoCompiler means no C compiler was found.
var ErrNoCompiler = errors.New("no C compiler found (install gcc, or set CC)")

// Compiler returns the C compiler to use: $CC, else cc, else gcc.
func Compiler() (string, error) {
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", ErrNoCompiler
}

// DefaultCacheDir is where Build keeps its builds: the user's cache
// directory (XDG_CACHE_HOME, else ~/.cache), under hooktrace/rcache.
func DefaultCacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory: %w", err)
	}
	return filepath.Join(d, "hooktrace", "rcache"), nil
}

// Key identifies a build: the embedded sources, the compiler (its path and
// version line) and the flags.
func Key(compiler string) (string, error) {
	h := sha256.New()
	names, err := sourceNames()
	if err != nil {
		return "", err
	}
	for _, n := range names {
		b, err := sources.ReadFile("src/" + n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	out, err := exec.Command(compiler, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", compiler, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	fmt.Fprintf(h, "%s\x00%s\x00%s", compiler, first, strings.Join(cflags, " "))
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func sourceNames() ([]string, error) {
	ents, err := sources.ReadDir("src")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// Build compiles the library and the workload under cacheDir (created if
// needed), or returns the build already there for the same key. Builds go
// to a temporary directory first and are renamed into place, so a build
// interrupted or raced by another process never leaves a half-built one.
func Build(cacheDir string) (*Built, error) {
	cc, err := Compiler()
	if err != nil {
		return nil, err
	}
	key, err := Key(cc)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cacheDir, key)
	b := &Built{Dir: dir, Library: filepath.Join(dir, LibraryName), Workload: filepath.Join(dir, WorkloadName), Compiler: cc}
	if fi, err := os.Stat(b.Workload); err == nil && fi.Mode().IsRegular() {
		if _, err := os.Stat(b.Library); err == nil {
			b.Cached = true
			return b, nil
		}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the build cache: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, key+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("creating the build cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	names, err := sourceNames()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		data, err := sources.ReadFile("src/" + n)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(tmp, n), data, 0o644); err != nil {
			return nil, fmt.Errorf("writing the sources: %w", err)
		}
	}
	steps := [][]string{
		append(append([]string{}, cflags...), "-fPIC", "-shared", "-o", LibraryName, "rcache.c", "patcher.c"),
		append(append([]string{}, cflags...), "-o", WorkloadName, "workload.c", "-L.", "-lrcache", "-Wl,-rpath,$ORIGIN"),
	}
	for _, args := range steps {
		cmd := exec.Command(cc, args...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("compiling the reference cache: %s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have built the same key meanwhile.
		if _, serr := os.Stat(b.Workload); serr == nil {
			b.Cached = true
			return b, nil
		}
		return nil, fmt.Errorf("installing the build: %w", err)
	}
	return b, nil
}
