package analyzer

import "sort"

// Graph is the lock graph at class level: one node per lock class (the
// allocator pseudo-lock included), one edge per pair of classes with at
// least one dependency between their instances. It is what the graph
// reports draw; findings say more about each cycle.
type Graph struct {
	Nodes []GraphNode `json:"nodes"`
	Edges []GraphEdge `json:"edges"`
}

// GraphNode is one lock class.
type GraphNode struct {
	// Name is the class name, as findings print it (without the " #N"
	// that tells instances of one class apart).
	Name string `json:"name"`
	// Key identifies the class across runs and machines, like finding IDs.
	Key string `json:"key"`
	// Type is "mutex", "rwlock", "spinlock" or "allocator lock".
	Type      string `json:"type"`
	Instances int    `json:"instances"`
	// Cycle is set when the class is on a reported lock-order cycle.
	Cycle bool `json:"cycle,omitempty"`
	// Misuse lists the IDs of the class's lock-misuse findings.
	Misuse []string `json:"misuse,omitempty"`
}

// GraphEdge is every dependency From → To between instances of two classes
// (indices into Graph.Nodes).
type GraphEdge struct {
	From int `json:"from"`
	To   int `json:"to"`
	// Dependencies counts the instance-level dependencies merged here.
	Dependencies int `json:"dependencies"`
	// Cycle is set when one of them is on a reported lock-order cycle;
	// Findings lists those cycles' finding IDs.
	Cycle    bool     `json:"cycle,omitempty"`
	Findings []string `json:"findings,omitempty"`
	// Arena, on allocator → lock edges, is the strongest verdict seen on
	// whether the allocator held its lock: "held", "may hold" or "not held"
	// (a "not held" edge takes part in no deadlock).
	Arena string `json:"arena,omitempty"`
	// Read is set when some dependency involves a read lock; Timed when
	// every one was a timed wait.
	Read  bool `json:"read,omitempty"`
	Timed bool `json:"timed,omitempty"`
	// Hook, on a dependency seen only through a memory hook (an allocator
	// call made under From can run a hook that takes To), names the hook:
	// "munmap hook".
	Hook string `json:"hook,omitempty"`
}

// graph builds the class-level lock graph; onCycle maps dependencies to
// the cycle findings they are on; misused are the classes with lock-misuse
// findings (a lock only ever unlocked is a class of its own).
func (a *Analyzer) graph(n *naming, onCycle map[*edge][]string, misused []*misusedClass) *Graph {
	g := &Graph{Nodes: []GraphNode{}, Edges: []GraphEdge{}}
	nodeOf := map[*class]int{}
	byName := map[string]int{}
	for _, c := range n.order {
		nodeOf[c] = len(g.Nodes)
		byName[c.name] = len(g.Nodes)
		g.Nodes = append(g.Nodes, GraphNode{
			Name:      c.name,
			Key:       c.key,
			Type:      c.instances[0].typ.word(),
			Instances: c.weight(),
		})
	}
	for _, c := range misused {
		i, ok := byName[c.name]
		if !ok {
			i = len(g.Nodes)
			g.Nodes = append(g.Nodes, GraphNode{Name: c.name, Key: c.key, Type: c.typ.word(), Instances: 1})
		}
		g.Nodes[i].Misuse = c.ids
	}
	type pair struct{ from, to int }
	edgeOf := map[pair]int{}
	timedOnly := map[int]bool{}
	for _, ed := range a.edgeList {
		cf, ct := n.class[ed.from.id], n.class[ed.to.id]
		if cf == nil || ct == nil {
			continue
		}
		p := pair{nodeOf[cf], nodeOf[ct]}
		i, ok := edgeOf[p]
		if !ok {
			i = len(g.Edges)
			edgeOf[p] = i
			g.Edges = append(g.Edges, GraphEdge{From: p.from, To: p.to})
			timedOnly[i] = true
		}
		ge := &g.Edges[i]
		ge.Dependencies += int(ed.weight)
		for _, id := range onCycle[ed] {
			ge.Cycle = true
			ge.Findings = appendUnique(ge.Findings, id)
		}
		for dt := depType(0); dt < depTypes; dt++ {
			s := ed.seen[dt]
			if s == nil {
				continue
			}
			if s.read || s.heldRead {
				ge.Read = true
			}
			if !s.timed {
				timedOnly[i] = false
			}
			if s.link != nil && ge.Hook == "" {
				ge.Hook = hookName(s.link.take.via)
			}
			if ed.from.typ == typeArena && (ge.Arena == "" || s.hold > holdOf(ge.Arena)) {
				ge.Arena = s.hold.String()
			}
		}
	}
	for i := range g.Edges {
		e := &g.Edges[i]
		e.Timed = timedOnly[i]
		sort.Strings(e.Findings)
		if e.Cycle {
			g.Nodes[e.From].Cycle = true
			g.Nodes[e.To].Cycle = true
		}
	}
	return g
}

func holdOf(s string) arenaHold {
	for h := holdNotHeld; h <= holdHeld; h++ {
		if h.String() == s {
			return h
		}
	}
	return holdNone
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}
