package rules

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
)

func TestUPCXXPack(t *testing.T) {
	p, err := Load("upcxx")
	if err != nil {
		t.Fatal(err)
	}
	const user = "upcxx::detail::persona_tls::burst_user"
	const userProgress = "upcxx::progress if arg0 == 1"
	var internal, restricted, fallbacks int
	for _, r := range p.Rules {
		if !strings.Contains(r.Why, "spec 2020.10.0 §") {
			t.Errorf("%s cites no section of the specification: %q", r, r.Why)
		}
		switch {
		case r.Unless == user && (r.InnerText() == userProgress || r.OuterText() == userProgress):
			fallbacks++
		case r.Unless != "":
			t.Errorf("%s stands in for %s", r, r.Unless)
		case r.Inner == user:
			internal++
		case r.Outer == user:
			restricted++
		default:
			t.Errorf("%s: neither side is user-level progress", r)
		}
	}
	if internal < 20 || restricted < 4 || fallbacks != internal+restricted {
		t.Errorf("%d progress-level rules, %d restricted-context rules, %d standing in for them on opt builds", internal, restricted, fallbacks)
	}
	if !strings.Contains(p.Missing[user], "opt") {
		t.Errorf("no explanation for an opt build: %q", p.Missing[user])
	}
	if got := p.Probed(); got[0] != user || !slices.Contains(got, "upcxx::progress") {
		t.Errorf("probed %v", got)
	}
}

func TestRulesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.rules")
	text := "# mine\n\nns::f<int, 2>(int) > ns::g  # because\nmissing ns::g: not built in\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 1 || p.Rules[0].Outer != "ns::f<int, 2>(int)" || p.Rules[0].Inner != "ns::g" || p.Rules[0].Why != "because" {
		t.Errorf("rules %+v", p.Rules)
	}
	if p.Missing["ns::g"] != "not built in" {
		t.Errorf("missing %v", p.Missing)
	}
	for _, bad := range []string{"f>g>h\n", "missing f\n", "# only a comment\n"} {
		if _, err := Parse("bad", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := Load("no-such-pack"); err == nil || !strings.Contains(err.Error(), "upcxx") {
		t.Errorf("unknown pack: %v", err)
	}
}

// TestFallback: a fallback line gives each rule on its function a twin on
// the other, with its condition, standing in; the twin reads back as
// written.
func TestFallback(t *testing.T) {
	p, err := Parse("mine", "a > f  # one\nf > b  # two\nfallback f = g(int) if arg0 == 0x10  # inlined\n")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range p.Rules {
		got = append(got, r.Spec())
	}
	want := []string{"a>f # one", "f>b # two", "a>g(int) if arg0 == 16 unless f # one", "g(int) if arg0 == 16>b unless f # two"}
	if !slices.Equal(got, want) {
		t.Errorf("rules %q, want %q", got, want)
	}
	for _, r := range p.Rules {
		back, err := analyzer.ParseRule(r.Spec())
		if err != nil || back != r {
			t.Errorf("%q reads back as %+v (%v), want %+v", r.Spec(), back, err, r)
		}
	}
	if got := p.Probed(); !slices.Equal(got, []string{"f", "b", "g(int)"}) {
		t.Errorf("probed %q", got)
	}
	for _, bad := range []string{"fallback f\n", "fallback zz = g\n", "fallback f = g if arg1 == 2\n"} {
		if _, err := Parse("bad", "a > f\n"+bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
