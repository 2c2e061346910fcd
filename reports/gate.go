package reports

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/hooktrace/hooktrace/analyzer"
)

// Baseline states of a finding, as SARIF names them.
const (
	StateNew       = "new"       // not in the baseline
	StateUnchanged = "unchanged" // in the baseline, at the same or a higher severity
	StateUpdated   = "updated"   // in the baseline, but less severe there
	StateAbsent    = "absent"    // in the baseline, not seen now: fixed
)

// Options say how a result is judged for a CI gate.
type Options struct {
	// FailOn is "error", "warning", "info" or "none"; empty means "error".
	FailOn string
	// Baseline is an earlier report: only findings it lacks fail. Nil
	// means no baseline.
	Baseline *Baseline
	// Suppressions never fail; entries no finding used are reported.
	Suppressions *Suppressions
	// Tool is the version string reports name their producer by.
	Tool string
	// SourceRoot makes absolute source paths under it relative (SARIF).
	SourceRoot string
}

// Gate is a result judged for a CI gate: each finding's baseline state and
// suppression, which ones fail, and what the baseline had that is gone.
type Gate struct {
	Result *analyzer.Result
	// Findings parallels Result.Findings.
	Findings []Judged
	// Fixed lists the baseline's findings that were not seen now.
	Fixed []analyzer.Finding
	// Unused lists the suppression entries that matched no finding.
	Unused []Suppression
	// FailOn is the threshold; "" means none.
	FailOn       analyzer.Severity
	HasBaseline  bool
	BaselineName string
	HasSuppress  bool
	Tool         string
	SourceRoot   string
}

// Judged is one finding with its verdict.
type Judged struct {
	*analyzer.Finding
	// State is its baseline state; empty without a baseline.
	State string
	// Suppressed is the entry that suppressed it, or nil.
	Suppressed *Suppression
	// Fails is set when this finding alone makes the gate fail.
	Fails bool
}

// Judge applies opts to res.
func Judge(res *analyzer.Result, opts Options) (*Gate, error) {
	g := &Gate{Result: res, Tool: opts.Tool, SourceRoot: opts.SourceRoot}
	switch opts.FailOn {
	case "", "error":
		g.FailOn = analyzer.SeverityError
	case "none":
	default:
		sev, err := analyzer.ParseSeverity(opts.FailOn)
		if err != nil {
			return nil, fmt.Errorf("--fail-on: %w", err)
		}
		g.FailOn = sev
	}
	var before map[string]*analyzer.Finding
	if b := opts.Baseline; b != nil {
		g.HasBaseline = true
		g.BaselineName = b.Name
		before = map[string]*analyzer.Finding{}
		for i := range b.Findings {
			before[b.Findings[i].ID] = &b.Findings[i]
		}
	}
	if opts.Suppressions != nil {
		g.HasSuppress = true
	}
	now := map[string]bool{}
	g.Findings = make([]Judged, len(res.Findings))
	for i := range res.Findings {
		f := &res.Findings[i]
		now[f.ID] = true
		j := Judged{Finding: f}
		if before != nil {
			old, ok := before[f.ID]
			switch {
			case !ok:
				j.State = StateNew
			case old.Severity.Rank() < f.Severity.Rank():
				j.State = StateUpdated
			default:
				j.State = StateUnchanged
			}
		}
		if opts.Suppressions != nil {
			j.Suppressed = opts.Suppressions.match(f)
		}
		j.Fails = g.fails(&j, before)
		g.Findings[i] = j
	}
	if b := opts.Baseline; b != nil {
		for _, f := range b.Findings {
			if !now[f.ID] {
				g.Fixed = append(g.Fixed, f)
			}
		}
	}
	if opts.Suppressions != nil {
		g.Unused = opts.Suppressions.unused()
	}
	return g, nil
}

// fails decides one finding: at or above the threshold, not suppressed,
// and, with a baseline, new — or more severe than the baseline had it and
// below the threshold there (the baseline never accepted it at this
// severity).
func (g *Gate) fails(j *Judged, before map[string]*analyzer.Finding) bool {
	if g.FailOn == "" || j.Suppressed != nil || j.Severity.Rank() < g.FailOn.Rank() {
		return false
	}
	switch j.State {
	case "", StateNew:
		return true
	case StateUpdated:
		return before[j.ID].Severity.Rank() < g.FailOn.Rank()
	}
	return false
}

// Fails reports whether any finding fails the gate: exit status 1.
func (g *Gate) Fails() bool {
	for i := range g.Findings {
		if g.Findings[i].Fails {
			return true
		}
	}
	return false
}

// Failing lists the failing findings.
func (g *Gate) Failing() []*Judged {
	var out []*Judged
	for i := range g.Findings {
		if g.Findings[i].Fails {
			out = append(out, &g.Findings[i])
		}
	}
	return out
}

// Counts summarises the gate for one-line reports.
type Counts struct {
	Findings, Failing, New, Unchanged, Updated, Fixed, Suppressed, Unused int
}

// Counts counts the findings by verdict.
func (g *Gate) Counts() Counts {
	c := Counts{Findings: len(g.Findings), Fixed: len(g.Fixed), Unused: len(g.Unused)}
	for i := range g.Findings {
		j := &g.Findings[i]
		if j.Fails {
			c.Failing++
		}
		if j.Suppressed != nil {
			c.Suppressed++
		}
		switch j.State {
		case StateNew:
			c.New++
		case StateUnchanged:
			c.Unchanged++
		case StateUpdated:
			c.Updated++
		}
	}
	return c
}

// plain is the gate of a result with no baseline, no suppressions, and the
// default threshold: what Text and JSON render.
func plain(res *analyzer.Result) *Gate {
	g, _ := Judge(res, Options{})
	return g
}

// Baseline is the findings of an earlier JSON report.
type Baseline struct {
	Name     string
	Findings []analyzer.Finding
}

// ReadBaseline reads a JSON report written by hooktrace (any format
// version 1 report: its findings are what counts).
func ReadBaseline(r io.Reader, name string) (*Baseline, error) {
	var doc struct {
		Version  int                `json:"version"`
		Findings []analyzer.Finding `json:"findings"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("baseline %s: not a hooktrace JSON report: %w", name, err)
	}
	if doc.Version != 1 {
		return nil, fmt.Errorf("baseline %s: report version %d, want 1", name, doc.Version)
	}
	for i, f := range doc.Findings {
		if f.ID == "" {
			return nil, fmt.Errorf("baseline %s: finding %d has no id", name, i+1)
		}
	}
	return &Baseline{Name: name, Findings: doc.Findings}, nil
}

// LoadBaseline reads a baseline report from a file.
func LoadBaseline(path string) (*Baseline, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	defer f.Close()
	return ReadBaseline(f, path)
}
