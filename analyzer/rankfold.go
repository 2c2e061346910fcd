package analyzer

import (
	"encoding/binary"
	"sort"

	"github.com/hooktrace/hooktrace/events"
)

// Folding finished traces.
//
// The traces of an MPI job's ranks are runs of one program: their lock
// instances, dependencies and stacks repeat from rank to rank. Once a
// trace is finished (the next one begins), nothing can add to its
// instances, so each group of them joined by dependencies (a process's
// locks, usually joined through the allocator's pseudo-lock) is folded
// into an earlier trace's group of the same shape: the same classes,
// dependencies and sightings (the same calls, stacks and verdicts; which
// thread, process or trace aside), and the same first sightings of the
// other findings on them. The survivors count every rank's instances and
// dependencies (weight), and those sightings add up their counts, so the
// result reports what it would unfolded, with the first rank's threads
// and stacks as examples; memory grows with the shapes and distinct
// stacks the ranks have, not with the ranks. Stacks are shared by content
// across traces as they arrive (internStack). A trace that lost events or
// was cut short is not folded: whether its records are believed depends
// on it.

// rankGroup is a finished trace's group of instances that later traces'
// groups of the same shape fold into, with the first sightings of the
// findings on it, in the order the signature lists them.
type rankGroup struct {
	members []*instance
	selfs   []*selfSighting
	incons  []*inconsistency
	hooks   []*hookLink
	// A representative's dependencies that twins were folded into, each
	// at its rankIdx, and where each folded group saw them.
	edges  []*edge
	folded []*foldedRank
}

// foldedRank is where one later trace's group saw the dependencies of the
// group it was folded into: a process, and the thread of each dependency.
// Per rank it costs four bytes a dependency, not a map.
type foldedRank struct {
	s    *stream
	pid  uint32
	tids []uint32 // by rankIdx: the twin's first sighting's thread, or 0
	// Twins that stood for more than one dependency (folded within their
	// trace), or were seen in another process, by rankIdx.
	more map[int32]seenCounts
}

// note records ed, folded into the representative's dependency tw.
func (fr *foldedRank) note(rep *rankGroup, tw, ed *edge) {
	if tw.rankRep == nil {
		tw.rankRep, tw.rankIdx = rep, int32(len(rep.edges))
		rep.edges = append(rep.edges, tw)
	}
	i := tw.rankIdx
	s := ed.firstSighting()
	if ed.where != nil || ed.rankRep != nil || ed.weight != 1 || (s != nil && (s.stream != fr.s || s.pid != fr.pid)) {
		if fr.more == nil {
			fr.more = map[int32]seenCounts{}
		}
		fr.more[i] = ed.seenIn()
		return
	}
	if s == nil {
		return
	}
	if int(i) >= len(fr.tids) {
		fr.tids = append(fr.tids, make([]uint32, int(i)+1-len(fr.tids))...)
	}
	fr.tids[i] = s.tid
}

// addTo counts where fr saw the dependency at index i.
func (fr *foldedRank) addTo(c seenCounts, i int32) {
	if m := fr.more[i]; m != nil {
		c.merge(m)
	} else if int(i) < len(fr.tids) && fr.tids[i] != 0 {
		c.add(fr.s, fr.pid, fr.tids[i], 1)
	}
}

// foldFinished folds the instances of the finished stream s into earlier
// streams' groups of the same shape.
func (a *Analyzer) foldFinished(s *stream) {
	if a.noFold || !s.complete() {
		return
	}
	var mine []*instance
	for _, inst := range a.instances {
		if inst == nil || inst.stream != s {
			continue
		}
		// Its lifetime is over with the trace; an in-stream twin of its
		// signature can never match again.
		inst.dead = true
		if inst.sig != "" {
			delete(a.twins, inst.sig)
			inst.sig = ""
		}
		mine = append(mine, inst)
	}
	a.dropDeferred(s)
	a.foldReentries(s)
	refs := a.findingRefs(s)
	for _, members := range groups(mine) {
		g := refs.of(members)
		sig := a.groupSignature(g)
		if rep := a.rankTwins[sig]; rep != nil {
			a.foldGroup(g, rep)
			continue
		}
		a.rankTwins[sig] = g
	}
	if a.goneEdges > len(a.edgeList)/2 {
		a.compactEdges()
	}
}

// dropDeferred forgets the instances of s waiting to be folded within it.
func (a *Analyzer) dropDeferred(s *stream) {
	kept := a.deferred[:0]
	for _, inst := range a.deferred {
		if inst.stream != s {
			kept = append(kept, inst)
		}
	}
	clear(a.deferred[len(kept):])
	a.deferred = kept
	a.deferredKept = min(a.deferredKept, len(kept))
}

// groups splits instances into the groups their dependencies join, each
// ordered by class, then creation: an order that does not depend on which
// thread took which lock first.
func groups(insts []*instance) [][]*instance {
	group := map[*instance]int{}
	var out [][]*instance
	for _, inst := range insts {
		if _, ok := group[inst]; ok {
			continue
		}
		g := len(out)
		members := []*instance{inst}
		group[inst] = g
		for i := 0; i < len(members); i++ {
			m := members[i]
			for _, eds := range [][]*edge{m.out, m.in} {
				for _, ed := range eds {
					for _, n := range []*instance{ed.from, ed.to} {
						if _, ok := group[n]; !ok {
							group[n] = g
							members = append(members, n)
						}
					}
				}
			}
		}
		keys := make(map[*instance]string, len(members))
		for _, m := range members {
			_, keys[m] = classOf(m)
		}
		sort.Slice(members, func(i, j int) bool {
			if ki, kj := keys[members[i]], keys[members[j]]; ki != kj {
				return ki < kj
			}
			return members[i].seq < members[j].seq
		})
		out = append(out, members)
	}
	return out
}

// findingSights are the first sightings of a stream's other findings, by
// the instance they are on.
type findingSights struct {
	selfs  map[*instance][]*selfSighting
	incons map[*instance][]*inconsistency
	hooks  map[*instance][]*hookLink
}

func (a *Analyzer) findingRefs(s *stream) *findingSights {
	r := &findingSights{selfs: map[*instance][]*selfSighting{}, incons: map[*instance][]*inconsistency{},
		hooks: map[*instance][]*hookLink{}}
	for _, x := range a.selfList {
		if x.stream == s {
			r.selfs[x.inst] = append(r.selfs[x.inst], x)
		}
	}
	for _, x := range a.inconList {
		if x.stream == s {
			r.incons[x.inst] = append(r.incons[x.inst], x)
		}
	}
	for _, x := range a.hookSelfList {
		if x.under.stream == s {
			r.hooks[x.under.inst] = append(r.hooks[x.under.inst], x)
		}
	}
	return r
}

// of is the group of members with their findings' sightings, in member
// order, then list order.
func (r *findingSights) of(members []*instance) *rankGroup {
	g := &rankGroup{members: members}
	for _, m := range members {
		g.selfs = append(g.selfs, r.selfs[m]...)
		g.incons = append(g.incons, r.incons[m]...)
		g.hooks = append(g.hooks, r.hooks[m]...)
	}
	return g
}

// groupSignature describes what the result can see of a group, as
// signature does for a dead cluster, without the trace, process and
// threads: instances by their place in the group, stacks by identity
// (interned).
func (a *Analyzer) groupSignature(g *rankGroup) string {
	index := make(map[*instance]int64, len(g.members))
	for i, m := range g.members {
		index[m] = int64(i)
	}
	b := a.sigBuf[:0]
	for _, inst := range g.members {
		b = append(b, byte(inst.typ), flagByte(inst.recursive, inst.errorCheck, inst.nonRecursiveReads, inst.used))
		b = appendString(b, inst.name)
		b = binary.AppendUvarint(b, stackID(inst.initStack))
		b = binary.AppendUvarint(b, stackID(inst.firstStack))
		out := append([]*edge(nil), inst.out...)
		sort.Slice(out, func(i, j int) bool { return index[out[i].to] < index[out[j].to] })
		b = binary.AppendUvarint(b, uint64(len(out)))
		for _, ed := range out {
			b = binary.AppendVarint(b, index[ed.to])
			b = append(b, flagByte(ed.guardSeen))
			b = binary.AppendUvarint(b, uint64(len(ed.guards)))
			for _, gd := range ed.guards {
				b = binary.AppendVarint(b, index[gd])
			}
			b = appendEdgeSightings(b, ed, false)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(g.selfs)))
	for _, s := range g.selfs {
		b = binary.AppendVarint(b, index[s.inst])
		b = append(b, byte(s.kind), byte(s.heldOp), byte(s.op), byte(s.allocOp), flagByte(s.viaHook, s.disproved(), s.contradicted > 0))
		b = appendStacks(b, s.heldStack, s.stack, s.allocStack)
		b = appendString(b, s.via)
	}
	b = binary.AppendUvarint(b, uint64(len(g.incons)))
	for _, r := range g.incons {
		b = binary.AppendVarint(b, index[r.inst])
		b = append(b, byte(r.kind), byte(r.event.op), byte(r.before.op), byte(r.after.op), flagByte(r.holder.tid != 0, r.foreign > 0))
		b = appendStacks(b, r.event.stack, r.before.stack, r.after.stack, r.holder.stack)
		if r.self != nil {
			b = append(b, flagByte(r.self.disproved()))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(g.hooks)))
	for _, l := range g.hooks {
		b = appendLink(binary.AppendVarint(b, index[l.under.inst]), l)
		kind, sev, why, ok := hookSelfVerdict(l)
		b = append(appendString(appendString(appendString(b, string(kind)), string(sev)), why), flagByte(ok))
	}
	a.sigBuf = b
	return string(b)
}

// appendLink describes a dependency through a hook: the allocator call
// under the lock and the hook's lock call, and the path between them.
func appendLink(b []byte, l *hookLink) []byte {
	u, h := l.under, l.take
	b = append(b, byte(u.op), byte(u.heldOp), byte(h.op), byte(h.allocOp), flagByte(u.read, h.read, h.recursive, h.timed))
	b = appendStacks(b, u.heldStack, u.allocStack, h.stack, h.allocStack)
	b = appendString(b, h.via)
	return appendString(b, l.path())
}

func appendStacks(b []byte, stacks ...*events.Stack) []byte {
	for _, st := range stacks {
		b = binary.AppendUvarint(b, stackID(st))
	}
	return b
}

// foldGroup folds g into rep, its twin from an earlier trace: member by
// member, dependency by dependency, sighting by sighting.
func (a *Analyzer) foldGroup(g, rep *rankGroup) {
	twin := make(map[*instance]*instance, len(g.members))
	for i, m := range g.members {
		twin[m] = rep.members[i]
		rep.members[i].weight += m.weight
	}
	fr := &foldedRank{s: g.members[0].stream, pid: g.members[0].pid}
	for _, m := range g.members {
		for _, ed := range append([]*edge(nil), m.out...) {
			if tw := a.edges[edgeKey(twin[ed.from], twin[ed.to])]; tw != nil {
				tw.weight += ed.weight
				fr.note(rep, tw, ed)
			}
			a.dropEdge(ed)
		}
	}
	rep.folded = append(rep.folded, fr)
	gone := map[any]bool{}
	for i, s := range g.selfs {
		r := rep.selfs[i]
		r.count += s.count
		r.where.merge(s.where)
		r.contradicted += s.contradicted
		delete(a.selfLocks, selfKey{s.inst.id, s.kind, s.viaHook, s.allocOp})
		gone[s] = true
	}
	for i, x := range g.incons {
		r := rep.incons[i]
		r.count += x.count
		r.where.merge(x.where)
		r.foreign += x.foreign
		delete(a.incons, x.key)
		gone[x] = true
	}
	for i, l := range g.hooks {
		rep.hooks[i].absorb(l)
		delete(a.hookSelfs, hookSelfKey{l.under.inst.id, l.under.op, l.take.via})
		gone[l] = true
	}
	a.selfList = dropGone(a.selfList, gone)
	a.inconList = dropGone(a.inconList, gone)
	a.hookSelfList = dropGone(a.hookSelfList, gone)
	for _, m := range g.members {
		a.freeInstance(m)
	}
}

func dropGone[T comparable](list []T, gone map[any]bool) []T {
	if len(gone) == 0 {
		return list
	}
	kept := list[:0]
	for _, x := range list {
		if !gone[x] {
			kept = append(kept, x)
		}
	}
	clear(list[len(kept):])
	return kept
}

// foldReentries merges the allocator re-entries of the finished stream s
// into the same ones of earlier streams (the same calls, stacks and hook).
func (a *Analyzer) foldReentries(s *stream) {
	gone := map[any]bool{}
	for _, r := range a.reentryList {
		if r.stream != s {
			continue
		}
		delete(a.reentries, r.key)
		b := append(appendStacks([]byte{byte(r.outer), byte(r.inner)}, r.stack, r.outerStack), r.via...)
		if first := a.rankReentries[string(b)]; first != nil {
			first.count += r.count
			first.where.merge(r.where)
			gone[r] = true
			continue
		}
		a.rankReentries[string(b)] = r
	}
	a.reentryList = dropGone(a.reentryList, gone)
}
