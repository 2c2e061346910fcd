// Package reports renders analyzer results for people (Text, Markdown,
// HTML, DOT) and for tools (JSON, SARIF, JUnit), judges them for CI gates
// (Judge: baselines, suppressions, thresholds), decides exit statuses
// (Fails, Gate.Fails) and exports traces as timelines (Perfetto).
package reports

import (
	"encoding/json"
	"io"

	"github.com/hooktrace/hooktrace/analyzer"
)

// JSON writes res as indented JSON. The output is stable: findings are
// sorted by the analyzer, struct fields keep their order and maps (call
// counts) are written with sorted keys.
func JSON(w io.Writer, res *analyzer.Result) error {
	return JSONGate(w, plain(res))
}

// JSONGate is JSON with, when the gate has a baseline or suppressions, a
// "gate" object: the threshold, the failing finding IDs, the baseline
// states, the fixed findings and the suppressions used and unused. The
// report stays a valid baseline for a later run.
func JSONGate(w io.Writer, g *Gate) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Lock names and rules contain '>' and '&': keep them readable.
	enc.SetEscapeHTML(false)
	doc := struct {
		*analyzer.Result
		Gate *gateJSON `json:"gate,omitempty"`
	}{Result: normalized(g.Result)}
	if g.HasBaseline || g.HasSuppress {
		doc.Gate = newGateJSON(g)
	}
	return enc.Encode(doc)
}

type gateJSON struct {
	FailOn     string             `json:"fail_on"`
	Failing    []string           `json:"failing"`
	Baseline   string             `json:"baseline,omitempty"`
	New        []string           `json:"new,omitempty"`
	Unchanged  []string           `json:"unchanged,omitempty"`
	Updated    []string           `json:"updated,omitempty"`
	Fixed      []analyzer.Finding `json:"fixed,omitempty"`
	Suppressed []suppressedJSON   `json:"suppressed,omitempty"`
	Unused     []Suppression      `json:"unused_suppressions,omitempty"`
}

type suppressedJSON struct {
	ID     string       `json:"id"`
	By     *Suppression `json:"by"`
	Reason string       `json:"reason"`
}

func newGateJSON(g *Gate) *gateJSON {
	out := &gateJSON{FailOn: "none", Failing: []string{}, Baseline: g.BaselineName, Unused: g.Unused}
	if g.FailOn != "" {
		out.FailOn = string(g.FailOn)
	}
	for i := range g.Findings {
		j := &g.Findings[i]
		if j.Fails {
			out.Failing = append(out.Failing, j.ID)
		}
		switch j.State {
		case StateNew:
			out.New = append(out.New, j.ID)
		case StateUnchanged:
			out.Unchanged = append(out.Unchanged, j.ID)
		case StateUpdated:
			out.Updated = append(out.Updated, j.ID)
		}
		if j.Suppressed != nil {
			out.Suppressed = append(out.Suppressed, suppressedJSON{ID: j.ID, By: j.Suppressed, Reason: j.Suppressed.Reason})
		}
	}
	if g.HasBaseline {
		out.Fixed = normalized(&analyzer.Result{Findings: g.Fixed}).Findings
	}
	return out
}

// normalized makes empty lists encode as [] rather than null, as the
// JSON contract promises arrays.
func normalized(res *analyzer.Result) *analyzer.Result {
	out := *res
	if out.Findings == nil {
		out.Findings = []analyzer.Finding{}
	}
	if out.Stats.Calls == nil {
		out.Stats.Calls = map[string]uint64{}
	}
	fs := make([]analyzer.Finding, len(out.Findings))
	for i, f := range out.Findings {
		if f.Locks == nil {
			f.Locks = []string{}
		}
		if f.Edges == nil {
			f.Edges = []analyzer.Edge{}
		}
		edges := make([]analyzer.Edge, len(f.Edges))
		for j, e := range f.Edges {
			if e.Stack == nil {
				e.Stack = []analyzer.Frame{}
			}
			edges[j] = e
		}
		f.Edges = edges
		fs[i] = f
	}
	out.Findings = fs
	return &out
}

// Fails reports whether res has a finding at least as severe as threshold
// ("info", "warning" or "error"): the exit-status decision for CI gates.
func Fails(res *analyzer.Result, threshold string) (bool, error) {
	sev, err := analyzer.ParseSeverity(threshold)
	if err != nil {
		return false, err
	}
	return res.Fails(sev), nil
}
