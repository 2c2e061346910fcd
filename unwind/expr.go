//go:build linux && amd64

package unwind

import (
	"errors"
	"fmt"
)

// Compilers put DWARF expressions into x86-64 CFI in a few fixed shapes: the
// PLT's "CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)", and the stack
// realignment prologue's "CFA = *(rbp - 8)" with rbp saved at "rbp + 0".
// Rather than pattern-match those, this evaluates a small, side-effect-free
// subset of DWARF operations over the registers we know and the copied stack.
// Anything else is reported as unsupported and ends the unwind.

const maxExprStack = 16

// DW_OP_* opcodes in the supported subset.
const (
	opDeref      = 0x06
	opConst1u    = 0x08
	opConst1s    = 0x09
	opConst2u    = 0x0a
	opConst2s    = 0x0b
	opConst4u    = 0x0c
	opConst4s    = 0x0d
	opConst8u    = 0x0e
	opConst8s    = 0x0f
	opConstu     = 0x10
	opConsts     = 0x11
	opDup        = 0x12
	opDrop       = 0x13
	opOver       = 0x14
	opSwap       = 0x16
	opAnd        = 0x1a
	opMinus      = 0x1c
	opOr         = 0x21
	opPlus       = 0x22
	opPlusUconst = 0x23
	opShl        = 0x24
	opShr        = 0x25
	opXor        = 0x27
	opEq         = 0x29
	opGe         = 0x2a
	opGt         = 0x2b
	opLe         = 0x2c
	opLt         = 0x2d
	opNe         = 0x2e
	opLit0       = 0x30
	opLit31      = 0x4f
	opBreg0      = 0x70
	opBreg31     = 0x8f
	opBregx      = 0x92
	opNop        = 0x96
)

var errExprStack = errors.New("expression stack underflow or overflow")

// evalExpr evaluates expr. When push is set its value starts on the stack,
// as DWARF requires for DW_CFA_expression and DW_CFA_val_expression (the
// CFA).
func evalExpr(expr []byte, regs *frameRegs, mem stackMemory, push *uint64) (uint64, error) {
	var stack [maxExprStack]uint64
	n := 0
	pushv := func(v uint64) error {
		if n >= len(stack) {
			return errExprStack
		}
		stack[n] = v
		n++
		return nil
	}
	if push != nil {
		stack[0] = *push
		n = 1
	}
	r := reader{buf: expr}
	for r.remaining() > 0 {
		op := r.u8()
		var err error
		switch {
		case op >= opLit0 && op <= opLit31:
			err = pushv(uint64(op - opLit0))
		case op >= opBreg0 && op <= opBreg31 || op == opBregx:
			reg := uint64(op - opBreg0)
			if op == opBregx {
				reg = r.uleb()
			}
			off := r.sleb()
			v, ok := regs.get(reg)
			if !ok {
				return 0, fmt.Errorf("expression uses register %d, which is not known", reg)
			}
			err = pushv(v + uint64(off))
		case op == opConst1u:
			err = pushv(uint64(r.u8()))
		case op == opConst1s:
			err = pushv(uint64(int64(int8(r.u8()))))
		case op == opConst2u:
			err = pushv(uint64(r.u16()))
		case op == opConst2s:
			err = pushv(uint64(int64(int16(r.u16()))))
		case op == opConst4u:
			err = pushv(uint64(r.u32()))
		case op == opConst4s:
			err = pushv(uint64(int64(int32(r.u32()))))
		case op == opConst8u, op == opConst8s:
			err = pushv(r.u64())
		case op == opConstu:
			err = pushv(r.uleb())
		case op == opConsts:
			err = pushv(uint64(r.sleb()))
		case op == opNop:
		case op == opDup, op == opOver:
			depth := 1
			if op == opOver {
				depth = 2
			}
			if n < depth {
				return 0, errExprStack
			}
			err = pushv(stack[n-depth])
		case op == opDrop:
			if n < 1 {
				return 0, errExprStack
			}
			n--
		case op == opSwap:
			if n < 2 {
				return 0, errExprStack
			}
			stack[n-1], stack[n-2] = stack[n-2], stack[n-1]
		case op == opDeref:
			if n < 1 {
				return 0, errExprStack
			}
			v, ok := mem.read(stack[n-1])
			if !ok {
				return 0, fmt.Errorf("expression reads 0x%x: %w", stack[n-1], errOutsideCopy)
			}
			stack[n-1] = v
		case op == opPlusUconst:
			if n < 1 {
				return 0, errExprStack
			}
			stack[n-1] += r.uleb()
		case op == opAnd, op == opMinus, op == opOr, op == opPlus, op == opShl, op == opShr,
			op == opXor, op == opEq, op == opGe, op == opGt, op == opLe, op == opLt, op == opNe:
			if n < 2 {
				return 0, errExprStack
			}
			a, b := stack[n-2], stack[n-1]
			n--
			stack[n-1] = binaryOp(op, a, b)
		default:
			return 0, fmt.Errorf("unsupported DWARF expression op 0x%x", op)
		}
		if err != nil {
			return 0, err
		}
		if r.err != nil {
			return 0, fmt.Errorf("expression operand: %w", r.err)
		}
	}
	if n < 1 {
		return 0, errExprStack
	}
	return stack[n-1], nil
}

// binaryOp applies a two-operand DWARF operation; a is the deeper entry.
// Comparisons are signed, as DWARF specifies.
func binaryOp(op byte, a, b uint64) uint64 {
	bool64 := func(c bool) uint64 {
		if c {
			return 1
		}
		return 0
	}
	switch op {
	case opAnd:
		return a & b
	case opMinus:
		return a - b
	case opOr:
		return a | b
	case opPlus:
		return a + b
	case opShl:
		if b >= 64 {
			return 0
		}
		return a << b
	case opShr:
		if b >= 64 {
			return 0
		}
		return a >> b
	case opXor:
		return a ^ b
	case opEq:
		return bool64(a == b)
	case opGe:
		return bool64(int64(a) >= int64(b))
	case opGt:
		return bool64(int64(a) > int64(b))
	case opLe:
		return bool64(int64(a) <= int64(b))
	case opLt:
		return bool64(int64(a) < int64(b))
	case opNe:
		return bool64(a != b)
	}
	return 0
}
