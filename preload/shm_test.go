//go:build linux && amd64

package preload

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestShmLayout compiles a program against the shim's header and checks
// that Go's copy of the shared-memory layout says the same.
func TestShmLayout(t *testing.T) {
	prog := `#include <stdio.h>
#include <stddef.h>
#include <linux/types.h>
#include "shm.h"
int main(void) {
	printf("%llu %d %s %s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %zu %zu %zu\n",
		SHM_MAGIC, SHM_VERSION, SHM_ENV, SHM_NAME_ENV, SHM_OFF_ID, SHM_SLOTS, SHM_SLOT_OPS,
		SHM_OFF_MAGIC, SHM_OFF_VERSION, SHM_OFF_TRACED, SHM_OFF_FLAGS, SHM_OFF_DATA_SIZE,
		SHM_OFF_DATA, SHM_OFF_HEAD, SHM_OFF_TAIL, SHM_OFF_LOST, SHM_OFF_SHARED, SHM_OFF_SLOTS,
		SHM_HEADER_BYTES, SHM_REC_HDR, SHM_KIND_PAD, SHM_F_FULL, SHM_F_FOLLOW, SHM_F_SAMPLES, SHM_F_SYSCALLS, SHM_F_DETACHED,
		SHM_OFF_NPROBES, SHM_OFF_PROBES, SHM_PROBES, SHM_PROBE_BYTES,
		offsetof(struct shm_probe, vaddr), offsetof(struct shm_probe, insn), sizeof(struct shm_probe));
	return 0;
}
`
	bin := buildAgainstShim(t, "layout", prog)
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d %d %s %s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d",
		uint64(shmMagic), shmVersion, shmEnv, shmNameEnv, shmOffID, shmSlots, shmSlotOps,
		shmOffMagic, shmOffVersion, shmOffTraced, shmOffFlags, shmOffSize,
		shmOffData, shmOffHead, shmOffTail, shmOffLost, shmOffShared, shmOffSlots,
		shmHeader, shmRecHdr, shmKindPad, shmFFull, shmFFollow, shmFSamples, shmFSyscalls, shmFDetached,
		shmOffNProbes, shmOffProbes, shmProbes, shmProbeBytes, 80, 96, shmProbeBytes)
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("C layout:\n  %s\nGo layout:\n  %s", got, want)
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
