package analyzer

import (
	"strconv"

	"github.com/hooktrace/hooktrace/events"
)

// The analyzer checks its own evidence: records that cannot all be true
// mean the tracer lost or misattributed an event, and a finding drawn from
// them would be impossible. They are reported as trace inconsistencies
// (warnings) and counted in Stats, so a tracer regression shows in every
// report. Lock misuse (misuse.go) in a trace that lost events or was cut
// short may be a lost event too: it is counted and reported here then.

// TraceChecks counts the records that contradict each other.
type TraceChecks struct {
	// A thread took a non-recursive lock it held, which waits forever,
	// then recorded more events.
	ImpossibleSelfDeadlocks uint64 `json:"impossible_self_deadlocks"`
	// Lock misuse in traces that lost events or were cut short: a lost
	// lock or unlock makes the same records.
	LockMisuse
}

// Total is the number of inconsistencies.
func (c TraceChecks) Total() uint64 {
	return c.ImpossibleSelfDeadlocks + c.LockMisuse.Total()
}

type inconsistencyKind uint8

const (
	incSelf    inconsistencyKind = iota // a self-deadlock its thread outlived
	incUnlock                           // an unlock of a lock the thread does not hold (misuse.go)
	incDestroy                          // a destroy of a held lock (misuse.go)
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

// inconsistency is the first sighting of one kind on one lock (and, for
// misuse, one site).
type inconsistency struct {
	key      incKey
	kind     inconsistencyKind
	inst     *instance
	stream   *stream
	pid, tid uint32
	before   eventNote
	event    eventNote
	after    eventNote // incSelf: the event that shows the thread went on
	count    uint64
	where    seenCounts // count by process and thread
	self     *selfSighting
	// Misuse: the first holder seen (another thread, or for a destroy the
	// thread itself), and how many of the calls found the lock held by
	// another thread.
	holder  holder
	foreign uint64
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
		r.where.add(t.stream, t.pid, t.tid, 1)
		return
	}
	r := &inconsistency{
		kind: incSelf, inst: s.inst, stream: t.stream, pid: t.pid, tid: t.tid,
		before: t.prevNote(t.selfBefore), event: eventNote{op: s.op, addr: s.inst.addr, stack: s.stack},
		after: eventNote{op: e.Op, addr: e.Addr, stack: t.stream.stack(e.Stack)},
		count: 1, self: s, holder: holder{tid: t.tid, stack: s.heldStack},
	}
	a.addInconsistency(k, r)
}

func (a *Analyzer) addInconsistency(k incKey, r *inconsistency) {
	if a.incons == nil {
		a.incons = map[incKey]*inconsistency{}
	}
	r.key = k
	if r.where == nil {
		r.where = seenCounts{}
		r.where.add(r.stream, r.pid, r.tid, r.count)
	}
	a.incons[k] = r
	a.inconList = append(a.inconList, r)
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

// selfInconsistencyFindings reports the self-deadlocks their threads
// outlived, one per lock class.
func (a *Analyzer) selfInconsistencyFindings(n *naming) []Finding {
	var out []Finding
	var where []seenCounts // by finding
	index := map[string]int{}
	for _, r := range a.inconList {
		if r.kind != incSelf || !r.self.disproved() {
			// Misuse, or some sighting did stop its thread: the error stands.
			continue
		}
		lock := n.of(r.inst)
		// The record is the lock's first sighting, at whichever site came
		// first: no site in the ID.
		id := findingID(KindTraceInconsistency, itoa(uint64(r.kind)), n.key(r.inst), "")
		if i, ok := index[id]; ok {
			out[i].Occurrences += r.count
			where[i].merge(r.where)
			continue
		}
		index[id] = len(out)
		where = append(where, seenCounts{})
		where[len(where)-1].merge(r.where)
		who := threadLabel(r.stream, r.tid)
		e := Edge{From: lock, To: lock, Thread: r.tid, ThreadName: r.stream.threadName(r.tid), PID: r.pid, Source: r.stream.source,
			Context: r.event.op.String() + "(" + lock + ") while holding it, then " + r.after.String()}
		e.Stack, e.StackTruncated = framesOf(r.event.stack)
		if r.holder.stack != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(r.holder.stack)
		}
		out = append(out, Finding{
			ID:       id,
			Kind:     KindTraceInconsistency,
			Severity: SeverityWarning,
			Title:    "trace inconsistency: " + who + " took " + lock + " while holding it, and went on",
			Detail: lock + " is a non-recursive " + r.inst.typ.word() + ": taking it again waits forever, yet " + who +
				" recorded more events, so this did not happen: an event was lost or misattributed (an unlock, a failed trylock, or another lock at the same address). Not reported as a self-deadlock." +
				r.around() + "; after, " + r.after.String() + ".",
			Locks:       []string{lock},
			Edges:       []Edge{e},
			Threads:     []uint32{r.tid},
			Occurrences: r.count,
		})
	}
	for i := range out {
		out[i].Seen = where[i].list()
	}
	return out
}

// around names the events of the record's thread before and at it.
func (r *inconsistency) around() string {
	return " Events around it on " + threadLabel(r.stream, r.tid) + ": before, " + r.before.String() + "; this, " + r.event.String()
}
