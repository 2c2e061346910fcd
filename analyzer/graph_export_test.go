package analyzer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// TestGraph: the class graph has every dependency once, with the cycle
// edges flagged by the findings they are on, and stays out of the JSON.
func TestGraph(t *testing.T) {
	b := named(tracebuild.New(100, nil))
	// A → B and B → A: an inversion. A → C: no cycle.
	lk(b, 1, lockA, "f1")
	lk(b, 1, lockB, "f2")
	lk(b, 1, lockC, "f3")
	b.Unlock(1, lockC).Unlock(1, lockB).Unlock(1, lockA)
	lk(b, 2, lockB, "g1")
	lk(b, 2, lockA, "g2")
	b.Unlock(2, lockA).Unlock(2, lockB)
	// The seed bug: vma_lock ⇄ the arena, and a hook path that does not
	// hold the arena lock.
	openMPIThreadA(b, 3)
	openMPIThreadB(b, 4, shrinkHeapHookStack...)
	b.Footer(nil)
	res := analyze(Options{}, b)

	g := res.Graph
	if g == nil {
		t.Fatal("no graph")
	}
	names := map[string]int{}
	for i, n := range g.Nodes {
		names[n.Name] = i
	}
	edge := func(from, to string) *GraphEdge {
		fi, ok1 := names[from]
		ti, ok2 := names[to]
		if !ok1 || !ok2 {
			t.Fatalf("nodes %q or %q missing: %+v", from, to, g.Nodes)
		}
		for i := range g.Edges {
			if g.Edges[i].From == fi && g.Edges[i].To == ti {
				return &g.Edges[i]
			}
		}
		return nil
	}
	cycleIDs := map[string]bool{}
	for _, f := range ofKind(res, KindLockOrderCycle) {
		cycleIDs[f.ID] = true
	}
	if len(cycleIDs) != 2 {
		t.Fatalf("want 2 cycle findings, got %d", len(cycleIDs))
	}
	for _, c := range []struct {
		from, to string
		cycle    bool
		arena    string
	}{
		{"lock_a (libx.so)", "lock_b (libx.so)", true, ""},
		{"lock_b (libx.so)", "lock_a (libx.so)", true, ""},
		{"lock_a (libx.so)", "lock_c (libx.so)", false, ""},
		{"lock_b (libx.so)", "lock_c (libx.so)", false, ""},
		{"vma_lock (librcache.so)", "glibc malloc arena", true, ""},
		{"glibc malloc arena", "vma_lock (librcache.so)", true, "held"},
	} {
		e := edge(c.from, c.to)
		if e == nil {
			t.Errorf("no edge %s → %s", c.from, c.to)
			continue
		}
		if e.Cycle != c.cycle || e.Arena != c.arena || e.Dependencies != 1 {
			t.Errorf("%s → %s: %+v", c.from, c.to, *e)
		}
		if e.Cycle && (len(e.Findings) != 1 || !cycleIDs[e.Findings[0]]) {
			t.Errorf("%s → %s: findings %v", c.from, c.to, e.Findings)
		}
	}
	if len(g.Edges) != 6 {
		t.Errorf("%d edges, want 6: %+v", len(g.Edges), g.Edges)
	}
	if n := g.Nodes[names["lock_c (libx.so)"]]; n.Cycle || n.Type != "mutex" || n.Instances != 1 {
		t.Errorf("lock_c node %+v", n)
	}
	if n := g.Nodes[names["glibc malloc arena"]]; !n.Cycle || n.Type != "allocator lock" {
		t.Errorf("arena node %+v", n)
	}
	out, _ := json.Marshal(res)
	if strings.Contains(string(out), `"graph"`) || strings.Contains(string(out), `"nodes"`) {
		t.Error("the graph leaked into the JSON report")
	}
	// Reading the result again gives the same graph.
	again := analyze(Options{}, b)
	a1, _ := json.Marshal(res.Graph)
	a2, _ := json.Marshal(again.Graph)
	if string(a1) != string(a2) {
		t.Error("graph not deterministic")
	}
}
