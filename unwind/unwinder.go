//go:build linux && amd64

package unwind

// Unwinder walks one stack sample after another with the CFI resolve
// returns (the objects the process really mapped, as the symbolizer read
// them), keeping its buffer from one walk to the next. The converter
// unwinds raw samples taken inside allocator calls with it (glibc has no
// frame pointers, and the path through it decides whether it holds its
// arena lock); the hang watcher unwinds blocked threads.
type Unwinder struct {
	pcs []uint64
}

// sampleDepth bounds a sample's walk: deeper than any allocator or lock
// path, and short enough that a corrupt stack costs little.
const sampleDepth = 64

// Unwind returns the PCs, the IP first, and whether the walk reached the
// end of the stack. The slice is reused by the next call.
func (u *Unwinder) Unwind(resolve Resolver, ip, sp, bp uint64, data []byte) ([]uint64, bool) {
	var reason string
	u.pcs, reason = AppendUnwind(u.pcs[:0], Sample{IP: ip, SP: sp, BP: bp, Stack: data}, resolve, sampleDepth)
	return u.pcs, reason == ReasonEndOfStack
}
