package reports

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// goldenFormats are the formats with golden files, by extension.
var goldenFormats = []struct{ format, ext string }{
	{"text", "txt"}, {"json", "json"}, {"sarif", "sarif"}, {"junit", "xml"},
	{"markdown", "md"}, {"dot", "dot"}, {"html", "html"},
}

// gateCase is a fixture judged one way.
type gateCase struct {
	name    string // golden file stem
	fixture string
	opts    func(t *testing.T) Options
	formats []string
}

func loadGoldenBaseline(t *testing.T, name string) *Baseline {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatalf("%v (run go test ./reports -update)", err)
	}
	defer f.Close()
	b, err := ReadBaseline(f, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadSuppressions(t *testing.T) *Suppressions {
	t.Helper()
	s, err := LoadSuppressions(filepath.Join("testdata", "suppress.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func plainOpts(t *testing.T) Options { return Options{Tool: "hooktrace test", SourceRoot: fxRoot} }

func gateCases() []gateCase {
	all := []string{"text", "json", "sarif", "junit", "markdown", "dot", "html"}
	return []gateCase{
		{"seed", "seed", plainOpts, []string{"text", "json", "sarif"}},
		{"regress", "regress", plainOpts, all},
		{"regress-gate", "regress", func(t *testing.T) Options {
			o := plainOpts(t)
			o.Baseline = loadGoldenBaseline(t, "seed.json")
			o.Suppressions = loadSuppressions(t)
			return o
		}, []string{"text", "json", "sarif", "junit", "markdown", "html"}},
		{"misuse", "misuse", plainOpts, all},
	}
}

func renderCase(t *testing.T, c gateCase, format string) []byte {
	t.Helper()
	g, err := Judge(analyzeFixture(t, c.fixture), c.opts(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, format, g); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func extOf(format string) string {
	for _, f := range goldenFormats {
		if f.format == format {
			return f.ext
		}
	}
	return format
}

// TestGolden renders every fixture in every format and compares with the
// committed golden files. The seed JSON is the baseline of regress-gate,
// so it is written first.
func TestGolden(t *testing.T) {
	for _, c := range gateCases() {
		for _, format := range c.formats {
			t.Run(c.name+"."+format, func(t *testing.T) {
				golden(t, c.name+"."+extOf(format), renderCase(t, c, format))
			})
		}
	}
	t.Run("regress.perfetto", func(t *testing.T) {
		golden(t, "regress.perfetto.json", perfettoOf(t, "regress"))
	})
}

func perfettoOf(t *testing.T, names ...string) []byte {
	t.Helper()
	a := analyzeFixtures(t, names...)
	var traces []TimelineTrace
	for _, name := range names {
		name := name
		traces = append(traces, TimelineTrace{Name: name + ".htr", Records: func(fn func(*events.Record) error) error {
			var err error
			eachFixtureRecord(t, name, func(r *events.Record) {
				if err == nil {
					err = fn(r)
				}
			})
			return err
		}})
	}
	var buf bytes.Buffer
	if err := Perfetto(&buf, traces, a); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
