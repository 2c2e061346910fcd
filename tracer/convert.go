package tracer

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer/symbolize"
)

// converter turns raw ring-buffer records into events.Records: it gives
// each distinct stack a small ID and sends it (symbolized) before the first
// event that uses it, and names threads and locks on first sight, while the
// process is still there to ask.
type converter struct {
	emit   func(*events.Record) error
	warn   func(string)
	procs  map[uint32]*procState
	events uint64
	nextID uint32
	rec    events.Record
}

// procState is what the converter knows of one address space. An exec
// replaces it: the same addresses mean other code afterwards.
type procState struct {
	sym     *symbolize.Symbolizer
	stacks  map[uint64]uint32 // kernel stack hash or sample id -> Stack.ID
	byFrame map[string]uint32 // unwound frames -> Stack.ID
	locks   map[uint64]bool
	threads map[uint32]bool
}

func newConverter(warn func(string)) *converter {
	return &converter{warn: warn, procs: map[uint32]*procState{}}
}

func (c *converter) watch(pid uint32) *procState {
	p := &procState{
		sym:     symbolize.New(int(pid)),
		stacks:  map[uint64]uint32{},
		byFrame: map[string]uint32{},
		locks:   map[uint64]bool{},
		threads: map[uint32]bool{},
	}
	c.procs[pid] = p
	return p
}

func (c *converter) proc(pid uint32) *procState {
	if p, ok := c.procs[pid]; ok {
		return p
	}
	return c.watch(pid)
}

var (
	sizeEvent  = int(unsafe.Sizeof(hooktraceEvent{}))
	sizeStack  = int(unsafe.Sizeof(hooktraceStack{}))
	sizeSample = int(unsafe.Sizeof(hooktraceSample{}))
)

func (c *converter) raw(b []byte) error {
	if len(b) < 4 {
		return fmt.Errorf("ring buffer record of %d bytes", len(b))
	}
	switch binary.LittleEndian.Uint32(b) {
	case 1:
		if len(b) < sizeEvent {
			return fmt.Errorf("short event record: %d bytes", len(b))
		}
		return c.event((*hooktraceEvent)(unsafe.Pointer(&b[0])))
	case 2:
		if len(b) < sizeStack {
			return fmt.Errorf("short stack record: %d bytes", len(b))
		}
		return c.stack((*hooktraceStack)(unsafe.Pointer(&b[0])))
	case 3:
		if len(b) < sizeSample {
			return fmt.Errorf("short sample record: %d bytes", len(b))
		}
		return c.sample((*hooktraceSample)(unsafe.Pointer(&b[0])))
	}
	return fmt.Errorf("unknown ring buffer record type %d", binary.LittleEndian.Uint32(b))
}

func (c *converter) event(r *hooktraceEvent) error {
	p := c.proc(r.Pid)
	op := events.Op(r.Op)
	if op == events.OpExec {
		// A new image: forget the old one's stacks and names.
		c.watch(r.Pid)
		p = c.procs[r.Pid]
	}
	if !p.threads[r.Tid] && op != events.OpThreadExit {
		p.threads[r.Tid] = true
		if err := c.send(&events.Record{Kind: events.RecThread, Thread: events.Thread{
			PID: r.Pid, TID: r.Tid, Name: threadName(r.Pid, r.Tid)}}); err != nil {
			return err
		}
	}
	if (op.IsLockAcquire() || op == events.OpMutexInit) && !p.locks[r.Addr] {
		p.locks[r.Addr] = true
		if name, ok := p.sym.Data(r.Addr); ok {
			if err := c.send(&events.Record{Kind: events.RecLockName, LockName: events.LockName{
				PID: r.Pid, Addr: r.Addr, Name: name}}); err != nil {
				return err
			}
		}
	}
	if op == events.OpThreadCreate && r.Flags&uint16(events.FlagProcess) != 0 {
		if _, ok := c.procs[uint32(r.Addr)]; !ok {
			c.watch(uint32(r.Addr))
		}
	}
	c.events++
	c.rec = events.Record{Kind: events.RecEvent, Event: events.Event{
		Time:  r.Time,
		PID:   r.Pid,
		TID:   r.Tid,
		Op:    op,
		Flags: events.Flags(r.Flags),
		Addr:  r.Addr,
		Addr2: r.Addr2,
		Size:  r.Size,
		Arg:   r.Arg,
		Ret:   r.Ret,
		Stack: p.stacks[r.Stack],
	}}
	return c.emit(&c.rec)
}

func (c *converter) stack(r *hooktraceStack) error {
	p := c.proc(r.Pid)
	if _, ok := p.stacks[r.Hash]; ok {
		return nil // sent before the kernel's LRU forgot it
	}
	n := min(int(r.Nr), len(r.Ips))
	frames := p.sym.Frames(r.Ips[:n])
	id, err := c.sendStack(p, frames, r.Truncated != 0)
	p.stacks[r.Hash] = id
	return err
}

func (c *converter) sample(r *hooktraceSample) error {
	p := c.proc(r.Pid)
	n := min(int(r.Len), len(r.Data))
	pcs, complete := unwindSample(p.sym, r.Ip, r.Sp, r.Bp, r.Data[:n])
	frames := p.sym.Frames(pcs)
	id, err := c.sendStack(p, frames, !complete)
	p.stacks[r.Hash] = id
	return err
}

// sendStack emits frames as a new stack unless the same frames were sent.
func (c *converter) sendStack(p *procState, frames []events.Frame, truncated bool) (uint32, error) {
	var key strings.Builder
	for _, f := range frames {
		fmt.Fprintf(&key, "%x,", f.Addr)
	}
	if truncated {
		key.WriteByte('t')
	}
	if id, ok := p.byFrame[key.String()]; ok {
		return id, nil
	}
	c.nextID++
	id := c.nextID
	p.byFrame[key.String()] = id
	return id, c.send(&events.Record{Kind: events.RecStack, Stack: &events.Stack{
		ID: id, Frames: frames, Truncated: truncated}})
}

func (c *converter) emitLost(n uint64) error {
	return c.send(&events.Record{Kind: events.RecLost, Lost: events.Lost{Time: monotonicNow(), Count: n}})
}

func (c *converter) send(r *events.Record) error {
	if c.emit == nil {
		return nil
	}
	return c.emit(r)
}

func threadName(pid, tid uint32) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
