//go:build linux && amd64

package unwind

import (
	"errors"
	"fmt"
)

// Sample is what the tracer captures at a probe: the registers needed to
// start unwinding and a copy of the user stack.
type Sample struct {
	IP, SP, BP uint64
	// Stack is user stack memory copied from SP upward.
	Stack []byte
}

// Resolver maps a runtime address to the CFI of the object mapped there and
// that mapping's load bias: runtime address = link-time address + bias. ok
// is false for addresses in no ELF mapping, such as JIT code.
type Resolver func(addr uint64) (obj *Object, bias uint64, ok bool)

// MaxDepth is the number of frames Unwind returns at most.
const MaxDepth = 128

// ReasonEndOfStack is the stop reason of a complete unwind: the outermost
// frame marked its return address undefined (as _start and clone do) or
// returned to address 0.
const ReasonEndOfStack = "end of stack"

// Unwind walks the sampled stack using the CFI of the objects resolve
// returns, falling back to frame pointers where there is none. pcs starts
// with s.IP followed by one return address per caller; reason says why the
// walk stopped and equals ReasonEndOfStack when it reached the outermost
// frame. Hostile or inconsistent input yields a short result, never a panic.
func Unwind(s Sample, resolve Resolver) (pcs []uint64, reason string) {
	return AppendUnwind(nil, s, resolve, MaxDepth)
}

// AppendUnwind is Unwind that appends to dst, so a caller can reuse one
// buffer, and stops after maxDepth frames.
func AppendUnwind(dst []uint64, s Sample, resolve Resolver, maxDepth int) (pcs []uint64, reason string) {
	pcs = dst
	defer func() {
		if r := recover(); r != nil {
			reason = fmt.Sprintf("internal error: %v", r)
		}
	}()
	if maxDepth <= 0 {
		return pcs, "max depth 0"
	}
	if resolve == nil {
		resolve = func(uint64) (*Object, uint64, bool) { return nil, 0, false }
	}
	mem := stackMemory{base: s.SP, data: s.Stack}
	var regs frameRegs
	regs.set(regRIP, s.IP)
	regs.set(regRSP, s.SP)
	regs.set(regRBP, s.BP)
	pcs = append(pcs, s.IP)
	// The probe's own pc is exact; every later one is a return address and
	// points after the call, possibly already into the next function.
	exactPC := true
	var rules row
	for depth := 0; ; depth++ {
		if depth+1 >= maxDepth {
			return pcs, fmt.Sprintf("max depth %d reached", maxDepth)
		}
		pc := regs.val[regRIP]
		lookupPC := pc
		if !exactPC {
			lookupPC--
		}
		var next frameRegs
		var stop string
		if err := findRules(resolve, lookupPC, &rules); err == nil {
			next, stop = stepCFI(&regs, &rules, mem, depth)
			exactPC = rules.signalFrame
		} else {
			next, stop = stepFramePointer(&regs, mem, pc, err)
			exactPC = false
		}
		if stop != "" {
			return pcs, stop
		}
		if next.val[regRSP] <= regs.val[regRSP] {
			return pcs, fmt.Sprintf("non-increasing CFA at depth %d", depth)
		}
		ra := next.val[regRIP]
		if ra == 0 {
			return pcs, ReasonEndOfStack
		}
		pcs = append(pcs, ra)
		regs = next
	}
}

// findRules looks up the unwinding rules for a runtime pc.
func findRules(resolve Resolver, pc uint64, out *row) error {
	obj, bias, ok := resolve(pc)
	if !ok || obj == nil {
		return errNotMapped
	}
	return obj.ruleAt(pc-bias, out)
}

var (
	errNotMapped   = errors.New("not in a mapped object")
	errOutsideCopy = errors.New("outside the stack copy")
)

// frameRegs holds the register values known in one frame.
type frameRegs struct {
	val   [numRegs]uint64
	known uint32 // bit i set when val[i] is valid
}

func (f *frameRegs) get(reg uint64) (uint64, bool) {
	if reg >= numRegs || f.known&(1<<reg) == 0 {
		return 0, false
	}
	return f.val[reg], true
}

func (f *frameRegs) set(reg, v uint64) {
	if reg < numRegs {
		f.val[reg] = v
		f.known |= 1 << reg
	}
}

// stackMemory is the copied stack, readable only within the copy.
type stackMemory struct {
	base uint64
	data []byte
}

func (m stackMemory) read(addr uint64) (uint64, bool) {
	if addr < m.base {
		return 0, false
	}
	off := addr - m.base
	if off > uint64(len(m.data)) || uint64(len(m.data))-off < 8 {
		return 0, false
	}
	r := reader{buf: m.data, pos: int(off)}
	return r.u64(), true
}

// calleeSaved reports whether the SysV x86-64 ABI makes a function preserve
// reg, so that a column without a rule keeps the callee's value.
func calleeSaved(reg int) bool {
	return reg == regRBX || reg == regRBP || (reg >= regR12 && reg <= regR15)
}

// stepCFI computes the caller's registers from the current frame's using the
// CFI rules at its pc. A non-empty stop ends the unwind.
func stepCFI(cur *frameRegs, rules *row, mem stackMemory, depth int) (next frameRegs, stop string) {
	pc := cur.val[regRIP]
	cfa, err := computeCFA(&rules.cfa, cur, mem)
	if err != nil {
		if errors.Is(err, errOutsideCopy) {
			return next, fmt.Sprintf("stack copy exhausted at depth %d", depth)
		}
		return next, fmt.Sprintf("computing CFA at 0x%x: %v", pc, err)
	}
	if rules.raColumn >= numRegs {
		return next, fmt.Sprintf("unsupported return address column %d at 0x%x", rules.raColumn, pc)
	}
	switch rules.regs[rules.raColumn].kind {
	case ruleUndefined:
		return next, ReasonEndOfStack
	case ruleUnspecified:
		return next, fmt.Sprintf("no return address rule at 0x%x", pc)
	}
	var raErr error
	for col := 0; col < numRegs; col++ {
		v, ok, err := recoverRegister(col, rules.regs[col], cfa, cur, mem)
		if ok {
			next.set(uint64(col), v)
		}
		if uint64(col) == rules.raColumn {
			raErr = err
			if err == nil && !ok {
				raErr = errors.New("return address not recoverable")
			}
		}
	}
	if raErr != nil {
		if errors.Is(raErr, errOutsideCopy) {
			return next, fmt.Sprintf("stack copy exhausted at depth %d", depth)
		}
		return next, fmt.Sprintf("recovering return address at 0x%x: %v", pc, raErr)
	}
	// On x86-64 the CFA is by definition the caller's stack pointer.
	next.set(regRSP, cfa)
	ra, _ := next.get(rules.raColumn)
	next.set(regRIP, ra)
	return next, ""
}

func computeCFA(rule *cfaRule, cur *frameRegs, mem stackMemory) (uint64, error) {
	if rule.expr != nil {
		return evalExpr(rule.expr, cur, mem, nil)
	}
	base, ok := cur.get(rule.reg)
	if !ok {
		return 0, fmt.Errorf("CFA register %d is not known", rule.reg)
	}
	return base + uint64(rule.offset), nil
}

// recoverRegister applies one column's rule. ok is false when the value
// cannot be known; err says why when that matters.
func recoverRegister(col int, rule regRule, cfa uint64, cur *frameRegs, mem stackMemory) (v uint64, ok bool, err error) {
	switch rule.kind {
	case ruleUnspecified:
		if calleeSaved(col) {
			v, ok = cur.get(uint64(col))
		}
	case ruleSameValue:
		v, ok = cur.get(uint64(col))
	case ruleOffset:
		v, ok = mem.read(cfa + uint64(rule.offset))
		if !ok {
			err = errOutsideCopy
		}
	case ruleValOffset:
		v, ok = cfa+uint64(rule.offset), true
	case ruleRegister:
		v, ok = cur.get(uint64(rule.reg))
	case ruleExpression:
		var addr uint64
		if addr, err = evalExpr(rule.expr, cur, mem, &cfa); err == nil {
			v, ok = mem.read(addr)
			if !ok {
				err = errOutsideCopy
			}
		}
	case ruleValExpression:
		v, err = evalExpr(rule.expr, cur, mem, &cfa)
		ok = err == nil
	}
	return v, ok, err
}

// stepFramePointer unwinds one frame by the frame-pointer convention, for
// code without CFI. It only trusts rbp when it points into the copied stack
// at or above the current stack pointer.
func stepFramePointer(cur *frameRegs, mem stackMemory, pc uint64, cfiErr error) (next frameRegs, stop string) {
	noCFI := fmt.Sprintf("no CFI for 0x%x", pc)
	if !errors.Is(cfiErr, errNoFDE) {
		noCFI += " (" + cfiErr.Error() + ")"
	}
	bp, ok := cur.get(regRBP)
	sp := cur.val[regRSP]
	if !ok || bp < sp || bp%8 != 0 {
		return next, noCFI + " and no usable frame pointer"
	}
	savedBP, ok1 := mem.read(bp)
	ra, ok2 := mem.read(bp + 8)
	if !ok1 || !ok2 {
		return next, noCFI + " and frame pointer outside the stack copy"
	}
	next.set(regRBP, savedBP)
	next.set(regRIP, ra)
	next.set(regRSP, bp+16)
	return next, ""
}
