//go:build linux && amd64

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/funcname"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// These tests trace programs built with the real UPC++ 2020.10.0 runtime
// (make upcxx builds it once into a cache; CI runs it before the tests),
// run with 2 ranks on the smp conduit, where rank 0 forks rank 1.

// upcxxPrefix is the cached UPC++ install. Under CI a missing install is
// built (from the tarball testdata/upcxx/build.sh finds), and fails the
// test if it cannot be; elsewhere the test is skipped with the command.
func upcxxPrefix(t *testing.T) string {
	t.Helper()
	prefix := os.Getenv("UPCXX_PREFIX")
	if prefix == "" {
		prefix = "/var/cache/hooktrace/upcxx-2020.10.0"
	}
	built := func() bool {
		_, err1 := os.Stat(filepath.Join(prefix, ".hooktrace-built"))
		_, err2 := os.Stat(filepath.Join(prefix, "test", "rput.cpp"))
		return err1 == nil && err2 == nil
	}
	if built() {
		return prefix
	}
	if !testenv.CI() {
		testenv.Unavailable(t, "UPC++ is not built in %s: run make upcxx (once, about 13 minutes)", prefix)
	}
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(t), "testdata", "upcxx", "build.sh"), prefix)
	if out, err := cmd.CombinedOutput(); err != nil || !built() {
		t.Fatalf("building UPC++: %v\n%s", err, out)
	}
	return prefix
}

// upcxxProgram builds src with UPC++'s debug codemode for network. With
// include set, that directory's upcxx/ headers replace the install's (a
// variant of the runtime: most of UPC++ is templates in its headers).
func upcxxProgram(t *testing.T, prefix, src, network, include string) string {
	t.Helper()
	return upcxxBuild(t, prefix, src, "debug", network, include)
}

// upcxxBuild is upcxxProgram in codemode (debug or opt).
func upcxxBuild(t *testing.T, prefix, src, codemode, network, include string) string {
	t.Helper()
	meta := func(what string) string {
		cmd := exec.Command(filepath.Join(prefix, "bin", "upcxx-meta"), what)
		cmd.Env = append(os.Environ(), "UPCXX_CODEMODE="+codemode, "UPCXX_NETWORK="+network, "UPCXX_THREADMODE=seq")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("upcxx-meta %s: %v", what, err)
		}
		return strings.TrimSpace(string(out))
	}
	cxx := meta("CXX")
	flags := strings.Fields(meta("CXXFLAGS"))
	pp := strings.Fields(meta("PPFLAGS"))
	if include != "" {
		installed := filepath.Join(prefix, "upcxx.debug.gasnet_seq."+network, "include")
		for i, f := range pp {
			if f == "-I"+installed {
				pp[i] = "-I" + include
			}
		}
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".cpp")+"-"+codemode)
	args := append(append(append(flags, pp...), "-I", filepath.Join(prefix, "test"), src, "-o", out),
		append(strings.Fields(meta("LDFLAGS")), strings.Fields(meta("LIBFLAGS"))...)...)
	if b, err := exec.Command(cxx, args...).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", src, err, b)
	}
	return out
}

// upcxxRun runs argv under upcxx-run with 2 ranks; cmd, when not nil,
// is how (as another user). A run that hangs is killed after a while, so
// that a test fails instead of waiting for ever.
func upcxxRun(t *testing.T, prefix string, wrap func(argv ...string) *exec.Cmd, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	full := append([]string{filepath.Join(prefix, "bin", "upcxx-run"), "-n", "2"}, argv...)
	var cmd *exec.Cmd
	if wrap != nil {
		cmd = wrap(full...)
	} else {
		cmd = exec.Command(full[0], full[1:]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	go func() {
		<-ctx.Done()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && cmd.Process != nil {
			cmd.Process.Kill()
		}
	}()
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(prefix, "bin")+":"+os.Getenv("PATH"))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("upcxx-run: %v", err)
	}
	return o.String(), e.String(), code
}

// upcxxFinding is a finding as the JSON report gives it, with where it
// was seen.
type upcxxFinding struct {
	finding
	Occurrences int    `json:"occurrences"`
	Merged      string `json:"merged"`
	Seen        []struct {
		PID     uint32 `json:"pid"`
		Rank    *int   `json:"rank"`
		Count   int    `json:"count"`
		Threads []struct {
			TID uint32 `json:"tid"`
		} `json:"threads"`
	} `json:"seen"`
}

func upcxxFindings(t *testing.T, report string) []upcxxFinding {
	t.Helper()
	var r struct {
		Findings []upcxxFinding `json:"findings"`
	}
	if err := json.Unmarshal([]byte(report), &r); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, report)
	}
	return r.Findings
}

// stackMatches reports whether edge i's stack has each of fns, in that
// order from the innermost frame, as C++ names match (with or without
// parameters and template arguments).
func stackMatches(f finding, i int, fns ...string) bool {
	if i >= len(f.Edges) {
		return false
	}
	next := 0
	for _, fr := range f.Edges[i].Stack {
		if next < len(fns) && funcname.Match(fns[next], fr.Function, "") {
			next++
		}
	}
	return next == len(fns)
}

func nestingsOf(fs []upcxxFinding) []upcxxFinding {
	var out []upcxxFinding
	for _, f := range fs {
		if f.Kind == "forbidden-nesting" {
			out = append(out, f)
		}
	}
	return out
}

// The rule of issue 572, with verify_segment as the debugger names it.
const rule572 = "verify_segment(upcxx::global_ptr<int, (upcxx::memory_kind)1>, bool)>upcxx::detail::persona_tls::burst_user"

// TestUPCXX572: verify_segment, internal-level by its documentation, waits
// with future::wait while rank 1 sends rank 0 RPCs: user-level progress
// (burst_user) runs inside it and the RPCs run before the segment is
// ready. Caught under every recorder and unprivileged, with the stack a
// user reads; the fixed twin is quiet.
func TestUPCXX572(t *testing.T) {
	testenv.RequireBPF(t)
	prefix := upcxxPrefix(t)
	prog := upcxxProgram(t, prefix, filepath.Join(testenv.RepoRoot(t), "testdata", "upcxx", "progress572.cpp"), "smp", "")
	if out, _, code := upcxxRun(t, prefix, nil, prog); code != 0 || !strings.Contains(out, "rpcs 4, early 4") {
		t.Fatalf("untraced: exit %d, %q", code, out)
	}
	type run struct {
		name   string
		nobody bool
	}
	for _, r := range []run{{"ebpf", false}, {"preload", false}, {"auto", false}, {"preload", true}} {
		name := r.name
		if r.nobody {
			name += "-nobody"
		}
		t.Run(name, func(t *testing.T) {
			for _, fixed := range []bool{false, true} {
				report, read := nobodyReport(t)
				argv := []string{hooktraceBin, "run", "--recorder", r.name, "--follow-forks", "--fail-on", "none",
					"--forbid", rule572, "--report", "json:" + report, "--", prog}
				want := "rpcs 4, early 4"
				if fixed {
					argv = append(argv, "fixed")
					want = "rpcs 4, early 0"
				}
				var wrap func(argv ...string) *exec.Cmd
				if r.nobody {
					wrap = func(argv ...string) *exec.Cmd { return asNobody(t, prog, argv...) }
				}
				out, stderr, code := upcxxRun(t, prefix, wrap, argv...)
				if code != 0 || !strings.Contains(out, want) {
					t.Fatalf("fixed=%v: exit %d, stdout %q, want %q\n%s", fixed, code, out, want, stderr)
				}
				nest := nestingsOf(upcxxFindings(t, read()))
				if fixed {
					if len(nest) != 0 {
						t.Errorf("fixed: want no finding, got %v", nest)
					}
					continue
				}
				if len(nest) != 1 {
					t.Fatalf("want 1 forbidden-nesting finding, got %v\n%s", nest, stderr)
				}
				f := nest[0]
				if !stackMatches(f.finding, 0, "upcxx::detail::persona_tls::burst_user", "upcxx::progress",
					"upcxx::detail::future_wait_upcxx_progress_user::operator()", "verify_segment", "main") {
					t.Errorf("stack where burst_user ran:\n%v", f.finding)
				}
				// Only rank 0 runs verify_segment.
				if len(f.Seen) != 1 || f.Seen[0].Count != f.Occurrences || f.Occurrences < 1 {
					t.Errorf("seen %+v, %d occurrences: want all in one process", f.Seen, f.Occurrences)
				}
			}
		})
	}
}

// upcxxVariant copies the installed UPC++ headers for network and seeds a progress-level violation in them: rput, whose progress level
// is internal (spec §8.2.1), makes user-level progress, the progress
// future::wait makes. It returns the include directory.
func upcxxVariant(t *testing.T, prefix, network string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "include")
	src := filepath.Join(prefix, "upcxx.debug.gasnet_seq."+network, "include")
	if out, err := exec.Command("cp", "-r", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("copying the headers: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "upcxx", "rput.hpp")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// In both of rput's overloads (by value, and from a buffer).
	const at = "traits_t::template assert_sane<T>();\n"
	if n := bytes.Count(b, []byte(at)); n != 2 {
		t.Fatalf("%s: %d places to seed the violation at, want rput's 2", path, n)
	}
	b = bytes.ReplaceAll(b, []byte(at), []byte(at+"    upcxx::progress(upcxx::progress_level::user); // seeded violation\n"))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestUPCXXRulesPack: UPC++'s own tests run unharmed (output and exit
// status) and quiet under --rules upcxx, where user-level progress is
// probed; a runtime variant whose rput makes user-level progress is
// caught in both ranks, each listed with its count.
func TestUPCXXRulesPack(t *testing.T) {
	testenv.RequireBPF(t)
	prefix := upcxxPrefix(t)
	const notProbed = "upcxx::detail::persona_tls::burst_user is not a function"
	traced := func(t *testing.T, rec, prog string) (string, []upcxxFinding, string, int) {
		report := filepath.Join(t.TempDir(), "report.json")
		out, stderr, code := upcxxRun(t, prefix, nil, hooktraceBin, "run", "--recorder", rec, "--follow-forks",
			"--fail-on", "none", "--rules", "upcxx", "--report", "json:"+report, "--", prog)
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatalf("no report (exit %d): %v\n%s", code, err, stderr)
		}
		if strings.Contains(stderr, notProbed) {
			t.Errorf("user-level progress was not probed:\n%s", stderr)
		}
		return out, upcxxFindings(t, string(b)), stderr, code
	}
	for _, c := range []struct {
		name string
		recs []string
	}{
		{"rpc_ff_ring", []string{"preload", "ebpf"}},
		{"rput", []string{"preload"}},
		{"atomics", []string{"preload"}},
		{"dist_object", []string{"preload"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			prog := upcxxProgram(t, prefix, filepath.Join(prefix, "test", c.name+".cpp"), "smp", "")
			want, _, wantCode := upcxxRun(t, prefix, nil, prog)
			if !strings.Contains(want, "Test result: SUCCESS") {
				t.Fatalf("untraced: exit %d\n%s", wantCode, want)
			}
			for _, rec := range c.recs {
				out, fs, stderr, code := traced(t, rec, prog)
				if code != wantCode || !strings.Contains(out, "Test result: SUCCESS") {
					t.Errorf("%s: exit %d (untraced %d), output:\n%s\n%s", rec, code, wantCode, out, stderr)
				}
				if n := nestingsOf(fs); len(n) != 0 {
					t.Errorf("%s: the runtime broke no progress level, yet: %v", rec, n)
				}
			}
		})
	}
	// An opt build inlines user-level progress (burst_user) into
	// upcxx::progress: the pack says so and checks upcxx::progress
	// entered with progress_level::user instead. A rule on that call
	// catches the 572 shape in the opt build under both recorders, with
	// the stack a user reads, and the fixed twin, which makes
	// internal-level progress (level 0) with the same function, is quiet.
	t.Run("opt", func(t *testing.T) {
		prog := upcxxBuild(t, prefix, filepath.Join(testenv.RepoRoot(t), "testdata", "upcxx", "progress572.cpp"), "opt", "smp", "")
		for _, rec := range []string{"preload", "ebpf"} {
			for _, fixed := range []bool{false, true} {
				report := filepath.Join(t.TempDir(), "report.json")
				argv := []string{hooktraceBin, "run", "--recorder", rec, "--follow-forks", "--fail-on", "none", "--rules", "upcxx",
					"--forbid", "verify_segment > upcxx::progress if arg0 == 1", "--report", "json:" + report, "--", prog}
				want := "rpcs 4, early 4"
				if fixed {
					argv, want = append(argv, "fixed"), "rpcs 4, early 0"
				}
				out, stderr, code := upcxxRun(t, prefix, nil, argv...)
				if code != 0 || !strings.Contains(out, want) {
					t.Fatalf("%s fixed=%v: exit %d, stdout %q, want %q\n%s", rec, fixed, code, out, want, stderr)
				}
				if !strings.Contains(stderr, notProbed) || !strings.Contains(stderr, "opt codemode inlines") ||
					!strings.Contains(stderr, "checked on upcxx::progress entered with progress_level::user instead") {
					t.Errorf("%s: stderr does not say how the progress-level rules are checked, and why:\n%s", rec, stderr)
				}
				b, err := os.ReadFile(report)
				if err != nil {
					t.Fatal(err)
				}
				nest := nestingsOf(upcxxFindings(t, string(b)))
				if fixed {
					if len(nest) != 0 {
						t.Errorf("%s fixed: internal-level progress reported: %v", rec, nest)
					}
					continue
				}
				if len(nest) != 1 || nest[0].Title != "forbidden nesting: upcxx::progress if arg0 == 1 ran inside verify_segment" {
					t.Fatalf("%s: want user-level progress inside verify_segment, got %v\n%s", rec, nest, stderr)
				}
				if f := nest[0]; !stackMatches(f.finding, 0, "upcxx::progress", "verify_segment") ||
					len(f.Seen) != 1 || f.Seen[0].Count != f.Occurrences {
					t.Errorf("%s: stack or processes:\n%v\n%+v", rec, f.finding, f.Seen)
				}
			}
		}
	})
	t.Run("seeded", func(t *testing.T) {
		prog := upcxxProgram(t, prefix, filepath.Join(prefix, "test", "rput.cpp"), "smp", upcxxVariant(t, prefix, "smp"))
		for _, rec := range []string{"preload", "ebpf"} {
			out, fs, stderr, code := traced(t, rec, prog)
			if code != 0 || !strings.Contains(out, "Test result: SUCCESS") {
				t.Errorf("%s: exit %d, output:\n%s\n%s", rec, code, out, stderr)
			}
			nest := nestingsOf(fs)
			if len(nest) != 1 || nest[0].Title != "forbidden nesting: upcxx::detail::persona_tls::burst_user ran inside upcxx::rput" {
				t.Fatalf("%s: want burst_user inside upcxx::rput, got %v", rec, nest)
			}
			f := nest[0]
			if !stackMatches(f.finding, 0, "upcxx::detail::persona_tls::burst_user", "upcxx::progress", "upcxx::rput", "main") {
				t.Errorf("%s: stack:\n%v", rec, f.finding)
			}
			// Both ranks call rput: both processes, with their counts.
			total := 0
			for _, sn := range f.Seen {
				total += sn.Count
				if sn.Count == 0 || len(sn.Threads) == 0 {
					t.Errorf("%s: seen %+v", rec, sn)
				}
			}
			if len(f.Seen) != 2 || total != f.Occurrences || f.Merged != "merged from 2 ranks" {
				t.Errorf("%s: seen %+v, merged %q, %d occurrences: want both ranks", rec, f.Seen, f.Merged, f.Occurrences)
			}
			// Rank 0 is the process upcxx-run started, which forked rank 1.
			for i, sn := range f.Seen {
				if sn.Rank == nil || *sn.Rank != i {
					t.Errorf("%s: process %d is rank %v, want %d", rec, sn.PID, sn.Rank, i)
				}
			}
		}
	})
}

// TestUPCXXUDP: on the udp conduit the ranks are separate processes, each
// traced by its own hooktrace into its own trace; analyzed together, the
// seeded violation is one finding seen in both, each process named with
// its trace and count.
func TestUPCXXUDP(t *testing.T) {
	prefix := upcxxPrefix(t)
	prog := upcxxProgram(t, prefix, filepath.Join(prefix, "test", "rput.cpp"), "udp", upcxxVariant(t, prefix, "udp"))
	dir := t.TempDir()
	out, stderr, code := upcxxRun(t, prefix, nil, "-localhost", hooktraceBin, "run", "--recorder", "preload", "--fail-on", "none",
		"--rules", "upcxx", "-o", filepath.Join(dir, "t-%p.htr"), "--", prog)
	if code != 0 || !strings.Contains(out, "Test result: SUCCESS") {
		t.Fatalf("exit %d, output:\n%s\n%s", code, out, stderr)
	}
	traces, _ := filepath.Glob(filepath.Join(dir, "t-*.htr"))
	if len(traces) != 2 {
		t.Fatalf("traces %v, want one per rank", traces)
	}
	report, stderr, _ := hooktrace(t, nil, append([]string{"analyze", "--format", "json", "--fail-on", "none"}, traces...)...)
	nest := nestingsOf(upcxxFindings(t, report))
	if len(nest) != 1 || !strings.HasSuffix(nest[0].Title, "ran inside upcxx::rput") {
		t.Fatalf("want burst_user inside upcxx::rput, got %v\n%s", nest, stderr)
	}
	f := nest[0]
	total := 0
	for _, sn := range f.Seen {
		total += sn.Count
	}
	if len(f.Seen) != 2 || f.Seen[0].PID == f.Seen[1].PID || total != f.Occurrences || f.Merged != "merged from 2 processes in 2 traces" {
		t.Errorf("seen %+v, merged %q, %d occurrences: want both processes", f.Seen, f.Merged, f.Occurrences)
	}
}
