//go:build linux && amd64

package tracer

import (
	"github.com/hooktrace/hooktrace/tracer/symbolize"
	"github.com/hooktrace/hooktrace/tracer/unwind"
)

// unwinder unwinds raw stack samples with the call-frame information of
// the mapped objects: glibc has no frame pointers, and the path through it
// decides whether it holds its arena lock.
type unwinder struct {
	objs map[string]*unwind.Object // by path; nil when it could not be read
	pcs  []uint64
}

func newUnwinder() *unwinder {
	return &unwinder{objs: map[string]*unwind.Object{}}
}

func (u *unwinder) object(path string) *unwind.Object {
	if o, ok := u.objs[path]; ok {
		return o
	}
	o, err := unwind.Open(path)
	if err != nil {
		o = nil
	}
	u.objs[path] = o
	return o
}

// unwind returns the sample's PCs, the IP first, and whether the walk
// reached the end of the stack.
func (u *unwinder) unwind(maps symbolize.Maps, ip, sp, bp uint64, data []byte) ([]uint64, bool) {
	resolve := func(addr uint64) (*unwind.Object, uint64, bool) {
		m, ok := maps.Find(addr)
		if !ok || !m.IsFile() {
			return nil, 0, false
		}
		o := u.object(m.Path)
		if o == nil {
			return nil, 0, false
		}
		bias, err := o.LoadBias(m.Start, m.Offset)
		if err != nil {
			return nil, 0, false
		}
		return o, bias, true
	}
	var reason string
	u.pcs, reason = unwind.AppendUnwind(u.pcs[:0], unwind.Sample{IP: ip, SP: sp, BP: bp, Stack: data}, resolve, 64)
	return u.pcs, reason == unwind.ReasonEndOfStack
}
