//go:build linux && amd64

package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/spf13/cobra"

	"github.com/hooktrace/hooktrace/preload"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/tracer"
)

// Recorders run can use.
const (
	recorderAuto    = "auto"
	recorderEBPF    = "ebpf"
	recorderPreload = "preload"
	// recorderNone is a trace's recorder when nothing recorded it (attach
	// watching for deadlocks alone).
	recorderNone = "none"
)

// recorder is a source of events for a recording: the BPF tracer (uprobes
// and tracepoints) or the preloaded user-space recorder. Both turn what
// they see into the same records through the same converter.
type recorder interface {
	session.Recorder
	// Seen is what the status line shows: threads and locks so far.
	Seen() (threads, locks int64)
}

// registerRecorder adds --recorder to c (run, demo), stored in choice.
func registerRecorder(c *cobra.Command, choice *string) {
	c.Flags().StringVar(choice, "recorder", recorderAuto,
		"ebpf: uprobes (needs root or CAP_BPF+CAP_PERFMON); preload: a preloaded library, unprivileged, for dynamically linked targets; auto: preload where it can")
}

// chooseRecorder resolves --recorder auto for argv: the preloaded library
// for a dynamically linked program, eBPF for what cannot be preloaded.
func chooseRecorder(choice string, argv []string) (string, error) {
	switch choice {
	case recorderEBPF, recorderPreload:
		if choice == recorderPreload {
			if why := unpreloadable(argv); why != "" {
				return "", usageError{fmt.Errorf("--recorder preload: %s", why)}
			}
		}
		return choice, nil
	case "", recorderAuto:
		if why := unpreloadable(argv); why != "" {
			return recorderEBPF, errAutoEBPF{why}
		}
		return recorderAuto, nil
	}
	return "", usageError{fmt.Errorf("--recorder %q: want ebpf, preload or auto", choice)}
}

// errAutoEBPF says why auto fell back to eBPF, for when eBPF is not
// permitted either.
type errAutoEBPF struct{ why string }

func (e errAutoEBPF) Error() string { return e.why }

// targetPath is the executable argv[0] names, "" when there is none (the
// launch reports it).
func targetPath(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return ""
	}
	return path
}

// unpreloadable says why the loader would not preload a library into
// argv[0], or "".
func unpreloadable(argv []string) string {
	path := targetPath(argv)
	if path == "" {
		return ""
	}
	if st, err := os.Stat(path); err == nil && st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		return fmt.Sprintf("%s is setuid or setgid: the loader ignores LD_PRELOAD for it", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return "" // a script: its interpreter is preloaded
	}
	defer f.Close()
	interp := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp = true
		}
	}
	if symbolize.ExeIsGo(path) {
		return fmt.Sprintf("%s is a Go program: it calls no libc allocator or pthread locks a preloaded library could see", path)
	}
	if !interp {
		return fmt.Sprintf("%s is statically linked: there is no loader to preload a library", path)
	}
	return ""
}

// newRecorder opens the recorder f.recorder names. auto (for a target that
// can be preloaded) is the preloaded library, plus, where eBPF is
// permitted, the kernel's syscall tracepoint: it sees the memory syscalls
// glibc makes inside free, which no interposition does.
func newRecorder(f *traceFlags, opts source.Options) (recorder, error) {
	if f.recorder == recorderAuto {
		f.recorder = recorderPreload
		sysOpts := opts
		sysOpts.SyscallsOnly = true
		sys, err := tracer.New(sysOpts)
		var kerr *tracer.KernelError
		if errors.As(err, &kerr) {
			f.noEBPF, f.noEBPFLine = kerr.Missing, kerr.Line()
		} else if err != nil && !errors.Is(err, tracer.ErrPermission) {
			return nil, err
		}
		p, perr := preload.New(opts)
		if perr != nil {
			if sys != nil {
				sys.Close()
			}
			return nil, perr
		}
		if sys != nil {
			if err := p.AddSyscalls(sys); err != nil {
				sys.Close()
				p.Close()
				return nil, err
			}
		}
		return p, nil
	}
	if f.recorder == recorderPreload {
		p, err := preload.New(opts)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	t, err := tracer.New(opts)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// recorderName is what the trace header says recorded it: ebpf, preload,
// or preload+sys_enter (with the kernel's syscall tracepoint).
func recorderName(r recorder) string {
	if p, ok := r.(*preload.Preload); ok {
		if p.Syscalls() {
			return recorderPreload + "+sys_enter"
		}
		return recorderPreload
	}
	return recorderEBPF
}

// resolveRecorder settles --recorder for run before the recording opens.
func resolveRecorder(f *traceFlags, argv []string) error {
	choice, err := chooseRecorder(f.recorder, argv)
	var auto errAutoEBPF
	if errors.As(err, &auto) {
		f.autoWhy = auto.why
		err = nil
	}
	if err != nil {
		return err
	}
	if choice == recorderAuto {
		// A function the shim cannot break on needs a uprobe.
		probes, err := f.userProbes()
		if err != nil {
			return err
		}
		var entry *preload.EntryError
		if len(probes) > 0 && errors.As(preload.CheckProbes(targetPath(argv), probes), &entry) {
			f.autoWhy = entry.Reason() + ": the preload recorder cannot break on it"
			choice = recorderEBPF
		}
	}
	f.recorder = choice
	return nil
}

// explainRecorderError adds why auto chose eBPF to its permission error,
// or to the kernel's refusal.
func explainRecorderError(f *traceFlags, err error) error {
	if f.autoWhy != "" && (errors.Is(err, tracer.ErrPermission) || errors.Is(err, tracer.ErrKernel)) {
		return fmt.Errorf("%s, so the ebpf recorder is needed: %w", f.autoWhy, err)
	}
	return err
}

// hiddenObject is the library whose frames are the recorder's, not the
// target's, if the recorder put one in the target.
func hiddenObject(r recorder) string {
	if p, ok := r.(*preload.Preload); ok {
		return p.Library()
	}
	return ""
}
