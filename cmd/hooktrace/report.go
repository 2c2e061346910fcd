package main

import (
	"fmt"
	"io"
	"os"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/reports"
)

// writeReport prints res in format and turns findings at or above failOn
// into exit status 1.
func writeReport(w io.Writer, res *analyzer.Result, format, failOn string) error {
	var err error
	switch format {
	case "text":
		err = reports.Text(w, res)
	case "json":
		err = reports.JSON(w, res)
	default:
		return usageError{fmt.Errorf("--format %q: want text or json", format)}
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	fail, err := reports.Fails(res, failOn)
	if err != nil {
		return usageError{err}
	}
	if fail {
		return &exitError{code: exitFindings}
	}
	return nil
}

// report prints the analysis of what the session traced.
func (s *session) report(foot *events.Footer) error {
	s.sink.an.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	return writeReport(os.Stdout, s.sink.an.Result(), s.flags.format, s.flags.failOn)
}
