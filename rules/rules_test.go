package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUPCXXPack(t *testing.T) {
	p, err := Load("upcxx")
	if err != nil {
		t.Fatal(err)
	}
	const user = "upcxx::detail::persona_tls::burst_user"
	var internal, restricted int
	for _, r := range p.Rules {
		if !strings.Contains(r.Why, "spec 2020.10.0 §") {
			t.Errorf("%s cites no section of the specification: %q", r, r.Why)
		}
		switch {
		case r.Inner == user:
			internal++
		case r.Outer == user:
			restricted++
		default:
			t.Errorf("%s: neither side is user-level progress", r)
		}
	}
	if internal < 20 || restricted < 4 {
		t.Errorf("%d progress-level rules and %d restricted-context rules", internal, restricted)
	}
	if !strings.Contains(p.Missing[user], "opt") {
		t.Errorf("no explanation for an opt build: %q", p.Missing[user])
	}
	if got := p.Inners(); got[0] != user {
		t.Errorf("inners %v", got)
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
