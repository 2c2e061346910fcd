package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/reports"
)

func newExportCmd() *cobra.Command {
	var format, output string
	var forbid []string
	c := &cobra.Command{
		Use:   "export --format perfetto -o OUT.json TRACE.htr...",
		Short: "Export traces as a timeline (Chrome trace-event JSON for the Perfetto UI)",
		Long: `export writes saved traces as a timeline: a track per thread with its lock
holds, condition waits and probed functions as slices, allocator calls and
memory syscalls as instants, and each finding as an instant where its
dependency was first seen. Open the file in the Perfetto UI or
chrome://tracing. Record with --mode full for every allocator call.`,
		Example: `  hooktrace export --format perfetto -o app.json app.htr
  hooktrace export -o job.json trace-*.htr`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			if format != "perfetto" && format != "chrome" {
				return usageError{fmt.Errorf("--format %q: want perfetto", format)}
			}
			if output == "" {
				return usageError{errors.New("-o is required (use -o - for stdout)")}
			}
			rules, err := parseRules(forbid)
			if err != nil {
				return err
			}
			return exportTimeline(args, output, rules)
		},
	}
	c.Flags().StringVarP(&format, "format", "f", "perfetto", "timeline format: perfetto (Chrome trace-event JSON)")
	c.Flags().StringVarP(&output, "output", "o", "", "write the timeline to this file (- for stdout)")
	c.Flags().StringArrayVar(&forbid, "forbid", nil, "OUTER>INNER: a nesting rule to check, as for analyze")
	return c
}

// exportTimeline reads the traces twice: once for the findings, once for
// the timeline.
func exportTimeline(paths []string, output string, rules []analyzer.Rule) error {
	a := analyzer.New(analyzer.Options{Forbid: rules})
	var traces []reports.TimelineTrace
	for _, path := range paths {
		if err := analyzeFile(a, path); err != nil {
			return err
		}
		h, err := traceHeader(path)
		if err != nil {
			return err
		}
		path := path
		traces = append(traces, reports.TimelineTrace{Name: path, Header: h, Records: func(fn func(*events.Record) error) error {
			return eachRecord(path, fn)
		}})
	}
	res := a.Result()
	var w io.Writer = os.Stdout
	var f *os.File
	if output != "-" {
		var err error
		if f, err = os.Create(output); err != nil {
			return fmt.Errorf("writing the timeline: %w", err)
		}
		w = f
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	err := reports.Perfetto(bw, traces, res)
	if err == nil {
		err = bw.Flush()
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("writing the timeline: %w", err)
	}
	if output != "-" {
		fmt.Fprintf(os.Stderr, "hooktrace: timeline of %d trace(s), %d findings, written to %s\n", len(paths), len(res.Findings), output)
	}
	if n := reports.CountedOnly(res); n > 0 {
		fmt.Fprintf(os.Stderr, "hooktrace: %s\n", reports.CountedOnlyNote(n))
	}
	return nil
}

func traceHeader(path string) (*events.Header, error) {
	r, err := events.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	rec, err := r.Next()
	if err != nil && err != io.EOF && !salvageable(err) {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if err == nil && rec.Kind == events.RecHeader {
		return rec.Header, nil
	}
	return nil, nil
}

// eachRecord calls fn with every record of a trace; a trace cut short or
// damaged ends at its last whole sound block (analyzeFile has warned).
func eachRecord(path string, fn func(*events.Record) error) error {
	r, err := events.Open(path)
	if err != nil {
		return err
	}
	defer r.Close()
	for {
		rec, err := r.Next()
		if err == io.EOF || salvageable(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}
