//go:build linux && amd64

package inject

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// libcFunc is the address of libc's function name in pid.
func libcFunc(t *testing.T, pid int, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[2] != "00000000" || !strings.HasPrefix(filepath.Base(f[5]), "libc.so") {
			continue
		}
		var start uint64
		fmt.Sscanf(f[0], "%x-", &start)
		ef, err := elf.Open(f[5])
		if err != nil {
			t.Fatal(err)
		}
		defer ef.Close()
		syms, err := ef.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range syms {
			if s.Name == name {
				return start + s.Value
			}
		}
		t.Fatalf("no %s in %s", name, f[5])
	}
	t.Fatalf("pid %d maps no libc", pid)
	return 0
}

// TestCallInBlockedThread: cat, blocked in read(2), is made to call libc's
// getpid and atoi (of a string hooktrace wrote) while stopped, and then
// reads and echoes its input as if nothing happened: its registers, and
// the system call it was in, are its own again.
func TestCallInBlockedThread(t *testing.T) {
	cmd := exec.Command("cat")
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(outPipe)
	// Echoed: cat is running, then blocked in its next read.
	io.WriteString(in, "one\n")
	if line, _ := out.ReadString('\n'); line != "one\n" {
		t.Fatalf("cat said %q", line)
	}
	pid := cmd.Process.Pid
	getpid, atoi := libcFunc(t, pid, "getpid"), libcFunc(t, pid, "atoi")
	err := With(pid, func(s *Stopped) error {
		th := s.Threads()[0]
		got, err := s.Call(th, getpid)
		if err != nil {
			return err
		}
		if int(got) != pid {
			t.Errorf("getpid in the target returned %d, want %d", got, pid)
		}
		at, err := s.PushString(th, "1234567")
		if err != nil {
			return err
		}
		if n, err := s.Call(th, atoi, at); err != nil || n != 1234567 {
			t.Errorf("atoi in the target: %d, %v; want 1234567", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "two\n")
	if line, _ := out.ReadString('\n'); line != "two\n" {
		t.Fatalf("after the calls cat said %q", line)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("cat after the calls: %v", err)
	}
}
