//go:build linux && amd64

package tracer_test

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/launch"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/tracer"
)

func init() {
	// This test binary is also the gate for the targets it starts.
	if len(os.Args) > 1 && os.Args[1] == launch.GateArg {
		runtime.LockOSThread()
		launch.RunGate(os.Args[2:])
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }

// trace runs prog under the tracer and returns its records.
func trace(t *testing.T, opts source.Options, argv ...string) (recs []events.Record, tr *tracer.Tracer) {
	t.Helper()
	var warnMu sync.Mutex
	opts.Warn = func(s string) { warnMu.Lock(); t.Log("warning:", s); warnMu.Unlock() }
	tr, err := tracer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	target, err := session.Launch(tr, argv)
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Attach(); err != nil {
		target.Abort()
		t.Fatal(err)
	}
	reading, err := session.Record(tr, func(r *events.Record) error {
		c := *r
		if c.Stack != nil {
			s := *c.Stack
			c.Stack = &s
		}
		recs = append(recs, c)
		return nil
	})
	if err != nil {
		target.Abort()
		t.Fatal(err)
	}
	// What the CLI's status line reads while the reader runs, read the
	// same way, so that go test -race checks it.
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				tr.Events()
				tr.Seen()
				tr.Calls()
				tr.Lost()
				tr.Sites()
				tr.Allocator()
			}
		}
	}()
	// As run does: held at its exec and exit, the target's mappings are
	// read before they go.
	_, waitErr := target.Wait(false, func(s string) { t.Log("warning:", s) })
	close(stop)
	<-polled
	if err := reading.Stop(); err != nil {
		t.Fatal(err)
	}
	if waitErr != nil {
		t.Fatal(waitErr)
	}
	return recs, tr
}

func TestTracerSeesMallocsUnderLock(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "mallocs")
	recs, tr := trace(t, source.Options{Mode: source.ModeFull}, prog)
	stacks := map[uint32]*events.Stack{}
	n := 0
	for _, r := range recs {
		switch r.Kind {
		case events.RecStack:
			stacks[r.Stack.ID] = r.Stack
		case events.RecEvent:
			if r.Event.Op == events.OpMalloc && r.Event.Size == 777 {
				n++
				if n == 1 && stacks[r.Event.Stack] == nil {
					t.Errorf("first malloc(777) has no stack (id %d)", r.Event.Stack)
				} else if n == 1 {
					for _, f := range stacks[r.Event.Stack].Frames {
						t.Logf("  %#x %s+%#x %s:%d (%s)", f.Addr, f.Function, f.Offset, f.File, f.Line, f.Object)
					}
				}
			}
		}
	}
	for _, s := range tr.Sites() {
		t.Logf("site %s %s+%#x %s %s", s.Kind, s.Name, s.Offset, filepath.Base(s.Object), s.Note)
	}
	t.Logf("calls %v lost %d", tr.Calls(), tr.Lost())
	if n != 10000 {
		t.Errorf("malloc(777) events: %d, want 10000", n)
	}
}

// TestStacksReadThroughDirectMap: the probes read return addresses from
// the threads' stack pages through the kernel's direct map, and each first
// read of a page agrees with bpf_probe_read_user, while threads recurse
// across pages and a fork write-protects every page under them; one
// thread's stack is a transparent huge page where the kernel allows it.
func TestStacksReadThroughDirectMap(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "stackpages")
	for _, mode := range []string{source.ModeAggregate, source.ModeFull} {
		t.Run(mode, func(t *testing.T) {
			_, tr := trace(t, source.Options{Mode: mode}, prog)
			const threads, depth, rounds = 4, 24, 40
			calls := tr.Calls()
			if got, want := calls["malloc"], uint64(threads*depth*rounds); got != want {
				t.Errorf("malloc calls: %d, want %d", got, want)
			}
			if got, want := calls["pthread_mutex_lock"], uint64(threads*depth*rounds); got < want {
				t.Errorf("pthread_mutex_lock calls: %d, want at least %d", got, want)
			}
			r := tr.StackReads()
			t.Logf("stack reads: %+v", r)
			if !r.DirectMap {
				t.Errorf("stacks were read with bpf_probe_read_user, not through the direct map (walks %d, mismatches %d)", r.Walks, r.Mismatches)
			}
			if r.Mismatches != 0 {
				t.Errorf("%d direct reads disagreed with bpf_probe_read_user", r.Mismatches)
			}
			// Every thread's descent crosses several pages each round.
			if r.Walks < threads*rounds {
				t.Errorf("%d page walks, want at least %d: the threads' reads crossed pages", r.Walks, threads*rounds)
			}
		})
	}
}

// TestOneUprobePerSite: where the kernel has no uprobe_multi links (6.1),
// each site gets its own uprobe with the same cookie, and the tracer sees
// what it sees through the links: every lock and unlock of an inversion,
// each op told by its cookie.
func TestOneUprobePerSite(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "inversion")
	count := func(recs []events.Record) map[events.Op]int {
		n := map[events.Op]int{}
		for _, r := range recs {
			if r.Kind == events.RecEvent {
				n[r.Event.Op]++
			}
		}
		return n
	}
	multi, _ := trace(t, source.Options{Mode: source.ModeFull}, prog)
	tracer.WithoutUprobeMulti(t)
	single, tr := trace(t, source.Options{Mode: source.ModeFull}, prog)
	m, s := count(multi), count(single)
	for _, op := range []events.Op{events.OpMutexLock, events.OpMutexUnlock} {
		if s[op] < 4 || s[op] != m[op] {
			t.Errorf("%v: %d events with one uprobe a site, %d with uprobe_multi; want the same, at least 4", op, s[op], m[op])
		}
	}
	uprobes := 0
	for _, site := range tr.Sites() {
		if site.Kind == "uprobe" {
			uprobes++
		}
	}
	if uprobes == 0 {
		t.Errorf("no uprobe sites placed: %v", tr.Sites())
	}
}
