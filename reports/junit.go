package reports

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
)

// JUnit XML, as test reporters read it (the Ant/Surefire dialect).
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
	SystemOut  string          `xml:"system-out,omitempty"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	Skipped   *junitSkipped `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Body    string `xml:",chardata"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

// JUnit writes the gate as JUnit XML: one test case per finding ID (named
// by the ID, classed by the kind), failing when the finding fails the gate
// with its text report as the failure, skipped when suppressed, passing
// otherwise; the baseline's fixed findings pass. A result without findings
// is one passing case, so reporters show the check ran.
func JUnit(w io.Writer, g *Gate) error {
	st := &g.Result.Stats
	suite := junitSuite{Name: "hooktrace"}
	suite.Properties = []junitProperty{
		{"events", strconv.FormatUint(st.Events, 10)},
		{"lost_events", strconv.FormatUint(st.LostEvents, 10)},
		{"threads", strconv.Itoa(st.Threads)},
		{"complete", strconv.FormatBool(st.Complete)},
		{"fail_on", failOnText(g)},
	}
	if n := st.UnrecordedProcesses; n > 0 {
		suite.Properties = append(suite.Properties, junitProperty{"unrecorded_processes", strconv.FormatUint(n, 10)})
	}
	if g.HasBaseline {
		suite.Properties = append(suite.Properties, junitProperty{"baseline", g.BaselineName})
	}
	if g.Tool != "" {
		suite.Properties = append(suite.Properties, junitProperty{"tool", g.Tool})
	}
	var out bytes.Buffer
	if !st.Complete {
		fmt.Fprintf(&out, "INCOMPLETE: %s — findings may be missing.\n", st.Incomplete)
	}
	for _, u := range g.Unused {
		fmt.Fprintf(&out, "unused suppression at %s (%s): it matched no finding\n", u.Source, u.String())
	}
	suite.SystemOut = out.String()
	for i := range g.Findings {
		j := &g.Findings[i]
		c := junitCase{Name: j.ID, Classname: "hooktrace." + string(j.Kind)}
		var body bytes.Buffer
		if err := FindingText(&body, j.Finding); err != nil {
			return err
		}
		switch {
		case j.Fails:
			c.Failure = &junitFailure{Message: j.Title, Type: string(j.Severity), Body: body.String()}
			suite.Failures++
		case j.Suppressed != nil:
			c.Skipped = &junitSkipped{Message: "suppressed (" + j.Suppressed.Source + "): " + j.Suppressed.Reason}
			suite.Skipped++
		default:
			c.SystemOut = passReason(g, j) + "\n\n" + body.String()
		}
		suite.Cases = append(suite.Cases, c)
	}
	for _, f := range g.Fixed {
		suite.Cases = append(suite.Cases, junitCase{Name: f.ID, Classname: "hooktrace." + string(f.Kind),
			SystemOut: "fixed: in the baseline, not seen now: " + f.Title})
	}
	if len(suite.Cases) == 0 {
		suite.Cases = append(suite.Cases, junitCase{Name: "no potential deadlocks", Classname: "hooktrace",
			SystemOut: "hooktrace found nothing to report."})
	}
	suite.Tests = len(suite.Cases)
	doc := junitSuites{Name: "hooktrace", Tests: suite.Tests, Failures: suite.Failures, Skipped: suite.Skipped,
		Suites: []junitSuite{suite}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// passReason says why a finding does not fail.
func passReason(g *Gate, j *Judged) string {
	switch {
	case j.State == StateUnchanged || j.State == StateUpdated:
		return "present in the baseline " + orDash(g.BaselineName) + "; not new"
	case g.FailOn == "":
		return "--fail-on none"
	}
	return fmt.Sprintf("%s: below --fail-on %s", j.Severity, g.FailOn)
}

func failOnText(g *Gate) string {
	if g.FailOn == "" {
		return "none"
	}
	return string(g.FailOn)
}
