//go:build linux && amd64

// Package symbolize is the tracer's object layer: it reads a traced
// process's mappings (the one /proc/PID/maps parser) and the ELF files
// behind them, and answers everything the tracer asks of those files:
// function names, source lines and data-symbol names for stacks and locks,
// the call-frame information the unwinder walks (parsed by package
// unwind), the functions and code bytes probes are placed on, and the
// extent of the allocator's code.
//
// An ELF file is opened through the file the process really mapped
// (/proc/PID/map_files, or /proc/PID/root + path with the mapped inode
// checked), never by a path that may since name another file, and is
// opened once per file (by device and inode), shared by every process
// that maps it. Symbol tables and CFI are read on first use; DWARF is read
// only when a source line is asked for. Symbols and lines missing from a
// stripped object are taken from its detached debug file, found by build
// ID or .gnu_debuglink.
package symbolize

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/unwind"
)

// Object is one ELF file as the tracer sees it: its symbols, debug
// information, call-frame information and bytes.
type Object struct {
	path    string
	r       io.ReaderAt      // the open file, which stays open
	file    *elf.File        // reads lazily from r
	loads   []elf.ProgHeader // PT_LOAD segments
	buildID []byte
	// roots are extra directories under which debug files are looked for,
	// such as a container's root seen through /proc.
	roots []string

	debugOnce sync.Once
	debug     *debugFile

	symOnce  sync.Once
	symErr   error
	funcs    symbolTable
	data     symbolTable
	hasTab   bool // a .symtab was found, here or in the debug file
	nameOnce sync.Once
	byName   map[string][]int32 // index into funcs.syms, by plain and demangled names
	clones   map[string][]int32 // gcc's entry clones (f.constprop.0, f.isra.0, f.part.0), by f's names

	dwarfOnce sync.Once
	dwarf     *dwarfInfo // nil when there is no usable DWARF

	cfiOnce sync.Once
	cfi     *unwind.Object // nil when unreadable
}

type fileKey struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

type cachedObject struct {
	obj *Object
	err error
}

// objects holds every object opened, so that files mapped by many processes
// (libc) are read once. Entries keep their file open: a deleted file can
// only be read through a descriptor taken while it was still mapped.
var objects = struct {
	sync.Mutex
	m map[fileKey]cachedObject
}{m: map[fileKey]cachedObject{}}

// Open opens the ELF file at path, or returns the object already open for
// the same file. For a file a process maps, OpenMapped is the right one.
func Open(path string) (*Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return openFile(f, path, nil)
}

// OpenMapped opens the file that mapping m of process pid maps, through
// the kernel's handle on the mapping when it can (see openMapped): the
// file rebuilt or replaced at m.Path since is not the one read. via is the
// path it was opened through, which names that same file while the
// mapping lasts: what uprobes for the process must be attached through.
func OpenMapped(pid int, m Mapping) (o *Object, via string, err error) {
	f, err := openMapped(pid, m)
	if err != nil {
		return nil, "", err
	}
	via = f.Name()
	o, err = openFile(f, m.Path, processRoots(pid))
	return o, via, err
}

// OpenIn opens path as process pid sees it (through /proc/PID/root, for a
// process in another mount namespace), for an object it does not map yet:
// a gated child's libraries before its exec.
func OpenIn(pid int, path string) (*Object, error) {
	if pid > 0 {
		if f, err := os.Open(fmt.Sprintf("/proc/%d/root%s", pid, path)); err == nil {
			return openFile(f, path, processRoots(pid))
		}
	}
	return Open(path)
}

// openFile takes ownership of f.
func openFile(f *os.File, path string, roots []string) (*Object, error) {
	_, key, ok := fileIdentity(f)
	if !ok {
		o, err := newObject(f, path, roots)
		if err != nil {
			f.Close()
		}
		return o, err
	}
	objects.Lock()
	defer objects.Unlock()
	if c, ok := objects.m[key]; ok {
		f.Close()
		return c.obj, c.err
	}
	o, err := newObject(f, path, roots)
	if err != nil {
		f.Close()
	}
	objects.m[key] = cachedObject{o, err}
	return o, err
}

func fileIdentity(f *os.File) (ino uint64, key fileKey, ok bool) {
	fi, err := f.Stat()
	if err != nil {
		return 0, key, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, key, false
	}
	key = fileKey{dev: uint64(st.Dev), ino: uint64(st.Ino), size: int64(st.Size), mtime: fi.ModTime().UnixNano()}
	return uint64(st.Ino), key, true
}

func newObject(r io.ReaderAt, path string, roots []string) (o *Object, err error) {
	defer func() {
		if p := recover(); p != nil {
			o, err = nil, fmt.Errorf("reading ELF %s: malformed file: %v", path, p)
		}
	}()
	ef, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("reading ELF %s: %w", path, err)
	}
	o = &Object{path: path, r: r, file: ef, roots: roots}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			o.loads = append(o.loads, p.ProgHeader)
		}
	}
	o.buildID = readBuildID(ef)
	return o, nil
}

// Path is the path the object was first opened by.
func (o *Object) Path() string { return o.path }

// BuildID is the object's GNU build ID in hex, or "" when it has none.
func (o *Object) BuildID() string { return fmt.Sprintf("%x", o.buildID) }

// DebugFile is the path of the detached debug file used for this object, or
// "" when none was found.
func (o *Object) DebugFile() string {
	if d := o.debugInfo(); d != nil {
		return d.path
	}
	return ""
}

// Stripped reports whether neither the object nor its debug file has a
// .symtab, leaving only exported (.dynsym) functions.
func (o *Object) Stripped() bool {
	o.loadSymbols()
	return !o.hasTab
}

// FileOffset converts a virtual address of the object to the offset in the
// file holding its bytes, which is what uprobes are placed by.
func (o *Object) FileOffset(vaddr uint64) (uint64, error) {
	for _, p := range o.loads {
		if vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("converting 0x%x in %s to a file offset: not in a loaded segment's file contents", vaddr, o.path)
}

// ReadAt reads the object's file at offset off: the bytes of a function,
// for placing a probe on it, are those of the file mapped, not of
// whatever file now has its path.
func (o *Object) ReadAt(p []byte, off int64) (int, error) { return o.r.ReadAt(p, off) }

// CFI returns the object's call-frame information for the unwinder, read
// on first use, or nil when it has none that can be read.
func (o *Object) CFI() *unwind.Object {
	o.cfiOnce.Do(func() {
		// Without CFI the unwinder falls back to frame pointers, as for
		// code in no file; why it could not be read changes nothing.
		o.cfi, _ = unwind.New(o.path, o.file)
		if o.cfi != nil && !o.cfi.HasCFI() {
			o.cfi = nil
		}
	})
	return o.cfi
}

// ELF is the object's ELF file, for readers of what this package does not
// interpret (the probe placement's call sites).
func (o *Object) ELF() *elf.File { return o.file }

// CodeSegment returns the file extent of the object's first executable
// loaded segment.
func (o *Object) CodeSegment() (off, size uint64, ok bool) {
	for _, p := range o.loads {
		if p.Flags&elf.PF_X != 0 {
			return p.Off, p.Filesz, true
		}
	}
	return 0, 0, false
}

// Interpreter is the program interpreter (dynamic loader) an executable
// names, or "" when it names none.
func (o *Object) Interpreter() string {
	for _, p := range o.file.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return strings.TrimRight(string(b), "\x00")
			}
		}
	}
	return ""
}

// inBSS reports whether vaddr is in the part of a loaded segment only
// present in memory (.bss past the file's contents).
func (o *Object) inBSS(vaddr uint64) bool {
	for _, p := range o.loads {
		if vaddr >= p.Vaddr+p.Filesz && vaddr < p.Vaddr+p.Memsz {
			return true
		}
	}
	return false
}

// bias returns how far the object was moved when mapped as m: the process
// address of a virtual address v is v+bias.
func (o *Object) bias(m Mapping) (uint64, bool) {
	page := uint64(os.Getpagesize())
	var found bool
	var bias uint64
	for _, p := range o.loads {
		off := p.Off &^ (page - 1)
		if p.Filesz == 0 || m.Offset < off || m.Offset >= p.Off+p.Filesz {
			continue
		}
		b := m.Start - (p.Vaddr &^ (page - 1)) - (m.Offset - off)
		// Old linkers map one file page into two segments; the
		// permissions tell which one this mapping is.
		if m.Executable() == (p.Flags&elf.PF_X != 0) {
			return b, true
		}
		if !found {
			bias, found = b, true
		}
	}
	return bias, found
}

// Frames symbolizes vaddr inside the object: the function holding it and,
// with DWARF, the source line and the functions inlined there, innermost
// first. Addr is vaddr; Object is the object's path. It never returns an
// empty slice.
func (o *Object) Frames(vaddr uint64) []events.Frame {
	return o.frames(vaddr, vaddr, o.path)
}

// frames looks up lookup (the address itself, or a return address minus
// one) and reports frames at addr, the object-relative address shown.
func (o *Object) frames(lookup, addr uint64, objName string) []events.Frame {
	o.loadSymbols()
	var fn string
	var start uint64
	haveSym := false
	if i := o.funcs.lookup(lookup, false); i >= 0 {
		s := &o.funcs.syms[i]
		fn, start, haveSym = demangleName(s.name), s.value, true
	}
	var chain []sourceFrame
	if dw := o.dwarfData(); dw != nil {
		chain = dw.frames(lookup)
	}
	if len(chain) == 0 {
		// Without a function, Offset is the object-relative address, the
		// same in every run: "libx.so+0x112e", as TSan and perf name it.
		f := events.Frame{Addr: addr, Object: objName, Offset: addr}
		if haveSym {
			f.Function, f.Offset = fn, offsetFrom(addr, start)
		}
		return []events.Frame{f}
	}
	out := make([]events.Frame, len(chain))
	for i, c := range chain {
		out[i] = events.Frame{
			Addr:     addr,
			Function: c.function,
			Offset:   offsetFrom(addr, c.start),
			File:     c.file,
			Line:     uint32(c.line),
			Object:   objName,
		}
	}
	// The outermost frame is the real function: the symbol table names it
	// fully (DWARF gives C++ methods unqualified) and knows its start.
	if outer := &out[len(out)-1]; haveSym {
		outer.Function, outer.Offset = fn, offsetFrom(addr, start)
	}
	return out
}

func offsetFrom(addr, start uint64) uint64 {
	if addr < start {
		return 0
	}
	return addr - start
}

// dataName names the data symbol holding vaddr as "sym[+0xoff] (object)".
func (o *Object) dataName(vaddr uint64, objName string) (string, bool) {
	s, ok := o.DataAt(vaddr)
	if !ok {
		return "", false
	}
	name := s.Name
	if vaddr > s.Value {
		name += fmt.Sprintf("+0x%x", vaddr-s.Value)
	}
	return name + " (" + filepath.Base(objName) + ")", true
}

// ExeIsGo reports whether the ELF file at path was built by the Go
// toolchain.
func ExeIsGo(path string) bool {
	o, err := Open(path)
	return err == nil && o.IsGo()
}

// IsGo reports whether the object was built by the Go toolchain.
// Uretprobes corrupt Go programs, whose stacks move.
func (o *Object) IsGo() bool {
	if o.file.Section(".go.buildinfo") != nil || o.file.Section(".gopclntab") != nil {
		return true
	}
	_, err := o.Func("runtime.main")
	return err == nil
}
