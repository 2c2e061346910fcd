package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/rules"
)

func newAnalyzeCmd() *cobra.Command {
	var format, failOn string
	var forbid, packs []string
	var rep reportFlags
	c := &cobra.Command{
		Use:   "analyze [flags] TRACE.htr...",
		Short: "Analyze saved traces (several are merged into one lock graph)",
		Example: `  hooktrace analyze app.htr
  hooktrace analyze --format json trace-*.htr
  hooktrace analyze --baseline main.json --report out.sarif --report summary.md app.htr`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			rules, err := parseRules(forbid)
			if err != nil {
				return err
			}
			more, err := packRules(packs)
			if err != nil {
				return err
			}
			rules = append(rules, more...)
			if err := rep.check(format, failOn); err != nil {
				return err
			}
			a := analyzer.New(analyzer.Options{Forbid: rules})
			for _, path := range args {
				if err := analyzeFile(a, path); err != nil {
					return err
				}
			}
			return writeReport(c.OutOrStdout(), a.Result(), format, failOn, &rep, nil)
		},
	}
	c.Flags().StringVarP(&format, "format", "f", "text", formatHelp)
	c.Flags().StringVar(&failOn, "fail-on", "error", "exit 1 when a finding is at or above this severity (error, warning, info, none)")
	c.Flags().StringArrayVar(&forbid, "forbid", nil, "OUTER>INNER: INNER must never run while OUTER is on the thread's stack")
	c.Flags().StringArrayVar(&packs, "rules", nil, "check a rule pack (upcxx, or a rules file) against traces recorded with its INNER functions probed; a trace keeps the rules it was recorded with")
	rep.register(c.Flags())
	return c
}

// analyzeFile feeds one trace to a. A trace cut short (the tracer was
// killed) or damaged (a flipped byte fails a block's checksum) is analyzed
// up to its last whole sound block, with a warning; the result then says
// it is incomplete.
func analyzeFile(a *analyzer.Analyzer, path string) error {
	r, err := events.Open(path)
	if err != nil {
		return err
	}
	defer r.Close()
	a.BeginStream(path)
	var rec events.Record
	for {
		err := r.NextInto(&rec)
		if err == io.EOF {
			return nil
		}
		if salvageable(err) {
			slog.Warn(fmt.Sprintf("%s: %v; analyzing the whole blocks before it", path, err))
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		a.Add(&rec)
	}
}

// salvageable reports whether a trace that failed to read with err still
// holds sound records before the failure: the reader delivers a block's
// records only once its checksum has passed, so a cut or a damaged byte
// loses the blocks from there on, not the ones before.
func salvageable(err error) bool {
	var corrupt *events.CorruptError
	return errors.Is(err, events.ErrTruncated) || errors.As(err, &corrupt)
}

// loadPacks loads the --rules packs.
func loadPacks(names []string) ([]*rules.Pack, error) {
	var out []*rules.Pack
	for _, n := range names {
		p, err := rules.Load(n)
		if err != nil {
			return nil, usageError{err}
		}
		out = append(out, p)
	}
	return out, nil
}

// packRules are the rules of the --rules packs names.
func packRules(names []string) ([]analyzer.Rule, error) {
	packs, err := loadPacks(names)
	if err != nil {
		return nil, err
	}
	var out []analyzer.Rule
	for _, p := range packs {
		out = append(out, p.Rules...)
	}
	return out, nil
}

func parseRules(specs []string) ([]analyzer.Rule, error) {
	var rules []analyzer.Rule
	for _, s := range specs {
		r, err := analyzer.ParseRule(s)
		if err != nil {
			return nil, usageError{err}
		}
		rules = append(rules, r)
	}
	return rules, nil
}
