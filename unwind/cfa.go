//go:build linux && amd64

package unwind

import (
	"errors"
	"fmt"
)

// x86-64 DWARF register numbers this package cares about. Columns 0-15 are
// the general-purpose registers, 16 is the return address (the caller's rip).
const (
	regRBX = 3
	regRBP = 6
	regRSP = 7
	regR12 = 12
	regR15 = 15
	regRIP = 16

	// numRegs is how many register columns are tracked. Rules for higher
	// columns (vector registers) are accepted and ignored: they never take
	// part in computing the CFA or a return address on x86-64.
	numRegs = 17
)

// maxRememberDepth caps DW_CFA_remember_state nesting; compilers nest at most
// a few levels.
const maxRememberDepth = 64

type ruleKind uint8

const (
	// ruleUnspecified is a column no instruction has mentioned. For
	// callee-saved registers it means "same value"; for the return address
	// column it means the CFI is incomplete.
	ruleUnspecified ruleKind = iota
	ruleUndefined
	ruleSameValue
	ruleOffset        // saved at CFA+offset
	ruleValOffset     // value is CFA+offset
	ruleRegister      // value is in register reg
	ruleExpression    // saved at the address expr computes
	ruleValExpression // value is what expr computes
)

// regRule says how to recover a register of the caller.
type regRule struct {
	kind   ruleKind
	reg    uint8 // ruleRegister; numRegs stands for any untracked register
	offset int64
	expr   []byte
}

// cfaRule says how to compute the canonical frame address: register+offset,
// or a DWARF expression when expr is non-nil.
type cfaRule struct {
	reg    uint64
	offset int64
	expr   []byte
}

// row is one row of the CFA table: the unwinding rules at one pc.
type row struct {
	cfa  cfaRule
	regs [numRegs]regRule
	// raColumn is the column holding the return address (16 on x86-64).
	raColumn uint64
	// signalFrame marks signal trampolines, whose "return address" is the
	// exact interrupted pc rather than the address after a call.
	signalFrame bool
}

// DW_CFA_* opcodes. The top two bits of the first three carry an operand.
const (
	cfaAdvanceLoc        = 0x40
	cfaOffset            = 0x80
	cfaRestore           = 0xc0
	cfaNop               = 0x00
	cfaSetLoc            = 0x01
	cfaAdvanceLoc1       = 0x02
	cfaAdvanceLoc2       = 0x03
	cfaAdvanceLoc4       = 0x04
	cfaOffsetExtended    = 0x05
	cfaRestoreExtended   = 0x06
	cfaUndefined         = 0x07
	cfaSameValue         = 0x08
	cfaRegister          = 0x09
	cfaRememberState     = 0x0a
	cfaRestoreState      = 0x0b
	cfaDefCFA            = 0x0c
	cfaDefCFARegister    = 0x0d
	cfaDefCFAOffset      = 0x0e
	cfaDefCFAExpression  = 0x0f
	cfaExpression        = 0x10
	cfaOffsetExtendedSF  = 0x11
	cfaDefCFASF          = 0x12
	cfaDefCFAOffsetSF    = 0x13
	cfaValOffset         = 0x14
	cfaValOffsetSF       = 0x15
	cfaValExpression     = 0x16
	cfaMIPSAdvanceLoc8   = 0x1d
	cfaGNUArgsSize       = 0x2e
	cfaGNUNegOffsetExtnd = 0x2f
)

// cfaMachine executes CIE and FDE instructions up to a target pc.
type cfaMachine struct {
	cie     *cie
	loc     uint64 // pc the current row applies from
	target  uint64
	cur     row
	initial row // state after the CIE's instructions, for DW_CFA_restore
	// DW_CFA_remember_state stack: the usual shallow nesting lives in
	// saved without allocating, deeper levels spill to more.
	saved  [2]row
	nSaved int
	more   []row
}

// computeRow fills out with the unwinding rules in effect at pc inside f.
func computeRow(f *fde, pc uint64, out *row) error {
	m := cfaMachine{cie: f.cie, loc: f.begin, target: pc}
	m.cur.raColumn = f.cie.raColumn
	m.cur.signalFrame = f.cie.signalFrame
	if err := m.run(f.cie.initial, f.cie.initialAddr); err != nil {
		return fmt.Errorf("running CIE instructions: %w", err)
	}
	m.initial = m.cur
	m.loc = f.begin
	if err := m.run(f.program, f.programAddr); err != nil {
		return fmt.Errorf("running FDE instructions: %w", err)
	}
	*out = m.cur
	return nil
}

// reachedTarget stops the interpreter once the location passes the target
// pc: the current row is the answer.
type reachedTarget struct{}

func (reachedTarget) Error() string { return "reached target" }

// advance moves the location by delta code units and reports whether the
// row for the target is complete.
func (m *cfaMachine) advance(delta uint64) error {
	return m.setLoc(m.loc + delta*m.cie.codeAlign)
}

func (m *cfaMachine) setLoc(loc uint64) error {
	if loc > m.target || loc < m.loc {
		// Past the target (or wrapped, which only corrupt data does): the
		// rules gathered so far are the ones in effect at the target.
		return reachedTarget{}
	}
	m.loc = loc
	return nil
}

func (m *cfaMachine) setRule(reg uint64, rule regRule) {
	if reg < numRegs {
		m.cur.regs[reg] = rule
	}
}

// run interprets a CFA program, stopping early once the target is reached.
func (m *cfaMachine) run(program []byte, programAddr uint64) error {
	err := m.exec(program, programAddr)
	if _, ok := err.(reachedTarget); ok {
		return nil
	}
	return err
}

func (m *cfaMachine) exec(program []byte, programAddr uint64) error {
	r := reader{buf: program}
	dataAlign := m.cie.dataAlign
	for r.remaining() > 0 {
		opPos := r.pos
		op := r.u8()
		switch op & 0xc0 {
		case cfaAdvanceLoc:
			if err := m.advance(uint64(op & 0x3f)); err != nil {
				return err
			}
			continue
		case cfaOffset:
			off := int64(r.uleb()) * dataAlign
			m.setRule(uint64(op&0x3f), regRule{kind: ruleOffset, offset: off})
			continue
		case cfaRestore:
			m.restore(uint64(op & 0x3f))
			continue
		}
		switch op {
		case cfaNop:
		case cfaSetLoc:
			bases := pointerBases{section: programAddr}
			loc, err := r.pointer(m.cie.fdeEncoding, m.cie.addrSize, bases)
			if err != nil {
				return fmt.Errorf("DW_CFA_set_loc: %w", err)
			}
			if err := m.setLoc(loc); err != nil {
				return err
			}
		case cfaAdvanceLoc1:
			d := uint64(r.u8())
			if r.err == nil {
				if err := m.advance(d); err != nil {
					return err
				}
			}
		case cfaAdvanceLoc2:
			d := uint64(r.u16())
			if r.err == nil {
				if err := m.advance(d); err != nil {
					return err
				}
			}
		case cfaAdvanceLoc4:
			d := uint64(r.u32())
			if r.err == nil {
				if err := m.advance(d); err != nil {
					return err
				}
			}
		case cfaMIPSAdvanceLoc8:
			d := r.u64()
			if r.err == nil {
				if err := m.advance(d); err != nil {
					return err
				}
			}
		case cfaOffsetExtended:
			reg := r.uleb()
			off := int64(r.uleb()) * dataAlign
			m.setRule(reg, regRule{kind: ruleOffset, offset: off})
		case cfaOffsetExtendedSF:
			reg := r.uleb()
			off := r.sleb() * dataAlign
			m.setRule(reg, regRule{kind: ruleOffset, offset: off})
		case cfaGNUNegOffsetExtnd:
			reg := r.uleb()
			off := -int64(r.uleb()) * dataAlign
			m.setRule(reg, regRule{kind: ruleOffset, offset: off})
		case cfaValOffset:
			reg := r.uleb()
			off := int64(r.uleb()) * dataAlign
			m.setRule(reg, regRule{kind: ruleValOffset, offset: off})
		case cfaValOffsetSF:
			reg := r.uleb()
			off := r.sleb() * dataAlign
			m.setRule(reg, regRule{kind: ruleValOffset, offset: off})
		case cfaRestoreExtended:
			m.restore(r.uleb())
		case cfaUndefined:
			m.setRule(r.uleb(), regRule{kind: ruleUndefined})
		case cfaSameValue:
			m.setRule(r.uleb(), regRule{kind: ruleSameValue})
		case cfaRegister:
			reg := r.uleb()
			from := r.uleb()
			m.setRule(reg, regRule{kind: ruleRegister, reg: uint8(min(from, numRegs))})
		case cfaRememberState:
			if err := m.remember(); err != nil {
				return err
			}
		case cfaRestoreState:
			if err := m.restoreState(); err != nil {
				return fmt.Errorf("DW_CFA_restore_state at offset %d: %w", opPos, err)
			}
		case cfaDefCFA:
			m.cur.cfa = cfaRule{reg: r.uleb(), offset: int64(r.uleb())}
		case cfaDefCFASF:
			reg := r.uleb()
			m.cur.cfa = cfaRule{reg: reg, offset: r.sleb() * dataAlign}
		case cfaDefCFARegister:
			// Keeps the offset, switches from an expression if there was one.
			m.cur.cfa.reg = r.uleb()
			m.cur.cfa.expr = nil
		case cfaDefCFAOffset:
			m.cur.cfa.offset = int64(r.uleb())
		case cfaDefCFAOffsetSF:
			m.cur.cfa.offset = r.sleb() * dataAlign
		case cfaDefCFAExpression:
			m.cur.cfa = cfaRule{expr: readBlock(&r)}
		case cfaExpression:
			reg := r.uleb()
			m.setRule(reg, regRule{kind: ruleExpression, expr: readBlock(&r)})
		case cfaValExpression:
			reg := r.uleb()
			m.setRule(reg, regRule{kind: ruleValExpression, expr: readBlock(&r)})
		case cfaGNUArgsSize:
			// Only matters for landing pads, not for finding the caller.
			r.uleb()
		default:
			return fmt.Errorf("unsupported CFA opcode 0x%x at offset %d", op, opPos)
		}
		if r.err != nil {
			return fmt.Errorf("CFA opcode 0x%x at offset %d: %w", op, opPos, r.err)
		}
	}
	return nil
}

func (m *cfaMachine) remember() error {
	switch {
	case m.nSaved < len(m.saved):
		m.saved[m.nSaved] = m.cur
	case m.nSaved < maxRememberDepth:
		m.more = append(m.more, m.cur)
	default:
		return fmt.Errorf("DW_CFA_remember_state nested deeper than %d", maxRememberDepth)
	}
	m.nSaved++
	return nil
}

func (m *cfaMachine) restoreState() error {
	switch {
	case m.nSaved == 0:
		return errors.New("no remembered state")
	case m.nSaved > len(m.saved):
		m.cur = m.more[len(m.more)-1]
		m.more = m.more[:len(m.more)-1]
	default:
		m.cur = m.saved[m.nSaved-1]
	}
	m.nSaved--
	return nil
}

func (m *cfaMachine) restore(reg uint64) {
	if reg < numRegs {
		m.cur.regs[reg] = m.initial.regs[reg]
	}
}

// readBlock reads a ULEB128-length-prefixed expression block. A block that
// does not fit sets the reader's error.
func readBlock(r *reader) []byte {
	n := r.uleb()
	if n > uint64(r.remaining()) {
		r.fail()
		return nil
	}
	b := r.bytes(int(n))
	if b == nil {
		// Keep "expression present" distinct from "no expression".
		b = []byte{}
	}
	return b
}
