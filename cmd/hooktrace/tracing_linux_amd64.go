package main

import (
	"errors"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/hooktrace/hooktrace/launch"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/tracer"
)

func init() {
	// The gate must exec from the main thread; init runs there.
	if len(os.Args) > 1 && os.Args[1] == launch.GateArg {
		runtime.LockOSThread()
		launch.RunGate(os.Args[2:])
	}
}

// tracingCmds are the commands that trace.
func tracingCmds() []*cobra.Command {
	return []*cobra.Command{newRunCmd(), newAttachCmd(), newDemoCmd()}
}

// tracerExitCode maps the tracer's errors a user can hit to exit codes.
func tracerExitCode(err error) (int, bool) {
	switch {
	case errors.Is(err, tracer.ErrPermission):
		return exitPermission, true
	case errors.Is(err, source.ErrNoProcess):
		return exitNoProcess, true
	case errors.Is(err, source.ErrKernelTask):
		return exitKernelTask, true
	}
	return 0, false
}

// isSymbolError says whether err is a probe's symbol missing or stripped.
func isSymbolError(err error) bool {
	return errors.Is(err, symbolize.ErrSymbolNotFound) || errors.Is(err, symbolize.ErrStripped)
}
