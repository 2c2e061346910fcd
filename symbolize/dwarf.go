//go:build linux && amd64

package symbolize

import (
	"debug/dwarf"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Limits against corrupt or hostile DWARF: past them a unit's tables are
// truncated rather than allowed to grow without bound.
const (
	maxLineRows    = 1 << 22 // per compilation unit
	maxUnitEntries = 1 << 22 // DIEs walked per compilation unit
	maxScopeDepth  = 64      // nesting of functions inlined into each other
	maxNameHops    = 8       // abstract_origin/specification links followed for a name
)

// attrMIPSLinkageName is DW_AT_MIPS_linkage_name, which older GCCs emit
// instead of DW_AT_linkage_name.
const attrMIPSLinkageName dwarf.Attr = 0x2007

// dwarfInfo answers "which source line and inlined functions are at this
// address" from an object's DWARF. Each compilation unit is decoded the
// first time an address inside it is asked for.
type dwarfInfo struct {
	data *dwarf.Data

	mu        sync.Mutex
	unitsDone bool
	units     []unitSpan // sorted by lo
	unitMaxHi []uint64
	tables    map[dwarf.Offset]*unitTables
	names     map[dwarf.Offset]dwarfName
	inlines   map[string][]inlineInstance // built on first InlinedSites
}

type unitSpan struct {
	lo, hi uint64
	cu     *dwarf.Entry
}

// unitTables is one compilation unit's line table and code scopes.
type unitTables struct {
	files  []string
	lines  []lineRow // sorted by address
	scopes []scope
}

type lineRow struct {
	addr uint64
	file int32 // index into files; -1 ends a sequence (no code from here)
	line int32
}

// scope is a function's code in the unit: an out-of-line function (depth 0)
// or a copy inlined into the enclosing scope (depth > 0).
type scope struct {
	ranges   [][2]uint64
	entry    uint64
	depth    int
	name     dwarfName
	callFile string // where the enclosing scope called this inlined copy
	callLine int
}

type dwarfName struct {
	full     string // demangled with arguments
	noParams string // demangled without arguments, for lookups by name
}

// sourceFrame is one level of the inline chain at an address.
type sourceFrame struct {
	function string
	start    uint64 // entry of the function or of the inlined code's range
	file     string
	line     int
}

// inlineInstance is one copy of an inlined function.
type inlineInstance struct {
	entry    uint64
	ranges   [][2]uint64
	callFile string
	callLine int
}

func newDwarfInfo(d *dwarf.Data) *dwarfInfo {
	return &dwarfInfo{
		data:   d,
		tables: map[dwarf.Offset]*unitTables{},
		names:  map[dwarf.Offset]dwarfName{},
	}
}

// frames returns the inline chain at pc, innermost first, with the source
// line of each level; nil when the DWARF says nothing about pc.
func (dw *dwarfInfo) frames(pc uint64) (out []sourceFrame) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	defer func() {
		if recover() != nil {
			out = nil
		}
	}()
	dw.loadUnits()
	cu := dw.unitAt(pc)
	if cu == nil {
		return nil
	}
	t := dw.unitTables(cu)
	file, line := t.lineAt(pc)

	// The scopes holding pc. The walk recorded them in tree order, so
	// each comes before the code inlined into it: outermost first.
	var chain []*scope
	var starts []uint64
	for i := range t.scopes {
		s := &t.scopes[i]
		lo, ok := rangeHolding(s.ranges, pc)
		if !ok {
			continue
		}
		chain = append(chain, s)
		starts = append(starts, lo)
	}
	if len(chain) == 0 {
		if line == 0 {
			return nil
		}
		return []sourceFrame{{file: file, line: line}}
	}
	out = make([]sourceFrame, 0, len(chain))
	for i := len(chain) - 1; i >= 0; i-- {
		s := chain[i]
		f := sourceFrame{function: s.name.full, start: starts[i], file: file, line: line}
		if s.depth == 0 {
			f.start = s.entry
		}
		if i < len(chain)-1 {
			// An outer level is at the line calling the level inside it.
			inner := chain[i+1]
			f.file, f.line = inner.callFile, inner.callLine
		}
		out = append(out, f)
	}
	return out
}

func rangeHolding(ranges [][2]uint64, pc uint64) (uint64, bool) {
	for _, r := range ranges {
		if pc >= r[0] && pc < r[1] {
			return r[0], true
		}
	}
	return 0, false
}

// loadUnits reads each compilation unit's address ranges (only the unit's
// first entry, not its contents).
func (dw *dwarfInfo) loadUnits() {
	if dw.unitsDone {
		return
	}
	dw.unitsDone = true
	r := dw.data.Reader()
	var last dwarf.Offset
	for first := true; ; first = false {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		// A corrupt DW_AT_sibling can point back at its own entry, and
		// SkipChildren then returns to it forever.
		if !first && e.Offset <= last {
			break
		}
		last = e.Offset
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
			ranges, _ := dw.data.Ranges(e)
			for _, rg := range ranges {
				if rg[1] > rg[0] {
					dw.units = append(dw.units, unitSpan{rg[0], rg[1], e})
				}
			}
		}
		r.SkipChildren()
	}
	sort.Slice(dw.units, func(i, j int) bool { return dw.units[i].lo < dw.units[j].lo })
	dw.unitMaxHi = make([]uint64, len(dw.units))
	var m uint64
	for i, u := range dw.units {
		m = max(m, u.hi)
		dw.unitMaxHi[i] = m
	}
}

func (dw *dwarfInfo) unitAt(pc uint64) *dwarf.Entry {
	i := sort.Search(len(dw.units), func(i int) bool { return dw.units[i].lo > pc }) - 1
	for ; i >= 0 && dw.unitMaxHi[i] > pc; i-- {
		if pc < dw.units[i].hi {
			return dw.units[i].cu
		}
	}
	return nil
}

func (dw *dwarfInfo) unitTables(cu *dwarf.Entry) *unitTables {
	if t, ok := dw.tables[cu.Offset]; ok {
		return t
	}
	t := &unitTables{}
	// Stored before decoding so a unit that panics is not retried.
	dw.tables[cu.Offset] = t
	files := dw.readLines(cu, t)
	t.scopes = dw.readScopes(cu, files, nil)
	return t
}

// readLines decodes the unit's line program into t and returns its file
// table for resolving DW_AT_call_file.
func (dw *dwarfInfo) readLines(cu *dwarf.Entry, t *unitTables) []*dwarf.LineFile {
	lr, err := dw.data.LineReader(cu)
	if err != nil || lr == nil {
		return nil
	}
	fileIndex := map[*dwarf.LineFile]int32{}
	var le dwarf.LineEntry
	for len(t.lines) < maxLineRows {
		if err := lr.Next(&le); err != nil {
			break
		}
		if le.EndSequence {
			t.lines = append(t.lines, lineRow{addr: le.Address, file: -1})
			continue
		}
		fi := int32(-1)
		if le.File != nil {
			var ok bool
			if fi, ok = fileIndex[le.File]; !ok {
				fi = int32(len(t.files))
				fileIndex[le.File] = fi
				t.files = append(t.files, le.File.Name)
			}
		}
		t.lines = append(t.lines, lineRow{addr: le.Address, file: fi, line: int32(le.Line)})
	}
	// Sequences are sorted each but may come in any order. A sequence's
	// end sorts before another starting at the same address, and rows at
	// one address keep their order so the last one wins, as in addr2line.
	sort.SliceStable(t.lines, func(i, j int) bool {
		a, b := t.lines[i], t.lines[j]
		if a.addr != b.addr {
			return a.addr < b.addr
		}
		return a.file < 0 && b.file >= 0
	})
	return lr.Files()
}

func (t *unitTables) lineAt(pc uint64) (string, int) {
	i := sort.Search(len(t.lines), func(i int) bool { return t.lines[i].addr > pc }) - 1
	if i < 0 {
		return "", 0
	}
	r := t.lines[i]
	if r.file < 0 || r.line <= 0 {
		return "", 0
	}
	return t.files[r.file], int(r.line)
}

// readScopes walks the unit's entries for code scopes: out-of-line
// functions and the functions inlined into them. Types and declarations
// hold no code and are skipped whole. With each set, every inlined copy is
// also passed to it (the walk behind InlinedSites).
func (dw *dwarfInfo) readScopes(cu *dwarf.Entry, files []*dwarf.LineFile, each func(*scope)) []scope {
	if !cu.Children {
		return nil
	}
	r := dw.data.Reader()
	r.Seek(cu.Offset)
	if _, err := r.Next(); err != nil {
		return nil
	}
	var out []scope
	// For each open entry with children: the scope it opened, or -1.
	var open []int
	var depth int
	for n := 0; n < maxUnitEntries; n++ {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		if e.Tag == 0 {
			if len(open) == 0 {
				break // end of the unit
			}
			if open[len(open)-1] >= 0 {
				depth--
			}
			open = open[:len(open)-1]
			continue
		}
		opened := -1
		switch e.Tag {
		case dwarf.TagSubprogram, dwarf.TagInlinedSubroutine:
			ranges, _ := dw.data.Ranges(e)
			if len(ranges) == 0 || depth >= maxScopeDepth {
				// A declaration or abstract instance: no code of its own.
				r.SkipChildren()
				continue
			}
			s := scope{ranges: ranges, entry: entryPC(e, ranges), depth: depth, name: dw.nameOf(e)}
			if e.Tag == dwarf.TagInlinedSubroutine {
				if fi, ok := e.Val(dwarf.AttrCallFile).(int64); ok && fi >= 0 && fi < int64(len(files)) && files[fi] != nil {
					s.callFile = files[fi].Name
				}
				if l, ok := e.Val(dwarf.AttrCallLine).(int64); ok {
					s.callLine = int(l)
				}
			}
			out = append(out, s)
			opened = len(out) - 1
			if each != nil && e.Tag == dwarf.TagInlinedSubroutine {
				each(&out[opened])
			}
		case dwarf.TagLexDwarfBlock, dwarf.TagNamespace, dwarf.TagModule:
			// Blocks and namespaces can hold code scopes.
		default:
			r.SkipChildren()
			continue
		}
		if e.Children {
			open = append(open, opened)
			if opened >= 0 {
				depth++
			}
		}
	}
	return out
}

func entryPC(e *dwarf.Entry, ranges [][2]uint64) uint64 {
	if v, ok := e.Val(dwarf.AttrEntrypc).(uint64); ok {
		return v
	}
	if v, ok := e.Val(dwarf.AttrLowpc).(uint64); ok {
		return v
	}
	lo := ranges[0][0]
	for _, r := range ranges {
		lo = min(lo, r[0])
	}
	return lo
}

// nameOf names a code scope. Inlined copies and out-of-line C++ methods name
// their function only through abstract_origin or specification links; the
// linkage name, demangled, is preferred because DW_AT_name is unqualified.
func (dw *dwarfInfo) nameOf(e *dwarf.Entry) dwarfName {
	return dw.nameWithin(e, 0)
}

func (dw *dwarfInfo) nameWithin(e *dwarf.Entry, hops int) dwarfName {
	for _, a := range []dwarf.Attr{dwarf.AttrLinkageName, attrMIPSLinkageName} {
		if ln, ok := e.Val(a).(string); ok && ln != "" {
			return dwarfName{full: demangleName(ln), noParams: demangleNoParams(ln)}
		}
	}
	if hops < maxNameHops {
		for _, a := range []dwarf.Attr{dwarf.AttrAbstractOrigin, dwarf.AttrSpecification} {
			if off, ok := e.Val(a).(dwarf.Offset); ok {
				if n := dw.nameAt(off, hops+1); n.full != "" {
					return n
				}
			}
		}
	}
	if n, ok := e.Val(dwarf.AttrName).(string); ok {
		return dwarfName{full: n, noParams: n}
	}
	return dwarfName{}
}

func (dw *dwarfInfo) nameAt(off dwarf.Offset, hops int) dwarfName {
	if n, ok := dw.names[off]; ok {
		return n
	}
	dw.names[off] = dwarfName{} // breaks reference cycles
	r := dw.data.Reader()
	r.Seek(off)
	e, err := r.Next()
	if err != nil || e == nil {
		return dwarfName{}
	}
	n := dw.nameWithin(e, hops)
	dw.names[off] = n
	return n
}

// inlinedCopies returns every inlined copy of the named function, indexing
// the whole DWARF on first use.
func (dw *dwarfInfo) inlinedCopies(name string) (out []inlineInstance, err error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, errors.New("malformed DWARF")
		}
	}()
	if dw.inlines == nil {
		dw.inlines = map[string][]inlineInstance{}
		dw.indexInlines()
	}
	return dw.inlines[name], nil
}

func (dw *dwarfInfo) indexInlines() {
	r := dw.data.Reader()
	var last dwarf.Offset
	for first := true; ; first = false {
		cu, err := r.Next()
		if err != nil || cu == nil {
			return
		}
		// A corrupt DW_AT_sibling can point back at its own entry, and
		// SkipChildren then returns to it forever.
		if !first && cu.Offset <= last {
			return
		}
		last = cu.Offset
		r.SkipChildren()
		if cu.Tag != dwarf.TagCompileUnit && cu.Tag != dwarf.TagPartialUnit {
			continue
		}
		var files []*dwarf.LineFile
		if lr, err := dw.data.LineReader(cu); err == nil && lr != nil {
			files = lr.Files()
		}
		dw.readScopes(cu, files, func(s *scope) {
			c := inlineInstance{entry: s.entry, ranges: s.ranges, callFile: s.callFile, callLine: s.callLine}
			dw.inlines[s.name.full] = append(dw.inlines[s.name.full], c)
			if s.name.noParams != s.name.full {
				dw.inlines[s.name.noParams] = append(dw.inlines[s.name.noParams], c)
			}
		})
	}
}

// InlineSite is one place a function was inlined: probing it there catches
// the calls compiled into that caller.
type InlineSite struct {
	Addr   uint64 // virtual address where the inlined code is entered
	Offset uint64 // file offset of Addr, for uprobes
	// Function is the out-of-line function holding the copy.
	Function string
	File     string // the call that was inlined
	Line     int
}

// InlinedSites finds the copies of a function the compiler inlined (glibc's
// shrink_heap and heap_trim exist only inside _int_free, for example). It
// reads the whole DWARF of the object or its debug file, so it is meant for
// names Func did not find. name is plain or a demangled C++ name.
func (o *Object) InlinedSites(name string) ([]InlineSite, error) {
	dw := o.dwarfData()
	if dw == nil {
		return nil, fmt.Errorf("finding inlined copies of %s in %s: %w: no DWARF", name, o.path, ErrSymbolNotFound)
	}
	copies, err := dw.inlinedCopies(name)
	if err != nil {
		return nil, fmt.Errorf("finding inlined copies of %s in %s: %w", name, o.path, err)
	}
	var out []InlineSite
	seen := map[uint64]bool{}
	for _, c := range copies {
		if seen[c.entry] {
			continue
		}
		seen[c.entry] = true
		site := InlineSite{Addr: c.entry, File: c.callFile, Line: c.callLine}
		if off, err := o.FileOffset(c.entry); err == nil {
			site.Offset = off
		}
		if s, ok := o.SymbolAt(c.entry); ok {
			site.Function = s.Name
		}
		out = append(out, site)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	if len(out) == 0 {
		return nil, fmt.Errorf("finding inlined copies of %s in %s: %w", name, o.path, ErrSymbolNotFound)
	}
	return out, nil
}
