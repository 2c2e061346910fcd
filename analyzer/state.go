package analyzer

import (
	"github.com/hooktrace/hooktrace/events"
)

// lockType is what kind of lock an instance is.
type lockType uint8

const (
	typeMutex lockType = iota
	typeRwlock
	typeSpin
	typeArena // the allocator's hidden lock
)

func (t lockType) word() string {
	switch t {
	case typeRwlock:
		return "rwlock"
	case typeSpin:
		return "spinlock"
	case typeArena:
		return "allocator lock"
	}
	return "mutex"
}

func lockTypeOf(op events.Op) lockType {
	switch {
	case op >= events.OpRwlockRdlock && op <= events.OpRwlockUnlock,
		op == events.OpRwlockInit, op == events.OpRwlockDestroy:
		return typeRwlock
	case op >= events.OpSpinLock && op <= events.OpSpinUnlock,
		op == events.OpSpinInit, op == events.OpSpinDestroy:
		return typeSpin
	}
	return typeMutex
}

// The rwlock preference (Event.Arg of rwlock calls) under which a read
// lock waits behind a queued writer, so reads are not recursive.
const rwlockPreferWriterNonrecursive = 2

// heldLock is one lock a thread holds.
type heldLock struct {
	inst    *instance
	addr    uint64
	depth   int32
	read    bool      // held for reading (shared)
	inAlloc bool      // taken by a hook inside an allocator call
	op      events.Op // the call that took it
	stack   uint32    // where it was taken (stream-local stack ID)
}

// thread is one thread's state.
type thread struct {
	stream *stream
	pid    uint32
	tid    uint32
	proc   *proc

	held []heldLock

	// User-probed functions active on the thread, innermost last.
	probes        []activeProbe
	probesInAlloc int // how many of them were entered inside the allocator

	// The allocator call the thread made last from outside the allocator:
	// hooks that run inside it are attributed to it.
	allocOp    events.Op
	allocStack uint32

	hook hookContext

	// The mutex of the condition wait the thread entered and has not
	// returned from: a wait left by cancellation never returns, but its
	// mutex is taken back before the cleanup handlers run, and one of
	// them usually unlocks it.
	waitingOn uint64

	prev       prevEvent     // the thread's latest event
	outlived   *selfSighting // a self-deadlock the thread's next event contradicts
	selfBefore prevEvent     // the event before that self-deadlock
	// In an attach, the lock addresses the thread was seen taking: an
	// unlock of any other may release a lock taken before the attach.
	took map[uint64]bool

	// The locks held around the thread's current allocator call, and
	// those a hook took again inside it.
	allocUnder []*instance
	retook     []*instance
}

type activeProbe struct {
	index   uint64
	name    string
	arg0    uint64 // the function's first integer argument (Rule.OuterArg0)
	slot    uint64 // where its return address is; 0 if the trace does not say
	stack   uint32
	inAlloc bool
	allocOp events.Op
}

func (t *thread) findHeld(addr uint64) int {
	for i := len(t.held) - 1; i >= 0; i-- {
		if t.held[i].addr == addr {
			return i
		}
	}
	return -1
}

// release drops one level of the lock at addr (all of it when all is set,
// as cond_wait does). It reports false, and counts the unlock, when the
// thread does not hold the lock (lost events, or a lock handed between
// threads).
func (t *thread) release(addr uint64, all bool) bool {
	i := t.findHeld(addr)
	if i < 0 {
		t.stream.unbalanced++
		return false
	}
	h := &t.held[i]
	h.depth--
	if h.depth > 0 && !all {
		return true
	}
	// Keep the order of the others: out-of-order unlocks are common.
	copy(t.held[i:], t.held[i+1:])
	t.held = t.held[:len(t.held)-1]
	return true
}

// exit forgets a thread's state; a TID can be reused later.
func (t *thread) exit() {
	t.held = t.held[:0]
	t.outlived = nil
	t.probes = t.probes[:0]
	t.probesInAlloc = 0
	t.allocOp = events.OpNone
	t.hook.reset()
	t.waitingOn = 0
}

// acquisition describes one lock being taken, for the shared code of lock
// calls and cond_wait's retake.
type acquisition struct {
	op        events.Op
	inst      *instance
	addr      uint64
	read      bool
	recursive bool // the read is a recursive read
	try       bool
	timed     bool
	inAlloc   bool
	e         *events.Event
}

func (a *Analyzer) acquire(t *thread, e *events.Event, inAlloc bool) {
	op := e.Op
	try, timed := op.IsTry(), op.IsTimed()
	if try || timed {
		// Their outcome is known at return only.
		if e.Flags&events.FlagReturn == 0 {
			return
		}
		if e.Flags&events.FlagAcquired == 0 && e.Ret != 0 {
			return
		}
	} else if e.Flags&events.FlagReturn != 0 {
		// Blocking calls are traced at entry, already marked acquired.
		return
	}
	typ := lockTypeOf(op)
	inst := t.proc.lock(a, e.Addr, typ)
	if typ == typeMutex {
		// __kind: the low two bits are the type, higher bits robust/PI.
		inst.recursive = events.MutexKind(e.Arg&3) == events.MutexRecursive
		inst.errorCheck = events.MutexKind(e.Arg&3) == events.MutexErrorCheck
	} else if typ == typeRwlock {
		// Set at init or by any call: a lifetime's preference is fixed.
		inst.nonRecursiveReads = inst.nonRecursiveReads || e.Arg == rwlockPreferWriterNonrecursive
	}
	read := op.IsRead()
	a.take(t, acquisition{
		op:        op,
		inst:      inst,
		addr:      e.Addr,
		read:      read,
		recursive: read && !inst.nonRecursiveReads,
		try:       try,
		timed:     timed,
		inAlloc:   inAlloc,
		e:         e,
	})
}

// condRetake handles pthread_cond_wait's return, which takes the mutex
// back while the thread may hold other locks.
func (a *Analyzer) condRetake(t *thread, e *events.Event, inAlloc bool) {
	if t.findHeld(e.Addr2) >= 0 {
		return // the release was lost; nothing to retake
	}
	inst := t.proc.lock(a, e.Addr2, typeMutex)
	a.take(t, acquisition{op: e.Op, inst: inst, addr: e.Addr2, inAlloc: inAlloc, e: e})
}

func (a *Analyzer) take(t *thread, q acquisition) {
	inst := q.inst
	if !inst.used {
		inst.used = true
		inst.firstStack = t.stream.stack(q.e.Stack)
	}
	if q.inAlloc && len(t.allocUnder) > 0 {
		t.retook = append(t.retook, inst)
	}
	if i := t.findHeld(q.addr); i >= 0 {
		a.retake(t, i, q)
		return
	}
	if t.stream.attached() {
		if t.took == nil {
			t.took = map[uint64]bool{}
		}
		t.took[q.addr] = true
	}
	if !q.try {
		dt := depType(0)
		if q.recursive {
			dt |= depRecursiveRead
		}
		for i := range t.held {
			a.lockEdge(t, &t.held[i], inst, q, dt)
		}
		if q.inAlloc {
			a.hookAcquire(t, q)
		}
	}
	t.held = append(t.held, heldLock{
		inst:    inst,
		addr:    q.addr,
		depth:   1,
		read:    q.read,
		inAlloc: q.inAlloc,
		op:      q.op,
		stack:   q.e.Stack,
	})
}

// retake handles a thread taking a lock it already holds.
func (a *Analyzer) retake(t *thread, i int, q acquisition) {
	h := &t.held[i]
	// A hook inside the allocator re-taking a lock held since before the
	// allocator call: the hook runs in the middle of the lock's critical
	// section.
	viaHook := q.inAlloc && !h.inAlloc
	switch {
	case q.try:
		// A trylock of a held lock cannot wait; on success it nests.
		h.depth++
	case h.inst.typ == typeMutex && h.inst.recursive:
		h.depth++
		if viaHook {
			a.selfLock(t, h, q, selfRecursiveHook)
		}
	case h.inst.typ == typeRwlock && h.read && q.read && q.recursive:
		h.depth++
	case h.inst.typ == typeRwlock && h.read && q.read:
		h.depth++
		a.selfLock(t, h, q, selfReadReentry)
	case h.inst.typ == typeRwlock && !h.read:
		// glibc knows its writer: the call fails with EDEADLK.
		a.selfLock(t, h, q, selfErrorCheck)
	case q.timed:
		// Waits for itself until the deadline; the call then fails.
		a.selfLock(t, h, q, selfTimed)
	case h.inst.typ == typeMutex && h.inst.errorCheck:
		a.selfLock(t, h, q, selfErrorCheck)
	default:
		// It waits forever, unless the trace is wrong: then the thread goes
		// on holding it once more (its next event checks).
		h.depth++
		a.selfLock(t, h, q, selfDeadlock)
	}
}

// probeEnter pushes a user-probed function and checks nesting rules.
func (a *Analyzer) probeEnter(t *thread, e *events.Event, inAlloc bool) {
	name := t.stream.probeName(e.Arg)
	p := activeProbe{index: e.Arg, name: name, arg0: e.Addr, slot: e.Size, stack: e.Stack, inAlloc: inAlloc}
	if a.unlessRules {
		t.stream.enteredProbe(t.pid, e.Arg)
	}
	if inAlloc {
		p.allocOp = t.enclosingAllocOp(e)
		t.probesInAlloc++
		if t.stream.arenaEnabled {
			t.hook.active = true
			t.decideHook(t.stream.stack(e.Stack), "the entry of "+name)
		}
	}
	if len(a.rules) > 0 {
		a.checkNesting(t, e, name)
	}
	t.probes = append(t.probes, p)
}

// probeExit pops the function, and any left open above it (a longjmp out
// of them, or their exits were lost). A function whose entry the thread
// does not have was entered on another thread of the process by a
// user-level thread that moved: it is popped there, alone.
func (t *thread) probeExit(idx, slot uint64) {
	if t.popProbe(idx, slot, true) || slot == 0 {
		return
	}
	for _, o := range t.stream.threads {
		if o != t && o.pid == t.pid && o.popProbe(idx, slot, false) {
			return
		}
	}
}

// popProbe pops the newest active probe idx entered at slot (any slot,
// when either is 0), and with above those entered after it.
func (t *thread) popProbe(idx, slot uint64, above bool) bool {
	for i := len(t.probes) - 1; i >= 0; i-- {
		p := t.probes[i]
		if p.index != idx || (slot != 0 && p.slot != 0 && p.slot != slot) {
			continue
		}
		end := i + 1
		if above {
			end = len(t.probes)
		}
		for _, q := range t.probes[i:end] {
			if q.inAlloc {
				t.probesInAlloc--
			}
		}
		t.probes = append(t.probes[:i], t.probes[end:]...)
		return true
	}
	return false
}
