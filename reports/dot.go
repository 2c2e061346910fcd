package reports

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

// Colours shared by the DOT and SVG graphs.
const (
	colorCycle  = "#d1242f" // edges and locks on a reported cycle
	colorEdge   = "#57606a"
	colorFaint  = "#a0a7b0" // allocator edges that cannot deadlock
	colorArena  = "#f3eee0"
	colorNode   = "#ffffff"
	colorMisuse = "#bc4c00" // locks with lock-misuse findings
)

// DOT writes the lock graph in Graphviz's language: one node per lock
// class, one edge per dependency between classes, the edges of reported
// cycles in red and bold, allocator edges on which the allocator does not
// hold its lock dashed.
func DOT(w io.Writer, g *Gate) error {
	gr := graphOf(g.Result)
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	c := g.Counts()
	p("digraph hooktrace {\n")
	p("  graph [rankdir=LR, labelloc=t, fontname=\"Helvetica\", label=%s];\n",
		dotString(fmt.Sprintf("hooktrace lock graph: %s, %s, %s", plural(len(gr.Nodes), "lock class"),
			plural(len(gr.Edges), "dependency"), plural(c.Findings, "finding"))))
	p("  node [shape=box, style=\"rounded,filled\", fillcolor=%q, fontname=\"Helvetica\", fontsize=11];\n", colorNode)
	p("  edge [color=%q, fontname=\"Helvetica\", fontsize=9];\n", colorEdge)
	gates := gateNodes(g.Result)
	for i, n := range gr.Nodes {
		attrs := []string{"label=" + dotString(n.Name), "tooltip=" + dotString(nodeTooltip(n))}
		if ids := gates[n.Name]; len(ids) > 0 {
			// A guarded cycle's gate: a double border, and which cycles it guards.
			attrs[0] = "label=" + dotString(n.Name+"\n(gate)")
			attrs[1] = "tooltip=" + dotString(nodeTooltip(n)+"; gate of "+strings.Join(ids, ", "))
			attrs = append(attrs, "peripheries=2")
		}
		if n.Type == "allocator lock" {
			attrs = append(attrs, "shape=box", "style=\"filled\"", fmt.Sprintf("fillcolor=%q", colorArena))
		}
		if len(n.Misuse) > 0 {
			// Misused: a dashed border, and which findings say how.
			attrs[1] = "tooltip=" + dotString(nodeTooltip(n)+"; lock misuse: "+strings.Join(n.Misuse, ", "))
			attrs = append(attrs, "style=\"rounded,filled,dashed\"", fmt.Sprintf("color=%q", colorMisuse), "penwidth=2")
		}
		if n.Cycle {
			attrs = append(attrs, fmt.Sprintf("color=%q", colorCycle), "penwidth=2")
		}
		p("  n%d [%s];\n", i, strings.Join(attrs, ", "))
	}
	for _, e := range gr.Edges {
		var attrs []string
		if l := edgeLabel(e); l != "" {
			attrs = append(attrs, "label="+dotString(l))
		}
		switch {
		case e.Cycle:
			attrs = append(attrs, fmt.Sprintf("color=%q", colorCycle), fmt.Sprintf("fontcolor=%q", colorCycle), "penwidth=2.5")
			attrs = append(attrs, "tooltip="+dotString("on "+strings.Join(e.Findings, ", ")))
		case e.Arena == "not held":
			attrs = append(attrs, "style=dashed", fmt.Sprintf("color=%q", colorFaint))
		}
		if e.Timed {
			attrs = append(attrs, "arrowhead=empty")
		}
		if len(attrs) > 0 {
			p("  n%d -> n%d [%s];\n", e.From, e.To, strings.Join(attrs, ", "))
		} else {
			p("  n%d -> n%d;\n", e.From, e.To)
		}
	}
	p("}\n")
	return bw.Flush()
}

func nodeTooltip(n analyzer.GraphNode) string {
	return n.Type + ", " + plural(n.Instances, "instance")
}

// edgeLabel says what is special about an edge: how often, and how.
func edgeLabel(e analyzer.GraphEdge) string {
	var parts []string
	if e.Dependencies > 1 {
		parts = append(parts, fmt.Sprintf("×%d", e.Dependencies))
	}
	if e.Arena != "" {
		parts = append(parts, "arena "+e.Arena)
	}
	if e.Hook != "" {
		parts = append(parts, "through "+e.Hook)
	}
	if e.Read {
		parts = append(parts, "read")
	}
	if e.Timed {
		parts = append(parts, "timed")
	}
	return strings.Join(parts, ", ")
}

var dotEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func dotString(s string) string { return `"` + dotEscaper.Replace(s) + `"` }

// graphOf is the result's lock graph or, for a result without one (read
// back from JSON), the graph of its findings' edges.
func graphOf(res *analyzer.Result) *analyzer.Graph {
	if res.Graph != nil {
		return res.Graph
	}
	g := &analyzer.Graph{}
	node := map[string]int{}
	nodeOf := func(name string) int {
		name = className(name)
		if i, ok := node[name]; ok {
			return i
		}
		node[name] = len(g.Nodes)
		typ := "mutex"
		if strings.Contains(name, "arena") || strings.HasSuffix(name, " allocator") {
			typ = "allocator lock"
		}
		g.Nodes = append(g.Nodes, analyzer.GraphNode{Name: name, Key: name, Type: typ, Instances: 1})
		return node[name]
	}
	type pair struct{ a, b int }
	edge := map[pair]int{}
	for _, f := range res.Findings {
		if f.Kind == analyzer.KindLockMisuse && len(f.Locks) > 0 {
			n := &g.Nodes[nodeOf(f.Locks[0])]
			n.Misuse = append(n.Misuse, f.ID)
			continue
		}
		if f.Kind != analyzer.KindLockOrderCycle && f.Kind != analyzer.KindDeadlock && f.Kind != analyzer.KindHookLock {
			continue
		}
		cycle := f.Kind != analyzer.KindHookLock
		for _, e := range f.Edges {
			p := pair{nodeOf(e.From), nodeOf(e.To)}
			i, ok := edge[p]
			if !ok {
				i = len(g.Edges)
				edge[p] = i
				g.Edges = append(g.Edges, analyzer.GraphEdge{From: p.a, To: p.b, Dependencies: 1, Arena: e.Arena})
			}
			if cycle {
				g.Edges[i].Cycle = true
				g.Edges[i].Findings = append(g.Edges[i].Findings, f.ID)
				g.Nodes[p.a].Cycle, g.Nodes[p.b].Cycle = true, true
			}
		}
	}
	return g
}

// gateNodes maps each guarded cycle's gate to the findings it guards, by
// the gate's class name (an instance label's " #n" dropped).
func gateNodes(res *analyzer.Result) map[string][]string {
	out := map[string][]string{}
	for _, f := range res.Findings {
		if f.Gate == "" {
			continue
		}
		name := f.Gate
		if i := strings.LastIndex(name, " #"); i > 0 {
			name = name[:i]
		}
		out[name] = append(out[name], f.ID)
	}
	return out
}
