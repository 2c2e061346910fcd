//go:build linux && amd64

package tracer

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/hooktrace/hooktrace/internal/proc"
)

// ErrKernel: the running kernel cannot run the eBPF recorder's programs. It
// lacks something they use (a kfunc, a helper, a map or attach type), or
// its verifier rejects them. Privileges would not change that: the preload
// recorder can still record.
var ErrKernel = errors.New("this kernel cannot run the eBPF recorder")

// KernelError is an ErrKernel: what the kernel lacks or refused.
type KernelError struct {
	// Missing names it in one line: `kfunc "bpf_rdonly_cast": not
	// supported`, or `the verifier rejects sys_enter: R2 min value is
	// negative, ...`; or, found before loading (checkKernel), `the eBPF
	// recorder needs bpf_loop (Linux 5.17 or later); this kernel is
	// 5.14.0`.
	Missing string
	// Log is the verifier's last lines when it rejected a program.
	Log     []string
	checked bool // found by checkKernel: Missing is the whole line
	err     error
}

// Line says what the kernel lacks or refused in one line, without the
// verifier's log.
func (e *KernelError) Line() string {
	if e.checked {
		return e.Missing
	}
	return ErrKernel.Error() + ": " + e.Missing
}

func (e *KernelError) Error() string {
	msg := e.Line()
	if len(e.Log) > 0 {
		msg += "\nthe verifier's last lines:\n\t" + strings.Join(e.Log, "\n\t")
	}
	return msg
}

func (e *KernelError) Is(target error) bool { return target == ErrKernel }
func (e *KernelError) Unwrap() error        { return e.err }

// verifierTail is how many of the verifier's last lines a KernelError
// keeps: the rejected instruction and the state that led to it.
const verifierTail = 12

var programName = regexp.MustCompile(`program (\w+):`)

// classifyLoad says why loading the BPF objects failed: ErrPermission
// only when the process lacks the capabilities to load them, ErrKernel
// when the kernel lacks a feature or its verifier refused a program (a
// refusal is EACCES, which reads as a permission error, but root gets it
// too), else err itself.
func classifyLoad(err error) error {
	var ve *ebpf.VerifierError
	switch {
	case !proc.MayLoadBPF() && errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %v", ErrPermission, err)
	case errors.As(err, &ve) && len(ve.Log) > 0:
		prog := "a program"
		if m := programName.FindStringSubmatch(err.Error()); m != nil {
			prog = m[1]
		}
		return &KernelError{Missing: fmt.Sprintf("the verifier rejects %s: %s", prog, verifierReason(ve.Log)),
			Log: ve.Log[max(0, len(ve.Log)-verifierTail):], err: err}
	case errors.Is(err, ebpf.ErrNotSupported):
		// "field SysEnter: program sys_enter: fixing up kfuncs: kfunc
		// "bpf_rdonly_cast": not supported": the last two parts say it.
		parts := strings.Split(err.Error(), ": ")
		return &KernelError{Missing: strings.Join(parts[max(0, len(parts)-2):], ": "), err: err}
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %v", ErrPermission, err)
	}
	return err
}

// verifierReason is the line of a verifier log that says why it
// rejected the program: the last one that is not its statistics.
func verifierReason(log []string) string {
	for i := len(log) - 1; i >= 0; i-- {
		l := strings.TrimSpace(log[i])
		if l == "" || strings.HasPrefix(l, "processed ") || strings.HasPrefix(l, "verification time") ||
			strings.HasPrefix(l, "stack depth") {
			continue
		}
		return l
	}
	return "(no reason in its log)"
}
