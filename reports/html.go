package reports

import (
	"html/template"
	"io"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

// HTML writes the gate as one self-contained page: the verdict, the lock
// graph as inline SVG, then every finding with its cycle, explanation,
// scenario and stacks. It loads nothing (no scripts, fonts or images from
// elsewhere), so it opens offline and can be kept as a CI artifact.
func HTML(w io.Writer, g *Gate) error {
	res := g.Result
	c := g.Counts()
	page := htmlPage{
		Gate:     g,
		Counts:   c,
		Verdict:  "PASS",
		Headline: mdHeadline(g, c),
		Stats:    &res.Stats,
		Calls:    callsText(res.Stats.Calls),
		Graph:    template.HTML(SVG(graphOf(res))), // built from escaped parts
		FailOn:   failOnText(g),
	}
	if g.Fails() {
		page.Verdict = "FAIL"
	}
	for i := range g.Findings {
		page.Findings = append(page.Findings, htmlFinding{Judged: &g.Findings[i], N: i + 1})
	}
	return htmlTemplate.Execute(w, page)
}

type htmlPage struct {
	Gate     *Gate
	Counts   Counts
	Verdict  string
	Headline string
	Stats    *analyzer.Stats
	Calls    string
	Graph    template.HTML
	FailOn   string
	Findings []htmlFinding
}

type htmlFinding struct {
	*Judged
	N int
}

// Cycle is the finding's cycle, "a → b → a", or "".
func (f htmlFinding) Cycle() string {
	if (f.Kind != analyzer.KindLockOrderCycle && f.Kind != analyzer.KindDeadlock) || len(f.Locks) == 0 {
		return ""
	}
	return strings.Join(append(append([]string(nil), f.Locks...), f.Locks[0]), " → ")
}

// ScenarioTable is the interleaving as rows of one cell per thread.
type ScenarioTable struct {
	Cols []string
	Rows [][]string
}

// Scenario is the finding's interleaving as a table.
func (f htmlFinding) Scenario() ScenarioTable {
	var t ScenarioTable
	col := map[string]int{}
	for _, s := range f.Finding.Scenario {
		if _, ok := col[s.Thread]; !ok {
			col[s.Thread] = len(t.Cols)
			t.Cols = append(t.Cols, "Thread "+s.Thread)
		}
	}
	for _, s := range f.Finding.Scenario {
		row := make([]string, len(t.Cols))
		row[col[s.Thread]] = s.Action
		t.Rows = append(t.Rows, row)
	}
	return t
}

// Open says whether the finding starts unfolded: failing ones do.
func (f htmlFinding) Open() bool { return f.Fails }

// Anchor is the finding's element ID.
func (f htmlFinding) Anchor() string { return "finding-" + f.ID }

var htmlFuncs = template.FuncMap{
	"frame":  FrameText,
	"thread": threadLabel,
	"taken":  takenLabel,
	"held":   heldLabel,
	"plural": plural,
	"inc":    func(i int) int { return i + 1 },
	"sev":    func(s analyzer.Severity) string { return string(s) },
	"exit": func(st *analyzer.Stats) string {
		return strings.TrimPrefix(exitText(st), ", ")
	},
	"unrecorded": unrecordedText,
}

var htmlTemplate = template.Must(template.New("report").Funcs(htmlFuncs).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hooktrace: {{.Headline}}</title>
<style>
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 0; background: #f6f8fa; }
main { max-width: 1200px; margin: 0 auto; padding: 24px; }
h1 { font-size: 24px; margin: 0 0 8px; }
h2 { font-size: 18px; margin: 28px 0 10px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 600; color: #fff; margin-right: 8px; }
.verdict.FAIL { background: #d1242f; } .verdict.PASS { background: #1a7f37; }
.box { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 16px; margin: 10px 0; }
.warn { border-color: #d4a72c; background: #fff8c5; }
.graph { overflow-x: auto; background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: 4px 10px; border-bottom: 1px solid #d0d7de; vertical-align: top; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #f6f8fa; padding: 8px; border-radius: 6px; overflow-x: auto; margin: 4px 0 10px; }
details.finding { background: #fff; border: 1px solid #d0d7de; border-left: 4px solid #8c959f; border-radius: 6px; margin: 10px 0; padding: 8px 14px; }
details.finding.error { border-left-color: #d1242f; } details.finding.warning { border-left-color: #d4a72c; }
details.finding.fails { box-shadow: 0 0 0 1px #d1242f; }
summary { cursor: pointer; font-weight: 600; }
.sev { text-transform: uppercase; font-size: 11px; padding: 1px 6px; border-radius: 4px; background: #eaeef2; margin-right: 6px; }
.sev.error { background: #ffebe9; color: #a40e26; } .sev.warning { background: #fff8c5; color: #7d4e00; }
.tag { font-size: 11px; padding: 1px 6px; border-radius: 4px; background: #ddf4ff; color: #0969da; margin-left: 6px; }
.tag.fail { background: #d1242f; color: #fff; }
.muted { color: #57606a; }
.cycle { color: #a40e26; font-weight: 600; }
ol.stack { margin: 4px 0 10px; padding-left: 34px; }
ol.stack li { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
</style>
</head>
<body>
<main>
<h1><span class="verdict {{.Verdict}}">{{.Verdict}}</span>hooktrace: {{.Headline}}</h1>
<p class="muted">{{plural .Counts.Findings "finding"}} · fail on {{.FailOn}}{{if .Gate.HasBaseline}} · baseline {{.Gate.BaselineName}}: {{.Counts.New}} new{{if .Counts.Updated}}, {{.Counts.Updated}} more severe{{end}}, {{.Counts.Unchanged}} still present, {{.Counts.Fixed}} fixed{{end}}{{if .Gate.HasSuppress}} · {{.Counts.Suppressed}} suppressed{{end}}{{if .Gate.Tool}} · {{.Gate.Tool}}{{end}}</p>
{{if not .Stats.Complete}}<div class="box warn"><strong>Incomplete trace:</strong> {{.Stats.Incomplete}} — findings may be missing (and lost unlocks can make false ones).</div>{{end}}
<div class="box">
<div>{{.Stats.Events}} events, {{.Stats.LostEvents}} lost{{unrecorded .Stats}}, {{plural .Stats.Threads "thread"}}, {{plural .Stats.Locks "lock"}} in {{plural .Stats.LockClasses "class"}}, {{plural .Stats.Dependencies "lock dependency"}}{{with exit .Stats}}, {{.}}{{end}}</div>
<div class="mono muted">calls: {{.Calls}}</div>
{{range .Stats.Warnings}}<div>warning: {{.}}</div>{{end}}
{{if gt (len .Stats.Traces) 1}}<table>{{range .Stats.Traces}}<tr><td class="mono">{{.Source}}</td><td>pid {{.PID}}</td><td>{{.Events}} events</td><td>{{if .Complete}}complete{{else}}INCOMPLETE: {{.Incomplete}}{{end}}</td></tr>{{end}}</table>{{end}}
</div>

<h2>Lock graph</h2>
<p class="muted">Each arrow A → B: B was taken while A was held. Red: on a reported cycle. Dashed: an allocator path that does not hold its lock.</p>
<div class="graph">{{.Graph}}</div>

<h2>Findings</h2>
{{if .Findings}}<table>
<tr><th>#</th><th>severity</th><th>verdict</th><th>finding</th><th>id</th></tr>
{{range .Findings}}<tr><td>{{.N}}</td><td><span class="sev {{sev .Severity}}">{{sev .Severity}}</span></td><td>{{if .Fails}}<span class="tag fail">FAIL</span>{{end}}{{with .State}}<span class="tag">{{.}}</span>{{end}}{{if .Suppressed}}<span class="tag">suppressed</span>{{end}}</td><td><a href="#{{.Anchor}}">{{.Title}}</a></td><td class="mono">{{.ID}}</td></tr>
{{end}}</table>
{{range .Findings}}
<details class="finding {{sev .Severity}}{{if .Fails}} fails{{end}}" id="{{.Anchor}}"{{if .Open}} open{{end}}>
<summary><span class="sev {{sev .Severity}}">{{sev .Severity}}</span>{{.Title}}{{if .Fails}}<span class="tag fail">FAIL</span>{{end}}{{with .State}}<span class="tag">{{.}}</span>{{end}}{{if .Suppressed}}<span class="tag">suppressed</span>{{end}}</summary>
<p class="mono muted">{{.ID}} · {{.Kind}}{{if gt .Occurrences 1}} · seen {{.Occurrences}} times{{end}}</p>
{{with .Suppressed}}<p><strong>Suppressed</strong> by {{.Source}}: {{.Reason}}</p>{{end}}
{{with .Cycle}}<p class="cycle">{{.}}</p>{{end}}{{with .Gate}}<p><strong>Guarded by</strong> {{.}}: every path holds it, so the cycle cannot deadlock while that holds.</p>{{end}}
{{if .Detail}}<p>{{.Detail}}</p>{{end}}
{{if .Threads}}<p class="muted">threads: {{range $i, $t := .Threads}}{{if $i}}, {{end}}{{$t}}{{end}}</p>{{end}}
{{if .SeenText}}<p class="muted">seen in{{with .Merged}} ({{.}}){{end}}:</p><ul class="muted">{{range .SeenText}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{range $i, $e := .Edges}}
<h3 style="font-size:14px;margin:14px 0 4px">edge {{inc $i}}: {{$e.From}} → {{$e.To}} <span class="muted">[{{thread $e}}]</span></h3>
<p>{{$e.Context}}</p>
<div class="muted">{{taken $e}}:</div>
{{if $e.Stack}}<ol class="stack" start="0">{{range $e.Stack}}<li>{{frame .}}</li>{{end}}</ol>{{if $e.StackTruncated}}<div class="muted">… stack truncated: the unwinder stopped early</div>{{end}}{{else}}<div class="muted">(no stack recorded)</div>{{end}}
{{if $e.HeldStack}}<div class="muted">{{held $e}}:</div><ol class="stack" start="0">{{range $e.HeldStack}}<li>{{frame .}}</li>{{end}}</ol>{{end}}
{{end}}
{{with .Scenario}}{{if .Rows}}<div class="muted">possible scenario:</div>
<table class="mono"><tr>{{range .Cols}}<th>{{.}}</th>{{end}}</tr>{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>
<p class="cycle">*** DEADLOCK ***</p>{{end}}{{end}}
</details>
{{end}}
{{else}}<div class="box">No findings.</div>{{end}}

{{if .Gate.Fixed}}<h2>Fixed since the baseline</h2>
<div class="box"><table>{{range .Gate.Fixed}}<tr><td class="mono">{{.ID}}</td><td>{{.Title}}</td></tr>{{end}}</table></div>{{end}}
{{if .Gate.Unused}}<h2>Unused suppressions</h2>
<div class="box warn"><table>{{range .Gate.Unused}}<tr><td class="mono">{{.Source}}</td><td>{{.String}}</td><td>{{.Reason}}</td></tr>{{end}}</table></div>{{end}}
</main>
</body>
</html>
`))
