package analyzer

import (
	"errors"
	"strconv"
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
	// OuterArg0 and InnerArg0, when set, make the function count only
	// when entered with that first integer argument ("NAME if arg0 == V"):
	// upcxx::progress(progress_level) makes user-level progress only
	// with the level user. A conditional Outer must be a probed function:
	// a frame of the stack does not say its arguments.
	OuterArg0, InnerArg0 Arg0
	// Unless names the function this rule stands in for in programs
	// that lack it (an optimised build inlined it): its sightings in a
	// process that entered Unless are dropped, as the rules on Unless
	// itself say it better there.
	Unless string
	// Why is the rule's reason, as its pack states it (a specification
	// and its section); empty for a --forbid rule.
	Why string
}

// ParseRule parses "OUTER>INNER", optionally followed by "# WHY". The
// names may be C++ names as a debugger prints them: the rule is split at
// the one '>' outside their balanced <> and (). Either side may end in
// " if arg0 == V", and INNER in " unless NAME" (see Rule).
func ParseRule(text string) (Rule, error) {
	spec, why, _ := strings.Cut(text, "#")
	parts, balanced := funcname.SplitTop(spec, '>')
	if !balanced {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": want OUTER>INNER (its <> or () do not balance)")
	}
	if len(parts) != 2 || strings.TrimSpace(parts[0]) == "" || strings.TrimSpace(parts[1]) == "" {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": want OUTER>INNER")
	}
	r := Rule{Why: strings.TrimSpace(why)}
	inner, unless, _ := strings.Cut(parts[1], " unless ")
	r.Unless = strings.TrimSpace(unless)
	var err error
	if r.Outer, r.OuterArg0, err = parseSide(parts[0]); err == nil {
		r.Inner, r.InnerArg0, err = parseSide(inner)
	}
	if err != nil {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": " + err.Error())
	}
	if r.Outer == "" || r.Inner == "" {
		return Rule{}, errors.New("forbid rule " + quote(text) + ": want OUTER>INNER")
	}
	return r, nil
}

// Arg0 is a condition on a function's first integer argument: the
// function counts only when entered with Value, if Set.
type Arg0 struct {
	Set   bool
	Value uint64
}

// holds reports whether a call whose first argument is v meets it.
func (c Arg0) holds(v uint64) bool { return !c.Set || c.Value == v }

// parseSide reads "NAME" or "NAME if arg0 == V".
func parseSide(s string) (string, Arg0, error) {
	name, cond, ok := strings.Cut(s, " if ")
	name = strings.TrimSpace(name)
	if !ok {
		return name, Arg0{}, nil
	}
	f := strings.Fields(strings.ReplaceAll(cond, "==", " == "))
	if len(f) != 3 || f[0] != "arg0" || f[1] != "==" {
		return "", Arg0{}, errors.New("want NAME if arg0 == VALUE (only the first integer argument is recorded)")
	}
	v, err := strconv.ParseUint(f[2], 0, 64)
	if err != nil {
		n, nerr := strconv.ParseInt(f[2], 0, 64)
		if nerr != nil {
			return "", Arg0{}, errors.New("arg0 == " + f[2] + ": not an integer")
		}
		v = uint64(n)
	}
	return name, Arg0{Set: true, Value: v}, nil
}

// OuterText and InnerText are the sides as written, conditions included.
func (r Rule) OuterText() string { return sideText(r.Outer, r.OuterArg0) }
func (r Rule) InnerText() string { return sideText(r.Inner, r.InnerArg0) }

func sideText(name string, arg0 Arg0) string {
	if !arg0.Set {
		return name
	}
	return name + " if arg0 == " + strconv.FormatUint(arg0.Value, 10)
}

func (r Rule) String() string {
	s := r.OuterText() + ">" + r.InnerText()
	if r.Unless != "" {
		s += " unless " + r.Unless
	}
	return s
}

// Spec is the rule as ParseRule reads it back, its reason included.
func (r Rule) Spec() string {
	if r.Why == "" {
		return r.String()
	}
	return r.String() + " # " + r.Why
}

// Probed lists the functions the rule needs probed: Inner, a conditional
// Outer (other Outers are found on the stack too) and Unless.
func (r Rule) Probed() []string {
	out := []string{r.Inner}
	if r.OuterArg0.Set {
		out = append(out, r.Outer)
	}
	if r.Unless != "" {
		out = append(out, r.Unless)
	}
	return out
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
		if !a.matches(r.Inner, name) || !r.InnerArg0.holds(e.Addr) {
			continue
		}
		var outerStack *events.Stack
		found := false
		for i := len(t.probes) - 1; i >= 0; i-- {
			p := &t.probes[i]
			if a.matches(r.Outer, p.name) && r.OuterArg0.holds(p.arg0) {
				found = true
				outerStack = t.stream.stack(p.stack)
				break
			}
		}
		if !found && !r.OuterArg0.Set {
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
