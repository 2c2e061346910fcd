//go:build linux && amd64

package unwind

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
)

// maxSectionSize bounds how much of a CFI section is loaded; real ones are a
// few MiB at most.
const maxSectionSize = 512 << 20

// pageSize is the x86-64 page size; mappings start at page-aligned offsets.
const pageSize = 4096

// Object holds the call-frame information of one ELF file, ready for lookups
// by link-time address. It does not keep the file open. An Object is
// immutable after Open and safe for concurrent use; callers should cache one
// per file since opening parses every CIE and may build an FDE index.
type Object struct {
	path       string
	ehFrame    *cfiSection // nil when absent
	debugFrame *cfiSection // nil when absent
	loads      []loadSegment
}

// loadSegment is a PT_LOAD program header, kept to translate mappings into a
// load bias.
type loadSegment struct {
	vaddr, offset, filesz uint64
}

// Open reads the CFI of the ELF file at path. An object without any CFI is
// not an error: unwinding through it falls back to frame pointers.
func Open(path string) (*Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	return OpenReader(path, f)
}

// OpenReader is Open for an ELF image that is not a plain file, such as the
// vDSO copied out of a process. name is only used in messages.
func OpenReader(name string, r io.ReaderAt) (obj *Object, err error) {
	defer func() {
		if p := recover(); p != nil {
			obj, err = nil, fmt.Errorf("opening %s: malformed ELF: %v", name, p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", name, err)
	}
	obj, err = newObject(name, f)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return obj, nil
}

func newObject(path string, f *elf.File) (*Object, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("unsupported ELF %v %v, want 64-bit x86-64", f.Class, f.Machine)
	}
	o := &Object{path: path}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			o.loads = append(o.loads, loadSegment{vaddr: p.Vaddr, offset: p.Off, filesz: p.Filesz})
		}
	}

	eh, ehAddr, err := sectionData(f, ".eh_frame")
	if err != nil {
		return nil, err
	}
	hdr, hdrAddr, err := sectionData(f, ".eh_frame_hdr")
	if err != nil {
		return nil, err
	}
	debug, _, err := sectionData(f, ".debug_frame")
	if err != nil {
		return nil, err
	}
	if o.ehFrame, err = loadEHFrame(eh, ehAddr, hdr, hdrAddr); err != nil {
		return nil, err
	}
	if o.debugFrame, err = loadDebugFrame(debug); err != nil {
		return nil, err
	}
	return o, nil
}

// sectionData returns the contents and link-time address of a section, or
// nil when the file has no such section with contents. Separate debug files
// keep .eh_frame as a NOBITS placeholder, which counts as absent.
func sectionData(f *elf.File, name string) ([]byte, uint64, error) {
	s := f.Section(name)
	if s == nil || s.Type == elf.SHT_NOBITS || s.Size == 0 {
		return nil, 0, nil
	}
	if s.Size > maxSectionSize {
		return nil, 0, fmt.Errorf("section %s too large (%d bytes)", name, s.Size)
	}
	data, err := s.Data()
	if err != nil {
		return nil, 0, fmt.Errorf("reading section %s: %w", name, err)
	}
	return data, s.Addr, nil
}

// loadEHFrame prepares .eh_frame for lookups, using the .eh_frame_hdr search
// table when it is usable and a freshly built index otherwise.
func loadEHFrame(eh []byte, ehAddr uint64, hdr []byte, hdrAddr uint64) (*cfiSection, error) {
	if len(eh) == 0 {
		return nil, nil
	}
	s := &cfiSection{name: ".eh_frame", data: eh, addr: ehAddr, isEH: true}
	if len(hdr) > 0 {
		s.hdr = parseHdr(hdr, hdrAddr, ehAddr)
	}
	if err := s.scan(s.hdr == nil); err != nil {
		return nil, err
	}
	return s, nil
}

// loadDebugFrame prepares .debug_frame, which has no search table. Its
// addresses are link-time addresses like those of .eh_frame.
func loadDebugFrame(data []byte) (*cfiSection, error) {
	if len(data) == 0 {
		return nil, nil
	}
	s := &cfiSection{name: ".debug_frame", data: data}
	if err := s.scan(true); err != nil {
		return nil, err
	}
	return s, nil
}

// Path returns the path (or name) the object was opened from.
func (o *Object) Path() string { return o.path }

// HasCFI reports whether the object has any call-frame information.
func (o *Object) HasCFI() bool { return o.ehFrame != nil || o.debugFrame != nil }

// LoadBias returns the bias of a mapping of this object, given the mapping's
// start address and file offset as listed in /proc/PID/maps: runtime address
// = link-time address + bias.
func (o *Object) LoadBias(mapStart, mapOffset uint64) (uint64, error) {
	for _, seg := range o.loads {
		pageStart := seg.offset &^ (pageSize - 1)
		if mapOffset >= pageStart && mapOffset < seg.offset+seg.filesz {
			// The mapping places file offset seg.offset at
			// mapStart + (seg.offset - mapOffset); the segment wants it at
			// seg.vaddr. Unsigned wrap-around keeps this right either way.
			return mapStart + (seg.offset - mapOffset) - seg.vaddr, nil
		}
	}
	return 0, fmt.Errorf("no loadable segment of %s contains file offset 0x%x", o.path, mapOffset)
}

// ruleAt returns the unwinding rules at a link-time pc, preferring .eh_frame
// (what the runtime itself uses) over .debug_frame.
func (o *Object) ruleAt(pc uint64, out *row) error {
	var firstErr error
	for _, s := range [2]*cfiSection{o.ehFrame, o.debugFrame} {
		if s == nil {
			continue
		}
		f, err := s.find(pc)
		if err == nil {
			return computeRow(&f, pc, out)
		}
		if firstErr == nil && !errors.Is(err, errNoFDE) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return firstErr
	}
	return errNoFDE
}
