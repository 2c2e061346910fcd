//go:build linux && amd64

package tracer

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// physAddressMask is what the probes need to read the target's stack
// through the kernel's direct map of physical memory (bpf/stackword.h):
// the bits of a page-table entry that hold a physical address, from the
// CPU's physical address width as the kernel set it (less the
// memory-encryption bits when those are on). 0 turns that off, and every
// read goes through bpf_probe_read_user: on a CPU that pages with five
// levels (the probes walk four), or when /proc/cpuinfo does not say.
func physAddressMask(cpuinfo string) uint64 {
	f, err := os.Open(cpuinfo)
	if err != nil {
		return 0
	}
	defer f.Close()
	var bits uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "flags":
			if strings.Contains(" "+val+" ", " la57 ") {
				return 0
			}
		case "address sizes":
			// "48 bits physical, 48 bits virtual"
			n, _, _ := strings.Cut(strings.TrimSpace(val), " ")
			if b, err := strconv.ParseUint(n, 10, 8); err == nil && bits == 0 && b > 12 && b <= 52 {
				bits = b
			}
		}
	}
	if bits == 0 {
		return 0
	}
	return (uint64(1)<<bits - 1) &^ 0xfff
}

// directMapMask is the tracer's phys_addr_mask for this machine, or 0
// and why the probes must read stacks with bpf_probe_read_user.
func directMapMask(rdonlyCast bool) (uint64, string) {
	if !rdonlyCast {
		return 0, "no bpf_rdonly_cast kfunc: Linux 6.2 added it"
	}
	if mask := physAddressMask("/proc/cpuinfo"); mask != 0 {
		return mask, ""
	}
	return 0, "5-level paging, or no physical address width in /proc/cpuinfo"
}

// haveKfunc says whether the running kernel's BTF has the kfunc name
// (a weak __ksym in bpf/ that the loader leaves unresolved when it does not).
func haveKfunc(name string) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var fn *btf.Func
	return spec.TypeByName(name, &fn) == nil
}

// StackReads is how the probes read the traced threads' stacks.
type StackReads struct {
	// DirectMap: through the kernel's direct map; else every read is a
	// bpf_probe_read_user, about twice what a probe hit costs otherwise.
	DirectMap bool
	// Off: the direct map was looked for and not found, or turned off by
	// a mismatch (neither is true before the first allocator call).
	Off bool
	// Walks counts page-table walks: a thread's first read of a stack
	// page, or one whose page-table entry had changed since.
	Walks uint64
	// Mismatches counts walks whose direct read disagreed with
	// bpf_probe_read_user; the first turned the direct map off.
	Mismatches uint64
}

// StackReadMethod names how the probes read stacks, for the trace's
// footer: "direct map", "bpf_probe_read_user (why)", or "" when no
// allocator call has read one yet.
func (t *Tracer) StackReadMethod() string {
	if t.noDirectMap != "" {
		return "bpf_probe_read_user (" + t.noDirectMap + ")"
	}
	switch r := t.StackReads(); {
	case r.DirectMap:
		return "direct map"
	case r.Mismatches > 0:
		return "bpf_probe_read_user (a direct read disagreed with it)"
	case r.Off:
		return "bpf_probe_read_user (the kernel's direct map was not found)"
	}
	return ""
}

// warnSlowStacks warns when the probes read stacks the slow way.
func (t *Tracer) warnSlowStacks() {
	if m := t.StackReadMethod(); strings.HasPrefix(m, "bpf_probe_read_user") {
		t.opts.Warn("the probes read stacks with " + m + ": every allocator call costs about twice as much")
	}
}

// StackReads says how the probes have been reading stacks so far.
func (t *Tracer) StackReads() StackReads {
	var base, walks, mismatches uint64
	t.objs.DirectMap.Get(&base)
	t.objs.StackWalks.Get(&walks)
	t.objs.StackMismatches.Get(&mismatches)
	// 0 is not found yet, 1 off (DIRECT_MAP_UNKNOWN, DIRECT_MAP_OFF).
	return StackReads{DirectMap: base > 1, Off: base == 1, Walks: walks, Mismatches: mismatches}
}
