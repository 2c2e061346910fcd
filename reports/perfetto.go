package reports

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
)

// TimelineTrace is one trace to put on a timeline: Records calls fn with
// each record in order (the same records the analyzer saw, under the same
// Name, so findings can be placed).
type TimelineTrace struct {
	Name    string
	Header  *events.Header // for the clock; nil if unknown before reading
	Records func(fn func(*events.Record) error) error
}

// Perfetto writes traces as Chrome trace-event JSON, which the Perfetto UI
// and chrome://tracing open: a process per traced process, a track per
// thread; lock holds, condition waits and probed functions (hooks) as
// slices; allocator calls, memory syscalls and thread events as instants;
// each finding as an instant on the threads of its edges, at the first
// time the edge was seen. Holds that do not nest (A taken, B taken, A
// released) are drawn as nesting slices: B is cut where A ends and goes
// on in a new slice. Several traces are aligned by their wall-clock start.
//
// The output is written as the records are read: memory stays bounded by
// the threads and their open slices.
func Perfetto(w io.Writer, traces []TimelineTrace, res *analyzer.Result) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	t := &timeline{w: bw, pids: map[uint32]int{}, wanted: map[edgeKey][]pendingMark{}}
	if res != nil {
		t.indexFindings(res)
	}
	if _, err := bw.WriteString("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"); err != nil {
		return err
	}
	t.base = -1
	for _, tr := range traces {
		if tr.Header != nil && tr.Header.StartUnix > 0 && (t.base < 0 || tr.Header.StartUnix < t.base) {
			t.base = tr.Header.StartUnix
		}
	}
	for i, tr := range traces {
		t.stream(i, tr)
		if err := tr.Records(t.record); err != nil {
			return err
		}
		t.endStream()
		if t.err != nil {
			return t.err
		}
	}
	t.unplaced()
	if t.err != nil {
		return t.err
	}
	if _, err := bw.WriteString("\n]"); err != nil {
		return err
	}
	if res != nil {
		// What the timeline cannot show: an aggregate trace holds the
		// first call of each pattern, the kernel only counted the rest.
		meta := map[string]any{
			"calls":        sumCalls(res.Stats.Calls),
			"events":       res.Stats.Events,
			"lost_events":  res.Stats.LostEvents,
			"counted_only": CountedOnly(res),
		}
		if n := CountedOnly(res); n > 0 {
			meta["note"] = CountedOnlyNote(n)
		}
		if n := res.Stats.UnrecordedProcesses; n > 0 {
			meta["unrecorded_processes"] = n
		}
		b, err := json.Marshal(map[string]any{"hooktrace": meta})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(bw, ",\"metadata\":%s", b); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("}\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// CountedOnly is how many traced calls of res have no event of their own:
// in an aggregate trace, the repeats the kernel only counted. Lost events
// are not among them.
func CountedOnly(res *analyzer.Result) uint64 {
	calls, sent := sumCalls(res.Stats.Calls), res.Stats.Events+res.Stats.LostEvents
	if calls <= sent {
		return 0
	}
	return calls - sent
}

// CountedOnlyNote says what a timeline lacks, and how to have it.
func CountedOnlyNote(n uint64) string {
	return fmt.Sprintf("%d calls were only counted (aggregate mode): the timeline shows the first of each pattern; record with --mode full to see every call", n)
}

func sumCalls(calls map[string]uint64) uint64 {
	var n uint64
	for _, v := range calls {
		n += v
	}
	return n
}

type timeline struct {
	w   *bufio.Writer
	err error
	n   int

	base int64 // earliest wall-clock start, ns; -1 unknown

	// The current stream.
	index   int
	name    string
	header  *events.Header
	offset  int64 // ns added to the stream's monotonic times
	started bool
	lastNS  uint64
	stacks  map[uint32]string // stack ID → signature
	locks   map[[2]uint64]string
	threads map[[2]uint32]*tlThread
	order   [][2]uint32
	pids    map[uint32]int // by stream-local pid: output pid

	usedPIDs map[int]bool

	// Findings waiting for the event that first showed their edges.
	wanted map[edgeKey][]pendingMark
	marks  []pendingMark // all, to report the unplaced ones
}

type tlThread struct {
	pid, tid uint32
	open     []tlSpan
}

type tlSpan struct {
	key   string // "lock:ADDR", "cond:ADDR", "probe:IDX"
	name  string
	cat   string
	start uint64
	depth int
	args  map[string]any
}

// edgeKey finds an edge's first sighting: the stream, thread and stack.
type edgeKey struct {
	source   string
	pid, tid uint32
	stack    string
}

type pendingMark struct {
	f      *analyzer.Finding
	edge   int
	placed *bool
}

func (t *timeline) indexFindings(res *analyzer.Result) {
	for i := range res.Findings {
		f := &res.Findings[i]
		for j := range f.Edges {
			e := &f.Edges[j]
			placed := new(bool)
			m := pendingMark{f: f, edge: j, placed: placed}
			t.marks = append(t.marks, m)
			if len(e.Stack) == 0 {
				continue
			}
			k := edgeKey{e.Source, e.PID, e.Thread, frameSignature(e.Stack)}
			t.wanted[k] = append(t.wanted[k], m)
		}
	}
}

func frameSignature(frames []analyzer.Frame) string {
	parts := make([]string, len(frames))
	for i, f := range frames {
		parts[i] = f.Address
	}
	return strings.Join(parts, ",")
}

func stackSignature(st *events.Stack) string {
	parts := make([]string, len(st.Frames))
	for i, f := range st.Frames {
		parts[i] = "0x" + strconv.FormatUint(f.Addr, 16)
	}
	return strings.Join(parts, ",")
}

func (t *timeline) stream(i int, tr TimelineTrace) {
	t.index, t.name, t.header = i, tr.Name, tr.Header
	t.started = false
	t.lastNS = 0
	t.stacks = map[uint32]string{}
	t.locks = map[[2]uint64]string{}
	t.threads = map[[2]uint32]*tlThread{}
	t.order = nil
	t.pids = map[uint32]int{}
	if t.usedPIDs == nil {
		t.usedPIDs = map[int]bool{}
	}
	if tr.Header != nil {
		t.setClock(tr.Header)
	}
}

// setClock maps the stream's monotonic clock onto the shared timeline.
func (t *timeline) setClock(h *events.Header) {
	t.header = h
	t.offset = 0
	if h.StartNS > 0 {
		t.offset = -int64(h.StartNS)
		if t.base >= 0 && h.StartUnix > 0 {
			t.offset += h.StartUnix - t.base
		}
	}
	t.started = h.StartNS > 0
}

func (t *timeline) ts(ns uint64) float64 {
	if !t.started {
		// No start time: the first event is time zero.
		t.offset = -int64(ns)
		t.started = true
	}
	return float64(int64(ns)+t.offset) / 1000
}

// pid gives a stream's process a unique output pid, naming it on first use.
func (t *timeline) pid(p uint32) int {
	if out, ok := t.pids[p]; ok {
		return out
	}
	out := int(p)
	for t.usedPIDs[out] {
		out += 1 << 22 // above Linux's pid_max
	}
	t.usedPIDs[out] = true
	t.pids[p] = out
	name := fmt.Sprintf("pid %d", p)
	if h := t.header; h != nil && h.PID == p && len(h.Command) > 0 {
		name += " " + strings.Join(h.Command, " ")
	}
	if t.name != "" {
		name = t.name + ": " + name
	}
	t.emit(map[string]any{"ph": "M", "name": "process_name", "pid": out, "tid": 0, "args": map[string]any{"name": name}})
	t.emit(map[string]any{"ph": "M", "name": "process_sort_index", "pid": out, "tid": 0, "args": map[string]any{"sort_index": t.index}})
	return out
}

func (t *timeline) thread(pid, tid uint32) *tlThread {
	k := [2]uint32{pid, tid}
	th := t.threads[k]
	if th == nil {
		th = &tlThread{pid: pid, tid: tid}
		t.threads[k] = th
		t.order = append(t.order, k)
		t.pid(pid)
	}
	return th
}

func (t *timeline) emit(ev map[string]any) {
	if t.err != nil {
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.err = err
		return
	}
	if t.n > 0 {
		t.w.WriteString(",\n")
	}
	t.n++
	_, t.err = t.w.Write(b)
}

func (t *timeline) record(r *events.Record) error {
	switch r.Kind {
	case events.RecHeader:
		if r.Header != nil && r.Header != t.header {
			t.setClock(r.Header)
		}
	case events.RecStack:
		if r.Stack != nil {
			t.stacks[r.Stack.ID] = stackSignature(r.Stack)
		}
	case events.RecThread:
		t.thread(r.Thread.PID, r.Thread.TID)
		if r.Thread.Name != "" {
			t.emit(map[string]any{"ph": "M", "name": "thread_name", "pid": t.pid(r.Thread.PID), "tid": r.Thread.TID,
				"args": map[string]any{"name": r.Thread.Name}})
		}
	case events.RecLockName:
		t.locks[[2]uint64{uint64(r.LockName.PID), r.LockName.Addr}] = r.LockName.Name
	case events.RecLost:
		ts := r.Lost.Time
		if ts == 0 {
			ts = t.lastNS
		}
		pid := 0
		if t.header != nil {
			pid = t.pid(t.header.PID)
		}
		t.emit(map[string]any{"ph": "i", "s": "p", "name": fmt.Sprintf("%d events lost", r.Lost.Count), "cat": "lost",
			"ts": t.ts(ts), "pid": pid, "tid": 0})
	case events.RecEvent:
		t.event(&r.Event)
	}
	return t.err
}

func (t *timeline) lockName(pid uint32, addr uint64, op events.Op) string {
	if n := t.locks[[2]uint64{uint64(pid), addr}]; n != "" {
		return n
	}
	kind := "mutex"
	switch {
	case op >= events.OpRwlockRdlock && op <= events.OpRwlockUnlock:
		kind = "rwlock"
	case op >= events.OpSpinLock && op <= events.OpSpinUnlock:
		kind = "spinlock"
	}
	return fmt.Sprintf("%s %#x", kind, addr)
}

func (t *timeline) event(e *events.Event) {
	if e.Time > t.lastNS {
		t.lastNS = e.Time
	}
	th := t.thread(e.PID, e.TID)
	ts := t.ts(e.Time)
	pid := t.pid(e.PID)
	if e.Stack != 0 {
		t.placeMarks(e, ts, pid)
	}
	op := e.Op
	inAlloc := e.Flags&events.FlagInAlloc != 0
	switch {
	case op.IsLockAcquire():
		acquired := e.Flags&events.FlagAcquired != 0
		if op.IsTry() || op.IsTimed() {
			if e.Flags&events.FlagReturn == 0 || (!acquired && e.Ret != 0) {
				return
			}
		} else if e.Flags&events.FlagReturn != 0 {
			return
		}
		name := t.lockName(e.PID, e.Addr, op)
		verb := "hold "
		if op.IsRead() {
			verb = "read-hold "
		}
		args := map[string]any{"lock": fmt.Sprintf("%#x", e.Addr), "call": op.String()}
		if inAlloc {
			args["in_allocator"] = events.Op(e.Addr2).String()
		}
		t.open(th, tlSpan{key: "lock:" + strconv.FormatUint(e.Addr, 16), name: verb + name, cat: "lock", start: e.Time, args: args})
	case op.IsUnlock():
		t.close(th, "lock:"+strconv.FormatUint(e.Addr, 16), e.Time, false)
	case op == events.OpCondWait || op == events.OpCondTimedwait:
		mutexKey := "lock:" + strconv.FormatUint(e.Addr2, 16)
		if e.Flags&events.FlagReturn == 0 {
			t.closeAll(th, mutexKey, e.Time)
			t.open(th, tlSpan{key: "cond:" + strconv.FormatUint(e.Addr, 16), name: op.String(), cat: "wait", start: e.Time,
				args: map[string]any{"cond": fmt.Sprintf("%#x", e.Addr), "mutex": fmt.Sprintf("%#x", e.Addr2)}})
		} else {
			t.close(th, "cond:"+strconv.FormatUint(e.Addr, 16), e.Time, false)
			t.open(th, tlSpan{key: mutexKey, name: "hold " + t.lockName(e.PID, e.Addr2, events.OpMutexLock), cat: "lock", start: e.Time,
				args: map[string]any{"lock": fmt.Sprintf("%#x", e.Addr2), "call": op.String() + " return"}})
		}
	case op == events.OpProbeEnter:
		name := "probe#" + strconv.FormatUint(e.Arg, 10)
		if h := t.header; h != nil && e.Arg < uint64(len(h.UserProbes)) {
			// A rule pack's optional probe is spelled "?NAME".
			name = strings.TrimPrefix(h.UserProbes[e.Arg], "?")
		}
		args := map[string]any{}
		if inAlloc {
			args["in_allocator"] = events.Op(e.Addr2).String()
		}
		t.open(th, tlSpan{key: "probe:" + strconv.FormatUint(e.Arg, 10), name: name, cat: "hook", start: e.Time, args: args})
	case op == events.OpProbeExit:
		t.close(th, "probe:"+strconv.FormatUint(e.Arg, 10), e.Time, false)
	case op.IsAllocator():
		args := map[string]any{}
		if e.Size != 0 {
			args["size"] = e.Size
		}
		if e.Addr != 0 {
			args["addr"] = fmt.Sprintf("%#x", e.Addr)
		}
		cat := "alloc"
		name := op.String()
		if inAlloc {
			name += " (inside " + events.Op(e.Addr2).String() + ")"
			cat = "alloc,reentry"
		}
		t.emit(map[string]any{"ph": "i", "s": "t", "name": name, "cat": cat, "ts": ts, "pid": pid, "tid": e.TID, "args": args})
	case op.IsMemSyscall():
		args := map[string]any{"addr": fmt.Sprintf("%#x", e.Addr), "len": e.Size}
		name := op.String()
		if inAlloc {
			name += " (inside " + events.Op(e.Addr2).String() + ")"
		}
		t.emit(map[string]any{"ph": "i", "s": "t", "name": name, "cat": "syscall", "ts": ts, "pid": pid, "tid": e.TID, "args": args})
	case op == events.OpThreadCreate:
		what := "thread"
		if e.Flags&events.FlagProcess != 0 {
			what = "process"
		}
		t.emit(map[string]any{"ph": "i", "s": "t", "name": "create " + what + " " + strconv.FormatUint(e.Arg, 10), "cat": "thread",
			"ts": ts, "pid": pid, "tid": e.TID})
	case op == events.OpThreadExit || op == events.OpExec:
		t.emit(map[string]any{"ph": "i", "s": "t", "name": op.String(), "cat": "thread", "ts": ts, "pid": pid, "tid": e.TID})
		if op == events.OpThreadExit {
			t.closeThread(th, e.Time)
		}
	case op == events.OpMutexInit || op == events.OpMutexDestroy:
		t.emit(map[string]any{"ph": "i", "s": "t", "name": op.String(), "cat": "lock", "ts": ts, "pid": pid, "tid": e.TID,
			"args": map[string]any{"lock": fmt.Sprintf("%#x", e.Addr)}})
	}
}

// placeMarks emits the findings whose edge was first seen at this event.
func (t *timeline) placeMarks(e *events.Event, ts float64, pid int) {
	sig, ok := t.stacks[e.Stack]
	if !ok || len(t.wanted) == 0 {
		return
	}
	k := edgeKey{t.name, e.PID, e.TID, sig}
	ms := t.wanted[k]
	if len(ms) == 0 {
		return
	}
	delete(t.wanted, k)
	for _, m := range ms {
		*m.placed = true
		t.mark(m, ts, pid, e.TID, "t")
	}
}

func (t *timeline) mark(m pendingMark, ts float64, pid int, tid uint32, scope string) {
	f := m.f
	e := &f.Edges[m.edge]
	t.emit(map[string]any{"ph": "i", "s": scope, "name": strings.ToUpper(string(f.Severity)) + ": " + f.Title,
		"cat": "finding", "ts": ts, "pid": pid, "tid": tid,
		"args": map[string]any{"id": f.ID, "kind": string(f.Kind), "edge": fmt.Sprintf("%d: %s → %s", m.edge+1, e.From, e.To),
			"context": e.Context}})
}

// unplaced puts the findings whose edges were never matched at the end of
// the timeline, on a process of their own.
func (t *timeline) unplaced() {
	seen := map[string]bool{}
	for _, m := range t.marks {
		if *m.placed || seen[m.f.ID] {
			continue
		}
		any := false
		for _, o := range t.marks {
			if o.f == m.f && *o.placed {
				any = true
			}
		}
		if any {
			continue
		}
		seen[m.f.ID] = true
		t.mark(m, t.ts(t.lastNS), 0, 0, "g")
	}
}

func (t *timeline) open(th *tlThread, s tlSpan) {
	for i := range th.open {
		if th.open[i].key == s.key {
			th.open[i].depth++ // a recursive lock taken again
			return
		}
	}
	s.depth = 1
	th.open = append(th.open, s)
}

// close ends the span with key at now; spans opened after it end too and
// continue in new slices, so slices always nest.
func (t *timeline) close(th *tlThread, key string, now uint64, all bool) {
	i := len(th.open) - 1
	for ; i >= 0; i-- {
		if th.open[i].key == key {
			break
		}
	}
	if i < 0 {
		return
	}
	if !all && th.open[i].depth > 1 {
		th.open[i].depth--
		return
	}
	above := append([]tlSpan(nil), th.open[i+1:]...)
	for j := len(th.open) - 1; j >= i; j-- {
		t.slice(th, &th.open[j], now, false)
	}
	th.open = th.open[:i]
	for _, s := range above {
		s.start = now
		args := map[string]any{"continued": true}
		for k, v := range s.args {
			args[k] = v
		}
		s.args = args
		th.open = append(th.open, s)
	}
}

func (t *timeline) closeAll(th *tlThread, key string, now uint64) { t.close(th, key, now, true) }

// closeThread ends every open slice of th (its end, or the trace's).
func (t *timeline) closeThread(th *tlThread, now uint64) {
	for j := len(th.open) - 1; j >= 0; j-- {
		t.slice(th, &th.open[j], now, true)
	}
	th.open = th.open[:0]
}

func (t *timeline) slice(th *tlThread, s *tlSpan, end uint64, unfinished bool) {
	if end < s.start {
		end = s.start
	}
	args := s.args
	if unfinished {
		args = map[string]any{"unfinished": true}
		for k, v := range s.args {
			args[k] = v
		}
	}
	ev := map[string]any{"ph": "X", "name": s.name, "cat": s.cat, "ts": t.ts(s.start), "dur": float64(end-s.start) / 1000,
		"pid": t.pid(th.pid), "tid": th.tid}
	if len(args) > 0 {
		ev["args"] = args
	}
	t.emit(ev)
}

// endStream closes what is still open at the stream's last event.
func (t *timeline) endStream() {
	for _, k := range t.order {
		t.closeThread(t.threads[k], t.lastNS)
	}
}
