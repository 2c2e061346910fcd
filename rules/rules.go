// Package rules reads nesting-rule packs: the built-in ones --rules names
// (upcxx) and rule files in the same format.
//
// A pack is text, one rule a line:
//
//	OUTER > INNER   # why (the specification and section it comes from)
//	missing INNER: what it means that INNER is not in the program
//	fallback NAME = OTHER if arg0 == V   # why OTHER stands in for NAME
//
// A fallback adds, for every rule with NAME on a side, the same rule with
// OTHER there instead, which counts only in processes that never entered
// NAME (analyzer.Rule's Unless): an optimised build that inlined NAME
// into OTHER is still checked, and a build that has NAME is not reported
// twice.
//
// INNER is probed; OUTER is found on the stack INNER is entered with (or
// is a probed function). Blank lines and lines starting with '#' are
// comments. Names are C, or C++ as a debugger prints them
// (internal/funcname). A pack's INNER functions are optional: a program
// that does not contain one is not checked against the rules that need it.
package rules

import (
	"embed"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

//go:embed *.rules
var builtin embed.FS

// Pack is a set of rules and what their absence means.
type Pack struct {
	Name  string
	Rules []analyzer.Rule
	// Missing explains, by INNER function, what a program without it
	// means for the rules (an optimised build that inlined it).
	Missing map[string]string
}

// Builtin lists the packs --rules knows by name.
func Builtin() []string {
	ents, _ := builtin.ReadDir(".")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".rules"))
	}
	sort.Strings(out)
	return out
}

// Load reads the built-in pack called name, or else the file name.
func Load(name string) (*Pack, error) {
	if b, err := builtin.ReadFile(name + ".rules"); err == nil {
		return Parse(name, string(b))
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--rules %s: neither a built-in pack (%s) nor a readable file: %w", name, strings.Join(Builtin(), ", "), err)
	}
	return Parse(name, string(b))
}

// Parse reads a pack's text; name is what errors call it.
func Parse(name, text string) (*Pack, error) {
	p := &Pack{Name: name, Missing: map[string]string{}}
	var fallbacks []fallback
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "fallback "); ok {
			fb, err := parseFallback(rest)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
			}
			fallbacks = append(fallbacks, fb)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "missing "); ok {
			fn, why, ok := cutTop(rest, ':')
			if !ok || fn == "" || why == "" {
				return nil, fmt.Errorf("%s:%d: want missing INNER: EXPLANATION", name, i+1)
			}
			p.Missing[fn] = why
			continue
		}
		r, err := analyzer.ParseRule(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		p.Rules = append(p.Rules, r)
	}
	if len(p.Rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", name)
	}
	for _, fb := range fallbacks {
		n := 0
		for _, r := range p.Rules {
			if r.Unless != "" || (r.Inner != fb.name && r.Outer != fb.name) {
				continue
			}
			if r.Inner == fb.name {
				r.Inner, r.InnerArg0 = fb.other.Inner, fb.other.InnerArg0
			} else {
				r.Outer, r.OuterArg0 = fb.other.Inner, fb.other.InnerArg0
			}
			r.Unless = fb.name
			p.Rules = append(p.Rules, r)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: fallback %s: no rule has it", name, fb.name)
		}
	}
	return p, nil
}

// fallback is a pack's "fallback NAME = OTHER" line: OTHER (a function
// and a condition, held as a rule's Inner side) stands in for NAME.
type fallback struct {
	name  string
	other analyzer.Rule
}

func parseFallback(text string) (fallback, error) {
	spec, _, _ := strings.Cut(text, "#")
	name, other, ok := strings.Cut(spec, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.TrimSpace(other) == "" {
		return fallback{}, fmt.Errorf("want fallback NAME = OTHER [if arg0 == V]")
	}
	// Read OTHER as the inner side of a rule.
	r, err := analyzer.ParseRule("x > " + other)
	if err != nil {
		return fallback{}, fmt.Errorf("fallback %s: %w", name, err)
	}
	return fallback{name: name, other: r}, nil
}

// cutTop cuts s at the first sep that is not part of a C++ scope ("::").
func cutTop(s string, sep byte) (before, after string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != sep {
			continue
		}
		if sep == ':' && (i+1 < len(s) && s[i+1] == ':' || i > 0 && s[i-1] == ':') {
			continue
		}
		return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:]), true
	}
	return "", "", false
}

// Probed lists the functions the pack's rules probe (analyzer.Rule's
// Probed), each once, in rule order.
func (p *Pack) Probed() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range p.Rules {
		for _, fn := range r.Probed() {
			if !seen[fn] {
				seen[fn] = true
				out = append(out, fn)
			}
		}
	}
	return out
}
