package reports

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

// Bounds that keep a Markdown report short enough for a pull-request
// comment; the other formats have everything.
const (
	mdMaxRows    = 30
	mdMaxDetails = 8
	mdMaxFrames  = 4
	mdMaxFixed   = 15
)

// Markdown writes the gate for a pull-request comment or a CI job summary:
// the verdict, a table of findings, then for each failing finding its
// cycle and the top frames of each edge.
func Markdown(w io.Writer, g *Gate) error {
	bw := bufio.NewWriter(w)
	m := &mdWriter{w: bw}
	st := &g.Result.Stats
	c := g.Counts()

	verdict := "PASS"
	if g.Fails() {
		verdict = "FAIL"
	}
	m.printf("## hooktrace: %s\n\n", mdHeadline(g, c))
	var facts []string
	facts = append(facts, "**"+verdict+"**")
	facts = append(facts, plural(c.Findings, "finding"))
	if g.HasBaseline {
		facts = append(facts, fmt.Sprintf("%d new, %d still present, %d fixed since %s",
			c.New+c.Updated, c.Unchanged, c.Fixed, mdCode(orDash(g.BaselineName))))
	}
	if g.HasSuppress {
		facts = append(facts, fmt.Sprintf("%d suppressed", c.Suppressed))
	}
	facts = append(facts, "fail on "+mdCode(failOnText(g)))
	m.printf("%s\n\n", strings.Join(facts, " · "))
	if !st.Complete {
		m.printf("> **Incomplete trace:** %s — findings may be missing.\n\n", mdEscape(st.Incomplete))
	}

	if len(g.Findings) > 0 {
		m.printf("| | severity | finding | id |\n|---|---|---|---|\n")
		for i := range g.Findings {
			if i == mdMaxRows {
				m.printf("\n… and %d more findings: see the full report.\n", len(g.Findings)-mdMaxRows)
				break
			}
			j := &g.Findings[i]
			m.printf("| %s | %s | %s | %s |\n", mdMark(j), j.Severity, mdCell(j.Title), mdCode(j.ID))
		}
		m.printf("\n")
	}

	shown := 0
	for i := range g.Findings {
		j := &g.Findings[i]
		if !j.Fails {
			continue
		}
		if shown == mdMaxDetails {
			m.printf("… %d more failing findings: see the full report.\n\n", c.Failing-shown)
			break
		}
		shown++
		m.finding(j)
	}

	if len(g.Fixed) > 0 {
		m.printf("**Fixed since the baseline:**\n\n")
		for i, f := range g.Fixed {
			if i == mdMaxFixed {
				m.printf("- … and %d more\n", len(g.Fixed)-mdMaxFixed)
				break
			}
			m.printf("- %s %s\n", mdCode(f.ID), mdEscape(f.Title))
		}
		m.printf("\n")
	}
	if len(g.Unused) > 0 {
		m.printf("**Unused suppressions** (they matched no finding):\n\n")
		for _, u := range g.Unused {
			m.printf("- %s: %s — %s\n", mdCode(u.Source), mdEscape(u.String()), mdEscape(u.Reason))
		}
		m.printf("\n")
	}
	if m.err != nil {
		return m.err
	}
	return bw.Flush()
}

type mdWriter struct {
	w   *bufio.Writer
	err error
}

func (m *mdWriter) printf(format string, args ...any) {
	if m.err == nil {
		_, m.err = fmt.Fprintf(m.w, format, args...)
	}
}

func (m *mdWriter) finding(j *Judged) {
	f := j.Finding
	m.printf("### %s\n\n", mdEscape(f.Title))
	meta := []string{mdCode(f.ID), string(f.Severity)}
	if j.State != "" {
		meta = append(meta, j.State)
	}
	if f.Occurrences > 1 {
		meta = append(meta, fmt.Sprintf("seen %d times", f.Occurrences))
	}
	if f.Merged != "" {
		meta = append(meta, f.Merged)
	}
	m.printf("%s\n\n", strings.Join(meta, " · "))
	if seen := f.SeenText(); len(seen) > 0 {
		m.printf("**Seen in:**\n\n")
		for _, l := range seen {
			m.printf("- %s\n", mdEscape(l))
		}
		m.printf("\n")
	}
	if (f.Kind == analyzer.KindLockOrderCycle || f.Kind == analyzer.KindDeadlock) && len(f.Locks) > 0 {
		parts := make([]string, 0, len(f.Locks)+1)
		for _, l := range append(append([]string(nil), f.Locks...), f.Locks[0]) {
			parts = append(parts, mdCode(l))
		}
		m.printf("**Cycle:** %s\n\n", strings.Join(parts, " → "))
	}
	if f.Gate != "" {
		m.printf("**Guarded by:** %s: every path holds it, so the cycle cannot deadlock while that holds.\n\n", mdCode(f.Gate))
	}
	for i := range f.Edges {
		e := &f.Edges[i]
		m.printf("%d. **%s**: %s\n", i+1, mdEscape(threadLabel(e)), mdEscape(e.Context))
		frames := topFrames(e.Stack, mdMaxFrames)
		if len(frames) > 0 {
			m.printf("   ```\n")
			for _, fr := range frames {
				m.printf("   %s\n", FrameText(fr))
			}
			m.printf("   ```\n")
		}
	}
	m.printf("\n")
}

// topFrames are up to n frames from the innermost one outside the C
// library on (the lock and allocator internals say little in a summary).
func topFrames(frames []analyzer.Frame, n int) []analyzer.Frame {
	for i := range frames {
		if !systemObject(frames[i].Object) {
			frames = frames[i:]
			break
		}
	}
	if len(frames) > n {
		frames = frames[:n]
	}
	return frames
}

func mdHeadline(g *Gate, c Counts) string {
	switch {
	case c.Failing > 0 && g.HasBaseline:
		return plural(c.Failing, "new problem") + " found"
	case c.Failing > 0:
		return plural(c.Failing, "problem") + " found"
	case c.Findings == 0:
		return "no potential deadlocks"
	case g.HasBaseline:
		return "no new problems"
	}
	return "nothing at or above " + failOnText(g)
}

func mdMark(j *Judged) string {
	var parts []string
	if j.Fails {
		parts = append(parts, "**FAIL**")
	}
	switch j.State {
	case StateNew:
		parts = append(parts, "new")
	case StateUpdated:
		parts = append(parts, "more severe")
	case StateUnchanged:
		parts = append(parts, "known")
	}
	if j.Suppressed != nil {
		parts = append(parts, "suppressed")
	}
	return strings.Join(parts, " ")
}

// mdCode is s as an inline code span.
func mdCode(s string) string {
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		s = " " + s + " "
	}
	return fence + strings.ReplaceAll(s, "|", "\\|") + fence
}

var mdEscaper = strings.NewReplacer(
	"\\", "\\\\", "`", "\\`", "*", "\\*", "_", "\\_", "[", "\\[", "]", "\\]",
	"<", "&lt;", ">", "&gt;", "|", "\\|", "#", "\\#", "\n", " ",
)

func mdEscape(s string) string { return mdEscaper.Replace(s) }

func mdCell(s string) string { return mdEscape(s) }
