package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// selfKind is what happens when a thread takes a lock it already holds.
type selfKind uint8

const (
	selfDeadlock      selfKind = iota // a non-recursive lock: waits for itself forever
	selfRecursiveHook                 // a recursive mutex re-entered by a hook inside the allocator
	selfReadReentry                   // a read lock whose readers queue behind writers, taken twice
	selfTimed                         // a timed lock: waits for itself until the deadline
	selfErrorCheck                    // the call fails with EDEADLK
)

type selfKey struct {
	inst    int32
	kind    selfKind
	viaHook bool
	allocOp events.Op // the allocator call the hook ran in, if viaHook
}

type selfSighting struct {
	kind       selfKind
	inst       *instance
	stream     *stream
	pid, tid   uint32
	heldOp     events.Op
	heldStack  *events.Stack
	op         events.Op
	stack      *events.Stack
	viaHook    bool // taken again by a hook inside an allocator call
	allocOp    events.Op
	allocStack *events.Stack
	via        string
	count      uint64
	where      seenCounts // count by process and thread
	// Sightings the thread outlived (more events followed): impossible
	// for a lock that waits forever.
	contradicted uint64
}

// selfLock records a thread taking a lock it holds (h).
func (a *Analyzer) selfLock(t *thread, h *heldLock, q acquisition, kind selfKind) {
	viaHook := q.inAlloc && !h.inAlloc
	h.inst.pinned = true // the key holds its id
	allocOp := events.OpNone
	if viaHook {
		allocOp = t.enclosingAllocOp(q.e)
	}
	key := selfKey{h.inst.id, kind, viaHook, allocOp}
	if s := a.selfLocks[key]; s != nil {
		s.count++
		s.where.add(t.stream, t.pid, t.tid, 1)
		t.expectStop(s)
		return
	}
	st := t.stream.stack(q.e.Stack)
	s := &selfSighting{
		kind:      kind,
		inst:      h.inst,
		stream:    t.stream,
		pid:       t.pid,
		tid:       t.tid,
		heldOp:    h.op,
		heldStack: t.stream.stack(h.stack),
		op:        q.op,
		stack:     st,
		viaHook:   viaHook,
		count:     1,
		where:     seenCounts{},
	}
	s.where.add(t.stream, t.pid, t.tid, 1)
	if viaHook {
		s.allocOp = allocOp
		s.allocStack = t.allocCallStack(st, s.allocOp)
		s.via = t.hookVia(st)
	}
	a.selfLocks[key] = s
	a.selfList = append(a.selfList, s)
	t.expectStop(s)
}

// expectStop: after a self-deadlock on a lock that waits forever, the
// thread should record nothing more.
func (t *thread) expectStop(s *selfSighting) {
	if s.kind == selfDeadlock {
		t.outlived = s
		t.selfBefore = t.prev
	}
}

// disproved reports whether the trace contradicts the sighting: every one
// was outlived by its thread; or some were, and events were lost. Then the
// lock's release was among the lost events, and the sightings not followed
// by an event (the trace ended, or the thread's next events were lost too)
// are no better evidence: a trace inconsistency, not an error.
func (s *selfSighting) disproved() bool {
	return s.count > 0 && (s.contradicted == s.count || s.contradicted > 0 && s.stream.lossy())
}

// selfFindings merges self-lock sightings by lock class, what happened and,
// for a hook, the allocator call it ran in; the sites of the first
// sighting are in the edges.
func (a *Analyzer) selfFindings(n *naming) []Finding {
	var out []Finding
	var where []seenCounts // by finding
	index := map[string]int{}
	for _, s := range a.selfList {
		if s.disproved() {
			continue // reported as a trace inconsistency
		}
		lock := n.of(s.inst)
		kind, sev := KindSelfDeadlock, SeverityError
		switch s.kind {
		case selfRecursiveHook:
			kind, sev = KindHookLock, SeverityWarning
		case selfReadReentry, selfTimed, selfErrorCheck:
			sev = SeverityWarning
		}
		id := findingID(kind, n.key(s.inst), itoa(uint64(s.kind)), boolWord(s.viaHook), s.allocOp.String())
		if i, ok := index[id]; ok {
			out[i].Occurrences += s.count
			out[i].Instances = appendSet(out[i].Instances, lock)
			where[i].merge(s.where)
			continue
		}
		index[id] = len(out)
		where = append(where, seenCounts{})
		where[len(where)-1].merge(s.where)
		f := Finding{
			ID:          id,
			Kind:        kind,
			Severity:    sev,
			Locks:       []string{lock},
			Threads:     []uint32{s.tid},
			Occurrences: s.count,
			Instances:   [][]string{{lock}},
		}
		f.Title, f.Detail = selfText(s, lock)
		if s.contradicted > 0 {
			f.Detail += " (" + itoa(s.contradicted) + " of " + itoa(s.count) +
				" sightings were followed by more events of their thread, which a real self-deadlock forbids: see the trace inconsistencies.)"
		}
		f.Edges = selfEdges(s, lock)
		out = append(out, f)
	}
	for i := range out {
		if len(out[i].Instances) < 2 {
			out[i].Instances = nil
		}
		out[i].Seen = where[i].list()
	}
	return out
}

func appendSet(sets [][]string, lock string) [][]string {
	if len(sets) >= maxInstanceSets {
		return sets
	}
	return append(sets, []string{lock})
}

func boolWord(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func selfText(s *selfSighting, lock string) (title, detail string) {
	kindWord := "a non-recursive lock"
	if s.inst.typ == typeMutex {
		kindWord = "a normal (non-recursive) mutex"
	}
	hook := "a hook"
	if s.via != "" {
		hook = "a hook in " + s.via
	}
	switch s.kind {
	case selfRecursiveHook:
		return "memory hook re-enters " + lock + " inside " + s.allocOp.String(),
			"The thread holds " + lock + " (a recursive mutex) and calls " + s.allocOp.String() + "; " + hook +
				" running inside it takes " + lock + " again. It does not block, but the hook runs while the data " +
				lock + " protects may be in the middle of an update."
	case selfReadReentry:
		return "read lock of " + lock + " taken twice by one thread",
			lock + "'s readers queue behind writers (PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP): a second read lock by the same thread deadlocks if a writer arrives in between."
	case selfTimed:
		return "timed lock of " + lock + ", which this thread already holds",
			"The thread waits for itself until the deadline, then the call fails."
	case selfErrorCheck:
		return s.op.String() + " of " + lock + ", which this thread already holds",
			"The lock detects it: the call fails with EDEADLK. Code that ignores the result runs unprotected."
	}
	if s.viaHook {
		return "self-deadlock: a memory hook inside " + s.allocOp.String() + " takes " + lock + ", which this thread already holds",
			"The thread holds " + lock + " and calls " + s.allocOp.String() + "; " + hook + " running inside it takes " +
				lock + " again. " + lock + " is " + kindWord + ", so the thread waits for itself forever (for instance the first malloc of a thread creates its arena and unmaps memory, which runs the munmap hook). Fix: do not call the allocator with the lock held."
	}
	return "self-deadlock: " + s.op.String() + " of " + lock + ", which this thread already holds",
		lock + " is " + kindWord + ": taking it again waits for itself forever."
}

func selfEdges(s *selfSighting, lock string) []Edge {
	name := s.stream.threadName(s.tid)
	mk := func(from, to, context string, stack, held *events.Stack) Edge {
		e := Edge{From: from, To: to, Thread: s.tid, ThreadName: name, PID: s.pid, Source: s.stream.source, Context: context}
		e.Stack, e.StackTruncated = framesOf(stack)
		if held != nil {
			e.HeldStack, e.HeldStackTruncated = framesOf(held)
		}
		return e
	}
	if !s.viaHook {
		return []Edge{mk(lock, lock, s.op.String()+"("+lock+") while already holding it (taken by "+s.heldOp.String()+")", s.stack, s.heldStack)}
	}
	alloc := s.stream.allocatorLock
	var hook strings.Builder
	hook.WriteString("a hook")
	if s.via != "" {
		hook.WriteString(" in " + s.via)
	}
	hook.WriteString(" running inside " + s.allocOp.String() + " takes " + lock + " again")
	if f := callerFrame(s.stack); f != nil {
		hook.WriteString(" at " + site(f))
	}
	return []Edge{
		mk(lock, alloc, s.allocOp.String()+" called while holding "+lock+" (taken by "+s.heldOp.String()+")", s.allocStack, s.heldStack),
		mk(alloc, lock, hook.String(), s.stack, s.allocStack),
	}
}
