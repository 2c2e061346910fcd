//go:build linux && amd64

package placement

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The placement decisions for Debian 12's glibc are checked on every machine
// against the code of that glibc, committed as testdata: the functions'
// bytes as they are in its libc.so.6. Where the machine's libc is that very
// build, the live file is checked too, and must equal the testdata.

const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// measuredLibc is the Debian glibc 2.36 build whose code is in
// testdata/glibc-2.36.txt, and against which the README's probe sites were
// read (gdb disassemble /r) and timed.
const (
	measuredLibc        = "glibc-2.36.txt"
	measuredLibcBuildID = "93ac61ec5a8eb1396f9fbd350e3169a558528a40"
)

var updateLibc = flag.Bool("update", false, "rewrite testdata/"+measuredLibc+" from this machine's libc (it must be build "+measuredLibcBuildID+")")

// glibcSites are the functions the tracer probes (source/sites.go), with
// the integer arguments its handler reads, and the site Choose must pick in
// Debian's glibc 2.36: its offset, whether the kernel emulates it, its
// instruction, and a part of the note that says why.
var glibcSites = []struct {
	name     string
	args     int
	offset   int
	emulated bool
	mnemonic string
	noteHas  string
}{
	{"malloc", 1, 0, true, "push", "+0: push %r12 (emulated)"},
	{"calloc", 2, 0, true, "push", "+0: push %r13"},
	{"realloc", 2, 0, true, "push", "+0: push %r15"},
	{"free", 1, 3, true, "je", "leave rdi intact: test %rdi,%rdi"},
	{"posix_memalign", 3, 7, true, "push", "leave rdi, rsi, rdx intact: cmpb $0x0,"},
	{"aligned_alloc", 2, 7, true, "je", "leave rdi, rsi intact: cmpb $0x0,"},
	{"memalign", 2, 7, true, "je", "leave rdi, rsi intact: cmpb $0x0,"},
	{"valloc", 1, 7, true, "push", "leave rdi intact: cmpb $0x0,"},
	{"pvalloc", 1, 7, true, "push", "leave rdi intact: cmpb $0x0,"},
	{"pthread_mutex_lock", 1, 0xe, true, "jne", "mov 0x10(%rdi),%eax; mov %eax,%edx; and $0x17f,%edx; and $0x7c,%eax"},
	{"pthread_mutex_trylock", 1, 0, true, "push", "+0: push %r14"},
	{"pthread_mutex_timedlock", 1, 5, true, "jmp", "leave rdi intact: mov %rsi,%rdx; xor %esi,%esi"},
	{"pthread_mutex_clocklock", 1, 3, true, "ja", "leave rdi intact: cmp $0x1,%esi"},
	{"pthread_mutex_unlock", 1, 5, true, "jmp", "leave rdi intact: mov $0x1,%esi"},
	{"pthread_mutex_init", 1, 0, true, "push", "+0: push %r13"},
	{"pthread_mutex_destroy", 1, 5, true, "jne", "leave rdi intact: mov 0x10(%rdi),%eax; test $0x10,%al"},
	{"pthread_rwlock_rdlock", 1, 0xd, true, "je", "mov 0x18(%rdi),%edx; mov %fs:0x2d0,%eax; cmp %eax,%edx"},
	{"pthread_rwlock_wrlock", 1, 0xd, true, "je", "mov 0x18(%rdi),%edx; mov %fs:0x2d0,%eax; cmp %eax,%edx"},
	// A retry loop jumps back above the first branch: the probe would
	// fire once per retry.
	{"pthread_rwlock_tryrdlock", 1, 0, false, "mov", "the branch at +0x32 jumps to +0x2"},
	{"pthread_rwlock_trywrlock", 1, 0, false, "mov", "the branch at +0x19 jumps to +0x5"},
	{"pthread_rwlock_timedrdlock", 1, 0, true, "push", "+0: push %r13"},
	{"pthread_rwlock_timedwrlock", 1, 0, true, "push", "+0: push %r15"},
	{"pthread_rwlock_clockrdlock", 1, 0, true, "push", "+0: push %r14"},
	{"pthread_rwlock_clockwrlock", 1, 0, true, "push", "+0: push %r15"},
	{"pthread_rwlock_unlock", 1, 0, true, "push", "+0: push %rbp"},
	// The kernel refuses a uprobe on the entry's lock decl.
	{"pthread_spin_lock", 1, 3, true, "jne", "refuses uprobes on lock-prefixed instructions"},
	// Leaf functions with no branch before their ret.
	{"pthread_spin_trylock", 1, 0, false, "mov", "retq at +0x13 returns"},
	{"pthread_spin_unlock", 1, 0, false, "mov", "retq at +0x8 returns"},
	{"pthread_cond_wait", 2, 0, true, "push", "+0: push %r15"},
	{"pthread_cond_timedwait", 2, 0, true, "push", "+0: push %r15"},
}

// TestChooseGlibc236 checks every probe site the tracer would pick in
// Debian's glibc 2.36, from the committed code, on any machine.
func TestChooseGlibc236(t *testing.T) {
	funcs := readGlibcFunctions(t, filepath.Join("testdata", measuredLibc))
	for _, want := range glibcSites {
		t.Run(want.name, func(t *testing.T) {
			code, ok := funcs[want.name]
			if !ok {
				t.Fatalf("%s is not in testdata/%s", want.name, measuredLibc)
			}
			site := Choose(code, want.args)
			if site.Offset != want.offset || site.StackAdjust != 0 || site.Emulated != want.emulated ||
				site.Mnemonic != want.mnemonic || !site.Probeable || !strings.Contains(site.Note, want.noteHas) {
				t.Errorf("%s: +%#x adjust %#x %s emulated=%v probeable=%v (%s); want +%#x adjust 0 %s emulated=%v probeable (%s)",
					want.name, site.Offset, site.StackAdjust, site.Mnemonic, site.Emulated, site.Probeable, site.Note,
					want.offset, want.mnemonic, want.emulated, want.noteHas)
			}
		})
	}
}

// TestChooseLiveLibc: where this machine's libc is the measured build, its
// functions are the committed ones, so the sites above are the ones the
// tracer picks here. With -update it rewrites the testdata from it.
func TestChooseLiveLibc(t *testing.T) {
	f, err := elf.Open(libcPath)
	if err != nil {
		testenv.Unavailable(t, "reading libc: %v", err)
	}
	defer f.Close()
	if id := buildID(f); id != measuredLibcBuildID {
		t.Skipf("libc build-id %s is not the measured %s: TestChooseGlibc236 checks that build's code", id, measuredLibcBuildID)
	}
	live := map[string][]byte{}
	for _, s := range glibcSites {
		sym, err := dynamicFunction(f, s.name)
		if err != nil {
			t.Fatal(err)
		}
		if live[s.name], err = symbolCode(f, sym); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join("testdata", measuredLibc)
	if *updateLibc {
		writeGlibcFunctions(t, path, live)
	}
	committed := readGlibcFunctions(t, path)
	for _, s := range glibcSites {
		if !bytes.Equal(live[s.name], committed[s.name]) {
			t.Errorf("%s in %s differs from testdata/%s", s.name, libcPath, measuredLibc)
		}
		if a, b := Choose(live[s.name], s.args), Choose(committed[s.name], s.args); a != b {
			t.Errorf("%s: live %+v, committed %+v", s.name, a, b)
		}
	}
}

// readGlibcFunctions reads the testdata: comment lines, then one function a
// line, "NAME SIZE HEX".
func readGlibcFunctions(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	funcs := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("%s:%d: want NAME SIZE HEX", path, n)
		}
		size, err := strconv.Atoi(fields[1])
		if err != nil {
			t.Fatalf("%s:%d: size: %v", path, n, err)
		}
		code, err := hex.DecodeString(fields[2])
		if err != nil || len(code) != size {
			t.Fatalf("%s:%d: %d bytes of code, want %d (%v)", path, n, len(code), size, err)
		}
		funcs[fields[0]] = code
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return funcs
}

func writeGlibcFunctions(t *testing.T, path string, funcs map[string][]byte) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Debian 12 glibc 2.36 (libc6 2.36-9+deb12u14, amd64): %s, build-id %s.\n", libcPath, measuredLibcBuildID)
	b.WriteString("# The functions hooktrace probes, whole (a site a later branch jumps back to is refused),\n")
	b.WriteString("# as .dynsym sizes them: NAME SIZE HEX. Rewritten by go test ./placement -run TestChooseLiveLibc -update.\n")
	for _, s := range glibcSites {
		fmt.Fprintf(&b, "%s %d %x\n", s.name, len(funcs[s.name]), funcs[s.name])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dynamicFunction finds a function in .dynsym, preferring the default
// version when a name has several.
func dynamicFunction(f *elf.File, name string) (elf.Symbol, error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return elf.Symbol{}, fmt.Errorf("reading dynamic symbols: %w", err)
	}
	for _, s := range syms {
		if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 &&
			!(s.HasVersion && s.VersionIndex.IsHidden()) {
			return s, nil
		}
	}
	return elf.Symbol{}, fmt.Errorf("finding %s: not in .dynsym", name)
}

// symbolCode returns a function's bytes as stored in the file.
func symbolCode(f *elf.File, sym elf.Symbol) ([]byte, error) {
	return fileBytes(f, sym.Value, sym.Size)
}

func fileBytes(f *elf.File, addr, size uint64) ([]byte, error) {
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || addr < sec.Addr || addr+size > sec.Addr+sec.Size {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		return data[addr-sec.Addr : addr-sec.Addr+size], nil
	}
	return nil, fmt.Errorf("reading %d bytes at %#x: no section holds them", size, addr)
}

func buildID(f *elf.File) string {
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		return ""
	}
	note, err := sec.Data()
	if err != nil || len(note) < 16 {
		return ""
	}
	// Elf64_Nhdr: namesz, descsz, type, then "GNU\0" and the id.
	nameSize := binary.LittleEndian.Uint32(note[0:4])
	descSize := binary.LittleEndian.Uint32(note[4:8])
	start := 12 + (nameSize+3)&^3
	if uint64(start)+uint64(descSize) > uint64(len(note)) {
		return ""
	}
	return hex.EncodeToString(note[start : start+descSize])
}
