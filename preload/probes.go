//go:build linux && amd64

package preload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"

	"golang.org/x/arch/x86/x86asm"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/probesite"
)

// writeProbes fills the shim's probe table (src/shm.h's struct shm_probe
// at shmOffProbes: --probe and --forbid functions, which the shim breaks on
// in the process with int3 and a SIGTRAP handler and resumes at a displaced
// copy of their first instruction) with the user's functions: where each
// is (object and address) and its first instruction. An instruction that
// would not do the same at another address (relative to the instruction
// pointer, or a transfer of control) is refused with the reason.
func (p *Preload) writeProbes(plan []probesite.Site, exe string) error {
	exeCanon := exe
	if c, err := filepath.EvalSymlinks(exe); err == nil {
		exeCanon = c
	}
	n := 0
	var sites []events.ProbeSite
	for _, s := range plan {
		if s.UserIdx < 0 {
			continue
		}
		if n == shmProbes {
			return fmt.Errorf("--probe: more than %d functions (clones included) to break on", shmProbes)
		}
		inst, dispAt, err := entry(s, p.opts.UserProbes[s.UserIdx])
		if err != nil {
			return err
		}
		e := p.mem[shmOffProbes+n*shmProbeBytes : shmOffProbes+(n+1)*shmProbeBytes]
		clear(e)
		// The executable is the object without a name in the loader's
		// list; a library is found by its file name.
		if s.Object != exeCanon {
			copy(e[shmProbeObject:shmProbeObject+shmProbeObjectSize-1], filepath.Base(s.Object))
		}
		binary.LittleEndian.PutUint64(e[shmProbeVaddr:], s.Sym.Value)
		binary.LittleEndian.PutUint32(e[shmProbeIndex:], uint32(s.UserIdx))
		e[shmProbeLen] = byte(inst.Len)
		e[shmProbeDispAt] = byte(dispAt)
		copy(e[shmProbeInsn:shmProbeInsn+shmProbeInsnSize], s.Code[:inst.Len])
		n++
		sites = append(sites, events.ProbeSite{Name: s.Sym.Mangled, Object: s.Object, Address: s.Sym.Value,
			Kind: "breakpoint", Note: "--probe " + p.opts.UserProbes[s.UserIdx]})
	}
	binary.LittleEndian.PutUint32(p.mem[shmOffNprobes:], uint32(n))
	p.imagesMu.Lock()
	p.breakpoints = sites
	p.imagesMu.Unlock()
	return nil
}

// EntryError says why the shim cannot break on a --probe function: its
// first instruction would not do the same from a displaced copy.
type EntryError struct {
	Probe string // as the user named it
	Inst  string // the instruction
	Why   string
}

// Reason is the error without its advice.
func (e *EntryError) Reason() string {
	return fmt.Sprintf("--probe %s: its first instruction (%s) %s", e.Probe, e.Inst, e.Why)
}

func (e *EntryError) Error() string { return e.Reason() + "; use --recorder ebpf" }

// entry decodes the first instruction of s, the user's probe spec, which
// the shim runs from a copy, and finds its rip-relative displacement.
func entry(s probesite.Site, spec string) (x86asm.Inst, int, error) {
	if len(s.Code) == 0 {
		return x86asm.Inst{}, 0, fmt.Errorf("--probe %s: its code could not be read", spec)
	}
	inst, err := x86asm.Decode(s.Code, 64)
	if err != nil {
		return x86asm.Inst{}, 0, &EntryError{Probe: spec, Inst: fmt.Sprintf("% x", s.Code[:min(len(s.Code), 8)]),
			Why: "could not be decoded: " + err.Error()}
	}
	dispAt, why := displacement(inst, s.Code[:inst.Len])
	if why != "" {
		return x86asm.Inst{}, 0, &EntryError{Probe: spec, Inst: inst.String(), Why: why}
	}
	return inst, dispAt, nil
}

// CheckProbes says, before exe runs, whether the shim can break on each of
// probes: an *EntryError names one it cannot. Other errors (a function
// not found) are the same whichever recorder runs.
func CheckProbes(exe string, probes []string) error {
	plan, err := probesite.PlanSites(0, exe, probes, func(string) {})
	if err != nil {
		return err
	}
	for _, s := range plan {
		if s.UserIdx < 0 {
			continue
		}
		if _, _, err := entry(s, probes[s.UserIdx]); err != nil {
			return err
		}
	}
	return nil
}

// displacement says where in code (inst's bytes) a rip-relative
// displacement is, which the shim adjusts for the copy's address (0 for
// none), or why the instruction cannot run elsewhere.
func displacement(inst x86asm.Inst, code []byte) (int, string) {
	switch inst.Op {
	case x86asm.RET, x86asm.JMP, x86asm.CALL, x86asm.INT, x86asm.SYSCALL:
		return 0, "transfers control"
	}
	for _, a := range inst.Args {
		switch a := a.(type) {
		case x86asm.Rel:
			return 0, "is relative to the instruction pointer"
		case x86asm.Mem:
			if a.Base != x86asm.RIP {
				continue
			}
			// The displacement's 4 bytes, after the opcode and
			// ModRM, before any immediate: the last match.
			var d [4]byte
			binary.LittleEndian.PutUint32(d[:], uint32(int32(a.Disp)))
			for at := len(code) - 4; at >= 2; at-- {
				if bytes.Equal(code[at:at+4], d[:]) {
					return at, ""
				}
			}
			return 0, "has a rip-relative operand hooktrace could not locate"
		}
	}
	return 0, ""
}
