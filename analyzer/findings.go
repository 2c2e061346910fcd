package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// hookLockFindings reports locks taken by hooks inside allocator calls
// that are on no reported cycle (informational: the dangerous half of the
// memory-hook deadlock, or a path that cannot deadlock with the arena).
// A finding is the lock class and the arena verdict: which allocator call
// or hooked call a hook was first seen in depends on timing, so those are
// said in the title (every call it was seen in) and the detail (the first
// sighting), not in the ID.
func (a *Analyzer) hookLockFindings(n *naming, onCycle map[*edge]bool, closed map[*instance]bool) []Finding {
	var out []Finding
	var calls []uint64 // by finding: the allocator calls (opBit) it was seen in
	var where []seenCounts
	index := map[string]int{}
	for _, ed := range a.edgeList {
		if ed.from.typ != typeArena || onCycle[ed] || closed[ed.to] {
			continue
		}
		for dt := depType(0); dt < depTypes; dt++ {
			s := ed.seen[dt]
			if s == nil {
				continue
			}
			lock := n.of(ed.to)
			id := findingID(KindHookLock, n.key(ed.to), s.hold.String())
			examples := ed.callSightings(s.hold)
			if len(examples) == 0 {
				examples = []*sighting{s}
			}
			var seenIn uint64
			for _, c := range examples {
				seenIn |= opBit(c.allocOp)
			}
			if i, ok := index[id]; ok {
				out[i].Occurrences += ed.weight
				out[i].Instances = appendSet(out[i].Instances, lock)
				calls[i] |= seenIn
				where[i].merge(ed.seenIn())
				continue
			}
			index[id] = len(out)
			calls = append(calls, seenIn)
			where = append(where, seenCounts{})
			where[len(where)-1].merge(ed.seenIn())
			f := Finding{
				ID:          id,
				Kind:        KindHookLock,
				Severity:    SeverityInfo,
				Locks:       []string{lock},
				Occurrences: ed.weight,
				Instances:   [][]string{{lock}},
			}
			tids := map[uint32]bool{}
			for _, c := range examples {
				f.Edges = append(f.Edges, edgeOut(n, ed, c))
				tids[c.tid] = true
			}
			f.Threads = sortedTIDs(tids)
			hook := "a hook"
			if s.via != "" {
				hook += " in " + s.via
			}
			f.Detail = "First seen: " + hook + " running inside " + s.allocOp.String() + " takes " + lock + " at " + s.hook +
				" (" + threadLabel(s.stream, s.tid) + sourceText(s.stream) + "). " + s.holdReason + ". "
			if s.hold == holdNotHeld {
				f.Detail += "This path alone cannot deadlock against the allocator. "
			} else {
				f.Detail += "No thread was seen calling the allocator while holding " + lock +
					"; any that does can deadlock with this hook. "
			}
			f.Detail += "Any allocator call that can run this hook orders the locks its thread holds before " + lock +
				"; none of those orders closes a cycle here."
			if len(examples) > 1 {
				f.Detail += " One edge per allocator call it was seen in, each that call's first sighting."
			}
			out = append(out, f)
		}
	}
	for i := range out {
		out[i].Title = "memory hook takes " + out[i].Locks[0] + " inside " + opList(calls[i])
		out[i].Seen = where[i].list()
		if len(out[i].Instances) < 2 {
			out[i].Instances = nil
		}
	}
	return out
}

// opBit is op's bit in a set of calls (events.Op values are below 64).
func opBit(op events.Op) uint64 {
	if op == events.OpNone || int(op) >= opSlots {
		return 0
	}
	return 1 << op
}

// opList names a set of calls, in the order of their op numbers:
// "malloc", "malloc and free", "malloc, realloc and free".
func opList(set uint64) string {
	var names []string
	for op := events.Op(1); int(op) < opSlots; op++ {
		if set&opBit(op) != 0 {
			names = append(names, op.String())
		}
	}
	switch len(names) {
	case 0:
		return "an allocator call"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// sourceText is ", in SOURCE" for a stream read from a named trace.
func sourceText(s *stream) string {
	if s.source == "" {
		return ""
	}
	return ", in " + s.source
}

// reentryFindings reports allocator calls made by hooks running inside an
// allocator call.
func (a *Analyzer) reentryFindings() []Finding {
	var out []Finding
	var where []seenCounts // by finding
	index := map[string]int{}
	for _, r := range a.reentryList {
		caller := allocCallerFrame(r.stack)
		// The hooked call (via) may be learnt from an earlier event of the
		// allocator call, which is timing: not part of what it is.
		id := findingID(KindAllocatorReentry, r.outer.String(), r.inner.String(), stableSite(caller))
		if i, ok := index[id]; ok {
			out[i].Occurrences += r.count
			where[i].merge(r.where)
			continue
		}
		index[id] = len(out)
		where = append(where, seenCounts{})
		where[len(where)-1].merge(r.where)
		via := ""
		if r.via != "" {
			via = " (in " + r.via + ")"
		}
		alloc := r.stream.allocatorLock
		e := Edge{
			From:       alloc,
			To:         alloc,
			Thread:     r.tid,
			ThreadName: r.stream.threadName(r.tid),
			PID:        r.pid,
			Source:     r.stream.source,
			Context:    r.inner.String() + " called by " + site(caller) + ", a hook" + via + " running inside " + r.outer.String(),
		}
		e.Stack, e.StackTruncated = framesOf(r.stack)
		if r.outerStack != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(r.outerStack)
		}
		locks := []string{}
		if r.stream.arenaEnabled {
			locks = []string{alloc}
		}
		out = append(out, Finding{
			ID:       id,
			Kind:     KindAllocatorReentry,
			Severity: SeverityError,
			Title:    "allocator re-entered: " + r.inner.String() + " called by a hook" + via + " inside " + r.outer.String(),
			Detail: "A hook running inside " + r.outer.String() + " calls " + r.inner.String() +
				". The allocator is not re-entrant: it may hold its arena lock (glibc's is not recursive, so the thread deadlocks) or be in the middle of updating its lists (heap corruption).",
			Locks:       locks,
			Edges:       []Edge{e},
			Threads:     []uint32{r.tid},
			Occurrences: r.count,
		})
	}
	for i := range out {
		out[i].Seen = where[i].list()
		out[i].Threads = where[i].threads()
	}
	return out
}

// nestingFindings reports broken forbid rules.
func (a *Analyzer) nestingFindings() []Finding {
	out := make([]Finding, 0, len(a.nestList))
	for _, s := range a.nestList {
		where, count := s.where, s.count
		if s.rule.Unless != "" {
			where, count = a.withoutUnless(s.where, s.rule.Unless)
			if count == 0 {
				continue
			}
		}
		outer, inner := s.rule.OuterText(), s.rule.InnerText()
		e := Edge{
			From:       outer,
			To:         inner,
			Thread:     s.tid,
			ThreadName: s.stream.threadName(s.tid),
			PID:        s.pid,
			Source:     s.stream.source,
			Context:    inner + " entered while " + outer + " is active on this thread",
		}
		e.Stack, e.StackTruncated = framesOf(s.stack)
		if s.outerStack != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(s.outerStack)
		}
		detail := "The rule " + s.rule.String() + " says " + inner + " must never run while " + outer +
			" is on the same thread's stack."
		if s.rule.Why != "" {
			detail += " Why: " + strings.TrimSuffix(s.rule.Why, ".") + "."
		}
		if s.inAlloc {
			detail += " It ran inside an allocator call."
		}
		if s.rule.Unless != "" {
			detail += " It stands in for the rules on " + s.rule.Unless + ", which this program does not have (an optimised build inlines it)."
		}
		out = append(out, Finding{
			ID:          findingID(KindForbiddenNesting, outer, inner),
			Kind:        KindForbiddenNesting,
			Severity:    SeverityError,
			Title:       "forbidden nesting: " + inner + " ran inside " + outer,
			Detail:      detail,
			Locks:       []string{},
			Edges:       []Edge{e},
			Threads:     where.threads(),
			Occurrences: count,
			Seen:        where.list(),
		})
	}
	return out
}

// withoutUnless drops from where the processes that entered the function
// unless names: there the rules on it apply, and this one stands aside.
func (a *Analyzer) withoutUnless(where seenCounts, unless string) (seenCounts, uint64) {
	kept, n := seenCounts{}, uint64(0)
	for k, c := range where {
		if a.procEntered(k.s, k.pid, unless) {
			continue
		}
		kept[k] = c
		n += c
	}
	return kept, n
}

// procEntered reports whether process pid of stream s entered a probed
// function named fn.
func (a *Analyzer) procEntered(s *stream, pid uint32, fn string) bool {
	for k := range s.entered {
		if k.pid == pid && a.matches(fn, s.probeName(k.probe)) {
			return true
		}
	}
	return false
}
