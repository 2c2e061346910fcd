//go:build linux && amd64

package symbolize

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// Stacks are symbolized behind the process: a library unloaded since the
// last snapshot still names its addresses, until something else is mapped
// there.
func TestRefreshKeepsUnmappedUntilReplaced(t *testing.T) {
	prog := progBuild.path(t)
	lib := plugBuild.path(t)
	tg := startTarget(t, prog, lib)
	s := New(tg.pid())

	fmt.Fprintln(tg.stdin, "dlopen")
	tg.readUntilReady(t)
	plugFn := tg.addrs["plug_fn"]
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if f := s.Frame(plugFn); f.Function != "plug_fn" {
		t.Fatalf("Frame(plug_fn) while loaded = %+v", f)
	}

	fmt.Fprintln(tg.stdin, "dlclose")
	tg.readUntilReady(t)
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if m, ok := s.Maps().Find(plugFn); !ok || m.Path != lib {
		t.Errorf("after dlclose, plug_fn is in %+v, %v; want the unloaded %s kept", m, ok, lib)
	}
	s.frames.clear()
	if f := s.Frame(plugFn + 1); f.Function != "plug_fn" || f.Object != lib {
		t.Errorf("after dlclose: Frame(plug_fn+1) = %+v; want plug_fn in %s", f, lib)
	}

	fmt.Fprintln(tg.stdin, "cover")
	tg.readUntilReady(t)
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if m, ok := s.Maps().Find(plugFn); !ok || m.Path != "" {
		t.Errorf("after anonymous memory was mapped over it, plug_fn is in %+v, %v; want that memory", m, ok)
	}
	if f := s.Frame(plugFn + 2); f.Function != "" {
		t.Errorf("Frame(plug_fn+2) in anonymous memory = %+v; want no function", f)
	}
}

// An exec replaces the whole address space: nothing of the old image is
// kept.
func TestRefreshAfterExec(t *testing.T) {
	prog := progBuild.path(t)
	sh := testenv.Tool(t, "a POSIX shell", "sh")
	tg := startTarget(t, sh, "-c", "echo ready; read line; exec "+prog)
	s := New(tg.pid())
	shell, err := filepath.EvalSymlinks(sh)
	if err != nil {
		t.Fatal(err)
	}
	hasShell := func() bool {
		for _, m := range s.Maps() {
			if m.Path == shell {
				return true
			}
		}
		return false
	}
	if !hasShell() {
		t.Fatalf("the shell %s is not in its own mappings", shell)
	}
	fmt.Fprintln(tg.stdin, "go")
	tg.readUntilReady(t)
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if hasShell() {
		t.Errorf("after exec, the mappings still hold the shell %s", shell)
	}
	if f := s.Frame(tg.addrs["target_fn"]); f.Function != "target_fn" || f.Object != prog {
		t.Errorf("after exec: Frame(target_fn) = %+v", f)
	}
}

// A forked child starts with its parent's mappings: one gone before it is
// looked at still symbolizes the code it shared with its parent.
func TestForkKeepsParentMappings(t *testing.T) {
	prog := progBuild.path(t)
	tg := startTarget(t, prog)
	s := New(tg.pid())
	// A process that has exited and been reaped stands for a child that
	// was gone before its maps were read.
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	c := s.Fork(done.Process.Pid)
	if f := c.Frame(tg.addrs["target_fn"]); f.Function != "target_fn" || f.Object != prog {
		t.Errorf("gone child: Frame(target_fn) = %+v", f)
	}
	if name, ok := c.Data(tg.addrs["vma_lock"]); name != "vma_lock (prog)" || !ok {
		t.Errorf("gone child: Data(vma_lock) = %q, %v", name, ok)
	}
	if err := c.Refresh(); err == nil {
		t.Error("Refresh of a gone child succeeded")
	}
}

// mapsReader is a process's open /proc/PID/maps that calls between after
// the first read(2), the kernel's first page of it.
type mapsReader struct {
	*os.File
	between func()
	reads   int
	read    int // bytes read
}

func (r *mapsReader) Read(p []byte) (int, error) {
	n, err := r.File.Read(p)
	r.read += n
	if r.reads++; r.reads == 1 {
		r.between()
	}
	return n, err
}

// readMapsAcross reads pid's maps with between run after the first read,
// and checks the kernel did cut the file short there.
func readMapsAcross(t *testing.T, pid int, between func()) error {
	t.Helper()
	whole, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := &mapsReader{File: f, between: between}
	maps, err := readMaps(r)
	if r.reads < 2 || r.read >= len(whole) {
		t.Fatalf("read %d bytes of %d in %d reads: the file was not cut short", r.read, len(whole), r.reads)
	}
	if err == nil {
		t.Errorf("%d mappings of a file cut short, and no error", len(maps))
	}
	return err
}

// A process that exits while its maps are read ends the file after what
// was read so far: a list without the mappings past it (the libraries,
// the stack), which is not the process's.
func TestReadMapsExitMidRead(t *testing.T) {
	tg := startTarget(t, progBuild.path(t))
	pid := tg.pid()
	err := readMapsAcross(t, pid, func() {
		tg.cmd.Process.Kill()
		// A zombie, not reaped: its pid stays.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			t.Fatal(err)
		}
	})
	if !errors.Is(err, ErrSpaceEnded) || !exited(pid) {
		t.Errorf("read across the exit: %v, exited %v; want ErrSpaceEnded, exited", err, exited(pid))
	}
}

// An exec while the maps are read ends the file the same way, but the
// process lives on: a Symbolizer must not take it for gone.
func TestReadMapsExecMidRead(t *testing.T) {
	prog := progBuild.path(t)
	sh := testenv.Tool(t, "a POSIX shell", "sh")
	tg := startTarget(t, sh, "-c", "echo ready; read line; exec "+prog)
	err := readMapsAcross(t, tg.pid(), func() {
		fmt.Fprintln(tg.stdin, "go")
		tg.readUntilReady(t)
	})
	if !errors.Is(err, ErrSpaceEnded) || exited(tg.pid()) {
		t.Errorf("read across the exec: %v, exited %v; want ErrSpaceEnded, not exited", err, exited(tg.pid()))
	}
	s := New(tg.pid())
	if f := s.Frame(tg.addrs["target_fn"]); f.Function != "target_fn" || f.Object != prog {
		t.Errorf("after exec: Frame(target_fn) = %+v", f)
	}
}
