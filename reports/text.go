package reports

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/renderer"
	"github.com/olekukonko/tablewriter/tw"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
)

// maxFrames bounds each printed stack; the JSON report has them all.
const maxFrames = 16

// textWidth is where explanations wrap.
const textWidth = 100

// Text writes res for people: whether the trace is complete, what was
// traced, a table of findings by kind and severity, then each finding with
// its cycle, locks, threads, per-edge stacks and a possible scenario.
func Text(w io.Writer, res *analyzer.Result) error {
	return TextGate(w, plain(res))
}

// recorderText names what recorded the traces, when their headers say.
func recorderText(st *analyzer.Stats) string {
	var names []string
	for _, t := range st.Traces {
		// "none": the report's INCOMPLETE line says why.
		if t.Recorder != "" && t.Recorder != "none" && !slices.Contains(names, t.Recorder) {
			names = append(names, t.Recorder)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (recorded by " + strings.Join(names, ", ") + ")"
}

// probeTimeText is the BPF programs' own time a run, summed over the
// traces, when the kernel counted it: "uprobe_hook 240 ns over 1,600,000
// runs".
func probeTimeText(st *analyzer.Stats) string {
	sum := map[string]events.ProgramTime{}
	for _, t := range st.Traces {
		for name, pt := range t.ProbeTime {
			s := sum[name]
			s.Runs += pt.Runs
			s.NS += pt.NS
			sum[name] = s
		}
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(sum)) {
		s := sum[name]
		parts = append(parts, fmt.Sprintf("%s %d ns a run over %d runs", name, s.NS/s.Runs, s.Runs))
	}
	return strings.Join(parts, ", ")
}

// TextGate is Text with the gate's verdicts: each finding's baseline state
// and suppression, the fixed findings, unused suppressions, and which
// findings fail.
func TextGate(w io.Writer, g *Gate) error {
	res := g.Result
	bw := bufio.NewWriter(w)
	p := &printer{w: bw, gate: g}
	st := &res.Stats

	if !st.Complete {
		p.incomplete(st)
	}
	p.line("hooktrace: %s", findingCount(res.Findings))
	p.line("stats: %d events, %d lost events%s, %s, %s (%s), %s%s",
		st.Events, st.LostEvents, unrecordedText(st), plural(st.Threads, "thread"), plural(st.Locks, "lock"),
		plural(st.LockClasses, "class"), plural(st.Dependencies, "lock dependency"), exitText(st))
	p.line("calls: %s%s", callsText(st.Calls), recorderText(st))
	tc := st.TraceChecks
	// Always printed: a tracer that starts losing events shows here.
	p.line("trace checks: %d impossible self-deadlocks, %s", tc.ImpossibleSelfDeadlocks, misuseText(tc.LockMisuse))
	if m := st.LockMisuse; m.Total() > 0 {
		p.line("lock misuse: %s", misuseText(m))
	}
	if pt := probeTimeText(st); pt != "" {
		p.line("probe time: %s", pt)
	}
	// Only the slow way is news.
	for _, t := range st.Traces {
		if t.StackReads != "" && t.StackReads != "direct map" {
			p.line("stack reads: %s", t.StackReads)
			break
		}
	}
	for _, t := range st.Traces {
		if r := ranksText(t.Ranks); r != "" {
			p.line("ranks: %s%s", r, traceSuffix(st, t))
		}
	}
	for _, warn := range st.Warnings {
		p.line("warning: %s", warn)
	}
	if len(st.Traces) > 1 {
		for _, t := range st.Traces {
			state := "complete"
			if !t.Complete {
				state = "INCOMPLETE: " + t.Incomplete
			}
			p.line("  trace %s: pid %d, %d events, %s", orDash(t.Source), t.PID, t.Events, state)
		}
	}
	p.gateSummary()
	p.blank()

	if len(res.Findings) > 0 {
		if err := p.summary(res.Findings); err != nil {
			return err
		}
		for i := range res.Findings {
			p.blank()
			if err := p.finding(i+1, &res.Findings[i], p.verdict(i)); err != nil {
				return err
			}
		}
	}
	if !st.Complete {
		p.blank()
		p.incomplete(st)
	}
	if p.err != nil {
		return p.err
	}
	return bw.Flush()
}

type printer struct {
	w    *bufio.Writer
	err  error
	gate *Gate // nil: no verdicts to print
}

// gateSummary prints the baseline comparison and suppressions, when the
// gate has them.
func (p *printer) gateSummary() {
	g := p.gate
	if g == nil || (!g.HasBaseline && !g.HasSuppress) {
		return
	}
	c := g.Counts()
	if g.HasBaseline {
		p.line("baseline %s: %d new, %d still present, %d fixed", orDash(g.BaselineName), c.New+c.Updated, c.Unchanged, c.Fixed)
		for _, f := range g.Fixed {
			p.line("  fixed: %s  %s", f.ID, f.Title)
		}
	}
	if g.HasSuppress {
		p.line("suppressed: %d", c.Suppressed)
		for _, u := range g.Unused {
			p.line("warning: unused suppression at %s (%s): it matched no finding", u.Source, u.String())
		}
	}
	threshold := "none"
	if g.FailOn != "" {
		threshold = string(g.FailOn)
	}
	p.line("failing (--fail-on %s): %d", threshold, c.Failing)
}

func (p *printer) line(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *printer) blank() { p.line("") }

// wrapped prints text after a label, wrapped and indented under itself.
func (p *printer) wrapped(indent, label, text string) {
	lines := wrap(text, textWidth-len(indent)-len(label))
	for i, l := range lines {
		if i == 0 {
			p.line("%s%s%s", indent, label, l)
		} else {
			p.line("%s%s%s", indent, strings.Repeat(" ", len(label)), l)
		}
	}
}

func (p *printer) incomplete(st *analyzer.Stats) {
	p.line("INCOMPLETE: %s — findings may be missing (and lost unlocks can make false ones)", st.Incomplete)
}

// summary is the table of findings by kind and severity.
func (p *printer) summary(fs []analyzer.Finding) error {
	type key struct {
		kind analyzer.Kind
		sev  analyzer.Severity
	}
	counts := map[key]int{}
	var keys []key
	for _, f := range fs {
		k := key{f.Kind, f.Severity}
		if counts[k] == 0 {
			keys = append(keys, k)
		}
		counts[k]++
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].sev.Rank() != keys[j].sev.Rank() {
			return keys[i].sev.Rank() > keys[j].sev.Rank()
		}
		return keys[i].kind < keys[j].kind
	})
	rows := [][]string{}
	for _, k := range keys {
		rows = append(rows, []string{string(k.sev), string(k.kind), fmt.Sprint(counts[k])})
	}
	return p.table("", []string{"SEVERITY", "KIND", "FINDINGS"}, rows)
}

// table renders an ASCII table, each line indented.
func (p *printer) table(indent string, header []string, rows [][]string) error {
	if p.err != nil {
		return p.err
	}
	var buf bytes.Buffer
	t := tablewriter.NewTable(&buf,
		tablewriter.WithRenderer(renderer.NewBlueprint(tw.Rendition{Symbols: tw.NewSymbols(tw.StyleASCII)})),
		tablewriter.WithRowAutoWrap(tw.WrapNone),
		tablewriter.WithHeaderAutoFormat(tw.Off),
		tablewriter.WithHeaderAlignment(tw.AlignLeft),
		tablewriter.WithRowAlignment(tw.AlignLeft),
	)
	t.Header(header)
	for _, r := range rows {
		if err := t.Append(r); err != nil {
			return err
		}
	}
	if err := t.Render(); err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		p.line("%s%s", indent, l)
	}
	return p.err
}

// verdict is the gate's word on finding i: "", or "NEW, FAILS",
// "unchanged", "suppressed: why" and so on.
func (p *printer) verdict(i int) string {
	g := p.gate
	if g == nil || (!g.HasBaseline && !g.HasSuppress) || i >= len(g.Findings) {
		return ""
	}
	j := &g.Findings[i]
	var parts []string
	if j.State != "" {
		parts = append(parts, strings.ToUpper(j.State))
	}
	if j.Suppressed != nil {
		parts = append(parts, "suppressed ("+j.Suppressed.Source+"): "+j.Suppressed.Reason)
	}
	if j.Fails {
		parts = append(parts, "FAILS")
	}
	return strings.Join(parts, ", ")
}

func (p *printer) finding(n int, f *analyzer.Finding, verdict string) error {
	const in = "    "
	p.line("[%d] %s %s  %s", n, strings.ToUpper(string(f.Severity)), f.Kind, f.ID)
	if verdict != "" {
		p.wrapped(in, "gate:    ", verdict)
	}
	p.wrapped(in, "", f.Title)
	if (f.Kind == analyzer.KindLockOrderCycle || f.Kind == analyzer.KindDeadlock) && len(f.Locks) > 0 {
		p.wrapped(in, "cycle:   ", strings.Join(append(append([]string(nil), f.Locks...), f.Locks[0]), " → "))
	}
	if len(f.Locks) > 0 {
		p.wrapped(in, "locks:   ", strings.Join(f.Locks, "; "))
	}
	if t := threadsText(f); t != "" {
		p.wrapped(in, "threads: ", t)
	}
	if hook := hookText(f); hook != "" {
		p.wrapped(in, "hook:    ", hook)
	}
	if f.Gate != "" {
		p.wrapped(in, "guard:   ", "every path holds "+f.Gate+" (a guarded cycle: not a deadlock while that holds)")
	}
	if f.Occurrences > 1 {
		seen := fmt.Sprintf("%d times", f.Occurrences)
		if f.Merged != "" {
			seen += ", " + f.Merged
		}
		p.line("%sseen:    %s", in, seen)
	}
	for i, l := range f.SeenText() {
		label := "         "
		if i == 0 {
			label = "in:      "
		}
		p.wrapped(in, label, l)
	}
	if f.Detail != "" {
		p.wrapped(in, "why:     ", f.Detail)
	}
	if len(f.Instances) > 1 {
		p.line("%sinstances:", in)
		for _, set := range f.Instances {
			p.line("%s  %s", in, strings.Join(set, " → "))
		}
	}
	for i := range f.Edges {
		p.edge(in, i+1, &f.Edges[i])
	}
	if len(f.Scenario) > 0 {
		p.line("%spossible scenario:", in)
		if err := p.scenario(in+"  ", f); err != nil {
			return err
		}
		p.line("%s  *** DEADLOCK ***", in)
	}
	return p.err
}

func (p *printer) edge(in string, n int, e *analyzer.Edge) {
	who := fmt.Sprintf("thread %d", e.Thread)
	if e.ThreadName != "" {
		who += " (" + e.ThreadName + ")"
	}
	if e.Source != "" {
		who += " in " + e.Source
	}
	p.blank()
	p.line("%sedge %d: %s → %s  [%s]", in, n, e.From, e.To, who)
	p.wrapped(in+"  ", "", e.Context)
	p.line("%s  %s:", in, takenLabel(e))
	p.stack(in+"    ", e.Stack, e.StackTruncated)
	if len(e.HeldStack) == 0 {
		return
	}
	// A hook's allocator call is the tail of the hook's own stack: named
	// by where it starts there, not printed twice.
	if i := len(e.Stack) - len(e.HeldStack); i >= 0 && i < maxFrames && !e.HeldStackTruncated &&
		slices.Equal(e.Stack[i:], e.HeldStack) {
		p.line("%s  %s: #%d above, %s", in, heldLabel(e), i, FrameText(e.HeldStack[0]))
		return
	}
	p.line("%s  %s:", in, heldLabel(e))
	p.stack(in+"    ", e.HeldStack, e.HeldStackTruncated)
}

// misuseText counts misused lock calls.
func misuseText(m analyzer.LockMisuse) string {
	return fmt.Sprintf("%d unlocks of unheld locks, %d unlocks by another thread, %d destroys of held locks",
		m.UnheldUnlocks, m.ForeignUnlocks, m.HeldDestroys)
}

func takenLabel(e *analyzer.Edge) string {
	if e.Action != "" {
		return e.To + " " + e.Action + " here"
	}
	if strings.Contains(e.To, "arena") || strings.HasSuffix(e.To, " allocator") {
		return "allocator called here (" + e.From + " held)"
	}
	return e.To + " taken here"
}

func heldLabel(e *analyzer.Edge) string {
	if strings.Contains(e.From, "arena") || strings.HasSuffix(e.From, " allocator") {
		return "in this allocator call"
	}
	return e.From + " taken here"
}

func (p *printer) stack(in string, frames []analyzer.Frame, truncated bool) {
	if len(frames) == 0 {
		p.line("%s(no stack recorded)", in)
		return
	}
	for i, f := range frames {
		if i == maxFrames {
			p.line("%s... %d more frames", in, len(frames)-maxFrames)
			break
		}
		p.line("%s#%-2d %s", in, i, FrameText(f))
	}
	if truncated {
		p.line("%s... (stack truncated: the unwinder stopped early, frames are missing)", in)
	}
}

// FrameText prints a frame as "function (file:line)" when the source is
// known, else "function+0xoff (object)".
func FrameText(f analyzer.Frame) string {
	obj := f.Object
	if i := strings.LastIndexByte(obj, '/'); i >= 0 {
		obj = obj[i+1:]
	}
	name := f.Function
	if a := f.ObjectAddress(); a != "" {
		return a
	}
	if name == "" {
		name = f.Address
	} else if f.Offset != 0 && f.File == "" {
		name += fmt.Sprintf("+0x%x", f.Offset)
	}
	switch {
	case f.File != "" && f.Line > 0:
		return fmt.Sprintf("%s (%s:%d)", name, f.File, f.Line)
	case f.File != "":
		return fmt.Sprintf("%s (%s)", name, f.File)
	case obj != "":
		return fmt.Sprintf("%s (%s)", name, obj)
	}
	return name
}

// scenario prints the interleaving as a table: one column per thread,
// one row per step, time going down. Thread i runs the path of edge i.
func (p *printer) scenario(in string, f *analyzer.Finding) error {
	steps := f.Scenario
	var cols []string
	colOf := map[string]int{}
	for _, s := range steps {
		if _, ok := colOf[s.Thread]; !ok {
			col := "Thread " + s.Thread
			if i := len(cols); i < len(f.Edges) {
				col += fmt.Sprintf(" (as tid %d)", f.Edges[i].Thread)
			}
			colOf[s.Thread] = len(cols)
			cols = append(cols, col)
		}
	}
	rows := make([][]string, 0, len(steps))
	for _, s := range steps {
		row := make([]string, len(cols))
		row[colOf[s.Thread]] = s.Action
		rows = append(rows, row)
	}
	return p.table(in, cols, rows)
}

func findingCount(fs []analyzer.Finding) string {
	if len(fs) == 0 {
		return "no findings"
	}
	bySev := map[analyzer.Severity]int{}
	for _, f := range fs {
		bySev[f.Severity]++
	}
	var parts []string
	for _, s := range []analyzer.Severity{analyzer.SeverityError, analyzer.SeverityWarning, analyzer.SeverityInfo} {
		if n := bySev[s]; n > 0 {
			parts = append(parts, plural(n, string(s)))
		}
	}
	return plural(len(fs), "finding") + " (" + strings.Join(parts, ", ") + ")"
}

func plural(n int, word string) string {
	switch {
	case n == 1:
		return "1 " + word
	case strings.HasSuffix(word, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(word, "y"))
	case strings.HasSuffix(word, "s"):
		return fmt.Sprintf("%d %ses", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// unrecordedText names the processes that could not record, if any.
func unrecordedText(st *analyzer.Stats) string {
	if st.UnrecordedProcesses == 0 {
		return ""
	}
	return ", " + plural(int(st.UnrecordedProcesses), "process") + " could not record"
}

func exitText(st *analyzer.Stats) string {
	switch {
	case st.ExitSignal != "":
		return ", target killed by " + st.ExitSignal
	case st.ExitStatus != nil:
		return fmt.Sprintf(", target exit status %d", *st.ExitStatus)
	}
	return ""
}

func callsText(calls map[string]uint64) string {
	if len(calls) == 0 {
		return "none"
	}
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%d", n, calls[n])
	}
	return strings.Join(parts, " ")
}

func threadsText(f *analyzer.Finding) string {
	seen := map[uint32]string{}
	var order []uint32
	// Every thread it was seen on, in every process, where counted.
	for _, sn := range f.Seen {
		for _, t := range sn.Threads {
			if _, ok := seen[t.TID]; !ok {
				order = append(order, t.TID)
				seen[t.TID] = t.Name
			}
		}
	}
	for _, e := range f.Edges {
		if _, ok := seen[e.Thread]; !ok {
			order = append(order, e.Thread)
		}
		if e.ThreadName != "" {
			seen[e.Thread] = e.ThreadName
		} else if _, ok := seen[e.Thread]; !ok {
			seen[e.Thread] = ""
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	parts := make([]string, len(order))
	for i, t := range order {
		parts[i] = fmt.Sprint(t)
		if name := seen[t]; name != "" {
			parts[i] += " (" + name + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// hookText summarises the memory-hook context of a finding, if it has one.
func hookText(f *analyzer.Finding) string {
	for _, e := range f.Edges {
		if e.Arena != "" {
			return e.Context
		}
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// wrap splits text into lines of at most width runes, at spaces.
func wrap(text string, width int) []string {
	if width < 20 {
		width = 20
	}
	words := strings.Fields(text)
	if len(words) == 0 {
		return []string{""}
	}
	var lines []string
	cur := words[0]
	for _, w := range words[1:] {
		if len([]rune(cur))+1+len([]rune(w)) > width {
			lines = append(lines, cur)
			cur = w
			continue
		}
		cur += " " + w
	}
	return append(lines, cur)
}

// FindingText writes one finding as the text report shows it (the JUnit
// failure body).
func FindingText(w io.Writer, f *analyzer.Finding) error {
	bw := bufio.NewWriter(w)
	p := &printer{w: bw}
	if err := p.finding(1, f, ""); err != nil {
		return err
	}
	return bw.Flush()
}

// ranksText says which process was which rank: "0 pid 100, 1 pid 101".
func ranksText(ranks map[uint32]int) string {
	pids := make([]uint32, 0, len(ranks))
	for pid := range ranks {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool {
		if ranks[pids[i]] != ranks[pids[j]] {
			return ranks[pids[i]] < ranks[pids[j]]
		}
		return pids[i] < pids[j]
	})
	parts := make([]string, len(pids))
	for i, pid := range pids {
		parts[i] = fmt.Sprintf("%d pid %d", ranks[pid], pid)
	}
	return strings.Join(parts, ", ")
}

// traceSuffix names the trace a line is about when there are several.
func traceSuffix(st *analyzer.Stats, t analyzer.TraceStats) string {
	if len(st.Traces) > 1 && t.Source != "" {
		return " (" + t.Source + ")"
	}
	return ""
}
