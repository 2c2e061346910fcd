//go:build linux && amd64

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// poller is the bench's stand-in for an MPI rank: "busy" spins forever
// without a syscall, as a rank busy-polls its shared-memory queues; "idle"
// sleeps in pause. Linked with pthreads, so attach has lock calls to
// place probes on.
const poller = `#include <pthread.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int main(int argc, char **argv)
{
	pthread_mutex_lock(&mu);
	pthread_mutex_unlock(&mu);
	if (argc > 1 && strcmp(argv[1], "idle") == 0) {
		for (;;)
			pause();
	}
	volatile unsigned long n = 0;
	for (;;)
		n++;
}
`

// BenchmarkStartup measures what hooktrace adds before and after a
// target runs, round-robin over the rounds, and prints a Markdown table
// of medians (and ranges):
//   - run -- /bin/true, wall time, under each recorder and alone: what a
//     short program pays for being traced (auto's default must stay
//     within 0.15 s of preload's);
//   - run's time from its start to the ready file (probes live, target
//     let go to exec);
//   - attach's time from its start to the ready file (probes live), on an
//     idle process and on one of two processes that busy-poll on every
//     core of a two-core machine, as MPI ranks do (the BPF verifier then
//     gets a fraction of a CPU).
//
// Run with -benchtime 1x.
func BenchmarkStartup(b *testing.B) {
	testenv.RequireBPF(b)
	bin := hooktraceBinary(b, b.TempDir())
	poll := testenv.C{Code: poller, Name: "poller"}.Build(b)
	trueBin, err := exec.LookPath("true")
	if err != nil {
		b.Fatal(err)
	}
	type measure struct {
		key, what string
		run       func(dir string) (time.Duration, error)
	}
	runTrue := func(recorder string, toReady bool) func(string) (time.Duration, error) {
		return func(dir string) (time.Duration, error) {
			ready := filepath.Join(dir, "ready")
			args := []string{"run", "--fail-on", "none", "--ready-file", ready}
			if recorder != "" {
				args = append(args, "--recorder", recorder)
			}
			cmd := exec.Command(bin, append(args, "--", trueBin)...)
			start := time.Now()
			if !toReady {
				out, err := cmd.CombinedOutput()
				if err != nil {
					return 0, fmt.Errorf("%v\n%s", err, tail(string(out)))
				}
				return time.Since(start), nil
			}
			// The target runs to its end.
			return untilReady(cmd, ready, start, func(*exec.Cmd) {})
		}
	}
	attach := func(busy bool) func(string) (time.Duration, error) {
		return func(dir string) (time.Duration, error) {
			mode := "idle"
			if busy {
				mode = "busy"
			}
			var targets []*exec.Cmd
			defer func() {
				for _, t := range targets {
					t.Process.Kill()
					t.Wait()
				}
			}()
			for range 1 + b2i(busy) {
				t := exec.Command(poll, mode)
				if err := t.Start(); err != nil {
					return 0, err
				}
				targets = append(targets, t)
			}
			// Let the target reach its loop (its libraries mapped).
			time.Sleep(100 * time.Millisecond)
			ready := filepath.Join(dir, "ready")
			cmd := exec.Command(bin, "attach", "--fail-on", "none", "--hang-timeout", "0",
				"--ready-file", ready, "--pid", strconv.Itoa(targets[0].Process.Pid))
			return untilReady(cmd, ready, time.Now(), func(c *exec.Cmd) { c.Process.Signal(syscall.SIGINT) })
		}
	}
	untraced := func(string) (time.Duration, error) {
		start := time.Now()
		err := exec.Command(trueBin).Run()
		return time.Since(start), err
	}
	measures := []measure{
		{"true", "/bin/true alone", untraced},
		{"run-preload", "run --recorder preload -- /bin/true", runTrue("preload", false)},
		{"run-auto", "run -- /bin/true (auto: preload + sys_enter)", runTrue("", false)},
		{"run-ebpf", "run --recorder ebpf -- /bin/true", runTrue("ebpf", false)},
		{"ready-preload", "run --recorder preload: start to target let go", runTrue("preload", true)},
		{"ready-auto", "run (auto): start to target let go", runTrue("", true)},
		{"ready-ebpf", "run --recorder ebpf: start to target let go", runTrue("ebpf", true)},
		{"attach-idle", "attach to an idle process: start to probes live", attach(false)},
		{"attach-busy", "attach beside two busy-polling processes: start to probes live", attach(true)},
	}
	times := map[string][]time.Duration{}
	fails := map[string]string{}
	for round := range *rounds {
		for _, m := range measures {
			if fails[m.key] != "" {
				continue
			}
			dir := filepath.Join(b.TempDir(), fmt.Sprintf("%s-%d", m.key, round))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			d, err := m.run(dir)
			if err != nil {
				fails[m.key] = err.Error()
				continue
			}
			times[m.key] = append(times[m.key], d)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nStart-up, %d rounds, load average %s\n\n", *rounds, loadavg())
	sb.WriteString("| what | median | range |\n|---|---|---|\n")
	for _, m := range measures {
		if why := fails[m.key]; why != "" {
			fmt.Fprintf(&sb, "| %s | failed: %s | |\n", m.what, firstLine(why))
			continue
		}
		ts := slices.Clone(times[m.key])
		slices.Sort(ts)
		med := medianOf(ts)
		fmt.Fprintf(&sb, "| %s | %s | %s–%s |\n", m.what, fmtDur(med), fmtDur(ts[0]), fmtDur(ts[len(ts)-1]))
		b.ReportMetric(med.Seconds(), m.key+"-s")
	}
	fmt.Fprint(os.Stderr, sb.String())
	if len(fails) > 0 {
		b.Fatalf("%d measures failed", len(fails))
	}
}

// untilReady starts cmd, waits for it to write its ready file and returns
// the time from start, then stop(cmd) ends it; an error if cmd exits
// first.
func untilReady(cmd *exec.Cmd, ready string, start time.Time, stop func(*exec.Cmd)) (time.Duration, error) {
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			d := time.Since(start)
			stop(cmd)
			<-exited
			return d, nil
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("%s exited before writing its ready file: %v", filepath.Base(cmd.Path), err)
		case <-time.After(time.Millisecond):
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hooktraceBinary is the hooktrace binary to measure: -hooktrace, or one
// built from ../cmd/hooktrace into dir.
func hooktraceBinary(b *testing.B, dir string) string {
	if *binary != "" {
		return *binary
	}
	bin := filepath.Join(dir, "hooktrace")
	if msg, err := exec.Command("go", "build", "-o", bin, "../cmd/hooktrace").CombinedOutput(); err != nil {
		b.Fatalf("building hooktrace: %v\n%s", err, msg)
	}
	return bin
}
