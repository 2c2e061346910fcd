//go:build linux && amd64

package placement

import (
	"bytes"
	"strings"
	"testing"
)

// code joins hand-assembled instructions.
func code(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func b(bs ...byte) []byte { return bs }

// Hand-assembled instructions; the comments give the AT&T text.
var (
	pushR12     = b(0x41, 0x54)                         // push %r12
	pushRbp     = b(0x55)                               // push %rbp
	pushRbx     = b(0x53)                               // push %rbx
	pushRbxRexW = b(0x48, 0x53)                         // rex.W push %rbx (single-stepped)
	pushImm     = b(0x6a, 0x00)                         // push $0
	popRsi      = b(0x5e)                               // pop %rsi
	popRdi      = b(0x5f)                               // pop %rdi
	movRspRbp   = b(0x48, 0x89, 0xe5)                   // mov %rsp,%rbp
	movRdiRax   = b(0x48, 0x89, 0xf8)                   // mov %rdi,%rax
	movRdiRbx   = b(0x48, 0x89, 0xfb)                   // mov %rdi,%rbx
	testRdi     = b(0x48, 0x85, 0xff)                   // test %rdi,%rdi
	je8         = b(0x74, 0x00)                         // je .+2
	je32        = b(0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00) // je .+0xc5
	jne32       = b(0x0f, 0x85, 0xac, 0x00, 0x00, 0x00) // jne .+0xb2
	jmp32       = b(0xe9, 0xf6, 0xfe, 0xff, 0xff)       // jmp .-0x105
	call32      = b(0xe8, 0x00, 0x00, 0x00, 0x00)       // call .+5
	callRax     = b(0xff, 0xd0)                         // call *%rax
	jmpRax      = b(0xff, 0xe0)                         // jmp *%rax
	ret         = b(0xc3)
	subRsp18    = b(0x48, 0x83, 0xec, 0x18)                      // sub $0x18,%rsp
	addRspM10   = b(0x48, 0x83, 0xc4, 0xf0)                      // add $-0x10,%rsp
	leaRspM20   = b(0x48, 0x8d, 0x64, 0x24, 0xe0)                // lea -0x20(%rsp),%rsp
	andRsp      = b(0x48, 0x83, 0xe4, 0xf0)                      // and $-16,%rsp
	movEsi1     = b(0xbe, 0x01, 0x00, 0x00, 0x00)                // mov $1,%esi
	movSil1     = b(0x40, 0xb6, 0x01)                            // mov $1,%sil
	movDh1      = b(0xb6, 0x01)                                  // mov $1,%dh
	setneCl     = b(0x0f, 0x95, 0xc1)                            // setne %cl
	xorR9d      = b(0x45, 0x31, 0xc9)                            // xor %r9d,%r9d
	mulRsi      = b(0x48, 0xf7, 0xe6)                            // mul %rsi (writes rdx:rax)
	cqo         = b(0x48, 0x99)                                  // cqo (writes rdx)
	cpuid       = b(0x0f, 0xa2)                                  // cpuid (writes rax,rbx,rcx,rdx)
	repMovsq    = b(0xf3, 0x48, 0xa5)                            // rep movsq (writes rdi,rsi,rcx)
	xchgRsiRdi  = b(0x48, 0x87, 0xf7)                            // xchg %rsi,%rdi
	xchgEaxR8d  = b(0x41, 0x90)                                  // xchg %eax,%r8d
	syscall     = b(0x0f, 0x05)                                  // syscall
	movEax1c    = b(0xb8, 0x1c, 0x00, 0x00, 0x00)                // mov $0x1c,%eax
	movdEsiXmm0 = b(0x66, 0x0f, 0x7e, 0xc6)                      // movd %xmm0,%esi
	pxorXmm0    = b(0x66, 0x0f, 0xef, 0xc0)                      // pxor %xmm0,%xmm0
	lockDecRdi  = b(0xf0, 0xff, 0x0f)                            // lock decl (%rdi)
	jne8        = b(0x75, 0x0b)                                  // jne .+0xd
	endbr64     = b(0xf3, 0x0f, 0x1e, 0xfa)                      // endbr64
	endbr32     = b(0xf3, 0x0f, 0x1e, 0xfb)                      // endbr32
	nop1        = b(0x90)                                        // nop
	nop5        = b(0x0f, 0x1f, 0x44, 0x00, 0x00)                // nopl 0(%rax,%rax)
	nop9        = b(0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0)       // nopw 0(%rax,%rax), single-stepped
	nopCs10     = b(0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0) // nopw %cs:0(%rax,%rax), refused
	pause       = b(0xf3, 0x90)                                  // pause
	movabsRax   = b(0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8)          // movabs $..,%rax
	jmp16       = b(0x66, 0xe9, 0, 0, 0, 0)                      // jmpw (0x66 prefix: not emulated)
	jePn        = b(0x2e, 0x74, 0x00)                            // je,pn (cs prefix: refused)
	undecodable = b(0x06)                                        // push %es: invalid in 64-bit mode

	// pthread_mutex_lock's opening of glibc 2.36.
	mutexLockHead = code(
		b(0x8b, 0x47, 0x10),             // mov 0x10(%rdi),%eax
		b(0x89, 0xc2),                   // mov %eax,%edx
		b(0x81, 0xe2, 0x7f, 0x01, 0, 0), // and $0x17f,%edx
		b(0x83, 0xe0, 0x7c),             // and $0x7c,%eax
		jne32,
	)
)

func repeat(part []byte, n int) []byte { return bytes.Repeat(part, n) }

func TestChoose(t *testing.T) {
	tests := []struct {
		name        string
		code        []byte
		args        int
		offset      int
		stackAdjust int
		mnemonic    string
		emulated    bool
		probeable   bool
		noteHas     string
	}{
		// Emulated entries stay at the entry.
		{"push at entry", code(pushR12, pushRbp, pushRbx, movRdiRbx), 1, 0, 0, "push", true, true, "+0: push %r12 (emulated)"},
		{"push rbp frame", code(pushRbp, movRspRbp, subRsp18, call32), 6, 0, 0, "push", true, true, "push %rbp"},
		{"nop5 entry", code(nop5, pushRbp), 6, 0, 0, "nop", true, true, "(emulated)"},
		{"nop1 entry", code(nop1, ret), 6, 0, 0, "nop", true, true, "(emulated)"},

		// free: test %rdi,%rdi; je.
		{"free", code(testRdi, je32, pushRbp), 1, 3, 0, "je", true, true, "+0x3: je +0xc8 (emulated); skipped instructions leave rdi intact: test %rdi,%rdi"},
		{"free args 6", code(testRdi, je32), 6, 3, 0, "je", true, true, "+0x3: je"},
		{"free args 0", code(testRdi, je32), 0, 3, 0, "je", true, true, "+0x3: je +0xc8 (emulated); skipped: test %rdi,%rdi"},
		{"pthread_mutex_lock", mutexLockHead, 1, 0xe, 0, "jne", true, true, "+0xe: jne"},
		// mov %eax,%edx writes rdx: the third argument is lost.
		{"pthread_mutex_lock args 3", mutexLockHead, 3, 0, 0, "mov", false, true, "writes rdx"},
		{"pthread_mutex_unlock", code(movEsi1, jmp32), 1, 5, 0, "jmp", true, true, "+0x5: jmpq -0x100 (emulated)"},
		{"pthread_mutex_unlock args 2", code(movEsi1, jmp32), 2, 0, 0, "mov", false, true, "mov $0x1,%esi at +0 writes rsi"},

		// Stack adjustments.
		{"sub then call", code(subRsp18, call32), 1, 4, 0x18, "call", true, true, "+0x4: callq +0x9 (emulated)"},
		{"add negative then jmp", code(addRspM10, jmp32), 1, 4, 0x10, "jmp", true, true, ""},
		{"lea rsp then je", code(leaRspM20, je8), 1, 5, 0x20, "je", true, true, ""},
		{"push imm then je", code(pushImm, je8), 1, 2, 8, "je", true, true, ""},
		{"rex.w push then je", code(pushRbxRexW, je8), 1, 2, 8, "je", true, true, ""},
		{"pushes then sub then je", code(pushRbxRexW, pushRbxRexW, subRsp18, testRdi, je8), 1, 11, 0x28, "je", true, true, ""},
		{"and rsp", code(andRsp, je8), 1, 0, 0, "and", false, true, "writes rsp in a way"},
		{"pop above entry", code(popRdi, je8), 0, 0, 0, "pop", false, true, "moves rsp above its entry value"},
		{"push imm pop rsi args 1", code(pushImm, popRsi, je8), 1, 3, 0, "je", true, true, ""},
		{"push imm pop rsi args 2", code(pushImm, popRsi, je8), 2, 0, 0, "push", false, true, "writes rsi"},

		// Leaving straight-line code first.
		{"ret first", code(movRdiRax, ret, pushRbp), 1, 0, 0, "mov", false, true, "retq at +0x3 returns"},
		{"indirect call", code(testRdi, callRax, je8), 1, 0, 0, "test", false, true, "calls out"},
		{"indirect jmp", code(testRdi, jmpRax), 1, 0, 0, "test", false, true, "jumps away"},
		{"16-bit jmp", code(testRdi, jmp16), 1, 0, 0, "test", false, true, "jumps away"},
		{"jcc with cs prefix", code(testRdi, jePn, pushRbp), 1, 0, 0, "test", false, true, "branches"},
		{"syscall", code(movEax1c, syscall, je8), 3, 0, 0, "mov", false, true, "enters the kernel"},
		{"undecodable", code(testRdi, undecodable, je8), 1, 0, 0, "test", false, true, "undecodable bytes at +0x3"},
		{"undecodable entry", code(undecodable, je8), 1, 0, 0, "", false, false, "undecodable bytes at +0"},
		{"truncated", code(testRdi, je32[:3]), 1, 0, 0, "test", false, true, "undecodable"},
		{"empty", nil, 1, 0, 0, "", false, false, "undecodable"},

		// Writes to argument registers, direct and implicit.
		{"sil args 2", code(movSil1, je8), 2, 0, 0, "mov", false, true, "writes rsi"},
		{"sil args 1", code(movSil1, je8), 1, 3, 0, "je", true, true, ""},
		{"dh args 3", code(movDh1, je8), 3, 0, 0, "mov", false, true, "writes rdx"},
		{"dh args 2", code(movDh1, je8), 2, 2, 0, "je", true, true, ""},
		{"setne cl args 4", code(setneCl, je8), 4, 0, 0, "setne", false, true, "writes rcx"},
		{"setne cl args 3", code(setneCl, je8), 3, 3, 0, "je", true, true, ""},
		{"r9d args 6", code(xorR9d, je8), 6, 0, 0, "xor", false, true, "writes r9"},
		{"r9d args 5", code(xorR9d, je8), 5, 3, 0, "je", true, true, ""},
		{"mul args 3", code(mulRsi, je8), 3, 0, 0, "mul", false, true, "writes rdx"},
		{"mul args 2", code(mulRsi, je8), 2, 3, 0, "je", true, true, ""},
		{"cqo args 3", code(cqo, je8), 3, 0, 0, "cqo", false, true, "writes rdx"},
		{"cpuid args 3", code(cpuid, je8), 3, 0, 0, "cpuid", false, true, "writes rdx"},
		{"cpuid args 2", code(cpuid, je8), 2, 2, 0, "je", true, true, ""},
		{"rep movs args 1", code(repMovsq, je8), 1, 0, 0, "movsq", false, true, "writes rdi before"},
		{"xchg args 1", code(xchgRsiRdi, je8), 1, 0, 0, "xchg", false, true, "writes rdi before"},
		{"xchg eax r8d args 5", code(xchgEaxR8d, je8), 5, 0, 0, "xchg", true, false, "writes r8"},
		{"movd to esi args 2", code(movdEsiXmm0, je8), 2, 0, 0, "movd", false, true, "writes rsi"},
		{"pxor args 6", code(pxorXmm0, je8), 6, 4, 0, "je", true, true, "leave rdi, rsi, rdx, rcx, r8, r9 intact"},
		{"x87 load args 6", code(b(0xdb, 0x6c, 0x24, 0x08), je8), 6, 4, 0, "je", true, true, "fldt 0x8(%rsp)"},
		{"fnstsw ax args 6", code(b(0xdf, 0xe0), je8), 6, 2, 0, "je", true, true, ""},
		{"args above 6 are clamped", code(testRdi, je8), 9, 3, 0, "je", true, true, ""},
		{"negative args", code(movEsi1, je8), -1, 5, 0, "je", true, true, ""},

		// Instructions the kernel refuses or mis-emulates are never sites.
		{"spin lock", code(lockDecRdi, jne8), 1, 3, 0, "jne", true, true, "intact: lock decl (%rdi)"},
		{"lock then ret", code(lockDecRdi, ret), 1, 0, 0, "dec", false, false, "refuses uprobes on lock-prefixed"},
		{"xchg eax r8d is not a nop", code(xchgEaxR8d, je8), 1, 2, 0, "je", true, true, ""},
		{"cs nop skipped", code(nopCs10, pushRbp), 1, 10, 0, "push", true, true, ""},
		{"pause emulated", code(pause, ret), 1, 0, 0, "pause", true, true, ""},
		{"nop9 single-stepped", code(nop9, testRdi, je8), 1, 12, 0, "je", true, true, "intact: nopw"},

		// endbr64 is single-stepped, and passed over.
		{"endbr push", code(endbr64, pushR12), 1, 4, 0, "push", true, true, "intact: endbr64"},
		{"endbr test je", code(endbr64, testRdi, je32), 1, 7, 0, "je", true, true, "intact: endbr64; test %rdi,%rdi"},
		{"endbr32 push", code(endbr32, pushRbp), 1, 4, 0, "push", true, true, ""},
		{"endbr ret", code(endbr64, ret), 1, 0, 0, "endbr64", false, true, "retq at +0x4 returns"},
		{"endbr mov jmp", code(endbr64, movEsi1, jmp32), 1, 9, 0, "jmp", true, true, ""},
		{"endbr mov jmp args 2", code(endbr64, movEsi1, jmp32), 2, 0, 0, "endbr64", false, true, "writes rsi"},
		{"endbr alone", endbr64, 1, 0, 0, "endbr64", false, true, "undecodable bytes at +0x4"},

		// The window.
		{"16 instructions then je", code(repeat(movRdiRax, 16), je8), 1, 0, 0, "mov", false, true, "within 16 instructions"},
		{"15 instructions then je", code(repeat(movRdiRax, 15), je8), 1, 45, 0, "je", true, true, ""},
		{"64 bytes then je", code(repeat(movabsRax, 7), je8), 1, 0, 0, "mov", false, true, "64 bytes"},
		{"60 bytes then je", code(repeat(movabsRax, 6), je8), 1, 60, 0, "je", true, true, ""},

		// Branches back into the skipped prologue.
		{"loop back to the site", code(testRdi, je8, b(0xeb, 0xfc)), 1, 0, 0, "test", false, true, "the branch at +0x5 jumps to +0x3"},
		{"loop back to the entry", code(testRdi, je8, b(0xeb, 0xf9)), 1, 3, 0, "je", true, true, ""},
		{"spin lock loop", code(lockDecRdi, jne8, b(0x31, 0xc0), ret, nop5, pause, b(0x83, 0x3f, 0x00), b(0x7f, 0xe9), b(0xeb, 0xf7)), 1, 3, 0, "jne", true, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Choose(tt.code, tt.args)
			t.Logf("%+v", got)
			if got.Offset != tt.offset || got.StackAdjust != tt.stackAdjust {
				t.Errorf("offset %#x adjust %#x, want %#x adjust %#x", got.Offset, got.StackAdjust, tt.offset, tt.stackAdjust)
			}
			if got.Mnemonic != tt.mnemonic {
				t.Errorf("mnemonic %q, want %q", got.Mnemonic, tt.mnemonic)
			}
			if got.Emulated != tt.emulated || got.Probeable != tt.probeable {
				t.Errorf("emulated %v probeable %v, want %v %v", got.Emulated, got.Probeable, tt.emulated, tt.probeable)
			}
			if !strings.Contains(got.Note, tt.noteHas) {
				t.Errorf("note %q lacks %q", got.Note, tt.noteHas)
			}
		})
	}
}

// TestEmulatedByKernel pins the kernel model to what was measured on 6.18:
// emulated hits cost well under a microsecond, single-stepped ones several.
func TestEmulatedByKernel(t *testing.T) {
	tests := []struct {
		name      string
		code      []byte
		emulated  bool
		probeable bool
	}{
		{"push %rbx", pushRbx, true, true},
		{"push %r12", pushR12, true, true},
		{"rex.W push %rbx", pushRbxRexW, false, true},
		{"pushw %bx", b(0x66, 0x53), false, true},
		{"push $0", pushImm, false, true},
		{"mov", movRdiRax, false, true},
		{"endbr64", endbr64, false, true},
		{"nop", nop1, true, true},
		{"data16 nop", b(0x66, 0x90), true, true},
		{"nop3", b(0x0f, 0x1f, 0x00), true, true},
		{"nop5", nop5, true, true},
		{"nop6", b(0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00), true, true},
		{"nop8", b(0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0), true, true},
		{"nop9", nop9, false, true},
		{"cs nopw", nopCs10, false, false},
		{"pause", pause, true, true},
		{"xchg %eax,%r8d", xchgEaxR8d, true, false},
		{"je rel8", je8, true, true},
		{"je rel32", je32, true, true},
		{"je,pn", jePn, false, false},
		{"jmp rel32", jmp32, true, true},
		{"jmp rel8", b(0xeb, 0x00), true, true},
		{"bnd jmp", b(0xf2, 0xe9, 0, 0, 0, 0), true, true},
		{"jmpw", jmp16, false, true},
		{"call rel32", call32, true, true},
		{"call *%rax", callRax, false, true},
		{"lock decl", lockDecRdi, false, false},
		{"ret", ret, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := decodeAt(tt.code, 0)
			if err != nil {
				t.Fatal(err)
			}
			if in.length != len(tt.code) {
				t.Fatalf("decoded %d bytes, want %d", in.length, len(tt.code))
			}
			if in.emulated != tt.emulated || (in.refused == "") != tt.probeable {
				t.Errorf("emulated %v probeable %v (%s), want %v %v", in.emulated, in.refused == "", in.refused, tt.emulated, tt.probeable)
			}
		})
	}
}

// TestChooseRefires: glibc 2.36's pthread_spin_lock. Its lock-prefixed
// entry cannot be probed; the site after it is fine, but the spin loop
// jumps back to the entry, so the site fires once per retry and the probe
// must be told (Refires) to count one call once.
func TestChooseRefires(t *testing.T) {
	spinLock := code(
		b(0xf0, 0xff, 0x0f), // lock decl (%rdi)
		b(0x75, 0x0b),       // jne .+0xd (the spin loop at 0x10)
		b(0x31, 0xc0),       // xor %eax,%eax
		ret,
		b(0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00), // nopl
		b(0xf3, 0x90),       // pause
		b(0x83, 0x3f, 0x00), // cmpl $0,(%rdi)
		b(0x7f, 0xe9),       // jg 0 (retry at the entry)
		b(0xeb, 0xf7),       // jmp 0x10
	)
	s := Choose(spinLock, 1)
	if s.Offset != 3 || !s.Refires {
		t.Errorf("pthread_spin_lock: offset %d, refires %v; want 3, true (%s)", s.Offset, s.Refires, s.Note)
	}
	// Without the branch back to the entry, the site fires once per call.
	noRetry := code(b(0xf0, 0xff, 0x0f), b(0x75, 0x0b), b(0x31, 0xc0), ret)
	if s := Choose(noRetry, 1); s.Offset != 3 || s.Refires {
		t.Errorf("no retry: offset %d, refires %v; want 3, false (%s)", s.Offset, s.Refires, s.Note)
	}
}
