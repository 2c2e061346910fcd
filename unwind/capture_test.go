//go:build linux && amd64

package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The tests in this file run testdata/capture.c, which samples its own stack
// the way the tracer's BPF side does, and unwind that sample offline.

type mapping struct {
	start, end, offset uint64
	path               string
}

type capture struct {
	binary string
	sample Sample
	funcs  map[string]uint64 // runtime addresses printed by the program
	maps   []mapping
}

func TestMain(m *testing.M) { testenv.Main(m) }

// buildCapture compiles the capture program the way HPC code and glibc are
// built: optimised and without frame pointers. Tests with the same flags
// share one binary: compiling is the slowest part of the tests.
func buildCapture(tb testing.TB, extraFlags ...string) string {
	tb.Helper()
	flags := append([]string{"-O2", "-fomit-frame-pointer", "-g0"}, extraFlags...)
	return testenv.C{Source: filepath.Join("testdata", "capture.c"), Flags: flags}.Build(tb)
}

func runCapture(tb testing.TB, bin, mode string) *capture {
	tb.Helper()
	out, err := exec.Command(bin, mode).Output()
	if err != nil {
		tb.Fatalf("running %s %s: %v", bin, mode, err)
	}
	c := &capture{binary: bin, funcs: map[string]uint64{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	hexValue := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			tb.Fatalf("parsing %q: %v", s, err)
		}
		return v
	}
	for sc.Scan() {
		key, rest, _ := strings.Cut(sc.Text(), " ")
		switch key {
		case "ip":
			c.sample.IP = hexValue(rest)
		case "sp":
			c.sample.SP = hexValue(rest)
		case "bp":
			c.sample.BP = hexValue(rest)
		case "func":
			name, addr, _ := strings.Cut(rest, " ")
			c.funcs[name] = hexValue(addr)
		case "stack":
			b, err := hex.DecodeString(rest)
			if err != nil {
				tb.Fatalf("decoding stack: %v", err)
			}
			c.sample.Stack = b
		case "map":
			f := strings.Fields(rest)
			if len(f) < 6 {
				continue // anonymous mapping
			}
			lo, hi, _ := strings.Cut(f[0], "-")
			c.maps = append(c.maps, mapping{
				start: hexValue(lo), end: hexValue(hi), offset: hexValue(f[2]),
				path: strings.Join(f[5:], " "),
			})
		}
	}
	if len(c.sample.Stack) == 0 || c.sample.IP == 0 {
		tb.Fatalf("capture output has no sample:\n%s", out)
	}
	return c
}

// resolver answers like the tracer would from /proc/PID/maps, opening each
// file once.
func (c *capture) resolver(tb testing.TB) Resolver {
	objects := map[string]*Object{}
	return func(addr uint64) (*Object, uint64, bool) {
		for _, m := range c.maps {
			if addr < m.start || addr >= m.end || !strings.HasPrefix(m.path, "/") {
				continue
			}
			obj, ok := objects[m.path]
			if !ok {
				var err error
				if obj, err = openPath(m.path); err != nil {
					tb.Logf("opening %s: %v", m.path, err)
				}
				objects[m.path] = obj
			}
			if obj == nil {
				return nil, 0, false
			}
			bias, err := loadBias(m.path, m.start, m.offset)
			if err != nil {
				tb.Logf("%v", err)
				return nil, 0, false
			}
			return obj, bias, true
		}
		return nil, 0, false
	}
}

func (c *capture) mappingOf(addr uint64) (mapping, bool) {
	for _, m := range c.maps {
		if addr >= m.start && addr < m.end {
			return m, true
		}
	}
	return mapping{}, false
}

// symbol is a function's runtime address range.
type symbol struct {
	name       string
	start, end uint64
}

// symbols returns the function symbols of path (from .symtab, or .dynsym for
// stripped libraries) shifted to runtime addresses using the file's mapping.
func (c *capture) symbols(tb testing.TB, path string) []symbol {
	tb.Helper()
	f, err := elf.Open(path)
	if err != nil {
		tb.Fatalf("opening %s: %v", path, err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil || len(syms) == 0 {
		syms, err = f.DynamicSymbols()
		if err != nil {
			tb.Fatalf("reading symbols of %s: %v", path, err)
		}
	}
	var bias uint64
	found := false
	for _, m := range c.maps {
		if m.path == path {
			if bias, err = loadBias(m.path, m.start, m.offset); err != nil {
				tb.Fatal(err)
			}
			found = true
			break
		}
	}
	if !found {
		tb.Fatalf("%s is not mapped", path)
	}
	var out []symbol
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			out = append(out, symbol{name: s.Name, start: s.Value + bias, end: s.Value + s.Size + bias})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

func symbolAt(syms []symbol, addr uint64) (symbol, bool) {
	i := sort.Search(len(syms), func(i int) bool { return syms[i].start > addr }) - 1
	if i >= 0 && addr < syms[i].end {
		return syms[i], true
	}
	return symbol{}, false
}

// describe names each pc as symbol+offset within its object, for test logs.
func (c *capture) describe(tb testing.TB, pcs []uint64) []string {
	symsByPath := map[string][]symbol{}
	var out []string
	for i, pc := range pcs {
		lookup := pc
		if i > 0 {
			lookup-- // return address: the call is just before it
		}
		m, ok := c.mappingOf(lookup)
		if !ok {
			out = append(out, fmt.Sprintf("#%d 0x%x ?", i, pc))
			continue
		}
		syms, ok := symsByPath[m.path]
		if !ok && strings.HasPrefix(m.path, "/") {
			syms = c.symbols(tb, m.path)
			symsByPath[m.path] = syms
		}
		name := "?"
		if s, ok := symbolAt(syms, lookup); ok {
			name = fmt.Sprintf("%s+0x%x", s.name, pc-s.start)
		}
		out = append(out, fmt.Sprintf("#%d 0x%x %s (%s)", i, pc, name, filepath.Base(m.path)))
	}
	return out
}

// frameIn reports whether frame i of pcs lies in function name of the
// capture binary.
func frameIn(syms []symbol, pcs []uint64, i int, name string) bool {
	if i >= len(pcs) {
		return false
	}
	lookup := pcs[i]
	if i > 0 {
		lookup--
	}
	s, ok := symbolAt(syms, lookup)
	return ok && s.name == name
}

func checkFuncAddresses(t *testing.T, c *capture, syms []symbol) {
	t.Helper()
	for name, addr := range c.funcs {
		s, ok := symbolAt(syms, addr)
		if !ok || s.name != name || s.start != addr {
			t.Fatalf("symbol table and load bias disagree with the program: %s is at 0x%x, table says %+v", name, addr, s)
		}
	}
}

func TestUnwindWithoutFramePointers(t *testing.T) {
	bin := buildCapture(t)
	c := runCapture(t, bin, "direct")
	syms := c.symbols(t, bin)
	checkFuncAddresses(t, c, syms)

	pcs, reason := Unwind(c.sample, c.resolver(t))
	frames := c.describe(t, pcs)
	t.Logf("stopped: %s\n%s", reason, strings.Join(frames, "\n"))

	for i, want := range []string{"c", "b", "a", "main"} {
		if !frameIn(syms, pcs, i, want) {
			t.Fatalf("frame %d is not in %s:\n%s", i, want, strings.Join(frames, "\n"))
		}
	}
	if reason != ReasonEndOfStack {
		t.Errorf("reason = %q, want %q", reason, ReasonEndOfStack)
	}
	// The walk must reach _start, whose CFI ends the stack.
	if !frameIn(syms, pcs, len(pcs)-1, "_start") {
		t.Errorf("last frame is not _start:\n%s", strings.Join(frames, "\n"))
	}
}

// Without unwind tables gcc describes frames only in .debug_frame, which has
// a different record layout and no search table.
func TestUnwindWithDebugFrame(t *testing.T) {
	bin := buildCapture(t, "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-g")
	c := runCapture(t, bin, "direct")
	syms := c.symbols(t, bin)
	checkFuncAddresses(t, c, syms)

	obj, err := openPath(bin)
	if err != nil {
		t.Fatal(err)
	}
	if obj.debugFrame == nil {
		t.Fatal("no .debug_frame loaded")
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	elfSyms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range elfSyms {
		if s.Name != "c" {
			continue
		}
		if _, err := obj.ehFrame.find(s.Value); err == nil {
			t.Fatal("c is described in .eh_frame; the test would not exercise .debug_frame")
		}
		if _, err := obj.debugFrame.find(s.Value); err != nil {
			t.Fatalf("c is not in .debug_frame: %v", err)
		}
	}

	pcs, reason := Unwind(c.sample, c.resolver(t))
	frames := c.describe(t, pcs)
	t.Logf("stopped: %s\n%s", reason, strings.Join(frames, "\n"))
	for i, want := range []string{"c", "b", "a", "main"} {
		if !frameIn(syms, pcs, i, want) {
			t.Fatalf("frame %d is not in %s:\n%s", i, want, strings.Join(frames, "\n"))
		}
	}
	if reason != ReasonEndOfStack {
		t.Errorf("reason = %q, want %q", reason, ReasonEndOfStack)
	}
}

func TestUnwindThroughGlibc(t *testing.T) {
	bin := buildCapture(t)
	c := runCapture(t, bin, "qsort")
	syms := c.symbols(t, bin)
	checkFuncAddresses(t, c, syms)

	pcs, reason := Unwind(c.sample, c.resolver(t))
	frames := c.describe(t, pcs)
	t.Logf("stopped: %s\n%s", reason, strings.Join(frames, "\n"))

	if !frameIn(syms, pcs, 0, "compare") {
		t.Fatalf("frame 0 is not the comparator:\n%s", strings.Join(frames, "\n"))
	}
	caller := -1
	for i := 1; i < len(pcs); i++ {
		if frameIn(syms, pcs, i, "sort_caller") {
			caller = i
			break
		}
	}
	if caller < 0 {
		t.Fatalf("sort_caller not found; the unwinder did not cross glibc:\n%s", strings.Join(frames, "\n"))
	}
	if caller < 2 {
		t.Fatalf("no glibc frame between comparator and sort_caller:\n%s", strings.Join(frames, "\n"))
	}
	for i := 1; i < caller; i++ {
		m, ok := c.mappingOf(pcs[i] - 1)
		if !ok || !strings.Contains(filepath.Base(m.path), "libc") {
			t.Fatalf("frame %d between comparator and sort_caller is not in libc:\n%s", i, strings.Join(frames, "\n"))
		}
	}
	if !frameIn(syms, pcs, caller+1, "main") {
		t.Fatalf("frame after sort_caller is not main:\n%s", strings.Join(frames, "\n"))
	}
	if reason != ReasonEndOfStack {
		t.Errorf("reason = %q, want %q", reason, ReasonEndOfStack)
	}
}

func TestTruncatedStackCopy(t *testing.T) {
	bin := buildCapture(t)
	c := runCapture(t, bin, "direct")
	resolve := c.resolver(t)
	full, fullReason := Unwind(c.sample, resolve)
	if fullReason != ReasonEndOfStack {
		t.Fatalf("full unwind stopped early: %s", fullReason)
	}
	sawPartial := false
	for n := 0; n <= len(c.sample.Stack); n += 4 {
		s := c.sample
		s.Stack = s.Stack[:n]
		pcs, reason := Unwind(s, resolve)
		if len(pcs) == 0 || len(pcs) > len(full) {
			t.Fatalf("copy of %d bytes: %d frames, full unwind has %d", n, len(pcs), len(full))
		}
		for i := range pcs {
			if pcs[i] != full[i] {
				t.Fatalf("copy of %d bytes: frame %d = 0x%x, full unwind has 0x%x", n, i, pcs[i], full[i])
			}
		}
		if reason == ReasonEndOfStack {
			if len(pcs) != len(full) {
				t.Fatalf("copy of %d bytes: end of stack after %d of %d frames", n, len(pcs), len(full))
			}
			continue
		}
		want := fmt.Sprintf("stack copy exhausted at depth %d", len(pcs)-1)
		if reason != want {
			t.Fatalf("copy of %d bytes: reason %q, want %q", n, reason, want)
		}
		if len(pcs) > 1 {
			sawPartial = true
		}
	}
	if !sawPartial {
		t.Fatal("no truncation produced a partial stack")
	}
}

func BenchmarkUnwind(b *testing.B) {
	bin := buildCapture(b)
	c := runCapture(b, bin, "qsort")
	resolve := c.resolver(b)
	pcs, reason := Unwind(c.sample, resolve)
	b.Logf("%d frames, %s", len(pcs), reason)
	buf := make([]uint64, 0, MaxDepth)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendUnwind(buf[:0], c.sample, resolve, MaxDepth)
	}
}

// A sample taken in a signal handler must continue through glibc's signal
// trampoline, whose CFI ('S' augmentation) reads the interrupted registers
// from the signal frame with DWARF expressions.
func TestUnwindThroughSignalFrame(t *testing.T) {
	bin := buildCapture(t)
	c := runCapture(t, bin, "signal")
	syms := c.symbols(t, bin)
	checkFuncAddresses(t, c, syms)

	pcs, reason := Unwind(c.sample, c.resolver(t))
	frames := c.describe(t, pcs)
	t.Logf("stopped: %s\n%s", reason, strings.Join(frames, "\n"))
	if !frameIn(syms, pcs, 0, "on_signal") {
		t.Fatalf("frame 0 is not the handler:\n%s", strings.Join(frames, "\n"))
	}
	caller := -1
	for i := 1; i < len(pcs); i++ {
		if frameIn(syms, pcs, i, "signal_caller") {
			caller = i
			break
		}
	}
	if caller < 0 || !frameIn(syms, pcs, caller+1, "main") {
		t.Fatalf("signal_caller and main not found after the signal frame:\n%s", strings.Join(frames, "\n"))
	}
	if reason != ReasonEndOfStack {
		t.Errorf("reason = %q, want %q", reason, ReasonEndOfStack)
	}
}

func BenchmarkOpenLibc(b *testing.B) {
	const path = "/usr/lib/x86_64-linux-gnu/libc.so.6"
	testenv.File(b, path, "Debian's libc6")
	for b.Loop() {
		if _, err := openPath(path); err != nil {
			b.Fatal(err)
		}
	}
}
