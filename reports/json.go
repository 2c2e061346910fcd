// Package reports renders analyzer results for people (Text) and for
// tools (JSON), and decides exit statuses (Fails).
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
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Lock names and rules contain '>' and '&': keep them readable.
	enc.SetEscapeHTML(false)
	return enc.Encode(normalized(res))
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
