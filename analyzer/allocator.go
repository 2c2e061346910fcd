package analyzer

import (
	"github.com/hooktrace/hooktrace/events"
)

// hookContext is what the analyzer learnt about the allocator call a
// thread is inside of, while hooks run in it.
type hookContext struct {
	active     bool
	call       uint64    // the allocator call number (Event.InAllocCall) it belongs to
	via        string    // the memory syscall the allocator made
	hold       arenaHold // decided from another event's stack; holdNone if not
	holdReason string    // why, and from which event
	// Hook dependencies whose stacks did not decide the arena question:
	// a memory syscall later in the same allocator call may.
	pending []pendingHold
	// Locks hooks took in this call whose hooked syscall is not known yet:
	// the next memory syscall of the call is the one the hook wraps.
	takes []*hookTake
}

type pendingHold struct {
	edge *edge
	dt   depType
	s    *sighting
}

func (h *hookContext) reset() {
	h.active = false
	h.via = ""
	h.hold = holdNone
	h.holdReason = ""
	h.pending = h.pending[:0]
	h.takes = h.takes[:0]
}

// allocCallStack is the stack of the allocator call (op) that an event
// with stack st ran inside. It comes from st itself, which the raw stack
// copy of such an event unwinds through the allocator to its caller, so
// both modes show the same call. Without one, the thread's last allocator
// event of that op stands in: in aggregate mode the chain cache may have
// only counted the call the event ran in, and that is an earlier one.
func (t *thread) allocCallStack(st *events.Stack, op events.Op) *events.Stack {
	if s := enclosingAllocCall(st); s != nil {
		return s
	}
	if op == t.allocOp {
		return t.stream.stack(t.allocStack)
	}
	return nil
}

// enclosingAllocOp is the allocator call an in-allocator event runs in.
func (t *thread) enclosingAllocOp(e *events.Event) events.Op {
	if e.Flags&events.FlagInAlloc != 0 {
		if op, _ := e.InAllocCall(); op.IsAllocator() {
			return op
		}
	}
	for i := len(t.probes) - 1; i >= 0; i-- {
		if t.probes[i].inAlloc && t.probes[i].allocOp != events.OpNone {
			return t.probes[i].allocOp
		}
	}
	return t.allocOp
}

// hookVia names what a hook runs in: the hooked memory call from its stack,
// else the memory syscall seen in this allocator call, else the innermost
// user-probed function entered inside the allocator.
func (t *thread) hookVia(st *events.Stack) string {
	if c := hookedCall(st); c != "" {
		return c
	}
	if t.hook.via != "" {
		return t.hook.via
	}
	for i := len(t.probes) - 1; i >= 0; i-- {
		if t.probes[i].inAlloc {
			return t.probes[i].name
		}
	}
	return ""
}

// allocatorCall handles malloc, free and the rest of the family.
func (a *Analyzer) allocatorCall(t *thread, e *events.Event, inAlloc bool) {
	if e.Flags&events.FlagReturn != 0 {
		return
	}
	if e.Op == events.OpFree && e.Size > 0 {
		t.proc.endRange(e.Addr, e.Size)
	}
	if inAlloc {
		a.reentry(t, e)
		return
	}
	t.allocOp = e.Op
	t.allocStack = e.Stack
	if len(t.held) > 0 {
		a.underLock(t, e)
	}
	if len(t.held) == 0 || !t.stream.arenaEnabled {
		return
	}
	// Every held lock → the arena: the call may need the arena lock
	// (tcache hits do not, but the next call may: the model is about what
	// can happen).
	arena := t.proc.arenaLock(a)
	for i := range t.held {
		h := &t.held[i]
		dt := depType(0)
		if h.read {
			dt |= depHeldShared
		}
		ed := a.edgeFor(h.inst, arena)
		if ed.seen[dt] != nil {
			continue
		}
		s := t.stream
		ed.seen[dt] = &sighting{
			stream:    s,
			pid:       t.pid,
			tid:       t.tid,
			heldOp:    h.op,
			heldRead:  h.read,
			heldStack: s.stack(h.stack),
			op:        e.Op,
			stack:     s.stack(e.Stack),
			allocOp:   e.Op,
		}
	}
}

// hookAcquire records allocator → lock for a lock taken by a hook running
// inside an allocator call, with the verdict on the arena lock.
func (a *Analyzer) hookAcquire(t *thread, q acquisition) {
	s := t.stream
	st := s.stack(q.e.Stack)
	var hold arenaHold
	var reason string
	if s.arenaEnabled {
		hold, reason = decideArena(st)
		if hold == holdMaybe && t.hook.hold != holdNone {
			hold, reason = t.hook.hold, t.hook.holdReason
		}
	} else {
		hold = holdNotHeld
		reason = s.allocator + " uses its own pthread locks, which are traced like any other lock"
	}
	t.hook.active = true
	allocOp := t.enclosingAllocOp(q.e)
	sg := &sighting{
		stream:     s,
		pid:        t.pid,
		tid:        t.tid,
		heldOp:     allocOp,
		op:         q.op,
		read:       q.read,
		stack:      st,
		timed:      q.timed,
		allocOp:    allocOp,
		via:        t.hookVia(st),
		hook:       site(callerFrame(st)),
		hold:       hold,
		holdReason: reason,
	}
	sg.heldStack = t.allocCallStack(st, allocOp)
	dt := depType(0)
	if q.recursive {
		dt |= depRecursiveRead
	}
	ed := a.edgeFor(t.proc.arenaLock(a), q.inst)
	ed.holdCount[hold]++
	ed.noteCall(sg)
	if old := ed.seen[dt]; old == nil || old.hold < hold {
		ed.seen[dt] = sg
	}
	if hold == holdMaybe {
		t.hook.pending = append(t.hook.pending, pendingHold{edge: ed, dt: dt, s: sg})
	}
	a.hookTook(t, q, sg)
}

// memSyscall handles madvise, munmap and the rest: munmap ends the locks it
// unmaps; made from inside the allocator, its stack may tell whether the
// arena lock is held for the hooks of this allocator call.
func (a *Analyzer) memSyscall(t *thread, e *events.Event, inAlloc bool) {
	if e.Op == events.OpMunmap {
		t.proc.endRange(e.Addr, e.Size)
	}
	if inAlloc {
		c := t.proc.hookContext()
		t.passedUnder(c, e.Op)
		for _, h := range t.hook.takes {
			if h.via == "" {
				h.via = e.Op.String()
			}
		}
		t.hook.takes = t.hook.takes[:0]
		a.sawSyscall(c, t.enclosingAllocOp(e), e.Op)
	}
	if !inAlloc || !t.stream.arenaEnabled {
		return
	}
	t.hook.active = true
	t.hook.via = e.Op.String()
	t.decideHook(t.stream.stack(e.Stack), "the "+e.Op.String()+" call this allocator call made")
}

// decideHook learns from the stack of another event in the same allocator
// call (a memory syscall, a probed hook's entry) whether the arena lock is
// held, for the hooks' lock dependencies that their own stacks left open.
func (t *thread) decideHook(st *events.Stack, source string) {
	hold, reason := decideArena(st)
	if hold == holdMaybe {
		return
	}
	reason += ", seen on " + source
	t.hook.hold, t.hook.holdReason = hold, reason
	for _, p := range t.hook.pending {
		p.revise(hold, reason)
	}
	t.hook.pending = t.hook.pending[:0]
}

// revise replaces a "may hold" verdict once the allocator call's memory
// syscall decided it. A dependency keeps "may hold" while any other
// undecided sighting supports it.
func (p pendingHold) revise(hold arenaHold, reason string) {
	s, ed := p.s, p.edge
	if s.hold != holdMaybe {
		return
	}
	ed.holdCount[holdMaybe]--
	ed.holdCount[hold]++
	if hold == holdHeld || ed.holdCount[holdMaybe] == 0 {
		s.hold, s.holdReason = hold, reason
		ed.noteCall(s)
	}
	if cur := ed.seen[p.dt]; cur == nil || cur.hold < s.hold {
		ed.seen[p.dt] = s
	}
}

// glibc 2.36's malloc internals, by whether the arena lock is held while
// they run (see the package documentation). new_heap and alloc_new_heap
// are missing on purpose: their caller decides.
var (
	arenaHeldIn = map[string]bool{
		"_int_free": true, "_int_malloc": true, "_int_realloc": true, "_int_memalign": true,
		"sysmalloc": true, "systrim": true, "heap_trim": true, "shrink_heap": true,
		"delete_heap": true, "mtrim": true, "malloc_trim": true, "__malloc_trim": true,
		"malloc_consolidate": true, "_int_free_merge_chunk": true,
		"_int_free_maybe_consolidate": true, "_int_free_create_chunk": true,
	}
	arenaNotHeldIn = map[string]string{
		"munmap_chunk":   "an mmapped chunk is unmapped without the arena lock",
		"mremap_chunk":   "an mmapped chunk is remapped without the arena lock",
		"_int_new_arena": "a new arena's heap is made before its lock is taken",
		"arena_get2":     "a new arena's heap is made before its lock is taken",
		// free's only memory call of its own: every arena path goes through
		// _int_free, so a hook whose nearest allocator frame is free itself
		// runs in munmap_chunk, which glibc 2.36 inlines into free.
		"free":        "free unmaps an mmapped chunk itself (munmap_chunk, inlined) without the arena lock",
		"__libc_free": "free unmaps an mmapped chunk itself (munmap_chunk, inlined) without the arena lock",
	}
)

// decideArena tells from a stack whether glibc holds its arena lock there.
// The innermost deciding frame wins: new_heap under sysmalloc is held,
// under _int_new_arena it is not.
func decideArena(st *events.Stack) (arenaHold, string) {
	if st == nil || len(st.Frames) == 0 {
		return holdMaybe, "glibc may hold its arena lock here: no stack was recorded"
	}
	for i := range st.Frames {
		fn := baseFunction(st.Frames[i].Function)
		if arenaHeldIn[fn] {
			return holdHeld, "glibc holds its arena lock here (" + fn + " on the stack)"
		}
		if why, ok := arenaNotHeldIn[fn]; ok {
			return holdNotHeld, "glibc does not hold its arena lock here (" + fn + ": " + why + ")"
		}
	}
	if st.Truncated {
		return holdMaybe, "glibc may hold its arena lock here: the stack is truncated before any glibc malloc frame (glibc has no frame pointers)"
	}
	return holdMaybe, "glibc may hold its arena lock here: no glibc-internal malloc frame on the stack (are glibc's debug symbols installed?)"
}

// reentryKey identifies an allocator call made inside an allocator call.
type reentryKey struct {
	stream int
	outer  events.Op
	inner  events.Op
	stack  uint32
}

type reentrySighting struct {
	key        reentryKey
	stream     *stream
	pid, tid   uint32
	outer      events.Op
	inner      events.Op
	outerStack *events.Stack
	stack      *events.Stack
	via        string
	count      uint64
	where      seenCounts
}

func (a *Analyzer) reentry(t *thread, e *events.Event) {
	if selfCall(t.stream.stack(e.Stack)) {
		return
	}
	outer := t.enclosingAllocOp(e)
	key := reentryKey{t.stream.index, outer, e.Op, e.Stack}
	if r := a.reentries[key]; r != nil {
		r.count++
		r.where.add(t.stream, t.pid, t.tid, 1)
		return
	}
	st := t.stream.stack(e.Stack)
	r := &reentrySighting{
		key:    key,
		stream: t.stream,
		pid:    t.pid,
		tid:    t.tid,
		outer:  outer,
		inner:  e.Op,
		stack:  st,
		via:    t.hookVia(st),
		count:  1,
		where:  seenCounts{},
	}
	r.where.add(t.stream, t.pid, t.tid, 1)
	r.outerStack = t.allocCallStack(st, outer)
	a.reentries[key] = r
	a.reentryList = append(a.reentryList, r)
}
