//go:build linux && amd64

package placement

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// ownCode returns the live address of CheckLive in this test binary and
// 4 KiB from there on as stored in the executable, found through the
// mapping that holds it (test binaries carry no symbol table).
func ownCode(t *testing.T) (uint64, []byte) {
	t.Helper()
	pc := uint64(reflect.ValueOf(CheckLive).Pointer())
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) != 6 || fields[5] != exe {
			continue
		}
		var start, end, off uint64
		if _, err := fmt.Sscanf(fields[0]+" "+fields[2], "%x-%x %x", &start, &end, &off); err != nil {
			t.Fatalf("parsing maps line %q: %v", line, err)
		}
		if pc < start || pc >= end {
			continue
		}
		f, err := os.Open(exe)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		code := make([]byte, 4096)
		if _, err := f.ReadAt(code, int64(pc-start+off)); err != nil {
			t.Fatalf("reading own executable: %v", err)
		}
		return pc, code
	}
	t.Fatalf("finding CheckLive at %#x in own mappings: missing", pc)
	return 0, nil
}

func TestCheckLiveSelf(t *testing.T) {
	pc, code := ownCode(t)
	pid := os.Getpid()

	if err := CheckLive(pid, pc, code[:32]); err != nil {
		t.Errorf("unchanged code: %v", err)
	}

	altered := bytes.Clone(code[:32])
	altered[5] ^= 0xff
	err := CheckLive(pid, pc, altered)
	if !errors.Is(err, ErrPatched) {
		t.Errorf("altered file bytes: got %v, want ErrPatched", err)
	}
	t.Log(err)

	// A live 0xcc where the "file" has something else is what a uprobe
	// looks like; Go's linker pads between functions with int3 on
	// amd64, so fake the file.
	pad := bytes.IndexByte(code, 0xcc)
	if pad < 0 {
		t.Fatal("no int3 padding within 4 KiB of CheckLive to pose as a breakpoint")
	}
	lo := max(0, pad-8)
	fake := bytes.Clone(code[lo : pad+1])
	fake[len(fake)-1] = 0x90
	err = CheckLive(pid, pc+uint64(lo), fake)
	if !errors.Is(err, ErrBreakpoint) || errors.Is(err, ErrPatched) {
		t.Errorf("int3 over a nop: got %v, want ErrBreakpoint", err)
	}

	if err := CheckLive(pid, 8, []byte{0}); err == nil || errors.Is(err, ErrPatched) {
		t.Errorf("unmapped address: got %v, want a read error", err)
	}
}

// patcherSource patches its own libc madvise entry the way Open MPI and UCX
// hook memory functions, then waits on stdin. Each line read makes it call
// two functions of its own with known first instructions, so a test can
// watch uprobes on them.
const patcherSource = `
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

asm(".text\n"
    ".globl probe_push\n.type probe_push,@function\nprobe_push:\n"
    "  push %rbx\n  pop %rbx\n  ret\n.size probe_push,.-probe_push\n"
    ".globl probe_nop5\n.type probe_nop5,@function\nprobe_nop5:\n"
    "  .byte 0x0f,0x1f,0x44,0x00,0x00\n  ret\n.size probe_nop5,.-probe_nop5\n");
void probe_push(void);
void probe_nop5(void);

static int hook(void *addr, size_t len, int advice) { return 0; }

int main(void) {
	unsigned char *target = dlsym(RTLD_DEFAULT, "madvise");
	if (!target) { fprintf(stderr, "no madvise\n"); return 1; }
	uintptr_t page = (uintptr_t)target & ~(uintptr_t)(getpagesize() - 1);
	size_t span = (uintptr_t)target + 13 - page;
	if (mprotect((void *)page, span, PROT_READ | PROT_WRITE | PROT_EXEC)) { perror("mprotect"); return 1; }
	uint64_t to = (uint64_t)(uintptr_t)&hook;
	target[0] = 0x49; target[1] = 0xbb;                       /* movabs $hook,%r11 */
	memcpy(target + 2, &to, 8);
	target[10] = 0x41; target[11] = 0xff; target[12] = 0xe3; /* jmp *%r11 */
	if (mprotect((void *)page, span, PROT_READ | PROT_EXEC)) { perror("mprotect"); return 1; }
	printf("madvise %p\nprobe_push %p\nprobe_nop5 %p\n", (void *)target, (void *)probe_push, (void *)probe_nop5);
	fflush(stdout);
	char line[16];
	while (fgets(line, sizeof line, stdin)) {
		probe_push();
		probe_nop5();
		probe_nop5();
		puts("called");
		fflush(stdout);
	}
	return 0;
}
`

// patcher is a running patcherSource process.
type patcher struct {
	path  string // its executable
	pid   int
	addrs map[string]uint64 // live addresses it reported
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startPatcher(t *testing.T) *patcher {
	t.Helper()
	bin := testenv.C{Name: "patcher", Code: patcherSource, Flags: []string{"-O1"}}.Build(t)

	cmd := exec.Command(bin)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting patcher: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})

	p := &patcher{path: bin, pid: cmd.Process.Pid, addrs: map[string]uint64{}, stdin: stdin, out: bufio.NewReader(stdout)}
	for range 3 {
		line, err := p.out.ReadString('\n')
		if err != nil {
			t.Fatalf("reading patcher output: %v", err)
		}
		name, hexAddr, _ := strings.Cut(strings.TrimSpace(line), " ")
		addr, err := strconv.ParseUint(strings.TrimPrefix(hexAddr, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("parsing patcher line %q: %v", line, err)
		}
		p.addrs[name] = addr
	}
	return p
}

// call makes the patcher run its probe_ functions once.
func (p *patcher) call(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := p.out.ReadString('\n'); err != nil || line != "called\n" {
		t.Fatalf("waiting for patcher: %q %v", line, err)
	}
}

// liveLibcFunction locates a libc function in process pid the way the
// tracer does: the file offset of its symbol, mapped through /proc/PID/maps.
func liveLibcFunction(t *testing.T, pid int, name string) (addr uint64, code []byte) {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var path string
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 6 && strings.HasPrefix(filepath.Base(fields[5]), "libc.so") {
			path = fields[5]
			break
		}
	}
	if path == "" {
		t.Fatalf("finding libc in pid %d: not mapped", pid)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sym, err := dynamicFunction(f, name)
	if err != nil {
		t.Fatal(err)
	}
	if code, err = symbolCode(f, sym); err != nil {
		t.Fatal(err)
	}
	var fileOffset uint64
	found := false
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_LOAD && prog.Vaddr <= sym.Value && sym.Value < prog.Vaddr+prog.Filesz {
			fileOffset = sym.Value - prog.Vaddr + prog.Off
			found = true
		}
	}
	if !found {
		t.Fatalf("finding %s in libc segments: outside every PT_LOAD", name)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) != 6 || fields[5] != path {
			continue
		}
		var start, end, off uint64
		if _, err := fmt.Sscanf(fields[0]+" "+fields[2], "%x-%x %x", &start, &end, &off); err != nil {
			t.Fatalf("parsing maps line %q: %v", line, err)
		}
		if off <= fileOffset && fileOffset < off+(end-start) {
			return start + fileOffset - off, code
		}
	}
	t.Fatalf("finding %s in pid %d: file offset %#x not mapped", name, pid, fileOffset)
	return 0, nil
}

func TestCheckLivePatchedChild(t *testing.T) {
	p := startPatcher(t)

	addr, code := liveLibcFunction(t, p.pid, "madvise")
	if addr != p.addrs["madvise"] {
		t.Fatalf("madvise located at %#x, the child says %#x", addr, p.addrs["madvise"])
	}
	err := CheckLive(p.pid, addr, code[:16])
	if !errors.Is(err, ErrPatched) {
		t.Fatalf("patched madvise: got %v, want ErrPatched", err)
	}
	t.Log(err)

	addr, code = liveLibcFunction(t, p.pid, "free")
	if err := CheckLive(p.pid, addr, code[:16]); err != nil {
		t.Errorf("untouched free: %v", err)
	}
}

// TestCheckLiveUprobe attaches real uprobes to show how they
// look in /proc/PID/mem: an int3 over the first byte, and for a 5-byte nop,
// after its first hit, a call into [uprobes-trampoline] (Linux 6.18).
func TestCheckLiveUprobe(t *testing.T) {
	testenv.RequireBPF(t)
	p := startPatcher(t)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		t.Fatalf("loading a BPF program: %v", err)
	}
	defer prog.Close()
	exe, err := link.OpenExecutable(p.path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(p.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}

	for _, name := range []string{"probe_push", "probe_nop5"} {
		var code []byte
		for _, s := range syms {
			if s.Name == name {
				if code, err = fileBytes(f, s.Value, s.Size); err != nil {
					t.Fatal(err)
				}
			}
		}
		if code == nil {
			t.Fatalf("finding %s in the patcher: missing", name)
		}
		addr := p.addrs[name]
		probe, err := exe.Uprobe(name, prog, &link.UprobeOptions{PID: p.pid})
		if err != nil {
			t.Fatalf("attaching a uprobe: %v", err)
		}
		p.call(t)
		err = CheckLive(p.pid, addr, code)
		probe.Close()
		t.Logf("%s with a uprobe: %v", name, err)
		if !errors.Is(err, ErrBreakpoint) {
			t.Errorf("%s with a uprobe: got %v, want ErrBreakpoint", name, err)
		}
		if err := CheckLive(p.pid, addr, code); err != nil {
			t.Errorf("%s after detaching: %v", name, err)
		}
	}
}
