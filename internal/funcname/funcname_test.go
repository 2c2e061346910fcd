package funcname

import (
	"slices"
	"testing"
)

func TestSplitTop(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"main>worker", []string{"main", "worker"}},
		{"main > worker", []string{"main ", " worker"}},
		{"my_internal_fn(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>)>on_incoming_rpc",
			[]string{"my_internal_fn(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>)", "on_incoming_rpc"}},
		{"a<b<c>>>d", []string{"a<b<c>>", "d"}},
		{"X::operator>(X const&)>g", []string{"X::operator>(X const&)", "g"}},
		{"X::operator<<(int)>g", []string{"X::operator<<(int)", "g"}},
		{"f(int (*)(a->b))>g", []string{"f(int (*)(a->b))", "g"}},
		{"a>b>c", []string{"a", "b", "c"}},
		{"plain", []string{"plain"}},
	} {
		got, ok := SplitTop(c.in, '>')
		if !ok || !slices.Equal(got, c.want) {
			t.Errorf("SplitTop(%q) = %q, %v; want %q", c.in, got, ok, c.want)
		}
	}
	for _, bad := range []string{"f<int>>", "f(int", "f<int"} {
		if got, ok := SplitTop(bad+"x", '>'); ok && len(got) == 1 {
			t.Errorf("SplitTop(%q) = %q, want a split or unbalanced", bad, got)
		}
	}
}

func TestClone(t *testing.T) {
	for _, c := range []struct {
		sym   string
		base  string
		entry bool
	}{
		{"f", "f", true},
		{"f.constprop.0", "f", true},
		{"f.isra.1", "f", true},
		{"f.part.0", "f", true},
		{"f.cold", "f", false},
		{"f.part.0.cold", "f", false},
		{"f.constprop.0.isra.0", "f", true},
		{"_Z3fooi.constprop.0", "_Z3fooi", true},
		{"foo(int) [clone .isra.0]", "foo(int)", true},
		{"foo(int) [clone .cold]", "foo(int)", false},
	} {
		base, entry := Clone(c.sym)
		if base != c.base || entry != c.entry {
			t.Errorf("Clone(%q) = %q, %v; want %q, %v", c.sym, base, entry, c.base, c.entry)
		}
	}
}

func TestMatch(t *testing.T) {
	const fn = "my_internal_fn(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>)"
	for _, c := range []struct {
		want, got, demangled string
		match                bool
	}{
		{"main", "main", "", true},
		{"worker", "worker.constprop.0", "", true},
		{"worker", "worker.cold", "", false},
		{"worker", "worker2", "", false},
		{fn, "_Z14my_internal_fniN5upcxx10global_ptrIiLNS_11memory_kindE1EEE", fn, true},
		{"my_internal_fn", "_Z14my_internal_fniN5upcxx10global_ptrIiLNS_11memory_kindE1EEE", fn, true},
		{"my_internal_fn(int,upcxx::global_ptr<int,(upcxx::memory_kind)1>)", "x", fn, true},
		{"_Z14my_internal_fniN5upcxx10global_ptrIiLNS_11memory_kindE1EEE", "_Z14my_internal_fniN5upcxx10global_ptrIiLNS_11memory_kindE1EEE", fn, true},
		{"upcxx::detail::persona_tls::burst_user", "x", "void upcxx::detail::persona_tls::burst_user<false>(upcxx::persona&)", true},
		{"upcxx::detail::persona_tls::burst_user<false>", "x", "void upcxx::detail::persona_tls::burst_user<false>(upcxx::persona&)", true},
		{"persona_tls::burst_user", "x", "void upcxx::detail::persona_tls::burst_user<false>(upcxx::persona&)", false},
		{"upcxx::progress", "x", "upcxx::progress(upcxx::progress_level)", true},
		{"upcxx::progress", "x", "upcxx::progress(upcxx::progress_level) [clone .cold]", false},
		{"A::operator()", "x", "A::operator()(int) const", true},
		{"upcxx::atomic_domain::fetch_add", "x", "upcxx::future<int> upcxx::atomic_domain<int>::fetch_add<upcxx::completions<> >(upcxx::global_ptr<int, (upcxx::memory_kind)1>, int, std::memory_order, upcxx::completions<>) const", true},
		{"upcxx::rput", "x", "upcxx::detail::completions_returner<upcxx::detail::event_is_here, upcxx::operation_cx_event>::return_t upcxx::rput<int, upcxx::completions<> >(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>, upcxx::completions<>)", true},
		{"upcxx::rput", "x", "upcxx::rput_strided<int>(int)", false},
	} {
		if got := Match(c.want, c.got, c.demangled); got != c.match {
			t.Errorf("Match(%q, %q, %q) = %v, want %v", c.want, c.got, c.demangled, got, c.match)
		}
	}
}
