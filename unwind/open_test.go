//go:build linux && amd64

package unwind

import (
	"debug/elf"
	"fmt"
)

// openPath builds the CFI of the ELF file at path. The tracer opens files
// through its object layer; the tests here read plain files.
func openPath(path string) (*Object, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	return New(path, f)
}

// loadBias is the bias of a mapping of path that starts at mapStart with
// file offset mapOffset, as /proc/PID/maps lists it: runtime address =
// link-time address + bias.
func loadBias(path string, mapStart, mapOffset uint64) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		if pageStart := p.Off &^ 4095; mapOffset >= pageStart && mapOffset < p.Off+p.Filesz {
			return mapStart + (p.Off - mapOffset) - p.Vaddr, nil
		}
	}
	return 0, fmt.Errorf("no loadable segment of %s contains file offset 0x%x", path, mapOffset)
}
