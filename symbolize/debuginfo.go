//go:build linux && amd64

package symbolize

import (
	"bytes"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// debugDir is where distributions install detached debug files
// (Debian's *-dbg and *-dbgsym packages, Fedora's debuginfo).
const debugDir = "/usr/lib/debug"

// maxDWARFSize bounds the DWARF read into memory for one object; larger
// debug info is ignored rather than risk exhausting memory.
const maxDWARFSize = 1 << 30

// debugFile is a detached debug file: an ELF holding the .symtab and DWARF
// stripped from the object it belongs to.
type debugFile struct {
	path string
	file *elf.File
}

// debugInfo finds the object's debug file once.
func (o *Object) debugInfo() *debugFile {
	o.debugOnce.Do(func() {
		o.debug = findDebugFile(o)
	})
	return o.debug
}

// findDebugFile looks up the debug file by build ID, then by .gnu_debuglink,
// the way gdb does. A candidate must prove it belongs to the object (same
// build ID, or the debuglink checksum) so stale debug files are not used.
func findDebugFile(o *Object) *debugFile {
	roots := append([]string{""}, o.roots...)
	if len(o.buildID) >= 2 {
		id := hex.EncodeToString(o.buildID)
		for _, root := range roots {
			path := filepath.Join(root, debugDir, ".build-id", id[:2], id[2:]+".debug")
			if d := openDebugFile(path, func(ef *elf.File, _ *os.File) bool {
				return bytes.Equal(readBuildID(ef), o.buildID)
			}); d != nil {
				return d
			}
		}
	}
	name, crc, ok := debugLink(o.file)
	if !ok || strings.HasPrefix(o.path, "[") {
		return nil
	}
	dir := filepath.Dir(o.path)
	for _, root := range roots {
		for _, path := range []string{
			filepath.Join(root, dir, name),
			filepath.Join(root, dir, ".debug", name),
			filepath.Join(root, debugDir, dir, name),
		} {
			if path == filepath.Join(root, o.path) {
				continue
			}
			if d := openDebugFile(path, func(_ *elf.File, f *os.File) bool {
				return fileCRC(f) == crc
			}); d != nil {
				return d
			}
		}
	}
	return nil
}

func openDebugFile(path string, belongs func(*elf.File, *os.File) bool) (d *debugFile) {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			d = nil
		}
		if d == nil {
			f.Close()
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil || !belongs(ef, f) {
		return nil
	}
	// The debug file stays open for as long as the object: DWARF and
	// symbols are read from it lazily.
	return &debugFile{path: path, file: ef}
}

// fileCRC is the CRC-32 .gnu_debuglink records for its debug file.
func fileCRC(f *os.File) uint32 {
	h := crc32.NewIEEE()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return 0
	}
	return h.Sum32()
}

// readBuildID returns the NT_GNU_BUILD_ID note's contents, from the note
// sections or, in files without section headers, the PT_NOTE segments.
func readBuildID(ef *elf.File) []byte {
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		if data, err := s.Data(); err == nil {
			if id := findBuildIDNote(data, ef.ByteOrder); id != nil {
				return id
			}
		}
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<20 {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err == nil {
			if id := findBuildIDNote(data, ef.ByteOrder); id != nil {
				return id
			}
		}
	}
	return nil
}

// findBuildIDNote walks ELF notes: namesz, descsz, type, then the name and
// the descriptor, each padded to 4 bytes.
func findBuildIDNote(data []byte, bo binary.ByteOrder) []byte {
	const ntGNUBuildID = 3
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	for len(data) >= 12 {
		namesz, descsz, typ := uint64(bo.Uint32(data)), uint64(bo.Uint32(data[4:])), bo.Uint32(data[8:])
		data = data[12:]
		if align(namesz)+align(descsz) > uint64(len(data)) {
			return nil
		}
		name := data[:namesz]
		desc := data[align(namesz) : align(namesz)+descsz]
		if typ == ntGNUBuildID && string(bytes.TrimRight(name, "\x00")) == "GNU" && len(desc) > 0 {
			return bytes.Clone(desc)
		}
		data = data[align(namesz)+align(descsz):]
	}
	return nil
}

// debugLink reads .gnu_debuglink: a file name, padding to 4 bytes, and the
// debug file's CRC-32.
func debugLink(ef *elf.File) (name string, crc uint32, ok bool) {
	s := ef.Section(".gnu_debuglink")
	if s == nil || s.Type == elf.SHT_NOBITS {
		return "", 0, false
	}
	data, err := s.Data()
	if err != nil {
		return "", 0, false
	}
	end := bytes.IndexByte(data, 0)
	if end <= 0 {
		return "", 0, false
	}
	name = string(data[:end])
	at := (end + 4) &^ 3
	if at+4 > len(data) || strings.Contains(name, "/") {
		return "", 0, false
	}
	return name, ef.ByteOrder.Uint32(data[at:]), true
}

// hasDWARF reports whether ef carries DWARF with contents (a stripped
// object's debug file keeps the section headers of what was removed, as
// NOBITS, and vice versa), and whether it is small enough to load.
func hasDWARF(ef *elf.File) bool {
	var info bool
	var total uint64
	for _, s := range ef.Sections {
		if !strings.HasPrefix(s.Name, ".debug_") && !strings.HasPrefix(s.Name, ".zdebug_") {
			continue
		}
		if s.Type == elf.SHT_NOBITS {
			continue
		}
		total += s.Size
		if strings.HasSuffix(s.Name, "debug_info") && s.Size > 0 {
			info = true
		}
	}
	return info && total <= maxDWARFSize
}

func loadDWARF(ef *elf.File) (d *dwarf.Data, err error) {
	defer func() {
		if p := recover(); p != nil {
			d, err = nil, fmt.Errorf("malformed DWARF: %v", p)
		}
	}()
	return ef.DWARF()
}

// dwarfData loads the DWARF of the object, or else of its debug file, on
// first use.
// PrefetchDWARF starts reading the object's DWARF in the background, for
// a recorder that knows early that stacks in it will be named with their
// inlined frames: libc's, with libc6-dbg, is megabytes to decompress (about
// 130 ms of CPU), which otherwise starts when the first stack arrives,
// after a short program has already exited.
func (o *Object) PrefetchDWARF() { go o.dwarfData() }

func (o *Object) dwarfData() *dwarfInfo {
	o.dwarfOnce.Do(func() {
		files := []*elf.File{o.file}
		if d := o.debugInfo(); d != nil {
			files = append(files, d.file)
		}
		for _, ef := range files {
			if !hasDWARF(ef) {
				continue
			}
			if d, err := loadDWARF(ef); err == nil {
				o.dwarf = newDwarfInfo(d)
				return
			}
		}
	})
	return o.dwarf
}
