//go:build linux && amd64

package placement

// What the x86-64 uprobe code of Linux 6.18 (arch/x86/kernel/uprobes.c)
// does with a probed instruction. The rules below were read from the kernel
// source and then confirmed on a 6.18 kernel by timing a probe on each kind
// of instruction: an emulated hit costs about 0.5-0.9 µs, a single-stepped
// one about 4 µs on an idle machine and far more under load.
//
//   - push %reg: only the one-byte 0x50-0x57 form and the REX.B form 0x41
//     0x5x (push_setup_xol_ops). "48 53" (REX.W push) and "66 53" (pushw)
//     are single-stepped.
//   - jmp rel8/rel32, call rel32, jcc rel8 (0x7x) and jcc rel32 (0x0f 0x8x)
//     (branch_setup_xol_ops), unless a 0x66 prefix is present.
//   - nops: any instruction whose opcode byte is 0x90, whatever its prefixes
//     (so pause, "f3 90", is emulated too), and the eight canonical kernel
//     nops of one to eight bytes, compared byte for byte. A 9-byte
//     "66 0f 1f 84 00.." and endbr64 are single-stepped. Kernels before 6.16
//     emulated only the 0x90 opcode; the insn_is_nop() rework merged after
//     6.18 matches nop patterns instead and no longer accepts pause.
//   - A uprobe on a 5-byte nop is additionally rewritten, after its first
//     hit, into a call to a per-process "[uprobes-trampoline]" page.
//
// The kernel refuses instructions carrying a lock or a cs/ds/es/ss prefix
// (is_prefix_bad): attaching fails with ENOTSUPP (errno 524) while a process
// maps the code, and a process that maps it later silently runs without the
// probe, which is worse. "41 90" (xchg %eax,%r8d) has opcode byte 0x90, so
// 6.18 emulates it as a nop and the exchange never happens: a probe there
// silently corrupts the program (measured).

// encoding splits an instruction the way the kernel's decoder sees it.
type encoding struct {
	raw      []byte // the whole instruction
	prefixes []byte // legacy prefixes
	rex      byte   // 0 when there is no REX prefix
	opcode   []byte // from the first opcode byte to the end
}

func splitEncoding(raw []byte) encoding {
	i := 0
	for i < len(raw) && isLegacyPrefix(raw[i]) {
		i++
	}
	e := encoding{raw: raw, prefixes: raw[:i]}
	if i < len(raw) && raw[i]&0xf0 == 0x40 {
		e.rex = raw[i]
		i++
	}
	e.opcode = raw[i:]
	return e
}

func isLegacyPrefix(b byte) bool {
	switch b {
	case 0x26, 0x2e, 0x36, 0x3e, 0x64, 0x65, 0x66, 0x67, 0xf0, 0xf2, 0xf3:
		return true
	}
	return false
}

func (e encoding) hasPrefix(p byte) bool {
	for _, b := range e.prefixes {
		if b == p {
			return true
		}
	}
	return false
}

// refusedByKernel reports why the kernel would not run a uprobe on the
// instruction correctly, or "" when it would. It covers the prefix rule and
// the "41 90" mis-emulation, not the kernel's full table of instructions.
func refusedByKernel(e encoding) string {
	for _, p := range e.prefixes {
		switch p {
		case 0xf0:
			return "the kernel refuses uprobes on lock-prefixed instructions"
		case 0x26, 0x2e, 0x36, 0x3e:
			return "the kernel refuses uprobes on instructions with a cs/ds/es/ss prefix"
		}
	}
	if len(e.opcode) > 0 && e.opcode[0] == 0x90 && e.rex&0x01 != 0 {
		return "the kernel emulates this xchg as a nop, which would skip the exchange"
	}
	return ""
}

// kernelNops are the kernel's x86_nops for 64-bit builds: a nop of exactly
// one of these encodings is emulated.
var kernelNops = [][]byte{
	{0x90},
	{0x66, 0x90},
	{0x0f, 0x1f, 0x00},
	{0x0f, 0x1f, 0x40, 0x00},
	{0x0f, 0x1f, 0x44, 0x00, 0x00},
	{0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00},
	{0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00},
	{0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00},
}

func isKernelNop(raw []byte) bool {
	for _, nop := range kernelNops {
		if string(nop) == string(raw) {
			return true
		}
	}
	return false
}

// emulatedByKernel reports whether the kernel handles a hit on the
// instruction without single-stepping it out of line.
func emulatedByKernel(e encoding) bool {
	if len(e.opcode) == 0 {
		return false
	}
	for _, p := range e.prefixes {
		switch p {
		case 0xf0, 0x26, 0x2e, 0x36, 0x3e:
			return false // refused outright
		}
	}
	if isKernelNop(e.raw) {
		return true
	}
	op := e.opcode[0]
	switch {
	case op == 0x90:
		return true
	case op >= 0x50 && op <= 0x57:
		return len(e.raw) == 1 || (len(e.raw) == 2 && e.rex == 0x41)
	case op == 0xe8 || op == 0xe9 || op == 0xeb || (op >= 0x70 && op <= 0x7f):
		return !e.hasPrefix(0x66)
	case op == 0x0f && len(e.opcode) > 1 && e.opcode[1] >= 0x80 && e.opcode[1] <= 0x8f:
		return !e.hasPrefix(0x66)
	}
	return false
}
