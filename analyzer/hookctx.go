package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// The allocator as a hook context (lockdep's fs_reclaim pseudo-lock): once
// a memory hook of a process was seen taking lock M inside an allocator
// call, any allocator call that can make the hooked syscall, made while
// holding L, may run that hook and so take M under L. The dependency
// L → M "through the hook" is added to the graph whether or not the
// allocator holds a lock of its own on that path.

// glibcReach lists, for glibc 2.36, which memory syscalls each allocator
// entry point can make, with the path through malloc.c that makes each.
// Conservative: a path that is rare (a thread's first malloc, a heap that
// grows, a free that trims) counts. See the package documentation.
var glibcReach = map[events.Op]map[events.Op]string{}

func init() {
	alloc := map[events.Op]string{
		events.OpMunmap: "ENTRY → arena_get2 → _int_new_arena → new_heap → alloc_new_heap → munmap (a thread's first call makes its arena; the new heap's mapping is trimmed to alignment), or ENTRY → _int_malloc → sysmalloc → new_heap → alloc_new_heap → munmap (a non-main arena grows by a new heap)",
		events.OpMmap:   "ENTRY → _int_malloc → sysmalloc → mmap (a chunk above the mmap threshold, a new heap, or the main arena when brk fails)",
		events.OpBrk:    "ENTRY → _int_malloc → sysmalloc → sbrk → brk (the main arena grows)",
		// No madvise: malloc's only ones are sysmalloc → madvise_thp, under
		// the non-default glibc.malloc.hugetlb=1 tunable, and sysmalloc →
		// _int_free of a full heap's old top → heap_trim, which trims the
		// heap just made for the request. A process that does either is
		// seen doing it (hookCtx.seen), and then it counts.
	}
	free := map[events.Op]string{
		events.OpMunmap:  "ENTRY → munmap_chunk → munmap (an mmapped chunk), or ENTRY → _int_free → heap_trim → delete_heap → munmap (a non-main heap emptied)",
		events.OpMadvise: "ENTRY → _int_free → heap_trim → shrink_heap → madvise (a non-main heap trimmed)",
		events.OpBrk:     "ENTRY → _int_free → systrim → sbrk → brk (the main arena trimmed)",
		events.OpMmap:    "ENTRY → _int_free → heap_trim → shrink_heap → mmap (MAP_FIXED, when overcommit is strict)",
	}
	for _, op := range []events.Op{events.OpMalloc, events.OpCalloc, events.OpValloc, events.OpPvalloc} {
		glibcReach[op] = entryPaths(op, alloc, nil)
	}
	// _int_memalign frees the unused head and tail of the chunk it carved.
	for _, op := range []events.Op{events.OpPosixMemalign, events.OpAlignedAlloc, events.OpMemalign} {
		glibcReach[op] = entryPaths(op, alloc, free)
	}
	glibcReach[events.OpFree] = entryPaths(events.OpFree, free, nil)
	realloc := entryPaths(events.OpRealloc, alloc, free)
	realloc[events.OpMremap] = "realloc → mremap_chunk → mremap (an mmapped chunk resized)"
	glibcReach[events.OpRealloc] = realloc
}

func entryPaths(entry events.Op, first, second map[events.Op]string) map[events.Op]string {
	out := map[events.Op]string{}
	name := entry.String()
	for _, paths := range []map[events.Op]string{first, second} {
		for sys, p := range paths {
			p = strings.ReplaceAll(p, "ENTRY", name)
			if old, ok := out[sys]; ok {
				p = old + "; or " + p
			}
			out[sys] = p
		}
	}
	return out
}

// hookCtx is what one process showed of its allocator calls and hooks.
type hookCtx struct {
	under    map[underKey]*underCall
	unders   []*underCall
	takes    map[takeKey]*hookTake
	takeList []*hookTake
	// seen[entry][syscall]: the allocator was seen making the syscall
	// inside that entry point (what a non-glibc allocator does).
	seen map[events.Op]map[events.Op]bool
	// passed[{lock, syscall}]: the syscall (so its hook) ran inside an
	// allocator call made with the lock held, and no hook took the lock
	// again: the hook re-enters it through a recursive wrapper (UCX's
	// spinlock), or takes it only on some paths.
	passed map[passKey]bool
}

type passKey struct {
	inst int32
	sys  events.Op
}

type underKey struct {
	inst int32
	op   events.Op
	read bool
}

// underCall is the first allocator call seen made while holding a lock.
type underCall struct {
	inst       *instance
	read       bool
	heldOp     events.Op
	heldStack  *events.Stack
	op         events.Op
	allocStack *events.Stack
	stream     *stream
	pid, tid   uint32
}

type takeKey struct {
	inst int32
	op   events.Op
	via  string
	read bool
}

// hookTake is the first time a hook took a lock inside an allocator call.
type hookTake struct {
	inst       *instance
	op         events.Op // the lock call
	read       bool
	recursive  bool
	timed      bool
	stack      *events.Stack
	allocOp    events.Op
	allocStack *events.Stack
	via        string // the hooked syscall ("munmap"), or a probed function, or ""
	stream     *stream
	pid, tid   uint32
}

// hookLink is a dependency L → M through a hook: under holds L around an
// allocator call that can run the hook that takes M.
type hookLink struct {
	ctx   *hookCtx
	under *underCall
	take  *hookTake
	// weight, for a hook-context hazard (hookSelfList): how many it
	// stands for, its folded twins of other traces included.
	weight uint64
	// where counts them by the thread that held the lock around the
	// allocator call; nil until a twin is folded in (seenIn).
	where seenCounts
}

// seenIn counts the hazards l stands for by the thread that held the lock
// around the allocator call.
func (l *hookLink) seenIn() seenCounts {
	if l.where != nil {
		return l.where
	}
	c := seenCounts{}
	c.add(l.under.stream, l.under.pid, l.under.tid, l.weight)
	return c
}

// absorb folds the twin hazard o, of another trace, into l.
func (l *hookLink) absorb(o *hookLink) {
	l.where = l.seenIn()
	l.where.merge(o.seenIn())
	l.weight += o.weight
}

// path is the allocator's path from the call under the lock to the hooked
// call, as known when the result is built (the hooked call may be learnt
// after the link was made).
func (l *hookLink) path() string {
	_, p := l.ctx.reach(l.under.stream, l.under.op, l.take)
	if p == "" {
		p = l.under.op.String() + " can run the hook"
	}
	return p
}

func (p *proc) hookContext() *hookCtx {
	if p.ctx == nil {
		p.ctx = &hookCtx{
			under:  map[underKey]*underCall{},
			takes:  map[takeKey]*hookTake{},
			seen:   map[events.Op]map[events.Op]bool{},
			passed: map[passKey]bool{},
		}
	}
	return p.ctx
}

// syscallOp is the memory syscall a hook's "via" names, if it names one.
func syscallOp(via string) (events.Op, bool) {
	if via == "sbrk" {
		return events.OpBrk, true
	}
	op, ok := events.OpByName(via)
	if !ok || !op.IsMemSyscall() {
		return events.OpNone, false
	}
	return op, true
}

// reach reports whether an allocator call entered at entry can run the
// hook, and by which path.
func (c *hookCtx) reach(s *stream, entry events.Op, h *hookTake) (bool, string) {
	sys, known := syscallOp(h.via)
	seen := known && c.seen[entry][sys]
	if s.allocator == "glibc" {
		if !known {
			// The hook's call is unknown: every entry point makes some
			// memory syscall.
			return true, entry.String() + " can make memory syscalls (the hook's call was not identified)"
		}
		if p, ok := glibcReach[entry][sys]; ok {
			if seen {
				p += "; seen in this process"
			}
			return true, "glibc 2.36: " + p
		}
	}
	if seen {
		return true, entry.String() + " was seen making " + sys.String() + " in this process"
	}
	if s.allocator == "glibc" {
		return false, ""
	}
	// Another allocator: only what it was seen to do.
	if entry == h.allocOp {
		return true, "the hook was seen running inside " + entry.String()
	}
	if !known && len(c.seen[entry]) > 0 {
		return true, entry.String() + " was seen making memory syscalls in this process"
	}
	return false, ""
}

// underLock records an allocator call made while the thread holds locks.
func (a *Analyzer) underLock(t *thread, e *events.Event) {
	c := t.proc.hookContext()
	s := t.stream
	for i := range t.held {
		t.allocUnder = append(t.allocUnder, t.held[i].inst)
	}
	for i := range t.held {
		h := &t.held[i]
		k := underKey{h.inst.id, e.Op, h.read}
		if c.under[k] != nil {
			continue
		}
		u := &underCall{
			inst: h.inst, read: h.read, heldOp: h.op, heldStack: s.stack(h.stack),
			op: e.Op, allocStack: s.stack(e.Stack), stream: s, pid: t.pid, tid: t.tid,
		}
		c.under[k] = u
		c.unders = append(c.unders, u)
		for _, h := range c.takeList {
			a.hookLink(c, u, h)
		}
	}
}

// hookTook records a lock a hook took inside an allocator call.
func (a *Analyzer) hookTook(t *thread, q acquisition, sg *sighting) {
	c := t.proc.hookContext()
	// What the hook wraps: its own stack, or a probed hook function. Not
	// a syscall seen earlier in the allocator call: the hook runs before
	// the call it wraps (an mmap precedes the munmap in alloc_new_heap).
	via := hookedCall(sg.stack)
	if via == "" {
		for i := len(t.probes) - 1; i >= 0 && via == ""; i-- {
			if t.probes[i].inAlloc {
				via = t.probes[i].name
			}
		}
	}
	k := takeKey{q.inst.id, sg.allocOp, via, q.read}
	if c.takes[k] != nil {
		return
	}
	h := &hookTake{
		inst: q.inst, op: q.op, read: q.read, recursive: q.recursive, timed: q.timed,
		stack: sg.stack, allocOp: sg.allocOp, allocStack: sg.heldStack, via: via,
		stream: t.stream, pid: t.pid, tid: t.tid,
	}
	c.takes[k] = h
	c.takeList = append(c.takeList, h)
	if via == "" {
		t.hook.takes = append(t.hook.takes, h)
	}
	if sys, ok := syscallOp(h.via); ok {
		a.sawSyscall(c, h.allocOp, sys)
	}
	for _, u := range c.unders {
		a.hookLink(c, u, h)
	}
}

// passedUnder records a memory syscall made inside an allocator call that
// its thread made holding locks, for each of them no hook took again.
func (t *thread) passedUnder(c *hookCtx, sys events.Op) {
	for _, l := range t.allocUnder {
		again := false
		for _, r := range t.retook {
			again = again || r == l
		}
		if !again {
			c.passed[passKey{l.id, sys}] = true
		}
	}
}

// passedWithout reports whether the hook's syscall was seen running under
// inst without the hook taking it. A hook whose call is unknown proves
// nothing this way.
func (c *hookCtx) passedWithout(inst *instance, via string) bool {
	sys, ok := syscallOp(via)
	return ok && c.passed[passKey{inst.id, sys}]
}

// sawSyscall records a memory syscall made inside an allocator entry.
func (a *Analyzer) sawSyscall(c *hookCtx, entry, sys events.Op) {
	if !entry.IsAllocator() || c.seen[entry][sys] {
		return
	}
	if c.seen[entry] == nil {
		c.seen[entry] = map[events.Op]bool{}
	}
	c.seen[entry][sys] = true
	// What the allocator is now known to do may link earlier sightings.
	for _, u := range c.unders {
		if u.op != entry {
			continue
		}
		for _, h := range c.takeList {
			a.hookLink(c, u, h)
		}
	}
}

// hookLink adds under.inst → take.inst through the hook when the
// allocator call can run it. A pair may come again (the allocator seen
// doing more): the edge, or the self sighting, is kept once.
func (a *Analyzer) hookLink(c *hookCtx, u *underCall, h *hookTake) {
	if ok, _ := c.reach(u.stream, u.op, h); !ok {
		return
	}
	link := &hookLink{ctx: c, under: u, take: h}
	if u.inst == h.inst {
		a.hookSelf(link)
		return
	}
	dt := depType(0)
	if u.read {
		dt |= depHeldShared
	}
	if h.read && h.recursive {
		dt |= depRecursiveRead
	}
	ed := a.edgeFor(u.inst, h.inst)
	ed.unguard()
	if ed.seen[dt] != nil {
		// Seen directly, or through another hook: the first one explains.
		return
	}
	ed.seen[dt] = &sighting{
		stream:    u.stream,
		pid:       u.pid,
		tid:       u.tid,
		heldOp:    u.heldOp,
		heldRead:  u.read,
		heldStack: u.allocStack,
		op:        h.op,
		read:      h.read,
		stack:     h.stack,
		timed:     h.timed,
		allocOp:   u.op,
		via:       h.via,
		link:      link,
	}
}

// hookSelfs are L == M: a lock held around an allocator call that can run
// a hook that takes the same lock.
type hookSelfKey struct {
	inst int32
	op   events.Op
	via  string
}

func (a *Analyzer) hookSelf(l *hookLink) {
	k := hookSelfKey{l.under.inst.id, l.under.op, l.take.via}
	if a.hookSelfs == nil {
		a.hookSelfs = map[hookSelfKey]bool{}
	}
	if a.hookSelfs[k] {
		return
	}
	a.hookSelfs[k] = true
	l.weight = 1
	a.hookSelfList = append(a.hookSelfList, l)
}

// hookSelfVerdict: what happens when the hook takes, inside the allocator
// call, the lock its thread holds around that call. ok is false when
// nothing does (a recursive read beside the thread's own read).
func hookSelfVerdict(l *hookLink) (kind Kind, sev Severity, why string, ok bool) {
	inst, u, h := l.under.inst, l.under, l.take
	switch {
	case inst.typ == typeMutex && inst.recursive:
		return KindHookLock, SeverityWarning, "a recursive mutex: the hook does not block, but runs in the middle of its critical section", true
	case inst.typ == typeMutex && inst.errorCheck:
		return KindHookLock, SeverityWarning, "an error-checking mutex: the hook's lock call fails with EDEADLK and the hook runs unprotected", true
	case inst.typ == typeRwlock && u.read && h.read && h.recursive:
		return "", "", "", false
	case inst.typ == typeRwlock && u.read && h.read:
		return KindHookLock, SeverityWarning, "a rwlock whose readers queue behind writers: the hook's read lock deadlocks if a writer arrives in between", true
	case inst.typ == typeRwlock && !u.read:
		return KindHookLock, SeverityWarning, "a rwlock held for writing: glibc fails the hook's lock call with EDEADLK and the hook runs unprotected", true
	case h.timed:
		return KindHookLock, SeverityWarning, "the hook's timed lock waits for its own thread until the deadline", true
	}
	word := "a non-recursive " + inst.typ.word()
	if inst.typ == typeMutex {
		word = "a normal (non-recursive) mutex"
	}
	if l.ctx.passedWithout(inst, h.via) {
		return KindHookLock, SeverityWarning, word + " to pthreads, but the hook" + viaText(h.via) +
			" was seen running inside an allocator call made with it held without taking it again: it re-enters it through a recursive wrapper (as UCX's spinlock does) or takes it only on some paths", true
	}
	return KindSelfDeadlock, SeverityError, word + ": the hook waits forever for the lock its own thread holds", true
}

// hookSelfFindings reports L == M hazards, merged by lock class and the
// allocator call made under the lock; the details and edges are those of
// the first sighting.
func (a *Analyzer) hookSelfFindings(n *naming) []Finding {
	var out []Finding
	var where []seenCounts
	index := map[string]int{}
	for _, l := range a.hookSelfList {
		kind, sev, why, ok := hookSelfVerdict(l)
		if !ok {
			continue
		}
		u, h := l.under, l.take
		if a.selfSeenViaHook(u.inst) {
			// The thread really took it again inside the allocator: that
			// finding says more.
			continue
		}
		lock := n.of(u.inst)
		// What it is: the lock class and the allocator call made under it.
		// Which hooked call and which sites were seen first is timing.
		id := findingID(kind, "hook context", n.key(u.inst), u.op.String())
		if i, ok := index[id]; ok {
			out[i].Occurrences += l.weight
			where[i].merge(l.seenIn())
			continue
		}
		index[id] = len(out)
		where = append(where, seenCounts{})
		where[len(where)-1].merge(l.seenIn())
		alloc := u.stream.allocatorLock
		hook := "a memory hook" + viaText(h.via)
		threads := map[uint32]bool{u.tid: true, h.tid: true}
		f := Finding{
			ID:          id,
			Kind:        kind,
			Severity:    sev,
			Locks:       []string{lock},
			Threads:     sortedTIDs(threads),
			Occurrences: l.weight,
		}
		if sev == SeverityError {
			f.Title = "self-deadlock hazard: " + u.op.String() + " called while holding " + lock + " can run " + hook + " that takes " + lock
		} else {
			f.Title = "memory hook may re-enter " + lock + " inside " + u.op.String()
		}
		f.Detail = "A thread holds " + lock + " around " + u.op.String() + " at " + site(allocCallerFrame(u.allocStack)) +
			". " + capitalize(hook) + " was seen taking " + lock + " inside " + h.allocOp.String() + " at " + site(callerFrame(h.stack)) +
			". The allocator call can run that hook (" + l.path() + "). When it does, " + lock + " is " + why +
			". This run did not hang: the two paths were seen separately. Fix: do not call the allocator with " + lock + " held, or do not take it in the hook."
		e1 := Edge{
			From: lock, To: alloc, Thread: u.tid, ThreadName: u.stream.threadName(u.tid), PID: u.pid, Source: u.stream.source,
			Context: u.op.String() + " called while holding " + lock + " (taken by " + u.heldOp.String() + ")",
		}
		e1.Stack, e1.StackTruncated = framesOf(u.allocStack)
		e1.HeldStack, e1.HeldStackTruncated = framesOf(u.heldStack)
		e2 := Edge{
			From: alloc, To: lock, Thread: h.tid, ThreadName: h.stream.threadName(h.tid), PID: h.pid, Source: h.stream.source,
			Context: hook + " running inside " + h.allocOp.String() + " takes " + lock + " at " + site(callerFrame(h.stack)) +
				"; the path from " + u.op.String() + ": " + l.path(),
		}
		e2.Stack, e2.StackTruncated = framesOf(h.stack)
		if h.allocStack != nil {
			e2.HeldStack, e2.HeldStackTruncated = framesOf(h.allocStack)
		}
		f.Edges = []Edge{e1, e2}
		out = append(out, f)
	}
	for i := range out {
		out[i].Seen = where[i].list()
	}
	return out
}

// selfSeenViaHook reports whether a thread was seen re-taking inst inside
// an allocator call it held it around.
func (a *Analyzer) selfSeenViaHook(inst *instance) bool {
	for _, s := range a.selfList {
		if s.inst == inst && s.viaHook {
			return true
		}
	}
	return false
}

// hookClosed reports the locks whose hook-lock info is superseded: a hook
// dependency into them is on a reported cycle, or they close on themselves.
func (a *Analyzer) hookClosed(onCycle map[*edge][]string) map[*instance]bool {
	out := map[*instance]bool{}
	for ed := range onCycle {
		for _, s := range ed.seen {
			if s != nil && s.link != nil {
				out[s.link.take.inst] = true
			}
		}
	}
	for _, l := range a.hookSelfList {
		if _, _, _, ok := hookSelfVerdict(l); ok {
			out[l.take.inst] = true
		}
	}
	return out
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// hookEdgeContext explains a dependency that goes through a hook.
func hookEdgeContext(n *naming, ed *edge, s *sighting) string {
	l := s.link
	return l.under.op.String() + " called while holding " + n.of(ed.from) + " (taken by " + l.under.heldOp.String() +
		") can run the memory hook" + viaText(l.take.via) + " that was seen taking " + n.of(ed.to) + " inside " +
		l.take.allocOp.String() + " at " + site(callerFrame(l.take.stack)) + " (thread " + itoa(uint64(l.take.tid)) + "); " + l.path()
}

func hookName(via string) string {
	if via == "" {
		return "memory hook"
	}
	return via + " hook"
}

// hookCycleStory explains a cycle with a dependency through a hook.
func hookCycleStory(n *naming, cyc []cycleStep) string {
	var b strings.Builder
	b.WriteString("Each lock on the cycle is taken while the previous one is held. ")
	for _, st := range cyc {
		s := st.edge.seen[st.dt]
		if s.link == nil {
			continue
		}
		l := s.link
		b.WriteString("The dependency " + n.of(st.edge.from) + " → " + n.of(st.edge.to) + " goes through a memory hook: a thread holding " +
			n.of(st.edge.from) + " calls " + l.under.op.String() + ", which can run the " + hookName(l.take.via) +
			" that was seen taking " + n.of(st.edge.to) + " inside " + l.take.allocOp.String() + " (" + l.path() + "). ")
	}
	b.WriteString("Threads running these paths at the same time can each hold one lock and wait for the next: a deadlock, even if this run did not hang.")
	return b.String()
}
