package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// trace builds an event stream by hand. Frames are written "function" or
// "function@object", innermost first; a frame "..." marks the stack
// truncated.
type trace struct {
	recs      []*events.Record
	stacks    map[string]uint32
	pid       uint32
	tidBase   uint32 // added to every TID: ID-stability tests move them
	addrBase  uint64 // added to every lock and memory address
	frameBase uint64 // added to every frame address
	clock     uint64
}

func newTrace(pid uint32, h *events.Header) *trace {
	b := &trace{stacks: map[string]uint32{}, pid: pid}
	if h == nil {
		h = &events.Header{}
	}
	h.Version = events.Version
	h.PID = pid
	b.recs = append(b.recs, &events.Record{Kind: events.RecHeader, Header: h})
	return b
}

func (b *trace) stack(frames []string) uint32 {
	if len(frames) == 0 {
		return 0
	}
	key := strings.Join(frames, "|")
	if id, ok := b.stacks[key]; ok {
		return id
	}
	id := uint32(len(b.stacks) + 1)
	b.stacks[key] = id
	st := &events.Stack{ID: id}
	for i, f := range frames {
		if f == "..." {
			st.Truncated = true
			continue
		}
		fn, obj, ok := strings.Cut(f, "@")
		if !ok {
			obj = "/usr/bin/prog"
		} else if !strings.Contains(obj, "/") {
			obj = "/usr/lib/x86_64-linux-gnu/" + obj
		}
		st.Frames = append(st.Frames, events.Frame{
			Addr:     b.frameBase + 0x401000 + uint64(id)*0x100 + uint64(i)*8,
			Function: fn,
			Offset:   uint64(4 * (i + 1)),
			Object:   obj,
		})
	}
	b.recs = append(b.recs, &events.Record{Kind: events.RecStack, Stack: st})
	return id
}

func (b *trace) event(e events.Event, frames ...string) *trace {
	b.clock += 100
	e.Time = b.clock
	e.PID = b.pid
	e.TID += b.tidBase
	if e.Addr != 0 {
		e.Addr += b.addrBase
	}
	if e.Op == events.OpCondWait || e.Op == events.OpCondTimedwait {
		e.Addr2 += b.addrBase
	}
	e.Stack = b.stack(frames)
	b.recs = append(b.recs, &events.Record{Kind: events.RecEvent, Event: e})
	return b
}

func (b *trace) lock(tid uint32, addr uint64, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr}, frames...)
}

func (b *trace) lockKind(tid uint32, addr uint64, kind events.MutexKind, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr, Arg: uint64(kind)}, frames...)
}

func (b *trace) unlock(tid uint32, addr uint64) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpMutexUnlock, Addr: addr})
}

// tryResult traces a trylock or timed lock's return.
func (b *trace) tryResult(tid uint32, op events.Op, addr uint64, ok bool, frames ...string) *trace {
	e := events.Event{TID: tid, Op: op, Flags: events.FlagReturn, Addr: addr, Ret: 16} // EBUSY
	if op.IsTimed() {
		e.Ret = 110 // ETIMEDOUT
	}
	if ok {
		e.Flags |= events.FlagAcquired
		e.Ret = 0
	}
	return b.event(e, frames...)
}

func (b *trace) rwlock(tid uint32, op events.Op, addr uint64, flags uint64, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: op, Flags: events.FlagAcquired, Addr: addr, Arg: flags}, frames...)
}

func (b *trace) rwunlock(tid uint32, addr uint64) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpRwlockUnlock, Addr: addr})
}

func (b *trace) alloc(tid uint32, op events.Op, addr, size uint64, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: op, Addr: addr, Size: size}, frames...)
}

// inAlloc traces an event that happens inside the allocator call enclosing.
func (b *trace) inAlloc(tid uint32, op events.Op, addr uint64, enclosing events.Op, frames ...string) *trace {
	e := events.Event{TID: tid, Op: op, Flags: events.FlagInAlloc, Addr: addr, Addr2: uint64(enclosing)}
	if op.IsLockAcquire() && !op.IsTry() && !op.IsTimed() {
		e.Flags |= events.FlagAcquired
	}
	return b.event(e, frames...)
}

func (b *trace) condWait(tid uint32, cond, mutex uint64) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpCondWait, Addr: cond, Addr2: mutex})
}

func (b *trace) condReturn(tid uint32, cond, mutex uint64, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: events.OpCondWait, Flags: events.FlagReturn, Addr: cond, Addr2: mutex}, frames...)
}

func (b *trace) op(tid uint32, op events.Op, addr, size uint64, frames ...string) *trace {
	return b.event(events.Event{TID: tid, Op: op, Addr: addr, Size: size}, frames...)
}

func (b *trace) probe(tid uint32, op events.Op, index uint64, frames ...string) *trace {
	e := events.Event{TID: tid, Op: op, Arg: index}
	if op == events.OpProbeExit {
		e.Flags = events.FlagReturn
	}
	return b.event(e, frames...)
}

func (b *trace) name(addr uint64, name string) *trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecLockName, LockName: events.LockName{PID: b.pid, Addr: addr + b.addrBase, Name: name}})
	return b
}

func (b *trace) thread(tid uint32, name string) *trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecThread, Thread: events.Thread{PID: b.pid, TID: tid + b.tidBase, Name: name}})
	return b
}

func (b *trace) lost(n uint64) *trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecLost, Lost: events.Lost{Count: n}})
	return b
}

func (b *trace) footer(f *events.Footer) *trace {
	if f == nil {
		status := 0
		f = &events.Footer{ExitStatus: &status}
	}
	b.recs = append(b.recs, &events.Record{Kind: events.RecFooter, Footer: f})
	return b
}

func (b *trace) records() []*events.Record { return b.recs }

func analyze(opts Options, streams ...*trace) *Result {
	a := New(opts)
	for i, s := range streams {
		a.BeginStream("trace" + itoa(uint64(i)))
		for _, r := range s.recs {
			a.Add(r)
		}
	}
	return a.Result()
}

func ofKind(res *Result, kind Kind) []Finding {
	var out []Finding
	for _, f := range res.Findings {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

func stackFunctions(fr []Frame) []string {
	var out []string
	for _, f := range fr {
		out = append(out, f.Function)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func anyContains(list []string, sub string) bool {
	for _, x := range list {
		if strings.Contains(x, sub) {
			return true
		}
	}
	return false
}
