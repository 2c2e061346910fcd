//go:build linux && amd64

package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hooktrace/hooktrace/preload"
	"github.com/hooktrace/hooktrace/source"
)

// openAttached opens the recorder --recorder names and places it in the
// running process: the preload recorder's library injected (ptrace, then
// dlopen in the process), or the eBPF probes. auto injects where it can
// and otherwise uses eBPF, saying why on stderr.
func (a *attachment) openAttached(opts source.Options, cancel <-chan struct{}) (recorder, error) {
	f := a.s.flags
	switch f.recorder {
	case recorderEBPF:
		return attachRecorder(f, opts, a.pid)
	case recorderPreload, recorderAuto, "":
	default:
		return nil, usageError{fmt.Errorf("--recorder %q: want ebpf, preload or auto", f.recorder)}
	}
	auto := f.recorder != recorderPreload
	if len(opts.UserProbes) > 0 {
		// The injected library places no breakpoints of its own.
		why := "--probe and --forbid need the eBPF recorder under attach"
		if !auto {
			return nil, usageError{fmt.Errorf("--recorder preload: %s", why)}
		}
		f.recorder, f.autoWhy = recorderEBPF, why
		fmt.Fprintf(os.Stderr, "hooktrace: recording with eBPF: %s\n", why)
		return attachRecorder(f, opts, a.pid)
	}
	if f.followForks {
		fmt.Fprintf(os.Stderr, "hooktrace: pid %d: the injected recorder does not follow forks (--follow-forks): --recorder ebpf does\n", a.pid)
	}
	tr, err := attachRecorder(f, opts, a.pid)
	if err == nil {
		p := tr.(*preload.Preload)
		if err = p.Inject(a.pid, preload.InjectOptions{Cancel: cancel}); err == nil {
			fmt.Fprintf(os.Stderr, "hooktrace: pid %d: recorder library loaded (ptrace, dlopen), %d GOT slots of its objects lead to it until the detach\n",
				a.pid, p.Injected())
			return tr, nil
		}
		tr.Close()
	}
	if errors.Is(err, preload.ErrCanceled) {
		return nil, err
	}
	if !auto {
		return nil, fmt.Errorf("--recorder preload: %w", err)
	}
	f.recorder = recorderEBPF
	f.autoWhy = "the recorder library cannot be loaded: " + err.Error()
	fmt.Fprintf(os.Stderr, "hooktrace: recording with eBPF: %s\n", f.autoWhy)
	return attachRecorder(f, opts, a.pid)
}

// attachRecorder opens the recorder f names (auto: the preload recorder,
// with the kernel's syscall tracepoint where permitted) and names pid to
// it.
func attachRecorder(f *traceFlags, opts source.Options, pid int) (recorder, error) {
	tr, err := newRecorder(f, opts)
	if err != nil {
		return nil, explainRecorderError(f, err)
	}
	if err := tr.Attach(pid, ""); err != nil {
		tr.Close()
		return nil, err
	}
	return tr, nil
}
