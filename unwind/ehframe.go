//go:build linux && amd64

package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Limits that keep hostile input from exhausting memory. Real objects are
// far below them: a large shared library has some 10^5 FDEs and a handful of
// CIEs.
const (
	maxFDEs = 1 << 22
	maxCIEs = 1 << 16
)

// addrSize is the pointer size of the only supported target, x86-64.
const addrSize = 8

// cfiSection is one parsed call-frame-information section: .eh_frame or
// .debug_frame. The two share a layout but differ in how CIEs are marked and
// referenced, and in pointer encodings.
type cfiSection struct {
	name string
	data []byte
	addr uint64 // link-time address of data[0]; pc-relative pointers need it
	isEH bool

	// cies holds every CIE found while scanning the section, by offset. It
	// is filled while opening and only read afterwards, which keeps Object
	// safe for concurrent use without locks.
	cies map[uint64]*cie

	// index is sorted by begin and used when there is no usable
	// .eh_frame_hdr search table.
	index []fdeRef
	// hdr is the .eh_frame_hdr binary-search table, when present and usable.
	hdr *hdrTable
}

// fdeRef locates one FDE: the pc range it covers and where it is.
type fdeRef struct {
	begin, end uint64
	offset     uint64
}

// cie is a Common Information Entry: the defaults shared by many FDEs.
type cie struct {
	codeAlign   uint64
	dataAlign   int64
	raColumn    uint64
	fdeEncoding byte
	hasAugData  bool // 'z': FDEs carry an augmentation-data block
	signalFrame bool // 'S': FDEs describe signal trampolines
	addrSize    int
	initial     []byte // initial instructions
	initialAddr uint64 // link-time address of initial[0]
}

// fde is a Frame Description Entry: the CFA program for one pc range.
type fde struct {
	cie         *cie
	begin, end  uint64
	program     []byte
	programAddr uint64 // link-time address of program[0]
}

// entry is one length-delimited record of a CFI section, CIE or FDE.
type entry struct {
	isCIE      bool
	cieOffset  uint64 // FDEs: section offset of their CIE
	body       []byte // what follows the CIE id / CIE pointer field
	bodyOffset uint64 // section offset of body[0]
	next       uint64 // section offset of the following record
	terminator bool   // zero-length record, which ends .eh_frame
}

// readEntry decodes the record header at off.
func (s *cfiSection) readEntry(off uint64) (entry, error) {
	if off >= uint64(len(s.data)) {
		return entry{}, errTruncated
	}
	r := reader{buf: s.data, pos: int(off)}
	length := uint64(r.u32())
	dwarf64 := false
	if length == 0xffffffff {
		length = r.u64()
		dwarf64 = true
	}
	if r.err != nil {
		return entry{}, r.err
	}
	start := uint64(r.pos)
	if length == 0 {
		return entry{terminator: true, next: start}, nil
	}
	if length > uint64(r.remaining()) {
		return entry{}, fmt.Errorf("record at 0x%x: length 0x%x past end of section", off, length)
	}
	end := start + length
	r.buf = r.buf[:end]

	idPos := uint64(r.pos)
	var id uint64
	// .eh_frame always uses a 4-byte CIE pointer, even in 64-bit records.
	if dwarf64 && !s.isEH {
		id = r.u64()
	} else {
		id = uint64(r.u32())
	}
	if r.err != nil {
		return entry{}, fmt.Errorf("record at 0x%x: %w", off, r.err)
	}
	e := entry{body: r.buf[r.pos:], bodyOffset: uint64(r.pos), next: end}
	switch {
	case s.isEH && id == 0:
		e.isCIE = true
	case s.isEH:
		// The CIE pointer counts backwards from the pointer field itself.
		if id > idPos {
			return entry{}, fmt.Errorf("record at 0x%x: CIE pointer 0x%x before start of section", off, id)
		}
		e.cieOffset = idPos - id
	case id == 0xffffffff || id == ^uint64(0):
		e.isCIE = true
	default:
		e.cieOffset = id
	}
	return e, nil
}

// cieAt returns the CIE at off, from the scan cache or by parsing it.
func (s *cfiSection) cieAt(off uint64) (*cie, error) {
	if c, ok := s.cies[off]; ok {
		return c, nil
	}
	e, err := s.readEntry(off)
	if err != nil {
		return nil, err
	}
	if !e.isCIE {
		return nil, fmt.Errorf("record at 0x%x is not a CIE", off)
	}
	return s.parseCIE(e)
}

func (s *cfiSection) parseCIE(e entry) (*cie, error) {
	r := reader{buf: e.body}
	c := &cie{addrSize: addrSize, fdeEncoding: pePtr}
	version := r.u8()
	switch {
	case r.err != nil:
		return nil, r.err
	case s.isEH && version != 1 && version != 3:
		return nil, fmt.Errorf("unsupported .eh_frame CIE version %d", version)
	case version != 1 && version != 3 && version != 4:
		return nil, fmt.Errorf("unsupported CIE version %d", version)
	}
	aug := r.cstring()
	if strings.HasPrefix(aug, "eh") {
		// Old GCC stored an exception-table pointer right here.
		r.bytes(c.addrSize)
		aug = aug[2:]
	}
	if version == 4 {
		c.addrSize = int(r.u8())
		if segSize := r.u8(); segSize != 0 {
			return nil, fmt.Errorf("segmented addresses (segment size %d) not supported", segSize)
		}
		if c.addrSize != 4 && c.addrSize != 8 {
			return nil, fmt.Errorf("unsupported address size %d", c.addrSize)
		}
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.raColumn = uint64(r.u8())
	} else {
		c.raColumn = r.uleb()
	}
	if r.err != nil {
		return nil, r.err
	}
	if aug != "" {
		if aug[0] != 'z' {
			return nil, fmt.Errorf("unsupported augmentation %q", aug)
		}
		c.hasAugData = true
		augLen := r.uleb()
		if augLen > uint64(r.remaining()) {
			return nil, fmt.Errorf("augmentation data: %w", errTruncated)
		}
		ar := reader{buf: r.bytes(int(augLen))}
	augLoop:
		for _, ch := range aug[1:] {
			switch ch {
			case 'L': // LSDA encoding; the pointer itself lives in each FDE
				ar.u8()
			case 'P': // personality routine, irrelevant for unwinding
				if err := ar.skipPointer(ar.u8(), c.addrSize); err != nil {
					return nil, fmt.Errorf("personality pointer: %w", err)
				}
			case 'R':
				c.fdeEncoding = ar.u8()
			case 'S':
				c.signalFrame = true
			case 'B', 'G':
				// AArch64 markers without data.
			default:
				// The 'z' length lets us skip data we do not understand.
				break augLoop
			}
		}
		if ar.err != nil {
			return nil, fmt.Errorf("augmentation data: %w", ar.err)
		}
	}
	if pointerSize(c.fdeEncoding, c.addrSize) == 0 && c.fdeEncoding&peFormatMask != peULEB128 &&
		c.fdeEncoding&peFormatMask != peSLEB128 {
		return nil, fmt.Errorf("unsupported FDE pointer encoding 0x%x", c.fdeEncoding)
	}
	c.initial = e.body[r.pos:]
	c.initialAddr = s.addr + e.bodyOffset + uint64(r.pos)
	return c, nil
}

// parseFDE decodes an FDE record. The CIE comes from the scan cache when
// possible.
func (s *cfiSection) parseFDE(e entry) (fde, error) {
	c, err := s.cieAt(e.cieOffset)
	if err != nil {
		return fde{}, fmt.Errorf("reading CIE at 0x%x: %w", e.cieOffset, err)
	}
	r := reader{buf: e.body}
	bases := pointerBases{section: s.addr + e.bodyOffset}
	begin, err := r.pointer(c.fdeEncoding, c.addrSize, bases)
	if err != nil {
		return fde{}, fmt.Errorf("FDE start address: %w", err)
	}
	// The range is a plain length: same storage format, no relative base.
	size, err := r.rawPointer(c.fdeEncoding&peFormatMask, c.addrSize)
	if err != nil {
		return fde{}, fmt.Errorf("FDE range: %w", err)
	}
	if c.hasAugData {
		n := r.uleb()
		if n > uint64(r.remaining()) {
			return fde{}, fmt.Errorf("FDE augmentation data: %w", errTruncated)
		}
		r.bytes(int(n))
	}
	if r.err != nil {
		return fde{}, r.err
	}
	end := begin + size
	if end < begin {
		end = ^uint64(0)
	}
	return fde{
		cie:         c,
		begin:       begin,
		end:         end,
		program:     e.body[r.pos:],
		programAddr: s.addr + e.bodyOffset + uint64(r.pos),
	}, nil
}

// fdeAt parses the FDE whose record starts at off.
func (s *cfiSection) fdeAt(off uint64) (fde, error) {
	e, err := s.readEntry(off)
	if err != nil {
		return fde{}, err
	}
	if e.terminator || e.isCIE {
		return fde{}, fmt.Errorf("record at 0x%x is not an FDE", off)
	}
	return s.parseFDE(e)
}

// scan walks every record once, caching CIEs and, when buildIndex is set,
// collecting a sorted FDE index. Records that fail to parse are skipped: one
// bad FDE must not hide the rest of the object.
func (s *cfiSection) scan(buildIndex bool) error {
	s.cies = make(map[uint64]*cie)
	for off := uint64(0); off < uint64(len(s.data)); {
		e, err := s.readEntry(off)
		if err != nil {
			// Without a valid length there is no way to find the next record.
			if off == 0 {
				return fmt.Errorf("reading %s: %w", s.name, err)
			}
			break
		}
		if e.terminator {
			if s.isEH {
				break
			}
			off = e.next
			continue
		}
		if e.isCIE {
			if len(s.cies) >= maxCIEs {
				return fmt.Errorf("reading %s: more than %d CIEs", s.name, maxCIEs)
			}
			if c, err := s.parseCIE(e); err == nil {
				s.cies[off] = c
			}
		} else if buildIndex {
			if len(s.index) >= maxFDEs {
				return fmt.Errorf("reading %s: more than %d FDEs", s.name, maxFDEs)
			}
			// Zero-length FDEs are left behind by linkers for discarded
			// functions and cover nothing.
			if f, err := s.parseFDE(e); err == nil && f.end > f.begin {
				s.index = append(s.index, fdeRef{begin: f.begin, end: f.end, offset: off})
			}
		}
		off = e.next
	}
	if buildIndex {
		sort.Slice(s.index, func(i, j int) bool { return s.index[i].begin < s.index[j].begin })
	}
	return nil
}

// errNoFDE means no FDE covers the pc; the caller may fall back to frame
// pointers.
var errNoFDE = errors.New("no FDE covers pc")

// find returns the FDE covering pc (a link-time address).
func (s *cfiSection) find(pc uint64) (fde, error) {
	if s.hdr != nil {
		off, ok := s.hdr.lookup(pc, s.addr)
		if !ok {
			return fde{}, errNoFDE
		}
		return s.checkCovers(off, pc)
	}
	// Last FDE starting at or before pc. Overlapping FDEs do not occur in
	// well-formed objects, so checking that one is enough.
	i := sort.Search(len(s.index), func(i int) bool { return s.index[i].begin > pc }) - 1
	if i < 0 || pc >= s.index[i].end {
		return fde{}, errNoFDE
	}
	return s.checkCovers(s.index[i].offset, pc)
}

func (s *cfiSection) checkCovers(off, pc uint64) (fde, error) {
	f, err := s.fdeAt(off)
	if err != nil {
		return fde{}, fmt.Errorf("reading FDE at 0x%x in %s: %w", off, s.name, err)
	}
	if pc < f.begin || pc >= f.end {
		return fde{}, errNoFDE
	}
	return f, nil
}

// hdrTable is the sorted (initial location, FDE address) table of
// .eh_frame_hdr, searched in place without building anything.
type hdrTable struct {
	table     []byte
	tableAddr uint64 // link-time address of table[0]
	hdrAddr   uint64 // datarel base
	enc       byte
	entrySize int // one pair
	count     int
}

// parseHdr decodes .eh_frame_hdr. It returns nil when the table is missing,
// uses an encoding that cannot be searched in place, or does not belong to
// the .eh_frame at ehAddr; the caller then builds its own index.
func parseHdr(data []byte, hdrAddr, ehAddr uint64) *hdrTable {
	r := reader{buf: data}
	version := r.u8()
	ehPtrEnc := r.u8()
	countEnc := r.u8()
	tableEnc := r.u8()
	if r.err != nil || version != 1 || countEnc == peOmit || tableEnc == peOmit {
		return nil
	}
	bases := pointerBases{section: hdrAddr, data: hdrAddr, hasData: true}
	ehPtr, err := r.pointer(ehPtrEnc, addrSize, bases)
	if err != nil || ehPtr != ehAddr {
		return nil
	}
	count, err := r.pointer(countEnc, addrSize, bases)
	if err != nil {
		return nil
	}
	size := pointerSize(tableEnc, addrSize)
	if size == 0 || tableEnc&peIndirect != 0 {
		return nil
	}
	switch tableEnc & peApplyMask {
	case peAbs, pePCRel, peDataRel:
	default:
		return nil
	}
	entrySize := 2 * size
	if count == 0 || count > maxFDEs || count*uint64(entrySize) > uint64(r.remaining()) {
		return nil
	}
	return &hdrTable{
		table:     data[r.pos : r.pos+int(count)*entrySize],
		tableAddr: hdrAddr + uint64(r.pos),
		hdrAddr:   hdrAddr,
		enc:       tableEnc,
		entrySize: entrySize,
		count:     int(count),
	}
}

// pair decodes table entry i.
func (h *hdrTable) pair(i int) (loc, fdeAddr uint64, ok bool) {
	off := i * h.entrySize
	if h.enc == peDataRel|peSData4 {
		// What every linker emits; decoded directly because this is the
		// innermost loop of a lookup.
		e := h.table[off : off+8]
		loc = h.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(e))))
		fdeAddr = h.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(e[4:]))))
		return loc, fdeAddr, true
	}
	r := reader{buf: h.table[off : off+h.entrySize]}
	bases := pointerBases{section: h.tableAddr + uint64(off), data: h.hdrAddr, hasData: true}
	loc, err1 := r.pointer(h.enc, addrSize, bases)
	fdeAddr, err2 := r.pointer(h.enc, addrSize, bases)
	return loc, fdeAddr, err1 == nil && err2 == nil
}

// lookup returns the .eh_frame offset of the last FDE starting at or before
// pc. The caller still checks that the FDE really covers pc.
func (h *hdrTable) lookup(pc, ehAddr uint64) (uint64, bool) {
	lo, hi := 0, h.count
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		loc, _, ok := h.pair(mid)
		if !ok {
			return 0, false
		}
		if loc <= pc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return 0, false
	}
	_, fdeAddr, ok := h.pair(lo - 1)
	if !ok || fdeAddr < ehAddr {
		return 0, false
	}
	return fdeAddr - ehAddr, true
}
