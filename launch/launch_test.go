//go:build linux && amd64

package launch_test

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hooktrace/hooktrace/launch"
)

func init() {
	// This test binary is also the gate for the targets it starts.
	if len(os.Args) > 1 && os.Args[1] == launch.GateArg {
		runtime.LockOSThread()
		launch.RunGate(os.Args[2:])
	}
}

// The target runs what it was given, with its status passed back, and is
// held at its exec, at each fork and at each exit, child's and its own.
func TestRunToExitHoldsExecForkExit(t *testing.T) {
	g, err := launch.Start([]string{"sh", "-c", "(exit 0) & wait; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	target := g.Cmd.Process.Pid
	if !filepath.IsAbs(g.Path) || filepath.Base(g.Path) != "sh" {
		t.Errorf("Path %q: want sh's absolute path", g.Path)
	}
	var mu sync.Mutex
	var execs, forks, exits []int
	note := func(to *[]int) func(int) {
		return func(pid int) { mu.Lock(); *to = append(*to, pid); mu.Unlock() }
	}
	ws, err := g.RunToExit(note(&exits), note(&forks), note(&execs))
	if err != nil {
		t.Fatal(err)
	}
	if !ws.Exited() || ws.ExitStatus() != 3 {
		t.Errorf("status %v: want exit 3", ws)
	}
	if !slices.Contains(execs, target) {
		t.Errorf("exec stops %v: want the target %d", execs, target)
	}
	if len(forks) != 1 || forks[0] == target {
		t.Errorf("fork stops %v: want the one child sh forks", forks)
	}
	if !slices.Contains(exits, target) || (len(forks) == 1 && !slices.Contains(exits, forks[0])) {
		t.Errorf("exit stops %v: want the target %d and its child %v", exits, target, forks)
	}
}

// StartEnv hands the target its environment and extra descriptors from
// fd 4 on.
func TestStartEnvPassesEnvironmentAndFiles(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	g, err := launch.StartEnv([]string{"sh", "-c", "echo $LAUNCH_TEST >&4"},
		append(os.Environ(), "LAUNCH_TEST=passed"), []*os.File{w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	ws, err := g.RunToExit(func(int) {}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	if ws.ExitStatus() != 0 || strings.TrimSpace(string(out)) != "passed" {
		t.Errorf("status %v, fd 4 read %q: want 0 and \"passed\"", ws, out)
	}
}

// An aborted target never runs its command.
func TestAbortNeverExecs(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	g, err := launch.Start([]string{"touch", marker})
	if err != nil {
		t.Fatal(err)
	}
	g.Abort()
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("%s exists (%v): the target ran after Abort", marker, err)
	}
}

func TestStartUnknownCommand(t *testing.T) {
	_, err := launch.Start([]string{"no-such-command-for-launch"})
	if err == nil || !strings.Contains(err.Error(), "finding no-such-command-for-launch") {
		t.Errorf("error %v: want one naming the command it could not find", err)
	}
}
