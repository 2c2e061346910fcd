//go:build linux && amd64

package placement

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// Some functions have no instruction the kernel emulates before they
// return: glibc 2.36's pthread_rwlock_destroy and pthread_spin_destroy are
// `xor %eax,%eax; ret`, pthread_spin_init (pthread_spin_unlock) stores and
// returns. Every hit on their entry is single-stepped out of line, ten to
// twenty times the cost of an emulated one. Their callers reach them with a
// `call rel32` (or a tail call's `jmp rel32`) to a PLT stub, which the
// kernel does emulate: probing the calls instead of the entry costs an
// emulated hit per call. At a call the arguments are already in their
// registers and the caller's frame is current; only the return address is
// not on the stack yet: it is the address after the call. A tail call's
// jmp leaves the stack as the entry finds it.
//
// Only calls through the PLT are seen this way, the very calls a preloaded
// library interposes: a call through a pointer to the function, or from
// inside the object that defines it, is not. CallSites reports an object
// that lets the function's address escape (loads its GOT slot, or takes
// the address of its stub), so that the caller can keep the entry probe.

// CallSite is one call of an imported function through its PLT stub (or
// through its GOT slot, as code built with -fno-plt calls).
type CallSite struct {
	Symbol string
	Addr   uint64 // the instruction's virtual address in the object
	Len    int    // its length: the return address is Addr+Len
	// Tail: a jmp, which leaves the caller's return address on the stack
	// as the function's entry would find it.
	Tail bool
	// Emulated: the kernel emulates the instruction (call/jmp rel32);
	// an indirect call through the GOT is single-stepped, as the entry is.
	Emulated    bool
	Instruction string
}

// Imports is what CallSites found in one object for each name it imports.
type Imports struct {
	Sites []CallSite
	// Escapes says, for a name whose address the object can pass around
	// (so that calls through a pointer would be missed), how; absent for
	// the others.
	Escapes map[string]string
}

// CallSites finds, in f, every call of the functions in names that goes
// through f's PLT or GOT. Objects that import none of names are not
// decoded. The executable sections are decoded instruction by
// instruction, restarting at every function symbol, so a site is always
// the start of an instruction.
func CallSites(f *elf.File, names []string) (Imports, error) {
	return callSites(f, names, false)
}

// callSites is CallSites, decoding only the candidates' functions, or,
// with whole, the whole executable sections (what the search must match).
func callSites(f *elf.File, names []string, whole bool) (Imports, error) {
	imp := Imports{Escapes: map[string]string{}}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	slots, err := importSlots(f, want, imp.Escapes)
	if err != nil || (len(slots) == 0 && len(imp.Escapes) == 0) {
		return imp, err
	}
	// A non-PIC executable that takes an imported function's address
	// makes its stub the function's address for the whole process: its
	// dynamic symbol is undefined but has a value.
	if dyn, err := f.DynamicSymbols(); err == nil {
		for _, s := range dyn {
			if want[symName(s.Name)] && s.Section == elf.SHN_UNDEF && s.Value != 0 && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				imp.Escapes[symName(s.Name)] = fmt.Sprintf("its PLT stub at %#x is the function's address", s.Value)
			}
		}
	}
	stubs := pltStubs(f, slots)
	starts := functionStarts(f)
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_EXECINSTR == 0 || isPLT(sec.Name) {
			continue
		}
		code, err := sec.Data()
		if err != nil {
			return imp, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		ranges := [][2]int{{0, len(code)}}
		if !whole {
			ranges = candidates(code, sec.Addr, starts, stubs, slots)
		}
		for _, r := range ranges {
			scanSection(code, sec.Addr, r[0], r[1], starts, stubs, slots, &imp)
		}
	}
	return imp, nil
}

// candidates finds the functions of code, loaded at base, that may refer
// to the stubs or slots: where 4 bytes, read as an instruction's
// displacement (rip-relative, followed by up to 4 bytes of immediate, or
// absolute), lead to one, or a byte read as a short jump's does. Decoding only those functions reads a large
// library's code in a fraction of the time (node's 90 MB: 1.5 s whole).
// It returns [from, to) offsets of code, in order.
func candidates(code []byte, base uint64, starts []uint64, stubs, slots map[uint64]string) [][2]int {
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, m := range []map[uint64]string{stubs, slots} {
		for a := range m {
			lo, hi = min(lo, a), max(hi, a+1)
		}
	}
	if lo >= hi {
		return nil
	}
	hit := func(t uint64) bool { return t >= lo && t < hi && (stubs[t] != "" || slots[t] != "") }
	var ranges [][2]int
	done := 0 // code before this is in a range already
	for i := 0; i+4 <= len(code); i++ {
		if i < done {
			continue
		}
		at := base + uint64(i)
		// A short jump's 1-byte displacement, near the stubs.
		near := at+130 >= lo && at < hi+130 && hit(at+2+uint64(int64(int8(code[i+1]))))
		v := uint64(int64(int32(binary.LittleEndian.Uint32(code[i:]))))
		next := at + v // + 4 to 8: the instruction's end
		if !near && (next+4 >= hi || next+8 < lo) && (v < lo || v >= hi) {
			continue
		}
		if !near && !hit(next+4) && !hit(next+5) && !hit(next+6) && !hit(next+8) && !hit(v) {
			continue
		}
		// The function holding these bytes, from its first instruction.
		k := sort.Search(len(starts), func(j int) bool { return starts[j] > base+uint64(i) })
		from, to := 0, len(code)
		if k > 0 && starts[k-1] >= base {
			from = int(starts[k-1] - base)
		}
		if k < len(starts) && starts[k]-base < uint64(len(code)) {
			to = int(starts[k] - base)
		}
		from = max(from, done)
		ranges = append(ranges, [2]int{from, to})
		done = to
	}
	return ranges
}

// symName drops a symbol version ("pthread_spin_init@GLIBC_2.34").
func symName(s string) string {
	name, _, _ := strings.Cut(s, "@")
	return name
}

func isPLT(name string) bool {
	return name == ".plt" || name == ".plt.sec" || name == ".plt.got" || name == ".iplt"
}

// importSlots maps the GOT slots the dynamic relocations fill with the
// address of a function in want (JUMP_SLOT: a PLT stub's; GLOB_DAT: an
// address the code loads) to its name. A relocation of another kind
// stores the address in data (a table of function pointers): escapes
// says so.
func importSlots(f *elf.File, want map[string]bool, escapes map[string]string) (map[uint64]string, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, nil
	}
	dyn, err := f.DynamicSymbols()
	if err != nil {
		return nil, nil // nothing is imported
	}
	slots := map[uint64]string{}
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_RELA || int(sec.Link) >= len(f.Sections) || f.Sections[sec.Link].Type != elf.SHT_DYNSYM {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		for i := 0; i+24 <= len(data); i += 24 {
			off := binary.LittleEndian.Uint64(data[i:])
			info := binary.LittleEndian.Uint64(data[i+8:])
			typ, sym := elf.R_X86_64(info&0xffffffff), info>>32
			if sym == 0 || sym > uint64(len(dyn)) {
				continue
			}
			name := symName(dyn[sym-1].Name)
			switch {
			case !want[name]:
			case typ == elf.R_X86_64_JMP_SLOT || typ == elf.R_X86_64_GLOB_DAT:
				slots[off] = name
			default:
				escapes[name] = fmt.Sprintf("a %s relocation stores its address at %#x", typ, off)
			}
		}
	}
	return slots, nil
}

// pltStubs finds the PLT stubs that jump through the slots: the address a
// call lands on (the stub's endbr64, where it has one) to the name.
func pltStubs(f *elf.File, slots map[uint64]string) map[uint64]string {
	stubs := map[uint64]string{}
	for _, sec := range f.Sections {
		if !isPLT(sec.Name) || sec.Type != elf.SHT_PROGBITS {
			continue
		}
		code, err := sec.Data()
		if err != nil {
			continue
		}
		start := -1 // an endbr64 just before
		for off := 0; off < len(code); {
			in, err := decodeAt(code, off)
			if err != nil {
				off++
				start = -1
				continue
			}
			if in.mnemonic == "endbr64" {
				start = off
			} else if slot, ok := ripSlot(in.inst, sec.Addr+uint64(off)); ok && in.inst.Op == x86asm.JMP {
				if name, ok := slots[slot]; ok {
					at := off
					if start >= 0 {
						at = start
					}
					stubs[sec.Addr+uint64(at)] = name
				}
				start = -1
			} else if in.mnemonic != "nop" {
				start = -1
			}
			off += in.length
		}
	}
	return stubs
}

// ripSlot is the address a rip-relative (or, in non-PIC code, absolute)
// memory operand of inst at addr refers to.
func ripSlot(inst x86asm.Inst, addr uint64) (uint64, bool) {
	for _, a := range inst.Args {
		m, ok := a.(x86asm.Mem)
		if !ok {
			continue
		}
		switch {
		case m.Base == x86asm.RIP && m.Index == 0:
			return addr + uint64(inst.Len) + uint64(m.Disp), true
		case m.Base == 0 && m.Index == 0 && m.Segment == 0 && m.Disp > 0:
			return uint64(m.Disp), true
		}
	}
	return 0, false
}

// functionStarts lists the function symbols' addresses, sorted: decoding
// restarts at each, so bytes between functions that are not code cannot
// put it out of step for long.
func functionStarts(f *elf.File) []uint64 {
	var starts []uint64
	for _, get := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := get()
		if err != nil {
			continue
		}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 && s.Section != elf.SHN_UNDEF {
				starts = append(starts, s.Value)
			}
		}
	}
	slices.Sort(starts)
	return slices.Compact(starts)
}

// scanSection decodes code, loaded at base, from offset from to offset
// to, and adds the calls of the stubs and slots to imp, and the ways their
// names escape. It decodes without the text decodeAt renders.
func scanSection(code []byte, base uint64, from, to int, starts []uint64, stubs, slots map[uint64]string, imp *Imports) {
	next := sort.Search(len(starts), func(i int) bool { return starts[i] > base+uint64(from) })
	end := base + uint64(len(code))
	for off := from; off < to; {
		addr := base + uint64(off)
		for next < len(starts) && starts[next] <= addr {
			next++
		}
		if _, ok := endbr(code[off:]); ok {
			off += 4
			continue
		}
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil || inst.Len == 0 {
			off++ // not code: padding, data
			continue
		}
		if next < len(starts) && starts[next] < addr+uint64(inst.Len) && starts[next] < end {
			// The instruction would run into a function's first byte:
			// the decoding was out of step.
			off = int(starts[next] - base)
			continue
		}
		off += inst.Len
		name, direct := "", false
		for _, a := range inst.Args {
			if rel, ok := a.(x86asm.Rel); ok {
				name, direct = stubs[addr+uint64(inst.Len)+uint64(int64(rel))], true
			}
		}
		target, viaSlot := ripSlot(inst, addr)
		switch {
		case name != "":
		case viaSlot && slots[target] != "":
			name = slots[target]
		case viaSlot && stubs[target] != "":
			imp.Escapes[stubs[target]] = fmt.Sprintf("the instruction at %#x takes its stub's address", addr)
			continue
		default:
			continue
		}
		raw := code[off-inst.Len : off]
		enc := splitEncoding(raw)
		switch {
		case inst.Op != x86asm.CALL && inst.Op != x86asm.JMP && direct:
			// A conditional tail call would fire the probe whether or
			// not it jumps.
			imp.Escapes[name] = fmt.Sprintf("the branch at %#x jumps to its stub conditionally", addr)
		case inst.Op != x86asm.CALL && inst.Op != x86asm.JMP:
			imp.Escapes[name] = fmt.Sprintf("the instruction at %#x loads its address", addr)
		case refusedByKernel(enc) != "":
			imp.Escapes[name] = fmt.Sprintf("its call at %#x cannot be probed: %s", addr, refusedByKernel(enc))
		default:
			how := "call"
			if inst.Op == x86asm.JMP {
				how = "jmp"
			}
			if direct {
				how += " " + name + "@plt"
			} else {
				how += " *" + name + "@got"
			}
			imp.Sites = append(imp.Sites, CallSite{Symbol: name, Addr: addr, Len: inst.Len, Tail: inst.Op == x86asm.JMP,
				Emulated: emulatedByKernel(enc), Instruction: how})
		}
	}
}
