//go:build linux && amd64

package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestSummary(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	results := map[string][]Result{
		"untraced":  {{Wall: ms(100)}, {Wall: ms(300)}, {Wall: ms(100)}},
		"floor":     {{Wall: ms(1100), Hits: 1000000}, {Wall: ms(1100), Hits: 1000000}, {Wall: ms(5000), Hits: 1000000}},
		"entry":     {{Wall: ms(5100), Hits: 1000000}, {Wall: ms(5100), Hits: 1000000}},
		"aggregate": {{Wall: ms(1300), Hits: 1000000, Lost: 3}, {Wall: ms(1100), Hits: 1000000}, {Wall: ms(1500), Hits: 1000000}},
	}
	s := Summarize(Configs(), results)
	if len(s.Rows) != 4 {
		t.Fatalf("rows %d, want 4 (no full runs)", len(s.Rows))
	}
	if r, _ := s.Row("untraced"); r.Wall != ms(100) {
		t.Errorf("untraced median %v, want 100ms", r.Wall)
	}
	if r, _ := s.Row("entry"); r.Wall != ms(5100) {
		t.Errorf("entry median %v, want 5.1s", r.Wall)
	}
	if w, _ := s.NsPerHit("floor"); w != 1000 {
		t.Errorf("floor ns/hit %v, want 1000", w)
	}
	tg := s.Targets()
	// overheads: floor 1000ms, entry 5000ms, aggregate 1200ms.
	if math.Abs(tg.VsFloor-1.2) > 1e-9 || math.Abs(tg.EntryVs-5000.0/1200) > 1e-9 || tg.LostDefault != 3 {
		t.Errorf("targets %+v, want 1.2, 4.17, 3 lost", tg)
	}
	md := s.Markdown("w")
	for _, want := range []string{"| floor at hooktrace's sites | 1.100 s | 11.0x |", "| 1.20 |", "| ≥ 5 | **no** |", "| 3 | | 0 | **no** |"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
