package analyzer

import (
	"strconv"

	"github.com/hooktrace/hooktrace/events"
)

// The analyzer checks its own evidence: records that cannot all be true
// mean the tracer lost or misattributed an event, and a finding drawn from
// them would be impossible. They are reported as trace inconsistencies
// (warnings) and counted in Stats, so a tracer regression shows in every
// report.

// TraceChecks counts the records that contradict each other.
type TraceChecks struct {
	// A thread took a non-recursive lock it held, which waits forever,
	// then recorded more events.
	ImpossibleSelfDeadlocks uint64 `json:"impossible_self_deadlocks"`
	// Unlocks of a lock no thread was seen holding (in an attach, a
	// thread's unlocks of locks it was never seen taking are not counted:
	// it may have taken them before).
	UnheldUnlocks uint64 `json:"unheld_unlocks"`
	// Unlocks of a lock another thread holds.
	ForeignUnlocks uint64 `json:"foreign_unlocks"`
}

// Total is the number of inconsistencies.
func (c TraceChecks) Total() uint64 {
	return c.ImpossibleSelfDeadlocks + c.UnheldUnlocks + c.ForeignUnlocks
}

type inconsistencyKind uint8

const (
	incSelf    inconsistencyKind = iota // a self-deadlock its thread outlived
	incUnheld                           // an unlock of a lock nobody held
	incForeign                          // an unlock of a lock another thread held
)

// eventNote describes one event for an inconsistency's context.
type eventNote struct {
	op    events.Op
	addr  uint64
	stack *events.Stack
}

func (n eventNote) String() string {
	if n.op == events.OpNone {
		return "none"
	}
	s := n.op.String()
	if n.addr != 0 {
		s += "(0x" + strconv.FormatUint(n.addr, 16) + ")"
	}
	if f := callerFrame(n.stack); f != nil {
		s += " at " + site(f)
	}
	return s
}

type incKey struct {
	kind inconsistencyKind
	inst int32
	site string
}

// inconsistency is the first sighting of one kind on one lock and site.
type inconsistency struct {
	kind       inconsistencyKind
	inst       *instance
	stream     *stream
	pid, tid   uint32
	holder     uint32 // incForeign: the thread that held it
	before     eventNote
	event      eventNote
	after      eventNote // incSelf: the event that shows the thread went on
	heldStack  *events.Stack
	count      uint64
	self       *selfSighting
	holderName string
}

// prevEvent is a thread's latest event, kept cheaply (one per event).
type prevEvent struct {
	op    events.Op
	addr  uint64
	stack uint32
}

// note remembers a thread's latest event, for the context of the next
// inconsistency.
func (t *thread) note(e *events.Event) {
	t.prev = prevEvent{op: e.Op, addr: e.Addr, stack: e.Stack}
}

func (t *thread) prevNote(p prevEvent) eventNote {
	return eventNote{op: p.op, addr: p.addr, stack: t.stream.stack(p.stack)}
}

// checkOutlived is called for each event of a thread that had taken a
// non-recursive lock it already held: it did not wait forever.
func (a *Analyzer) checkOutlived(t *thread, e *events.Event) {
	s := t.outlived
	t.outlived = nil
	s.contradicted++
	a.checks.ImpossibleSelfDeadlocks++
	k := incKey{incSelf, s.inst.id, itoa(uint64(s.kind)) + boolWord(s.viaHook) + s.allocOp.String()}
	if r := a.incons[k]; r != nil {
		r.count++
		return
	}
	r := &inconsistency{
		kind: incSelf, inst: s.inst, stream: t.stream, pid: t.pid, tid: t.tid,
		before: t.prevNote(t.selfBefore), event: eventNote{op: s.op, addr: s.inst.addr, stack: s.stack},
		after: eventNote{op: e.Op, addr: e.Addr, stack: t.stream.stack(e.Stack)}, heldStack: s.heldStack,
		count: 1, self: s,
	}
	a.addInconsistency(k, r)
}

func (a *Analyzer) addInconsistency(k incKey, r *inconsistency) {
	if a.incons == nil {
		a.incons = map[incKey]*inconsistency{}
	}
	a.incons[k] = r
	a.inconList = append(a.inconList, r)
}

// unheldUnlock handles an unlock of addr by a thread that does not hold
// it: another thread's lock is released from that thread; a lock nobody
// holds is counted. In an attach, a thread's unlock of a lock it was never
// seen taking is neither: it took it before the attach.
func (a *Analyzer) unheldUnlock(t *thread, e *events.Event, addr uint64) {
	inst := t.proc.live[addr]
	if t.stream.attached() && !t.took[addr] {
		// This thread may have taken it before the attach (and another
		// thread's lock call, traced at its entry, may be waiting for it).
		return
	}
	for _, o := range t.stream.threads {
		if o == t || o.pid != t.pid {
			continue
		}
		if i := o.findHeld(addr); i >= 0 {
			h := o.held[i]
			o.release(addr, true)
			a.checks.ForeignUnlocks++
			a.recordUnlock(t, e, incForeign, h.inst, o.tid, t.stream.stack(h.stack))
			return
		}
	}
	a.checks.UnheldUnlocks++
	if inst == nil {
		inst = t.proc.lock(a, addr, lockTypeOf(e.Op))
	}
	a.recordUnlock(t, e, incUnheld, inst, 0, nil)
}

func (a *Analyzer) recordUnlock(t *thread, e *events.Event, kind inconsistencyKind, inst *instance, holder uint32, heldStack *events.Stack) {
	st := t.stream.stack(e.Stack)
	k := incKey{kind, inst.id, stableSite(callerFrame(st))}
	if r := a.incons[k]; r != nil {
		r.count++
		return
	}
	a.addInconsistency(k, &inconsistency{
		kind: kind, inst: inst, stream: t.stream, pid: t.pid, tid: t.tid, holder: holder,
		before: t.prevNote(t.prev), event: eventNote{op: e.Op, addr: lockAddrOf(e), stack: st}, heldStack: heldStack, count: 1,
		holderName: t.stream.threadName(holder),
	})
}

func lockAddrOf(e *events.Event) uint64 {
	if e.Op == events.OpCondWait || e.Op == events.OpCondTimedwait {
		return e.Addr2
	}
	return e.Addr
}

// attached reports whether the trace began with the process already
// running (attach), rather than at its first instruction (run).
// lossy reports whether the trace lost events: the ring had no room.
func (s *stream) lossy() bool {
	return s.lost > 0 || (s.footer != nil && s.footer.Lost > 0)
}

func (s *stream) attached() bool {
	return s.header != nil && len(s.header.Command) == 0
}

func threadLabel(s *stream, tid uint32) string {
	l := "thread " + itoa(uint64(tid))
	if name := s.threadName(tid); name != "" {
		l += " (" + name + ")"
	}
	return l
}

// inconsistencyFindings reports the trace inconsistencies, one per kind,
// lock class and site.
func (a *Analyzer) inconsistencyFindings(n *naming) []Finding {
	var out []Finding
	index := map[string]int{}
	for _, r := range a.inconList {
		if r.kind == incSelf && !r.self.disproved() {
			// Some sighting did stop its thread: the error stands.
			continue
		}
		lock := n.of(r.inst)
		// An unlock's site is what it is (each site has its own record);
		// a self-deadlock's record is its lock's first sighting, at
		// whichever site came first.
		site := stableSite(callerFrame(r.event.stack))
		if r.kind == incSelf {
			site = ""
		}
		id := findingID(KindTraceInconsistency, itoa(uint64(r.kind)), n.key(r.inst), site)
		if i, ok := index[id]; ok {
			out[i].Occurrences += r.count
			continue
		}
		index[id] = len(out)
		who := threadLabel(r.stream, r.tid)
		f := Finding{
			ID:          id,
			Kind:        KindTraceInconsistency,
			Severity:    SeverityWarning,
			Locks:       []string{lock},
			Threads:     []uint32{r.tid},
			Occurrences: r.count,
		}
		around := " Events around it on " + who + ": before, " + r.before.String() + "; this, " + r.event.String()
		e := Edge{From: lock, To: lock, Thread: r.tid, ThreadName: r.stream.threadName(r.tid), PID: r.pid, Source: r.stream.source}
		e.Stack, e.StackTruncated = framesOf(r.event.stack)
		if r.heldStack != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(r.heldStack)
		}
		switch r.kind {
		case incSelf:
			f.Title = "trace inconsistency: " + who + " took " + lock + " while holding it, and went on"
			f.Detail = lock + " is a non-recursive " + r.inst.typ.word() + ": taking it again waits forever, yet " + who +
				" recorded more events, so this did not happen: an event was lost or misattributed (an unlock, a failed trylock, or another lock at the same address). Not reported as a self-deadlock." +
				around + "; after, " + r.after.String() + "."
			e.Context = r.event.op.String() + "(" + lock + ") while holding it, then " + r.after.String()
		case incUnheld:
			f.Title = "trace inconsistency: " + who + " unlocked " + lock + ", which no thread held"
			f.Detail = "No lock call of " + lock + " by this thread is in the trace before this unlock: an event was lost, or a call was counted as an unlock that is not one." +
				around + "."
			e.Context = r.event.op.String() + "(" + lock + ") without holding it"
		case incForeign:
			holder := "thread " + itoa(uint64(r.holder))
			if r.holderName != "" {
				holder += " (" + r.holderName + ")"
			}
			f.Threads = sortedTIDs(map[uint32]bool{r.tid: true, r.holder: true})
			f.Title = "trace inconsistency: " + who + " unlocked " + lock + ", held by " + holder
			f.Detail = lock + " was taken by " + holder + " and released by " + who +
				": undefined for pthread mutexes and spinlocks, or an event was attributed to the wrong thread. The lock is taken as released by its holder." + around + "."
			e.Context = r.event.op.String() + "(" + lock + ") by " + who + " while " + holder + " holds it"
		}
		f.Edges = []Edge{e}
		out = append(out, f)
	}
	return out
}
