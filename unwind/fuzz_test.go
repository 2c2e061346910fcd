//go:build linux && amd64

package unwind

import (
	"debug/elf"
	"strings"
	"testing"
)

// FuzzCFI feeds arbitrary bytes to the CFI parser, the .eh_frame_hdr search,
// the CFA interpreter, the expression evaluator and a full unwind. Internal
// functions are called directly so that a panic is not hidden by the
// recover at the API boundary.
func FuzzCFI(f *testing.F) {
	// Beyond the checked-in seeds, start from the head of the system libc's
	// .eh_frame, which has every CIE flavour glibc uses.
	if ef, err := elf.Open("/usr/lib/x86_64-linux-gnu/libc.so.6"); err == nil {
		if data, addr, err := sectionData(ef, ".eh_frame"); err == nil && len(data) > 0 {
			f.Add(headRecords(data, 4096), addr, []byte(nil), uint64(0))
		}
		ef.Close()
	}
	f.Fuzz(func(t *testing.T, ehFrame []byte, ehAddr uint64, hdr []byte, hdrAddr uint64) {
		exerciseSection(t, &cfiSection{name: ".eh_frame", data: ehFrame, addr: ehAddr, isEH: true}, hdr, hdrAddr)
		exerciseSection(t, &cfiSection{name: ".debug_frame", data: ehFrame}, nil, 0)
	})
}

// headRecords returns the longest prefix of a CFI section, up to limit
// bytes, that ends on a record boundary.
func headRecords(data []byte, limit int) []byte {
	s := &cfiSection{data: data, isEH: true}
	end := uint64(0)
	for end < uint64(len(data)) {
		e, err := s.readEntry(end)
		if err != nil || e.terminator || e.next > uint64(limit) {
			break
		}
		end = e.next
	}
	return data[:end]
}

func exerciseSection(t *testing.T, s *cfiSection, hdr []byte, hdrAddr uint64) {
	if len(hdr) > 0 {
		s.hdr = parseHdr(hdr, hdrAddr, s.addr)
	}
	if err := s.scan(s.hdr == nil); err != nil {
		return
	}
	var pcs []uint64
	if s.hdr != nil {
		for i := 0; i < s.hdr.count && i < 64; i++ {
			if loc, _, ok := s.hdr.pair(i); ok {
				pcs = append(pcs, loc)
			}
		}
	}
	for i, ref := range s.index {
		if i >= 64 {
			break
		}
		pcs = append(pcs, ref.begin, ref.begin+(ref.end-ref.begin)/2, ref.end-1)
	}
	// A stack built from the section itself gives the expression evaluator
	// and register recovery arbitrary but deterministic memory.
	mem := stackMemory{base: 0x7ff000, data: s.data[:min(len(s.data), 512)]}
	for _, pc := range pcs {
		f, err := s.find(pc)
		if err != nil {
			continue
		}
		var r row
		if err := computeRow(&f, pc, &r); err != nil {
			continue
		}
		var regs frameRegs
		regs.set(regRIP, pc)
		regs.set(regRSP, mem.base)
		regs.set(regRBP, mem.base+16)
		stepCFI(&regs, &r, mem, 0)
	}
	if len(pcs) > 0 {
		obj := &Object{name: "fuzz", ehFrame: s}
		resolve := func(uint64) (*Object, uint64, bool) { return obj, 0, true }
		_, reason := Unwind(Sample{IP: pcs[0], SP: mem.base, BP: mem.base + 16, Stack: mem.data}, resolve)
		if strings.HasPrefix(reason, "internal error") {
			t.Fatal(reason)
		}
	}
}
