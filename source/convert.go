//go:build linux && amd64

package source

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/probesite"
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/unwind"
)

// Converter turns raw ring-buffer records into events.Records: it gives
// each distinct stack a small ID and sends it (symbolized) before the first
// event that uses it, and names threads and locks on first sight, while the
// process is still there to ask.
type Converter struct {
	// mu guards procs and allocs: the reader looks processes up while the
	// ptrace gate's goroutine places a new child's or image's probes
	// (SetAllocator) and takes an exiting process's last maps.
	mu sync.Mutex
	// allocs is the allocator each process uses, as the probes placed
	// for its current image found it.
	allocs map[uint32]*probesite.AllocRange
	// allocCode: where each process's allocator code is, to tell its own
	// lock calls inside an allocator call from a hook's (both recorders).
	allocCode map[uint32]*probesite.AllocRange
	// Threads and lock addresses seen, for the live status line.
	nthreads, nlocks atomic.Int64
	// Emit receives the records.
	Emit func(*events.Record) error
	// lostSeen is the drops already reported (ReportLost).
	lostSeen uint64
	// OnFork hears of a child a traced process forked, to follow.
	OnFork func(pid uint32)
	// OnLoad hears of a library a traced process loaded (dlopen).
	OnLoad func(pid uint32)
	unw    *unwind.Unwinder
	warn   func(string)
	// Hide is an object whose frames are not the target's (the preloaded
	// recorder's interposers), dropped from unwound stacks.
	Hide  string
	procs map[uint32]*procState
	// calls: the probes placed on calls of a traced function, by where
	// the call is, and the function called (see SetCalls).
	calls  map[fileSpot]callee
	events atomic.Uint64 // read by the status line
	nextID uint32
	rec    events.Record
}

// fileSpot is a place in an object's file.
type fileSpot struct {
	object string
	offset uint64
}

// callee is the function a probed call calls, and how.
type callee struct {
	fileSpot
	len  int  // the call instruction's length
	tail bool // a tail call's jmp: the stack is as at the entry
}

// SetCalls records the probes of plan placed on calls of a traced
// function rather than on the function (Site.Calls). Their stacks start at
// the call, in the caller, where an entry probe's start in the function
// and go on from the caller's return address: the converter makes them
// start so too, and both kinds of probe, and the preloaded recorder, give
// the same stacks. Calls are known by file and offset, for any process.
func (c *Converter) SetCalls(plan []probesite.Site) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range plan {
		s := &plan[i]
		for _, call := range s.Calls {
			if c.calls == nil {
				c.calls = map[fileSpot]callee{}
			}
			c.calls[fileSpot{call.Object, call.Offset}] = callee{fileSpot{s.Object, s.Sym.Offset}, call.Len, call.Tail}
		}
	}
}

// atCall rewrites the first frames of a stack taken at a probe on a call
// (pcs[0], the call) as an entry probe's would be: the function called,
// then the call's return address (the kernel's stacks carry it already:
// have is 1; an unwound sample's go on from the caller's: 0).
func (c *Converter) atCall(maps symbolize.Maps, pcs []uint64, have int) []uint64 {
	if len(pcs) == 0 {
		return pcs
	}
	c.mu.Lock()
	n := len(c.calls)
	c.mu.Unlock()
	if n == 0 {
		return pcs
	}
	m, ok := maps.Find(pcs[0])
	if !ok {
		return pcs
	}
	c.mu.Lock()
	to, ok := c.calls[fileSpot{m.Path, pcs[0] - m.Start + m.Offset}]
	c.mu.Unlock()
	if !ok {
		return pcs
	}
	fn := uint64(0)
	for _, f := range maps {
		if f.Path == to.object && to.offset >= f.Offset && to.offset < f.Offset+(f.End-f.Start) {
			fn = f.Start + to.offset - f.Offset
			break
		}
	}
	if fn == 0 {
		return pcs
	}
	if to.tail || have == 1 {
		return append([]uint64{fn}, pcs[1:]...)
	}
	// The return address is the instruction after the call.
	return append([]uint64{fn, pcs[0] + uint64(to.len)}, pcs[1:]...)
}

// procState is what the converter knows of one address space. An exec
// replaces it: the same addresses mean other code afterwards.
type procState struct {
	sym    *symbolize.Symbolizer
	stacks map[uint64]uint32 // kernel stack hash -> Stack.ID
	// samples: raw stack samples by id. The kernel names a sample again
	// for every event on the same path (its seen_samples cache), for as
	// long as it remembers the path.
	samples sampleCache
	byFrame map[string]uint32 // unwound frames -> Stack.ID
	// allocCaller: kernel stack hashes whose caller (the frame above
	// the traced call) is allocator code.
	allocCaller map[uint64]bool
	locks       map[uint64]bool
	threads     map[uint32]bool
	// mapsDirty: memory was mapped or unmapped since the maps were read.
	mapsDirty bool
	// parent: the process this one was forked from. A child's first
	// records name stacks its parent sent: those of the locks its thread
	// holds from the fork.
	parent *procState
}

// stackID is the stack a kernel hash names, sent by this process or by a
// process it was forked from; 0 when none was.
func (p *procState) stackID(hash uint64) uint32 {
	for q := p; q != nil; q = q.parent {
		if id, ok := q.stacks[hash]; ok {
			return id
		}
	}
	return 0
}

// calledByAllocator reports whether the stack a kernel hash names was
// sent with the allocator's own code as the traced call's caller.
func (p *procState) calledByAllocator(hash uint64) bool {
	for q := p; q != nil; q = q.parent {
		if v, ok := q.allocCaller[hash]; ok {
			return v
		}
	}
	return false
}

// sample is the raw stack sample an id names, as stackID finds stacks.
func (p *procState) sample(id uint64) (sampleInfo, bool) {
	for q := p; q != nil; q = q.parent {
		if s, ok := q.samples.get(id); ok {
			return s, true
		}
	}
	return sampleInfo{}, false
}

// mapsFor returns the process's mappings, read again when memory was
// mapped or unmapped since, or when pc is in none of them.
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

// NewConverter returns a converter that emits nothing until Emit is set.
func NewConverter(warn func(string)) *Converter {
	return &Converter{warn: warn, procs: map[uint32]*procState{}, allocs: map[uint32]*probesite.AllocRange{}, allocCode: map[uint32]*probesite.AllocRange{}, unw: &unwind.Unwinder{}}
}

// SetAllocator records which allocator pid uses, and starts watching pid
// if it is new: from Attach on, its mappings are known even if it exits
// before the reader sees its first event.
func (c *Converter) SetAllocator(pid uint32, r *probesite.AllocRange) {
	c.mu.Lock()
	c.allocs[pid] = r
	c.allocCode[pid] = r
	c.mu.Unlock()
	c.proc(pid)
}

// SetAllocatorCode records where pid's allocator code is, for a recorder
// that knows itself when a call is inside the allocator (the preload
// shim) but not whose code a lock call inside it comes from.
func (c *Converter) SetAllocatorCode(pid uint32, r *probesite.AllocRange) {
	c.mu.Lock()
	c.allocCode[pid] = r
	c.mu.Unlock()
}

// allocatorCode is where pid's allocator code is, nil when unknown.
func (c *Converter) allocatorCode(pid uint32) *probesite.AllocRange {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.allocCode[pid]
}

// allocator is the allocator pid uses, nil when unknown.
func (c *Converter) allocator(pid uint32) *probesite.AllocRange {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.allocs[pid]
}

// watch starts afresh on pid's address space.
func (c *Converter) watch(pid uint32) *procState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watchLocked(pid)
}

func (c *Converter) watchLocked(pid uint32) *procState {
	sym := symbolize.New(int(pid))
	old, ok := c.procs[pid]
	if ok {
		// Gone already (or its address space ended under the read): the
		// snapshot taken at its exec or exit stop (see RefreshMaps) is
		// all there is. A list cut short by the end is never taken
		// (symbolize.ReadMaps): it would hide that snapshot.
		if len(sym.Maps()) == 0 {
			sym = old.sym
		}
	}
	return c.start(pid, sym)
}

// start records a fresh procState for pid.
func (c *Converter) start(pid uint32, sym *symbolize.Symbolizer) *procState {
	p := &procState{
		sym:         sym,
		stacks:      map[uint64]uint32{},
		allocCaller: map[uint64]bool{},
		byFrame:     map[string]uint32{},
		locks:       map[uint64]bool{},
		threads:     map[uint32]bool{},
	}
	c.procs[pid] = p
	return p
}

// RefreshMaps reads pid's mappings while pid is held at its exec or exit
// (run's ptrace stops), with its memory intact: the reader may be far
// behind, and a short-lived process gone, mappings and all, by the time
// its stacks are symbolized. It runs on another goroutine than the
// converter: it only touches the symbolizer, which locks.
func (c *Converter) RefreshMaps(pid uint32) {
	c.mu.Lock()
	p := c.procs[pid]
	c.mu.Unlock()
	if p != nil {
		p.sym.Refresh()
	}
}

// Track watches pid from now on, if it is new: its mappings are known
// even if it exits before its first record is read.
func (c *Converter) Track(pid uint32) { c.proc(pid) }

// Seen counts the threads and lock addresses seen so far.
func (c *Converter) Seen() (threads, locks int64) {
	return c.nthreads.Load(), c.nlocks.Load()
}

// Events is the number of event records handed out so far.
func (c *Converter) Events() uint64 { return c.events.Load() }

// proc returns pid's state, watching it from now on if it is new.
func (c *Converter) proc(pid uint32) *procState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.procs[pid]; ok {
		return p
	}
	return c.watchLocked(pid)
}

// child starts watching a forked child with its parent's allocator,
// unless the gate's placement got there first. It says whether the child
// is new.
func (c *Converter) child(pid uint32, parent *procState, alloc, code *probesite.AllocRange) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.procs[pid]; ok {
		return false
	}
	// From its parent's mappings: a short-lived child may be gone before
	// its maps are read.
	c.start(pid, parent.sym.Fork(int(pid))).parent = parent
	c.allocs[pid] = alloc
	c.allocCode[pid] = code
	return true
}

var (
	// SizeEvent is an event record's size, for a reader that looks at
	// records before converting them (the preload recorder's merge by
	// time).
	SizeEvent = int(unsafe.Sizeof(abi.Event{}))
	sizeStack = int(unsafe.Sizeof(abi.Stack{}))
	// A sample record is sent at its used length: the header and Len
	// bytes of Data.
	sampleHeader = int(unsafe.Offsetof(abi.Sample{}.Data))
	objectHeader = int(unsafe.Offsetof(abi.Object{}.Path))
)

// Raw converts one record as the BPF ring or the preload recorder's ring
// holds it, and emits what it gives.
func (c *Converter) Raw(b []byte) error {
	if len(b) < 4 {
		return fmt.Errorf("ring buffer record of %d bytes", len(b))
	}
	switch binary.LittleEndian.Uint32(b) {
	case uint32(abi.RecEvent):
		if len(b) < SizeEvent {
			return fmt.Errorf("short event record: %d bytes", len(b))
		}
		return c.event((*abi.Event)(unsafe.Pointer(&b[0])))
	case uint32(abi.RecStack):
		if len(b) < sizeStack {
			return fmt.Errorf("short stack record: %d bytes", len(b))
		}
		return c.stack((*abi.Stack)(unsafe.Pointer(&b[0])))
	case uint32(abi.RecSample):
		if len(b) < sampleHeader {
			return fmt.Errorf("short sample record: %d bytes", len(b))
		}
		var r abi.Sample
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&r)), sampleHeader), b)
		n := min(int(r.Len), len(b)-sampleHeader, len(r.Data))
		return c.sample(&r, b[sampleHeader:sampleHeader+n])
	case uint32(abi.RecObject):
		if len(b) < objectHeader {
			return fmt.Errorf("short object record: %d bytes", len(b))
		}
		var r abi.Object
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&r)), unsafe.Sizeof(r)), b)
		c.object(&r)
		return nil
	}
	return fmt.Errorf("unknown ring buffer record type %d", binary.LittleEndian.Uint32(b))
}

func (c *Converter) event(r *abi.Event) error {
	p := c.proc(r.Pid)
	op := events.Op(r.Op)
	if op == events.OpExec {
		// A new image: forget the old one's stacks and names.
		p = c.watch(r.Pid)
	}
	if !p.threads[r.Tid] && op != events.OpThreadExit {
		p.threads[r.Tid] = true
		c.nthreads.Add(1)
		if err := c.send(&events.Record{Kind: events.RecThread, Thread: events.Thread{
			PID: r.Pid, TID: r.Tid, Name: proc.ThreadName(int(r.Pid), int(r.Tid))}}); err != nil {
			return err
		}
	}
	// A misused lock (an unlock sent with its stack, a destroy of a held
	// one) may be seen first there.
	misuse := (op.IsUnlock() && r.Stack != 0) || r.Flags&uint16(events.FlagBusy) != 0
	if (op.IsLockAcquire() || op.IsLockInit() || misuse) && !p.locks[r.Addr] {
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
	if op == events.OpMutexDestroy {
		// The lifetime is over: a program that creates and destroys
		// mutexes in a loop must not grow this set without bound.
		delete(p.locks, r.Addr)
	}
	if op == events.OpThreadCreate && r.Flags&uint16(events.FlagProcess) != 0 {
		if c.child(uint32(r.Addr), p, c.allocator(r.Pid), c.allocatorCode(r.Pid)) {
			if c.OnFork != nil {
				c.OnFork(uint32(r.Addr))
			}
		}
	}
	switch op {
	case events.OpMmap:
		p.mapsDirty = true
		if r.Arg&unix.PROT_EXEC != 0 {
			// Code is being mapped (the loader, dlopen): read the maps
			// now, while it is most likely still there; the reader runs
			// behind the process, which may unmap it (dlclose) before
			// its stacks are looked up. The event is sent on entry to
			// the call, so the mapping may not be there yet: mapsDirty
			// reads them again at the next lookup. Data files mapped
			// (shared memory segments, say) wait for the next lookup.
			p.sym.Refresh()
		}
	case events.OpMunmap, events.OpMremap:
		p.mapsDirty = true
	}
	flags, addr2 := events.Flags(r.Flags), r.Addr2
	var stack uint32
	// ownLock: a lock call the allocator's own code makes inside an
	// allocator call (jemalloc's, tcmalloc's mutexes) is the allocator
	// at work, ordered like any lock; a hook is code of another object
	// that the allocator call runs.
	lockCall := op.IsLockAcquire() || op.IsUnlock() || op.IsLockInit() || op.IsLockDestroy()
	if r.Stack>>63 != 0 {
		s, ok := p.sample(r.Stack)
		stack = s.stack
		if ok && (s.notInAlloc || lockCall && s.allocCaller) {
			flags &^= events.FlagInAlloc
			addr2 = 0
		}
	} else {
		stack = p.stackID(r.Stack)
		if lockCall && flags&events.FlagInAlloc != 0 && p.calledByAllocator(r.Stack) {
			flags &^= events.FlagInAlloc
			addr2 = 0
		}
	}
	c.events.Add(1)
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
	return c.Emit(&c.rec)
}

// object pins a library the process loaded to its addresses, or unpins
// one it is unloading: its stacks may be named after it is gone.
func (c *Converter) object(r *abi.Object) {
	p := c.proc(r.Pid)
	if r.Gone != 0 {
		p.sym.Unpin(r.Base)
		return
	}
	n := min(int(r.Len), len(r.Path))
	path := make([]byte, n)
	for i := range path {
		path[i] = byte(r.Path[i])
	}
	if err := p.sym.Pin(r.Base, string(path)); err != nil && c.warn != nil {
		c.warn(fmt.Sprintf("pid %d loaded %s, whose code cannot be named: %v", r.Pid, path, err))
	}
	if c.OnLoad != nil {
		c.OnLoad(r.Pid)
	}
}

func (c *Converter) stack(r *abi.Stack) error {
	p := c.proc(r.Pid)
	if _, ok := p.stacks[r.Hash]; ok {
		return nil // sent before the kernel's LRU forgot it
	}
	n := min(int(r.Nr), len(r.Ips))
	maps := p.mapsFor(r.Ips[0])
	pcs, whole := plausibleFrames(maps, c.atCall(maps, r.Ips[:n], 1))
	if len(pcs) > 1 {
		if alloc := c.allocatorCode(r.Pid); alloc != nil && alloc.Contains(p.sym, pcs[1]) {
			p.allocCaller[r.Hash] = true
		}
	}
	frames := p.sym.FramesInlined(pcs)
	id, err := c.sendStack(p, frames, r.Truncated != 0 || !whole)
	p.stacks[r.Hash] = id
	return err
}

func (c *Converter) sample(r *abi.Sample, data []byte) error {
	p := c.proc(r.Pid)
	maps := p.mapsFor(r.Ip)
	pcs, complete := c.unw.Unwind(p.sym.ResolveCFI, r.Ip, r.Sp, r.Bp, data)
	pcs = c.atCall(maps, pcs, 0)
	if c.Hide != "" {
		pcs, complete = maps.DropObject(pcs, complete, c.Hide)
	}
	var s sampleInfo
	if alloc := c.allocator(r.Pid); alloc != nil {
		inside := false
		for _, pc := range pcs[min(1, len(pcs)):] {
			if alloc.Contains(p.sym, pc) {
				inside = true
				break
			}
		}
		s.notInAlloc = !inside
	}
	if code := c.allocatorCode(r.Pid); len(pcs) > 1 && code != nil {
		s.allocCaller = code.Contains(p.sym, pcs[1])
	}
	frames := p.sym.FramesInlined(pcs)
	id, err := c.sendStack(p, frames, !complete)
	s.stack = id
	p.samples.put(r.Hash, s)
	return err
}

// sampleInfo is what an event naming a sample gets from it.
type sampleInfo struct {
	stack uint32
	// notInAlloc: the unwound stack has no allocator frame; the kernel's
	// quick test was fooled (a stale return slot).
	notInAlloc bool
	// allocCaller: the traced call's caller is allocator code.
	allocCaller bool
}

// sampleCache keeps the samples the kernel may still name: at least the
// sampleKeep most recently used. The kernel's seen_samples is an LRU of
// fewer entries, so a sample it still names is here; memory stays bounded
// when every event brings its own sample (an unknown allocator range).
type sampleCache struct {
	cur, old map[uint64]sampleInfo
}

const sampleKeep = 4 * 16384

func (c *sampleCache) get(id uint64) (sampleInfo, bool) {
	if s, ok := c.cur[id]; ok {
		return s, true
	}
	s, ok := c.old[id]
	if ok {
		c.put(id, s)
	}
	return s, ok
}

func (c *sampleCache) put(id uint64, s sampleInfo) {
	if c.cur == nil || len(c.cur) >= sampleKeep {
		c.old, c.cur = c.cur, make(map[uint64]sampleInfo)
	}
	c.cur[id] = s
}

// sendStack emits frames as a new stack unless the same frames were sent.
func (c *Converter) sendStack(p *procState, frames []events.Frame, truncated bool) (uint32, error) {
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

// ReportLost emits a Lost record for the drops a source counted since its
// last report: total is its running count.
func (c *Converter) ReportLost(total uint64) error {
	if total <= c.lostSeen {
		return nil
	}
	n := total - c.lostSeen
	c.lostSeen = total
	return c.send(&events.Record{Kind: events.RecLost, Lost: events.Lost{Time: proc.Now(), Count: n}})
}

func (c *Converter) send(r *events.Record) error {
	if c.Emit == nil {
		return nil
	}
	return c.Emit(r)
}
