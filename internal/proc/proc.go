//go:build linux

// Package proc holds the small facts about live processes that the tracer,
// the hang watcher and the CLI all read the same way: the clock the trace's
// event times are on, a thread's name, and the kernel's release.
package proc

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelRelease is the running kernel's release, as uname -r prints it,
// or "" when uname fails.
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Now reads CLOCK_MONOTONIC, the clock BPF's bpf_ktime_get_ns uses: event
// times, trace header/footer times and a hang's time are all on it.
func Now() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// ThreadName is a thread's comm, or "" once it is gone.
func ThreadName(pid, tid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// PtraceHint says what decides the right to ptrace or read another
// process's threads, where Yama restricts it; it starts with a space.
func PtraceHint() string {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	scope := strings.TrimSpace(string(b))
	if err != nil || scope == "0" {
		return " (only the process's own user, or one with CAP_SYS_PTRACE, may read it)"
	}
	return " (kernel.yama.ptrace_scope is " + scope + ": only the process's ancestors, or a user with CAP_SYS_PTRACE, may read it)"
}
