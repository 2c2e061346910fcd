package analyzer

import (
	"encoding/binary"
	"sort"

	"github.com/hooktrace/hooktrace/events"
)

// Folding dead lock instances.
//
// A program that creates, uses and destroys locks in a loop makes a new
// instance per lifetime, each with its dependencies: memory would grow
// with the lock churn, not with the program's classes, edges and stacks.
// Once an instance's lifetime is over nothing can add to its dependencies
// (no thread can take it again), so it is folded into an earlier dead
// instance of the same class whose dependencies are the same: the same
// neighbours, each dependency sighted the same way (same calls, stacks,
// thread and verdicts). Such twins are interchangeable in every cycle and
// finding; the survivor counts how many instances (weight) and instance
// dependencies (edge.weight) it stands for, so occurrences, statistics
// and instance numbering stay what they were. An instance still held by a
// thread, or whose allocator verdict may still be revised, is retried
// later.

// lifetimeEnded is called when inst's lifetime ends (destroy, free,
// munmap, exec).
func (a *Analyzer) lifetimeEnded(inst *instance) {
	if inst == nil || inst.typ == typeArena || inst.dead {
		return
	}
	inst.dead = true
	if a.noFold {
		return
	}
	if !a.tryFold(inst) {
		a.deferred = append(a.deferred, inst)
		if len(a.deferred) >= 2*a.deferredKept+64 {
			a.retryFolds()
		}
	}
}

// retryFolds tries again the dead instances that could not be folded.
func (a *Analyzer) retryFolds() {
	kept := a.deferred[:0]
	for _, inst := range a.deferred {
		if !inst.folded && a.instances[inst.id] == inst && !a.tryFold(inst) {
			kept = append(kept, inst)
		}
	}
	clear(a.deferred[len(kept):])
	a.deferred = kept
	a.deferredKept = len(kept)
}

// tryFold folds a dead instance into its twin, or makes it the
// representative of its kind. It reports false when inst must wait.
func (a *Analyzer) tryFold(inst *instance) bool {
	if !inst.used {
		// Never taken: no dependency, no name, nothing to keep (and no
		// thread holds it).
		a.freeInstance(inst)
		return true
	}
	if inst.pinned || a.busy(inst) {
		return false
	}
	sig := a.signature(inst)
	if rep := a.twins[sig]; rep != nil && rep != inst && a.instances[rep.id] == rep {
		a.fold(inst, rep)
		return true
	}
	inst.sig = sig
	a.twins[sig] = inst
	return true
}

// busy: a thread holds inst (it can still gain dependencies), or an
// allocator verdict on one of its dependencies may still be revised.
func (a *Analyzer) busy(inst *instance) bool {
	for _, t := range inst.stream.threads {
		for i := range t.held {
			if t.held[i].inst == inst {
				return true
			}
		}
		for _, p := range t.hook.pending {
			if p.edge.from == inst || p.edge.to == inst {
				return true
			}
		}
	}
	return false
}

// signature describes what findings can see of a dead instance: its class
// and its dependencies, sighting by sighting. Stacks are compared by
// identity: a stream sends each distinct stack once.
func (a *Analyzer) signature(inst *instance) string {
	b := a.sigBuf[:0]
	b = binary.AppendUvarint(b, uint64(inst.stream.index))
	b = binary.AppendUvarint(b, uint64(inst.pid))
	b = append(b, byte(inst.typ), flagByte(inst.recursive, inst.errorCheck, inst.nonRecursiveReads))
	b = appendString(b, inst.name)
	b = binary.AppendUvarint(b, stackID(inst.initStack))
	b = binary.AppendUvarint(b, stackID(inst.firstStack))
	deps := a.sigDeps[:0]
	for _, ed := range inst.out {
		deps = append(deps, sigDep{ed.to.seq, ed})
	}
	n := len(deps)
	for _, ed := range inst.in {
		deps = append(deps, sigDep{ed.from.seq, ed})
	}
	out, in := deps[:n], deps[n:]
	for _, list := range [][]sigDep{out, in} {
		sort.Slice(list, func(i, j int) bool { return list[i].other < list[j].other })
		b = binary.AppendUvarint(b, uint64(len(list)))
		for _, d := range list {
			b = appendEdgeSignature(b, d.other, d.ed)
		}
	}
	clear(deps)
	a.sigDeps = deps[:0]
	a.sigBuf = b
	return string(b)
}

type sigDep struct {
	other int64
	ed    *edge
}

func appendEdgeSignature(b []byte, other int64, ed *edge) []byte {
	b = binary.AppendUvarint(b, uint64(other))
	for dt, s := range ed.seen {
		if s == nil {
			continue
		}
		b = append(b, byte(dt), byte(s.heldOp), byte(s.op), byte(s.allocOp), byte(s.hold),
			flagByte(s.heldRead, s.read, s.timed))
		b = binary.AppendUvarint(b, uint64(s.pid))
		b = binary.AppendUvarint(b, uint64(s.tid))
		b = binary.AppendUvarint(b, stackID(s.heldStack))
		b = binary.AppendUvarint(b, stackID(s.stack))
		b = appendString(b, s.via)
		b = appendString(b, s.hook)
		b = appendString(b, s.holdReason)
	}
	return append(b, 0xff)
}

func stackID(st *events.Stack) uint64 {
	if st == nil {
		return 0
	}
	return uint64(st.ID)
}

func flagByte(bits ...bool) byte {
	var v byte
	for i, b := range bits {
		if b {
			v |= 1 << i
		}
	}
	return v
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// fold merges dead inst into its twin rep and forgets inst.
func (a *Analyzer) fold(inst, rep *instance) {
	rep.weight += inst.weight
	// Each dependency of inst has its twin at rep: add to its weight.
	twinOut := map[*instance]*edge{}
	for _, ed := range rep.out {
		twinOut[ed.to] = ed
	}
	twinIn := map[*instance]*edge{}
	for _, ed := range rep.in {
		twinIn[ed.from] = ed
	}
	var touched []*instance
	for _, ed := range inst.out {
		if tw := twinOut[ed.to]; tw != nil {
			tw.weight += ed.weight
		}
		a.dropEdge(ed)
		touched = append(touched, ed.to)
	}
	for _, ed := range inst.in {
		if tw := twinIn[ed.from]; tw != nil {
			tw.weight += ed.weight
		}
		a.dropEdge(ed)
		touched = append(touched, ed.from)
	}
	a.freeInstance(inst)
	// Dead representatives that had inst as a neighbour lost a
	// dependency: their signatures changed.
	for _, n := range touched {
		if n.sig == "" || a.instances[n.id] != n {
			continue
		}
		if a.twins[n.sig] == n {
			delete(a.twins, n.sig)
		}
		n.sig = ""
		a.tryFold(n)
	}
}

// dropEdge removes a dependency of a folded instance.
func (a *Analyzer) dropEdge(ed *edge) {
	if ed.gone {
		return
	}
	ed.gone = true
	delete(a.edges, edgeKey(ed.from, ed.to))
	ed.from.out = removeEdge(ed.from.out, ed)
	ed.to.in = removeEdge(ed.to.in, ed)
	a.goneEdges++
	if a.goneEdges > 1024 && a.goneEdges > len(a.edgeList)/2 {
		a.compactEdges()
	}
}

func removeEdge(list []*edge, ed *edge) []*edge {
	for i, e := range list {
		if e == ed {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			return list[:last]
		}
	}
	return list
}

// compactEdges drops folded dependencies from edgeList, keeping the order.
func (a *Analyzer) compactEdges() {
	if a.goneEdges == 0 {
		return
	}
	kept := a.edgeList[:0]
	for _, ed := range a.edgeList {
		if !ed.gone {
			kept = append(kept, ed)
		}
	}
	clear(a.edgeList[len(kept):])
	a.edgeList = kept
	a.goneEdges = 0
	if cap(a.edgeList) > 4*len(a.edgeList)+1024 {
		a.edgeList = append([]*edge(nil), a.edgeList...)
	}
}

// freeInstance gives inst's slot to the next new instance.
func (a *Analyzer) freeInstance(inst *instance) {
	inst.folded = true
	if inst.sig != "" && a.twins[inst.sig] == inst {
		delete(a.twins, inst.sig)
	}
	a.instances[inst.id] = nil
	a.freeIDs = append(a.freeIDs, inst.id)
}

// newInstanceID is a free slot, or a new one.
func (a *Analyzer) newInstanceID() int32 {
	if n := len(a.freeIDs); n > 0 {
		id := a.freeIDs[n-1]
		a.freeIDs = a.freeIDs[:n-1]
		return id
	}
	a.instances = append(a.instances, nil)
	return int32(len(a.instances) - 1)
}

// liveInstances lists the instances kept, in order of creation.
func (a *Analyzer) liveInstances() []*instance {
	out := make([]*instance, 0, len(a.instances))
	for _, inst := range a.instances {
		if inst != nil {
			out = append(out, inst)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}
