//go:build linux && amd64

// Package source holds what hooktrace's two sources of events share: the
// BPF tracer (package tracer) and the preloaded recorder (package
// preload) write the same records (the layout of ../bpf/hooktrace.h), and
// one Converter turns them into events.Records, with symbolized stacks and
// named locks and threads, read while the process is alive. Both take the
// same Options and refuse the same processes; both find the functions they
// record the same way, through package probesite.
package source

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Modes of recording.
const (
	// ModeAggregate sends what the analysis needs: every lock call, every
	// memory syscall, and the allocator calls made with a lock held or
	// inside another allocator call; the rest are only counted. The
	// default: a malloc with no lock held cannot be part of a lock cycle,
	// and most mallocs are made with none held.
	ModeAggregate = "aggregate"
	// ModeFull sends every call, for timelines and exact tests.
	ModeFull = "full"
)

// Options configure a source of events.
type Options struct {
	Mode        string
	FollowForks bool
	// RingBytes is the ring buffer's size (a power of two, at least a page).
	RingBytes int
	// NoSamples turns off raw stack samples inside allocator calls (and with
	// them the unwinding through glibc that decides its arena lock).
	NoSamples bool
	// UserProbes are extra functions, SYMBOL or SYMBOL@object, traced at
	// entry and exit.
	UserProbes []string
	// Warn receives warnings (a site refused, a missing symbol).
	Warn func(string)
	// SyscallsOnly places no uprobes: only the BPF tracer's tracepoints,
	// for the memory syscalls the preload recorder cannot see (glibc's
	// own, inside free). Preload.AddSyscalls reads it.
	SyscallsOnly bool
}

// Defaults fills what o leaves empty (aggregate mode, warnings dropped)
// and checks the mode, for either source.
func (o *Options) Defaults() error {
	if o.Mode == "" {
		o.Mode = ModeAggregate
	}
	if err := CheckMode(o.Mode); err != nil {
		return fmt.Errorf("mode %w", err)
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	return nil
}

// CheckMode says why mode is none of the modes a source records in; the
// CLI's --mode flag and Defaults both ask it.
func CheckMode(mode string) error {
	if mode != ModeAggregate && mode != ModeFull {
		return fmt.Errorf("%q: want %s or %s", mode, ModeAggregate, ModeFull)
	}
	return nil
}

// Errors a user can hit, for distinct exit codes.
var (
	ErrNoProcess  = errors.New("no such process")
	ErrKernelTask = errors.New("is a kernel thread: it has no user space to trace")
)

// CheckProcess says why pid cannot be traced.
func CheckProcess(pid int) error {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	// Field 9 is the task's flags; PF_KTHREAD = 0x00200000. The comm may
	// hold spaces: count fields after its closing parenthesis.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		// A zombie keeps its stat but has no memory left to trace.
		if len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return fmt.Errorf("process %d has exited: %w", pid, ErrNoProcess)
		}
		var flags uint64
		if len(f) > 6 {
			fmt.Sscan(f[6], &flags)
		}
		if flags&0x00200000 != 0 {
			return fmt.Errorf("pid %d %w", pid, ErrKernelTask)
		}
	}
	return nil
}
