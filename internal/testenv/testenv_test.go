package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// TestUnavailable runs a test that misses something in a child test
// process, with and without CI: it must fail under CI and skip elsewhere.
func TestUnavailable(t *testing.T) {
	for _, ci := range []string{"", "1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingPiece$", "-test.v")
		cmd.Env = append(os.Environ(), "HOOKTRACE_TESTENV_CHILD=1", "CI="+ci)
		out, err := cmd.CombinedOutput()
		switch {
		case ci != "" && (err == nil || !strings.Contains(string(out), "--- FAIL: TestMissingPiece") ||
			!strings.Contains(string(out), "no no-such-tool-frobnicator in PATH (apt-get install -y frobnicator) (required under CI)")):
			t.Errorf("under CI: %v\n%s", err, out)
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP: TestMissingPiece")):
			t.Errorf("outside CI: %v\n%s", err, out)
		}
	}
}

func TestMissingPiece(t *testing.T) {
	if os.Getenv("HOOKTRACE_TESTENV_CHILD") == "" {
		return // only TestUnavailable's child runs it
	}
	Tool(t, "apt-get install -y frobnicator", "no-such-tool-frobnicator")
	t.Fatal("Tool returned without the tool")
}

// TestBuildShared: two tests building the same program share one
// executable, named as asked; another flag makes another build.
func TestBuildShared(t *testing.T) {
	const code = "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 6 * 7); return 0; }\n"
	a := C{Name: "answer", Code: code}.Build(t)
	b := C{Name: "answer", Code: code}.Build(t)
	c := C{Name: "answer", Code: code, Flags: []string{"-O0"}}.Build(t)
	if a != b || a == c || !strings.HasSuffix(a, "/answer") {
		t.Errorf("builds %s, %s, %s: want the first two equal, the third apart, all named answer", a, b, c)
	}
	for _, bin := range []string{a, c} {
		out, err := exec.Command(bin).Output()
		if err != nil || string(out) != "42\n" {
			t.Errorf("%s: %q %v", bin, out, err)
		}
	}
}
