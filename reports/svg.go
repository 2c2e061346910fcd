package reports

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"regexp"
	"sort"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

// Layout constants for the SVG lock graph, in pixels.
const (
	svgMaxNodes   = 60   // beyond this only cycles and their neighbours are drawn
	svgCharWidth  = 7.0  // average width of a 12px sans-serif character
	svgLabelChars = 40   // longer lock names are shortened (the tooltip has all)
	svgNodeHeight = 30.0 //
	svgRowGap     = 26.0
	svgColGap     = 110.0
	svgBandGap    = 44.0 // between components, where their arcs bend
	svgMargin     = 24.0
)

type svgNode struct {
	index  int // in the graph
	comp   int // weakly connected component: drawn as a band of its own
	label  string
	w      float64
	layer  int
	pos    float64 // order within the layer
	x, y   float64 // centre
	arena  bool
	cycle  bool
	misuse bool // a lock with lock-misuse findings
	title  string
	degree int
}

// SVG draws the lock graph as a self-contained SVG image: locks left to
// right in layers by lock order, the edges of reported cycles in red.
// Large graphs are cut down to the cycles and their neighbours.
func SVG(gr *analyzer.Graph) string {
	keep, omitted := svgSelect(gr)
	if len(keep) == 0 {
		return `<svg xmlns="http://www.w3.org/2000/svg" width="320" height="60" viewBox="0 0 320 60" role="img">` +
			`<text x="16" y="34" font-family="sans-serif" font-size="13" fill="#57606a">no lock dependencies were traced</text></svg>`
	}
	nodes := make([]*svgNode, 0, len(keep))
	byIndex := map[int]*svgNode{}
	for _, i := range keep {
		n := gr.Nodes[i]
		sn := &svgNode{index: i, label: shorten(compactName(n.Name), svgLabelChars), arena: n.Type == "allocator lock",
			cycle: n.Cycle, misuse: len(n.Misuse) > 0, title: n.Name + " — " + nodeTooltip(n)}
		if sn.misuse {
			sn.title += "; lock misuse: " + strings.Join(n.Misuse, ", ")
		}
		sn.w = float64(len([]rune(sn.label)))*svgCharWidth + 24
		nodes = append(nodes, sn)
		byIndex[i] = sn
	}
	var edges []analyzer.GraphEdge
	for _, e := range gr.Edges {
		if byIndex[e.From] != nil && byIndex[e.To] != nil && e.From != e.To {
			edges = append(edges, e)
			byIndex[e.From].degree++
			byIndex[e.To].degree++
		}
	}
	svgComponents(nodes, edges, byIndex)
	svgLayers(nodes, edges, byIndex)
	svgOrder(nodes, edges, byIndex)
	width, height := svgPlace(nodes)

	// Edges first, so nodes are drawn over their ends; cycle edges last
	// among them, so they are on top.
	have := map[[2]int]bool{}
	for _, e := range edges {
		have[[2]int{e.From, e.To}] = true
	}
	sort.SliceStable(edges, func(i, j int) bool { return !edges[i].Cycle && edges[j].Cycle })
	var body bytes.Buffer
	ext := extent{minX: 0, minY: 0, maxX: width, maxY: height}
	for _, e := range edges {
		svgEdge(&body, e, byIndex[e.From], byIndex[e.To], have[[2]int{e.To, e.From}], gr, &ext)
	}
	for _, n := range nodes {
		svgNodeOut(&body, n)
	}
	// Curves that bend out of the layout widen the picture.
	dx, dy := math.Max(0, math.Ceil(-ext.minX)), math.Max(0, math.Ceil(-ext.minY))
	width, height = math.Ceil(ext.maxX+dx), math.Ceil(ext.maxY+dy)
	if omitted > 0 {
		height += 18
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="lock graph">`,
		width, height, width, height)
	b.WriteString(`<defs>`)
	for _, m := range []struct{ id, color string }{{"arrow", colorEdge}, {"arrow-cycle", colorCycle}, {"arrow-faint", colorFaint}} {
		fmt.Fprintf(&b, `<marker id="%s" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="%s"/></marker>`, m.id, m.color)
	}
	b.WriteString(`</defs>`)
	fmt.Fprintf(&b, `<g transform="translate(%.0f,%.0f)">`, dx, dy)
	b.Write(body.Bytes())
	b.WriteString(`</g>`)
	if omitted > 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-family="sans-serif" font-size="11" fill="#57606a">%d lock classes off any cycle not drawn</text>`,
			svgMargin, height-8, omitted)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// extent is the box the drawing covers.
type extent struct{ minX, minY, maxX, maxY float64 }

func (e *extent) add(x, y, margin float64) {
	e.minX = math.Min(e.minX, x-margin)
	e.minY = math.Min(e.minY, y-margin)
	e.maxX = math.Max(e.maxX, x+margin)
	e.maxY = math.Max(e.maxY, y+margin)
}

// compactName shortens a lock class name for a graph node: no code
// offsets, shorter words ("mutex init at pool_create (libpool.so)").
func compactName(name string) string {
	name = offsetRE.ReplaceAllString(name, "")
	name = strings.Replace(name, " initialised at ", " init at ", 1)
	return strings.Replace(name, " first taken at ", " taken at ", 1)
}

var offsetRE = regexp.MustCompile(`\+0x[0-9a-f]+`)

// svgSelect picks the nodes to draw: all of them when few, else the ones
// on cycles and their neighbours, up to the cap.
func svgSelect(gr *analyzer.Graph) (keep []int, omitted int) {
	connected := map[int]bool{}
	for _, e := range gr.Edges {
		connected[e.From], connected[e.To] = true, true
	}
	var all []int
	for i := range gr.Nodes {
		if connected[i] {
			all = append(all, i)
		}
	}
	if len(all) <= svgMaxNodes {
		return all, 0
	}
	chosen := map[int]bool{}
	for i, n := range gr.Nodes {
		if n.Cycle && len(chosen) < svgMaxNodes {
			chosen[i] = true
		}
	}
	for _, e := range gr.Edges {
		if len(chosen) >= svgMaxNodes {
			break
		}
		if chosen[e.From] && !chosen[e.To] {
			chosen[e.To] = true
		} else if chosen[e.To] && !chosen[e.From] {
			chosen[e.From] = true
		}
	}
	for _, i := range all {
		if chosen[i] {
			keep = append(keep, i)
		}
	}
	return keep, len(all) - len(keep)
}

// svgComponents numbers the weakly connected components in the order of
// their first node.
func svgComponents(nodes []*svgNode, edges []analyzer.GraphEdge, byIndex map[int]*svgNode) {
	parent := map[int]int{}
	var find func(int) int
	find = func(x int) int {
		if p, ok := parent[x]; ok && p != x {
			r := find(p)
			parent[x] = r
			return r
		}
		return x
	}
	for _, e := range edges {
		a, b := find(e.From), find(e.To)
		if a != b {
			parent[b] = a
		}
	}
	num := map[int]int{}
	for _, n := range nodes {
		r := find(n.index)
		if _, ok := num[r]; !ok {
			num[r] = len(num)
		}
		n.comp = num[r]
	}
}

// svgLayers gives each node a layer: the longest path to it once the
// cycles are broken at the back edges of a depth-first search.
func svgLayers(nodes []*svgNode, edges []analyzer.GraphEdge, byIndex map[int]*svgNode) {
	out := map[int][]int{}
	for _, e := range edges {
		out[e.From] = append(out[e.From], e.To)
	}
	state := map[int]int{} // 0 new, 1 on the stack, 2 done
	back := map[[2]int]bool{}
	var order []int // reverse postorder: a topological order of the DAG
	var visit func(v int)
	visit = func(v int) {
		state[v] = 1
		for _, w := range out[v] {
			switch state[w] {
			case 0:
				visit(w)
			case 1:
				back[[2]int{v, w}] = true
			}
		}
		state[v] = 2
		order = append(order, v)
	}
	// Start from the nodes nothing points to, then any left (cycles).
	indeg := map[int]int{}
	for _, e := range edges {
		indeg[e.To]++
	}
	for _, n := range nodes {
		if indeg[n.index] == 0 && state[n.index] == 0 {
			visit(n.index)
		}
	}
	for _, n := range nodes {
		if state[n.index] == 0 {
			visit(n.index)
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		v := order[i]
		for _, w := range out[v] {
			if !back[[2]int{v, w}] && byIndex[w].layer < byIndex[v].layer+1 {
				byIndex[w].layer = byIndex[v].layer + 1
			}
		}
	}
}

// svgOrder orders each layer by the barycentre of its neighbours, a few
// sweeps each way, to uncross edges.
func svgOrder(nodes []*svgNode, edges []analyzer.GraphEdge, byIndex map[int]*svgNode) {
	layers := map[int][]*svgNode{}
	maxLayer := 0
	for _, n := range nodes {
		layers[n.layer] = append(layers[n.layer], n)
		if n.layer > maxLayer {
			maxLayer = n.layer
		}
	}
	for _, l := range layers {
		sort.SliceStable(l, func(i, j int) bool { return l[i].comp < l[j].comp })
		for i, n := range l {
			n.pos = float64(i)
		}
	}
	nbrs := map[int][]*svgNode{}
	for _, e := range edges {
		nbrs[e.From] = append(nbrs[e.From], byIndex[e.To])
		nbrs[e.To] = append(nbrs[e.To], byIndex[e.From])
	}
	sweep := func(layer, toward int) {
		l := layers[layer]
		bary := map[*svgNode]float64{}
		for _, n := range l {
			sum, cnt := 0.0, 0
			for _, m := range nbrs[n.index] {
				if m.layer == toward {
					sum += m.pos
					cnt++
				}
			}
			if cnt > 0 {
				bary[n] = sum / float64(cnt)
			} else {
				bary[n] = n.pos
			}
		}
		sort.SliceStable(l, func(i, j int) bool {
			if l[i].comp != l[j].comp {
				return l[i].comp < l[j].comp
			}
			return bary[l[i]] < bary[l[j]]
		})
		for i, n := range l {
			n.pos = float64(i)
		}
	}
	for it := 0; it < 4; it++ {
		for layer := 1; layer <= maxLayer; layer++ {
			sweep(layer, layer-1)
		}
		for layer := maxLayer - 1; layer >= 0; layer-- {
			sweep(layer, layer+1)
		}
	}
}

// svgPlace sets coordinates: layers are columns; each component is a
// band of rows, its layers centred within it.
func svgPlace(nodes []*svgNode) (width, height float64) {
	colWidth := map[int]float64{}
	type cl struct{ comp, layer int }
	count := map[cl]int{}
	rank := map[*svgNode]int{} // order within its component's layer
	maxLayer, maxComp := 0, 0
	byPos := append([]*svgNode(nil), nodes...)
	sort.SliceStable(byPos, func(i, j int) bool { return byPos[i].pos < byPos[j].pos })
	for _, n := range byPos {
		if n.w > colWidth[n.layer] {
			colWidth[n.layer] = n.w
		}
		k := cl{n.comp, n.layer}
		rank[n] = count[k]
		count[k]++
		maxLayer = max(maxLayer, n.layer)
		maxComp = max(maxComp, n.comp)
	}
	rows := make([]int, maxComp+1) // rows of each band
	for k, c := range count {
		rows[k.comp] = max(rows[k.comp], c)
	}
	bandTop := make([]float64, maxComp+1)
	y := svgMargin
	for c := 0; c <= maxComp; c++ {
		bandTop[c] = y
		y += float64(rows[c])*(svgNodeHeight+svgRowGap) + svgBandGap
	}
	height = y - svgRowGap - svgBandGap + svgMargin
	colX := map[int]float64{}
	x := svgMargin
	for l := 0; l <= maxLayer; l++ {
		colX[l] = x + colWidth[l]/2
		x += colWidth[l] + svgColGap
	}
	width = x - svgColGap + svgMargin
	for _, n := range nodes {
		c := count[cl{n.comp, n.layer}]
		shift := float64(rows[n.comp]-c) / 2
		n.x = colX[n.layer]
		n.y = bandTop[n.comp] + (float64(rank[n])+shift)*(svgNodeHeight+svgRowGap) + svgNodeHeight/2
	}
	return math.Ceil(width), math.Ceil(height)
}

func svgNodeOut(b *bytes.Buffer, n *svgNode) {
	fill, stroke, width := colorNode, colorEdge, 1.2
	if n.arena {
		fill = colorArena
	}
	dash := ""
	if n.misuse {
		stroke, width, dash = colorMisuse, 2.2, ` stroke-dasharray="5 3"`
	}
	if n.cycle {
		stroke, width = colorCycle, 2.2
	}
	class := "node"
	if n.cycle {
		class += " cycle"
	}
	rx := 8
	if n.arena {
		rx = 2
	}
	fmt.Fprintf(b, `<g class="%s"><title>%s</title><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="%d" fill="%s" stroke="%s" stroke-width="%.1f"%s/>`,
		class, html.EscapeString(n.title), n.x-n.w/2, n.y-svgNodeHeight/2, n.w, svgNodeHeight, rx, fill, stroke, width, dash)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" dominant-baseline="central" font-family="sans-serif" font-size="12" fill="#1f2328">%s</text></g>`,
		n.x, n.y, html.EscapeString(n.label))
}

func svgEdge(b *bytes.Buffer, e analyzer.GraphEdge, from, to *svgNode, reverse bool, gr *analyzer.Graph, ext *extent) {
	// Control point: off the straight line, to the left of the direction
	// of travel, so an edge and its reverse make two arcs; more for edges
	// that go back or stay within a layer.
	dx, dy := to.x-from.x, to.y-from.y
	dist := math.Hypot(dx, dy)
	if dist == 0 {
		return
	}
	bend := 0.0
	if reverse {
		bend = 28
	}
	if to.layer <= from.layer {
		bend = 40 + 0.12*dist
	}
	nx, ny := -dy/dist, dx/dist
	if from.comp > 0 {
		// Below the first band, arcs bend the other way: back edges go
		// under their band, into the gap before the next.
		nx, ny = -nx, -ny
	}
	cx, cy := (from.x+to.x)/2+nx*bend, (from.y+to.y)/2+ny*bend
	x0, y0 := boxExit(from, cx, cy)
	x1, y1 := boxExit(to, cx, cy)
	// The curve's farthest point from the chord is halfway to the control
	// point; its label sits there.
	ext.add(0.25*x0+0.5*cx+0.25*x1, 0.25*y0+0.5*cy+0.25*y1, 16)
	color, marker, width, dash := colorEdge, "arrow", 1.3, ""
	switch {
	case e.Cycle:
		color, marker, width = colorCycle, "arrow-cycle", 2.6
	case e.Arena == "not held":
		color, marker, dash = colorFaint, "arrow-faint", ` stroke-dasharray="5,4"`
	}
	class := "edge"
	if e.Cycle {
		class += " cycle"
	}
	title := gr.Nodes[e.From].Name + " → " + gr.Nodes[e.To].Name
	if l := edgeLabel(e); l != "" {
		title += " (" + l + ")"
	}
	if len(e.Findings) > 0 {
		title += ": " + strings.Join(e.Findings, ", ")
	}
	fmt.Fprintf(b, `<g class="%s"><title>%s</title><path d="M%.1f,%.1f Q%.1f,%.1f %.1f,%.1f" fill="none" stroke="%s" stroke-width="%.1f"%s marker-end="url(#%s)"/>`,
		class, html.EscapeString(title), x0, y0, cx, cy, x1, y1, color, width, dash, marker)
	if l := edgeLabel(e); l != "" {
		mx, my := 0.25*x0+0.5*cx+0.25*x1, 0.25*y0+0.5*cy+0.25*y1
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-family="sans-serif" font-size="10" fill="%s">%s</text>`,
			mx, my-4, color, html.EscapeString(l))
	}
	b.WriteString(`</g>`)
}

// boxExit is where the line from n's centre toward (px, py) leaves n's box.
func boxExit(n *svgNode, px, py float64) (float64, float64) {
	dx, dy := px-n.x, py-n.y
	hw, hh := n.w/2+2, svgNodeHeight/2+2
	if dx == 0 && dy == 0 {
		return n.x, n.y
	}
	t := math.Inf(1)
	if dx != 0 {
		t = math.Min(t, hw/math.Abs(dx))
	}
	if dy != 0 {
		t = math.Min(t, hh/math.Abs(dy))
	}
	return n.x + dx*t, n.y + dy*t
}

// shorten cuts s to n characters with an ellipsis in the middle, keeping
// the object name at the end ("very_long_lock_na…(librcache.so)").
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	head := (n - 1) * 3 / 5
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}
