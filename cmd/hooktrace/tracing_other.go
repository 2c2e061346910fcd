//go:build !(linux && amd64)

package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// The probes read x86-64 registers, syscall numbers and glibc layouts:
// elsewhere hooktrace reads traces made there but cannot make them.
var errUnsupported = fmt.Errorf("tracing needs x86-64 Linux (this hooktrace is built for %s/%s); analyze and export read traces made there",
	runtime.GOOS, runtime.GOARCH)

// tracingCmds stands in for run, attach and demo: each says it cannot
// trace here.
func tracingCmds() []*cobra.Command {
	var cmds []*cobra.Command
	for _, c := range []struct{ use, short string }{
		{"run [flags] -- COMMAND [ARGS...]", "Run a command traced (x86-64 Linux only)"},
		{"attach --pid PID [flags]", "Trace a running process (x86-64 Linux only)"},
		{"demo", "Trace the reference registration cache (x86-64 Linux only)"},
	} {
		cmds = append(cmds, &cobra.Command{
			Use:                c.use,
			Short:              c.short,
			DisableFlagParsing: true,
			RunE: func(*cobra.Command, []string) error {
				return &exitError{code: exitFailure, err: errUnsupported}
			},
		})
	}
	return cmds
}

func tracerExitCode(error) (int, bool) { return 0, false }

// isSymbolError: no probes are placed here, so no symbol can be missing.
func isSymbolError(error) bool { return false }
