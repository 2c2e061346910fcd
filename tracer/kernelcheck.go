//go:build linux && amd64

package tracer

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/internal/proc"
)

// kernelFeature is something the BPF programs use that a kernel may
// lack, and the first Linux release that has it.
type kernelFeature struct {
	name  string // as a user looks it up: "bpf_loop", "task storage maps"
	since string // "5.17"
	// probe asks the running kernel: nil when it has the feature,
	// ebpf.ErrNotSupported when it does not, another error when it
	// cannot tell (no privilege to load a probe program).
	probe func() error
}

// helperSince is when each helper the programs call came. A helper the
// programs call that is not here is still checked, with no release to
// name; TestKernelFeaturesCoverPrograms keeps the list whole.
var helperSince = map[asm.BuiltinFunc]string{
	asm.FnMapLookupElem:     "3.19",
	asm.FnMapUpdateElem:     "3.19",
	asm.FnMapDeleteElem:     "3.19",
	asm.FnKtimeGetNs:        "4.1",
	asm.FnGetPrandomU32:     "4.1",
	asm.FnTailCall:          "4.2",
	asm.FnGetCurrentPidTgid: "4.2",
	asm.FnGetCurrentTask:    "4.8",
	asm.FnGetStack:          "4.18",
	asm.FnProbeReadUser:     "5.5",
	asm.FnProbeReadUserStr:  "5.5",
	asm.FnProbeReadKernel:   "5.5",
	asm.FnRingbufOutput:     "5.8",
	asm.FnRingbufReserve:    "5.8",
	asm.FnRingbufSubmit:     "5.8",
	asm.FnRingbufQuery:      "5.8",
	asm.FnGetCurrentTaskBtf: "5.11",
	asm.FnTaskStorageGet:    "5.11",
	asm.FnGetAttachCookie:   "5.15", // on a uprobe's perf event
	asm.FnFindVma:           "5.17",
	asm.FnLoop:              "5.17",
}

// mapTypeSince is when each map type the programs use came.
var mapTypeSince = map[ebpf.MapType]struct{ name, since string }{
	ebpf.Array:        {"arrays", "3.19"},
	ebpf.Hash:         {"hash maps", "3.19"},
	ebpf.ProgramArray: {"program arrays", "4.2"},
	ebpf.PerCPUArray:  {"per-CPU arrays", "4.6"},
	ebpf.LRUHash:      {"LRU hash maps", "4.10"},
	ebpf.RingBuf:      {"the BPF ring buffer", "5.8"},
	ebpf.TaskStorage:  {"task storage maps", "5.11"},
}

// programTypeSince is when each program type the programs are came.
var programTypeSince = map[ebpf.ProgramType]struct{ name, since string }{
	ebpf.Kprobe:        {"BPF programs on uprobes", "4.3"},
	ebpf.RawTracepoint: {"raw tracepoint programs", "4.17"},
}

// optionalKfuncs are the kfuncs the programs declare weak and do
// without: New reads stacks with bpf_probe_read_user without
// bpf_rdonly_cast (Linux 6.2).
var optionalKfuncs = []string{"bpf_rdonly_cast"}

// btfSince: CO-RE and task storage need the kernel's own BTF
// (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF), which Linux 5.4 began
// to publish.
const btfSince = "5.4"

// kernelFeatures lists what loading spec's programs needs: all of them,
// or with syscallsOnly the tracepoints' (syscallObjects). The optional
// features (uprobe_multi links, bpf_rdonly_cast) are not in it: New
// chooses what to do without them.
func kernelFeatures(spec *ebpf.CollectionSpec, syscallsOnly bool) ([]kernelFeature, error) {
	need := []kernelFeature{{name: "the kernel's BTF (/sys/kernel/btf/vmlinux)", since: btfSince, probe: func() error {
		_, err := btf.LoadKernelSpec()
		return err
	}}}
	// Helpers are offered per program type (a raw tracepoint may have one
	// a uprobe lacks): each is asked for each type that calls it.
	type key struct {
		name string
		pt   ebpf.ProgramType
	}
	seen := map[key]bool{}
	add := func(f kernelFeature, pt ebpf.ProgramType) {
		if !seen[key{f.name, pt}] {
			seen[key{f.name, pt}] = true
			need = append(need, f)
		}
	}
	for _, name := range sortedKeys(spec.Maps) {
		mt := spec.Maps[name].Type
		known, ok := mapTypeSince[mt]
		if !ok {
			known.name = mt.String() + " maps"
		}
		add(kernelFeature{name: known.name, since: known.since, probe: func() error { return features.HaveMapType(mt) }}, ebpf.UnspecifiedProgram)
	}
	progs := sortedKeys(spec.Programs)
	if syscallsOnly {
		progs = syscallPrograms()
	}
	for _, name := range progs {
		p := spec.Programs[name]
		if p == nil {
			return nil, fmt.Errorf("no program %s in the BPF objects", name)
		}
		pt := p.Type
		known, ok := programTypeSince[pt]
		if !ok {
			known.name = pt.String() + " programs"
		}
		add(kernelFeature{name: known.name, since: known.since, probe: func() error { return features.HaveProgramType(pt) }}, pt)
		for _, ins := range p.Instructions {
			if !ins.IsBuiltinCall() {
				continue
			}
			fn, err := asm.BuiltinFuncForPlatform("linux", uint32(ins.Constant))
			if err != nil {
				return nil, fmt.Errorf("program %s: %w", name, err)
			}
			add(kernelFeature{name: helperName(fn), since: helperSince[fn], probe: func() error {
				return haveHelper(pt, fn)
			}}, pt)
		}
	}
	return need, nil
}

// haveHelper is features.HaveProgramHelper, with one case it leaves
// open decided. cilium/ebpf rewrites a call of bpf_probe_read_kernel or
// bpf_probe_read_user into bpf_probe_read where its own test finds them
// missing (a kernel before 5.5, or one whose lockdown withdraws them, as
// 6.12's does), so the verifier's refusal of the probe program names
// bpf_probe_read, not the helper asked for, and HaveProgramHelper cannot
// tell. A program that calls nothing else, refused because its type may
// not call the helper, says the kernel lacks it.
func haveHelper(pt ebpf.ProgramType, fn asm.BuiltinFunc) error {
	err := features.HaveProgramHelper(pt, fn)
	var ve *ebpf.VerifierError
	if err == nil || errors.Is(err, ebpf.ErrNotSupported) || !errors.Is(err, unix.EINVAL) || !errors.As(err, &ve) {
		return err
	}
	refused := slices.ContainsFunc(ve.Log, func(l string) bool {
		return strings.Contains(l, "cannot use helper") || strings.Contains(l, "unknown func")
	})
	if refused {
		return fmt.Errorf("%w: %w", ebpf.ErrNotSupported, err)
	}
	return err
}

// helperName is fn as bpf-helpers(7) names it: FnGetCurrentTaskBtf is
// bpf_get_current_task_btf.
func helperName(fn asm.BuiltinFunc) string {
	var b strings.Builder
	b.WriteString("bpf")
	for _, r := range strings.TrimPrefix(fn.String(), "Fn") {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// syscallPrograms names the programs loadObjects loads with
// syscallsOnly: syscallObjects' fields.
func syscallPrograms() []string {
	var names []string
	st := reflect.TypeFor[syscallObjects]()
	for i := range st.NumField() {
		if name := st.Field(i).Tag.Get("ebpf"); name != "" && st.Field(i).Type == reflect.TypeFor[*ebpf.Program]() {
			names = append(names, name)
		}
	}
	return names
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkKernel asks the running kernel, before anything is loaded, for
// every feature spec's programs need (kernelFeatures), and says in one
// line what it lacks: a KernelError naming the missing feature that
// came last, the first release that has it, and this kernel's. A probe
// that cannot tell (no privilege) is no verdict: loading them then says
// what is wrong (classifyLoad).
func checkKernel(spec *ebpf.CollectionSpec, syscallsOnly bool) error {
	need, err := kernelFeatures(spec, syscallsOnly)
	if err != nil {
		return err
	}
	var missing []kernelFeature
	for _, f := range need {
		if err := f.probe(); errors.Is(err, ebpf.ErrNotSupported) {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	// The newest is what a user needs to know: the kernel to get.
	newest := slices.MaxFunc(missing, func(a, b kernelFeature) int { return compareRelease(a.since, b.since) })
	others := map[string]bool{}
	for _, f := range missing {
		if f.name != newest.name {
			others[f.name] = true
		}
	}
	return &KernelError{Missing: missingLine(newest, len(others), cmp.Or(proc.KernelRelease(), "unknown"), lockdownMode()),
		checked: true, err: ebpf.ErrNotSupported}
}

// missingLine says that the eBPF recorder needs f, and why this kernel,
// release, does not offer it: older than f, or withdrawn by its lockdown
// mode (as "confidentiality" withdraws bpf_probe_read_kernel), or built
// without it. others counts the other features it lacks.
func missingLine(f kernelFeature, others int, release, lockdown string) string {
	var b strings.Builder
	b.WriteString("the eBPF recorder needs " + f.name)
	if f.since != "" {
		fmt.Fprintf(&b, " (Linux %s or later)", f.since)
	}
	switch {
	case others == 1:
		b.WriteString(" and 1 other feature")
	case others > 1:
		fmt.Fprintf(&b, " and %d other features", others)
	}
	b.WriteString("; this kernel is " + release)
	switch {
	case f.since == "" || compareRelease(release, f.since) < 0:
	case lockdown != "" && lockdown != "none":
		fmt.Fprintf(&b, ", but its lockdown (%s) withdraws it", lockdown)
	default:
		b.WriteString(", but does not offer it")
	}
	return b.String()
}

// compareRelease compares two kernel releases by major and minor number:
// "5.14.0-362.el9.x86_64" is before "5.17".
func compareRelease(a, b string) int {
	pa, pb := releaseNumbers(a), releaseNumbers(b)
	return slices.Compare(pa[:], pb[:])
}

func releaseNumbers(r string) [2]int {
	var n [2]int
	for i, part := range strings.SplitN(r, ".", 3) {
		if i == len(n) {
			break
		}
		end := strings.IndexFunc(part, func(c rune) bool { return c < '0' || c > '9' })
		if end >= 0 {
			part = part[:end]
		}
		n[i], _ = strconv.Atoi(part)
	}
	return n
}

// lockdownMode is the kernel's lockdown mode ("none", "integrity",
// "confidentiality"), or "" where securityfs does not say.
func lockdownMode() string {
	b, err := os.ReadFile("/sys/kernel/security/lockdown")
	if err != nil {
		return ""
	}
	s := string(b)
	start, end := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if start < 0 || end < start {
		return ""
	}
	return s[start+1 : end]
}
