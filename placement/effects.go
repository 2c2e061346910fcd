//go:build linux && amd64

package placement

import (
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// General-purpose registers in hardware order, so that x86asm's register
// banks map onto them by position.
const (
	rax = iota
	rcx
	rdx
	rbx
	rsp
	rbp
	rsi
	rdi
	r8
	r9
)

var registerNames = [16]string{
	"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
	"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
}

// argumentRegisters are the System V integer argument registers in order.
var argumentRegisters = [6]int{rdi, rsi, rdx, rcx, r8, r9}

// registerSet holds one bit per general-purpose register.
type registerSet uint16

func setOf(regs ...int) registerSet {
	var s registerSet
	for _, r := range regs {
		s |= 1 << r
	}
	return s
}

// String lists argument registers in argument order, then the others.
func (s registerSet) String() string {
	var names []string
	for _, r := range argumentRegisters {
		if s&setOf(r) != 0 {
			names = append(names, registerNames[r])
		}
	}
	rest := s &^ setOf(argumentRegisters[:]...)
	for r := range registerNames {
		if rest&setOf(r) != 0 {
			names = append(names, registerNames[r])
		}
	}
	return strings.Join(names, ", ")
}

// generalRegister maps any width of a general-purpose register (including
// ah/ch/dh/bh and sil/dil) to its 64-bit register.
func generalRegister(a x86asm.Arg) (int, bool) {
	r, ok := a.(x86asm.Reg)
	if !ok {
		return 0, false
	}
	switch {
	case x86asm.AL <= r && r <= x86asm.R15B:
		i := int(r - x86asm.AL)
		// The 8-bit bank runs al,cl,dl,bl, ah,ch,dh,bh, spl,bpl,sil,dil, r8b..:
		// after the first four every entry is four places past its register.
		if i < 4 {
			return i, true
		}
		return i - 4, true
	case x86asm.AX <= r && r <= x86asm.R15W:
		return int(r - x86asm.AX), true
	case x86asm.EAX <= r && r <= x86asm.R15L:
		return int(r - x86asm.EAX), true
	case x86asm.RAX <= r && r <= x86asm.R15:
		return int(r - x86asm.RAX), true
	}
	return 0, false
}

// isVectorRegister covers x87, MMX, XMM, YMM, ZMM and mask registers.
func isVectorRegister(a x86asm.Arg) bool {
	r, ok := a.(x86asm.Reg)
	return ok && x86asm.F0 <= r && r <= x86asm.K7
}

// effect is what one straight-line instruction does to the state the probe
// handler depends on.
type effect struct {
	writes    registerSet // general-purpose registers written, in whole or in part
	stackDown int         // bytes rsp moves down (negative: up)
	// stop is set when the scan must end at this instruction: it leaves
	// straight-line code, moves rsp in a way we cannot follow, or is not
	// one we understand. It reads as a predicate: "<instruction> <stop>".
	stop string
}

// opKind says which explicit operands of an operation it writes; implicit
// writes are listed separately.
type opKind int

const (
	noDestination  opKind = iota + 1 // compares, fences, nops, and operations whose operands are all sources
	writesFirst                      // the first (Intel-order) operand is the destination
	writesFirstTwo                   // both operands are destinations (xchg, xadd, mulx)
)

var opKinds = map[string]opKind{}

// implicitWrites lists registers an operation writes without naming them.
// Every operation here also needs an opKinds entry, or vector operands.
var implicitWrites = map[string]registerSet{
	"MUL": setOf(rax, rdx), "DIV": setOf(rax, rdx), "IDIV": setOf(rax, rdx),
	"CWD": setOf(rdx), "CDQ": setOf(rdx), "CQO": setOf(rdx),
	"CBW": setOf(rax), "CWDE": setOf(rax), "CDQE": setOf(rax),
	"LAHF": setOf(rax), "XLATB": setOf(rax),
	"CPUID": setOf(rax, rbx, rcx, rdx),
	"RDTSC": setOf(rax, rdx), "RDTSCP": setOf(rax, rcx, rdx),
	"RDMSR": setOf(rax, rdx), "RDPMC": setOf(rax, rdx), "XGETBV": setOf(rax, rdx),
	"CMPXCHG": setOf(rax), "CMPXCHG8B": setOf(rax, rdx), "CMPXCHG16B": setOf(rax, rdx),
	"PCMPESTRI": setOf(rcx), "PCMPISTRI": setOf(rcx),
	"VPCMPESTRI": setOf(rcx), "VPCMPISTRI": setOf(rcx),
}

// stringOps move rdi/rsi (and rcx with a rep prefix, rax for lods); they are
// treated as writing all four rather than modelling each variant.
var stringOps = map[string]bool{}

// flowStops are operations that leave straight-line code or enter the
// kernel. A site after a syscall would fire only once the system call has
// done its work, which defeats timing the function, so the scan ends there
// too.
var flowStops = map[string]string{
	"RET": "returns", "LRET": "returns", "IRET": "returns", "IRETD": "returns", "IRETQ": "returns",
	"JMP": "jumps away", "LJMP": "jumps away", "CALL": "calls out", "LCALL": "calls out",
	"JCXZ": "branches", "JECXZ": "branches", "JRCXZ": "branches",
	"LOOP": "branches", "LOOPE": "branches", "LOOPNE": "branches",
	"XBEGIN": "branches", "XABORT": "branches",
	"SYSCALL": "enters the kernel", "SYSENTER": "enters the kernel",
	"SYSEXIT": "enters the kernel", "SYSRET": "enters the kernel",
	"INT": "traps", "INTO": "traps", "UD0": "traps", "UD1": "traps", "UD2": "traps", "HLT": "traps",
}

func init() {
	for _, op := range []string{
		"NOP", "PAUSE", "CMP", "TEST", "BT",
		"PREFETCHNTA", "PREFETCHT0", "PREFETCHT1", "PREFETCHT2", "PREFETCHW",
		"LFENCE", "MFENCE", "SFENCE", "CLFLUSH",
		"CLC", "STC", "CMC", "CLD", "STD", "SAHF",
		"LDMXCSR", "STMXCSR", "VLDMXCSR", "VSTMXCSR",
		"VZEROUPPER", "VZEROALL",
		// Operands are sources; the results land in implicitWrites.
		"MUL", "DIV", "IDIV", "CWD", "CDQ", "CQO", "CBW", "CWDE", "CDQE",
		"LAHF", "XLATB", "CPUID", "RDTSC", "RDTSCP", "RDMSR", "RDPMC", "XGETBV",
		"CMPXCHG8B", "CMPXCHG16B",
	} {
		opKinds[op] = noDestination
	}
	for _, op := range []string{
		"MOV", "MOVZX", "MOVSX", "MOVSXD", "MOVBE", "MOVNTI", "LEA",
		"ADD", "SUB", "ADC", "SBB", "AND", "OR", "XOR", "NOT", "NEG", "INC", "DEC",
		"SHL", "SHR", "SAR", "ROL", "ROR", "RCL", "RCR", "SHLD", "SHRD",
		"IMUL", "BSWAP", "BSF", "BSR", "POPCNT", "LZCNT", "TZCNT", "BTS", "BTR", "BTC",
		"CRC32", "RDRAND", "RDSEED", "RDFSBASE", "RDGSBASE",
		"ANDN", "BZHI", "BEXTR", "SARX", "SHLX", "SHRX", "RORX",
		"BLSI", "BLSR", "BLSMSK", "PDEP", "PEXT", "CMPXCHG",
	} {
		opKinds[op] = writesFirst
	}
	for _, op := range []string{"XCHG", "XADD", "MULX"} {
		opKinds[op] = writesFirstTwo
	}
	for _, cc := range []string{"A", "AE", "B", "BE", "E", "G", "GE", "L", "LE", "NE", "NO", "NP", "NS", "O", "P", "S"} {
		opKinds["SET"+cc] = writesFirst
		opKinds["CMOV"+cc] = writesFirst
		flowStops["J"+cc] = "branches"
	}
	for _, op := range []string{"MOVS", "STOS", "LODS", "SCAS", "CMPS", "INS", "OUTS"} {
		for _, size := range []string{"B", "W", "D", "Q"} {
			stringOps[op+size] = true
		}
	}
}

// effectOf describes one decoded instruction.
func effectOf(inst x86asm.Inst) effect {
	name := inst.Op.String()
	if reason, ok := flowStops[name]; ok {
		return effect{stop: reason}
	}
	if stringOps[name] {
		return effect{writes: setOf(rdi, rsi, rcx, rax)}
	}
	switch name {
	case "PUSH", "PUSHF", "PUSHFQ":
		return effect{stackDown: pushSize(inst)}
	case "POP", "POPF", "POPFQ":
		e := effect{stackDown: -pushSize(inst)}
		if r, ok := generalRegister(inst.Args[0]); ok {
			if r == rsp {
				return effect{stop: "loads rsp from the stack"}
			}
			e.writes = setOf(r)
		}
		return e
	case "ENTER", "LEAVE":
		return effect{stop: "rebuilds the frame, moving rsp in a way the stack adjustment cannot follow"}
	}

	var e effect
	kind, known := opKinds[name]
	switch {
	case known:
	case hasVectorOperand(inst), strings.HasPrefix(name, "F"):
		// Vector instructions write general-purpose registers only
		// through their first operand (movd %xmm0,%eax, pmovmskb, pextrq),
		// and x87 ones (all named F...) only in fnstsw %ax.
		kind = writesFirst
	default:
		return effect{stop: "is not an instruction the scan understands"}
	}
	switch kind {
	case writesFirst:
		if name == "IMUL" && inst.Args[1] == nil {
			break // one-operand form: the operand is a source, rdx:rax the result
		}
		e.writes = operandWrites(inst.Args[:1])
	case writesFirstTwo:
		e.writes = operandWrites(inst.Args[:2])
	}
	e.writes |= implicitWrites[name]
	if name == "IMUL" && inst.Args[1] == nil {
		e.writes |= setOf(rax, rdx)
	}
	if e.writes&setOf(rsp) != 0 {
		down, ok := rspAdjustment(inst)
		if !ok {
			return effect{stop: "writes rsp in a way the stack adjustment cannot follow"}
		}
		e.writes &^= setOf(rsp)
		e.stackDown = down
	}
	return e
}

func operandWrites(args []x86asm.Arg) registerSet {
	var s registerSet
	for _, a := range args {
		if r, ok := generalRegister(a); ok {
			s |= setOf(r)
		}
	}
	return s
}

func hasVectorOperand(inst x86asm.Inst) bool {
	for _, a := range inst.Args {
		if isVectorRegister(a) {
			return true
		}
	}
	return false
}

// pushSize is 8 in 64-bit mode unless a 0x66 prefix makes it a 16-bit push.
func pushSize(inst x86asm.Inst) int {
	if r, ok := inst.Args[0].(x86asm.Reg); ok && x86asm.AX <= r && r <= x86asm.R15W {
		return 2
	}
	if inst.DataSize == 16 {
		return 2
	}
	return 8
}

// rspAdjustment follows the three ways compilers allocate a frame:
// sub $n,%rsp; add $-n,%rsp; lea -n(%rsp),%rsp.
func rspAdjustment(inst x86asm.Inst) (int, bool) {
	if inst.Args[0] != x86asm.RSP {
		return 0, false
	}
	switch inst.Op {
	case x86asm.SUB:
		if imm, ok := inst.Args[1].(x86asm.Imm); ok {
			return int(imm), true
		}
	case x86asm.ADD:
		if imm, ok := inst.Args[1].(x86asm.Imm); ok {
			return -int(imm), true
		}
	case x86asm.LEA:
		if m, ok := inst.Args[1].(x86asm.Mem); ok && m.Base == x86asm.RSP && m.Index == 0 && m.Segment == 0 {
			return -int(m.Disp), true
		}
	}
	return 0, false
}
