//go:build linux && amd64

package tracer_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer"
)

func init() {
	// This test binary is also the gate for the targets it starts.
	if len(os.Args) > 1 && os.Args[1] == tracer.GateArg {
		runtime.LockOSThread()
		tracer.RunGate(os.Args[2:])
	}
}

func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("eBPF unavailable under CI: not root")
	}
	t.Skip("eBPF unavailable: not root")
}

func buildC(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	b, err := exec.Command("gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", out,
		filepath.Join("..", "testdata", name+".c")).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

// trace runs prog under the tracer and returns its records.
func trace(t *testing.T, opts tracer.Options, argv ...string) (recs []events.Record, tr *tracer.Tracer) {
	t.Helper()
	var warnMu sync.Mutex
	opts.Warn = func(s string) { warnMu.Lock(); t.Log("warning:", s); warnMu.Unlock() }
	tr, err := tracer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	g, err := tracer.StartGated(argv)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Attach(g.Cmd.Process.Pid, g.Path); err != nil {
		g.Abort()
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- tr.Run(stop, func(r *events.Record) error {
			c := *r
			if c.Stack != nil {
				s := *c.Stack
				c.Stack = &s
			}
			recs = append(recs, c)
			return nil
		})
	}()
	if err := g.Open(); err != nil {
		t.Fatal(err)
	}
	g.Cmd.Wait()
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return recs, tr
}

func TestTracerSeesMallocsUnderLock(t *testing.T) {
	requireBPF(t)
	prog := buildC(t, "mallocs")
	recs, tr := trace(t, tracer.Options{Mode: tracer.ModeFull}, prog)
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
