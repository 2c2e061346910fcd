//go:build linux && amd64

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestAutoWhereEBPFCannotLoad: where the kernel cannot run the eBPF
// recorder (a kfunc, helper or attach type it lacks, or its verifier
// refuses the probes), --recorder ebpf fails with the kernel's reason,
// exit 3 and not the permission status, and auto records with the
// preload recorder alone: the same finding, one line on stderr naming
// what is missing, and the trace header keeping it. Where eBPF loads,
// auto records with preload and the syscall tracepoint, and the header
// says nothing is missing.
//
// The kernel matrix (make test-kernels) runs this inside its VMs a second
// time under lockdown=confidentiality, which withdraws
// bpf_probe_read_kernel from the probes. It sets HOOKTRACE_EXPECT_EBPF to
// "loads" before and "fails" after, so that each branch is the one tested.
// Under lockdown the start-up check finds the helper missing before
// anything loads, and both lines name it and the lockdown.
func TestAutoWhereEBPFCannotLoad(t *testing.T) {
	testenv.RequireBPF(t)
	inversion := testenv.Program(t, "inversion")
	report, _, stderr, code := runJSON(t, "--recorder", "ebpf", "--", inversion)
	const needs = "the eBPF recorder needs " // found before loading
	loads := code != exitFailure ||
		!strings.Contains(stderr, "this kernel cannot run the eBPF recorder") && !strings.Contains(stderr, needs)
	switch expect := os.Getenv("HOOKTRACE_EXPECT_EBPF"); {
	case expect == "fails" && loads:
		t.Fatalf("--recorder ebpf: exit %d, want %d saying the kernel cannot run it:\n%s", code, exitFailure, stderr)
	case expect == "loads" && !loads:
		t.Fatalf("--recorder ebpf: the probes do not load on this kernel:\n%s", stderr)
	}
	if loads {
		if code != exitFindings || len(ofKind(findings(t, report), "lock-order-cycle", "error")) != 1 {
			t.Fatalf("--recorder ebpf: exit %d, findings %v\n%s", code, findings(t, report), stderr)
		}
	} else {
		if strings.Contains(stderr, "not permitted") {
			t.Errorf("--recorder ebpf, as root: the error blames permissions:\n%s", stderr)
		}
		if !strings.Contains(stderr, "the verifier") && !strings.Contains(stderr, "not supported") && !strings.Contains(stderr, needs) {
			t.Errorf("--recorder ebpf: the error does not say what the kernel refused or lacks:\n%s", stderr)
		}
		if lockedDown() && !saysLockdown(stderr, "hooktrace: ", "\n") {
			t.Errorf("--recorder ebpf, locked down: the error does not say, before loading, in one line, that the lockdown withdraws bpf_probe_read_kernel or _user:\n%s", stderr)
		}
	}

	trace := filepath.Join(t.TempDir(), "auto.htr")
	report, _, stderr, code = runJSON(t, "-o", trace, "--", inversion)
	if code != exitFindings || len(ofKind(findings(t, report), "lock-order-cycle", "error")) != 1 {
		t.Fatalf("auto: exit %d, want %d with one lock-order cycle: %v\n%s", code, exitFindings, findings(t, report), stderr)
	}
	_, _, r := readTrace(t, trace)
	h := r.Header()
	const notice = ": recording with the preload recorder alone\n"
	if loads {
		if h.Recorder != "preload+sys_enter" || h.NoEBPF != "" || strings.Contains(stderr, notice) {
			t.Errorf("auto where eBPF loads: recorder %q, no_ebpf %q; stderr:\n%s", h.Recorder, h.NoEBPF, stderr)
		}
		return
	}
	if n := strings.Count(stderr, notice); n != 1 {
		t.Errorf("auto: %d notices that eBPF cannot run, want 1:\n%s", n, stderr)
	}
	if lockedDown() && !saysLockdown(stderr, "hooktrace: warning: ", notice) {
		t.Errorf("auto, locked down: the notice does not say that the lockdown withdraws bpf_probe_read_kernel or _user:\n%s", stderr)
	}
	if h.Recorder != "preload" || h.NoEBPF == "" || !strings.Contains(stderr, h.NoEBPF) {
		t.Errorf("auto: header recorder %q, no_ebpf %q: want preload, and what stderr named as missing:\n%s", h.Recorder, h.NoEBPF, stderr)
	}
	var rep struct {
		Stats struct {
			Traces []struct {
				NoEBPF string `json:"no_ebpf"`
			} `json:"traces"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(report), &rep); err != nil || len(rep.Stats.Traces) != 1 || rep.Stats.Traces[0].NoEBPF != h.NoEBPF {
		t.Errorf("auto: the report's trace does not say what the header does (%q): %+v %v", h.NoEBPF, rep.Stats.Traces, err)
	}
}

// saysLockdown says whether stderr has the line hooktrace writes before
// loading where the kernel's lockdown withdraws bpf_probe_read_kernel and
// bpf_probe_read_user (tracer.checkKernel), between prefix and suffix.
func saysLockdown(stderr, prefix, suffix string) bool {
	const needs = "the eBPF recorder needs bpf_probe_read_"
	tail := "; this kernel is " + proc.KernelRelease() + ", but its lockdown (confidentiality) withdraws it" + suffix
	for l := range strings.Lines(stderr) {
		if strings.HasPrefix(l, prefix+needs) && strings.HasSuffix(l, tail) {
			return true
		}
	}
	return false
}

// lockedDown says whether the kernel is locked down for confidentiality.
func lockedDown() bool {
	b, err := os.ReadFile("/sys/kernel/security/lockdown")
	return err == nil && strings.Contains(string(b), "[confidentiality]")
}
