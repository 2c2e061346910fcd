//go:build linux && amd64

package placement

import (
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"testing"
)

const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// measuredLibcBuildID is the Debian glibc 2.36 build whose code the exact
// offsets below were read from (gdb disassemble /r) and timed against.
const measuredLibcBuildID = "93ac61ec5a8eb1396f9fbd350e3169a558528a40"

func TestChooseLibc(t *testing.T) {
	f, err := elf.Open(libcPath)
	if err != nil {
		t.Skipf("no libc to read: %v", err)
	}
	defer f.Close()
	id := buildID(f)

	tests := []struct {
		name   string
		args   int
		offset int // -1: only logged
	}{
		{"free", 1, 3},                 // test %rdi,%rdi; je
		{"malloc", 1, 0},               // push %r12
		{"pthread_mutex_lock", 1, 0xe}, // mov; mov; and; and; jne
		{"pthread_mutex_unlock", 1, 5}, // mov $1,%esi; jmp
		{"pthread_mutex_trylock", 1, -1},
		{"calloc", 2, -1},
		{"realloc", 2, -1},
		{"pthread_rwlock_unlock", 1, -1},
		{"pthread_spin_lock", 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sym, err := dynamicFunction(f, tt.name)
			if err != nil {
				t.Fatal(err)
			}
			code, err := symbolCode(f, sym)
			if err != nil {
				t.Fatal(err)
			}
			site := Choose(code, tt.args)
			t.Logf("%s (args %d): offset %#x adjust %#x %s emulated=%v probeable=%v; %s",
				tt.name, tt.args, site.Offset, site.StackAdjust, site.Mnemonic, site.Emulated, site.Probeable, site.Note)
			if tt.offset < 0 {
				return
			}
			if id != measuredLibcBuildID {
				t.Skipf("libc build-id %s is not the measured %s", id, measuredLibcBuildID)
			}
			if site.Offset != tt.offset || site.StackAdjust != 0 || !site.Emulated {
				t.Errorf("offset %#x adjust %#x emulated %v, want %#x 0 true", site.Offset, site.StackAdjust, site.Emulated, tt.offset)
			}
		})
	}
}

// dynamicFunction finds a function in .dynsym, preferring the default
// version when a name has several.
func dynamicFunction(f *elf.File, name string) (elf.Symbol, error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return elf.Symbol{}, fmt.Errorf("reading dynamic symbols: %w", err)
	}
	for _, s := range syms {
		if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 &&
			!(s.HasVersion && s.VersionIndex.IsHidden()) {
			return s, nil
		}
	}
	return elf.Symbol{}, fmt.Errorf("finding %s: not in .dynsym", name)
}

// symbolCode returns a function's bytes as stored in the file.
func symbolCode(f *elf.File, sym elf.Symbol) ([]byte, error) {
	return fileBytes(f, sym.Value, sym.Size)
}

func fileBytes(f *elf.File, addr, size uint64) ([]byte, error) {
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || addr < sec.Addr || addr+size > sec.Addr+sec.Size {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		return data[addr-sec.Addr : addr-sec.Addr+size], nil
	}
	return nil, fmt.Errorf("reading %d bytes at %#x: no section holds them", size, addr)
}

func buildID(f *elf.File) string {
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		return ""
	}
	note, err := sec.Data()
	if err != nil || len(note) < 16 {
		return ""
	}
	// Elf64_Nhdr: namesz, descsz, type, then "GNU\0" and the id.
	nameSize := binary.LittleEndian.Uint32(note[0:4])
	descSize := binary.LittleEndian.Uint32(note[4:8])
	start := 12 + (nameSize+3)&^3
	if uint64(start)+uint64(descSize) > uint64(len(note)) {
		return ""
	}
	return hex.EncodeToString(note[start : start+descSize])
}
