//go:build linux && amd64

package tracer

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestVerifierRejectionIsKernel: a program the verifier refuses, loaded
// as root, is the kernel's refusal (ErrKernel, with the verifier's
// reason and last lines), not a permission error, although the kernel
// answers EACCES. Debian's 6.12 refused the probes so, and hooktrace told
// root to run as root.
func TestVerifierRejectionIsKernel(t *testing.T) {
	testenv.RequireBPF(t)
	// bpf_probe_read_user(buf, size, src) with a size that may be
	// negative: the rejection 6.12 gave the probes.
	insns := asm.Instructions{
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Reg(asm.R2, asm.R0),
		asm.And.Imm(asm.R2, 15),
		asm.Sub.Imm(asm.R2, 8),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -16),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnProbeReadUser.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "negative_size", Type: ebpf.Kprobe, License: "GPL", Instructions: insns})
	if err == nil {
		prog.Close()
		t.Fatal("the verifier accepted a read of a possibly negative size")
	}
	err = classifyLoad(err)
	if errors.Is(err, ErrPermission) {
		t.Fatalf("a verifier rejection, loaded with every privilege, reads as a permission error: %v", err)
	}
	var kerr *KernelError
	if !errors.As(err, &kerr) || !errors.Is(err, ErrKernel) {
		t.Fatalf("not a KernelError: %v", err)
	}
	if !strings.Contains(kerr.Missing, "the verifier rejects") || !strings.Contains(kerr.Missing, "R2") {
		t.Errorf("Missing does not give the verifier's reason: %q", kerr.Missing)
	}
	if len(kerr.Log) == 0 || len(kerr.Log) > verifierTail {
		t.Errorf("the verifier's last lines: %d of them, want 1 to %d", len(kerr.Log), verifierTail)
	}
	t.Logf("%v", err)
	if strings.Contains(err.Error(), "not permitted") {
		t.Errorf("the message blames permissions: %v", err)
	}
}
