//go:build linux && amd64

// Package inject runs functions inside a running process, as a debugger's
// "call" does: it stops every thread with ptrace, makes one of them call a
// function with registers it sets, and gives every thread back its own
// registers (general, floating-point and vector) before resuming it.
// hooktrace's attach uses it to load its recorder library (dlopen) into
// a live process and to start and stop that recorder.
//
// What makes such a call safe is the caller's business: Stopped.Threads
// says where every thread was stopped, so that it can refuse while any of
// them is inside the allocator or the loader (see package preload).
package inject

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/internal/proc"
)

// Thread is one stopped thread of the process.
type Thread struct {
	TID  int
	Regs unix.PtraceRegs
	// xstate is the thread's extended register state (x87, SSE, AVX) as
	// PTRACE_GETREGSET NT_X86_XSTATE gives it.
	xstate []byte
	// sig is a signal the thread was stopped for (not hooktrace's
	// interrupt), delivered to it when it resumes.
	sig unix.Signal
	// Blocked and Ignored are its signal mask and its process's ignored
	// signals; Seccomp its seccomp mode (0 none, 1 strict, 2 filter).
	Blocked, Ignored uint64
	Seccomp          int
	// scratch is the lowest address strings for the next call took.
	scratch uint64
}

// Stopped is a process every thread of which hooktrace has stopped.
type Stopped struct {
	pid     int
	threads []*Thread
	// CallTimeout bounds one Call: a function that blocks on a lock held
	// by a stopped thread would never return.
	CallTimeout time.Duration
}

// ErrCallTimeout is Call's error when the function did not return in
// time; the process is then left as it is: the thread cannot be taken out
// of the call safely.
var ErrCallTimeout = errors.New("the call did not return")

// With stops every thread of pid, runs f, and resumes them all with their
// own registers, whatever f did. All of it runs on one OS thread, which
// ptrace requires.
func With(pid int, f func(*Stopped) error) (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := &Stopped{pid: pid, CallTimeout: 10 * time.Second}
	defer func() {
		if rerr := s.resume(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if err := s.stop(); err != nil {
		return err
	}
	return f(s)
}

// PID is the process's.
func (s *Stopped) PID() int { return s.pid }

// Threads are the process's threads, stopped.
func (s *Stopped) Threads() []*Thread { return s.threads }

// stop seizes and interrupts each thread, listing them again until no new
// one appeared (a running thread may create one meanwhile).
func (s *Stopped) stop() error {
	seen := map[int]bool{}
	for round := 0; ; round++ {
		tids, err := taskIDs(s.pid)
		if err != nil {
			return err
		}
		fresh := 0
		for _, tid := range tids {
			if seen[tid] {
				continue
			}
			seen[tid] = true
			fresh++
			if err := unix.PtraceSeize(tid); err != nil {
				if err == unix.ESRCH {
					continue // exited meanwhile
				}
				if err == unix.EPERM {
					return fmt.Errorf("ptrace pid %d: %w%s", s.pid, err, proc.PtraceHint())
				}
				return fmt.Errorf("ptrace thread %d of pid %d: %w", tid, s.pid, err)
			}
			t := &Thread{TID: tid}
			if err := unix.PtraceInterrupt(tid); err != nil {
				unix.PtraceDetach(tid)
				continue
			}
			if !s.waitStop(t) {
				continue
			}
			s.threads = append(s.threads, t)
		}
		if fresh == 0 {
			break
		}
		if round > 100 {
			return fmt.Errorf("pid %d: threads kept appearing while they were stopped", s.pid)
		}
	}
	if len(s.threads) == 0 {
		return fmt.Errorf("pid %d: no thread could be stopped", s.pid)
	}
	for _, t := range s.threads {
		if err := unix.PtraceGetRegs(t.TID, &t.Regs); err != nil {
			return fmt.Errorf("reading thread %d's registers: %w", t.TID, err)
		}
		x, err := getXState(t.TID)
		if err != nil {
			return fmt.Errorf("reading thread %d's vector registers: %w", t.TID, err)
		}
		t.xstate = x
		t.Blocked, t.Ignored, t.Seccomp = threadStatus(s.pid, t.TID)
	}
	return nil
}

// waitStop waits for t's stop after an interrupt; a signal it stopped for
// first is kept, to be delivered when it resumes. false: t exited.
func (s *Stopped) waitStop(t *Thread) bool {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(t.TID, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || ws.Exited() || ws.Signaled() {
			return false
		}
		if !ws.Stopped() {
			continue
		}
		if ws.TrapCause() == unix.PTRACE_EVENT_STOP {
			return true
		}
		// A signal-delivery stop: the signal waits for the resume, and
		// the interrupt's own stop still comes.
		if sig := ws.StopSignal(); sig != unix.SIGTRAP || t.sig == 0 {
			t.sig = sig
		}
		if err := unix.PtraceCont(t.TID, 0); err != nil {
			return false
		}
	}
}

// resume gives every thread its registers back and lets it go, with the
// signal it was stopped for, if any.
func (s *Stopped) resume() error {
	var first error
	for _, t := range s.threads {
		if err := unix.PtraceSetRegs(t.TID, &t.Regs); err != nil && first == nil {
			first = fmt.Errorf("restoring thread %d's registers: %w", t.TID, err)
		}
		if t.xstate != nil {
			if err := setXState(t.TID, t.xstate); err != nil && first == nil {
				first = fmt.Errorf("restoring thread %d's vector registers: %w", t.TID, err)
			}
		}
		unix.PtraceDetach(t.TID)
		if t.sig != 0 {
			unix.Tgkill(s.pid, t.TID, t.sig)
		}
	}
	s.threads = nil
	return first
}

// Call makes thread t call fn with integer arguments args (at most six)
// and returns what it returned in rax. Strings it needs are written with
// PushString first, which returns their addresses; they live below the
// thread's stack pointer until the next Call.
func (s *Stopped) Call(t *Thread, fn uint64, args ...uint64) (uint64, error) {
	if len(args) > 6 {
		return 0, fmt.Errorf("call with %d arguments: at most 6", len(args))
	}
	regs := t.Regs
	sp := s.scratch(t)
	// The return address 0: the return faults, and the fault is the stop
	// that says the call is done. The stack as at a call: rsp+8 aligned.
	sp -= 8
	if err := s.poke(sp, make([]byte, 8)); err != nil {
		return 0, err
	}
	regs.Rsp = sp
	regs.Rip = fn
	regs.Rax = 0
	// No system call to restart: the one the thread was in is restarted
	// when its own registers are back.
	regs.Orig_rax = ^uint64(0)
	argRegs := []*uint64{&regs.Rdi, &regs.Rsi, &regs.Rdx, &regs.Rcx, &regs.R8, &regs.R9}
	for i, a := range args {
		*argRegs[i] = a
	}
	if err := unix.PtraceSetRegs(t.TID, &regs); err != nil {
		return 0, fmt.Errorf("setting thread %d's registers: %w", t.TID, err)
	}
	if err := unix.PtraceCont(t.TID, 0); err != nil {
		return 0, fmt.Errorf("resuming thread %d: %w", t.TID, err)
	}
	deadline := time.Now().Add(s.CallTimeout)
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(t.TID, &ws, unix.WALL|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("waiting for thread %d's call: %w", t.TID, err)
		}
		if pid == 0 {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("thread %d, calling %#x: %w within %v", t.TID, fn, ErrCallTimeout, s.CallTimeout)
			}
			time.Sleep(200 * time.Microsecond)
			continue
		}
		if ws.Exited() || ws.Signaled() {
			return 0, fmt.Errorf("thread %d ended during the call (%v)", t.TID, ws)
		}
		if !ws.Stopped() {
			continue
		}
		var now unix.PtraceRegs
		if err := unix.PtraceGetRegs(t.TID, &now); err != nil {
			return 0, fmt.Errorf("reading thread %d's registers: %w", t.TID, err)
		}
		sig := ws.StopSignal()
		if sig == unix.SIGSEGV && now.Rip == 0 {
			// Back where the call returns to: the thread's own registers
			// go back when it resumes.
			t.scratch = 0
			if err := unix.PtraceSetRegs(t.TID, &t.Regs); err != nil {
				return 0, err
			}
			return now.Rax, nil
		}
		if sig == unix.SIGSEGV || sig == unix.SIGBUS || sig == unix.SIGILL || sig == unix.SIGFPE {
			unix.PtraceSetRegs(t.TID, &t.Regs)
			return 0, fmt.Errorf("thread %d faulted (%v) at %#x during the call", t.TID, sig, now.Rip)
		}
		if ws.TrapCause() == -1 && sig != unix.SIGSTOP && sig != unix.SIGTRAP {
			// Someone else's signal: it waits for the thread's resume.
			t.sig = sig
		}
		if err := unix.PtraceCont(t.TID, 0); err != nil {
			return 0, fmt.Errorf("resuming thread %d: %w", t.TID, err)
		}
	}
}

// scratch is where strings for a call go: below the thread's red zone.
func (s *Stopped) scratch(t *Thread) uint64 {
	if t.scratch == 0 {
		t.scratch = (t.Regs.Rsp - 1024) &^ 15
	}
	return t.scratch
}

// PushString writes str, NUL-terminated, below t's stack for the next
// Call and returns its address.
func (s *Stopped) PushString(t *Thread, str string) (uint64, error) {
	top := s.scratch(t)
	at := (top - uint64(len(str)+1)) &^ 15
	if err := s.poke(at, append([]byte(str), 0)); err != nil {
		return 0, err
	}
	t.scratch = at
	return at, nil
}

// ReadMemory reads n bytes of the process's memory at addr.
func (s *Stopped) ReadMemory(addr uint64, n int) ([]byte, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", s.pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := f.ReadAt(b, int64(addr))
	return b[:k], err
}

func (s *Stopped) poke(addr uint64, b []byte) error {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", s.pid), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening pid %d's memory: %w", s.pid, err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, int64(addr)); err != nil {
		return fmt.Errorf("writing pid %d's memory at %#x: %w", s.pid, addr, err)
	}
	return nil
}

// The extended state's largest size on x86-64 (AVX-512 included) is
// under 4 KiB; the kernel says how much it filled.
const xstateMax = 16 << 10

func getXState(tid int) ([]byte, error) {
	buf := make([]byte, xstateMax)
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETREGSET, uintptr(tid), uintptr(ntX86XState),
		uintptr(unsafe.Pointer(&iov)), 0, 0); e != 0 {
		return nil, e
	}
	return buf[:iov.Len], nil
}

func setXState(tid int, x []byte) error {
	iov := unix.Iovec{Base: &x[0]}
	iov.SetLen(len(x))
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SETREGSET, uintptr(tid), uintptr(ntX86XState),
		uintptr(unsafe.Pointer(&iov)), 0, 0); e != 0 {
		return e
	}
	return nil
}

// ntX86XState is the regset of the x87/SSE/AVX state (elf.h NT_X86_XSTATE).
const ntX86XState = 0x202

func taskIDs(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// threadStatus reads a thread's blocked and ignored signals and seccomp
// mode from /proc.
func threadStatus(pid, tid int) (blocked, ignored uint64, seccomp int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return 0, 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "SigBlk":
			blocked, _ = strconv.ParseUint(v, 16, 64)
		case "SigIgn":
			ignored, _ = strconv.ParseUint(v, 16, 64)
		case "Seccomp":
			seccomp, _ = strconv.Atoi(v)
		}
	}
	return blocked, ignored, seccomp
}
