package analyzer

import (
	"sort"
	"strconv"

	"github.com/hooktrace/hooktrace/events"
)

// opSlots bounds the per-op call counters (ops are small integers).
const opSlots = 64

type lockKey struct {
	pid  uint32
	addr uint64
}

// stream is one trace: its stack IDs, PIDs and TIDs mean nothing outside it.
type stream struct {
	an     *Analyzer
	index  int
	source string
	seen   bool // any record arrived

	header *events.Header
	footer *events.Footer
	// ranks are the ranks of the job's processes, by PID, as the footer
	// gives them.
	ranks map[uint32]int

	// Stream-local lookups, dropped when the stream is finished (what
	// findings need is referenced directly).
	stacks    map[uint32]*events.Stack
	lockNames map[lockKey]string
	procs     map[uint32]*proc
	// entered: the probed functions (by Header.UserProbes index) each
	// process entered, kept when a rule stands in for another
	// (Rule.Unless); it outlives finish, as findings are built later.
	entered map[procProbe]bool
	threads map[uint32]*thread
	last    *thread // the thread of the previous event: events come in runs

	threadNames map[uint32]string
	probeNames  []string

	allocator     string // "glibc", "jemalloc", ...
	arenaEnabled  bool   // model the allocator's hidden lock
	allocatorLock string // the pseudo-lock's name

	events     uint64
	lost       uint64
	entries    [opSlots]uint64
	returns    [opSlots]uint64
	threadsRun int // threads that produced events
	unbalanced uint64
	misuse     LockMisuse
}

func newStream(index int, source string) *stream {
	s := &stream{
		index:       index,
		source:      source,
		stacks:      map[uint32]*events.Stack{},
		lockNames:   map[lockKey]string{},
		procs:       map[uint32]*proc{},
		threads:     map[uint32]*thread{},
		threadNames: map[uint32]string{},
	}
	s.setAllocator("")
	return s
}

// setAllocator decides whether the allocator's lock is modelled. An
// unnamed allocator is glibc's: it is what a Linux target gets by default.
func (s *stream) setAllocator(name string) {
	if name == "" {
		name = "glibc"
	}
	s.allocator = name
	s.arenaEnabled = name == "glibc"
	if s.arenaEnabled {
		s.allocatorLock = "glibc malloc arena"
	} else {
		s.allocatorLock = name + " allocator"
	}
}

type procProbe struct {
	pid   uint32
	probe uint64
}

// enteredProbe notes that process pid entered probed function probe.
func (s *stream) enteredProbe(pid uint32, probe uint64) {
	if s.entered == nil {
		s.entered = map[procProbe]bool{}
	}
	s.entered[procProbe{pid, probe}] = true
}

// finish drops the stream-local lookup tables, and the header's probe
// sites, which no result shows (a job's every rank has its own copy).
func (s *stream) finish() {
	if s.header != nil && s.header.Probes != nil {
		h := *s.header
		h.Probes = nil
		s.header = &h
	}
	s.stacks = nil
	s.lockNames = nil
	s.procs = nil
	s.threads = nil
	s.last = nil
}

func (s *stream) stack(id uint32) *events.Stack {
	if id == 0 || s.stacks == nil {
		return nil
	}
	return s.stacks[id]
}

func (s *stream) threadName(tid uint32) string { return s.threadNames[tid] }

func (s *stream) probeName(idx uint64) string {
	if idx < uint64(len(s.probeNames)) {
		return s.probeNames[idx]
	}
	return "probe#" + itoa(idx)
}

// thread returns the state of TID, creating it on first sight.
func (s *stream) thread(pid, tid uint32) *thread {
	if t := s.last; t != nil && t.tid == tid && t.pid == pid {
		return t
	}
	t := s.threads[tid]
	if t == nil || t.pid != pid {
		// A new thread, or a TID reused by another process.
		t = &thread{stream: s, pid: pid, tid: tid, proc: s.proc(pid)}
		s.threads[tid] = t
		s.threadsRun++
	}
	s.last = t
	return t
}

func (s *stream) proc(pid uint32) *proc {
	p := s.procs[pid]
	if p == nil {
		p = &proc{stream: s, pid: pid, live: map[uint64]*instance{}}
		s.procs[pid] = p
	}
	return p
}

// exec replaces p's image: its locks end and its threads are gone.
func (s *stream) exec(p *proc) {
	for _, addr := range append([]uint64(nil), p.sorted...) {
		p.end(addr)
	}
	p.arena = nil
	for _, t := range s.threads {
		if t.pid == p.pid {
			t.exit()
		}
	}
}

// fork gives a child process its parent's lock symbols: the same image
// is mapped at the same addresses.
func (s *stream) fork(parent, child uint32) {
	var names []lockKey
	for k := range s.lockNames {
		if k.pid == parent {
			names = append(names, k)
		}
	}
	for _, k := range names {
		ck := lockKey{child, k.addr}
		if _, ok := s.lockNames[ck]; !ok {
			s.lockNames[ck] = s.lockNames[k]
		}
	}
}

// proc holds one process's live lock instances.
type proc struct {
	stream *stream
	pid    uint32
	live   map[uint64]*instance
	sorted []uint64  // addresses of live, ascending: free/munmap ranges
	arena  *instance // the allocator pseudo-lock, created on demand
	ctx    *hookCtx  // its allocator calls under locks and hook locks
}

// lock returns the live instance at addr, creating it when the address has
// none (first use, or reuse after its previous lock ended).
func (p *proc) lock(a *Analyzer, addr uint64, typ lockType) *instance {
	if inst := p.live[addr]; inst != nil {
		return inst
	}
	return p.create(a, addr, typ)
}

func (p *proc) create(a *Analyzer, addr uint64, typ lockType) *instance {
	inst := &instance{
		id:     a.newInstanceID(),
		stream: p.stream,
		pid:    p.pid,
		addr:   addr,
		typ:    typ,
		name:   p.stream.lockNames[lockKey{p.pid, addr}],
		seq:    a.nextSeq,
		weight: 1,
		local:  1,
	}
	a.nextSeq++
	a.instances[inst.id] = inst
	p.live[addr] = inst
	i := sort.Search(len(p.sorted), func(i int) bool { return p.sorted[i] >= addr })
	p.sorted = append(p.sorted, 0)
	copy(p.sorted[i+1:], p.sorted[i:])
	p.sorted[i] = addr
	return inst
}

// initLock starts a new lifetime at addr (re-initialising a live lock ends
// the old one) and remembers where it was initialised, to name it.
func (p *proc) initLock(a *Analyzer, addr uint64, typ lockType, st *events.Stack) *instance {
	p.end(addr)
	inst := p.create(a, addr, typ)
	inst.initStack = st
	return inst
}

// end finishes the lifetime of the lock at addr, if any.
func (p *proc) end(addr uint64) {
	inst, ok := p.live[addr]
	if !ok {
		return
	}
	delete(p.live, addr)
	p.stream.an.lifetimeEnded(inst)
	i := sort.Search(len(p.sorted), func(i int) bool { return p.sorted[i] >= addr })
	p.sorted = append(p.sorted[:i], p.sorted[i+1:]...)
}

// endRange ends every lock in [addr, addr+size).
func (p *proc) endRange(addr, size uint64) {
	n := len(p.sorted)
	if n == 0 || size == 0 {
		return
	}
	hi := addr + size
	if hi < addr {
		hi = ^uint64(0)
	}
	// Most frees touch no lock: check the bounds before searching.
	if p.sorted[0] >= hi || p.sorted[n-1] < addr {
		return
	}
	i := sort.Search(n, func(i int) bool { return p.sorted[i] >= addr })
	j := i
	for j < n && p.sorted[j] < hi {
		inst := p.live[p.sorted[j]]
		delete(p.live, p.sorted[j])
		p.stream.an.lifetimeEnded(inst)
		j++
	}
	if j > i {
		p.sorted = append(p.sorted[:i], p.sorted[j:]...)
	}
}

// arenaLock returns the process's allocator pseudo-lock.
func (p *proc) arenaLock(a *Analyzer) *instance {
	if p.arena == nil {
		p.arena = &instance{
			id:     a.newInstanceID(),
			stream: p.stream,
			pid:    p.pid,
			typ:    typeArena,
			name:   p.stream.allocatorLock,
			used:   true,
			seq:    a.nextSeq,
			weight: 1,
			local:  1,
		}
		a.nextSeq++
		a.instances[p.arena.id] = p.arena
	}
	return p.arena
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
