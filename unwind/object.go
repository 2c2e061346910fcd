//go:build linux && amd64

package unwind

import (
	"debug/elf"
	"errors"
	"fmt"
)

// maxSectionSize bounds how much of a CFI section is loaded; real ones are a
// few MiB at most.
const maxSectionSize = 512 << 20

// Object holds the call-frame information of one ELF file, ready for lookups
// by link-time address. It is built from a file the caller opened (the
// tracer's object layer, which also knows where the file is mapped and so
// the load bias), and keeps no reference to it. An Object is immutable and
// safe for concurrent use; callers should keep one per file since building
// it parses every CIE and may build an FDE index.
type Object struct {
	name       string
	ehFrame    *cfiSection // nil when absent
	debugFrame *cfiSection // nil when absent
}

// New reads the CFI of an open ELF file. An object without any CFI is not
// an error: unwinding through it falls back to frame pointers. name is
// only used in messages.
func New(name string, f *elf.File) (obj *Object, err error) {
	defer func() {
		if p := recover(); p != nil {
			obj, err = nil, fmt.Errorf("reading the CFI of %s: malformed ELF: %v", name, p)
		}
	}()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("reading the CFI of %s: unsupported ELF %v %v, want 64-bit x86-64", name, f.Class, f.Machine)
	}
	o := &Object{name: name}
	eh, ehAddr, err := sectionData(f, ".eh_frame")
	if err != nil {
		return nil, fmt.Errorf("reading the CFI of %s: %w", name, err)
	}
	hdr, hdrAddr, err := sectionData(f, ".eh_frame_hdr")
	if err != nil {
		return nil, fmt.Errorf("reading the CFI of %s: %w", name, err)
	}
	debug, _, err := sectionData(f, ".debug_frame")
	if err != nil {
		return nil, fmt.Errorf("reading the CFI of %s: %w", name, err)
	}
	if o.ehFrame, err = loadEHFrame(eh, ehAddr, hdr, hdrAddr); err != nil {
		return nil, fmt.Errorf("reading the CFI of %s: %w", name, err)
	}
	if o.debugFrame, err = loadDebugFrame(debug); err != nil {
		return nil, fmt.Errorf("reading the CFI of %s: %w", name, err)
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

// Name returns the name the object was built with.
func (o *Object) Name() string { return o.name }

// HasCFI reports whether the object has any call-frame information.
func (o *Object) HasCFI() bool { return o.ehFrame != nil || o.debugFrame != nil }

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
