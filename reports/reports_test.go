package reports

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

const vma = 0x601200

// openMPISeed is the Open MPI madvise-hook deadlock: thread 11 holds
// vma_lock and calls malloc; thread 12 frees, glibc trims the heap with
// its arena lock held, and the madvise hook takes vma_lock.
func openMPISeed(complete bool) *analyzer.Result {
	b := tracebuild.New(4000, &events.Header{Allocator: "glibc"})
	b.FrameOffset = 8
	b.Sources = map[string]tracebuild.Source{"vma_tree_insert": {File: "rcache/vma_tree.c", Line: 88}}
	b.Name(vma, "vma_lock (librcache.so)").Thread(11, "mpi-send").Thread(12, "progress")
	b.Lock(11, vma, "pthread_mutex_lock@libc.so.6", "mca_rcache_base_vma_insert@librcache.so", "mca_rcache_register@librcache.so")
	b.Alloc(11, events.OpMalloc, 0, 48, "malloc@libc.so.6", "vma_tree_insert@librcache.so", "mca_rcache_base_vma_insert@librcache.so")
	b.Unlock(11, vma)
	b.Alloc(12, events.OpFree, 0x7f1000000010, 0x20000, "free@libc.so.6", "release_buffers")
	b.InAlloc(12, events.OpMutexLock, vma, events.OpFree,
		"pthread_mutex_lock@libc.so.6", "vma_tree_iterate@librcache.so", "_intercept_madvise@librcache.so",
		"shrink_heap@libc.so.6", "heap_trim@libc.so.6", "_int_free@libc.so.6", "free@libc.so.6", "release_buffers")
	b.InAlloc(12, events.OpMutexUnlock, vma, events.OpFree)
	b.Event(events.Event{TID: 12, Op: events.OpMadvise, Flags: events.FlagInAlloc, Addr: 0x7f1000020000, Size: 0x10000, Addr2: uint64(events.OpFree)})
	if complete {
		b.Footer(nil)
	} else {
		b.Lost(1234)
	}
	a := analyzer.New(analyzer.Options{})
	a.BeginStream("rank0.htrace")
	for _, r := range b.Records() {
		a.Add(r)
	}
	return a.Result()
}

func TestTextOpenMPISeed(t *testing.T) {
	var buf bytes.Buffer
	if err := Text(&buf, openMPISeed(true)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"hooktrace: 1 finding (1 error)",
		"stats: 7 events, 0 lost events, 2 threads, 1 lock (1 class), 2 lock dependencies, target exit status 0",
		"target exit status 0",
		"calls: free=1 madvise=1 malloc=1 pthread_mutex_lock=2 pthread_mutex_unlock=2",
		"| SEVERITY | KIND",
		"| error    | lock-order-cycle |",
		"[1] ERROR lock-order-cycle  lock-order-cycle-",
		"possible deadlock through the allocator",
		"cycle:   vma_lock (librcache.so) → glibc malloc arena → vma_lock (librcache.so)",
		"threads: 11 (mpi-send), 12 (progress)",
		"edge 1: vma_lock (librcache.so) → glibc malloc arena  [thread 11 (mpi-send) in rank0.htrace]",
		"edge 2: glibc malloc arena → vma_lock (librcache.so)  [thread 12 (progress) in rank0.htrace]",
		"vma_tree_insert (rcache/vma_tree.c:88)",
		"vma_tree_iterate+0x10 (librcache.so)",
		"shrink_heap+0x20 (libc.so.6)",
		"glibc holds its arena lock here (shrink_heap on the stack)",
		"possible scenario:",
		"Thread A (as tid 11)",
		"malloc(): lock(glibc malloc arena)",
		"madvise hook: lock(vma_lock (librcache.so))",
		"*** DEADLOCK ***",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q", want)
		}
	}
	if strings.Contains(out, "INCOMPLETE") {
		t.Error("complete trace reported incomplete")
	}
	if t.Failed() {
		t.Log("\n" + out)
	}
}

func TestTextIncomplete(t *testing.T) {
	var buf bytes.Buffer
	if err := Text(&buf, openMPISeed(false)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "INCOMPLETE: 1234 events lost; trace cut short: no footer") {
		t.Errorf("INCOMPLETE must open the report:\n%s", out)
	}
	if strings.Count(out, "INCOMPLETE:") != 2 {
		t.Errorf("INCOMPLETE must also close the report")
	}
	if !strings.Contains(out, "1234 lost events") {
		t.Errorf("stats line lacks the lost events")
	}
}

func TestTextNoFindings(t *testing.T) {
	var buf bytes.Buffer
	res := &analyzer.Result{Version: 1, Stats: analyzer.Stats{Complete: true, Calls: map[string]uint64{"malloc": 3}}}
	if err := Text(&buf, res); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "no findings") || !strings.Contains(out, "calls: malloc=3") {
		t.Errorf("%s", out)
	}
}

func TestJSONContract(t *testing.T) {
	var buf bytes.Buffer
	if err := JSON(&buf, openMPISeed(false)); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Version int `json:"version"`
		Stats   struct {
			Events     *uint64           `json:"events"`
			LostEvents *uint64           `json:"lost_events"`
			Threads    *int              `json:"threads"`
			Complete   *bool             `json:"complete"`
			Incomplete string            `json:"incomplete"`
			Calls      map[string]uint64 `json:"calls"`
		} `json:"stats"`
		Findings []struct {
			ID       string   `json:"id"`
			Kind     string   `json:"kind"`
			Severity string   `json:"severity"`
			Title    string   `json:"title"`
			Locks    []string `json:"locks"`
			Edges    []struct {
				From    string `json:"from"`
				To      string `json:"to"`
				Thread  uint32 `json:"thread"`
				Context string `json:"context"`
				Stack   []struct {
					Function string  `json:"function"`
					File     *string `json:"file"`
					Line     *uint32 `json:"line"`
					Object   string  `json:"object"`
					Address  string  `json:"address"`
				} `json:"stack"`
			} `json:"edges"`
		} `json:"findings"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	st := doc.Stats
	if doc.Version != 1 || st.Events == nil || *st.Events != 7 || st.LostEvents == nil || *st.LostEvents != 1234 ||
		st.Threads == nil || *st.Threads != 2 || st.Complete == nil || *st.Complete || st.Incomplete == "" || st.Calls["malloc"] != 1 {
		t.Errorf("stats %+v", st)
	}
	if len(doc.Findings) != 1 {
		t.Fatalf("findings %d", len(doc.Findings))
	}
	f := doc.Findings[0]
	if f.Kind != "lock-order-cycle" || f.Severity != "error" || !strings.HasPrefix(f.ID, "lock-order-cycle-") || len(f.Locks) != 2 || len(f.Edges) != 2 {
		t.Errorf("finding %+v", f)
	}
	fr := f.Edges[1].Stack[0]
	if fr.Function != "pthread_mutex_lock" || fr.File == nil || fr.Line == nil || !strings.HasPrefix(fr.Address, "0x") || fr.Object == "" {
		t.Errorf("frame %+v", fr)
	}
	// Stable: the same result renders the same bytes.
	var again bytes.Buffer
	if err := JSON(&again, openMPISeed(false)); err != nil {
		t.Fatal(err)
	}
	if again.String() != buf.String() {
		t.Error("JSON output is not stable")
	}
	if strings.Contains(buf.String(), "null") {
		t.Errorf("JSON has nulls where arrays are promised")
	}
}

func TestJSONEmptyLists(t *testing.T) {
	var buf bytes.Buffer
	if err := JSON(&buf, &analyzer.Result{Version: 1}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"findings": []`) || !strings.Contains(buf.String(), `"calls": {}`) {
		t.Errorf("%s", buf.String())
	}
}

func TestFails(t *testing.T) {
	res := openMPISeed(true)
	for _, c := range []struct {
		threshold string
		fails     bool
	}{{"error", true}, {"warning", true}, {"info", true}} {
		got, err := Fails(res, c.threshold)
		if err != nil || got != c.fails {
			t.Errorf("Fails(%s) = %v, %v", c.threshold, got, err)
		}
	}
	if _, err := Fails(res, "bogus"); err == nil {
		t.Error("bogus threshold accepted")
	}
	if got, _ := Fails(&analyzer.Result{}, "info"); got {
		t.Error("no findings must pass")
	}
}

func TestFrameText(t *testing.T) {
	for _, c := range []struct {
		f    analyzer.Frame
		want string
	}{
		{analyzer.Frame{Function: "worker", File: "w.c", Line: 12, Object: "/usr/bin/app", Offset: 4}, "worker (w.c:12)"},
		{analyzer.Frame{Function: "worker", Offset: 0x40, Object: "/usr/bin/app"}, "worker+0x40 (app)"},
		{analyzer.Frame{Address: "0x7f00", Object: "/lib/libfoo.so"}, "0x7f00 (libfoo.so)"},
	} {
		if got := FrameText(c.f); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}
