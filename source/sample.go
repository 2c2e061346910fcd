//go:build linux && amd64

package source

import (
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/unwind"
)

// unwinder unwinds raw stack samples with the call-frame information of
// the mapped objects: glibc has no frame pointers, and the path through it
// decides whether it holds its arena lock. The CFI comes from the
// symbolizer's objects, so from the files the process really mapped, the
// same ones its stacks are symbolized with.
type unwinder struct {
	pcs []uint64
}

func newUnwinder() *unwinder { return &unwinder{} }

// unwind returns the sample's PCs, the IP first, and whether the walk
// reached the end of the stack.
func (u *unwinder) unwind(sym *symbolize.Symbolizer, ip, sp, bp uint64, data []byte) ([]uint64, bool) {
	var reason string
	u.pcs, reason = unwind.AppendUnwind(u.pcs[:0], unwind.Sample{IP: ip, SP: sp, BP: bp, Stack: data}, sym.ResolveCFI, 64)
	return u.pcs, reason == unwind.ReasonEndOfStack
}
