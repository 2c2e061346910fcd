//go:build linux && amd64

package placement

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"

	"golang.org/x/arch/x86/x86asm"

	"github.com/hooktrace/hooktrace/symbolize"
)

var (
	// ErrPatched means the live code differs from the file in a way no
	// uprobe or debugger breakpoint explains: a runtime patcher (Open MPI,
	// UCX) has redirected the function, typically by overwriting its entry
	// with movabs $hook,%r11; jmp *%r11. A uprobe runs the instruction it
	// copied from the file, not the patched one, and resumes after it, in
	// the middle of the patch: the target dies with SIGSEGV. Never probe
	// such a site.
	ErrPatched = errors.New("live code differs from the file")

	// ErrBreakpoint means the only differences are breakpoints: uprobes
	// (another tracer's, or this tracer's own from an earlier attach) or a
	// debugger's int3. Adding a uprobe is safe: the kernel keeps one uprobe
	// per file offset and shares it among consumers. A debugger's int3 at
	// the same spot would be taken over by the uprobe, which disturbs the
	// debugger, not the target.
	ErrBreakpoint = errors.New("live code carries breakpoints")
)

// CheckLive compares the code at addr in process pid with fileBytes, the same
// code as read from the ELF file. Pass the bytes from the function entry
// through the end of the probed instruction, and at least the 13 bytes of a
// movabs/jmp patch. It returns nil when they match, and an error wrapping
// ErrPatched or ErrBreakpoint, with both byte strings, when they do not.
//
// A uprobe shows in /proc/PID/mem, as observed on Linux 6.18: the kernel
// writes an int3 (0xcc) over the first byte of the probed instruction in the
// process's copy of the page, so a probe at free+3 reads back as
// 48 85 ff cc 84 bf 00 00 00. A uprobe on a 5-byte nop is rewritten, after
// its first hit, into a call rel32 into the process's
// "[uprobes-trampoline]" mapping; both forms count as breakpoints here.
// While the kernel is switching a nop to that call, a reader can catch an
// int3 followed by half-written bytes and report ErrPatched; checking again
// settles it.
func CheckLive(pid int, addr uint64, fileBytes []byte) error {
	live, err := readLive(pid, addr, len(fileBytes))
	if err != nil {
		return err
	}
	if bytes.Equal(live, fileBytes) {
		return nil
	}
	details := fmt.Sprintf("at %#x in pid %d: live % x, file % x", addr, pid, live, fileBytes)
	onlyBreakpoints, err := onlyBreakpoints(pid, addr, live, fileBytes)
	if err != nil {
		return fmt.Errorf("%w %s (%w)", ErrPatched, details, err)
	}
	if onlyBreakpoints {
		return fmt.Errorf("%w %s", ErrBreakpoint, details)
	}
	return fmt.Errorf("%w %s", ErrPatched, details)
}

func readLive(pid int, addr uint64, n int) ([]byte, error) {
	if addr > math.MaxInt64 {
		return nil, fmt.Errorf("reading code of pid %d: address %#x out of range", pid, addr)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, fmt.Errorf("reading code of pid %d: %w", pid, err)
	}
	defer mem.Close()
	live := make([]byte, n)
	if _, err := mem.ReadAt(live, int64(addr)); err != nil {
		return nil, fmt.Errorf("reading %d bytes at %#x of pid %d: %w", n, addr, pid, err)
	}
	return live, nil
}

// onlyBreakpoints reports whether every difference is an int3 or a call
// from a 5-byte nop into the uprobe trampoline.
func onlyBreakpoints(pid int, addr uint64, live, file []byte) (bool, error) {
	var trampolines []span // read only if a call needs explaining
	for i := 0; i < len(live); i++ {
		switch {
		case live[i] == file[i], live[i] == 0xcc:
			continue
		case live[i] == 0xe8 && i+5 <= len(live) && isFiveByteNop(file[i:]):
			if trampolines == nil {
				var err error
				if trampolines, err = uprobeTrampolines(pid); err != nil {
					return false, err
				}
			}
			rel := int32(binary.LittleEndian.Uint32(live[i+1 : i+5]))
			target := addr + uint64(i) + 5 + uint64(int64(rel))
			if !contains(trampolines, target) {
				return false, nil
			}
			i += 4
		default:
			return false, nil
		}
	}
	return true, nil
}

func isFiveByteNop(code []byte) bool {
	inst, err := x86asm.Decode(code, 64)
	return err == nil && inst.Op == x86asm.NOP && inst.Len == 5
}

type span struct{ start, end uint64 }

func contains(spans []span, addr uint64) bool {
	for _, s := range spans {
		if s.start <= addr && addr < s.end {
			return true
		}
	}
	return false
}

func uprobeTrampolines(pid int) ([]span, error) {
	maps, err := symbolize.ReadMaps(pid)
	if err != nil {
		return nil, err
	}
	spans := []span{} // non-nil: read once even when empty
	for _, m := range maps {
		if m.Path == "[uprobes-trampoline]" {
			spans = append(spans, span{m.Start, m.End})
		}
	}
	return spans, nil
}
