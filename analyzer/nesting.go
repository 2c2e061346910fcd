package analyzer

import (
	"errors"
	"strings"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/funcname"
)

// Rule forbids Inner from running while Outer is on the same thread's
// stack. Inner is a function traced with --probe; Outer is one too, or a
// frame of the stack Inner is entered with.
type Rule struct {
	Outer string
	Inner string
	// Why is the rule's reason, as its pack states it (a specification
	// and its section); empty for a --forbid rule.
	Why string
}

// ParseRule parses "OUTER>INNER", optionally followed by "# WHY". The
// names may be C++ names as a debugger prints them: the rule is split at
// the one '>' outside their balanced <> and ().
func ParseRule(text string) (Rule, error) {
	spec, why, _ := strings.Cut(text, "#")
	parts, balanced := funcname.SplitTop(spec, '>')
	if !balanced {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": want OUTER>INNER (its <> or () do not balance)")
	}
	if len(parts) != 2 || strings.TrimSpace(parts[0]) == "" || strings.TrimSpace(parts[1]) == "" {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": want OUTER>INNER")
	}
	return Rule{Outer: strings.TrimSpace(parts[0]), Inner: strings.TrimSpace(parts[1]), Why: strings.TrimSpace(why)}, nil
}

func (r Rule) String() string { return r.Outer + ">" + r.Inner }

// Spec is the rule as ParseRule reads it back, its reason included.
func (r Rule) Spec() string {
	if r.Why == "" {
		return r.String()
	}
	return r.String() + " # " + r.Why
}

func quote(s string) string { return "\"" + s + "\"" }

type nestSighting struct {
	rule       Rule
	stream     *stream
	pid, tid   uint32
	outerStack *events.Stack
	stack      *events.Stack
	inAlloc    bool
	count      uint64
	where      seenCounts
}

// checkNesting runs when a probed function is entered: a rule is broken
// when its Outer is active on the thread, as a probed function or as a
// frame of the entry's stack (which catches an Outer whose entry was lost).
func (a *Analyzer) checkNesting(t *thread, e *events.Event, name string) {
	var st *events.Stack
	for ri, r := range a.rules {
		if !a.matches(r.Inner, name) {
			continue
		}
		var outerStack *events.Stack
		found := false
		for i := len(t.probes) - 1; i >= 0; i-- {
			if a.matches(r.Outer, t.probes[i].name) {
				found = true
				outerStack = t.stream.stack(t.probes[i].stack)
				break
			}
		}
		if !found {
			if st == nil {
				st = t.stream.stack(e.Stack)
			}
			found = a.stackHasFunction(st, r.Outer)
		}
		if !found {
			continue
		}
		if n := a.nestings[ri]; n != nil {
			n.count++
			n.where.add(t.stream, t.pid, t.tid, 1)
			continue
		}
		if st == nil {
			st = t.stream.stack(e.Stack)
		}
		n := &nestSighting{
			rule:       r,
			stream:     t.stream,
			pid:        t.pid,
			tid:        t.tid,
			outerStack: outerStack,
			stack:      st,
			inAlloc:    e.Flags&events.FlagInAlloc != 0,
			count:      1,
			where:      seenCounts{},
		}
		n.where.add(t.stream, t.pid, t.tid, 1)
		a.nestings[ri] = n
		a.nestList = append(a.nestList, n)
	}
}

func (a *Analyzer) stackHasFunction(st *events.Stack, fn string) bool {
	if st == nil {
		return false
	}
	// The first frame is the probed function itself.
	for i := 1; i < len(st.Frames); i++ {
		if a.matches(fn, st.Frames[i].Function) {
			return true
		}
	}
	return false
}

// matches is funcname.Match, remembered: a rule pack checks tens of
// names against the same frames at every entry of its inner function.
func (a *Analyzer) matches(want, got string) bool {
	if got == "" {
		return false
	}
	k := [2]string{want, got}
	m, ok := a.matchCache[k]
	if !ok {
		m = funcname.Match(want, got, "")
		if a.matchCache == nil {
			a.matchCache = map[[2]string]bool{}
		}
		a.matchCache[k] = m
	}
	return m
}
