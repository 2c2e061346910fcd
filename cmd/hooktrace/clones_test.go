//go:build linux && amd64

package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestProbeClones: gcc -O2 turns worker into worker.constprop.0, the only
// copy main calls, with its error path split off into
// worker.constprop.0.cold. A rule on worker is a rule on the clone, under
// every recorder: the clone is probed and named, the .cold fragment is
// not, and the probe count includes the --probe breakpoints.
func TestProbeClones(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "clones")
	placed := regexp.MustCompile(`(\d+) probes placed`)
	counts := map[string]string{}
	for _, rec := range withAuto {
		t.Run(rec, func(t *testing.T) {
			report, stdout, stderr, code := runJSON(t, "--recorder", rec, "--fail-on", "none",
				"--forbid", "main>worker", "--", prog)
			if code != 0 || !strings.Contains(stdout, "total 15") {
				t.Fatalf("exit %d, stdout %q\n%s", code, stdout, stderr)
			}
			if !strings.Contains(stderr, "worker.constprop.0 (0x") || strings.Contains(stderr, ".cold") {
				t.Errorf("stderr does not name the clone probed, or names the .cold fragment:\n%s", stderr)
			}
			var r struct {
				Findings []struct {
					Kind        string `json:"kind"`
					Occurrences int    `json:"occurrences"`
				} `json:"findings"`
			}
			if err := json.Unmarshal([]byte(report), &r); err != nil {
				t.Fatal(err)
			}
			nest := 0
			for _, f := range r.Findings {
				if f.Kind == "forbidden-nesting" {
					nest++
					if f.Occurrences != 2 {
						t.Errorf("worker ran inside main %d times, want 2", f.Occurrences)
					}
				}
			}
			if nest != 1 {
				t.Errorf("want 1 forbidden-nesting finding, got %s", report)
			}
			m := placed.FindStringSubmatch(stderr)
			if m == nil {
				t.Fatalf("no probe count:\n%s", stderr)
			}
			counts[rec] = m[1]
			// The breakpoints on main and worker's clone, under the
			// shim too (entry and return under eBPF).
			if !regexp.MustCompile(`\bclones \([24]\)`).MatchString(stderr) {
				t.Errorf("the probe count leaves out the --probe functions in clones:\n%s", stderr)
			}
		})
	}
	t.Logf("probes placed: %v", counts)
}
