package tracer

import "golang.org/x/sys/unix"

// monotonicNow reads the clock BPF's bpf_ktime_get_ns uses.
func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
