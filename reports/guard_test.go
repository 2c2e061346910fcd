package reports

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
)

// guardedResult: cache_lock and stats_lock inverted by two threads, both
// always under gate_lock (Goodlock's guarded cycle).
func guardedResult(t *testing.T) *analyzer.Result {
	t.Helper()
	b := newFx(&events.Header{Command: []string{"./server"}})
	b.Name(addrA, "gate_lock (server)")
	b.Name(addrB, "cache_lock (server)")
	b.Name(addrC, "stats_lock (server)")
	for _, p := range []struct {
		tid           uint32
		first, second uint64
		fn            string
	}{{1, addrB, addrC, "update_cache"}, {2, addrC, addrB, "report_stats"}} {
		b.Lock(p.tid, addrA, "pthread_mutex_lock"+libc, p.fn)
		b.Lock(p.tid, p.first, "pthread_mutex_lock"+libc, p.fn)
		b.Lock(p.tid, p.second, "pthread_mutex_lock"+libc, p.fn)
		b.Unlock(p.tid, p.second)
		b.Unlock(p.tid, p.first)
		b.Unlock(p.tid, addrA)
	}
	fxFooter(b)
	a := analyzer.New(analyzer.Options{})
	a.BeginStream("server.htr")
	for _, r := range b.Records() {
		a.Add(r)
	}
	res := a.Result()
	if len(res.Findings) != 1 || res.Findings[0].Gate != "gate_lock (server)" || res.Findings[0].Severity != analyzer.SeverityWarning {
		t.Fatalf("want one guarded warning, got %+v", res.Findings)
	}
	return res
}

// TestGateInEveryFormat: the guarded cycle's gate shows in every report.
func TestGateInEveryFormat(t *testing.T) {
	res := guardedResult(t)
	for _, format := range Formats {
		var buf bytes.Buffer
		if err := Render(&buf, format, plain(res)); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		out := buf.String()
		want := "gate_lock (server)"
		switch format {
		case "json":
			want = `"gate": "gate_lock (server)"`
		case "sarif":
			want = `"gate": "gate_lock (server)"`
		case "dot":
			want = `gate_lock (server)\n(gate)`
		case "text", "junit":
			want = "guard:   every path holds gate_lock (server)"
		case "markdown":
			// The summary lists a passing finding by its title only.
			want = `(guarded by gate\_lock (server))`
		case "html":
			want = "<strong>Guarded by</strong> gate_lock (server)"
		}
		if !strings.Contains(out, want) {
			t.Errorf("%s report lacks %q:\n%s", format, want, out)
		}
	}
}
