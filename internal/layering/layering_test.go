// Package layering holds a test of the import graph: the packages import
// one way, as docs/design.md draws it.
package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/hooktrace/hooktrace/"

// imports lists each of the module's packages (for linux/amd64, the
// platform that traces) with the module's packages it imports.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"...")
	cmd.Env = append(cmd.Environ(), "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rest, ok := strings.CutPrefix(imp, module); ok {
				graph[pkg] = append(graph[pkg], rest)
			}
		}
	}
	return graph
}

// Each rule: packages (a name, or a prefix ending in "/") that must not
// import any of the others, and why.
var forbidden = []struct {
	from, to []string
	why      string
}{
	{[]string{"source", "probesite", "placement", "symbolize", "unwind", "internal/abi", "hang", "session", "launch", "events", "analyzer", "reports"},
		[]string{"tracer", "tracer/", "preload", "cmd/"},
		"the recorders and the CLI sit on top of what they share"},
	{[]string{"probesite", "placement", "symbolize", "unwind"},
		[]string{"source"},
		"finding sites and reading objects come before converting records"},
	{[]string{"symbolize", "unwind"},
		[]string{"probesite", "placement"},
		"the object layer knows nothing of probes"},
	{[]string{"unwind"},
		[]string{"symbolize"},
		"symbolize builds on the unwinder's CFI, not the other way"},
	{[]string{"events", "analyzer", "reports"},
		[]string{"source", "probesite", "placement", "symbolize", "unwind", "internal/abi", "hang", "inject"},
		"offline analysis builds and runs anywhere Go does"},
}

func matches(pkg string, names []string) bool {
	for _, n := range names {
		if pkg == n || (strings.HasSuffix(n, "/") && strings.HasPrefix(pkg, n)) {
			return true
		}
	}
	return false
}

func TestImportsGoOneWay(t *testing.T) {
	graph := imports(t)
	for _, want := range []string{"tracer", "source", "probesite", "placement", "symbolize", "unwind", "internal/abi"} {
		if _, ok := graph[want]; !ok {
			t.Errorf("no package %s: update this test and docs/design.md with the new layout", want)
		}
	}
	for pkg, imps := range graph {
		// tracer loads BPF and reads its ring: what it uses lives beside
		// it, not under it.
		if strings.HasPrefix(pkg, "tracer/") {
			t.Errorf("%s: tracer has no subpackages; shared code goes to the top level", pkg)
		}
		for _, imp := range imps {
			for _, r := range forbidden {
				if matches(pkg, r.from) && matches(imp, r.to) {
					t.Errorf("%s imports %s: %s", pkg, imp, r.why)
				}
			}
		}
	}
}
