package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Capability bits of /proc/self/status's CapEff (linux/capability.h).
const (
	CapSysAdmin = 21
	CapPerfmon  = 38
	CapBPF      = 39
)

// EffectiveCaps reads this process's effective capability set.
func EffectiveCaps() (uint64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("reading capabilities: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("reading capabilities: parsing %q: %w", line, err)
			}
			return caps, nil
		}
	}
	return 0, errors.New("reading capabilities: no CapEff in /proc/self/status")
}

// MayLoadBPF reports whether this process has the capabilities that
// loading BPF programs and attaching uprobes need: CAP_BPF and
// CAP_PERFMON, or CAP_SYS_ADMIN (root has them all).
func MayLoadBPF() bool {
	caps, err := EffectiveCaps()
	if err != nil {
		return false
	}
	both := uint64(1)<<CapBPF | uint64(1)<<CapPerfmon
	return caps&(1<<CapSysAdmin) != 0 || caps&both == both
}
