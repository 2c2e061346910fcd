package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestAutoNeedsEBPF: --recorder auto (the default) records with eBPF what
// the preload recorder cannot: a target the loader will not preload
// (static, setuid, Go) and a --probe whose first instruction the shim
// cannot run from a displaced copy (progress_user is a tail call: a jump).
// With privileges the trace says ebpf and has eBPF's finding; as an
// ordinary user run exits with the permission status and says why.
func TestAutoNeedsEBPF(t *testing.T) {
	testenv.RequireBPF(t)
	testenv.File(t, "/usr/lib/x86_64-linux-gnu/libc.a", "apt-get install -y libc6-dev")
	inversion := testenv.Program(t, "inversion")
	static := testenv.Program(t, "inversion", "-static")
	// A private setuid copy: the shared build must not be modified.
	setuid := filepath.Join(t.TempDir(), "inversion")
	b, err := os.ReadFile(inversion)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(setuid, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(setuid, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	progress := testenv.Program(t, "progress")
	for _, c := range []struct {
		name   string
		prog   string
		args   []string // run's, the target's included
		why    string   // what both the notice and the error say
		finds  string   // the finding the eBPF trace has
		noRoot bool     // eBPF cannot record it either (a Go program without cgo)
	}{
		{name: "static", prog: static, args: []string{"--", static}, why: "is statically linked", finds: "lock-order-cycle"},
		{name: "setuid", prog: setuid, args: []string{"--", setuid}, why: "is setuid or setgid", finds: "lock-order-cycle"},
		{name: "probe", prog: progress, args: []string{"--forbid", "verify_segment>progress_user", "--", progress},
			why: "--probe progress_user: its first instruction (JMP", finds: "forbidden-nesting"},
		// hooktrace itself: static Go. eBPF is chosen, and finds nothing
		// to probe in it, which it says.
		{name: "go", prog: hooktraceBin, args: []string{"--", hooktraceBin, "--version"}, why: "is a Go program", noRoot: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			report, _, stderr, code := runJSON(t, append([]string{"--fail-on", "none"}, c.args...)...)
			if !strings.Contains(stderr, "hooktrace: recording with eBPF: ") || !strings.Contains(stderr, c.why) {
				t.Errorf("stderr does not say why eBPF records (%q):\n%s", c.why, stderr)
			}
			if c.noRoot {
				if code != exitFailure || !strings.Contains(stderr, "no probe placed") {
					t.Errorf("exit %d, want %d saying no probe was placed:\n%s", code, exitFailure, stderr)
				}
			} else {
				if code != 0 {
					t.Fatalf("exit %d\n%s", code, stderr)
				}
				var r struct {
					Stats struct {
						Traces []struct {
							Recorder string `json:"recorder"`
						} `json:"traces"`
					} `json:"stats"`
				}
				if err := json.Unmarshal([]byte(report), &r); err != nil {
					t.Fatal(err)
				}
				if len(r.Stats.Traces) != 1 || r.Stats.Traces[0].Recorder != "ebpf" {
					t.Errorf("traces %+v: want one, recorded by ebpf", r.Stats.Traces)
				}
				if fs := ofKind(findings(t, report), c.finds, "error"); len(fs) != 1 {
					t.Errorf("want 1 %s error, got %v", c.finds, findings(t, report))
				}
			}

			cmd := asNobody(t, c.prog, append([]string{hooktraceBin, "run"}, c.args...)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitPermission || !strings.Contains(string(out), c.why) ||
				!strings.Contains(string(out), "so the ebpf recorder is needed: not permitted to load BPF programs") {
				t.Errorf("as nobody: %v, %q; want exit %d saying %q and that eBPF is needed", err, out, exitPermission, c.why)
			}
		})
	}
}
