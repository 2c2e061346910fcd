// Command hooktrace traces memory hooks, allocator calls and pthread locks
// in a live process with eBPF, and reports potential deadlocks.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes. 1 is reserved for findings at or above --fail-on.
const (
	exitOK         = 0
	exitFindings   = 1
	exitUsage      = 2
	exitFailure    = 3 // tracing or I/O failure
	exitPermission = 4
	exitNoProcess  = 5
	exitKernelTask = 6
	exitNoSymbol   = 7
)

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
	gate bool // findings failed the gate: the report has said why
}

// isGateFailure reports whether err is findings failing the gate, not a
// failure of hooktrace's.
func isGateFailure(err error) bool {
	var ee *exitError
	return errors.As(err, &ee) && ee.gate
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func main() {
	slog.SetDefault(slog.New(newWarnHandler(os.Stderr)))
	root := newRootCmd()
	// HOOKTRACE_CPUPROFILE=FILE profiles hooktrace itself, for its developers.
	if path := os.Getenv("HOOKTRACE_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			pprof.StartCPUProfile(f)
		}
	}
	err := root.Execute()
	pprof.StopCPUProfile()
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(os.Stderr, "hooktrace: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "hooktrace: %v\n", err)
	if code, ok := tracerExitCode(err); ok {
		return code
	}
	switch {
	case isSymbolError(err):
		return exitNoSymbol
	case isUsage(err):
		return exitUsage
	}
	return exitFailure
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "hooktrace",
		Short: "Find potential deadlocks between memory hooks, the allocator and pthread locks",
		Long: `hooktrace records a program's malloc/free, memory syscalls and pthread lock
calls, rebuilds each thread's lock order with glibc's hidden arena lock and
hook contexts modelled, and reports every potential deadlock it saw evidence
of, with stacks, even from a run that did not hang.

By default (--recorder auto) it records through a library it loads into the
program: run preloads it, attach injects it into the live process, with no
root needed; as root, eBPF probes on the kernel's syscall tracepoint add the
memory syscalls glibc makes inside malloc and free. --recorder ebpf records
with uprobes alone.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err}
	})
	// run, attach and demo trace (or say why they cannot here).
	root.AddCommand(tracingCmds()...)
	root.AddCommand(newAnalyzeCmd(), newExportCmd())
	return root
}

// usageError marks a mistake in the command line.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func isUsage(err error) bool {
	var u usageError
	// cobra's own "unknown command" carries no type to test.
	return errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command ")
}

// usageArgs makes a wrong number of arguments a usage error (exit 2).
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			return usageError{fmt.Errorf("%s: %w", c.Name(), err)}
		}
		return nil
	}
}
