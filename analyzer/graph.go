package analyzer

import (
	"sort"

	"github.com/hooktrace/hooktrace/events"
)

// depType types a dependency A → B the way lockdep does: how A is held
// (exclusive, or shared: a read lock) and how B is wanted (non-recursively,
// or as a recursive read). See the package documentation for the rule.
type depType uint8

const (
	depRecursiveRead depType = 1 << iota // B wanted as a recursive read
	depHeldShared                        // A held for reading
	depTypes         = 4
)

func (d depType) recursiveRead() bool { return d&depRecursiveRead != 0 }
func (d depType) heldShared() bool    { return d&depHeldShared != 0 }

// arenaHold says whether the allocator holds its lock where a hook took a
// lock (allocator → lock dependencies only).
type arenaHold uint8

const (
	holdNone    arenaHold = iota // not an allocator dependency
	holdNotHeld                  // this path runs outside the arena lock
	holdMaybe                    // the stack does not tell
	holdHeld                     // the arena lock is held here
)

func (h arenaHold) String() string {
	switch h {
	case holdNotHeld:
		return "not held"
	case holdMaybe:
		return "may hold"
	case holdHeld:
		return "held"
	}
	return ""
}

// sighting is the first (or most telling) time a dependency was seen.
type sighting struct {
	stream    *stream
	pid, tid  uint32
	heldOp    events.Op // how the held lock was taken
	heldRead  bool
	heldStack *events.Stack
	op        events.Op // the call that took the next lock
	read      bool
	stack     *events.Stack
	timed     bool // a timed wait: it ends, at worst, in a timeout

	// Allocator dependencies.
	allocOp    events.Op // the enclosing allocator call
	via        string    // the hooked call or probed function the lock was taken in
	hook       string    // the function that called the lock
	hold       arenaHold
	holdReason string

	// A dependency through a memory hook: the allocator call made under
	// the held lock can run a hook seen taking the next one.
	link *hookLink
}

// edge is a dependency between two lock instances, with one sighting per
// dependency type seen.
type edge struct {
	from, to *instance
	seen     [depTypes]*sighting
	// Goodlock's gate candidates: the locks held exclusively at every
	// sighting, besides from and to (guardSeen once there was one).
	guards    []*instance
	guardSeen bool
	weight    uint64 // instance dependencies it stands for (fold.go)
	gone      bool   // its instance was folded into a twin
	// where counts the instance dependencies it stands for by the thread
	// each was first seen on; nil until a twin of its own trace is folded
	// in (seenIn). Twins of later traces are counted by the rank group
	// it represents, at index rankIdx (rankfold.go).
	where   seenCounts
	rankRep *rankGroup
	rankIdx int32
	// Allocator → lock dependencies: how many sightings had each hold
	// verdict (a verdict can be revised when the allocator call's memory
	// syscall shows up).
	holdCount [holdHeld + 1]uint32
	// Allocator → lock dependencies: the most telling sighting of each
	// allocator call hooks were seen taking the lock in (noteCall).
	byCall []*sighting
}

// noteCall keeps s, a hook's sighting of an allocator → lock dependency,
// as its allocator call's example: the first one, unless a later one
// found the arena lock held where the earlier did not.
func (ed *edge) noteCall(s *sighting) {
	for i, old := range ed.byCall {
		if old.allocOp == s.allocOp {
			if old.hold < s.hold {
				ed.byCall[i] = s
			}
			return
		}
	}
	ed.byCall = append(ed.byCall, s)
}

// callSightings are the examples of ed's allocator calls with the verdict
// hold, in the order of their op numbers.
func (ed *edge) callSightings(hold arenaHold) []*sighting {
	var out []*sighting
	for _, s := range ed.byCall {
		if s.hold == hold {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].allocOp < out[j].allocOp })
	return out
}

// seenIn counts the instance dependencies ed stands for by the thread
// each was first seen on: unfolded, its one dependency on the thread of
// its first sighting of the lowest type.
func (ed *edge) seenIn() seenCounts {
	c := seenCounts{}
	if ed.where != nil {
		c.merge(ed.where)
	} else if s := ed.firstSighting(); s != nil {
		c.add(s.stream, s.pid, s.tid, 1) // its weight counts other traces' twins too
	}
	if ed.rankRep != nil {
		for _, fr := range ed.rankRep.folded {
			fr.addTo(c, ed.rankIdx)
		}
	}
	return c
}

// firstSighting is ed's sighting of the lowest dependency type.
func (ed *edge) firstSighting() *sighting {
	for _, s := range ed.seen {
		if s != nil {
			return s
		}
	}
	return nil
}

// absorb folds o, a twin dependency of the same trace, into ed.
func (ed *edge) absorb(o *edge) {
	if ed.where == nil {
		ed.where = seenCounts{}
		if s := ed.firstSighting(); s != nil {
			ed.where.add(s.stream, s.pid, s.tid, ed.weight)
		}
	}
	ed.where.merge(o.seenIn())
	ed.weight += o.weight
}

func edgeKey(from, to *instance) uint64 {
	return uint64(uint32(from.id))<<32 | uint64(uint32(to.id))
}

func (a *Analyzer) edgeFor(from, to *instance) *edge {
	key := edgeKey(from, to)
	ed := a.edges[key]
	if ed == nil {
		ed = &edge{from: from, to: to, weight: 1}
		a.edges[key] = ed
		a.edgeList = append(a.edgeList, ed)
		from.out = append(from.out, ed)
		to.in = append(to.in, ed)
	}
	return ed
}

// lockEdge records h → q.inst. Only the first sighting of each type keeps
// stacks, unless it was a timed wait or a dependency through a hook and a
// direct blocking one comes along.
func (a *Analyzer) lockEdge(t *thread, h *heldLock, to *instance, q acquisition, dt depType) {
	if h.read {
		dt |= depHeldShared
	}
	ed := a.edgeFor(h.inst, to)
	t.guard(ed)
	if old := ed.seen[dt]; old != nil && (q.timed || (!old.timed && old.link == nil)) {
		return
	}
	s := t.stream
	ed.seen[dt] = &sighting{
		stream:    s,
		pid:       t.pid,
		tid:       t.tid,
		heldOp:    h.op,
		heldRead:  h.read,
		heldStack: s.stack(h.stack),
		op:        q.op,
		read:      q.read,
		stack:     s.stack(q.e.Stack),
		timed:     q.timed,
	}
}

// usable reports whether a dependency type of ed takes part in deadlocks:
// allocator → lock dependencies only where the allocator may hold its lock.
func (ed *edge) usable(dt depType) bool {
	s := ed.seen[dt]
	if s == nil {
		return false
	}
	return ed.from.typ != typeArena || s.hold >= holdMaybe
}

// cycleStep is one dependency on a cycle.
type cycleStep struct {
	edge *edge
	dt   depType
}

// stateEdge is a dependency in the graph of (lock, entered-as-recursive-
// read) states, where lockdep's read/write rule becomes plain reachability.
type stateEdge struct {
	to   int32
	step cycleStep
}

// maxComponentCycles caps the cycles searched for in one strongly
// connected component. Each costs a breadth-first search bounded by the
// component; a component of 100,000 locks taken in random pairs holds
// hundreds of thousands of dependencies, each on some cycle, and a search
// per dependency grows with the square of the graph. The dependencies
// left out are counted (cycleSearch.omitted) and said in the findings.
const maxComponentCycles = 1000

// cycleSearch is what findCycles found.
type cycleSearch struct {
	cycles [][]cycleStep
	comp   []int32 // the strongly connected component of each cycle
	// omitted counts, per component, the dependencies on some cycle of
	// the component that no reported cycle goes through (the search
	// stopped at maxComponentCycles).
	omitted map[int32]uint64
}

// findCycles returns, for every dependency on some deadlock-capable cycle,
// a shortest such cycle through it, each distinct cycle once, up to
// maxComponentCycles per component. Past that, with n given, it still
// searches through dependencies between two classes that no reported
// cycle joins yet (up to maxComponentCycles more), so a capped component
// hides no class-level dependency on a cycle unless it has more such
// pairs than that. Cost: Tarjan is linear; each BFS is bounded by its
// component and runs only for dependencies no earlier cycle covered, at
// most 2 × maxComponentCycles times a component.
func (a *Analyzer) findCycles(n *naming) cycleSearch {
	var res cycleSearch
	// Compact the instances that have dependencies.
	index := map[int32]int32{}
	var nodes []*instance
	node := func(inst *instance) int32 {
		if i, ok := index[inst.id]; ok {
			return i
		}
		i := int32(len(nodes))
		index[inst.id] = i
		nodes = append(nodes, inst)
		return i
	}
	type pending struct {
		from, to int32
		step     cycleStep
	}
	var deps []pending
	for _, ed := range a.edgeList {
		for dt := depType(0); dt < depTypes; dt++ {
			if ed.usable(dt) {
				deps = append(deps, pending{node(ed.from), node(ed.to), cycleStep{ed, dt}})
			}
		}
	}
	if len(deps) == 0 {
		return res
	}
	// State 2n+r: lock n, entered as a recursive read when r is 1. A lock
	// entered as a recursive read cannot be left by a dependency that holds
	// it shared: that pair never blocks.
	adj := make([][]stateEdge, 2*len(nodes))
	for _, d := range deps {
		to := 2 * d.to
		if d.step.dt.recursiveRead() {
			to++
		}
		for r := int32(0); r < 2; r++ {
			if r == 1 && d.step.dt.heldShared() {
				continue
			}
			from := 2*d.from + r
			adj[from] = append(adj[from], stateEdge{to: to, step: d.step})
		}
	}
	comp := tarjan(adj)

	covered := make([][]bool, len(adj))
	for u := range adj {
		covered[u] = make([]bool, len(adj[u]))
	}
	found := map[int32]int{}
	type classPair struct{ from, to string }
	pairOf := func(ed *edge) classPair { return classPair{n.key(ed.from), n.key(ed.to)} }
	joined := map[classPair]bool{} // class pairs on reported cycles
	seenCycle := map[string]bool{}
	bfs := newBFS(len(adj))
	capped := false
	for u := range adj {
		for k, se := range adj[u] {
			c := comp[u]
			if covered[u][k] || c != comp[se.to] {
				continue
			}
			if found[c] >= maxComponentCycles &&
				(n == nil || found[c] >= 2*maxComponentCycles || joined[pairOf(se.step.edge)]) {
				capped = true
				continue
			}
			path := bfs.path(adj, comp, se.to, int32(u))
			if path == nil {
				continue
			}
			found[c]++
			covered[u][k] = true
			steps := []cycleStep{se.step}
			for _, p := range path {
				covered[p.from][p.k] = true
				steps = append(steps, adj[p.from][p.k].step)
			}
			if n != nil {
				for _, st := range steps {
					joined[pairOf(st.edge)] = true
				}
			}
			steps = rotateCycle(steps)
			key := cycleKey(steps)
			if !seenCycle[key] {
				seenCycle[key] = true
				res.cycles = append(res.cycles, steps)
				res.comp = append(res.comp, c)
			}
		}
	}
	if capped {
		res.omitted = omittedSteps(adj, comp, res.cycles, found)
	}
	return res
}

// omittedSteps counts, per capped component, the dependencies inside it
// that no reported cycle goes through. Inside a strongly connected
// component every dependency is on some cycle.
func omittedSteps(adj [][]stateEdge, comp []int32, cycles [][]cycleStep, found map[int32]int) map[int32]uint64 {
	onCycle := map[cycleStep]bool{}
	for _, cyc := range cycles {
		for _, st := range cyc {
			onCycle[st] = true
		}
	}
	counted := map[cycleStep]bool{}
	out := map[int32]uint64{}
	for u := range adj {
		c := comp[u]
		if found[c] < maxComponentCycles {
			continue
		}
		for _, se := range adj[u] {
			if comp[se.to] != c || onCycle[se.step] || counted[se.step] {
				continue
			}
			counted[se.step] = true
			out[c]++
		}
	}
	return out
}

// rotateCycle starts a cycle at its oldest lock, so the same cycle found
// from different edges compares equal.
func rotateCycle(steps []cycleStep) []cycleStep {
	best := 0
	for i, s := range steps {
		if s.edge.from.seq < steps[best].edge.from.seq {
			best = i
		}
	}
	return append(append([]cycleStep(nil), steps[best:]...), steps[:best]...)
}

func cycleKey(steps []cycleStep) string {
	b := make([]byte, 0, len(steps)*9)
	for _, s := range steps {
		id := uint32(s.edge.from.id)
		b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		id = uint32(s.edge.to.id)
		b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24), byte(s.dt))
	}
	return string(b)
}

// tarjan returns the strongly connected component of each node
// (iterative: lock graphs can be deep).
func tarjan(adj [][]stateEdge) []int32 {
	n := len(adj)
	index := make([]int32, n)
	low := make([]int32, n)
	comp := make([]int32, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
		comp[i] = -1
	}
	var stack []int32
	type frame struct {
		v int32
		k int
	}
	var call []frame
	next, ncomp := int32(0), int32(0)
	for root := 0; root < n; root++ {
		if index[root] >= 0 {
			continue
		}
		call = append(call[:0], frame{v: int32(root)})
		index[root], low[root] = next, next
		next++
		stack = append(stack, int32(root))
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			v := f.v
			if f.k < len(adj[v]) {
				w := adj[v][f.k].to
				f.k++
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{v: w})
				} else if onStack[w] && index[w] < low[v] {
					low[v] = index[w]
				}
				continue
			}
			call = call[:len(call)-1]
			if len(call) > 0 {
				if p := call[len(call)-1].v; low[v] < low[p] {
					low[p] = low[v]
				}
			}
			if low[v] == index[v] {
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp[w] = ncomp
					if w == v {
						break
					}
				}
				ncomp++
			}
		}
	}
	return comp
}

// bfs finds shortest paths inside one component, reusing its buffers.
type bfs struct {
	mark   []uint32 // visited when equal to stamp
	stamp  uint32
	parent []bfsHop
	queue  []int32
}

type bfsHop struct {
	from int32
	k    int
}

func newBFS(n int) *bfs {
	return &bfs{mark: make([]uint32, n), parent: make([]bfsHop, n)}
}

// path returns the hops of a shortest path from src to dst within src's
// component, or nil.
func (b *bfs) path(adj [][]stateEdge, comp []int32, src, dst int32) []bfsHop {
	b.stamp++
	b.queue = append(b.queue[:0], src)
	b.mark[src] = b.stamp
	if src == dst {
		return []bfsHop{}
	}
	for head := 0; head < len(b.queue); head++ {
		v := b.queue[head]
		for k, se := range adj[v] {
			w := se.to
			if b.mark[w] == b.stamp || comp[w] != comp[src] {
				continue
			}
			b.mark[w] = b.stamp
			b.parent[w] = bfsHop{from: v, k: k}
			if w == dst {
				var hops []bfsHop
				for x := dst; x != src; x = b.parent[x].from {
					hops = append(hops, b.parent[x])
				}
				for i, j := 0, len(hops)-1; i < j; i, j = i+1, j-1 {
					hops[i], hops[j] = hops[j], hops[i]
				}
				return hops
			}
			b.queue = append(b.queue, w)
		}
	}
	return nil
}
