package analyzer

import (
	"github.com/hooktrace/hooktrace/events"
	"strings"
)

// Options configure an Analyzer.
type Options struct {
	// Forbid lists nesting rules checked on every stream, in addition to
	// the rules each trace recorded in its header.
	Forbid []Rule
	// Allocator overrides Header.Allocator ("glibc", "jemalloc", ...).
	Allocator string
}

// Analyzer consumes event streams and builds a Result. It is not safe for
// concurrent use.
type Analyzer struct {
	opts      Options
	rules     []Rule
	ruleIndex map[Rule]int
	// matchCache holds funcname.Match's answers, by rule name and frame.
	matchCache map[[2]string]bool
	warnings   []string

	streams []*stream
	cur     *stream

	instances []*instance // by id; nil where an instance was folded
	nextSeq   int64
	freeIDs   []int32
	// Dead instances by signature, each standing for its folded twins,
	// and the dead ones to fold once no thread holds them (fold.go).
	twins        map[string][]*instance
	deferred     []*instance
	deferredKept int
	goneEdges    int  // folded dependencies still in edgeList
	noFold       bool // keep every instance (tests compare with folding)
	sigBuf       []byte
	sigDeps      []sigDep

	// Finished streams' groups of instances by signature, and their
	// allocator re-entries, for later streams to fold into (rankfold.go).
	rankTwins     map[string]*rankGroup
	rankReentries map[string]*reentrySighting
	// Stacks by a hash of their frames, shared by every stream, and how
	// many there are (stacks.go).
	stackTable map[uint64][]*events.Stack
	nstacks    uint32

	// Dependencies between lock instances, keyed by edgeKey(from, to).
	edges    map[uint64]*edge
	edgeList []*edge

	// First sightings of the non-cycle findings, in the order seen.
	selfLocks   map[selfKey]*selfSighting
	selfList    []*selfSighting
	reentries   map[reentryKey]*reentrySighting
	reentryList []*reentrySighting
	nestings    map[int]*nestSighting
	unlessRules bool // a rule stands in for another (Rule.Unless)
	nestList    []*nestSighting

	// Locks held around an allocator call that can run a hook taking them.
	hookSelfs    map[hookSelfKey]bool
	hookSelfList []*hookLink

	// The trace's own contradictions (the lock misuse is counted by
	// stream).
	checks    TraceChecks
	incons    map[incKey]*inconsistency
	inconList []*inconsistency
}

// New returns an Analyzer with no streams yet.
func New(opts Options) *Analyzer {
	a := &Analyzer{
		opts:      opts,
		ruleIndex: map[Rule]int{},
		edges:     map[uint64]*edge{},
		twins:     map[string][]*instance{},
		selfLocks: map[selfKey]*selfSighting{},
		reentries: map[reentryKey]*reentrySighting{},
		nestings:  map[int]*nestSighting{},

		rankTwins:     map[string]*rankGroup{},
		rankReentries: map[string]*reentrySighting{},
		stackTable:    map[uint64][]*events.Stack{},
	}
	for _, r := range opts.Forbid {
		a.addRule(r)
	}
	return a
}

// BeginStream starts a new event stream (one trace file, one MPI rank):
// stack IDs, PIDs and TIDs of different streams never refer to each other.
// source labels the stream in reports (a file name, say). A Header record
// arriving after other records of the current stream starts a new stream
// by itself, so calling BeginStream is needed only to give the label.
func (a *Analyzer) BeginStream(source string) {
	if a.cur != nil && !a.cur.seen {
		a.cur.source = source
		return
	}
	a.newStream(source)
}

func (a *Analyzer) newStream(source string) {
	if a.cur != nil {
		a.cur.finish()
		a.foldFinished(a.cur)
	}
	a.cur = newStream(len(a.streams), source)
	a.cur.an = a
	a.streams = append(a.streams, a.cur)
}

// Add feeds one record of the current stream. It keeps the Header, Stack
// and Footer the record points to and copies the rest, so the caller may
// reuse the Record itself.
func (a *Analyzer) Add(r *events.Record) {
	if a.cur == nil {
		a.newStream("")
	}
	switch r.Kind {
	case events.RecEvent:
		a.event(&r.Event)
		return
	case events.RecStack:
		if r.Stack != nil {
			a.cur.stacks[r.Stack.ID] = a.internStack(r.Stack)
		}
	case events.RecHeader:
		if a.cur.seen {
			a.newStream("")
		}
		a.header(r.Header)
	case events.RecThread:
		if r.Thread.Name != "" {
			a.cur.threadNames[r.Thread.TID] = r.Thread.Name
		}
	case events.RecLockName:
		a.lockName(r.LockName)
	case events.RecLost:
		a.cur.lost += r.Lost.Count
	case events.RecFooter:
		a.cur.footer = r.Footer
		if r.Footer != nil {
			a.cur.ranks = r.Footer.Ranks
		}
	}
	a.cur.seen = true
}

func (a *Analyzer) header(h *events.Header) {
	s := a.cur
	s.header = h
	if h == nil {
		return
	}
	// A rule pack's probes are optional ("?NAME"): the name is NAME.
	s.probeNames = make([]string, len(h.UserProbes))
	for i, p := range h.UserProbes {
		s.probeNames[i] = strings.TrimPrefix(p, "?")
	}
	alloc := h.Allocator
	if a.opts.Allocator != "" {
		alloc = a.opts.Allocator
	}
	s.setAllocator(alloc)
	for _, text := range h.Forbid {
		r, err := ParseRule(text)
		if err != nil {
			a.warnings = append(a.warnings, "header forbid rule ignored: "+err.Error())
			continue
		}
		a.addRule(r)
	}
}

func (a *Analyzer) addRule(r Rule) {
	if _, ok := a.ruleIndex[r]; ok {
		return
	}
	a.ruleIndex[r] = len(a.rules)
	a.rules = append(a.rules, r)
	a.unlessRules = a.unlessRules || r.Unless != ""
}

func (a *Analyzer) lockName(n events.LockName) {
	s := a.cur
	if n.Name == "" {
		return
	}
	s.lockNames[lockKey{n.PID, n.Addr}] = n.Name
	// The name may arrive after the lock was first seen.
	if p := s.procs[n.PID]; p != nil {
		if inst := p.live[n.Addr]; inst != nil && inst.name == "" {
			inst.name = n.Name
		}
	}
}

// event is the hot path: one call per traced event.
func (a *Analyzer) event(e *events.Event) {
	s := a.cur
	s.seen = true
	s.events++
	op := e.Op
	if int(op) < opSlots {
		if e.Flags&events.FlagReturn != 0 {
			s.returns[op]++
		} else {
			s.entries[op]++
		}
	}
	t := s.thread(e.PID, e.TID)
	if t.outlived != nil && e.Op != events.OpThreadExit {
		// (A thread killed while it waits forever still exits.)
		a.checkOutlived(t, e)
	}

	inAlloc := e.Flags&events.FlagInAlloc != 0 || t.probesInAlloc > 0
	if !inAlloc && t.hook.active && !op.IsUnlock() {
		// The allocator call the hooks ran in is over. (Unlocks do not
		// decide: a tracer may not mark them.)
		t.hook.reset()
	}
	if !inAlloc && len(t.allocUnder) > 0 && !op.IsUnlock() {
		t.allocUnder, t.retook = t.allocUnder[:0], t.retook[:0]
	}
	if e.Flags&events.FlagInAlloc != 0 {
		// Another allocator call, even with no event outside between.
		if _, call := e.InAllocCall(); call != t.hook.call {
			if t.hook.active {
				t.hook.reset()
			}
			t.hook.call = call
		}
	}

	switch {
	case op.IsAllocator():
		a.allocatorCall(t, e, inAlloc)
	case op.IsLockAcquire():
		a.acquire(t, e, inAlloc)
	case op.IsUnlock():
		if t.waitingOn != 0 && t.waitingOn == e.Addr && t.findHeld(e.Addr) < 0 {
			// The unlock of a wait left by cancellation (see waitingOn):
			// a recorder that sees returns only sees the wait's entry.
			t.waitingOn = 0
		} else if !t.release(e.Addr, false) {
			a.unheldUnlock(t, e, e.Addr)
		}
	case op.IsMemSyscall():
		a.memSyscall(t, e, inAlloc)
	default:
		a.otherEvent(t, e, inAlloc)
	}
	t.note(e)
}

func (a *Analyzer) otherEvent(t *thread, e *events.Event, inAlloc bool) {
	switch e.Op {
	case events.OpMutexInit, events.OpRwlockInit, events.OpSpinInit:
		if e.Op == events.OpSpinInit && e.Flags&events.FlagBusy != 0 && a.spinAliasUnlock(t, e) {
			break
		}
		// A lock its own thread holds, initialised again, starts anew
		// unheld: what a fork child does with the locks its
		// pthread_atfork handlers took (jemalloc re-initialises its
		// mutexes there rather than unlock them).
		if t.findHeld(e.Addr) >= 0 {
			t.release(e.Addr, true)
		}
		inst := t.proc.initLock(a, e.Addr, lockTypeOf(e.Op), t.stream.stack(e.Stack))
		if e.Op == events.OpRwlockInit {
			inst.nonRecursiveReads = e.Arg == rwlockPreferWriterNonrecursive
		}
	case events.OpMutexDestroy, events.OpRwlockDestroy, events.OpSpinDestroy:
		a.destroyLock(t, e)
	case events.OpCondWait, events.OpCondTimedwait:
		if e.Flags&events.FlagReturn == 0 {
			// Waiting releases the mutex completely.
			if !t.release(e.Addr2, true) {
				a.unheldUnlock(t, e, e.Addr2)
			}
			t.waitingOn = e.Addr2
		} else {
			// It is taken back whatever the result (a timeout too).
			t.waitingOn = 0
			a.condRetake(t, e, inAlloc)
		}
	case events.OpProbeEnter:
		a.probeEnter(t, e, inAlloc)
	case events.OpProbeExit:
		t.probeExit(e.Arg, e.Size)
	case events.OpThreadCreate:
		if e.Flags&events.FlagProcess != 0 {
			t.stream.fork(t.pid, uint32(e.Arg))
		}
	case events.OpThreadExit:
		t.exit()
	case events.OpExec:
		t.stream.exec(t.proc)
	}
}

// Result analyses what was added so far. It does not change the Analyzer:
// more records may be added and Result called again.
func (a *Analyzer) Result() *Result {
	res := &Result{Version: events.Version, Findings: []Finding{}}
	a.compactEdges()
	names := a.nameInstances()
	cycles := a.cycleFindings(names)
	res.Findings = append(res.Findings, cycles.findings...)
	res.Findings = append(res.Findings, a.selfFindings(names)...)
	res.Findings = append(res.Findings, a.hookSelfFindings(names)...)
	res.Findings = append(res.Findings, a.selfInconsistencyFindings(names)...)
	misuse, misused := a.misuseFindings(names)
	res.Findings = append(res.Findings, misuse...)
	res.Findings = append(res.Findings, a.hookLockFindings(names, cycles.arenaEdges, a.hookClosed(cycles.edgeFindings))...)
	res.Findings = append(res.Findings, a.reentryFindings()...)
	res.Findings = append(res.Findings, a.nestingFindings()...)
	for _, st := range a.streams {
		res.Findings = append(res.Findings, st.hangFindings()...)
	}
	a.fillSeen(res.Findings)
	res.Stats = a.stats(names)
	res.Graph = a.graph(names, cycles.edgeFindings, misused)
	res.Sort()
	return res
}
