//go:build linux && amd64

package tracer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestMissingFeatureLine: what the one line says for a missing feature,
// by why the kernel lacks it.
func TestMissingFeatureLine(t *testing.T) {
	loop := kernelFeature{name: "bpf_loop", since: "5.17"}
	for _, c := range []struct {
		f                 kernelFeature
		others            int
		release, lockdown string
		want              string
	}{
		{loop, 0, "5.14.0-362.8.1.el9_3.x86_64", "",
			"the eBPF recorder needs bpf_loop (Linux 5.17 or later); this kernel is 5.14.0-362.8.1.el9_3.x86_64"},
		{loop, 2, "5.10.0-28-amd64", "none",
			"the eBPF recorder needs bpf_loop (Linux 5.17 or later) and 2 other features; this kernel is 5.10.0-28-amd64"},
		{kernelFeature{name: "bpf_probe_read_kernel", since: "5.5"}, 0, "6.1.0-18-amd64", "confidentiality",
			"the eBPF recorder needs bpf_probe_read_kernel (Linux 5.5 or later); this kernel is 6.1.0-18-amd64, but its lockdown (confidentiality) withdraws it"},
		{kernelFeature{name: "the kernel's BTF (/sys/kernel/btf/vmlinux)", since: "5.4"}, 1, "5.15.0", "none",
			"the eBPF recorder needs the kernel's BTF (/sys/kernel/btf/vmlinux) (Linux 5.4 or later) and 1 other feature; this kernel is 5.15.0, but does not offer it"},
		{kernelFeature{name: "bpf_new_helper"}, 0, "6.18.0", "",
			"the eBPF recorder needs bpf_new_helper; this kernel is 6.18.0"},
	} {
		if got := missingLine(c.f, c.others, c.release, c.lockdown); got != c.want {
			t.Errorf("missingLine(%s, %d, %s, %q):\n got %s\nwant %s", c.f.name, c.others, c.release, c.lockdown, got, c.want)
		}
	}
	err := error(&KernelError{Missing: missingLine(loop, 0, "5.14.0", ""), checked: true, err: ebpf.ErrNotSupported})
	if !errors.Is(err, ErrKernel) || !errors.Is(err, ebpf.ErrNotSupported) || strings.Contains(err.Error(), "\n") {
		t.Errorf("a missing feature's error is not one line of ErrKernel: %q", err)
	}
}

func TestCompareRelease(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"5.14.0-362.el9.x86_64", "5.17", -1},
		{"5.17", "5.17", 0},
		{"6.1.0-18-amd64", "5.17", 1},
		{"6.10", "6.6", 1},
		{"6.12.43+deb12-amd64", "6.12", 0},
	} {
		if got := compareRelease(c.a, c.b); got != c.want {
			t.Errorf("compareRelease(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestKernelFeaturesCoverPrograms: every helper, map type and program
// type the programs in ../bpf use has the release that brought it, every
// kfunc they call is one they can do without, and the README's
// requirements name the newest of them as the eBPF recorder's minimum.
func TestKernelFeaturesCoverPrograms(t *testing.T) {
	spec, err := loadHooktrace()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range spec.Programs {
		for _, ins := range p.Instructions {
			if ins.IsKfuncCall() && !slices.Contains(optionalKfuncs, ins.Reference()) {
				t.Errorf("program %s calls kfunc %s, which checkKernel does not check", p.Name, ins.Reference())
			}
		}
	}
	all, err := kernelFeatures(spec, false)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := kernelFeatures(spec, true)
	if err != nil {
		t.Fatal(err)
	}
	var newest string
	for _, f := range all {
		if f.since == "" {
			t.Errorf("%s: no release says when Linux added it (helperSince, mapTypeSince, programTypeSince)", f.name)
		}
		if newest == "" || compareRelease(f.since, newest) > 0 {
			newest = f.since
		}
	}
	// The programs of each mode are all there: sys_enter reads stacks
	// with bpf_loop too.
	names := func(fs []kernelFeature) []string {
		var n []string
		for _, f := range fs {
			n = append(n, f.name)
		}
		return n
	}
	for _, want := range []string{helperName(asm.FnLoop), "task storage maps", "raw tracepoint programs"} {
		if !slices.Contains(names(sys), want) {
			t.Errorf("the tracepoints alone need %s: %v", want, names(sys))
		}
	}
	if !slices.Contains(names(all), "BPF programs on uprobes") || slices.Contains(names(sys), "BPF programs on uprobes") {
		t.Errorf("uprobe programs: all %v, tracepoints alone %v", names(all), names(sys))
	}
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Linux " + newest + " or later"; !strings.Contains(string(readme), want) {
		t.Errorf("the README's requirements do not say the eBPF recorder needs %q", want)
	}
}

// TestCheckKernelHere: this kernel runs the eBPF recorder, and the check
// says so, for all the programs and for the tracepoints alone.
func TestCheckKernelHere(t *testing.T) {
	testenv.RequireBPF(t)
	spec, err := loadHooktrace()
	if err != nil {
		t.Fatal(err)
	}
	for _, syscallsOnly := range []bool{false, true} {
		if err := checkKernel(spec, syscallsOnly); err != nil {
			t.Errorf("syscallsOnly %v: %v", syscallsOnly, err)
		}
	}
}
