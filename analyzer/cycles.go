package analyzer

import (
	"sort"
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

type cycleResult struct {
	findings []Finding
	// Allocator → lock dependencies on a reported cycle: the hook-lock
	// finding for them would say less than the cycle does.
	arenaEdges map[*edge]bool
	// The IDs of the cycle findings each dependency is on.
	edgeFindings map[*edge][]string
}

type cycleGroup struct {
	classKeys []string // canonical rotation
	rep       []cycleStep
	sev       Severity
	count     uint64
	sets      [][]string
	cycles    [][]cycleStep
	comps     map[int32]bool // the strongly connected components of the cycles
	omitted   uint64         // dependencies of those components on no reported cycle
}

// cycleFindings turns instance cycles into findings, one per class cycle.
func (a *Analyzer) cycleFindings(n *naming) cycleResult {
	res := cycleResult{arenaEdges: map[*edge]bool{}}
	groups := map[string]*cycleGroup{}
	var order []*cycleGroup
	search := a.findCycles(n)
	for ci, cyc := range search.cycles {
		keys := make([]string, len(cyc))
		for i, st := range cyc {
			keys[i] = n.key(st.edge.from)
			if st.edge.from.typ == typeArena {
				res.arenaEdges[st.edge] = true
			}
		}
		canon := canonicalRotation(keys)
		gk := strings.Join(canon, "\x00")
		sev := guardedSeverity(cyc)
		g := groups[gk]
		if g == nil {
			g = &cycleGroup{classKeys: canon, rep: cyc, sev: sev, comps: map[int32]bool{}}
			groups[gk] = g
			order = append(order, g)
		} else if sev.Rank() > g.sev.Rank() {
			g.rep, g.sev = cyc, sev
		}
		g.count += cycleWeight(cyc)
		g.cycles = append(g.cycles, cyc)
		if c := search.comp[ci]; !g.comps[c] {
			g.comps[c] = true
			g.omitted += search.omitted[c]
		}
		if len(g.sets) < maxInstanceSets {
			set := make([]string, len(cyc))
			for i, st := range cyc {
				set[i] = n.of(st.edge.from)
			}
			g.sets = append(g.sets, set)
		}
	}
	res.edgeFindings = map[*edge][]string{}
	for _, g := range order {
		f := a.cycleFinding(n, g)
		res.findings = append(res.findings, f)
		for _, cyc := range g.cycles {
			for _, st := range cyc {
				ids := res.edgeFindings[st.edge]
				if len(ids) == 0 || ids[len(ids)-1] != f.ID {
					res.edgeFindings[st.edge] = append(ids, f.ID)
				}
			}
		}
	}
	return res
}

// cycleWeight is how many instance cycles cyc stands for: as many as the
// most folded of its dependencies (see fold.go).
func cycleWeight(cyc []cycleStep) uint64 {
	w := uint64(1)
	for _, st := range cyc {
		w = max(w, st.edge.weight)
	}
	return w
}

// canonicalRotation rotates a cycle of class keys to its least rotation,
// so the same class cycle entered anywhere gets one ID.
func canonicalRotation(keys []string) []string {
	best := keys
	for i := 1; i < len(keys); i++ {
		rot := append(append([]string(nil), keys[i:]...), keys[:i]...)
		if lessStrings(rot, best) {
			best = rot
		}
	}
	return best
}

func lessStrings(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// cycleSeverity: an error, unless the cycle needs the allocator to hold
// its arena lock where the stack could not tell, or a wait on it was only
// ever timed (it ends in a timeout).
func cycleSeverity(cyc []cycleStep) Severity {
	for _, st := range cyc {
		s := st.edge.seen[st.dt]
		if s.timed || (st.edge.from.typ == typeArena && s.hold == holdMaybe) {
			return SeverityWarning
		}
	}
	return SeverityError
}

func (a *Analyzer) cycleFinding(n *naming, g *cycleGroup) Finding {
	cyc := g.rep
	labels := make([]string, len(cyc))
	hasArena, hasRead, hasTimed, hasHook := false, false, false, false
	for i, st := range cyc {
		labels[i] = n.of(st.edge.from)
		s := st.edge.seen[st.dt]
		hasHook = hasHook || s.link != nil
		hasArena = hasArena || st.edge.from.typ == typeArena
		hasRead = hasRead || s.read || s.heldRead
		hasTimed = hasTimed || s.timed
	}
	path := strings.Join(append(append([]string(nil), labels...), labels[0]), " → ")
	f := Finding{
		ID:          findingID(KindLockOrderCycle, g.classKeys...),
		Kind:        KindLockOrderCycle,
		Severity:    g.sev,
		Locks:       labels,
		Occurrences: g.count,
	}
	switch {
	case hasArena:
		f.Title = "possible deadlock through the allocator: " + path
	case hasHook:
		f.Title = "possible deadlock through a memory hook: " + path
	case len(cyc) == 2:
		f.Title = "lock order inversion: " + path
	default:
		f.Title = "lock order cycle of " + itoa(uint64(len(cyc))) + " locks: " + path
	}
	if g.count > 1 {
		f.Instances = g.sets
	}
	tids := map[uint32]bool{}
	for _, st := range cyc {
		s := st.edge.seen[st.dt]
		f.Edges = append(f.Edges, edgeOut(n, st.edge, s))
		tids[s.tid] = true
	}
	f.Threads = sortedTIDs(tids)
	f.Scenario = scenario(n, cyc)

	var d []string
	if hasArena {
		d = append(d, arenaCycleStory(n, cyc))
	} else if hasHook {
		d = append(d, hookCycleStory(n, cyc))
	} else {
		d = append(d, "Each lock on the cycle was taken while the previous one was held. Threads running these paths at the same time can each hold one lock and wait for the next: a deadlock, even if this run did not hang.")
	}
	if len(tids) == 1 {
		d = append(d, "All of these dependencies were seen on one thread; the orders still conflict, and two threads running these paths can deadlock.")
	}
	if hasRead {
		d = append(d, "Read/write rule: a read lock held by one thread blocks only writers and non-recursive readers (glibc's default rwlocks let readers in beside readers), so a cycle is reported only when at every lock on it the waiting call would block against the holder.")
	}
	if hasTimed {
		d = append(d, "Some waits on the cycle are timed: they end in a timeout rather than a hang.")
	}
	if g.count > 1 {
		d = append(d, "Seen on "+itoa(g.count)+" sets of lock instances of the same classes.")
	}
	if g.omitted > 0 {
		f.Unreported = g.omitted
		d = append(d, "These locks are part of a strongly connected group of dependencies too large to search whole: "+
			itoa(g.omitted)+" more dependencies in it lie on cycles not reported (after "+
			itoa(maxComponentCycles)+" cycles per group the search only looks for pairs of lock classes no reported cycle joins). Fixing the reported cycles splits the group; analyze again to see the rest.")
	}
	f.Detail = strings.Join(d, " ")
	f.Seen = seenOfCycles(g.cycles)
	describeGate(n, &f, cyc)
	return f
}

// arenaCycleStory explains a cycle through the allocator pseudo-lock in
// the terms of the Open MPI memory-hook bug.
func arenaCycleStory(n *naming, cyc []cycleStep) string {
	var b strings.Builder
	for _, st := range cyc {
		s := st.edge.seen[st.dt]
		switch {
		case st.edge.to.typ == typeArena:
			b.WriteString("A thread holding " + n.of(st.edge.from) + " calls " + s.op.String() +
				", which may need glibc's arena lock. ")
		case st.edge.from.typ == typeArena:
			b.WriteString("A thread inside " + s.allocOp.String() + " runs a memory hook" + viaText(s.via) +
				" that takes " + n.of(st.edge.to) + ": " + s.holdReason + ". ")
		}
	}
	b.WriteString("Together they can wait for each other forever; the run need not have hung, the paths were seen separately. Fix: do not call the allocator with the lock held, or do not take it in the hook.")
	return b.String()
}

func viaText(via string) string {
	if via == "" {
		return ""
	}
	return " in " + via
}

// scenario builds lockdep's "possible unsafe locking scenario": thread i
// takes lock i, then each thread wants the next lock.
func scenario(n *naming, cyc []cycleStep) []Step {
	steps := make([]Step, 0, 2*len(cyc))
	for i, st := range cyc {
		steps = append(steps, Step{Thread: threadLetter(i), Action: holdAction(n, st)})
	}
	for i, st := range cyc {
		steps = append(steps, Step{Thread: threadLetter(i), Action: wantAction(n, st)})
	}
	return steps
}

func threadLetter(i int) string {
	if i < 26 {
		return string(rune('A' + i))
	}
	return "T" + itoa(uint64(i))
}

func holdAction(n *naming, st cycleStep) string {
	s := st.edge.seen[st.dt]
	from := n.of(st.edge.from)
	if st.edge.from.typ == typeArena {
		return "in " + s.allocOp.String() + "(): lock(" + from + ")"
	}
	return lockVerb(s.heldOp, s.heldRead) + "(" + from + ")"
}

func wantAction(n *naming, st cycleStep) string {
	s := st.edge.seen[st.dt]
	to := n.of(st.edge.to)
	switch {
	case s.link != nil:
		return s.allocOp.String() + "() runs the " + hookName(s.link.take.via) + ": " + lockVerb(s.op, s.read) + "(" + to + ")"
	case st.edge.to.typ == typeArena:
		return s.op.String() + "(): lock(" + to + ")"
	case st.edge.from.typ == typeArena:
		hook := "hook"
		if s.via != "" {
			hook = s.via + " hook"
		}
		return hook + ": " + lockVerb(s.op, s.read) + "(" + to + ")"
	case s.op == events.OpCondWait || s.op == events.OpCondTimedwait:
		return s.op.String() + " returns: lock(" + to + ")"
	}
	return lockVerb(s.op, s.read) + "(" + to + ")"
}

func lockVerb(op events.Op, read bool) string {
	switch {
	case read:
		return "read_lock"
	case lockTypeOf(op) == typeRwlock && op.IsLockAcquire():
		return "write_lock"
	case op.IsTry():
		return "trylock"
	case op.IsTimed():
		return "timedlock"
	}
	return "lock"
}

// edgeOut renders one dependency.
func edgeOut(n *naming, ed *edge, s *sighting) Edge {
	e := Edge{
		From:       n.of(ed.from),
		To:         n.of(ed.to),
		Thread:     s.tid,
		ThreadName: s.stream.threadName(s.tid),
		PID:        s.pid,
		Source:     s.stream.source,
		Context:    edgeContext(n, ed, s),
	}
	e.Stack, e.StackTruncated = framesOf(s.stack)
	if s.heldStack != nil {
		e.HeldStack, e.HeldStackTruncated = framesOf(s.heldStack)
	}
	if ed.from.typ == typeArena {
		e.Arena = s.hold.String()
	}
	return e
}

func edgeContext(n *naming, ed *edge, s *sighting) string {
	from, to := n.of(ed.from), n.of(ed.to)
	switch {
	case s.link != nil:
		return hookEdgeContext(n, ed, s)
	case ed.to.typ == typeArena:
		return s.op.String() + " called while holding " + from + " (taken by " + s.heldOp.String() +
			"); glibc takes its arena lock inside " + s.op.String()
	case ed.from.typ == typeArena:
		c := "a hook"
		if s.via != "" {
			c += " in " + s.via
		}
		c += " running inside " + s.allocOp.String() + " takes " + to
		if s.hook != "" {
			c += " at " + s.hook
		}
		if s.holdReason != "" {
			c += "; " + s.holdReason
		}
		return c
	case s.op == events.OpCondWait || s.op == events.OpCondTimedwait:
		return s.op.String() + " returned and took " + to + " back while holding " + from +
			" (taken by " + s.heldOp.String() + ")"
	}
	return s.op.String() + "(" + to + ") while holding " + from + " (taken by " + s.heldOp.String() + ")"
}

func sortedTIDs(set map[uint32]bool) []uint32 {
	out := make([]uint32, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
