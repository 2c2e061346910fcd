// Package funcname reads the function names users write in rules and
// --probe: C names, demangled C++ names with or without their parameter
// list, and mangled names, and the compiler's clone suffixes.
//
// C++ names hold '<', '>', '(' and ')' (templates, casts in template
// arguments, operator names), so the separators of a rule ("OUTER>INNER")
// are looked for only at the top level, outside balanced brackets.
package funcname

import (
	"strings"
	"unicode"
)

// SplitTop splits s at every sep that is outside balanced <> and (); ok is
// false when the brackets do not balance. "f<a>b" has no top-level '>'.
func SplitTop(s string, sep byte) (parts []string, ok bool) {
	angle, paren := 0, 0
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == sep && angle == 0 && paren == 0 && !operatorAt(s, i) {
			parts = append(parts, s[start:i])
			start = i + 1
			continue
		}
		switch c {
		case '(':
			paren++
		case ')':
			paren--
		case '<':
			if paren == 0 && !operatorAt(s, i) {
				angle++
			}
		case '>':
			if paren == 0 && !operatorAt(s, i) && !(i > 0 && s[i-1] == '-') {
				angle--
			}
		}
		if paren < 0 || angle < 0 {
			return nil, false
		}
	}
	if paren != 0 || angle != 0 {
		return nil, false
	}
	return append(parts, s[start:]), true
}

// operatorAt: the '<' or '>' at i belongs to an operator's name
// ("operator<", "operator>>=", "operator<=>"), not to a template.
func operatorAt(s string, i int) bool {
	j := i
	for j > 0 && strings.ContainsRune("<>=", rune(s[j-1])) {
		j--
	}
	return strings.HasSuffix(strings.TrimRight(s[:j], " "), "operator")
}

// Normalize spells a name the one way Match compares: no spaces but one
// before a word that follows a word or a type, and no "@version".
func Normalize(name string) string {
	name = strings.TrimSpace(name)
	if i := strings.IndexByte(name, '@'); i > 0 {
		name = name[:i]
	}
	if !strings.ContainsAny(name, " \t") {
		return name
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == ' ' || c == '\t' {
			j := i
			for j < len(name) && (name[j] == ' ' || name[j] == '\t') {
				j++
			}
			// A space stays before a word that follows a word or a
			// type ("unsigned long", "future<int> ns::f", "(int) const").
			if i > 0 && j < len(name) && (isIdent(name[i-1]) || strings.IndexByte(">)*&", name[i-1]) >= 0) && isIdent(name[j]) {
				b.WriteByte(' ')
			}
			i = j - 1
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c < 0x80 && (unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)))
}

// cloneKinds are gcc's suffixes of a function's copies that are entered by
// a call: the copy is the function. ".cold" (and ".part" of a cold path is
// still ".cold") is a fragment jumped to from inside, never an entry.
var cloneKinds = []string{".constprop.", ".isra.", ".part.", ".lto_priv.", ".localalias"}

// Clone splits a symbol name into the function it copies and whether it
// is an entry point: "f.constprop.0" is f's entry, "f.cold" and
// "f.part.0.cold" are not. Demangled clones ("f(int) [clone .isra.0]")
// are read as well.
func Clone(sym string) (base string, entry bool) {
	if i := strings.Index(sym, " [clone "); i > 0 {
		rest := sym[i:]
		return sym[:i], !strings.Contains(rest, ".cold")
	}
	i := strings.IndexByte(sym, '.')
	if i <= 0 {
		return sym, true
	}
	suffix := sym[i:]
	if strings.Contains(suffix, ".cold") {
		return sym[:i], false
	}
	for _, k := range cloneKinds {
		if strings.HasPrefix(suffix, k) {
			return sym[:i], true
		}
	}
	// Some other dot ("f.localalias", a C name with a dot): the name as is.
	return sym, true
}

// Params splits a demangled name into the function and its parameter
// list with qualifiers: "ns::f<int>(int) const" is "ns::f<int>" and
// "(int) const"; a name without one returns "".
func Params(name string) (fn, params string) {
	name = strings.TrimSpace(name)
	// The last top-level '(' that is not part of the function's own name
	// (operator()) opens the parameter list.
	angle, paren, open := 0, 0, -1
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '(':
			if paren == 0 && angle == 0 && !strings.HasSuffix(name[:i], "operator") {
				open = i
			}
			paren++
		case ')':
			paren--
		case '<':
			if paren == 0 && !operatorAt(name, i) {
				angle++
			}
		case '>':
			if paren == 0 && !operatorAt(name, i) && !(i > 0 && name[i-1] == '-') {
				angle--
			}
		}
	}
	if open <= 0 {
		return name, ""
	}
	return strings.TrimRight(name[:open], " "), name[open:]
}

// Match reports whether a function named want (as a user wrote it: plain,
// C++ with or without parameters, or mangled) is the symbol or frame named
// got; demangled is got's demangled form when got is mangled (or "").
// Clones of the function match; .cold fragments do not.
func Match(want, got, demangled string) bool {
	want = Normalize(want)
	if want == "" {
		return false
	}
	base, entry := Clone(Normalize(got))
	if !entry {
		return false
	}
	if base == want {
		return true
	}
	if demangled == "" {
		demangled = got
	}
	d, entry := Clone(Normalize(demangled))
	if !entry {
		return false
	}
	if d == want {
		return true
	}
	fn, _ := Params(d)
	// A template function's demangled name starts with its return type,
	// and its template arguments may be left out.
	forms := []string{fn, withoutTemplateArgs(fn)}
	if !strings.Contains(want, "<") {
		// "upcxx::atomic_domain::fetch_add" names every instance of
		// upcxx::atomic_domain<T>::fetch_add<...>.
		forms = append(forms, withoutAnyTemplateArgs(fn))
	}
	for _, f := range forms {
		if f == want || strings.HasSuffix(f, " "+want) {
			return true
		}
	}
	return false
}

// withoutTemplateArgs drops the template argument list that ends a name:
// "ns::f<int, 2>" is "ns::f".
func withoutTemplateArgs(name string) string {
	if !strings.HasSuffix(name, ">") || strings.HasSuffix(name, "operator>") {
		return name
	}
	depth := 0
	for i := len(name) - 1; i >= 0; i-- {
		switch name[i] {
		case '>':
			depth++
		case '<':
			depth--
			if depth == 0 {
				return name[:i]
			}
		}
	}
	return name
}

// withoutAnyTemplateArgs drops every template argument list of a name:
// "R<int> ns::C<T>::f<2>" is "R ns::C::f".
func withoutAnyTemplateArgs(name string) string {
	if !strings.Contains(name, "<") {
		return name
	}
	var b strings.Builder
	depth := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '<' && !operatorAt(name, i):
			depth++
			continue
		case c == '>' && depth > 0 && !operatorAt(name, i):
			depth--
			continue
		}
		if depth == 0 {
			b.WriteByte(c)
		}
	}
	return b.String()
}
