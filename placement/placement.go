//go:build linux && amd64

// Package placement chooses where in a function's prologue to put a uprobe,
// and checks that the code in a live process is still the code in the file.
//
// A uprobe costs about ten times more when the kernel has to single-step the
// probed instruction out of line than when it can emulate it (push of a
// register, relative jmp/jcc/call, nops). Many hot functions start with a
// single-stepped instruction (free: test %rdi,%rdi) and reach an emulated
// one a few bytes later (je), so probing there instead of at the entry cuts
// the cost of every hit, provided the move changes nothing the probe handler
// sees: every call must pass through the new site exactly once, the argument
// registers it reads must still hold the arguments, and it must still find
// the return address, which the Site's StackAdjust locates.
//
// Where a function has no such instruction before it returns (glibc's
// pthread_rwlock_destroy is `xor %eax,%eax; ret`), CallSites finds its
// callers' calls of it through their PLT instead, which the kernel
// emulates (callsite.go).
package placement

import (
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// The window past the entry in which a site is looked for. Prologues reach
// their first branch well within it, and a tight window keeps the probe
// close to the true entry in time.
const (
	maxInstructions = 16
	maxOffset       = 64
)

// Site is where to place the probe for one function.
type Site struct {
	// Offset is the distance in bytes from the function entry to the
	// probed instruction.
	Offset int
	// Refires: a branch in the function jumps back to its entry, so a site
	// past the entry fires again on that path within one call (glibc's
	// pthread_spin_lock retries its lock-prefixed entry after spinning).
	Refires bool
	// StackAdjust is how many bytes rsp sits below its entry value when
	// the probe at Offset fires: the return address is at [rsp+StackAdjust]
	// and stack-passed arguments follow it.
	StackAdjust int
	// Mnemonic is the probed instruction's operation, such as "je".
	Mnemonic string
	// Instruction is the probed instruction in AT&T syntax; branch targets
	// are shown as offsets from the function entry ("je +0xc8").
	Instruction string
	// Emulated reports whether the kernel emulates the probed instruction
	// rather than single-stepping it.
	Emulated bool
	// Probeable is false when the kernel refuses a uprobe on the probed
	// instruction (a lock or cs/ds/es/ss prefix), or would run it wrongly.
	// It can be false only when Choose fell back to the entry.
	Probeable bool
	// Note explains the choice, or why Choose fell back to the entry.
	Note string
}

// Choose picks the probe site for a function, given its code from the entry
// and how many integer argument registers (rdi, rsi, rdx, rcx, r8, r9, in
// that order) the probe handler reads.
//
// It scans forward from the entry through straight-line code and returns the
// first instruction the kernel emulates, as long as every instruction before
// it leaves the needed argument registers alone and moves rsp only in ways
// StackAdjust can account for. A branch may itself be the site: it executes
// on every path. The scan ends at the first branch, return, call, system
// call or instruction it does not understand; if no site was found by then,
// or within 16 instructions or 64 bytes, Choose falls back to offset 0.
//
// Pass the whole function when possible: Choose also refuses a site that a
// later branch in the function jumps back to (or before), since the probe
// would then fire more than once per call or without the entry having run.
func Choose(code []byte, args int) Site {
	args = max(0, min(args, len(argumentRegisters)))
	needed := setOf(argumentRegisters[:args]...)

	var passed []string // single-stepped instructions the site skips
	stackDown := 0
	entryRefused := "" // why the entry itself cannot be probed, if it cannot
	for off, n := 0, 0; n < maxInstructions && off < maxOffset; n++ {
		in, err := decodeAt(code, off)
		if err != nil {
			return fallback(code, fmt.Sprintf("no emulated instruction before undecodable bytes at %s", offsetText(off)))
		}
		if off == 0 {
			entryRefused = in.refused
		}
		if in.emulated && in.refused == "" {
			if from, to, ok := branchInto(code, off); ok {
				return fallback(code, fmt.Sprintf("%s at %s would fire again: the branch at %s jumps to %s",
					in.text, offsetText(off), offsetText(from), offsetText(to)))
			}
			site := Site{
				Offset:      off,
				StackAdjust: stackDown,
				Mnemonic:    in.mnemonic,
				Instruction: in.text,
				Emulated:    true,
				Probeable:   true,
				Note:        siteNote(off, in.text, passed, needed, stackDown),
			}
			if entryRefused != "" {
				site.Note += "; the entry could not be probed anyway: " + entryRefused
			}
			if off > 0 && branchToEntry(code) {
				site.Refires = true
				site.Note += "; a branch back to the entry makes it fire again within a call"
			}
			return site
		}
		e := in.effect
		if e.stop != "" {
			return fallback(code, fmt.Sprintf("%s at %s %s before any emulated instruction", in.text, offsetText(off), e.stop))
		}
		if clobbered := e.writes & needed; clobbered != 0 {
			return fallback(code, fmt.Sprintf("%s at %s writes %s before any emulated instruction", in.text, offsetText(off), clobbered))
		}
		stackDown += e.stackDown
		if stackDown < 0 {
			return fallback(code, fmt.Sprintf("%s at %s moves rsp above its entry value", in.text, offsetText(off)))
		}
		passed = append(passed, in.text)
		off += in.length
	}
	return fallback(code, fmt.Sprintf("no emulated instruction within %d instructions or %d bytes", maxInstructions, maxOffset))
}

func siteNote(off int, text string, passed []string, needed registerSet, stackDown int) string {
	note := fmt.Sprintf("%s: %s (emulated)", offsetText(off), text)
	if stackDown != 0 {
		note += fmt.Sprintf("; return address at [rsp+%#x]", stackDown)
	}
	switch {
	case len(passed) == 0:
		return note
	case needed == 0:
		return note + "; skipped: " + strings.Join(passed, "; ")
	}
	return note + fmt.Sprintf("; skipped instructions leave %s intact: %s", needed, strings.Join(passed, "; "))
}

// fallback probes the entry, which is always correct, only slower.
func fallback(code []byte, why string) Site {
	site := Site{Note: "+0: fell back to the entry: " + why}
	in, err := decodeAt(code, 0)
	if err != nil {
		return site
	}
	site.Mnemonic = in.mnemonic
	site.Instruction = in.text
	site.Emulated = in.emulated
	site.Probeable = in.refused == ""
	if in.refused != "" {
		site.Note += "; and " + in.refused
	}
	return site
}

func offsetText(off int) string {
	switch {
	case off == 0:
		return "+0"
	case off < 0:
		return fmt.Sprintf("-%#x", -off)
	}
	return fmt.Sprintf("+%#x", off)
}

// instructionText renders AT&T syntax, with a relative branch's target
// written as an offset from the function entry ("je +0xc8"), which reads
// the same wherever the code is loaded.
func instructionText(inst x86asm.Inst, off int) string {
	text := x86asm.GNUSyntax(inst, 0, nil)
	for _, a := range inst.Args {
		if rel, ok := a.(x86asm.Rel); ok {
			if i := strings.LastIndexByte(text, ' '); i >= 0 {
				return text[:i+1] + offsetText(off+inst.Len+int(rel))
			}
		}
	}
	return text
}

// instruction is one decoded instruction of the scanned code.
type instruction struct {
	length   int
	mnemonic string
	text     string
	inst     x86asm.Inst // zero for endbr, which x86asm does not know
	emulated bool
	refused  string // why the kernel would not probe it, or ""
	effect   effect
}

func decodeAt(code []byte, off int) (instruction, error) {
	if off >= len(code) {
		return instruction{}, fmt.Errorf("decoding at %s: code ends", offsetText(off))
	}
	if name, ok := endbr(code[off:]); ok {
		// endbr64 marks an indirect-branch target and otherwise does
		// nothing; the kernel single-steps it (measured), so it is
		// passed over like any other harmless instruction.
		enc := splitEncoding(code[off : off+4])
		return instruction{length: 4, mnemonic: name, text: name, emulated: emulatedByKernel(enc), refused: refusedByKernel(enc)}, nil
	}
	inst, err := x86asm.Decode(code[off:], 64)
	if err != nil {
		return instruction{}, fmt.Errorf("decoding at %s: %w", offsetText(off), err)
	}
	if inst.Op == 0 || inst.Len == 0 {
		// x86asm reports an instruction it cannot name as a bare prefix.
		return instruction{}, fmt.Errorf("decoding at %s: unknown instruction", offsetText(off))
	}
	enc := splitEncoding(code[off : off+inst.Len])
	return instruction{
		length:   inst.Len,
		mnemonic: strings.ToLower(inst.Op.String()),
		text:     instructionText(inst, off),
		inst:     inst,
		emulated: emulatedByKernel(enc),
		refused:  refusedByKernel(enc),
		effect:   effectOf(inst),
	}, nil
}

func endbr(code []byte) (string, bool) {
	if len(code) < 4 || code[0] != 0xf3 || code[1] != 0x0f || code[2] != 0x1e {
		return "", false
	}
	switch code[3] {
	case 0xfa:
		return "endbr64", true
	case 0xfb:
		return "endbr32", true
	}
	return "", false
}

// branchToEntry reports whether a relative branch in code targets its
// first byte.
func branchToEntry(code []byte) bool {
	_, _, found := findBranch(code, func(target int) bool { return target == 0 })
	return found
}

// branchInto finds a relative branch anywhere in code whose target lies in
// (0, site]. A target of exactly 0 re-enters the function at its entry,
// which an entry probe would see as a new call too, so it is allowed.
func branchInto(code []byte, site int) (from, to int, found bool) {
	return findBranch(code, func(target int) bool { return target > 0 && target <= site })
}

// findBranch finds the first relative branch in code whose target (an
// offset in code) is wanted. The sweep is linear and steps over
// undecodable bytes one at a time; a sweep knocked out of step could
// invent a target (a needless fallback) or miss one, but compilers keep
// data out of x86-64 functions.
func findBranch(code []byte, wanted func(target int) bool) (from, to int, found bool) {
	for off := 0; off < len(code); {
		in, err := decodeAt(code, off)
		if err != nil {
			off++
			continue
		}
		for _, a := range in.inst.Args {
			if rel, ok := a.(x86asm.Rel); ok {
				if target := off + in.length + int(rel); wanted(target) {
					return off, target, true
				}
			}
		}
		off += in.length
	}
	return 0, 0, false
}
