package reports

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hooktrace/hooktrace/analyzer"
)

// Suppression is one entry of a suppressions file: a finding it matches
// is reported but never fails the gate.
//
// The file is a list of entries separated by blank lines, one "key: value"
// per line, '#' starting a comment line:
//
//	# the pool lock is only taken before the threads start
//	id: lock-order-cycle-0123456789ab
//	reason: reviewed in PR 42
//
//	lock: vma_lock*
//	function: mca_rcache_*
//	kind: hook-lock
//	reason: the hook never runs with the arena lock held
//
// An entry selects by id (a finding ID), lock (a lock name) or function (a
// function on any stack of the finding), at least one of them; every
// selector given must match. Values of id, lock and function are patterns:
// '*' matches any run of characters, '?' one character. kind restricts
// the entry to one kind of finding. reason is required.
type Suppression struct {
	ID       string `json:"id,omitempty"`
	Lock     string `json:"lock,omitempty"`
	Function string `json:"function,omitempty"`
	Kind     string `json:"kind,omitempty"`
	Reason   string `json:"reason"`
	// Where the entry starts: "file:line".
	Source string `json:"source"`

	used bool
}

// Suppressions is a parsed suppressions file.
type Suppressions struct {
	Entries []*Suppression
}

// String describes the entry's selectors: `id lock-order-cycle-… lock vma_*`.
func (s *Suppression) String() string {
	var parts []string
	for _, kv := range [][2]string{{"id", s.ID}, {"lock", s.Lock}, {"function", s.Function}, {"kind", s.Kind}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+" "+kv[1])
		}
	}
	return strings.Join(parts, ", ")
}

// ReadSuppressions parses a suppressions file; name labels errors.
func ReadSuppressions(r io.Reader, name string) (*Suppressions, error) {
	out := &Suppressions{}
	var cur *Suppression
	seen := map[string]bool{}
	finish := func() error {
		if cur == nil {
			return nil
		}
		if cur.ID == "" && cur.Lock == "" && cur.Function == "" {
			return fmt.Errorf("%s: entry has no id, lock or function to match", cur.Source)
		}
		if cur.Reason == "" {
			return fmt.Errorf("%s: entry %s has no reason (every suppression needs one)", cur.Source, cur)
		}
		out.Entries = append(out.Entries, cur)
		cur = nil
		return nil
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			if err := finish(); err != nil {
				return nil, err
			}
			continue
		}
		if strings.HasPrefix(text, "#") {
			continue
		}
		key, value, ok := strings.Cut(text, ":")
		key, value = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(value)
		where := fmt.Sprintf("%s:%d", name, line)
		if strings.ContainsRune(text, 0) || !utf8.ValidString(text) {
			return nil, fmt.Errorf("%s: not a text line (a binary file?): %s", where, excerpt(text))
		}
		if !ok || key == "" {
			return nil, fmt.Errorf("%s: want \"key: value\" (id, lock, function, kind, reason), got %s", where, excerpt(text))
		}
		if cur == nil {
			cur = &Suppression{Source: where}
			seen = map[string]bool{}
		}
		if seen[key] {
			return nil, fmt.Errorf("%s: %s given twice in one entry", where, key)
		}
		seen[key] = true
		if value == "" {
			return nil, fmt.Errorf("%s: %s is empty", where, key)
		}
		switch key {
		case "id":
			cur.ID = value
		case "lock":
			cur.Lock = value
		case "function":
			cur.Function = value
		case "kind":
			if !knownKind(value) {
				return nil, fmt.Errorf("%s: unknown kind %s", where, excerpt(value))
			}
			cur.Kind = value
		case "reason":
			cur.Reason = value
		default:
			return nil, fmt.Errorf("%s: unknown key %s (want id, lock, function, kind or reason)", where, excerpt(key))
		}
	}
	if err := sc.Err(); err == bufio.ErrTooLong {
		return nil, fmt.Errorf("%s:%d: a line longer than 1 MiB (not a suppressions file?)", name, line+1)
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return out, nil
}

// excerpt quotes the start of a bad line: an error stays one readable
// line even when the file is not text at all.
func excerpt(s string) string {
	const max = 40
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("... (%d bytes)", len(s))
}

// LoadSuppressions reads a suppressions file.
func LoadSuppressions(path string) (*Suppressions, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("suppressions: %w", err)
	}
	defer f.Close()
	return ReadSuppressions(f, path)
}

func knownKind(k string) bool {
	switch analyzer.Kind(k) {
	case analyzer.KindLockOrderCycle, analyzer.KindSelfDeadlock, analyzer.KindAllocatorReentry,
		analyzer.KindHookLock, analyzer.KindForbiddenNesting, analyzer.KindDeadlock, analyzer.KindLockMisuse:
		return true
	}
	return false
}

// match returns the first entry matching f and marks every matching entry
// used.
func (s *Suppressions) match(f *analyzer.Finding) *Suppression {
	var first *Suppression
	for _, e := range s.Entries {
		if e.matches(f) {
			e.used = true
			if first == nil {
				first = e
			}
		}
	}
	return first
}

func (s *Suppressions) unused() []Suppression {
	var out []Suppression
	for _, e := range s.Entries {
		if !e.used {
			out = append(out, *e)
		}
	}
	return out
}

func (e *Suppression) matches(f *analyzer.Finding) bool {
	if e.Kind != "" && string(f.Kind) != e.Kind {
		return false
	}
	if e.ID != "" && !Glob(e.ID, f.ID) {
		return false
	}
	if e.Lock != "" && !anyLock(e.Lock, f) {
		return false
	}
	if e.Function != "" && !anyFunction(e.Function, f) {
		return false
	}
	return true
}

func anyLock(pattern string, f *analyzer.Finding) bool {
	for _, l := range f.Locks {
		if Glob(pattern, l) || Glob(pattern, className(l)) {
			return true
		}
	}
	return false
}

// className strips the " #N" that tells instances of a class apart.
func className(label string) string {
	if i := strings.LastIndex(label, " #"); i > 0 {
		rest := label[i+2:]
		if rest != "" && strings.Trim(rest, "0123456789") == "" {
			return label[:i]
		}
	}
	return label
}

func anyFunction(pattern string, f *analyzer.Finding) bool {
	for _, e := range f.Edges {
		for _, st := range [][]analyzer.Frame{e.Stack, e.HeldStack} {
			for _, fr := range st {
				if fr.Function != "" && Glob(pattern, fr.Function) {
					return true
				}
			}
		}
	}
	return false
}

// Glob matches name against pattern, where '*' matches any run of
// characters (slashes too) and '?' any one character.
func Glob(pattern, name string) bool {
	p, n := []rune(pattern), []rune(name)
	// Iterative matching with one backtrack point: linear in practice.
	pi, ni, star, mark := 0, 0, -1, 0
	for ni < len(n) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == n[ni]):
			pi++
			ni++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, ni
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			ni = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
