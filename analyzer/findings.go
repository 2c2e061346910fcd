package analyzer

// hookLockFindings reports locks taken by hooks inside allocator calls
// that are on no reported cycle (informational: the dangerous half of the
// memory-hook deadlock, or a path that cannot deadlock with the arena).
func (a *Analyzer) hookLockFindings(n *naming, onCycle map[*edge]bool, closed map[*instance]bool) []Finding {
	var out []Finding
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
			id := findingID(KindHookLock, n.key(ed.to), s.hold.String(), s.allocOp.String(), s.via,
				stableSite(callerFrame(s.stack)))
			if i, ok := index[id]; ok {
				out[i].Occurrences += ed.weight
				out[i].Instances = appendSet(out[i].Instances, lock)
				continue
			}
			index[id] = len(out)
			f := Finding{
				ID:          id,
				Kind:        KindHookLock,
				Severity:    SeverityInfo,
				Title:       "memory hook takes " + lock + " inside " + s.allocOp.String(),
				Locks:       []string{lock},
				Edges:       []Edge{edgeOut(n, ed, s)},
				Threads:     []uint32{s.tid},
				Occurrences: ed.weight,
				Instances:   [][]string{{lock}},
			}
			hook := "A hook"
			if s.via != "" {
				hook += " in " + s.via
			}
			f.Detail = hook + " running inside " + s.allocOp.String() + " takes " + lock + ". " + s.holdReason + ". "
			if s.hold == holdNotHeld {
				f.Detail += "This path alone cannot deadlock against the allocator. "
			} else {
				f.Detail += "No thread was seen calling the allocator while holding " + lock +
					"; any that does can deadlock with this hook. "
			}
			f.Detail += "Any allocator call that can run this hook orders the locks its thread holds before " + lock +
				"; none of those orders closes a cycle here."
			out = append(out, f)
		}
	}
	for i := range out {
		if len(out[i].Instances) < 2 {
			out[i].Instances = nil
		}
	}
	return out
}

// reentryFindings reports allocator calls made by hooks running inside an
// allocator call.
func (a *Analyzer) reentryFindings() []Finding {
	var out []Finding
	index := map[string]int{}
	for _, r := range a.reentryList {
		caller := allocCallerFrame(r.stack)
		id := findingID(KindAllocatorReentry, r.outer.String(), r.inner.String(), r.via, stableSite(caller))
		if i, ok := index[id]; ok {
			out[i].Occurrences += r.count
			continue
		}
		index[id] = len(out)
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
	return out
}

// nestingFindings reports broken forbid rules.
func (a *Analyzer) nestingFindings() []Finding {
	out := make([]Finding, 0, len(a.nestList))
	for _, s := range a.nestList {
		e := Edge{
			From:       s.rule.Outer,
			To:         s.rule.Inner,
			Thread:     s.tid,
			ThreadName: s.stream.threadName(s.tid),
			PID:        s.pid,
			Source:     s.stream.source,
			Context:    s.rule.Inner + " entered while " + s.rule.Outer + " is active on this thread",
		}
		e.Stack, e.StackTruncated = framesOf(s.stack)
		if s.outerStack != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(s.outerStack)
		}
		detail := "The rule " + s.rule.String() + " says " + s.rule.Inner + " must never run while " + s.rule.Outer +
			" is on the same thread's stack."
		if s.inAlloc {
			detail += " It ran inside an allocator call."
		}
		out = append(out, Finding{
			ID:          findingID(KindForbiddenNesting, s.rule.Outer, s.rule.Inner),
			Kind:        KindForbiddenNesting,
			Severity:    SeverityError,
			Title:       "forbidden nesting: " + s.rule.Inner + " ran inside " + s.rule.Outer,
			Detail:      detail,
			Locks:       []string{},
			Edges:       []Edge{e},
			Threads:     []uint32{s.tid},
			Occurrences: s.count,
		})
	}
	return out
}
