package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/reports"
)

// formatHelp is the --format flag's help.
const formatHelp = "report format on stdout: text, json, sarif, junit, markdown, dot or html"

// reportFlags are the report and CI-gate flags analyze, run and attach
// share (--format and --fail-on are registered by each command).
type reportFlags struct {
	reports    []string
	baseline   string
	suppress   string
	sourceRoot string
	errorCode  int
	fs         *pflag.FlagSet

	// Loaded by check.
	base  *reports.Baseline
	supps *reports.Suppressions
}

func (r *reportFlags) register(fl *pflag.FlagSet) {
	r.fs = fl
	fl.StringArrayVar(&r.reports, "report", nil,
		"write a report to a file, [FORMAT:]FILE, the format from the extension when not given (.txt .json .sarif .xml=junit .md .dot .html); "+
			"repeatable; stdout then gets no report unless --format is given")
	fl.StringVar(&r.baseline, "baseline", "", "an earlier JSON report: only findings it lacks fail (the report lists new, still present and fixed)")
	fl.StringVar(&r.suppress, "suppress", "", "a suppressions file: entries by finding id, lock or function pattern, each with a reason")
	fl.StringVar(&r.sourceRoot, "source-root", ".", "SARIF: source files under this directory are named relative to it")
	fl.IntVar(&r.errorCode, "error-exitcode", exitFindings, "the exit status when findings fail the gate (1 to 255)")
}

// exitCode is the status for a failing gate: --error-exitcode.
func (r *reportFlags) exitCode() int {
	if r.errorCode == 0 {
		return exitFindings
	}
	return r.errorCode
}

// reportTarget is one --report.
type reportTarget struct {
	format, path string
}

// targets parses --report.
func (r *reportFlags) targets() ([]reportTarget, error) {
	var out []reportTarget
	for _, spec := range r.reports {
		format, path, ok := strings.Cut(spec, ":")
		if !ok || !reports.KnownFormat(format) {
			format, path = "", spec
		}
		if path == "" {
			return nil, usageError{fmt.Errorf("--report %q: no file name", spec)}
		}
		if format == "" {
			f, known := reports.FormatOf(path)
			if !known {
				return nil, usageError{fmt.Errorf("--report %q: cannot tell the format from the extension; write FORMAT:%s (%s)",
					spec, path, strings.Join(reports.Formats, ", "))}
			}
			format = f
		}
		out = append(out, reportTarget{format, path})
	}
	return out, nil
}

// check validates the report flags and loads the baseline and the
// suppressions, before any tracing: a typo must not cost a run.
func (r *reportFlags) check(format, failOn string) error {
	if r.errorCode < 0 || r.errorCode > 255 || (r.errorCode == 0 && r.fs != nil && r.fs.Changed("error-exitcode")) {
		return usageError{fmt.Errorf("--error-exitcode %d: want 1 to 255", r.errorCode)}
	}
	if !reports.KnownFormat(format) {
		return usageError{fmt.Errorf("--format %q: want %s", format, strings.Join(reports.Formats, ", "))}
	}
	if failOn != "none" {
		if _, err := analyzer.ParseSeverity(failOn); err != nil {
			return usageError{fmt.Errorf("--fail-on: %w", err)}
		}
	}
	if _, err := r.targets(); err != nil {
		return err
	}
	if r.baseline != "" && r.base == nil {
		b, err := reports.LoadBaseline(r.baseline)
		if err != nil {
			return usageError{err}
		}
		r.base = b
	}
	if r.suppress != "" && r.supps == nil {
		s, err := reports.LoadSuppressions(r.suppress)
		if err != nil {
			return usageError{err}
		}
		r.supps = s
	}
	return nil
}

// formatGiven reports whether --format was on the command line.
func (r *reportFlags) formatGiven() bool {
	if r.fs == nil {
		return true
	}
	f := r.fs.Lookup("format")
	return f != nil && f.Changed
}

// writeReport judges res, prints it on w in format (unless w is nil, or
// --report writes files and --format was not given), writes the --report
// files (their names expanded by expand, when set), and turns failing
// findings into exit status 1 (--error-exitcode).
func writeReport(w io.Writer, res *analyzer.Result, format, failOn string, r *reportFlags, expand func(string) (string, error)) error {
	if r == nil {
		r = &reportFlags{}
	}
	if err := r.check(format, failOn); err != nil {
		return err
	}
	root := r.sourceRoot
	if root != "" {
		if abs, err := filepath.Abs(root); err == nil {
			root = abs
		}
	}
	g, err := reports.Judge(res, reports.Options{
		FailOn:       failOn,
		Baseline:     r.base,
		Suppressions: r.supps,
		Tool:         "hooktrace " + version,
		SourceRoot:   root,
	})
	if err != nil {
		return usageError{err}
	}
	targets, err := r.targets()
	if err != nil {
		return err
	}
	if w != nil && (len(targets) == 0 || r.formatGiven()) {
		if err := reports.Render(w, format, g); err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
	}
	var written []string
	for _, t := range targets {
		path := t.path
		if expand != nil {
			if path, err = expand(path); err != nil {
				return err
			}
		}
		if err := writeReportFile(path, t.format, g); err != nil {
			return err
		}
		written = append(written, path)
	}
	if len(written) > 0 {
		fmt.Fprintf(os.Stderr, "hooktrace: %s; report%s written to %s\n", gateSummary(g),
			map[bool]string{true: "s", false: ""}[len(written) > 1], strings.Join(written, ", "))
	}
	if g.Fails() {
		return &exitError{code: r.exitCode(), gate: true}
	}
	return nil
}

func writeReportFile(path, format string, g *reports.Gate) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	err = reports.Render(f, format, g)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the report %s: %w", path, err)
	}
	return nil
}

// gateSummary is the one-line verdict: "3 findings, 1 failing (1 new, 1
// still present, 1 fixed; 1 suppressed)".
func gateSummary(g *reports.Gate) string {
	c := g.Counts()
	s := fmt.Sprintf("%d finding", c.Findings)
	if c.Findings != 1 {
		s += "s"
	}
	s += fmt.Sprintf(", %d failing", c.Failing)
	var more []string
	if g.HasBaseline {
		more = append(more, fmt.Sprintf("%d new, %d still present, %d fixed", c.New+c.Updated, c.Unchanged, c.Fixed))
	}
	if g.HasSuppress {
		more = append(more, fmt.Sprintf("%d suppressed, %d unused suppressions", c.Suppressed, c.Unused))
	}
	if len(more) > 0 {
		s += " (" + strings.Join(more, "; ") + ")"
	}
	if !g.Result.Stats.Complete {
		s += "; INCOMPLETE trace: " + g.Result.Stats.Incomplete
	}
	return s
}
