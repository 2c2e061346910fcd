package analyzer

import (
	"github.com/hooktrace/hooktrace/events"
)

// Lock misuse: a thread unlocks a lock it does not hold (no thread holds
// it, or another one does), or destroys a held lock. Helgrind and TSan
// report these from the program's own calls, and so does hooktrace: both
// recorders send such a call with its stack, and with the holder the
// lock's own word names (the holder's acquisition may have been only
// counted). A lost event makes the same records (a lost lock call leaves
// its unlock unheld, a lost unlock leaves a lock held), so they are
// lock-misuse findings only in a trace that lost nothing and was not cut
// short; in any other they are trace inconsistencies that say so.

// LockMisuse counts lock calls made on a lock in a state the call forbids.
type LockMisuse struct {
	// Unlocks of a lock no thread held (in an attach, a thread's unlocks
	// of locks it was never seen taking are not counted: it may have
	// taken them before).
	UnheldUnlocks uint64 `json:"unheld_unlocks"`
	// Unlocks of a lock another thread held.
	ForeignUnlocks uint64 `json:"foreign_unlocks"`
	// Destroys of a held lock.
	HeldDestroys uint64 `json:"held_destroys"`
}

// Total is the number of misused calls.
func (m LockMisuse) Total() uint64 { return m.UnheldUnlocks + m.ForeignUnlocks + m.HeldDestroys }

func (m LockMisuse) unlocks() uint64 { return m.UnheldUnlocks + m.ForeignUnlocks }

func (m *LockMisuse) add(o LockMisuse) {
	m.UnheldUnlocks += o.UnheldUnlocks
	m.ForeignUnlocks += o.ForeignUnlocks
	m.HeldDestroys += o.HeldDestroys
}

// holder is the thread that held a misused lock, where known.
type holder struct {
	tid   uint32        // 0: no thread held it, or the lock's word names none (readers)
	stack *events.Stack // where it took the lock, when the trace has that
}

// unheldUnlock handles an unlock of addr by a thread that does not hold
// it: another thread's lock (released from that thread, unless glibc
// refuses the call), or a lock nobody holds. In an attach, a thread's
// unlock of a lock it was never seen taking is neither: it took it before
// the attach (and a waiter, traced at its lock call's entry, is not the
// holder).
func (a *Analyzer) unheldUnlock(t *thread, e *events.Event, addr uint64) {
	if t.stream.attached() && !t.took[addr] {
		return
	}
	if o, i := t.otherHolder(addr); o != nil {
		h := o.held[i]
		if !ownerChecked(h.inst) {
			// glibc releases it whoever calls: its holder goes on
			// unprotected.
			o.release(addr, true)
		}
		t.stream.misuse.ForeignUnlocks++
		a.misuse(t, e, incUnlock, h.inst, holder{tid: o.tid, stack: t.stream.stack(h.stack)})
		return
	}
	inst := t.proc.lock(a, addr, lockTypeOf(e.Op))
	if tid := wordHolder(e); tid != 0 && tid != t.tid {
		// Held, as the lock says, by a thread whose acquisition the trace
		// does not have (the chain cache only counted it).
		t.stream.misuse.ForeignUnlocks++
		a.misuse(t, e, incUnlock, inst, holder{tid: tid})
		return
	}
	t.stream.misuse.UnheldUnlocks++
	a.misuse(t, e, incUnlock, inst, holder{})
}

// spinAliasUnlock handles a spinlock init the eBPF recorder flagged as
// maybe a release (events.FlagBusy: glibc's pthread_spin_init is
// pthread_spin_unlock's code, the caller did not hold the lock, and its
// word said held): it is the release of the lock another thread holds,
// if one does, and reports whether it was.
func (a *Analyzer) spinAliasUnlock(t *thread, e *events.Event) bool {
	if o, _ := t.otherHolder(e.Addr); o == nil {
		return false
	}
	u := *e
	u.Op, u.Flags = events.OpSpinUnlock, e.Flags&^events.FlagBusy
	if !t.release(u.Addr, false) {
		a.unheldUnlock(t, &u, u.Addr)
	}
	return true
}

// destroyLock ends the lifetime of a destroyed lock, and reports its
// destroy when a thread holds it or the lock's word says it is held
// (FlagBusy). glibc refuses to destroy a held mutex (EBUSY): that one
// lives on.
func (a *Analyzer) destroyLock(t *thread, e *events.Event) {
	busy := e.Flags&events.FlagBusy != 0
	var inst *instance
	var h holder
	if i := t.findHeld(e.Addr); i >= 0 {
		inst, h = t.held[i].inst, holder{tid: t.tid, stack: t.stream.stack(t.held[i].stack)}
	} else if o, i := t.otherHolder(e.Addr); o != nil {
		inst, h = o.held[i].inst, holder{tid: o.tid, stack: t.stream.stack(o.held[i].stack)}
	} else if busy {
		inst, h = t.proc.lock(a, e.Addr, lockTypeOf(e.Op)), holder{tid: wordHolder(e)}
	}
	if inst != nil {
		t.stream.misuse.HeldDestroys++
		a.misuse(t, e, incDestroy, inst, h)
	}
	if busy && e.Op == events.OpMutexDestroy {
		return
	}
	t.proc.end(e.Addr)
}

// otherHolder is the thread of t's process, other than t, that holds the
// lock at addr (the lowest TID of several readers), and the lock's index
// in its held locks.
func (t *thread) otherHolder(addr uint64) (*thread, int) {
	var best *thread
	at := -1
	for _, o := range t.stream.threads {
		if o == t || o.pid != t.pid {
			continue
		}
		if i := o.findHeld(addr); i >= 0 && (best == nil || o.tid < best.tid) {
			best, at = o, i
		}
	}
	return best, at
}

// ownerChecked reports whether glibc checks the owner of inst on unlock
// (error-checking and recursive mutexes): another thread's unlock fails
// with EPERM and changes nothing.
func ownerChecked(inst *instance) bool {
	return inst.typ == typeMutex && (inst.recursive || inst.errorCheck)
}

// wordHolder is the holder's TID that a misused call's record names from
// the lock's word (0 for none).
func wordHolder(e *events.Event) uint32 {
	if e.Flags&events.FlagInAlloc != 0 {
		return 0 // Addr2 is the allocator call
	}
	switch {
	case e.Op == events.OpMutexUnlock, e.Op == events.OpRwlockUnlock, e.Flags&events.FlagBusy != 0:
		return uint32(e.Addr2)
	}
	return 0
}

// misuse records one misused call, merged per kind, lock and call site.
func (a *Analyzer) misuse(t *thread, e *events.Event, kind inconsistencyKind, inst *instance, h holder) {
	inst.pinned = true // the key holds its id
	st := t.stream.stack(e.Stack)
	if !inst.used && inst.firstStack == nil {
		inst.firstStack = st
	}
	foreign := uint64(0)
	if h.tid != 0 && h.tid != t.tid {
		foreign = 1
	}
	k := incKey{kind, inst.id, stableSite(callerFrame(st))}
	if r := a.incons[k]; r != nil {
		r.count++
		r.foreign += foreign
		r.where.add(t.stream, t.pid, t.tid, 1)
		return
	}
	a.addInconsistency(k, &inconsistency{
		kind: kind, inst: inst, stream: t.stream, pid: t.pid, tid: t.tid,
		before: t.prevNote(t.prev), event: eventNote{op: e.Op, addr: lockAddrOf(e), stack: st},
		count: 1, holder: h, foreign: foreign,
	})
}

func lockAddrOf(e *events.Event) uint64 {
	if e.Op == events.OpCondWait || e.Op == events.OpCondTimedwait {
		return e.Addr2
	}
	return e.Addr
}

// complete reports whether the trace lost no event and was not cut short:
// only then are its records of lock misuse the program's doing.
func (s *stream) complete() bool {
	return !s.lossy() && s.footer != nil
}

// misusedClass is a lock class with lock-misuse findings, for the graph.
type misusedClass struct {
	name, key string
	typ       lockType
	ids       []string
}

// misuseFindings reports the misused calls, one per kind of call, lock
// class and call site: lock misuse in a complete trace, a trace
// inconsistency that says it may be a lost event in any other. It also
// returns the classes of the lock-misuse findings, for the graph.
func (a *Analyzer) misuseFindings(n *naming) ([]Finding, []*misusedClass) {
	var out []Finding
	var classes []*misusedClass
	byName := map[string]*misusedClass{}
	index := map[string]int{}
	var where []seenCounts // by finding
	for _, r := range a.inconList {
		if r.kind == incSelf {
			continue
		}
		kind := KindLockMisuse
		if !r.stream.complete() {
			kind = KindTraceInconsistency
		}
		call := "unlock"
		if r.kind == incDestroy {
			call = "destroy"
		}
		id := findingID(kind, call, n.key(r.inst), stableSite(callerFrame(r.event.stack)))
		if i, ok := index[id]; ok {
			out[i].Occurrences += r.count
			where[i].merge(r.where)
			continue
		}
		index[id] = len(out)
		where = append(where, seenCounts{})
		where[len(where)-1].merge(r.where)
		f := r.misuseFinding(n)
		f.ID, f.Kind = id, kind
		if kind == KindTraceInconsistency {
			f.Title = "trace inconsistency: " + f.Title
			taken := "the call that took it"
			if r.kind == incDestroy {
				taken = "its unlock"
			}
			f.Detail = "In a complete trace this would be lock misuse, but this trace is not (" + r.stream.stats().Incomplete +
				"): " + taken + " may be among the events lost. " + f.Detail + r.around() + "."
		} else {
			name := n.className(r.inst)
			c := byName[name]
			if c == nil {
				c = &misusedClass{name: name, key: n.key(r.inst), typ: r.inst.typ}
				byName[name] = c
				classes = append(classes, c)
			}
			c.ids = append(c.ids, id)
		}
		out = append(out, f)
	}
	for i := range out {
		out[i].Seen = where[i].list()
	}
	return out, classes
}

// misuseFinding is the finding of one misuse record, without its ID and
// kind.
func (r *inconsistency) misuseFinding(n *naming) Finding {
	lock := n.of(r.inst)
	who := threadLabel(r.stream, r.tid)
	op := r.event.op.String()
	h := r.holder
	holderText := threadLabel(r.stream, h.tid)
	if h.stack == nil && h.tid != 0 {
		holderText += " (as the lock's own word says; the trace has no acquisition of it by that thread)"
	}
	tids := map[uint32]bool{r.tid: true}
	if h.tid != 0 {
		tids[h.tid] = true
	}
	e := Edge{From: lock, To: lock, Thread: r.tid, ThreadName: r.stream.threadName(r.tid), PID: r.pid, Source: r.stream.source}
	e.Stack, e.StackTruncated = framesOf(r.event.stack)
	if h.stack != nil {
		e.HeldStack, e.HeldStackTruncated = framesOf(h.stack)
	}
	f := Finding{
		Severity:    SeverityWarning,
		Locks:       []string{lock},
		Threads:     sortedTIDs(tids),
		Occurrences: r.count,
	}
	// Titles name no thread: TIDs differ from run to run.
	switch {
	case r.kind == incUnlock && h.tid == 0:
		e.Action = "unlocked"
		f.Title = "unlock of " + lock + ", which no thread held"
		e.Context = op + "(" + lock + ") by " + who + ", which does not hold it, and no thread does"
		f.Detail = "No thread held " + lock + " when " + who + " called " + op + ": an unlock of an unlocked " +
			r.inst.typ.word() + ", undefined in POSIX. " + unlockEffect(r.inst, false)
	case r.kind == incUnlock:
		e.Action = "unlocked"
		f.Title = "unlock of " + lock + ", held by another thread"
		e.Context = op + "(" + lock + ") by " + who + " while " + threadLabel(r.stream, h.tid) + " holds it"
		f.Detail = lock + " was held by " + holderText + " when " + who + " called " + op +
			": an unlock by a thread that does not hold the lock, undefined in POSIX. " + unlockEffect(r.inst, true)
	default:
		e.Action = "destroyed"
		switch {
		case h.tid == r.tid:
			f.Title = "destroy of " + lock + ", held by the destroying thread"
			e.Context = op + "(" + lock + ") by " + who + ", which holds it"
			f.Detail = who + " called " + op + " while holding " + lock + ". "
		case h.tid != 0:
			f.Title = "destroy of " + lock + ", held by another thread"
			e.Context = op + "(" + lock + ") by " + who + " while " + threadLabel(r.stream, h.tid) + " holds it"
			f.Detail = who + " called " + op + " while " + holderText + " held " + lock + ". "
		default:
			f.Title = "destroy of " + lock + ", which is held"
			e.Context = op + "(" + lock + ") by " + who + " while the lock's word says it is held (by readers, or a thread it does not name)"
			f.Detail = who + " called " + op + " while " + lock + " was held, as its word says (by readers, or a thread it does not name). "
		}
		f.Detail += "Destroying a held lock is undefined in POSIX. " + destroyEffect(r.inst)
	}
	if r.foreign > 0 && r.count > 1 && r.kind == incUnlock {
		f.Detail += " (" + itoa(r.foreign) + " of the " + itoa(r.count) + " calls here found it held by another thread.)"
	}
	f.Edges = []Edge{e}
	return f
}

// unlockEffect says what glibc 2.36 does with an unlock of a lock the
// calling thread does not hold.
func unlockEffect(inst *instance, heldByOther bool) string {
	switch {
	case ownerChecked(inst):
		return "glibc checks this mutex's owner: the call fails with EPERM and changes nothing; code that ignores the result goes on as if it had released it."
	case inst.typ == typeRwlock:
		return "glibc takes it for a reader's unlock (the caller is not the lock's writer) and its count of readers goes wrong: later lock calls may wait for good, or let a writer in beside readers."
	case inst.typ == typeSpin:
		return "glibc stores the unlocked value whoever calls."
	case heldByOther:
		return "glibc does not check a normal mutex's owner: the call releases it, and its holder goes on in its critical section unprotected."
	}
	return "glibc does not check a normal mutex's owner: the call goes through, and the mutex's count of users goes wrong (a later pthread_mutex_destroy fails with EBUSY)."
}

// destroyEffect says what glibc 2.36 does when a held lock is destroyed.
func destroyEffect(inst *instance) string {
	if inst.typ == typeMutex {
		return "glibc refuses: the call fails with EBUSY and the mutex stays held; code that ignores the result goes on to free or reuse memory that is still a locked mutex."
	}
	return "glibc does not check: the " + inst.typ.word() + " is gone while held, and its holder's unlock, or a thread waiting for it, then uses a destroyed lock."
}
