//go:build linux && amd64

package tracer

import "golang.org/x/sys/unix"

// MonotonicNow reads the clock BPF's bpf_ktime_get_ns uses: event times
// and trace header/footer times are on it.
func MonotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
