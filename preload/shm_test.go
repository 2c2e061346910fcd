//go:build linux && amd64

package preload

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/probesite"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/symbolize"
)

// TestShmLayout regenerates the Go side of the shared-memory layout from
// src/shm.h (every macro, every enumerator, every field's offset and size,
// read by the compiler) and holds the committed shm_layout.go to it.
func TestShmLayout(t *testing.T) {
	testenv.Tool(t, "apt-get install -y gcc", "gcc")
	out := filepath.Join(t.TempDir(), "shm_layout.go")
	if b, err := exec.Command("go", "run", "./internal/shmlayout", "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("shmlayout: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("shm_layout.go")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			g, w := "", ""
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("shm_layout.go:%d is not what src/shm.h gives (run make generate):\n have %s\n want %s", i+1, g, w)
			}
		}
	}
	// The probe table's stride is the struct, and the widths writeProbes
	// stores are the fields'.
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"sizeof(struct shm_probe)", shmProbeSize, shmProbeBytes},
		{"vaddr", shmProbeVaddrSize, 8},
		{"index", shmProbeIndexSize, 4},
		{"len", shmProbeLenSize, 1},
		{"disp_at", shmProbeDispAtSize, 1},
		{"header", shmHeaderBytes, shmOffProbes + shmProbes*shmProbeBytes},
		{"a counter slot's ops (at least OP_COUNT)", max(shmSlotOps, int(abi.OpCount)), shmSlotOps},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, Go writes %d", c.name, c.got, c.want)
		}
	}
}

// TestShmProbeTable has the C side read the probe table writeProbes
// writes: each field where the shim looks for it.
func TestShmProbeTable(t *testing.T) {
	code := []byte{0x48, 0x8b, 0x05, 0x10, 0x20, 0x00, 0x00, 0x55} // mov 0x2010(%rip),%rax; push %rbp
	p := &Preload{mem: make([]byte, shmHeaderBytes), opts: source.Options{UserProbes: []string{"first", "second@libtwo.so.1"}}}
	plan := []probesite.Site{
		{UserIdx: -1, Object: "/usr/lib/libc.so.6"},
		{UserIdx: 0, Object: "/bin/prog", Sym: symbolize.Symbol{Mangled: "first", Value: 0x401126}, Code: code[7:]},
		{UserIdx: 1, Object: "/usr/lib/libtwo.so.1", Sym: symbolize.Symbol{Mangled: "second", Value: 0x1a2b3c}, Code: code},
	}
	if err := p.writeProbes(plan, "/bin/prog"); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(t.TempDir(), "header")
	if err := os.WriteFile(mem, p.mem, 0o644); err != nil {
		t.Fatal(err)
	}
	prog := `#include <stdio.h>
#include <stdlib.h>
#include <linux/types.h>
#include "shm.h"
static unsigned char h[SHM_HEADER_BYTES];
int main(int argc, char **argv) {
	FILE *f = fopen(argv[1], "rb");
	if (!f || fread(h, 1, sizeof h, f) != sizeof h)
		return 1;
	__u32 n = *(__u32 *)(h + SHM_OFF_NPROBES);
	printf("%u\n", n);
	for (__u32 i = 0; i < n; i++) {
		struct shm_probe *p = (struct shm_probe *)(h + SHM_OFF_PROBES + i * SHM_PROBE_BYTES);
		printf("[%s] %#llx %u %u %u", p->object, (unsigned long long)p->vaddr, p->index, p->len, p->disp_at);
		for (int k = 0; k < p->len; k++)
			printf(" %02x", p->insn[k]);
		printf("\n");
	}
	return 0;
}
`
	bin := buildAgainstShim(t, "probes", prog)
	b, err := exec.Command(bin, mem).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "2\n[] 0x401126 0 1 0 55\n[libtwo.so.1] 0x1a2b3c 1 7 3 48 8b 05 10 20 00 00\n"
	if string(b) != want {
		t.Errorf("the shim reads the probe table as\n%s\nwant\n%s", b, want)
	}
}

// buildAgainstShim compiles the C program prog with the shim's sources
// and bpf/ on the include path, flags added, and returns the executable.
func buildAgainstShim(t *testing.T, name, prog string, flags ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, name+".c")
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	args := append(append([]string{"-I", "src", "-I", "../bpf"}, flags...), "-o", bin, src)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}
