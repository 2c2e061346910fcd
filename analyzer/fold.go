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
// (no thread can take it again). So the dead instances connected by
// dependencies (a cluster: an object's two locks, or one heap mutex taken
// under a table lock) are folded into an earlier dead cluster of the same
// shape: the same classes, the same dependencies among them and to the
// same live or remaining locks, each sighted the same way (same calls,
// stacks, thread and verdicts). Such twins are interchangeable in every
// cycle and finding; the survivors count how many instances (weight) and
// instance dependencies (edge.weight) they stand for, so occurrences,
// statistics and instance numbering stay what they were. A cluster with an
// instance still held by a thread, or whose allocator verdict may still be
// revised, is retried later.

// maxCluster bounds the dead clusters folded: finding one costs its size.
const maxCluster = 16

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

// tryFold folds the dead cluster of inst into its twin, or makes it the
// representative of its shape. It reports false when it must wait.
func (a *Analyzer) tryFold(inst *instance) bool {
	if inst.folded {
		return true
	}
	if !inst.used && !inst.pinned {
		// Never taken: no dependency, no name, nothing to keep (and no
		// thread holds it). A misused one is named by a finding.
		a.freeInstance(inst)
		return true
	}
	cluster, ok := a.deadCluster(inst)
	if !ok {
		return true // too large, or a finding refers to a member: kept as is
	}
	for _, m := range cluster {
		if a.busy(m) {
			return false
		}
	}
	// The members may have stood for a smaller cluster before.
	for _, m := range cluster {
		if m.sig != "" {
			delete(a.twins, m.sig)
			m.sig = ""
		}
	}
	sig := a.signature(cluster)
	if rep := a.twins[sig]; rep != nil && a.intact(rep, sig) {
		a.fold(cluster, rep)
		return true
	}
	for _, m := range cluster {
		m.sig = sig
	}
	a.twins[sig] = cluster
	return true
}

// deadCluster is inst and the dead instances it is connected to by
// dependencies, in order of creation; false when there are more than
// maxCluster or one is pinned.
func (a *Analyzer) deadCluster(inst *instance) ([]*instance, bool) {
	cluster := []*instance{inst}
	in := map[*instance]bool{inst: true}
	for i := 0; i < len(cluster); i++ {
		m := cluster[i]
		if m.pinned {
			return nil, false
		}
		visit := func(n *instance) bool {
			if !n.dead || in[n] {
				return true
			}
			if len(cluster) == maxCluster {
				return false
			}
			in[n] = true
			cluster = append(cluster, n)
			return true
		}
		for _, ed := range m.out {
			if !visit(ed.to) {
				return nil, false
			}
		}
		for _, ed := range m.in {
			if !visit(ed.from) {
				return nil, false
			}
		}
	}
	sort.Slice(cluster, func(i, j int) bool { return cluster[i].seq < cluster[j].seq })
	return cluster, true
}

// intact: the representative cluster rep is still what sig describes.
func (a *Analyzer) intact(rep []*instance, sig string) bool {
	for _, m := range rep {
		if m.folded || a.instances[m.id] != m || m.sig != sig {
			return false
		}
	}
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

// signature describes what findings can see of a dead cluster: each
// member's class and its dependencies, sighting by sighting, the other end
// named by its place in the cluster or, outside it, by its creation
// number. Stacks are compared by identity: a stream sends each distinct
// stack once.
func (a *Analyzer) signature(cluster []*instance) string {
	index := map[*instance]int64{}
	for i, m := range cluster {
		index[m] = int64(i)
	}
	other := func(n *instance) int64 {
		if i, ok := index[n]; ok {
			return -1 - i
		}
		return n.seq
	}
	b := a.sigBuf[:0]
	for _, inst := range cluster {
		b = binary.AppendUvarint(b, uint64(inst.stream.index))
		b = binary.AppendUvarint(b, uint64(inst.pid))
		b = append(b, byte(inst.typ), flagByte(inst.recursive, inst.errorCheck, inst.nonRecursiveReads))
		b = appendString(b, inst.name)
		b = binary.AppendUvarint(b, stackID(inst.initStack))
		b = binary.AppendUvarint(b, stackID(inst.firstStack))
		deps := a.sigDeps[:0]
		for _, ed := range inst.out {
			deps = append(deps, sigDep{other(ed.to), ed})
		}
		n := len(deps)
		for _, ed := range inst.in {
			deps = append(deps, sigDep{other(ed.from), ed})
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
	}
	a.sigBuf = b
	return string(b)
}

type sigDep struct {
	other int64
	ed    *edge
}

func appendEdgeSignature(b []byte, other int64, ed *edge) []byte {
	return appendEdgeSightings(binary.AppendVarint(b, other), ed, true)
}

// appendEdgeSightings appends what ed's sightings show, with their
// threads and process or (folding other traces) without.
func appendEdgeSightings(b []byte, ed *edge, threads bool) []byte {
	var present byte
	for dt, s := range ed.seen {
		if s != nil {
			present |= 1 << dt
		}
	}
	b = append(b, present)
	for _, s := range ed.seen {
		if s != nil {
			b = appendSighting(b, s, threads)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(ed.byCall)))
	for _, s := range ed.byCall {
		b = appendSighting(b, s, threads)
	}
	return b
}

func appendSighting(b []byte, s *sighting, threads bool) []byte {
	b = append(b, byte(s.heldOp), byte(s.op), byte(s.allocOp), byte(s.hold),
		flagByte(s.heldRead, s.read, s.timed, s.link != nil))
	if threads {
		b = binary.AppendUvarint(b, uint64(s.pid))
		b = binary.AppendUvarint(b, uint64(s.tid))
	}
	b = appendStacks(b, s.heldStack, s.stack)
	b = appendString(b, s.via)
	b = appendString(b, s.hook)
	b = appendString(b, s.holdReason)
	if s.link != nil && !threads {
		// Within a trace, one process's hook context explains every link;
		// across traces, each its own.
		b = appendLink(b, s.link)
	}
	return b
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

// fold merges the dead cluster into its twin rep, member by member, and
// forgets it.
func (a *Analyzer) fold(cluster, rep []*instance) {
	twin := map[*instance]*instance{}
	for i, m := range cluster {
		twin[m] = rep[i]
		rep[i].weight += m.weight
		rep[i].local += m.local
	}
	image := func(n *instance) *instance {
		if t := twin[n]; t != nil {
			return t
		}
		return n
	}
	var dead []*edge
	for _, m := range cluster {
		dead = append(dead, m.out...)
		for _, ed := range m.in {
			if twin[ed.from] == nil { // inner ones are in an out list
				dead = append(dead, ed)
			}
		}
	}
	for _, ed := range dead {
		// Equal signatures: each dependency has its twin at rep.
		if tw := a.edges[edgeKey(image(ed.from), image(ed.to))]; tw != nil {
			tw.absorb(ed)
		}
	}
	for _, ed := range dead {
		a.dropEdge(ed)
	}
	for _, m := range cluster {
		a.freeInstance(m)
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
	inst.sig = ""
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
