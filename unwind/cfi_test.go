//go:build linux && amd64

package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// systemObjects are real, optimised x86-64 objects to check the parser
// against; those missing on a machine are skipped.
var systemObjects = []string{
	"/usr/lib/x86_64-linux-gnu/libc.so.6",
	"/usr/lib/x86_64-linux-gnu/libm.so.6",
	"/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
	"/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
	"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
	"/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
}

func existingSystemObjects(t *testing.T) []string {
	var out []string
	for _, p := range systemObjects {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		testenv.Unavailable(t, "none of the system libraries %v", systemObjects)
	}
	return out
}

// readelfRegs maps readelf's x86-64 register names to DWARF columns.
var readelfRegs = map[string]int{
	"rax": 0, "rdx": 1, "rcx": 2, "rbx": 3, "rsi": 4, "rdi": 5, "rbp": 6, "rsp": 7,
	"r8": 8, "r9": 9, "r10": 10, "r11": 11, "r12": 12, "r13": 13, "r14": 14, "r15": 15,
	"rip": 16, "ra": 16,
}

var readelfRegNames = func() map[uint64]string {
	m := map[uint64]string{}
	for name, col := range readelfRegs {
		if name != "ra" {
			m[uint64(col)] = name
		}
	}
	return m
}()

// formatCFA and formatRule print rules the way `readelf -wF` does.
func formatCFA(c cfaRule) string {
	if c.expr != nil {
		return "exp"
	}
	return fmt.Sprintf("%s%+d", readelfRegNames[c.reg], c.offset)
}

func formatRule(r regRule) string {
	switch r.kind {
	case ruleUnspecified, ruleUndefined:
		return "u"
	case ruleSameValue:
		return "s"
	case ruleOffset:
		return fmt.Sprintf("c%+d", r.offset)
	case ruleValOffset:
		return fmt.Sprintf("v%+d", r.offset)
	case ruleRegister:
		return fmt.Sprintf("r%d (%s)", r.reg, readelfRegNames[uint64(r.reg)])
	case ruleExpression:
		return "exp"
	case ruleValExpression:
		return "vexp"
	}
	return "?"
}

var (
	readelfFDE   = regexp.MustCompile(`^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=[0-9a-f]+ pc=([0-9a-f]+)\.\.([0-9a-f]+)`)
	readelfRow   = regexp.MustCompile(`^([0-9a-f]{8,16}) (.*)$`)
	readelfField = regexp.MustCompile(`r\d+ \(\w+\)|\S+`)
)

// TestRowsMatchReadelf checks every row of every FDE against the table
// binutils computes, for the capture binary and the system libraries. This
// exercises CIE/FDE parsing, the .eh_frame_hdr lookup and the interpreter on
// everything gcc, clang-built and hand-written glibc assembly emit.
func TestRowsMatchReadelf(t *testing.T) {
	testenv.Tool(t, "apt-get install -y binutils", "readelf")
	paths := append([]string{buildCapture(t)}, existingSystemObjects(t)...)
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			obj, err := openPath(path)
			if err != nil {
				t.Fatal(err)
			}
			// readelf exits 1 on some distribution libraries after printing
			// the full table (it cannot follow .gnu_debuglink), so judge by
			// the output.
			out, err := exec.Command("readelf", "-wF", path).Output()
			if !bytes.Contains(out, []byte(" FDE ")) {
				t.Fatalf("readelf printed no FDEs: %v", err)
			}
			rows, fdes := compareWithReadelf(t, obj, out)
			t.Logf("%d FDEs, %d rows agree", fdes, rows)
			if rows == 0 {
				t.Fatal("no rows compared")
			}
		})
	}
}

func compareWithReadelf(t *testing.T, obj *Object, out []byte) (rows, fdes int) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	inFDE := false
	var columns []string
	var begin uint64
	failures := 0
	for sc.Scan() {
		line := sc.Text()
		if m := readelfFDE.FindStringSubmatch(line); m != nil {
			inFDE, columns = true, nil
			begin, _ = strconv.ParseUint(m[1], 16, 64)
			fdes++
			if _, err := obj.ehFrame.find(begin); err != nil {
				t.Errorf("FDE at 0x%x not found: %v", begin, err)
			}
			continue
		}
		if strings.TrimSpace(line) == "" || strings.Contains(line, " CIE ") {
			inFDE = false
			continue
		}
		if !inFDE {
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "LOC" && f[1] == "CFA" {
			columns = f[2:]
			continue
		}
		m := readelfRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		loc, _ := strconv.ParseUint(m[1], 16, 64)
		fields := readelfField.FindAllString(m[2], -1)
		if len(fields) != len(columns)+1 {
			t.Fatalf("cannot split readelf row %q into columns %q", line, columns)
		}
		var r row
		if err := obj.ruleAt(loc, &r); err != nil {
			t.Errorf("0x%x: %v", loc, err)
			failures++
			continue
		}
		got := []string{formatCFA(r.cfa)}
		for _, name := range columns {
			col, ok := readelfRegs[name]
			if !ok {
				got = append(got, "?") // vector registers are not tracked
				continue
			}
			got = append(got, formatRule(r.regs[col]))
		}
		for i := range fields {
			if got[i] != "?" && got[i] != fields[i] {
				t.Errorf("0x%x (FDE at 0x%x): got %q, readelf %q", loc, begin, got, fields)
				failures++
				break
			}
		}
		if failures > 20 {
			t.Fatal("too many mismatches")
		}
		rows++
	}
	return rows, fdes
}

// TestHeaderTableMatchesIndex checks the in-place .eh_frame_hdr search
// against the index built by scanning, for every FDE boundary.
func TestHeaderTableMatchesIndex(t *testing.T) {
	for _, path := range existingSystemObjects(t) {
		obj, err := openPath(path)
		if err != nil {
			t.Fatal(err)
		}
		withHdr := obj.ehFrame
		if withHdr.hdr == nil {
			t.Fatalf("%s: .eh_frame_hdr not used", path)
		}
		scanned := &cfiSection{name: withHdr.name, data: withHdr.data, addr: withHdr.addr, isEH: true}
		if err := scanned.scan(true); err != nil {
			t.Fatal(err)
		}
		if len(scanned.index) != withHdr.hdr.count {
			t.Errorf("%s: scan found %d FDEs, header lists %d", path, len(scanned.index), withHdr.hdr.count)
		}
		for _, ref := range scanned.index {
			for _, pc := range []uint64{ref.begin - 1, ref.begin, (ref.begin + ref.end) / 2, ref.end - 1, ref.end} {
				a, errA := withHdr.find(pc)
				b, errB := scanned.find(pc)
				if (errA == nil) != (errB == nil) || a.begin != b.begin || a.end != b.end {
					t.Fatalf("%s: pc 0x%x: header lookup %+v/%v, index lookup %+v/%v", path, pc, a, errA, b, errB)
				}
			}
		}
	}
}

// cfiBuilder assembles a .eh_frame section for hand-written cases.
type cfiBuilder struct {
	buf  []byte
	addr uint64
}

func (b *cfiBuilder) record(body []byte) int {
	off := len(b.buf)
	b.buf = appendU32(b.buf, uint32(len(body)))
	b.buf = append(b.buf, body...)
	return off
}

func appendU32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

// cie adds a "zR" CIE with pc-relative sdata4 FDE pointers, x86-64 factors
// and the given initial instructions.
func (b *cfiBuilder) cie(initial ...byte) int {
	body := appendU32(nil, 0)
	body = append(body, 1, 'z', 'R', 0, 1, 0x78, 16, 1, peSData4|pePCRel)
	return b.record(append(body, initial...))
}

// fde adds an FDE for [begin, begin+size) using the CIE at cieOff.
func (b *cfiBuilder) fde(cieOff int, begin uint64, size uint32, program ...byte) {
	idPos := len(b.buf) + 4
	body := appendU32(nil, uint32(idPos-cieOff))
	fieldAddr := b.addr + uint64(idPos) + 4
	body = appendU32(body, uint32(int32(int64(begin)-int64(fieldAddr))))
	body = appendU32(body, size)
	body = append(body, 0) // no augmentation data
	b.record(append(body, program...))
}

func (b *cfiBuilder) section(t *testing.T) *cfiSection {
	t.Helper()
	s := &cfiSection{name: ".eh_frame", data: b.buf, addr: b.addr, isEH: true}
	if err := s.scan(true); err != nil {
		t.Fatal(err)
	}
	return s
}

func rowAt(t *testing.T, s *cfiSection, pc uint64) row {
	t.Helper()
	f, err := s.find(pc)
	if err != nil {
		t.Fatalf("pc 0x%x: %v", pc, err)
	}
	var r row
	if err := computeRow(&f, pc, &r); err != nil {
		t.Fatalf("pc 0x%x: %v", pc, err)
	}
	return r
}

// standardCIE is what gcc emits: CFA = rsp+8, return address at CFA-8.
var standardCIE = []byte{cfaDefCFA, regRSP, 8, cfaOffset | regRIP, 1}

func TestInterpreter(t *testing.T) {
	b := cfiBuilder{addr: 0x2000}
	c := b.cie(standardCIE...)
	b.fde(c, 0x1000, 0x40,
		cfaAdvanceLoc|1, cfaDefCFAOffset, 16, cfaOffset|regRBP, 2, // push %rbp
		cfaAdvanceLoc|3, cfaDefCFARegister, regRBP, // mov %rsp,%rbp
		cfaAdvanceLoc|4, cfaRememberState,
		cfaAdvanceLoc1, 8, cfaDefCFA, regRSP, 8, cfaRestore|regRBP, // leave; ret
		cfaAdvanceLoc2, 2, 0, cfaRestoreState,
		cfaAdvanceLoc|1, cfaOffsetExtendedSF, regRBX, 3, // rbx at CFA-24
		cfaUndefined, regR12, cfaSameValue, regR15,
		cfaAdvanceLoc|1, cfaDefCFASF, regRSP, 0x7c, // rsp+32
		cfaAdvanceLoc|1, cfaDefCFAOffsetSF, 0x7e, // rsp+16
		cfaAdvanceLoc|1, cfaRegister, regRBX, 5, cfaValOffset, 14, 1,
		cfaGNUArgsSize, 16, cfaNop,
	)
	b.buf = appendU32(b.buf, 0) // terminator
	s := b.section(t)

	tests := []struct {
		pc   uint64
		want string
	}{
		{0x1000, "rsp+8 rbp=u ra=c-8"},
		{0x1001, "rsp+16 rbp=c-16 ra=c-8"},
		{0x1003, "rsp+16 rbp=c-16 ra=c-8"},
		{0x1004, "rbp+16 rbp=c-16 ra=c-8"},
		{0x1008, "rbp+16 rbp=c-16 ra=c-8"},
		{0x1010, "rsp+8 rbp=u ra=c-8"},
		{0x1012, "rbp+16 rbp=c-16 ra=c-8"},
		{0x1013, "rbp+16 rbp=c-16 rbx=c-24 r12=u r15=s ra=c-8"},
		{0x1014, "rsp+32 rbp=c-16 rbx=c-24 r12=u r15=s ra=c-8"},
		{0x1015, "rsp+16 rbp=c-16 rbx=c-24 r12=u r15=s ra=c-8"},
		{0x103f, "rsp+16 rbp=c-16 rbx=r5 (rdi) r12=u r14=v-8 r15=s ra=c-8"},
	}
	for _, tt := range tests {
		r := rowAt(t, s, tt.pc)
		got := formatCFA(r.cfa)
		for _, col := range []int{regRBP, regRBX, regR12, 14, regR15, regRIP} {
			if col != regRBP && col != regRIP && r.regs[col].kind == ruleUnspecified {
				continue
			}
			name := readelfRegNames[uint64(col)]
			if col == regRIP {
				name = "ra"
			}
			got += " " + name + "=" + formatRule(r.regs[col])
		}
		if got != tt.want {
			t.Errorf("pc 0x%x: got %q, want %q", tt.pc, got, tt.want)
		}
	}
	if _, err := s.find(0x1040); err != errNoFDE {
		t.Errorf("pc past the FDE: err = %v, want errNoFDE", err)
	}
}

// The PLT's CFA depends on where in a 16-byte PLT entry the pc is: after the
// entry's push the CFA is 8 bytes further away.
func TestPLTExpression(t *testing.T) {
	b := cfiBuilder{addr: 0x3000}
	c := b.cie(standardCIE...)
	plt := []byte{
		opBreg0 + regRSP, 8, opBreg0 + regRIP, 0, opLit0 + 15, opAnd, opLit0 + 11, opGe,
		opLit0 + 3, opShl, opPlus,
	}
	b.fde(c, 0x1020, 0x40, append([]byte{cfaDefCFAExpression, byte(len(plt))}, plt...)...)
	s := b.section(t)
	const sp = 0x7fff0000
	for _, tt := range []struct{ pc, cfa uint64 }{
		{0x1020, sp + 8}, {0x1026, sp + 8}, {0x102a, sp + 8}, {0x102b, sp + 16}, {0x102f, sp + 16}, {0x1030, sp + 8},
	} {
		r := rowAt(t, s, tt.pc)
		var regs frameRegs
		regs.set(regRSP, sp)
		regs.set(regRIP, tt.pc)
		cfa, err := computeCFA(&r.cfa, &regs, stackMemory{})
		if err != nil || cfa != tt.cfa {
			t.Errorf("pc 0x%x: CFA 0x%x, %v; want 0x%x", tt.pc, cfa, err, tt.cfa)
		}
	}
}

// Stack realignment (gcc's main with aligned locals) saves the CFA in the
// frame and describes it with expressions.
func TestRealignExpressions(t *testing.T) {
	b := cfiBuilder{addr: 0x3000}
	c := b.cie(standardCIE...)
	b.fde(c, 0x1000, 0x40,
		cfaDefCFAExpression, 3, opBreg0+regRBP, 0x78, opDeref, // CFA = *(rbp-8)
		cfaExpression, regRBP, 2, opBreg0+regRBP, 0, // rbp saved at rbp+0
	)
	s := b.section(t)
	const sp = 0x7fff0000
	stack := make([]byte, 256)
	put := func(addr, v uint64) {
		for i := 0; i < 8; i++ {
			stack[addr-sp+uint64(i)] = byte(v >> (8 * i))
		}
	}
	bp := uint64(sp + 0x40)
	cfa := uint64(sp + 0x80)
	put(bp-8, cfa)
	put(bp, 0x1234)      // caller's rbp
	put(cfa-8, 0x401000) // return address
	r := rowAt(t, s, 0x1010)
	var regs frameRegs
	regs.set(regRSP, sp)
	regs.set(regRBP, bp)
	regs.set(regRIP, 0x1010)
	next, stop := stepCFI(&regs, &r, stackMemory{base: sp, data: stack}, 0)
	if stop != "" {
		t.Fatal(stop)
	}
	if next.val[regRSP] != cfa || next.val[regRBP] != 0x1234 || next.val[regRIP] != 0x401000 {
		t.Fatalf("caller rsp=0x%x rbp=0x%x rip=0x%x", next.val[regRSP], next.val[regRBP], next.val[regRIP])
	}
}

func TestUnsupportedExpressionStops(t *testing.T) {
	b := cfiBuilder{addr: 0x3000}
	c := b.cie(standardCIE...)
	// DW_OP_call_frame_cfa is outside the supported subset.
	b.fde(c, 0x1000, 0x40, cfaDefCFAExpression, 1, 0x9c)
	obj := &Object{ehFrame: b.section(t)}
	resolve := func(uint64) (*Object, uint64, bool) { return obj, 0, true }
	pcs, reason := Unwind(Sample{IP: 0x1000, SP: 0x7000, Stack: make([]byte, 64)}, resolve)
	if len(pcs) != 1 || !strings.Contains(reason, "unsupported DWARF expression op 0x9c") {
		t.Fatalf("pcs %x, reason %q", pcs, reason)
	}
}

func TestPointerEncodings(t *testing.T) {
	tests := []struct {
		enc  byte
		data []byte
		want uint64
	}{
		{pePtr, []byte{1, 2, 3, 4, 5, 6, 7, 8}, 0x0807060504030201},
		{peULEB128, []byte{0xe5, 0x8e, 0x26}, 624485},
		{peSLEB128, []byte{0xc0, 0xbb, 0x78}, uint64(0xffffffffffffffff - 123456 + 1)},
		{peUData2, []byte{0xfe, 0xff}, 0xfffe},
		{peSData2, []byte{0xfe, 0xff}, ^uint64(1)},
		{peUData4, []byte{0xfc, 0xff, 0xff, 0xff}, 0xfffffffc},
		{peSData4, []byte{0xfc, 0xff, 0xff, 0xff}, ^uint64(3)},
		{peUData8, []byte{8, 0, 0, 0, 0, 0, 0, 0}, 8},
		{peSData8, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ^uint64(0)},
		{peSData4 | pePCRel, []byte{0, 0, 0, 0, 0xfc, 0xff, 0xff, 0xff}, 0x1000 + 4 - 4},
		{peSData4 | peDataRel, []byte{0x10, 0, 0, 0}, 0x5010},
	}
	for _, tt := range tests {
		r := reader{buf: tt.data}
		if tt.enc&peApplyMask == pePCRel {
			r.pos = 4
		}
		got, err := r.pointer(tt.enc, 8, pointerBases{section: 0x1000, data: 0x5000, hasData: true})
		if err != nil || got != tt.want {
			t.Errorf("encoding 0x%x: got 0x%x, %v; want 0x%x", tt.enc, got, err, tt.want)
		}
	}
	for _, enc := range []byte{peUData4 | peIndirect, peUData4 | peTextRel, 0x05, peOmit} {
		r := reader{buf: make([]byte, 8)}
		if _, err := r.pointer(enc, 8, pointerBases{}); err == nil {
			t.Errorf("encoding 0x%x: no error", enc)
		}
	}
	r := reader{buf: []byte{0x80, 0x80}}
	if r.uleb(); r.err == nil {
		t.Error("truncated ULEB128 accepted")
	}
}

// A frame without CFI is stepped with frame pointers when rbp is plausible.
func TestFramePointerFallback(t *testing.T) {
	const sp = 0x7fff0000
	stack := make([]byte, 64)
	put := func(off int, v uint64) {
		for i := 0; i < 8; i++ {
			stack[off+i] = byte(v >> (8 * i))
		}
	}
	put(16, 0)        // saved rbp: outermost frame
	put(24, 0x401234) // return address
	noObject := func(uint64) (*Object, uint64, bool) { return nil, 0, false }

	pcs, reason := Unwind(Sample{IP: 0x9000, SP: sp, BP: sp + 16, Stack: stack}, noObject)
	if len(pcs) != 2 || pcs[1] != 0x401234 {
		t.Fatalf("pcs %x, reason %q", pcs, reason)
	}
	if !strings.HasPrefix(reason, "no CFI for 0x401234") {
		t.Errorf("reason %q", reason)
	}

	pcs, reason = Unwind(Sample{IP: 0x9000, SP: sp, BP: 0x1235, Stack: stack}, noObject)
	if len(pcs) != 1 || !strings.HasPrefix(reason, "no CFI for 0x9000") {
		t.Fatalf("garbage rbp: pcs %x, reason %q", pcs, reason)
	}
}

// The real executable must be usable both through .eh_frame_hdr and through
// a scanned index (objects linked without --eh-frame-hdr).
func TestOpenWithoutHeaderTable(t *testing.T) {
	bin := buildCapture(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	eh, ehAddr, err := sectionData(f, ".eh_frame")
	if err != nil {
		t.Fatal(err)
	}
	s, err := loadEHFrame(eh, ehAddr, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.hdr != nil || len(s.index) == 0 {
		t.Fatalf("expected a scanned index, got hdr=%v index=%d", s.hdr != nil, len(s.index))
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, sym := range syms {
		if sym.Name == "c" || sym.Name == "main" {
			if _, err := s.find(sym.Value); err != nil {
				t.Errorf("%s: %v", sym.Name, err)
			}
		}
	}
}
