package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrors: every mistake on the command line exits 2 with one
// line naming it, before anything is traced (no eBPF needed: none of these
// gets as far as loading a program).
func TestUsageErrors(t *testing.T) {
	binary := filepath.Join(t.TempDir(), "binary.supp")
	elf, err := os.ReadFile(hooktraceBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(binary, elf[:600_000], 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		says string
	}{
		{"run without a command", []string{"run"}, "run: requires at least 1 arg"},
		{"analyze without files", []string{"analyze"}, "analyze: requires at least 1 arg"},
		{"export without files", []string{"export", "-o", "x.json"}, "export: requires at least 1 arg"},
		{"unknown subcommand", []string{"bogus"}, `unknown command "bogus"`},
		{"bad mode", []string{"run", "--mode", "bogus", "--", "/bin/true"}, `--mode "bogus": want aggregate or full`},
		{"three-part forbid on run", []string{"run", "--forbid", "main>worker>main", "--", "/bin/true"}, `"main>worker>main": want OUTER>INNER`},
		{"three-part forbid on attach", []string{"attach", "--pid", "1", "--forbid", "main>worker>main"}, `"main>worker>main": want OUTER>INNER`},
		{"three-part forbid on analyze", []string{"analyze", "--forbid", "main>worker>main", fixtureSeed}, `"main>worker>main": want OUTER>INNER`},
		{"ring too big", []string{"run", "--ring", "2G", "--", "/bin/true"}, "from 4K to 1G"},
		{"ring not a power of two", []string{"run", "--ring", "3M", "--", "/bin/true"}, "from 4K to 1G"},
		{"binary suppressions file", []string{"analyze", "--suppress", binary, fixtureSeed}, binary + ":1: not a text line"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr, code := hooktrace(t, nil, c.args...)
			if code != exitUsage || !strings.Contains(stderr, c.says) {
				t.Errorf("exit %d (want %d), stderr %q (want it to say %q)", code, exitUsage, stderr, c.says)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; lines != 1 || len(stderr) > 300 {
				t.Errorf("want a one-line error, got %d lines, %d bytes: %q", lines, len(stderr), stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}
