//go:build linux

package tracer

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// directMapLimits is what the probes need to read the target's stack
// through the kernel's direct map of physical memory (bpf/stackword.h):
// where physical RAM ends, and which bits of a page-table entry hold a
// physical address. Zeros turn that off, and every read goes through
// bpf_probe_read_user: on a machine with 5-level paging (the probes walk
// four levels), or when /proc does not say (its addresses read as 0
// without CAP_SYS_ADMIN).
func directMapLimits() (top, mask uint64) {
	bits := physAddressBits("/proc/cpuinfo")
	top = ramEnd("/proc/iomem")
	if bits == 0 || top == 0 {
		return 0, 0
	}
	return top, (uint64(1)<<bits - 1) &^ 0xfff
}

// physAddressBits reads the CPU's physical address width (as the kernel
// set it: less the memory-encryption bits when those are on), or 0 when
// the CPU pages with five levels.
func physAddressBits(cpuinfo string) uint {
	f, err := os.Open(cpuinfo)
	if err != nil {
		return 0
	}
	defer f.Close()
	var bits uint
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
			if b, err := strconv.ParseUint(n, 10, 8); err == nil && bits == 0 {
				bits = uint(b)
			}
		}
	}
	return bits
}

// ramEnd is the end of the highest System RAM range in iomem.
func ramEnd(iomem string) uint64 {
	f, err := os.Open(iomem)
	if err != nil {
		return 0
	}
	defer f.Close()
	var end uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		span, name, ok := strings.Cut(line, " : ")
		if !ok || name != "System RAM" || strings.HasPrefix(line, " ") {
			continue
		}
		_, hi, ok := strings.Cut(span, "-")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(hi, 16, 64); err == nil && v+1 > end {
			end = v + 1
		}
	}
	return end
}

// StackReads is how the probes read the traced threads' stacks.
type StackReads struct {
	// DirectMap: through the kernel's direct map; else every read is a
	// bpf_probe_read_user, about twice what a probe hit costs otherwise.
	DirectMap bool
	// Walks counts page-table walks: a thread's first read of a stack
	// page, or one whose page-table entry had changed since.
	Walks uint64
	// Mismatches counts walks whose direct read disagreed with
	// bpf_probe_read_user; the first turned the direct map off.
	Mismatches uint64
}

// StackReads says how the probes have been reading stacks so far.
func (t *Tracer) StackReads() StackReads {
	var base, walks, mismatches uint64
	t.objs.DirectMap.Get(&base)
	t.objs.StackWalks.Get(&walks)
	t.objs.StackMismatches.Get(&mismatches)
	// 0 is not found yet, 1 off (DIRECT_MAP_UNKNOWN, DIRECT_MAP_OFF).
	return StackReads{DirectMap: base > 1, Walks: walks, Mismatches: mismatches}
}
