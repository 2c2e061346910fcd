//go:build linux && amd64

// Package launch starts a target behind the gate and holds it with ptrace
// at its exec, forks and exit: what a recorder needs to trace a command
// from its first instruction to its last, whichever recorder it is.
package launch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// GateArg is the first argument that makes the hooktrace binary act as the
// gate: a child that waits until the probes are attached, then execs the
// target, so the target is traced from its first instruction (the same PID
// keeps its uprobes across exec, and the loader maps libc with the
// breakpoints in place).
const GateArg = "__hooktrace_gate"

// RunGate is the child side. It must run on the process's main thread (call
// it from an init function): exec from another thread would hand the PID's
// task to a new thread and the probes attached to the old one would be lost.
func RunGate(args []string) {
	gate := os.NewFile(3, "gate")
	var b [1]byte
	n, _ := gate.Read(b[:])
	gate.Close()
	if n != 1 {
		// The tracer went away without opening the gate.
		os.Exit(126)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "hooktrace: %v\n", err)
		os.Exit(127)
	}
	err = syscall.Exec(path, args, gateEnv(os.Environ(), heldPreload, "LD_PRELOAD"))
	fmt.Fprintf(os.Stderr, "hooktrace: exec %s: %v\n", path, err)
	os.Exit(127)
}

// heldPreload carries the target's LD_PRELOAD through the gate: the gate
// is hooktrace itself, and a library preloaded into it (the preload
// recorder's) would record the gate's own calls (its Go runtime's threads
// and mappings) as the target's.
const heldPreload = "HOOKTRACE_GATE_LD_PRELOAD"

// gateEnv renames env's variable from to to, dropping any to it had.
func gateEnv(env []string, from, to string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		switch name {
		case to:
		case from:
			out = append(out, to+"="+v)
		default:
			out = append(out, kv)
		}
	}
	return out
}

// Gated is a started target held before its exec.
type Gated struct {
	Cmd  *exec.Cmd
	Path string // the resolved executable it will exec
	open *os.File
}

// Start starts argv under the gate with stdio passed through.
func Start(argv []string) (*Gated, error) {
	return StartEnv(argv, nil, nil)
}

// StartEnv is Start with the target's environment (nil: this
// process's) and extra descriptors it inherits from fd 4 on (fd 3 is the
// gate's own).
func StartEnv(argv, env []string, extra []*os.File) (*Gated, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command to run")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w", argv[0], err)
	}
	// "./app" stays relative after LookPath; the probe plan compares it
	// with the absolute paths of /proc/PID/maps and the loader's list.
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding hooktrace's own binary: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("making the gate pipe: %w", err)
	}
	cmd := exec.Command(self, append([]string{GateArg}, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = append([]*os.File{r}, extra...)
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = gateEnv(env, "LD_PRELOAD", heldPreload)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	r.Close()
	return &Gated{Cmd: cmd, Path: path, open: w}, nil
}

// Open lets the target exec.
func (g *Gated) Open() error {
	defer g.open.Close()
	_, err := g.open.Write([]byte{1})
	return err
}

// RunToExit lets the target exec and waits for it to exit. It stops the
// target at its exit, before its memory is torn down, and calls atExit
// there: events are read behind the target, and a short-lived one would
// otherwise be gone, mappings and all, before its stacks are symbolized.
// It stops the target (and followed children) at each exec, once the new
// image is loaded and before it runs, and calls onExec there.
// With onFork set it also stops each child the target forks at its birth
// and calls onFork before letting it run, so that the child's own probes
// (uprobes are per process) are in place before its first instruction;
// the children are held at their exit too.
//
// The stops are ptrace's (PTRACE_SEIZE, which does not stop the target
// and passes signals on untouched); a target that cannot be seized runs
// without them.
func (g *Gated) RunToExit(atExit, onFork, onExec func(pid int)) (syscall.WaitStatus, error) {
	type result struct {
		ws  syscall.WaitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		// ptrace requests must come from the thread that seized.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		target := g.Cmd.Process.Pid
		opts := uintptr(unix.PTRACE_O_TRACEEXIT | unix.PTRACE_O_TRACEEXEC)
		if onFork != nil {
			opts |= unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK
		}
		_, _, errno := syscall.Syscall6(syscall.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(target), 0, opts, 0, 0)
		seized := errno == 0
		if err := g.Open(); err != nil {
			done <- result{err: fmt.Errorf("starting the target: %w", err)}
			return
		}
		// Children whose probes are placed, and whose first stop was seen.
		placed, started := map[int]bool{}, map[int]bool{}
		follow := func(pid int) {
			if !placed[pid] {
				placed[pid] = true
				onFork(pid)
			}
		}
		var ws syscall.WaitStatus
		for {
			pid, err := syscall.Wait4(-1, &ws, unix.WALL, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				done <- result{err: fmt.Errorf("waiting for the target: %w", err)}
				return
			}
			if ws.Exited() || ws.Signaled() {
				if pid == target {
					done <- result{ws: ws}
					return
				}
				continue
			}
			if !ws.Stopped() || !seized {
				continue
			}
			sig := 0
			switch event := int(ws) >> 16; {
			case event == unix.PTRACE_EVENT_EXIT:
				atExit(pid)
			case event == unix.PTRACE_EVENT_EXEC:
				// The new image is loaded and has not run: place the
				// probes it needs (the gate's own exec included).
				if onExec != nil {
					onExec(pid)
				}
			case event == unix.PTRACE_EVENT_FORK || event == unix.PTRACE_EVENT_VFORK:
				if child, err := unix.PtraceGetEventMsg(pid); err == nil {
					follow(int(child))
				}
			case event == unix.PTRACE_EVENT_STOP:
				if pid != target && !started[pid] {
					// A new child's first stop: place its probes (if
					// its parent's fork event has not already), then
					// let it run.
					started[pid] = true
					follow(pid)
					break
				}
				switch ws.StopSignal() {
				case syscall.SIGSTOP, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU:
					// A group stop (SIGSTOP and friends): stay stopped as
					// the target would untraced, but keep watching.
					syscall.Syscall6(syscall.SYS_PTRACE, unix.PTRACE_LISTEN, uintptr(pid), 0, 0, 0, 0)
					continue
				}
				// A notification trap (SIGTRAP): a SIGCONT arrived (timeout
				// sends one after its SIGTERM). The target would run on
				// untraced; held here it would never see its signals.
			default:
				sig = int(ws.StopSignal())
			}
			syscall.PtraceCont(pid, sig)
		}
	}()
	r := <-done
	g.Cmd.Process.Release()
	return r.ws, r.err
}

// Abort kills the held child without letting it exec.
func (g *Gated) Abort() {
	g.open.Close()
	g.Cmd.Wait()
}
