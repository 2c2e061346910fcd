package tracer

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer/symbolize"
)

// converter turns raw ring-buffer records into events.Records: it gives
// each distinct stack a small ID and sends it (symbolized) before the first
// event that uses it, and names threads and locks on first sight, while the
// process is still there to ask.
type converter struct {
	mu sync.Mutex // guards procs for exiting, called from elsewhere
	// Threads and lock addresses seen, for the live status line.
	nthreads, nlocks atomic.Int64
	emit             func(*events.Record) error
	onFork           func(pid uint32) // a traced process forked a child to follow
	unw              *unwinder
	warn             func(string)
	// hide is an object whose frames are not the target's (the preloaded
	// recorder's interposers), dropped from unwound stacks.
	hide   string
	procs  map[uint32]*procState
	events uint64
	nextID uint32
	rec    events.Record
}

// procState is what the converter knows of one address space. An exec
// replaces it: the same addresses mean other code afterwards.
type procState struct {
	sym    *symbolize.Symbolizer
	live   *liveMaps // keeps sym current while the process lives
	alloc  *allocRange
	stacks map[uint64]uint32 // kernel stack hash or sample id -> Stack.ID
	// notInAlloc holds the samples whose unwound stack has no allocator
	// frame: the kernel's quick test was fooled (a stale return slot).
	notInAlloc map[uint64]bool
	byFrame    map[string]uint32 // unwound frames -> Stack.ID
	locks      map[uint64]bool
	threads    map[uint32]bool
	// mapsDirty: an executable mapping was made since the maps were read.
	mapsDirty bool
}

// mapsFor returns the process's mappings, read again when code was mapped
// since, or when pc is in none of them.
func (p *procState) mapsFor(pc uint64) symbolize.Maps {
	maps := p.sym.Maps()
	if _, ok := maps.Find(pc); p.mapsDirty || !ok {
		p.mapsDirty = false
		p.sym.Refresh()
		maps = p.sym.Maps()
	}
	return maps
}

// plausibleFrames keeps a frame-pointer stack up to its first address that
// is not in executable code: past code built without frame pointers (glibc,
// most -O2 libraries) the walk reads data as return addresses. whole says
// nothing was cut.
func plausibleFrames(maps symbolize.Maps, pcs []uint64) ([]uint64, bool) {
	for i, pc := range pcs {
		m, ok := maps.Find(pc)
		if pc == 0 || (ok && !m.Executable()) || (!ok && len(maps) > 0) {
			return pcs[:i], false
		}
	}
	return pcs, true
}

func newConverter(warn func(string)) *converter {
	return &converter{warn: warn, procs: map[uint32]*procState{}, unw: newUnwinder()}
}

// setAllocator records which allocator pid uses.
func (c *converter) setAllocator(pid uint32, r *allocRange) {
	c.proc(pid).alloc = r
}

// watch starts afresh on pid's address space, keeping what is known of
// its allocator (the probes were placed for the image it runs or is about
// to exec).
func (c *converter) watch(pid uint32) *procState {
	var alloc *allocRange
	sym := symbolize.New(int(pid))
	old, ok := c.procs[pid]
	var live *liveMaps
	if ok {
		alloc, live = old.alloc, old.live
		// Gone already: the poller's last snapshot is all there is.
		if len(sym.Maps()) == 0 {
			sym = old.sym
		}
		live.sym.Store(sym)
	} else {
		live = startLiveMaps(pid, sym)
	}
	p := &procState{
		sym:        sym,
		live:       live,
		alloc:      alloc,
		notInAlloc: map[uint64]bool{},
		stacks:     map[uint64]uint32{},
		byFrame:    map[string]uint32{},
		locks:      map[uint64]bool{},
		threads:    map[uint32]bool{},
	}
	c.mu.Lock()
	c.procs[pid] = p
	c.mu.Unlock()
	return p
}

// exiting takes the last snapshot of pid's mappings. It runs on another
// goroutine than the converter: it only touches the symbolizer, which
// locks.
func (c *converter) exiting(pid uint32) {
	c.mu.Lock()
	p := c.procs[pid]
	c.mu.Unlock()
	if p != nil {
		p.live.sym.Load().Refresh()
	}
}

// close stops the maps pollers.
func (c *converter) close() {
	for _, p := range c.procs {
		p.live.close()
	}
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
		c.nthreads.Add(1)
		if err := c.send(&events.Record{Kind: events.RecThread, Thread: events.Thread{
			PID: r.Pid, TID: r.Tid, Name: threadName(r.Pid, r.Tid)}}); err != nil {
			return err
		}
	}
	if (op.IsLockAcquire() || op == events.OpMutexInit) && !p.locks[r.Addr] {
		p.locks[r.Addr] = true
		c.nlocks.Add(1)
		p.mapsFor(r.Addr)
		if name, ok := p.sym.Data(r.Addr); ok {
			if err := c.send(&events.Record{Kind: events.RecLockName, LockName: events.LockName{
				PID: r.Pid, Addr: r.Addr, Name: name}}); err != nil {
				return err
			}
		}
	}
	if op == events.OpThreadCreate && r.Flags&uint16(events.FlagProcess) != 0 {
		if _, ok := c.procs[uint32(r.Addr)]; !ok {
			c.watch(uint32(r.Addr)).alloc = p.alloc
			if c.onFork != nil {
				c.onFork(uint32(r.Addr))
			}
		}
	}
	if op == events.OpMmap && r.Arg&unix.PROT_EXEC != 0 {
		// Code is being mapped (the loader, dlopen): stacks may soon
		// point into it.
		p.mapsDirty = true
	}
	flags, addr2 := events.Flags(r.Flags), r.Addr2
	stack := p.stacks[r.Stack]
	if r.Stack>>63 != 0 {
		// A sample is used by one event only.
		delete(p.stacks, r.Stack)
		if p.notInAlloc[r.Stack] {
			delete(p.notInAlloc, r.Stack)
			flags &^= events.FlagInAlloc
			addr2 = 0
		}
	}
	c.events++
	c.rec = events.Record{Kind: events.RecEvent, Event: events.Event{
		Time:  r.Time,
		PID:   r.Pid,
		TID:   r.Tid,
		Op:    op,
		Flags: flags,
		Addr:  r.Addr,
		Addr2: addr2,
		Size:  r.Size,
		Arg:   r.Arg,
		Ret:   r.Ret,
		Stack: stack,
	}}
	return c.emit(&c.rec)
}

func (c *converter) stack(r *hooktraceStack) error {
	p := c.proc(r.Pid)
	if _, ok := p.stacks[r.Hash]; ok {
		return nil // sent before the kernel's LRU forgot it
	}
	n := min(int(r.Nr), len(r.Ips))
	pcs, whole := plausibleFrames(p.mapsFor(r.Ips[0]), r.Ips[:n])
	frames := p.sym.FramesInlined(pcs)
	id, err := c.sendStack(p, frames, r.Truncated != 0 || !whole)
	p.stacks[r.Hash] = id
	return err
}

func (c *converter) sample(r *hooktraceSample) error {
	p := c.proc(r.Pid)
	n := min(int(r.Len), len(r.Data))
	maps := p.mapsFor(r.Ip)
	pcs, complete := c.unw.unwind(maps, r.Ip, r.Sp, r.Bp, r.Data[:n])
	if c.hide != "" {
		pcs, complete = hideObject(maps, pcs, complete, c.hide)
	}
	if p.alloc != nil {
		inside := false
		for _, pc := range pcs[min(1, len(pcs)):] {
			if p.alloc.contains(maps, pc) {
				inside = true
				break
			}
		}
		if !inside {
			p.notInAlloc[r.Hash] = true
		}
	}
	frames := p.sym.FramesInlined(pcs)
	id, err := c.sendStack(p, frames, !complete)
	p.stacks[r.Hash] = id
	return err
}

// hideObject drops the frames in the object at path. A walk that ends in
// it reached the recorder's thread start wrapper: the target's part of the
// stack is whole.
func hideObject(maps symbolize.Maps, pcs []uint64, complete bool, path string) ([]uint64, bool) {
	out := pcs[:0]
	for i, pc := range pcs {
		if m, ok := maps.Find(pc); ok && m.Path == path {
			if i == len(pcs)-1 {
				complete = true
			}
			continue
		}
		out = append(out, pc)
	}
	return out, complete
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
	return c.send(&events.Record{Kind: events.RecLost, Lost: events.Lost{Time: MonotonicNow(), Count: n}})
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
