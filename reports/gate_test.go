package reports

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
)

func baselineOf(t *testing.T, res *analyzer.Result, name string) *Baseline {
	t.Helper()
	var buf bytes.Buffer
	if err := JSON(&buf, res); err != nil {
		t.Fatal(err)
	}
	b, err := ReadBaseline(&buf, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func idsBy(g *Gate, pick func(j *Judged) bool) []string {
	out := []string{}
	for i := range g.Findings {
		if pick(&g.Findings[i]) {
			out = append(out, g.Findings[i].ID)
		}
	}
	return out
}

func kindsOf(fs []analyzer.Finding) []string {
	out := []string{}
	for _, f := range fs {
		out = append(out, string(f.Kind)+"/"+string(f.Severity))
	}
	return out
}

// TestBaselineBothWays: against the older run only the new inversion
// fails and the timed cycle is fixed; the other way round the timed cycle
// is new (a warning: it fails only at --fail-on warning) and the inversion
// is fixed; against itself nothing is new.
func TestBaselineBothWays(t *testing.T) {
	seed, regress := analyzeFixture(t, "seed"), analyzeFixture(t, "regress")
	if len(seed.Findings) != 3 || len(regress.Findings) != 3 {
		t.Fatalf("fixtures: seed %v, regress %v", kindsOf(seed.Findings), kindsOf(regress.Findings))
	}
	inversion, timed := regress.Findings[0].ID, seed.Findings[1].ID
	if !strings.HasPrefix(regress.Findings[0].Title, "lock order inversion") || seed.Findings[1].Severity != analyzer.SeverityWarning {
		t.Fatalf("fixture findings moved: %v / %v", regress.Findings[0].Title, seed.Findings[1].Title)
	}

	// Forward: the pull request against main.
	g, err := Judge(regress, Options{Baseline: baselineOf(t, seed, "seed.json")})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Fails() || !reflect.DeepEqual(idsBy(g, func(j *Judged) bool { return j.Fails }), []string{inversion}) {
		t.Errorf("forward: failing %v, want only %s", idsBy(g, func(j *Judged) bool { return j.Fails }), inversion)
	}
	if got := idsBy(g, func(j *Judged) bool { return j.State == StateNew }); !reflect.DeepEqual(got, []string{inversion}) {
		t.Errorf("forward: new %v", got)
	}
	if got := idsBy(g, func(j *Judged) bool { return j.State == StateUnchanged }); len(got) != 2 {
		t.Errorf("forward: unchanged %v", got)
	}
	if len(g.Fixed) != 1 || g.Fixed[0].ID != timed {
		t.Errorf("forward: fixed %v, want %s", g.Fixed, timed)
	}
	// Without the baseline the old findings fail too.
	plainGate, _ := Judge(regress, Options{})
	if n := len(plainGate.Failing()); n != 2 {
		t.Errorf("no baseline: %d failing, want 2 errors", n)
	}

	// Backward: main against the pull request.
	back, err := Judge(seed, Options{Baseline: baselineOf(t, regress, "regress.json")})
	if err != nil {
		t.Fatal(err)
	}
	if back.Fails() {
		t.Errorf("backward at --fail-on error: the new finding is a warning, nothing may fail: %v", idsBy(back, func(j *Judged) bool { return j.Fails }))
	}
	if got := idsBy(back, func(j *Judged) bool { return j.State == StateNew }); !reflect.DeepEqual(got, []string{timed}) {
		t.Errorf("backward: new %v", got)
	}
	if len(back.Fixed) != 1 || back.Fixed[0].ID != inversion {
		t.Errorf("backward: fixed %v", back.Fixed)
	}
	warn, _ := Judge(seed, Options{FailOn: "warning", Baseline: baselineOf(t, regress, "regress.json")})
	if !reflect.DeepEqual(idsBy(warn, func(j *Judged) bool { return j.Fails }), []string{timed}) {
		t.Errorf("backward at --fail-on warning: failing %v", idsBy(warn, func(j *Judged) bool { return j.Fails }))
	}

	// Against itself.
	same, _ := Judge(regress, Options{FailOn: "info", Baseline: baselineOf(t, regress, "regress.json")})
	if same.Fails() || len(same.Fixed) != 0 {
		t.Errorf("against itself: fails=%v fixed=%v", same.Fails(), same.Fixed)
	}
	none, _ := Judge(regress, Options{FailOn: "none"})
	if none.Fails() {
		t.Error("--fail-on none failed")
	}
	if _, err := Judge(regress, Options{FailOn: "fatal"}); err == nil {
		t.Error("bad --fail-on accepted")
	}
}

// TestBaselineSeverityRise: a finding the baseline had as a warning that
// is now an error was never accepted as an error, so it fails.
func TestBaselineSeverityRise(t *testing.T) {
	now := analyzeFixture(t, "regress")
	old := *now
	old.Findings = append([]analyzer.Finding(nil), now.Findings...)
	old.Findings[0].Severity = analyzer.SeverityWarning
	g, _ := Judge(now, Options{Baseline: baselineOf(t, &old, "old.json")})
	if j := g.Findings[0]; j.State != StateUpdated || !j.Fails {
		t.Errorf("risen finding: state %q fails %v", j.State, j.Fails)
	}
	if g.Findings[1].Fails {
		t.Error("an unchanged error failed")
	}
	// Already an error in the baseline: unchanged, passes.
	old.Findings[0].Severity = analyzer.SeverityError
	g, _ = Judge(now, Options{Baseline: baselineOf(t, &old, "old.json")})
	if g.Fails() {
		t.Error("nothing new, yet it fails")
	}
}

func TestReadBaselineErrors(t *testing.T) {
	for _, c := range []struct{ name, doc, says string }{
		{"not json", "hello", "not a hooktrace JSON report"},
		{"version", `{"version": 9, "findings": []}`, "version 9"},
		{"no id", `{"version": 1, "findings": [{"kind": "hook-lock"}]}`, "no id"},
	} {
		if _, err := ReadBaseline(strings.NewReader(c.doc), "b.json"); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// A report with a gate section is a baseline too.
	var buf bytes.Buffer
	g, _ := Judge(analyzeFixture(t, "regress"), Options{Baseline: baselineOf(t, analyzeFixture(t, "seed"), "seed.json")})
	if err := JSONGate(&buf, g); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadBaseline(&buf, "gate.json"); err != nil || len(b.Findings) != 3 {
		t.Errorf("gate report as baseline: %v, %v", b, err)
	}
}

const suppressSample = `# comment
id: lock-order-cycle-*
reason: cycles are tracked elsewhere

lock: stats_lock*
kind: hook-lock
reason: the stats hook is fine

function: no_such_function
reason: stale entry
`

// TestSuppressions: entries by ID pattern, lock and function; a
// suppressed finding never fails; unused entries are reported; bad files
// are refused with the line.
func TestSuppressions(t *testing.T) {
	regress := analyzeFixture(t, "regress")
	s, err := ReadSuppressions(strings.NewReader(suppressSample), "s.txt")
	if err != nil {
		t.Fatal(err)
	}
	g, _ := Judge(regress, Options{FailOn: "info", Suppressions: s})
	if g.Fails() {
		t.Errorf("everything is suppressed, yet it fails: %v", idsBy(g, func(j *Judged) bool { return j.Fails }))
	}
	for i := range g.Findings {
		j := &g.Findings[i]
		want := "s.txt:2"
		if j.Kind == analyzer.KindHookLock {
			want = "s.txt:5"
		}
		if j.Suppressed == nil || j.Suppressed.Source != want {
			t.Errorf("%s suppressed by %+v, want %s", j.ID, j.Suppressed, want)
		}
	}
	if len(g.Unused) != 1 || g.Unused[0].Function != "no_such_function" || g.Unused[0].Source != "s.txt:9" {
		t.Errorf("unused %+v", g.Unused)
	}

	// The other direction: nothing matches, everything fails as before.
	none, _ := ReadSuppressions(strings.NewReader("lock: other*\nreason: x\n\nid: hook-lock-000000000000\nreason: y\n"), "n.txt")
	g, _ = Judge(regress, Options{Suppressions: none})
	if len(g.Failing()) != 2 || len(g.Unused) != 2 {
		t.Errorf("non-matching suppressions: %d failing, %d unused", len(g.Failing()), len(g.Unused))
	}

	// Function patterns see every frame of every edge; lock patterns see
	// class names without the instance number; all selectors must match.
	for _, c := range []struct {
		entry string
		hits  int
	}{
		{"function: cache_*\nreason: r", 1},
		{"function: pthread_mutex_lock\nreason: r", 3},
		{"lock: vma_lock (librcache.so)\nreason: r", 1},
		{"lock: vma_lock*\nfunction: cache_fill\nreason: r", 0},
		{"lock: *pool_create*\nkind: lock-order-cycle\nreason: r", 1},
		{"id: hook-lock-??????????????\nreason: r", 0},
		{"id: hook-lock-????????????\nreason: r", 1},
	} {
		s, err := ReadSuppressions(strings.NewReader(c.entry), "c.txt")
		if err != nil {
			t.Fatalf("%q: %v", c.entry, err)
		}
		g, _ := Judge(regress, Options{Suppressions: s})
		if got := g.Counts().Suppressed; got != c.hits {
			t.Errorf("%q suppressed %d, want %d", c.entry, got, c.hits)
		}
	}

	for _, c := range []struct{ file, says string }{
		{"id: x\n", "s.txt:1: entry id x has no reason"},
		{"reason: because\n", "no id, lock or function"},
		{"id: x\nreason: a\nreason: b\n", "s.txt:3: reason given twice"},
		{"id: x\nwhy: a\n", `unknown key "why"`},
		{"id: x\nkind: bogus\nreason: a\n", `unknown kind "bogus"`},
		{"just text\n", `want "key: value"`},
		{"id:\nreason: a\n", "id is empty"},
	} {
		if _, err := ReadSuppressions(strings.NewReader(c.file), "s.txt"); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: error %v, want %q", c.file, err, c.says)
		}
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		p, s string
		ok   bool
	}{
		{"*", "", true}, {"a*", "abc", true}, {"*c", "abc", true}, {"a?c", "abc", true},
		{"a*b*c", "axxbyyc", true}, {"a*b*c", "axxbyy", false}, {"vma_lock*", "vma_lock (librcache.so) #2", true},
		{"x", "xy", false}, {"*/lib/*", "/usr/lib/libc.so", true}, {"??", "→a", true},
	} {
		if Glob(c.p, c.s) != c.ok {
			t.Errorf("Glob(%q, %q) = %v", c.p, c.s, !c.ok)
		}
	}
}

// TestGateJSON: the gate section lists what the text says.
func TestGateJSON(t *testing.T) {
	c := gateCases()[2]
	var buf bytes.Buffer
	if err := Render(&buf, "json", mustJudge(t, c)); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Findings []struct {
			ID string `json:"id"`
		} `json:"findings"`
		Gate struct {
			FailOn     string                `json:"fail_on"`
			Failing    []string              `json:"failing"`
			New        []string              `json:"new"`
			Unchanged  []string              `json:"unchanged"`
			Fixed      []struct{ ID string } `json:"fixed"`
			Suppressed []struct {
				ID     string `json:"id"`
				Reason string `json:"reason"`
			} `json:"suppressed"`
			Unused []struct {
				Lock   string `json:"lock"`
				Source string `json:"source"`
			} `json:"unused_suppressions"`
		} `json:"gate"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	gt := doc.Gate
	if gt.FailOn != "error" || len(gt.Failing) != 1 || len(gt.New) != 1 || len(gt.Unchanged) != 2 || len(gt.Fixed) != 1 ||
		len(gt.Suppressed) != 1 || len(gt.Unused) != 1 || gt.Unused[0].Lock != "legacy_lock*" {
		t.Errorf("gate %+v", gt)
	}
	// Without a baseline or suppressions, no gate section: the JSON report
	// is what it always was.
	buf.Reset()
	JSON(&buf, analyzeFixture(t, "regress"))
	if strings.Contains(buf.String(), `"gate"`) {
		t.Error("plain JSON grew a gate section")
	}
}

func mustJudge(t *testing.T, c gateCase) *Gate {
	t.Helper()
	g, err := Judge(analyzeFixture(t, c.fixture), c.opts(t))
	if err != nil {
		t.Fatal(err)
	}
	return g
}
