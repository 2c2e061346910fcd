package reports

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
)

// junitDoc is how a test reporter reads JUnit XML.
type junitDoc struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Skipped  int      `xml:"skipped,attr"`
	Suites   []struct {
		Name       string `xml:"name,attr"`
		Tests      int    `xml:"tests,attr"`
		Failures   int    `xml:"failures,attr"`
		Skipped    int    `xml:"skipped,attr"`
		Properties []struct {
			Name  string `xml:"name,attr"`
			Value string `xml:"value,attr"`
		} `xml:"properties>property"`
		Cases []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Type    string `xml:"type,attr"`
				Body    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			SystemOut string `xml:"system-out"`
		} `xml:"testcase"`
		SystemOut string `xml:"system-out"`
	} `xml:"testsuite"`
}

func parseJUnit(t *testing.T, data []byte) junitDoc {
	t.Helper()
	var doc junitDoc
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("JUnit XML does not parse: %v\n%s", err, data)
	}
	return doc
}

// TestJUnitParsesBack: one test case per finding ID (and per fixed one),
// failures carry the finding's text report, suppressed cases are skipped,
// the counts add up.
func TestJUnitParsesBack(t *testing.T) {
	for _, c := range gateCases()[1:] {
		g := mustJudge(t, c)
		doc := parseJUnit(t, renderCase(t, c, "junit"))
		if len(doc.Suites) != 1 {
			t.Fatalf("%s: %d suites", c.name, len(doc.Suites))
		}
		s := doc.Suites[0]
		if s.Tests != len(g.Findings)+len(g.Fixed) || len(s.Cases) != s.Tests || doc.Tests != s.Tests {
			t.Errorf("%s: %d tests, %d cases, for %d findings + %d fixed", c.name, s.Tests, len(s.Cases), len(g.Findings), len(g.Fixed))
		}
		failures, skipped := 0, 0
		for i, tc := range s.Cases {
			if i >= len(g.Findings) {
				if tc.Failure != nil || !strings.HasPrefix(tc.SystemOut, "fixed:") {
					t.Errorf("%s: fixed case %+v", c.name, tc)
				}
				continue
			}
			j := &g.Findings[i]
			if tc.Name != j.ID || tc.Classname != "hooktrace."+string(j.Kind) {
				t.Errorf("%s: case %q/%q for %s", c.name, tc.Name, tc.Classname, j.ID)
			}
			if (tc.Failure != nil) != j.Fails {
				t.Errorf("%s: %s failure=%v, fails=%v", c.name, j.ID, tc.Failure != nil, j.Fails)
			}
			if tc.Failure != nil {
				failures++
				if tc.Failure.Message != j.Title || !strings.Contains(tc.Failure.Body, j.ID) ||
					!strings.Contains(tc.Failure.Body, "taken here:") || !strings.Contains(tc.Failure.Body, "#1  ") {
					t.Errorf("%s: failure of %s lacks the text report:\n%s", c.name, j.ID, tc.Failure.Body)
				}
			}
			if tc.Skipped != nil {
				skipped++
				if j.Suppressed == nil || !strings.Contains(tc.Skipped.Message, j.Suppressed.Reason) {
					t.Errorf("%s: skipped %s: %q", c.name, j.ID, tc.Skipped.Message)
				}
			}
		}
		if failures != s.Failures || skipped != s.Skipped || doc.Failures != failures {
			t.Errorf("%s: counted %d failures %d skipped; attributes say %d/%d", c.name, failures, skipped, s.Failures, s.Skipped)
		}
	}
	// regress-gate: one failure (the new inversion), one skipped (the
	// suppressed hook lock), the unused suppression in system-out.
	doc := parseJUnit(t, renderCase(t, gateCases()[2], "junit"))
	if doc.Failures != 1 || doc.Skipped != 1 || !strings.Contains(doc.Suites[0].SystemOut, "unused suppression") {
		t.Errorf("regress-gate: %d failures, %d skipped, system-out %q", doc.Failures, doc.Skipped, doc.Suites[0].SystemOut)
	}
	// No findings: one passing case.
	var buf bytes.Buffer
	res := openMPISeed(true)
	res.Findings = nil
	if err := JUnit(&buf, plain(res)); err != nil {
		t.Fatal(err)
	}
	if doc := parseJUnit(t, buf.Bytes()); doc.Tests != 1 || doc.Failures != 0 {
		t.Errorf("empty: %+v", doc)
	}
}

// TestMarkdownShort: the PR comment names the verdict, the cycle and top
// frames, and stays short; it escapes what Markdown would eat.
func TestMarkdownShort(t *testing.T) {
	md := string(renderCase(t, gateCases()[2], "markdown"))
	for _, want := range []string{
		"## hooktrace: 1 new problem found",
		"**FAIL**",
		"1 new, 2 still present, 1 fixed since `seed.json`",
		"**Cycle:** `mutex initialised at pool_create+0x10 (libpool.so)` → `mutex initialised at cache_create+0x10 (libpool.so)` → ",
		"cache_fill (/src/app/pool/cache.c:19)",
		"pool_put (/src/app/pool/pool.c:77)",
		"**Fixed since the baseline:**",
		"**Unused suppressions**",
		"pool\\_create", // escaped outside code spans
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if strings.Contains(md, "pthread_mutex_lock+") {
		t.Error("markdown shows lock internals as top frames")
	}
	if len(md) > 4000 {
		t.Errorf("markdown is %d bytes: too long for a comment", len(md))
	}
	// Fenced blocks are balanced.
	if strings.Count(md, "```")%2 != 0 {
		t.Error("unbalanced code fences")
	}
	pass := string(renderCase(t, gateCase{"x", "regress", func(t *testing.T) Options {
		o := plainOpts(t)
		o.FailOn = "none"
		return o
	}, nil}, "markdown"))
	if !strings.Contains(pass, "**PASS**") || strings.Contains(pass, "### ") {
		t.Errorf("a passing gate shows details:\n%s", pass)
	}
}

var (
	dotNode = regexp.MustCompile(`^  (n\d+) \[(.*)\];$`)
	dotEdge = regexp.MustCompile(`^  (n\d+) -> (n\d+)( \[(.*)\])?;$`)
)

// TestDOT: every edge joins declared nodes; exactly the cycle edges are
// red; strings are quoted.
func TestDOT(t *testing.T) {
	g := mustJudge(t, gateCases()[1])
	dot := string(renderCase(t, gateCases()[1], "dot"))
	lines := strings.Split(strings.TrimSpace(dot), "\n")
	if lines[0] != "digraph hooktrace {" || lines[len(lines)-1] != "}" {
		t.Fatalf("not a digraph:\n%s", dot)
	}
	nodes := map[string]bool{}
	red := 0
	edges := 0
	for _, l := range lines[1 : len(lines)-1] {
		if m := dotNode.FindStringSubmatch(l); m != nil {
			nodes[m[1]] = true
			continue
		}
		if m := dotEdge.FindStringSubmatch(l); m != nil {
			edges++
			if !nodes[m[1]] || !nodes[m[2]] {
				t.Errorf("edge to an undeclared node: %s", l)
			}
			if strings.Contains(m[4], colorCycle) {
				red++
			}
			continue
		}
		if !strings.HasPrefix(l, "  graph [") && !strings.HasPrefix(l, "  node [") && !strings.HasPrefix(l, "  edge [") {
			t.Errorf("unexpected line %q", l)
		}
	}
	gr := g.Result.Graph
	cycles := 0
	for _, e := range gr.Edges {
		if e.Cycle {
			cycles++
		}
	}
	if len(nodes) != len(gr.Nodes) || edges != len(gr.Edges) || red != cycles || cycles != 4 {
		t.Errorf("%d nodes, %d edges, %d red; graph has %d, %d, %d on cycles", len(nodes), edges, red, len(gr.Nodes), len(gr.Edges), cycles)
	}
	if !strings.Contains(dot, `label="vma_lock (librcache.so)"`) || !strings.Contains(dot, `style=dashed`) {
		t.Errorf("labels or the not-held edge missing:\n%s", dot)
	}
	if dotString(`a "b" \c`) != `"a \"b\" \\c"` {
		t.Error("dotString escaping")
	}
}

// TestSVG: the graph is well-formed XML with one shape per node and one
// path per edge, red paths for cycle edges, and no node overlapping
// another.
func TestSVG(t *testing.T) {
	gr := mustJudge(t, gateCases()[1]).Result.Graph
	svg := SVG(gr)
	dec := xml.NewDecoder(strings.NewReader(svg))
	type box struct{ x, y, w, h float64 }
	var rects []box
	paths, redPaths := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("SVG is not XML: %v\n%s", err, svg)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := map[string]string{}
		for _, a := range se.Attr {
			attr[a.Name.Local] = a.Value
		}
		switch se.Name.Local {
		case "rect":
			var b box
			for _, p := range []struct {
				k string
				v *float64
			}{{"x", &b.x}, {"y", &b.y}, {"width", &b.w}, {"height", &b.h}} {
				if err := json.Unmarshal([]byte(attr[p.k]), p.v); err != nil {
					t.Fatalf("rect %s=%q", p.k, attr[p.k])
				}
			}
			rects = append(rects, b)
		case "path":
			if attr["marker-end"] == "" {
				continue // the arrowheads
			}
			paths++
			if attr["stroke"] == colorCycle {
				redPaths++
			}
		}
	}
	// Locks with no dependency are not drawn.
	connected := map[int]bool{}
	for _, e := range gr.Edges {
		connected[e.From], connected[e.To] = true, true
	}
	if len(rects) != len(connected) || len(connected) >= len(gr.Nodes) || paths != len(gr.Edges) || redPaths != 4 {
		t.Errorf("%d rects, %d paths (%d red) for %d connected nodes of %d, %d edges", len(rects), paths, redPaths, len(connected), len(gr.Nodes), len(gr.Edges))
	}
	for i := range rects {
		for j := i + 1; j < len(rects); j++ {
			a, b := rects[i], rects[j]
			if a.x < b.x+b.w && b.x < a.x+a.w && a.y < b.y+b.h && b.y < a.y+a.h {
				t.Errorf("nodes %d and %d overlap: %+v %+v", i, j, a, b)
			}
		}
	}
	if !strings.Contains(SVG(&analyzerGraphEmpty), "no lock dependencies") {
		t.Error("empty graph")
	}
}

// TestPerfetto: the timeline is Chrome trace-event JSON that nests: every
// slice on a thread ends before or with its parent, named threads have
// their names, each finding is an instant on its edges' threads.
func TestPerfetto(t *testing.T) {
	data := perfettoOf(t, "regress")
	var doc struct {
		DisplayTimeUnit string `json:"displayTimeUnit"`
		TraceEvents     []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Ts   float64        `json:"ts"`
			Dur  *float64       `json:"dur"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			S    string         `json:"s"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if doc.DisplayTimeUnit != "ns" || len(doc.TraceEvents) == 0 {
		t.Fatal("empty timeline")
	}
	type slice struct{ start, end float64 }
	perThread := map[[2]int][]slice{}
	threadNames := map[string]bool{}
	findings := map[string]int{}
	names := map[string]bool{}
	for _, e := range doc.TraceEvents {
		names[e.Name] = true
		switch e.Ph {
		case "M":
			if e.Name == "thread_name" {
				threadNames[e.Args["name"].(string)] = true
			}
		case "X":
			if e.Dur == nil || *e.Dur < 0 || e.Ts < 0 {
				t.Errorf("bad slice %+v", e)
				continue
			}
			k := [2]int{e.Pid, e.Tid}
			perThread[k] = append(perThread[k], slice{e.Ts, e.Ts + *e.Dur})
		case "i":
			if e.S != "t" && e.S != "p" && e.S != "g" {
				t.Errorf("instant scope %q", e.S)
			}
			if e.Cat == "finding" {
				findings[e.Args["id"].(string)]++
			}
		default:
			t.Errorf("unexpected phase %q", e.Ph)
		}
	}
	// Slices on one thread nest: sorted by start (longer first), each
	// starts after the previous ends or ends within it.
	for k, ss := range perThread {
		sort.Slice(ss, func(i, j int) bool {
			if ss[i].start != ss[j].start {
				return ss[i].start < ss[j].start
			}
			return ss[i].end > ss[j].end
		})
		var stack []slice
		for _, s := range ss {
			for len(stack) > 0 && stack[len(stack)-1].end <= s.start {
				stack = stack[:len(stack)-1]
			}
			if len(stack) > 0 && s.end > stack[len(stack)-1].end+1e-9 {
				t.Errorf("thread %v: slice %+v overlaps %+v without nesting", k, s, stack[len(stack)-1])
			}
			stack = append(stack, s)
		}
	}
	for _, n := range []string{"mpi-send", "progress", "reaper", "alloc-1", "evictor", "main"} {
		if !threadNames[n] {
			t.Errorf("no thread_name %q", n)
		}
	}
	for _, n := range []string{
		"hold vma_lock (librcache.so)", "hold queue_mutex (app)", "pthread_cond_wait", "progress_loop",
		"malloc", "calloc", "free", "madvise (inside free)", "hold stats_lock (libstats.so)",
		"create thread 12", "thread_exit",
	} {
		if !names[n] {
			t.Errorf("timeline lacks %q", n)
		}
	}
	res := analyzeFixture(t, "regress")
	for _, f := range res.Findings {
		if findings[f.ID] != len(f.Edges) {
			t.Errorf("finding %s: %d instants for %d edges", f.ID, findings[f.ID], len(f.Edges))
		}
	}
	// The inversion's unlocks were out of order (pool, then cache): the
	// cache hold is cut and continued.
	if !bytes.Contains(data, []byte(`"continued":true`)) {
		t.Error("no continued slice for the out-of-order unlock")
	}
	// Two traces: both processes, distinct pids although both are 4000.
	two := perfettoOf(t, "seed", "regress")
	var doc2 struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Pid  int            `json:"pid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(two, &doc2); err != nil {
		t.Fatal(err)
	}
	procs := map[int]string{}
	for _, e := range doc2.TraceEvents {
		if e.Ph == "M" && e.Name == "process_name" {
			procs[e.Pid] = e.Args["name"].(string)
		}
	}
	if len(procs) != 2 {
		t.Errorf("two traces of pid 4000: processes %v", procs)
	}
}

var analyzerGraphEmpty = analyzer.Graph{}

// TestUnrecordedProcessesReported: processes that could not record make
// the report incomplete, and every format with stats says how many.
func TestUnrecordedProcessesReported(t *testing.T) {
	g := mustJudge(t, gateCases()[0])
	st := &g.Result.Stats
	st.UnrecordedProcesses, st.Complete, st.Incomplete = 3, false, "3 processes could not record"
	for format, want := range map[string]string{
		"text":     "0 lost events, 3 processes could not record,",
		"json":     `"unrecorded_processes": 3`,
		"sarif":    `"unrecorded_processes": 3`,
		"junit":    `<property name="unrecorded_processes" value="3">`,
		"markdown": "**Incomplete trace:** 3 processes could not record",
		"html":     "lost, 3 processes could not record,",
	} {
		var buf bytes.Buffer
		if err := Render(&buf, format, g); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%s report lacks %q:\n%s", format, want, buf.String())
		}
	}
}
