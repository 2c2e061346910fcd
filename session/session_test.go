//go:build linux && amd64

package session_test

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/launch"
	"github.com/hooktrace/hooktrace/preload"
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

// Both recorders are sources for the same session.
var (
	_ session.Recorder = (*tracer.Tracer)(nil)
	_ session.Recorder = (*preload.Preload)(nil)
	_ session.Launcher = (*preload.Preload)(nil)
)

// traceMallocs traces testdata/mallocs.c (4 threads, 10000 malloc(777)
// under one mutex) with rec into a trace file and the analyzer, as run
// does, and checks what a user would.
func traceMallocs(t *testing.T, rec session.Recorder) {
	t.Helper()
	prog := testenv.Program(t, "mallocs")
	target, err := session.Launch(rec, []string{prog})
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Attach(); err != nil {
		target.Abort()
		t.Fatal(err)
	}
	h := events.Header{Version: events.Version, Tool: "session test", Clock: "CLOCK_MONOTONIC"}
	target.Header(&h)
	if h.Exe != prog || h.PID == 0 || len(h.Probes) == 0 {
		t.Errorf("header: exe %q pid %d %d probes; want %s, its PID, the probes placed", h.Exe, h.PID, len(h.Probes), prog)
	}
	path := filepath.Join(t.TempDir(), "mallocs.htr")
	sink, err := session.NewSink(path, &h)
	if err != nil {
		target.Abort()
		t.Fatal(err)
	}
	mallocs, locks := 0, 0
	reading, err := session.Record(rec, func(r *events.Record) error {
		if r.Kind == events.RecEvent {
			switch {
			case r.Event.Op == events.OpMalloc && r.Event.Size == 777:
				mallocs++
			case r.Event.Op == events.OpMutexLock:
				locks++
			}
		}
		return sink.Add(r)
	})
	if err != nil {
		sink.Abandon()
		target.Abort()
		t.Fatal(err)
	}
	ws, waitErr := target.Wait(false, func(s string) { t.Log("warning:", s) })
	if err := reading.Stop(); err != nil {
		t.Fatal(err)
	}
	if waitErr != nil {
		t.Fatal(waitErr)
	}
	// mallocs.c exits 3, so that its own status is seen to come through.
	if !ws.Exited() || ws.ExitStatus() != 3 {
		t.Errorf("target: %v, want exit 3", ws)
	}
	foot := session.Footer(rec)
	if err := sink.Close(foot); err != nil {
		t.Fatal(err)
	}
	an := sink.Analyzer()
	an.Add(&events.Record{Kind: events.RecFooter, Footer: foot})
	if res := an.Result(); res.Stats.Threads < 4 {
		t.Errorf("the analyzer saw %d threads, want the 4 workers at least", res.Stats.Threads)
	}
	// The file holds what the reader handed out, footer included.
	rd, err := events.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	inFile := 0
	for {
		r, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind == events.RecEvent && r.Event.Op == events.OpMalloc && r.Event.Size == 777 {
			inFile++
		}
	}
	if inFile != mallocs || rd.Header().Exe != prog || rd.Footer() == nil || rd.Footer().Events != foot.Events {
		t.Errorf("trace file: %d malloc(777) (%d handed out), exe %q, footer %+v", inFile, mallocs, rd.Header().Exe, rd.Footer())
	}
	if mallocs != 10000 || locks < 10000 || foot.Lost != 0 || foot.Calls["malloc"] < 10000 {
		t.Errorf("%d malloc(777) and %d mutex lock events, %d lost, calls %v; want 10000, at least 10000, 0, malloc at least 10000",
			mallocs, locks, foot.Lost, foot.Calls)
	}
}

func warnTo(t *testing.T) func(string) {
	var mu sync.Mutex
	return func(s string) { mu.Lock(); t.Log("warning:", s); mu.Unlock() }
}

func TestSessionWithBPFTracer(t *testing.T) {
	testenv.RequireBPF(t)
	tr, err := tracer.New(source.Options{Mode: source.ModeFull, Warn: warnTo(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	traceMallocs(t, tr)
}

func TestSessionWithPreload(t *testing.T) {
	p, err := preload.New(source.Options{Mode: source.ModeFull, Warn: warnTo(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	traceMallocs(t, p)
}

// Without a recorder the target runs untraced, started the same way.
func TestSessionUntraced(t *testing.T) {
	target, err := session.Launch(nil, []string{"sh", "-c", "exit 7"})
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Attach(); err != nil {
		t.Fatal(err)
	}
	ws, err := target.Wait(false, nil)
	if err != nil || ws.ExitStatus() != 7 {
		t.Errorf("status %v, error %v: want exit 7", ws, err)
	}
}
