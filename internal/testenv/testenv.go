// Package testenv decides, for every test that needs something of the
// machine (eBPF rights, kernel BTF, a compiler, a browser, Open MPI...),
// whether a missing piece skips the test or fails it, and builds the C
// programs the tests trace.
//
// The rule is the README's: on a developer's machine a missing piece skips
// the test with what to install; under CI (the CI environment variable set
// and not empty) the set-up is part of the job, so a missing piece fails the
// test instead of letting a green run prove nothing.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/proc"
)

// CI reports whether the tests run under CI, where nothing may be skipped.
func CI() bool { return os.Getenv("CI") != "" }

// Unavailable stops a test that cannot run here: it fails under CI and
// skips elsewhere. The message should say what is missing and how to get it.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		tb.Fatalf("%s (required under CI)", msg)
	}
	tb.Skip(msg)
}

// RequireBPF stops a test that cannot load BPF programs and attach uprobes
// here: it needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, as root has),
// and kernel BTF, which the committed objects' CO-RE relocations read.
func RequireBPF(tb testing.TB) {
	tb.Helper()
	if why := bpfMissing(); why != "" {
		Unavailable(tb, "eBPF unavailable: %s", why)
	}
}

func bpfMissing() string {
	if _, err := proc.EffectiveCaps(); err != nil {
		return err.Error()
	}
	if !proc.MayLoadBPF() {
		return "no CAP_BPF and CAP_PERFMON (run as root)"
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return "no kernel BTF (/sys/kernel/btf/vmlinux)"
	}
	return ""
}

// Tool returns the path of the first of names found in PATH, and stops
// the test when none is; hint says how to install it.
func Tool(tb testing.TB, hint string, names ...string) string {
	tb.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Unavailable(tb, "no %s in PATH (%s)", strings.Join(names, " or "), hint)
	return ""
}

// File stops the test when path does not exist; hint says how to get it.
func File(tb testing.TB, path, hint string) {
	tb.Helper()
	if _, err := os.Stat(path); err != nil {
		Unavailable(tb, "%v (%s)", err, hint)
	}
}
