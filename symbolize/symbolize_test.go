//go:build linux && amd64

package symbolize

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// needTool skips when a compiler is missing, except in CI where the tests
// must run.
func needTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.Tool(t, "apt-get install -y gcc g++", name)
}

// build is a test program made from a testdata source.
type build struct {
	compiler, src, out string
	args               []string
}

var (
	progBuild         = build{"gcc", "prog.c", "prog", []string{"-g", "-O0", "-fno-toplevel-reorder", "-pthread", "-ldl"}}
	progStrippedBuild = build{"gcc", "prog.c", "prog-stripped", []string{"-O0", "-fno-toplevel-reorder", "-pthread", "-ldl", "-s"}}
	plugBuild         = build{"gcc", "plug.c", "libplug.so", []string{"-g", "-O0", "-shared", "-fPIC", "-pthread"}}
	plugStrippedBuild = build{"gcc", "plug.c", "libplug-stripped.so", []string{"-O0", "-shared", "-fPIC", "-pthread", "-s"}}
	classBuild        = build{"g++", "class.cc", "cls", []string{"-g", "-O0"}}
)

func TestMain(m *testing.M) { testenv.Main(m) }

// path returns the build shared by every test that only reads it. Tests
// that change or delete the file use into instead.
func (b build) path(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("testdata", b.src))
	if err != nil {
		t.Fatal(err)
	}
	return testenv.C{Compiler: b.compiler, Source: src, Name: b.out, Flags: b.args}.Build(t)
}

// into copies the program into dir, for a test of its own to change, and
// returns its path.
func (b build) into(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(b.path(t))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, b.out)
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// markerLine returns the line of testdata/src holding /* marker */ or
// // marker.
func markerLine(t *testing.T, src, marker string) uint32 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", src))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, marker) {
			return uint32(i + 1)
		}
	}
	t.Fatalf("no %s in %s", marker, src)
	return 0
}

// elfSymbol reads a symbol's value straight from the file, as an oracle
// independent of the code under test.
func elfSymbol(t *testing.T, path, name string) elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("%s has no symbol %s", path, name)
	return elf.Symbol{}
}

// target is a running testdata/prog.c.
type target struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	addrs map[string]uint64
	bytes map[string][]byte // first bytes at some function addresses
}

func startTarget(t *testing.T, prog string, args ...string) *target {
	t.Helper()
	cmd := exec.Command(prog, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tg := &target{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout), addrs: map[string]uint64{}, bytes: map[string][]byte{}}
	t.Cleanup(func() {
		tg.stdin.Close()
		if tg.cmd.ProcessState == nil {
			tg.cmd.Process.Kill()
			tg.cmd.Wait()
		}
	})
	tg.readUntilReady(t)
	return tg
}

// readUntilReady reads "name 0xaddr [hex bytes]" lines up to "ready".
func (tg *target) readUntilReady(t *testing.T) {
	t.Helper()
	for tg.out.Scan() {
		fields := strings.Fields(tg.out.Text())
		if len(fields) == 1 && fields[0] == "ready" {
			return
		}
		if len(fields) < 2 || fields[0] == "error" {
			t.Fatalf("target says %q", tg.out.Text())
		}
		addr, err := strconv.ParseUint(strings.TrimPrefix(fields[1], "0x"), 16, 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", tg.out.Text(), err)
		}
		tg.addrs[fields[0]] = addr
		if len(fields) > 2 {
			b, err := hex.DecodeString(fields[2])
			if err != nil {
				t.Fatal(err)
			}
			tg.bytes[fields[0]] = b
		}
	}
	t.Fatalf("target exited before it was ready: %v", tg.out.Err())
}

func (tg *target) pid() int { return tg.cmd.Process.Pid }

func (tg *target) exit(t *testing.T) {
	t.Helper()
	tg.stdin.Close()
	if err := tg.cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatal(err)
		}
	}
}

func TestParseMaps(t *testing.T) {
	const maps = `7f0000000000-7f0000001000 r--p 00000000 fe:00 1234                       /usr/lib/libc.so.6
55aa00000000-55aa00001000 r-xp 00001000 fe:01 99                         /opt/my app/bin with spaces
55aa00001000-55aa00002000 rw-p 00002000 fe:01 100                        /tmp/gone (deleted)
55aa00002000-55aa00003000 rw-p 00000000 00:00 0                          
55aa00003000-55aa00024000 rw-p 00000000 00:00 0                          [heap]
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7f1000000000-7f1000001000 r-xp 00000000 00:05 4242                       /memfd:jit (deleted)
7f2000000000-7f2000001000 r--p 00000000 fe:00 77                         /tmp/new\012line
`
	got, err := ParseMaps(strings.NewReader(maps))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mapping{
		{Start: 0x55aa00000000, End: 0x55aa00001000, Perms: "r-xp", Offset: 0x1000, Major: 0xfe, Minor: 1, Inode: 99, Path: "/opt/my app/bin with spaces"},
		{Start: 0x55aa00001000, End: 0x55aa00002000, Perms: "rw-p", Offset: 0x2000, Major: 0xfe, Minor: 1, Inode: 100, Path: "/tmp/gone", Deleted: true},
		{Start: 0x55aa00002000, End: 0x55aa00003000, Perms: "rw-p"},
		{Start: 0x55aa00003000, End: 0x55aa00024000, Perms: "rw-p", Path: "[heap]"},
		{Start: 0x7f0000000000, End: 0x7f0000001000, Perms: "r--p", Major: 0xfe, Inode: 1234, Path: "/usr/lib/libc.so.6"},
		{Start: 0x7f1000000000, End: 0x7f1000001000, Perms: "r-xp", Minor: 5, Inode: 4242, Path: "/memfd:jit", Deleted: true},
		{Start: 0x7f2000000000, End: 0x7f2000001000, Perms: "r--p", Major: 0xfe, Inode: 77, Path: "/tmp/new\nline"},
		{Start: 0x7ffd00000000, End: 0x7ffd00002000, Perms: "r-xp", Path: "[vdso]"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	files := 0
	for _, m := range got {
		if m.IsFile() {
			files++
		}
	}
	if files != 5 {
		t.Errorf("%d file mappings, want 5", files)
	}
	for _, c := range []struct {
		addr uint64
		path string
		ok   bool
	}{
		{0x55aa00000000, "/opt/my app/bin with spaces", true},
		{0x55aa00000fff, "/opt/my app/bin with spaces", true},
		{0x55aa00001000, "/tmp/gone", true},
		{0x55aa00030000, "", false},
		{0x7ffd00001fff, "[vdso]", true},
	} {
		m, ok := got.Find(c.addr)
		if ok != c.ok || m.Path != c.path {
			t.Errorf("Find(%#x) = %q, %v; want %q, %v", c.addr, m.Path, ok, c.path, c.ok)
		}
	}

	if _, err := ParseMaps(strings.NewReader("zzz-1 r-xp 0 0:0 0\n")); err == nil {
		t.Error("a bad line parsed")
	}
}

func TestObjectC(t *testing.T) {
	prog := progBuild.path(t)
	stripped := progStrippedBuild.path(t)
	lib := plugBuild.path(t)
	strippedLib := plugStrippedBuild.path(t)

	o, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := Open(prog); again != o {
		t.Error("opening the same file twice gave two objects")
	}
	if o.Stripped() {
		t.Error("prog built with symbols reports stripped")
	}

	for _, name := range []string{"target_fn", "after_asm", "caller", "main", "asm_nosize"} {
		want := elfSymbol(t, prog, name)
		s, err := o.Func(name)
		if err != nil {
			t.Errorf("Func(%s): %v", name, err)
			continue
		}
		off, err := o.FileOffset(want.Value)
		if err != nil {
			t.Fatal(err)
		}
		if s.Name != name || s.Value != want.Value || s.Size != want.Size || s.Offset != off || s.Kind != KindFunc {
			t.Errorf("Func(%s) = %+v; want value %#x size %d offset %#x", name, s, want.Value, want.Size, off)
		}
	}

	_, err = o.Func("no_such_function")
	if !errors.Is(err, ErrSymbolNotFound) || errors.Is(err, ErrStripped) {
		t.Errorf("Func(no_such_function) = %v; want ErrSymbolNotFound only", err)
	}

	// A symbol without a size covers the gap to the next one, no further.
	asm, after := elfSymbol(t, prog, "asm_nosize"), elfSymbol(t, prog, "after_asm")
	if after.Value <= asm.Value {
		t.Fatalf("after_asm (%#x) is not after asm_nosize (%#x)", after.Value, asm.Value)
	}
	target := elfSymbol(t, prog, "target_fn")
	for _, c := range []struct {
		vaddr uint64
		name  string
	}{
		{asm.Value, "asm_nosize"},
		{asm.Value + 2, "asm_nosize"},
		{after.Value, "after_asm"},
		{after.Value + 1, "after_asm"},
		{target.Value + target.Size - 1, "target_fn"},
	} {
		if s, ok := o.SymbolAt(c.vaddr); !ok || s.Name != c.name {
			t.Errorf("SymbolAt(%#x) = %q, %v; want %q", c.vaddr, s.Name, ok, c.name)
		}
	}

	// DWARF: the function's first line is the one it was written on.
	src, _ := filepath.Abs("testdata/prog.c")
	frames := o.Frames(target.Value)
	if len(frames) != 1 {
		t.Fatalf("Frames(target_fn) = %+v", frames)
	}
	if f := frames[0]; f.Function != "target_fn" || f.Offset != 0 || f.File != src || f.Line != markerLine(t, "prog.c", "LINE_TARGET") || f.Object != prog {
		t.Errorf("Frames(target_fn) = %+v; want target_fn at %s:%d", f, src, markerLine(t, "prog.c", "LINE_TARGET"))
	}

	// Data symbols, including one in .bss.
	vma := elfSymbol(t, prog, "vma_lock")
	for _, c := range []struct {
		vaddr uint64
		name  string
		ok    bool
	}{
		{vma.Value, "vma_lock (prog)", true},
		{vma.Value + 16, "vma_lock+0x10 (prog)", true},
		{vma.Value + vma.Size, "", false},
		{target.Value, "", false},
	} {
		if name, ok := o.dataName(c.vaddr, prog); name != c.name || ok != c.ok {
			t.Errorf("data name at %#x = %q, %v; want %q, %v", c.vaddr, name, ok, c.name, c.ok)
		}
	}

	// Stripped: only .dynsym is left, and main programs export nothing.
	so, err := Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	if !so.Stripped() {
		t.Error("stripped prog does not report stripped")
	}
	_, err = so.Func("target_fn")
	if !errors.Is(err, ErrSymbolNotFound) || !errors.Is(err, ErrStripped) {
		t.Errorf("Func(target_fn) in a stripped program = %v; want ErrSymbolNotFound and ErrStripped", err)
	}
	if err == nil || !strings.Contains(err.Error(), "target_fn") || !strings.Contains(err.Error(), stripped) {
		t.Errorf("error %q does not name the symbol and the object", err)
	}

	// A stripped library still exports its dynamic symbols.
	full, err := Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := Open(strippedLib)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"exported_fn", "plug_fn"} {
		want, err := full.Func(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sl.Func(name)
		if err != nil || got.Value != want.Value || got.Size != want.Size {
			t.Errorf("stripped Func(%s) = %+v, %v; want %+v", name, got, err, want)
		}
	}
	if _, err := full.Func("hidden_fn"); err != nil {
		t.Errorf("Func(hidden_fn) in the unstripped library: %v", err)
	}
	if _, err := sl.Func("hidden_fn"); !errors.Is(err, ErrStripped) || !errors.Is(err, ErrSymbolNotFound) {
		t.Errorf("Func(hidden_fn) in the stripped library = %v; want ErrStripped", err)
	}

	if ExeIsGo(prog) {
		t.Error("ExeIsGo(C program) = true")
	}
	if exe, err := os.Executable(); err == nil && !ExeIsGo(exe) {
		t.Error("ExeIsGo(this Go test binary) = false")
	}
}

func TestObjectCPlusPlus(t *testing.T) {
	bin := classBuild.path(t)
	o, err := Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	methodInt := elfSymbol(t, bin, "_ZN2ns5Class6methodEi")
	methodDouble := elfSymbol(t, bin, "_ZN2ns5Class6methodEd")
	only := elfSymbol(t, bin, "_ZN2ns5Class4onlyEi")

	for _, c := range []struct {
		query string
		want  elf.Symbol
		name  string
	}{
		{"ns::Class::method(int)", methodInt, "ns::Class::method(int)"},
		{"ns::Class::method(double)", methodDouble, "ns::Class::method(double)"},
		{"_ZN2ns5Class6methodEi", methodInt, "ns::Class::method(int)"},
		{"ns::Class::only", only, "ns::Class::only(int)"},
		{"ns::Class::only(int)", only, "ns::Class::only(int)"},
		{" ns::Class::method( int ) ", methodInt, "ns::Class::method(int)"},
	} {
		s, err := o.Func(c.query)
		if err != nil {
			t.Errorf("Func(%q): %v", c.query, err)
			continue
		}
		if s.Value != c.want.Value || s.Name != c.name || s.Mangled != c.want.Name {
			t.Errorf("Func(%q) = %+v; want %s at %#x", c.query, s, c.name, c.want.Value)
		}
	}

	_, err = o.Func("ns::Class::method")
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Func(ns::Class::method) = %v; want ErrAmbiguous", err)
	}
	for _, want := range []string{fmt.Sprintf("%#x", methodInt.Value), fmt.Sprintf("%#x", methodDouble.Value), "method(int)", "method(double)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ambiguity error %q does not list %s", err, want)
		}
	}

	f := o.Frames(methodInt.Value + 4)
	want := markerLine(t, "class.cc", "LINE_METHOD_INT")
	if last := f[len(f)-1]; last.Function != "ns::Class::method(int)" || last.Offset != 4 || last.Line != want || filepath.Base(last.File) != "class.cc" {
		t.Errorf("Frames(method(int)+4) = %+v; want ns::Class::method(int)+0x4 at class.cc:%d", f, want)
	}

	table := elfSymbol(t, bin, "_ZN2nsL15lock_like_tableE")
	if name, ok := o.dataName(table.Value+8, bin); !ok || name != "ns::lock_like_table+0x8 (cls)" {
		t.Errorf("data name = %q, %v; want ns::lock_like_table+0x8 (cls)", name, ok)
	}
}

// TestFuncsClones: gcc -O2 leaves only worker.constprop.0 (what main
// calls) and its .cold fragment: Funcs("worker") is the clone alone, and
// Func, which wants the function itself, does not find it.
func TestFuncsClones(t *testing.T) {
	bin := testenv.Program(t, "clones")
	o, err := Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := o.Funcs("worker")
	if err != nil || len(syms) != 1 || syms[0].Mangled != "worker.constprop.0" {
		t.Fatalf("Funcs(worker) = %+v, %v; want worker.constprop.0 alone", syms, err)
	}
	if _, err := o.Func("worker"); !errors.Is(err, ErrSymbolNotFound) {
		t.Errorf("Func(worker) = %v; want not found", err)
	}
	if syms, err := o.Funcs("main"); err != nil || len(syms) != 1 || syms[0].Mangled != "main" {
		t.Errorf("Funcs(main) = %+v, %v", syms, err)
	}
	if _, err := o.Funcs("no_such_function"); !errors.Is(err, ErrSymbolNotFound) {
		t.Errorf("Funcs(no_such_function) = %v", err)
	}
}

func TestSymbolizeProcess(t *testing.T) {
	prog := progBuild.path(t)
	lib := plugBuild.path(t)
	src, _ := filepath.Abs("testdata/prog.c")
	tg := startTarget(t, prog, lib)
	s := New(tg.pid())

	lineTarget := markerLine(t, "prog.c", "LINE_TARGET")
	lineCall := markerLine(t, "prog.c", "LINE_CALL")
	lineAfter := markerLine(t, "prog.c", "LINE_AFTER")
	a := tg.addrs

	caller := elfSymbol(t, prog, "caller")
	bias := a["target_fn"] - elfSymbol(t, prog, "target_fn").Value
	retOffset := a["recorded_ret"] - (bias + caller.Value)

	check := func(t *testing.T, when string) {
		t.Helper()
		for _, c := range []struct {
			name string
			got  events.Frame
			want events.Frame
		}{
			{"target_fn", s.Frame(a["target_fn"]), events.Frame{Addr: a["target_fn"], Function: "target_fn", File: src, Line: lineTarget, Object: prog}},
			// The return address is on the line after the call; as a
			// return address it is attributed to the call.
			{"return address as an IP", s.Frame(a["recorded_ret"]), events.Frame{Addr: a["recorded_ret"], Function: "caller", Offset: retOffset, File: src, Line: lineAfter, Object: prog}},
			{"asm_nosize", s.Frame(a["asm_nosize"] + 1), events.Frame{Addr: a["asm_nosize"] + 1, Function: "asm_nosize", Offset: 1, Object: prog}},
		} {
			if c.got != c.want {
				t.Errorf("%s: %s:\n got %+v\nwant %+v", when, c.name, c.got, c.want)
			}
		}

		stack := s.Frames([]uint64{a["target_fn"], a["recorded_ret"]})
		if len(stack) != 2 || stack[1].Function != "caller" || stack[1].Line != lineCall || stack[1].Addr != a["recorded_ret"] {
			t.Errorf("%s: Frames = %+v; want caller at line %d as the second frame", when, stack, lineCall)
		}
		if stack[1].Offset != retOffset {
			t.Errorf("%s: return frame offset %#x; want %#x", when, stack[1].Offset, retOffset)
		}

		for _, c := range []struct {
			addr uint64
			name string
			ok   bool
		}{
			{a["vma_lock"], "vma_lock (prog)", true},
			{a["vma_lock"] + 8, "vma_lock+0x8 (prog)", true},
			{a["big_table"], "big_table (prog)", true},
			// Past the file's last page: anonymous memory after the mapping.
			{a["big_table"] + 0x80000, "big_table+0x80000 (prog)", true},
			{a["heap"], "", false},
			{a["target_fn"], "", false},
		} {
			if name, ok := s.Data(c.addr); name != c.name || ok != c.ok {
				t.Errorf("%s: Data(%#x) = %q, %v; want %q, %v", when, c.addr, name, ok, c.name, c.ok)
			}
		}
	}
	check(t, "running")

	if m, ok := s.Maps().Find(a["big_table"] + 0x80000); !ok || m.Path != "" {
		t.Errorf("big_table+0x80000 is in %+v, %v; the test wants it in anonymous memory", m, ok)
	}

	// Asking again is answered from the cache.
	hits, misses := s.hits, s.misses
	check(t, "cached")
	if s.misses != misses || s.hits <= hits {
		t.Errorf("second pass: %d new misses, %d new hits; want only hits", s.misses-misses, s.hits-hits)
	}

	// A library loaded after the snapshot is found by refreshing it.
	time.Sleep(2 * minRefreshGap)
	fmt.Fprintln(tg.stdin, "dlopen")
	tg.readUntilReady(t)
	if f := s.Frame(tg.addrs["plug_fn"]); f.Function != "plug_fn" || f.Object != lib || filepath.Base(f.File) != "plug.c" {
		t.Errorf("Frame(plug_fn) = %+v; want plug_fn in %s", f, lib)
	}
	if name, ok := s.Data(tg.addrs["plug_lock"]); name != "plug_lock (libplug.so)" || !ok {
		t.Errorf("Data(plug_lock) = %q, %v; want plug_lock (libplug.so)", name, ok)
	}

	// After exit the snapshot still symbolizes, including addresses never
	// asked for before (so not from the cache).
	tg.exit(t)
	if err := s.Refresh(); err == nil {
		t.Error("Refresh after exit succeeded")
	}
	s.frames.clear()
	s.data.clear()
	check(t, "after exit")
	if f := s.Frame(a["target_fn"] + 5); f.Function != "target_fn" || f.Offset != 5 {
		t.Errorf("after exit: Frame(target_fn+5) = %+v", f)
	}
	if f := s.Frame(1); f != (events.Frame{Addr: 1}) {
		t.Errorf("Frame(1) = %+v; want only Addr", f)
	}
}

// A binary deleted while it runs is read through the kernel's handle on it.
func TestSymbolizeDeletedExecutable(t *testing.T) {
	prog := progBuild.into(t, t.TempDir())
	tg := startTarget(t, prog)
	if err := os.Remove(prog); err != nil {
		t.Fatal(err)
	}
	s := New(tg.pid())
	if f := s.Frame(tg.addrs["target_fn"]); f.Function != "target_fn" || f.Object != prog {
		t.Errorf("Frame(target_fn) of a deleted binary = %+v", f)
	}
	m, _ := s.Maps().Find(tg.addrs["target_fn"])
	if !m.Deleted {
		t.Errorf("mapping %+v not marked deleted", m)
	}
	if name, ok := s.Data(tg.addrs["vma_lock"]); name != "vma_lock (prog)" || !ok {
		t.Errorf("Data(vma_lock) = %q, %v", name, ok)
	}
}

// libcPath finds the C library a running program maps.
func libcPath(t *testing.T, maps Maps) string {
	t.Helper()
	for _, m := range maps {
		if base := filepath.Base(m.Path); strings.HasPrefix(base, "libc.so") || strings.HasPrefix(base, "libc-") {
			return m.Path
		}
	}
	t.Fatal("the target maps no libc")
	return ""
}

func TestGlibc(t *testing.T) {
	tg := startTarget(t, progBuild.path(t))
	s := New(tg.pid())
	path := libcPath(t, s.Maps())
	libc, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}

	// Exported functions: the bytes at the file offset are the bytes the
	// process runs, and the address symbolizes back to the name.
	var bias uint64
	for _, name := range []string{"malloc", "pthread_mutex_lock"} {
		sym, err := libc.Func(name)
		if err != nil {
			t.Fatalf("Func(%s): %v", name, err)
		}
		addr := tg.addrs[name]
		fileBytes := make([]byte, len(tg.bytes[name]))
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.ReadAt(fileBytes, int64(sym.Offset))
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fileBytes, tg.bytes[name]) {
			t.Errorf("%s: file bytes at offset %#x are %x; the process runs %x at %#x", name, sym.Offset, fileBytes, tg.bytes[name], addr)
		}
		if f := s.Frame(addr); f.Function != name || f.Offset != 0 || f.Object != path {
			t.Errorf("Frame(%s) = %+v", name, f)
		}
		bias = addr - sym.Value
	}

	// Versions: the default one unless another is asked for.
	for _, c := range []struct{ plain, versioned string }{
		{"pthread_mutex_lock", "pthread_mutex_lock@@GLIBC_2.2.5"},
		{"pthread_cond_wait", "pthread_cond_wait@@GLIBC_2.3.2"},
	} {
		p, err1 := libc.Func(c.plain)
		v, err2 := libc.Func(c.versioned)
		if err1 != nil || err2 != nil || p.Value != v.Value {
			t.Errorf("Func(%s) = %#x, %v; Func(%s) = %#x, %v; want the same address", c.plain, p.Value, err1, c.versioned, v.Value, err2)
		}
	}
	old, err := libc.Func("pthread_cond_wait@GLIBC_2.2.5")
	if cur, _ := libc.Func("pthread_cond_wait"); err != nil || old.Value == cur.Value || old.Version != "GLIBC_2.2.5" {
		t.Errorf("Func(pthread_cond_wait@GLIBC_2.2.5) = %+v, %v; want the old version, not %#x", old, err, cur.Value)
	}
	if m, err := libc.Func("memcpy"); err != nil || m.Kind != KindIFunc {
		t.Errorf("Func(memcpy) = %+v, %v; want the IFUNC", m, err)
	}

	// Internal functions need the debug file.
	testenv.File(t, filepath.Join(debugDir, ".build-id"), "apt-get install -y libc6-dbg for glibc-internal symbols")
	if libc.DebugFile() == "" {
		t.Fatalf("no debug file found for %s (build ID %s); is libc6-dbg installed for this libc?", path, libc.BuildID())
	}
	t.Logf("%s: debug file %s", path, libc.DebugFile())

	for _, name := range []string{"_int_free", "_int_malloc", "munmap_chunk", "sysmalloc", "shrink_heap", "heap_trim"} {
		t.Run(name, func(t *testing.T) {
			var addrs []uint64
			sym, err := libc.Func(name)
			switch {
			case err == nil:
				if sym.Size == 0 {
					t.Fatalf("Func(%s) = %+v: no size", name, sym)
				}
				addrs = append(addrs, sym.Value, sym.Value+sym.Size/2, sym.Value+sym.Size-1)
				if s, ok := libc.SymbolAt(sym.Value + sym.Size/2); !ok || s.Name != name {
					t.Errorf("SymbolAt(%s+%#x) = %q", name, sym.Size/2, s.Name)
				}
			case errors.Is(err, ErrSymbolNotFound):
				// This glibc has the function only inlined (shrink_heap
				// and heap_trim into _int_free, in Debian's 2.36).
				sites, err := libc.InlinedSites(name)
				if err != nil {
					t.Fatalf("%s is neither a symbol nor inlined: %v", name, err)
				}
				t.Logf("%s is inlined at %+v", name, sites)
				for _, site := range sites {
					addrs = append(addrs, site.Addr)
				}
			default:
				t.Fatal(err)
			}
			for _, v := range addrs {
				// A symbol is what Frame names; a function only inlined
				// is the innermost level of Lookup.
				f := s.Frame(bias + v)
				if err != nil {
					f = s.Lookup(bias+v, false)[0]
				}
				if f.Function != name || f.Object != path || f.Line == 0 {
					t.Errorf("frame of %s at %#x = %+v", name, v, f)
				}
			}
		})
	}

	// An address inside inlined code: each inlined function is a frame.
	if _, err := libc.Func("shrink_heap"); errors.Is(err, ErrSymbolNotFound) {
		sites, _ := libc.InlinedSites("shrink_heap")
		if len(sites) > 0 {
			frames := s.FramesInlined([]uint64{bias + sites[0].Addr})
			var names []string
			for _, f := range frames {
				names = append(names, f.Function)
			}
			if got := strings.Join(names, " < "); got != "shrink_heap < heap_trim < _int_free" {
				t.Errorf("inline chain at shrink_heap = %s; want shrink_heap < heap_trim < _int_free", got)
			}
		}
	}
}

// Looking up probes must not read DWARF: glibc's takes a while to load.
func TestFuncDoesNotLoadDWARF(t *testing.T) {
	tg := startTarget(t, progBuild.path(t))
	maps, err := ReadMaps(tg.pid())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(libcPath(t, maps))
	if err != nil {
		t.Fatal(err)
	}
	// A fresh object, not one another test already used.
	o, err := newObject(f, f.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Func("malloc"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Func("_int_free"); err != nil && o.DebugFile() != "" {
		t.Fatal(err)
	}
	if o.dwarf != nil {
		t.Error("Func loaded DWARF")
	}
}

// Debug info split off with objcopy and found through .gnu_debuglink, the
// way a distribution without build-ID directories ships it.
func TestDebugLink(t *testing.T) {
	objcopy := needTool(t, "objcopy")
	dir := t.TempDir()
	lib := plugBuild.into(t, dir)
	want := elfSymbol(t, lib, "hidden_fn")

	debug := lib + ".debug"
	for _, args := range [][]string{
		{"--only-keep-debug", lib, debug},
		{"--strip-all", lib},
		{"--add-gnu-debuglink=" + debug, lib},
	} {
		if msg, err := exec.Command(objcopy, args...).CombinedOutput(); err != nil {
			t.Fatalf("objcopy %v: %v\n%s", args, err, msg)
		}
	}
	// Another copy whose debug file no longer matches its checksum.
	stale := filepath.Join(dir, "stale")
	if err := os.Mkdir(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"libplug.so", "libplug.so.debug"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "libplug.so.debug" {
			data = append(data, 0)
		}
		if err := os.WriteFile(filepath.Join(stale, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	o, err := Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	if o.DebugFile() != debug || o.Stripped() {
		t.Fatalf("debug file %q, stripped %v; want %s", o.DebugFile(), o.Stripped(), debug)
	}
	s, err := o.Func("hidden_fn")
	if err != nil || s.Value != want.Value {
		t.Fatalf("Func(hidden_fn) = %+v, %v; want %#x", s, err, want.Value)
	}
	f := o.Frames(s.Value)
	if last := f[len(f)-1]; last.Function != "hidden_fn" || filepath.Base(last.File) != "plug.c" || last.Line == 0 {
		t.Errorf("Frames(hidden_fn) = %+v; want hidden_fn with its line in plug.c", f)
	}

	so, err := Open(filepath.Join(stale, "libplug.so"))
	if err != nil {
		t.Fatal(err)
	}
	if so.DebugFile() != "" {
		t.Errorf("a debug file failing its checksum was used: %s", so.DebugFile())
	}
	if _, err := so.Func("hidden_fn"); !errors.Is(err, ErrStripped) {
		t.Errorf("Func(hidden_fn) without a debug file = %v; want ErrStripped", err)
	}
}

func TestSymbolizeVDSO(t *testing.T) {
	tg := startTarget(t, progBuild.path(t))
	s := New(tg.pid())
	var vdsoMap Mapping
	for _, m := range s.Maps() {
		if m.Path == "[vdso]" {
			vdsoMap = m
		}
	}
	v := vdsoObject()
	if vdsoMap.Start == 0 || v == nil {
		testenv.Unavailable(t, "no vDSO mapped in the target")
	}
	sym, err := v.Func("__vdso_clock_gettime")
	if err != nil {
		t.Fatal(err)
	}
	bias, ok := v.bias(vdsoMap)
	if !ok {
		t.Fatal("no load bias for the vDSO")
	}
	f := s.Frame(bias + sym.Value + 4)
	if !strings.HasSuffix(f.Function, "clock_gettime") || f.Offset != 4 || f.Object != "[vdso]" {
		t.Errorf("Frame(clock_gettime in the vDSO) = %+v", f)
	}
}

func TestFuncVersions(t *testing.T) {
	o, err := Open(plugBuild.path(t))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := o.Func("plug_fn")
	if err != nil {
		t.Fatal(err)
	}
	// The library has no versions: a versioned name still finds it.
	for _, name := range []string{"plug_fn@@V1", "plug_fn@V1"} {
		if s, err := o.Func(name); err != nil || s.Value != plain.Value {
			t.Errorf("Func(%s) = %+v, %v; want %#x", name, s, err, plain.Value)
		}
	}
}

// Broken files must degrade to missing names, never to a panic.
func TestCorruptFiles(t *testing.T) {
	prog := progBuild.path(t)
	data, err := os.ReadFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	target := elfSymbol(t, prog, "target_fn")
	var variants [][]byte
	for _, name := range []string{".debug_info", ".debug_line", ".debug_abbrev", ".debug_str", ".symtab", ".strtab"} {
		s := ef.Section(name)
		if s == nil {
			t.Fatalf("%s has no %s", prog, name)
		}
		for _, fill := range []byte{0x00, 0xff, 0x80} {
			b := bytes.Clone(data)
			for i := s.Offset + s.Size/4; i < s.Offset+s.Size; i++ {
				b[i] = fill
			}
			variants = append(variants, b)
		}
	}
	ef.Close()
	for _, cut := range []int{64, 1000, len(data) / 2, len(data) - 100} {
		variants = append(variants, data[:cut])
	}
	for i, b := range variants {
		o, err := newObject(bytes.NewReader(b), "corrupt", nil)
		if err != nil {
			continue
		}
		o.Func("target_fn")
		o.SymbolAt(target.Value)
		o.DataAt(target.Value)
		o.InlinedSites("target_fn")
		if f := o.Frames(target.Value); len(f) == 0 {
			t.Errorf("variant %d: no frames", i)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	tg := startTarget(t, progBuild.path(t))
	s := New(tg.pid())
	addrs := []uint64{tg.addrs["target_fn"], tg.addrs["recorded_ret"], tg.addrs["malloc"], tg.addrs["pthread_mutex_lock"]}
	want := s.Frames(addrs)
	s.frames.clear()
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				got := s.Frames(addrs)
				for j := range got {
					if got[j] != want[j] {
						errs <- fmt.Sprintf("frame %d = %+v; want %+v", j, got[j], want[j])
						return
					}
				}
				s.Data(tg.addrs["vma_lock"])
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
