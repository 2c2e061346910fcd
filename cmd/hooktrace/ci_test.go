package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// The CI-gate tests run the real binary on the committed fixture traces
// (reports/testdata): no eBPF needed, except for the parallel launch.

var (
	fixtureSeed    = filepath.Join("..", "..", "reports", "testdata", "seed.htr")
	fixtureRegress = filepath.Join("..", "..", "reports", "testdata", "regress.htr")
)

// baselineFile writes the JSON report of a trace, as a main-branch job
// would keep it.
func baselineFile(t *testing.T, trace string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "baseline.json")
	stdout, stderr, code := hooktrace(t, nil, "analyze", "--format", "json", "--fail-on", "none", trace)
	if code != 0 {
		t.Fatalf("analyze %s: exit %d\n%s", trace, code, stderr)
	}
	if err := os.WriteFile(out, []byte(stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGateExitCodes: with a baseline only new findings at or above
// --fail-on fail, in both directions; suppressions turn a failure into a
// pass and unused ones are reported; bad input is a usage error.
func TestGateExitCodes(t *testing.T) {
	seedJSON, regressJSON := baselineFile(t, fixtureSeed), baselineFile(t, fixtureRegress)
	inversion := regressReportID(t, regressJSON, "lock order inversion")
	cases := []struct {
		name string
		args []string
		code int
		says string // in stdout+stderr
	}{
		{"no baseline: old errors fail", []string{"analyze", fixtureRegress}, exitFindings, "FINDINGS"},
		{"new inversion fails", []string{"analyze", "--baseline", seedJSON, fixtureRegress}, exitFindings, "NEW, FAILS"},
		{"fixed listed", []string{"analyze", "--baseline", seedJSON, fixtureRegress}, exitFindings, "1 new, 2 still present, 1 fixed"},
		{"nothing new", []string{"analyze", "--baseline", regressJSON, fixtureRegress}, exitOK, "0 new, 3 still present, 0 fixed"},
		{"backward: new warning passes at error", []string{"analyze", "--baseline", regressJSON, fixtureSeed}, exitOK, "1 new, 2 still present, 1 fixed"},
		{"backward: new warning fails at warning", []string{"analyze", "--fail-on", "warning", "--baseline", regressJSON, fixtureSeed}, exitFindings, "NEW, FAILS"},
		{"fail-on none", []string{"analyze", "--fail-on", "none", fixtureRegress}, exitOK, "3 findings"},
		{"suppressed by id", []string{"analyze", "--baseline", seedJSON, "--suppress",
			writeFile(t, "s.txt", "id: "+inversion+"\nreason: tracked in issue 7\n\nlock: gone_lock\nreason: old\n"), fixtureRegress},
			exitOK, "unused suppression at"},
		{"suppressed by lock", []string{"analyze", "--baseline", seedJSON, "--suppress",
			writeFile(t, "s.txt", "lock: *pool_create*\nreason: pool locks are ordered by design\n"), fixtureRegress}, exitOK, "suppressed: 1"},
		{"suppression matches nothing", []string{"analyze", "--baseline", seedJSON, "--suppress",
			writeFile(t, "s.txt", "function: nowhere\nreason: x\n"), fixtureRegress}, exitFindings, "unused suppression"},
		{"suppression without reason", []string{"analyze", "--suppress", writeFile(t, "s.txt", "id: "+inversion+"\n"), fixtureRegress},
			exitUsage, "has no reason"},
		{"missing baseline", []string{"analyze", "--baseline", "/nonexistent.json", fixtureRegress}, exitUsage, "baseline"},
		{"bad baseline", []string{"analyze", "--baseline", writeFile(t, "b.json", "[]"), fixtureRegress}, exitUsage, "not a hooktrace JSON report"},
		{"bad format", []string{"analyze", "--format", "yaml", fixtureRegress}, exitUsage, "--format"},
		{"bad report extension", []string{"analyze", "--report", filepath.Join(t.TempDir(), "r.bin"), fixtureRegress}, exitUsage, "FORMAT:"},
		{"bad fail-on", []string{"analyze", "--fail-on", "fatal", fixtureRegress}, exitUsage, "fail-on"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr, code := hooktrace(t, nil, c.args...)
			if code != c.code || !strings.Contains(stdout+stderr, c.says) {
				t.Errorf("exit %d (want %d), output lacks %q:\n%s\n%s", code, c.code, c.says, stdout, stderr)
			}
		})
	}
}

func regressReportID(t *testing.T, reportPath, titlePrefix string) string {
	t.Helper()
	data, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Findings []struct{ ID, Title string }
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, f := range doc.Findings {
		if strings.HasPrefix(f.Title, titlePrefix) {
			return f.ID
		}
	}
	t.Fatalf("no finding %q in %s", titlePrefix, reportPath)
	return ""
}

// TestReportFiles: --report writes each file in the format its name says
// (or FORMAT: says), stdout stays clean, stderr has one summary line.
func TestReportFiles(t *testing.T) {
	dir := t.TempDir()
	seedJSON := baselineFile(t, fixtureSeed)
	files := map[string]string{
		"out.sarif": "", "summary.md": "", "junit.xml": "", "graph.dot": "", "report.html": "", "report.json": "", "report.txt": "",
	}
	args := []string{"analyze", "--baseline", seedJSON}
	for name := range files {
		args = append(args, "--report", filepath.Join(dir, name))
	}
	args = append(args, "--report", "markdown:"+filepath.Join(dir, "comment.body"), fixtureRegress)
	stdout, stderr, code := hooktrace(t, nil, args...)
	if code != exitFindings {
		t.Fatalf("exit %d, want 1 (the new inversion)\n%s", code, stderr)
	}
	if stdout != "" {
		t.Errorf("stdout is not clean with --report:\n%s", stdout)
	}
	if !strings.Contains(stderr, "3 findings, 1 failing (1 new, 2 still present, 1 fixed)") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr: %q", stderr)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	var sarif struct {
		Version string `json:"version"`
		Runs    []struct {
			Results []struct {
				BaselineState string `json:"baselineState"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(read("out.sarif")), &sarif); err != nil || sarif.Version != "2.1.0" || len(sarif.Runs[0].Results) != 3 {
		t.Errorf("SARIF: %v %+v", err, sarif)
	}
	var junit struct {
		Failures int `xml:"failures,attr"`
	}
	if err := xml.Unmarshal([]byte(read("junit.xml")), &junit); err != nil || junit.Failures != 1 {
		t.Errorf("JUnit: %v failures=%d", err, junit.Failures)
	}
	var rep struct {
		Gate struct {
			New []string `json:"new"`
		} `json:"gate"`
	}
	if err := json.Unmarshal([]byte(read("report.json")), &rep); err != nil || len(rep.Gate.New) != 1 {
		t.Errorf("JSON: %v %+v", err, rep)
	}
	for name, want := range map[string]string{
		"summary.md": "## hooktrace: 1 new problem found", "comment.body": "**FAIL**", "graph.dot": "digraph hooktrace {",
		"report.html": "<svg", "report.txt": "NEW, FAILS",
	} {
		if !strings.Contains(read(name), want) {
			t.Errorf("%s lacks %q", name, want)
		}
	}
	// --format given as well: stdout gets that report too.
	stdout, _, _ = hooktrace(t, nil, "analyze", "--format", "markdown", "--report", filepath.Join(dir, "x.sarif"), fixtureRegress)
	if !strings.HasPrefix(stdout, "## hooktrace") {
		t.Errorf("--format with --report: stdout %q", stdout)
	}
}

// TestExportPerfetto: export writes trace-event JSON with a thread track
// per named thread and the findings.
func TestExportPerfetto(t *testing.T) {
	out := filepath.Join(t.TempDir(), "timeline.json")
	_, stderr, code := hooktrace(t, nil, "export", "--format", "perfetto", "-o", out, fixtureRegress, fixtureSeed)
	if code != 0 {
		t.Fatalf("export: exit %d\n%s", code, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	procs, findings, holds := 0, 0, 0
	for _, e := range doc.TraceEvents {
		switch {
		case e.Ph == "M" && e.Name == "process_name":
			procs++
		case e.Cat == "finding":
			findings++
		case e.Ph == "X" && e.Cat == "lock":
			holds++
		}
	}
	if procs != 2 || findings == 0 || holds == 0 {
		t.Errorf("timeline: %d processes, %d finding marks, %d holds", procs, findings, holds)
	}
	if _, stderr, code := hooktrace(t, nil, "export", "--format", "ctf", "-o", out, fixtureRegress); code != exitUsage {
		t.Errorf("bad export format: exit %d %s", code, stderr)
	}
	if _, _, code := hooktrace(t, nil, "export", fixtureRegress); code != exitUsage {
		t.Errorf("export without -o: exit %d", code)
	}
}

// TestExpandPath: the %-escapes of -o and --report.
func TestExpandPath(t *testing.T) {
	h := &events.Header{PID: 4242, Host: "node07.cluster.example", StartUnix: 1_760_000_000_000_000_000}
	env := map[string]string{"PMI_RANK": "3", "SLURM_PROCID": "9"}
	getenv := func(k string) string { return env[k] }
	for _, c := range []struct{ in, want string }{
		{"trace.htr", "trace.htr"},
		{"trace-%r.htr", "trace-3.htr"},
		{"trace-%h-%p.htr", "trace-node07-4242.htr"},
		{"t-%t.htr", "t-20251009T085320Z.htr"},
		{"100%%-%r", "100%-3"},
	} {
		got, err := expandPath(c.in, h, getenv)
		if err != nil || got != c.want {
			t.Errorf("%q → %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	env = map[string]string{"OMPI_COMM_WORLD_RANK": "1", "PMI_RANK": "3"}
	if got, _ := expandPath("%r", h, getenv); got != "1" {
		t.Errorf("Open MPI's rank first: %q", got)
	}
	env = map[string]string{"SLURM_PROCID": "12"}
	if got, _ := expandPath("%r", h, getenv); got != "12" {
		t.Errorf("srun rank: %q", got)
	}
	env = map[string]string{}
	if got, _ := expandPath("%r", h, getenv); got != "0" {
		t.Errorf("no rank: %q", got)
	}
	// upcxx-run on the smp conduit: the process it starts is rank 0.
	env = map[string]string{"GASNET_PSHM_NODES": "2"}
	if got, _ := expandPath("%r", h, getenv); got != "0" {
		t.Errorf("GASNet smp: %q", got)
	}
	for _, bad := range []string{"trace-%q.htr", "trace-%"} {
		if _, err := expandPath(bad, h, getenv); err == nil || !isUsage(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestMPIRun runs a real MPI program under Open MPI's mpirun, each rank
// traced by its own hooktrace writing trace-%r.htr, then analyzes the
// traces merged: one finding, seen in both ranks.
func TestMPIRun(t *testing.T) {
	testenv.RequireBPF(t)
	mpirun := testenv.Tool(t, "apt-get install -y openmpi-bin libopenmpi-dev", "mpirun")
	prog := testenv.C{Compiler: "mpicc", Source: filepath.Join("testdata", "mpi_ranks.c")}.Build(t)
	dir := t.TempDir()
	cmd := exec.Command(mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "2",
		hooktraceBin, "run", "--fail-on", "none", "--report", "rank-%r.md", "-o", "trace-%r.htr", "--", prog)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
	for _, r := range []string{"0", "1"} {
		if !strings.Contains(string(out), "token 42") {
			t.Errorf("the MPI program did not pass its token:\n%s", out)
		}
		for _, f := range []string{"trace-" + r + ".htr", "rank-" + r + ".md"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("rank %s: %v\n%s", r, err, out)
			}
		}
	}
	traces, _ := filepath.Glob(filepath.Join(dir, "trace-*.htr"))
	stdout, stderr, code := hooktrace(t, nil, append([]string{"analyze", "--format", "json"}, traces...)...)
	if code != exitFindings {
		t.Fatalf("analyze of the merged ranks: exit %d, want 1\n%s", code, stderr)
	}
	var rep struct {
		Stats struct {
			Traces []struct {
				Source   string `json:"source"`
				Complete bool   `json:"complete"`
			} `json:"traces"`
		} `json:"stats"`
		Findings []struct {
			Title       string `json:"title"`
			Occurrences int    `json:"occurrences"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Stats.Traces) != 2 || !rep.Stats.Traces[0].Complete || !rep.Stats.Traces[1].Complete {
		t.Errorf("traces %+v", rep.Stats.Traces)
	}
	found := false
	for _, f := range rep.Findings {
		if strings.Contains(f.Title, "table_lock") && strings.Contains(f.Title, "queue_lock") {
			found = true
			if f.Occurrences != 2 {
				t.Errorf("the inversion was seen %d times, want once per rank", f.Occurrences)
			}
		}
	}
	if !found {
		t.Errorf("no table_lock/queue_lock inversion in %+v", rep.Findings)
	}
}
