//go:build linux && amd64

package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hooktrace/hooktrace/internal/funcname"
)

var (
	// ErrSymbolNotFound: the object has no function of that name.
	ErrSymbolNotFound = errors.New("symbol not found")
	// ErrStripped accompanies ErrSymbolNotFound when the object (and any
	// debug file found for it) has no .symtab, so only exported functions
	// can be found.
	ErrStripped = errors.New("object is stripped (no .symtab and no debug file)")
	// ErrAmbiguous: the name matches functions at different addresses.
	ErrAmbiguous = errors.New("ambiguous symbol")
)

// SymbolKind says what a symbol names.
type SymbolKind uint8

const (
	KindFunc SymbolKind = iota + 1
	// KindIFunc is a GNU indirect function: its address is the resolver
	// that picks an implementation at load time, not the implementation.
	KindIFunc
	KindData
)

func (k SymbolKind) String() string {
	switch k {
	case KindFunc:
		return "func"
	case KindIFunc:
		return "ifunc"
	case KindData:
		return "data"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Symbol is a function or data symbol of an object.
type Symbol struct {
	Name    string // demangled (C++: with the argument list), without @version
	Mangled string // as the symbol table spells it, without @version
	Version string // "GLIBC_2.2.5"; empty when unversioned
	Value   uint64 // virtual address in the object
	Size    uint64 // from the symbol table; 0 when it did not say
	// Offset is the file offset of Value, which uprobes attach to; 0 when
	// Value is not backed by the file (.bss).
	Offset uint64
	Kind   SymbolKind
}

// symbol is a symbol-table entry as kept in memory.
type symbol struct {
	name    string // without @version
	version string
	hidden  bool // a non-default version (name@V, not name@@V): only old binaries bind to it
	value   uint64
	size    uint64
	end     uint64 // where lookups by address stop: value+size, or the next symbol for size 0
	kind    SymbolKind
	bind    elf.SymBind
}

// symbolTable is a kind of symbol sorted by address.
type symbolTable struct {
	syms   []symbol
	maxEnd []uint64 // maxEnd[i] = max(syms[:i+1].end), to find enclosing symbols
}

func (o *Object) loadSymbols() {
	o.symOnce.Do(func() {
		defer func() {
			if p := recover(); p != nil {
				o.symErr = fmt.Errorf("reading symbols of %s: malformed file: %v", o.path, p)
			}
		}()
		var funcs, data []symbol
		add := func(ef *elf.File, syms []elf.Symbol, dynamic bool) {
			for _, s := range syms {
				sym, ok := convertSymbol(ef, s, dynamic)
				if !ok {
					continue
				}
				if sym.kind == KindData {
					data = append(data, sym)
				} else {
					funcs = append(funcs, sym)
				}
			}
		}
		if syms, err := o.file.Symbols(); err == nil {
			add(o.file, syms, false)
			o.hasTab = true
		}
		if syms, err := o.file.DynamicSymbols(); err == nil {
			add(o.file, syms, true)
		}
		if d := o.debugInfo(); d != nil {
			if syms, err := d.file.Symbols(); err == nil && len(syms) > 0 {
				add(d.file, syms, false)
				o.hasTab = true
			}
		}
		o.funcs = newSymbolTable(funcs)
		o.data = newSymbolTable(data)
	})
}

// convertSymbol keeps defined function and data symbols; its section's end
// bounds symbols of size 0, which otherwise run to the next symbol.
func convertSymbol(ef *elf.File, s elf.Symbol, dynamic bool) (symbol, bool) {
	var kind SymbolKind
	switch elf.ST_TYPE(s.Info) {
	case elf.STT_FUNC:
		kind = KindFunc
	case elf.STT_GNU_IFUNC:
		kind = KindIFunc
	case elf.STT_OBJECT:
		kind = KindData
	default:
		return symbol{}, false
	}
	if s.Section == elf.SHN_UNDEF || s.Section >= elf.SHN_LORESERVE || s.Value == 0 || s.Name == "" {
		return symbol{}, false
	}
	sym := symbol{name: s.Name, value: s.Value, size: s.Size, kind: kind, bind: elf.ST_BIND(s.Info)}
	if dynamic {
		sym.version = s.Version
		sym.hidden = s.HasVersion && s.VersionIndex.IsHidden()
	} else if i := strings.IndexByte(s.Name, '@'); i > 0 {
		// .symtab spells versions into the name: "f@@V" is the default
		// version, "f@V" an old one.
		sym.name = s.Name[:i]
		v := s.Name[i+1:]
		sym.version, sym.hidden = strings.TrimPrefix(v, "@"), !strings.HasPrefix(v, "@")
	}
	sym.end = sym.value + sym.size
	if sym.size == 0 && int(s.Section) < len(ef.Sections) {
		// Remember the section end; newSymbolTable may shorten it.
		sec := ef.Sections[s.Section]
		if sec.Addr <= sym.value && sym.value < sec.Addr+sec.Size {
			sym.end = sec.Addr + sec.Size
		} else {
			sym.end = sym.value + 1
		}
	}
	return sym, true
}

func newSymbolTable(syms []symbol) symbolTable {
	sort.Slice(syms, func(i, j int) bool {
		a, b := &syms[i], &syms[j]
		if a.value != b.value {
			return a.value < b.value
		}
		if a.name != b.name {
			return a.name < b.name
		}
		if a.version != b.version {
			return a.version < b.version
		}
		return a.size > b.size
	})
	// The same symbol often appears in .symtab, .dynsym and the debug file.
	out := syms[:0]
	for _, s := range syms {
		if n := len(out); n > 0 && out[n-1].value == s.value && out[n-1].name == s.name && out[n-1].version == s.version {
			continue
		}
		out = append(out, s)
	}
	syms = out
	// A symbol without a size (hand-written assembly) covers the gap up to
	// the next symbol.
	for i := range syms {
		if syms[i].size != 0 {
			continue
		}
		for j := i + 1; j < len(syms); j++ {
			if syms[j].value > syms[i].value {
				syms[i].end = min(syms[i].end, syms[j].value)
				break
			}
		}
	}
	t := symbolTable{syms: syms, maxEnd: make([]uint64, len(syms))}
	var m uint64
	for i, s := range syms {
		m = max(m, s.end)
		t.maxEnd[i] = m
	}
	return t
}

// lookup returns the index of the most specific symbol holding vaddr: the
// one starting closest below it, the smallest among those, and of aliases
// the name a programmer would use.
func (t *symbolTable) lookup(vaddr uint64, exact bool) int {
	i := sort.Search(len(t.syms), func(i int) bool { return t.syms[i].value > vaddr }) - 1
	best := -1
	for ; i >= 0 && t.maxEnd[i] > vaddr; i-- {
		s := &t.syms[i]
		if best >= 0 && s.value < t.syms[best].value {
			break
		}
		if vaddr >= s.end || (exact && s.size == 0 && s.value != vaddr) {
			continue
		}
		if best < 0 || betterSymbol(s, &t.syms[best]) {
			best = i
		}
	}
	return best
}

// betterSymbol orders symbols at the same address: the tighter one first,
// then the name most likely to be the public one (glibc has "free",
// "__libc_free" and "cfree@GLIBC_2.2.5" at one address).
func betterSymbol(a, b *symbol) bool {
	if a.value != b.value {
		return a.value > b.value
	}
	if (a.size == 0) != (b.size == 0) {
		return a.size != 0
	}
	if a.size != b.size {
		return a.size < b.size
	}
	if a.hidden != b.hidden {
		return !a.hidden
	}
	if ra, rb := bindRank(a.bind), bindRank(b.bind); ra != rb {
		return ra < rb
	}
	ua, ub := leadingUnderscores(a.name), leadingUnderscores(b.name)
	if ua != ub {
		return ua < ub
	}
	if len(a.name) != len(b.name) {
		return len(a.name) < len(b.name)
	}
	return a.name < b.name
}

func bindRank(b elf.SymBind) int {
	switch b {
	case elf.STB_GLOBAL:
		return 0
	case elf.STB_WEAK:
		return 1
	}
	return 2
}

func leadingUnderscores(s string) int {
	return len(s) - len(strings.TrimLeft(s, "_"))
}

func (o *Object) publicSymbol(s *symbol) Symbol {
	sym := Symbol{
		Name:    demangleName(s.name),
		Mangled: s.name,
		Version: s.version,
		Value:   s.value,
		Size:    s.size,
		Kind:    s.kind,
	}
	if off, err := o.FileOffset(s.value); err == nil {
		sym.Offset = off
	}
	return sym
}

// SymbolAt returns the function symbol holding vaddr.
func (o *Object) SymbolAt(vaddr uint64) (Symbol, bool) {
	o.loadSymbols()
	i := o.funcs.lookup(vaddr, false)
	if i < 0 {
		return Symbol{}, false
	}
	return o.publicSymbol(&o.funcs.syms[i]), true
}

// DataAt returns the data symbol holding vaddr. A data symbol without a size
// only matches its own address.
func (o *Object) DataAt(vaddr uint64) (Symbol, bool) {
	o.loadSymbols()
	i := o.data.lookup(vaddr, true)
	if i < 0 {
		return Symbol{}, false
	}
	return o.publicSymbol(&o.data.syms[i]), true
}

// Func finds the function a probe should be placed on. name may be plain
// ("malloc"), versioned ("pthread_cond_wait@GLIBC_2.2.5"; without a version
// the default one is meant, as the linker would pick), mangled, or a
// demangled C++ name with or without its argument list
// ("ns::Class::method(int)" or "ns::Class::method").
func (o *Object) Func(name string) (Symbol, error) {
	o.loadSymbols()
	if o.symErr != nil {
		return Symbol{}, o.symErr
	}
	base, version, versioned := splitVersion(name)
	var matches []*symbol
	candidates := o.names()[base]
	if len(candidates) == 0 {
		candidates = o.names()[funcname.Normalize(base)]
	}
	for _, i := range candidates {
		if s := &o.funcs.syms[i]; !versioned || s.version == version {
			matches = append(matches, s)
		}
	}
	if versioned && len(matches) == 0 {
		// An object without symbol versions still has the function the
		// name asks for, only not under that version.
		for _, i := range candidates {
			if s := &o.funcs.syms[i]; s.version == "" {
				matches = append(matches, s)
			}
		}
	}
	if !versioned {
		matches = dropOldVersions(matches)
	}
	if len(matches) == 0 {
		if !o.hasTab {
			return Symbol{}, fmt.Errorf("looking up %s in %s: %w: %w", name, o.path, ErrSymbolNotFound, ErrStripped)
		}
		return Symbol{}, fmt.Errorf("looking up %s in %s: %w", name, o.path, ErrSymbolNotFound)
	}
	best := matches[0]
	var addrs []string
	seen := map[uint64]bool{}
	for _, s := range matches {
		if !seen[s.value] {
			seen[s.value] = true
			addrs = append(addrs, fmt.Sprintf("0x%x (%s)", s.value, demangleName(s.name)))
		}
		if s.value == best.value && betterSymbol(s, best) {
			best = s
		}
	}
	if len(addrs) > 1 {
		return Symbol{}, fmt.Errorf("looking up %s in %s: %w: %d addresses match: %s",
			name, o.path, ErrAmbiguous, len(addrs), strings.Join(addrs, ", "))
	}
	// publicSymbol leaves Offset 0 when it cannot convert; a probe needs it.
	if _, err := o.FileOffset(best.value); err != nil {
		return Symbol{}, fmt.Errorf("looking up %s: %w", name, err)
	}
	return o.publicSymbol(best), nil
}

// splitVersion splits "name@@V" or "name@V" into name and V.
func splitVersion(name string) (base, version string, versioned bool) {
	i := strings.IndexByte(name, '@')
	if i <= 0 {
		return name, "", false
	}
	return name[:i], strings.TrimLeft(name[i:], "@"), true
}

// dropOldVersions removes symbols only old binaries link to when the default
// version is also there.
func dropOldVersions(syms []*symbol) []*symbol {
	current := 0
	for _, s := range syms {
		if !s.hidden {
			current++
		}
	}
	if current == 0 || current == len(syms) {
		return syms
	}
	out := syms[:0:0]
	for _, s := range syms {
		if !s.hidden {
			out = append(out, s)
		}
	}
	return out
}

// names indexes functions by every name Func accepts for them. A clone
// gcc made of a function (f.constprop.0, f.isra.0, f.part.0) is found by
// its own name only, and listed under f's names in o.clones for Funcs; a
// .cold fragment, which no call enters, under neither.
func (o *Object) names() map[string][]int32 {
	o.nameOnce.Do(func() {
		idx := make(map[string][]int32, len(o.funcs.syms))
		clones := map[string][]int32{}
		add := func(m map[string][]int32, key string, i int) {
			l := m[key]
			if len(l) > 0 && l[len(l)-1] == int32(i) {
				return
			}
			m[key] = append(l, int32(i))
		}
		index := func(m map[string][]int32, name string, i int) {
			add(m, name, i)
			if isMangled(name) {
				if full := demangleName(name); full != name {
					add(m, funcname.Normalize(full), i)
					add(m, funcname.Normalize(demangleNoParams(name)), i)
				}
			}
		}
		for i, s := range o.funcs.syms {
			base, entry := funcname.Clone(s.name)
			if base == s.name {
				index(idx, s.name, i)
				continue
			}
			add(idx, s.name, i)
			if entry {
				index(clones, base, i)
			}
		}
		o.byName, o.clones = idx, clones
	})
	return o.byName
}

// Funcs finds the function name names, as Func does, with the clones gcc
// made of it that calls enter (f.constprop.0, f.isra.0, f.part.0): a
// caller may call only a clone, so a probe on the function is a probe on
// each. .cold fragments are not among them: they are jumped to from
// inside, and a probe there would be a false entry.
func (o *Object) Funcs(name string) ([]Symbol, error) {
	sym, err := o.Func(name)
	if err != nil && !errors.Is(err, ErrSymbolNotFound) {
		return nil, err
	}
	var out []Symbol
	seen := map[uint64]bool{}
	if err == nil {
		out = append(out, sym)
		seen[sym.Value] = true
	}
	base, _, _ := splitVersion(name)
	for _, i := range o.clones[funcname.Normalize(base)] {
		s := &o.funcs.syms[i]
		if seen[s.value] {
			continue
		}
		if _, ferr := o.FileOffset(s.value); ferr != nil {
			continue
		}
		seen[s.value] = true
		out = append(out, o.publicSymbol(s))
	}
	if len(out) == 0 {
		return nil, err
	}
	return out, nil
}
