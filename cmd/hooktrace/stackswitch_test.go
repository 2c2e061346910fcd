//go:build linux && amd64

package main

import (
	"encoding/json"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestProbedFunctionSwitchesStacks: the runtimes this tool is for run
// user-level threads that switch stacks inside a function, and leave
// functions by longjmp. A probed function entered on two contexts, whose
// first-entered returns first, and 100 probed calls left by longjmp (more
// than the preload recorder keeps return addresses for) must leave the
// program's output and status as untraced, with every entry counted and
// every exit that happened: the two returns of coro_step and the five of
// plain_step after the jumps. The preload recorder once aborted the
// program here, and faulted reading a sample above the top of a context's
// stack. The kernel's uretprobes, which the eBPF recorder's exits are,
// kill a program whose thread returns on another stack (SIGILL): eBPF is
// held to the longjmp half, and counts the same there.
func TestProbedFunctionSwitchesStacks(t *testing.T) {
	prog := testenv.Program(t, "switchstacks")
	for _, recorder := range []string{"preload", "ebpf"} {
		for _, mode := range []string{"full", "aggregate"} {
			t.Run(recorder+" "+mode, func(t *testing.T) {
				if recorder == "ebpf" {
					testenv.RequireBPF(t)
				}
				want, args, enters, exits := "a 11\nb 21\njumped 100, sum 20\n", []string{prog}, uint64(107), uint64(7)
				if recorder == "ebpf" {
					want, args, enters, exits = "jumped 100, sum 20\n", []string{prog, "100", "nocoro"}, 105, 5
				}
				report, stdout, stderr, code := runJSON(t, append([]string{"--recorder", recorder, "--mode", mode, "--fail-on", "none",
					"--probe", "coro_step", "--probe", "leave_by_jump", "--probe", "plain_step", "--"}, args...)...)
				if code != 0 || stdout != want {
					t.Fatalf("exit %d, output %q (want %q)\n%s", code, stdout, want, stderr)
				}
				rep := parseReport(t, report)
				if rep.Stats.ExitStatus == nil || *rep.Stats.ExitStatus != 0 {
					t.Fatalf("the program exited with %v", rep.Stats.ExitStatus)
				}
				// 2 + 100 + 5 entries; 2 + 5 exits.
				if c := rep.Stats.Calls; c["probe_enter"] != enters || c["probe_exit"] != exits {
					t.Errorf("calls %v: want %d probe_enter and %d probe_exit", c, enters, exits)
				}
				if rep.Stats.LostEvents != 0 {
					t.Errorf("%d events lost", rep.Stats.LostEvents)
				}
			})
		}
	}
}

// TestProbedFunctionMovesThreads: a user-level thread entering a probed
// function on one thread and returning on another (Argobots and Qthreads
// move theirs between workers), and a probed function that tail-calls
// another, so that both return through one return address. The preload
// recorder once aborted the program on both. Every entry and exit is
// counted; the function that moved is over on the thread it was entered
// on (a rule with it as OUTER sees nothing there afterwards), and the
// tail call is a nesting. The eBPF recorder, whose uretprobes cannot
// follow a thread (SIGILL), is held to the tail calls.
func TestProbedFunctionMovesThreads(t *testing.T) {
	prog := testenv.Program(t, "migrate")
	for _, recorder := range []string{"preload", "ebpf"} {
		for _, mode := range []string{"full", "aggregate"} {
			t.Run(recorder+" "+mode, func(t *testing.T) {
				want := "tail calls 20, sum 420\nmigrated 20, sum 210, tail calls after 420\n"
				args, enters := []string{prog}, uint64(100)
				if recorder == "ebpf" {
					testenv.RequireBPF(t)
					want, args, enters = "tail calls 20, sum 420\n", []string{prog, "20", "nomigrate"}, 40
				}
				report, stdout, stderr, code := runJSON(t, append([]string{"--recorder", recorder, "--mode", mode, "--fail-on", "none",
					"--probe", "tail_outer", "--probe", "tail_inner", "--forbid", "ult_step > tail_inner",
					"--forbid", "tail_outer > tail_inner", "--"}, args...)...)
				if code != 0 || stdout != want {
					t.Fatalf("exit %d, output %q (want %q)\n%s", code, stdout, want, stderr)
				}
				rep := parseReport(t, report)
				if c := rep.Stats.Calls; c["probe_enter"] != enters || c["probe_exit"] != enters || rep.Stats.LostEvents != 0 {
					t.Errorf("calls %v, %d lost: want %d probe_enter and probe_exit", c, rep.Stats.LostEvents, enters)
				}
				var titles []string
				for _, raw := range rep.Findings {
					var f finding
					if err := json.Unmarshal(raw, &f); err != nil {
						t.Fatal(err)
					}
					titles = append(titles, f.Title)
				}
				// tail_inner runs inside tail_outer 20 times on the main
				// thread, and 20 more on the threads ult_step left.
				if len(titles) != 1 || titles[0] != "forbidden nesting: tail_inner ran inside tail_outer" {
					t.Errorf("findings %q", titles)
				}
			})
		}
	}
}
