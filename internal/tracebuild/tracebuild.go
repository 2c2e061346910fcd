// Package tracebuild builds event streams by hand, record by record, as the
// tracer would send them: the analyzer's table tests and the reports'
// fixture traces are written with it. It depends on events only, so the
// tests of the pure packages still build on any OS.
package tracebuild

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// Trace is a stream under construction. Frames are written "function" or
// "function@object", innermost first; an object without a slash is in
// /usr/lib/x86_64-linux-gnu, a function without one is in Program; a frame
// "..." marks the stack truncated. Each stack is sent once, before the first
// event that uses it, as the tracer does.
type Trace struct {
	PID uint32
	// Clock is the time of the last event; each event is Step later.
	Clock, Step uint64
	// Bases are added to every TID, every lock and memory address and
	// every frame address: tests of ID stability move them.
	TIDBase             uint32
	AddrBase, FrameBase uint64
	// Program is the object of frames that name none.
	Program string
	// FrameOffset is the offset into its function of the innermost frame;
	// frame i is at FrameOffset*(i+1).
	FrameOffset uint64
	// Sources gives functions a source line, as DWARF would.
	Sources map[string]Source

	recs   []*events.Record
	stacks map[string]uint32
}

// Source is a function's source line.
type Source struct {
	File string
	Line uint32
}

// New starts a stream of process pid with header h (a bare one when nil),
// events 100 ns apart, in /usr/bin/prog.
func New(pid uint32, h *events.Header) *Trace {
	if h == nil {
		h = &events.Header{}
	}
	h.Version = events.Version
	h.PID = pid
	return &Trace{PID: pid, Step: 100, Program: "/usr/bin/prog", FrameOffset: 4, stacks: map[string]uint32{},
		recs: []*events.Record{{Kind: events.RecHeader, Header: h}}}
}

// Records is the stream so far.
func (b *Trace) Records() []*events.Record { return b.recs }

// Drain returns the stream so far and starts a new part: a long stream
// can be fed to an analyzer piece by piece, holding little.
func (b *Trace) Drain() []*events.Record {
	recs := b.recs
	b.recs = nil
	return recs
}

// Stack returns the ID of a stack, sending it first if it is new; 0 for no
// frames.
func (b *Trace) Stack(frames []string) uint32 {
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
			obj = b.Program
		} else if !strings.Contains(obj, "/") {
			obj = "/usr/lib/x86_64-linux-gnu/" + obj
		}
		fr := events.Frame{
			Addr:     b.FrameBase + 0x401000 + uint64(id)*0x100 + uint64(i)*8,
			Function: fn,
			Offset:   b.FrameOffset * uint64(i+1),
			Object:   obj,
		}
		if src, ok := b.Sources[fn]; ok {
			fr.File, fr.Line = src.File, src.Line
		}
		st.Frames = append(st.Frames, fr)
	}
	b.recs = append(b.recs, &events.Record{Kind: events.RecStack, Stack: st})
	return id
}

// Event sends e, Step after the previous one, with the bases applied and
// its stack.
func (b *Trace) Event(e events.Event, frames ...string) *Trace {
	b.Clock += b.Step
	e.Time = b.Clock
	e.PID = b.PID
	e.TID += b.TIDBase
	if e.Addr != 0 {
		e.Addr += b.AddrBase
	}
	if e.Op == events.OpCondWait || e.Op == events.OpCondTimedwait {
		e.Addr2 += b.AddrBase // the mutex
	}
	e.Stack = b.Stack(frames)
	b.recs = append(b.recs, &events.Record{Kind: events.RecEvent, Event: e})
	return b
}

// Lock is a pthread_mutex_lock that took addr.
func (b *Trace) Lock(tid uint32, addr uint64, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr}, frames...)
}

// LockKind is Lock of a mutex of the given kind.
func (b *Trace) LockKind(tid uint32, addr uint64, kind events.MutexKind, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr, Arg: uint64(kind)}, frames...)
}

// Unlock is a pthread_mutex_unlock.
func (b *Trace) Unlock(tid uint32, addr uint64) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpMutexUnlock, Addr: addr})
}

// TryResult is a trylock's or timed lock's return: acquired, or EBUSY
// (ETIMEDOUT for a timed one).
func (b *Trace) TryResult(tid uint32, op events.Op, addr uint64, ok bool, frames ...string) *Trace {
	e := events.Event{TID: tid, Op: op, Flags: events.FlagReturn, Addr: addr, Ret: 16} // EBUSY
	if op.IsTimed() {
		e.Ret = 110 // ETIMEDOUT
	}
	if ok {
		e.Flags |= events.FlagAcquired
		e.Ret = 0
	}
	return b.Event(e, frames...)
}

// RWLock is a read-write lock acquired by op; flags are its Arg.
func (b *Trace) RWLock(tid uint32, op events.Op, addr uint64, flags uint64, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: op, Flags: events.FlagAcquired, Addr: addr, Arg: flags}, frames...)
}

// RWUnlock is a pthread_rwlock_unlock.
func (b *Trace) RWUnlock(tid uint32, addr uint64) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpRwlockUnlock, Addr: addr})
}

// Alloc is an allocator call.
func (b *Trace) Alloc(tid uint32, op events.Op, addr, size uint64, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: op, Addr: addr, Size: size}, frames...)
}

// InAlloc is an event inside the allocator call enclosing: a lock call
// there (acquired unless try or timed) or a memory syscall.
func (b *Trace) InAlloc(tid uint32, op events.Op, addr uint64, enclosing events.Op, frames ...string) *Trace {
	e := events.Event{TID: tid, Op: op, Flags: events.FlagInAlloc, Addr: addr, Addr2: uint64(enclosing)}
	if op.IsLockAcquire() && !op.IsTry() && !op.IsTimed() {
		e.Flags |= events.FlagAcquired
	}
	return b.Event(e, frames...)
}

// CondWait is the entry of pthread_cond_wait, which releases mutex.
func (b *Trace) CondWait(tid uint32, cond, mutex uint64) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpCondWait, Addr: cond, Addr2: mutex})
}

// CondReturn is pthread_cond_wait's return, with mutex retaken.
func (b *Trace) CondReturn(tid uint32, cond, mutex uint64, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: events.OpCondWait, Flags: events.FlagReturn, Addr: cond, Addr2: mutex}, frames...)
}

// Op is any other call.
func (b *Trace) Op(tid uint32, op events.Op, addr, size uint64, frames ...string) *Trace {
	return b.Event(events.Event{TID: tid, Op: op, Addr: addr, Size: size}, frames...)
}

// Probe is the entry or exit of user probe number index.
func (b *Trace) Probe(tid uint32, op events.Op, index uint64, frames ...string) *Trace {
	e := events.Event{TID: tid, Op: op, Arg: index}
	if op == events.OpProbeExit {
		e.Flags = events.FlagReturn
	}
	return b.Event(e, frames...)
}

// Name names the lock at addr.
func (b *Trace) Name(addr uint64, name string) *Trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecLockName, LockName: events.LockName{PID: b.PID, Addr: addr + b.AddrBase, Name: name}})
	return b
}

// Thread names a thread.
func (b *Trace) Thread(tid uint32, name string) *Trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecThread, Thread: events.Thread{PID: b.PID, TID: tid + b.TIDBase, Name: name}})
	return b
}

// Lost reports n records the ring buffer dropped.
func (b *Trace) Lost(n uint64) *Trace {
	b.recs = append(b.recs, &events.Record{Kind: events.RecLost, Lost: events.Lost{Count: n}})
	return b
}

// Footer ends the stream with f, or when nil with a target that exited 0.
func (b *Trace) Footer(f *events.Footer) *Trace {
	if f == nil {
		status := 0
		f = &events.Footer{ExitStatus: &status}
	}
	b.recs = append(b.recs, &events.Record{Kind: events.RecFooter, Footer: f})
	return b
}
