//go:build linux && amd64

package tracer_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/tracer"
)

// buildReplacedLib builds testdata/libreplaced.c as a shared library.
func buildReplacedLib(t *testing.T, out string, flags ...string) {
	t.Helper()
	args := append([]string{"-O2", "-g", "-fomit-frame-pointer", "-fno-toplevel-reorder", "-shared", "-fPIC", "-pthread", "-o", out},
		flags...)
	args = append(args, filepath.Join("..", "testdata", "libreplaced.c"))
	if b, err := exec.Command(testenv.Tool(t, "apt-get install -y gcc", "gcc"), args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

// replacedTarget builds testdata/replaced.c, the library it loads and
// the library's rebuild, and makes the FIFO it waits on.
func replacedTarget(t *testing.T) (prog, lib, newLib, fifo string) {
	t.Helper()
	prog = testenv.Program(t, "replaced")
	dir := t.TempDir()
	lib = filepath.Join(dir, "libreplaced.so")
	buildReplacedLib(t, lib, "-DSUFFIX=old", "-DFRAME=256", "-DPAD=0")
	newLib = filepath.Join(dir, "libreplaced.so.new")
	buildReplacedLib(t, newLib, "-DSUFFIX=new", "-DFRAME=2048", "-DPAD=400")
	fifo = filepath.Join(dir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return prog, lib, newLib, fifo
}

// A library rebuilt in place while the target runs (same path, new inode)
// must not change what its stacks say: symbols, lock names and the CFI the
// unwinder walks all come from the copy the process mapped.
func TestReplacedLibraryReadFromMapping(t *testing.T) {
	testenv.RequireBPF(t)
	prog, lib, newLib, fifo := replacedTarget(t)

	var warnMu sync.Mutex
	tr, err := tracer.New(source.Options{Warn: func(s string) { warnMu.Lock(); t.Log("warning:", s); warnMu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	target, err := session.Launch(tr, []string{prog, lib, fifo})
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Attach(); err != nil {
		target.Abort()
		t.Fatal(err)
	}
	var recs []events.Record
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
	// The target opens the FIFO once the library is mapped: replace the
	// library then, and let the target call it.
	replaced := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			replaced <- err
			return
		}
		defer f.Close()
		if err := os.Rename(newLib, lib); err != nil {
			replaced <- err
			return
		}
		_, err = f.Write([]byte{1})
		replaced <- err
	}()
	// As run does: held at its exit, the target's mappings are read
	// before they go.
	ws, err := target.Wait(false, func(s string) { t.Log("warning:", s) })
	if err != nil {
		t.Fatal(err)
	}
	if ws.ExitStatus() != 0 {
		// Unblock the writer if the target never opened the FIFO.
		if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatalf("target exited with %v", ws)
	}
	if err := <-replaced; err != nil {
		t.Fatalf("replacing the library: %v", err)
	}
	if err := reading.Stop(); err != nil {
		t.Fatal(err)
	}

	names := func(s *events.Stack) []string {
		var out []string
		for _, f := range s.Frames {
			out = append(out, f.Function)
		}
		return out
	}
	// hasInOrder reports whether want appears in frames as a subsequence.
	hasInOrder := func(frames []string, want ...string) bool {
		for _, f := range frames {
			if len(want) > 0 && f == want[0] {
				want = want[1:]
			}
		}
		return len(want) == 0
	}
	var unwound bool
	var lockName string
	for _, r := range recs {
		switch r.Kind {
		case events.RecStack:
			fs := names(r.Stack)
			for _, f := range r.Stack.Frames {
				if strings.HasSuffix(f.Function, "_new") || f.Function == "x_pad_new" {
					t.Errorf("a stack names %s of the library written after the target mapped it:\n  %s",
						f.Function, strings.Join(fs, "\n  "))
				}
			}
			// Only the CFI of the mapped copy walks from malloc through
			// the library (no frame pointers) to main.
			if hasInOrder(fs, "malloc", "x_inner_old", "x_outer_old", "x_entry", "main") {
				unwound = true
				t.Logf("unwound through the mapped library:\n  %s", strings.Join(fs, "\n  "))
			}
		case events.RecLockName:
			if strings.HasPrefix(r.LockName.Name, "x_lock") {
				lockName = r.LockName.Name
			}
		}
	}
	if !unwound {
		var all []string
		for _, r := range recs {
			if r.Kind == events.RecStack {
				all = append(all, strings.Join(names(r.Stack), " < "))
			}
		}
		t.Errorf("no stack goes malloc < x_inner_old < x_outer_old < x_entry < main; stacks:\n  %s", strings.Join(all, "\n  "))
	}
	if want := "x_lock_old (libreplaced.so)"; lockName != want {
		t.Errorf("the library's lock is named %q, want %q", lockName, want)
	}
}

// Attached to a process whose library was replaced on disk since it loaded
// it, the probes go on the copy it mapped: a uprobe attached by the path
// would go on the new file, and never fire.
func TestAttachProbesTheMappedLibrary(t *testing.T) {
	testenv.RequireBPF(t)
	prog, lib, newLib, fifo := replacedTarget(t)
	cmd := exec.Command(prog, lib, fifo)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	// Returns once the target has loaded the library and opened its end.
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.Rename(newLib, lib); err != nil {
		t.Fatal(err)
	}

	var warnMu sync.Mutex
	tr, err := tracer.New(source.Options{
		Mode:       source.ModeFull,
		UserProbes: []string{"x_entry@libreplaced.so"},
		Warn:       func(s string) { warnMu.Lock(); t.Log("warning:", s); warnMu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if err := tr.Attach(cmd.Process.Pid, ""); err != nil {
		t.Fatal(err)
	}
	// The target calls x_entry in a loop once it reads a byte. Two
	// acquisitions of its lock traced mean a whole call was traced, from
	// the entry probe on.
	var (
		lockAddr      uint64
		locks, enters int
		entryStack    uint32
		stacks        = map[uint32]*events.Stack{}
	)
	twoLocks := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- tr.Run(stop, func(r *events.Record) error {
			switch r.Kind {
			case events.RecStack:
				s := *r.Stack
				stacks[s.ID] = &s
			case events.RecLockName:
				if strings.HasPrefix(r.LockName.Name, "x_lock") {
					lockAddr = r.LockName.Addr
				}
			case events.RecEvent:
				switch {
				case r.Event.Op == events.OpProbeEnter:
					enters++
					entryStack = r.Event.Stack
				case r.Event.Op == events.OpMutexLock && lockAddr != 0 && r.Event.Addr == lockAddr:
					if locks++; locks == 2 {
						close(twoLocks)
					}
				}
			}
			return nil
		})
	}()
	if _, err := w.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-twoLocks:
	case <-time.After(time.Minute):
		t.Error("the target's lock was not traced twice in a minute")
	}
	w.Close() // the target stops after the current call
	if err := cmd.Wait(); err != nil {
		t.Errorf("target: %v", err)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if enters == 0 {
		t.Fatalf("the probe on x_entry never fired (%d lock calls traced in it)", locks)
	}
	if s := stacks[entryStack]; s == nil || len(s.Frames) == 0 || s.Frames[0].Function != "x_entry" {
		t.Errorf("the probe's stack is %+v, want x_entry first", s)
	}
	var found bool
	for _, s := range tr.Sites() {
		if s.Name == "x_entry" {
			found = true
			if s.Object != lib {
				t.Errorf("x_entry's site is in %s, want %s", s.Object, lib)
			}
		}
	}
	if !found {
		t.Error("no site for x_entry")
	}
}
