//go:build linux && amd64

// Package bench measures what tracing costs a workload that allocates
// under locks (testdata/workload.c): untraced, under `hooktrace run` with
// each recorder and mode, at the floor of the eBPF path (hooktrace's probe
// sites attached to a BPF program that only counts), as a -fsanitize=thread
// build, and under Helgrind. The workload times its own phase and counts
// its own calls; `make bench` runs it and prints a Markdown table.
package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Kind is how a configuration runs the workload.
type Kind int

const (
	// Direct runs the workload's executable, under Wrap when set.
	Direct Kind = iota
	// Hooktrace runs it under `hooktrace run`.
	Hooktrace
	// Floor runs it behind hooktrace's gate with floor.c's counting-only
	// program at hooktrace's probe sites.
	Floor
	// Attach starts it held before its phase and runs `hooktrace attach`
	// on it; the phase starts once recording is on.
	Attach
)

// Config is one way of running the workload. The list in Configs is the
// whole of what the bench knows about each: a new recorder or tool is one
// entry there.
type Config struct {
	Key  string // what HOOKTRACE_BENCH_CONFIGS names it by
	Name string // for the table
	Kind Kind
	// TSan: the workload built with -fsanitize=thread (Direct).
	TSan bool
	// Wrap is a command the workload runs under (Direct), such as
	// valgrind; the configuration is unavailable when Wrap[0] is not
	// installed.
	Wrap []string
	// Recorder is `hooktrace run --recorder`'s value (Hooktrace), or
	// attach's (Attach). A
	// binary without the flag records with eBPF, so "ebpf" then runs
	// without it, and any other recorder is unavailable.
	Recorder string
	// Args are more `hooktrace run` flags (Hooktrace).
	Args []string
	// AtEntry puts the floor's probes at the functions' first
	// instructions, where a naive uprobe tracer puts them (Floor).
	AtEntry bool
	// Default: run when HOOKTRACE_BENCH_CONFIGS is empty.
	Default bool
}

// Configs are every configuration, in the order they run in a round and
// appear in the table.
func Configs() []Config {
	return []Config{
		{Key: "untraced", Name: "untraced", Kind: Direct, Default: true},
		{Key: "aggregate", Name: "hooktrace eBPF, aggregate (default mode)", Kind: Hooktrace, Recorder: "ebpf",
			Args: []string{"--mode", "aggregate"}, Default: true},
		{Key: "full", Name: "hooktrace eBPF, full", Kind: Hooktrace, Recorder: "ebpf",
			Args: []string{"--mode", "full"}, Default: true},
		// The user-space recorder; a binary under test without
		// `--recorder preload` gets a row that says so.
		{Key: "preload", Name: "hooktrace preload recorder, aggregate", Kind: Hooktrace, Recorder: "preload",
			Args: []string{"--mode", "aggregate"}, Default: true},
		{Key: "preload-full", Name: "hooktrace preload recorder, full", Kind: Hooktrace, Recorder: "preload",
			Args: []string{"--mode", "full"}},
		// attach to the running workload before its phase: the preload
		// recorder injected through ptrace, and eBPF probes.
		{Key: "attach-preload", Name: "hooktrace attach, preload recorder injected, aggregate", Kind: Attach, Recorder: "preload",
			Args: []string{"--mode", "aggregate"}, Default: true},
		{Key: "attach-ebpf", Name: "hooktrace attach, eBPF, aggregate", Kind: Attach, Recorder: "ebpf",
			Args: []string{"--mode", "aggregate"}, Default: true},
		{Key: "floor", Name: "floor: counting uprobes at hooktrace's sites", Kind: Floor, Default: true},
		{Key: "entry", Name: "floor at the functions' entries", Kind: Floor, AtEntry: true},
		{Key: "tsan", Name: "TSan (-fsanitize=thread build)", Kind: Direct, TSan: true, Default: true},
		{Key: "helgrind", Name: "Helgrind (valgrind --tool=helgrind)", Kind: Direct,
			Wrap: []string{"valgrind", "--tool=helgrind", "-q"}, Default: true},
	}
}

// Select picks the configurations a comma- or space-separated list names,
// in Configs' order, with untraced always first; the defaults when the
// list is empty.
func Select(list string) ([]Config, error) {
	want := map[string]bool{"untraced": true}
	names := strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' })
	for _, k := range names {
		want[k] = true
	}
	var known []string
	var cfgs []Config
	for _, c := range Configs() {
		known = append(known, c.Key)
		if (len(names) == 0 && c.Default) || want[c.Key] {
			cfgs = append(cfgs, c)
		}
		delete(want, c.Key)
	}
	for k := range want {
		return nil, fmt.Errorf("unknown configuration %q (known: %s)", k, strings.Join(known, ", "))
	}
	return cfgs, nil
}

// Counts are calls by name, as hooktrace's stats.calls spells them.
type Counts map[string]uint64

// Checked are the calls whose counts are compared with the workload's
// own: its API calls, and the mmap and munmap of each mapped block.
var Checked = []string{"pthread_mutex_lock", "pthread_mutex_unlock", "malloc", "free", "mmap", "munmap"}

// Own is what the workload reports of its phase.
type Own struct {
	Phase time.Duration // wall time
	CPU   time.Duration // the process's user + system time in the phase
	Calls Counts        // the Checked calls
}

// ParseOwn reads the workload's line:
// "phase_ns=N cpu_ns=N pthread_mutex_lock=N ... big=N". Each mapped block is one
// mmap and one munmap.
func ParseOwn(line string) (Own, error) {
	own := Own{Calls: Counts{}}
	seen := map[string]bool{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if !ok || err != nil {
			return Own{}, fmt.Errorf("reading the workload's counts %q: bad field %q", line, f)
		}
		seen[k] = true
		switch k {
		case "phase_ns":
			own.Phase = time.Duration(n)
		case "cpu_ns":
			own.CPU = time.Duration(n)
		case "big":
			own.Calls["mmap"], own.Calls["munmap"] = n, n
		default:
			own.Calls[k] = n
		}
	}
	for _, k := range []string{"phase_ns", "cpu_ns", "pthread_mutex_lock", "pthread_mutex_unlock", "malloc", "free", "big"} {
		if !seen[k] {
			return Own{}, fmt.Errorf("reading the workload's counts %q: no %s", line, k)
		}
	}
	return own, nil
}

// Result is one run of one configuration.
type Result struct {
	Round int
	// The phase's wall and CPU time, as the workload measured them.
	Phase, CPU time.Duration
	Own        Counts // the workload's own counts of its phase
	// Traced are the tracer's counts of the whole run (hooktrace's
	// stats.calls); for the floor, "hits" is its counter.
	Traced Counts
	Lost   uint64
	// Complete is the report's verdict (hooktrace only).
	Complete bool
	// Probe is the entry probes' BPF program's runs and time (hooktrace's
	// uprobe_hook, the floor's counter) when the kernel counted them.
	Probe ProbeTime
}

// ProbeTime is a BPF program's runs and their time.
type ProbeTime struct {
	Runs uint64
	Time time.Duration
}

// PerRun is the time a run, 0 when none was counted.
func (p ProbeTime) PerRun() time.Duration {
	if p.Runs == 0 {
		return 0
	}
	return p.Time / time.Duration(p.Runs)
}

// Runner runs the workload under the configurations.
type Runner struct {
	Plain, TSan string // the workload's executables
	Hooktrace   string // the hooktrace binary under test
	Dir         string // for outputs
	Warn        func(string)
	recorders   *bool // whether Hooktrace has --recorder, once asked
}

// Available says why cfg cannot run here, or "".
func (r *Runner) Available(cfg Config) string {
	switch {
	case cfg.TSan && r.TSan == "":
		return "no -fsanitize=thread build (gcc with libtsan)"
	case len(cfg.Wrap) > 0:
		if _, err := exec.LookPath(cfg.Wrap[0]); err != nil {
			return cfg.Wrap[0] + " is not installed"
		}
	case cfg.Kind == Hooktrace && cfg.Recorder != "ebpf" && !r.hasRecorders():
		return fmt.Sprintf("this hooktrace has no --recorder flag, so no %s recorder", cfg.Recorder)
	case cfg.Kind == Attach && !r.attachHasRecorders():
		return "this hooktrace's attach has no --recorder flag"
	}
	return ""
}

// attachHasRecorders asks the binary under test whether `attach` takes
// --recorder.
func (r *Runner) attachHasRecorders() bool {
	out, _ := exec.Command(r.Hooktrace, "attach", "--help").CombinedOutput()
	return bytes.Contains(out, []byte("--recorder"))
}

// hasRecorders asks the binary under test whether `run` takes --recorder.
func (r *Runner) hasRecorders() bool {
	if r.recorders == nil {
		out, _ := exec.Command(r.Hooktrace, "run", "--help").CombinedOutput()
		has := bytes.Contains(out, []byte("--recorder"))
		r.recorders = &has
	}
	return *r.recorders
}

// Run runs the workload once under cfg with argv's arguments (ITERS
// THREADS MUTEXES); the workload writes its counts to a file.
func (r *Runner) Run(cfg Config, round int, args []string) (Result, error) {
	res := Result{Round: round}
	dir, err := os.MkdirTemp(r.Dir, cfg.Key+"-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ownFile := filepath.Join(dir, "own.txt")
	prog := r.Plain
	if cfg.TSan {
		prog = r.TSan
	}
	argv := append(append([]string{prog}, args...), ownFile)
	var stderr bytes.Buffer
	switch cfg.Kind {
	case Direct:
		argv = append(append([]string(nil), cfg.Wrap...), argv...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			return res, fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, tail(stderr.String()))
		}
	case Hooktrace:
		report := filepath.Join(dir, "report.json")
		run := []string{"run"}
		if r.hasRecorders() {
			run = append(run, "--recorder", cfg.Recorder)
		}
		run = append(run, cfg.Args...)
		run = append(run, "--fail-on", "none", "-o", filepath.Join(dir, "trace.htr"), "--report", "json:"+report, "--")
		cmd := exec.Command(r.Hooktrace, append(run, argv...)...)
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			return res, fmt.Errorf("hooktrace %s: %w\n%s", strings.Join(run, " "), err, tail(stderr.String()))
		}
		if res.Traced, res.Lost, res.Complete, res.Probe, err = readReport(report); err != nil {
			return res, err
		}
	case Attach:
		report := filepath.Join(dir, "report.json")
		if err := r.runAttached(cfg, dir, report, argv); err != nil {
			return res, err
		}
		if res.Traced, res.Lost, res.Complete, res.Probe, err = readReport(report); err != nil {
			return res, err
		}
	case Floor:
		hits, probe, err := runFloor(argv, cfg.AtEntry, r.Warn)
		if err != nil {
			return res, err
		}
		res.Traced = Counts{"hits": hits}
		res.Probe = probe
	}
	b, err := os.ReadFile(ownFile)
	if err != nil {
		return res, fmt.Errorf("reading the workload's counts: %w", err)
	}
	own, err := ParseOwn(strings.TrimSpace(string(b)))
	if err != nil {
		return res, err
	}
	res.Phase, res.CPU, res.Own = own.Phase, own.CPU, own.Calls
	return res, nil
}

// runAttached starts argv held before its phase, attaches hooktrace to
// it, lets the phase run once recording is on, and waits for both: attach
// ends at the workload's exit, with its report written.
func (r *Runner) runAttached(cfg Config, dir, report string, argv []string) error {
	work := exec.Command(argv[0], argv[1:]...)
	work.Env = append(os.Environ(), "WORKLOAD_HOLD=1")
	hold, err := work.StdinPipe()
	if err != nil {
		return err
	}
	var workOut bytes.Buffer
	work.Stdout, work.Stderr = &workOut, &workOut
	if err := work.Start(); err != nil {
		return err
	}
	defer hold.Close()
	worked := make(chan error, 1)
	go func() { worked <- work.Wait() }()
	ready := filepath.Join(dir, "ready")
	args := []string{"attach", "--pid", strconv.Itoa(work.Process.Pid), "--recorder", cfg.Recorder}
	args = append(args, cfg.Args...)
	args = append(args, "--hang-timeout", "0", "--ready-file", ready, "--fail-on", "none",
		"-o", filepath.Join(dir, "trace.htr"), "--report", "json:"+report)
	var stderr bytes.Buffer
	ht := exec.Command(r.Hooktrace, args...)
	ht.Stdout, ht.Stderr = &stderr, &stderr
	if err := ht.Start(); err != nil {
		work.Process.Kill()
		return err
	}
	attached := make(chan error, 1)
	go func() { attached <- ht.Wait() }()
	fail := func(err error) error {
		work.Process.Kill()
		ht.Process.Kill()
		<-worked
		<-attached
		return fmt.Errorf("hooktrace %s: %w\n%s", strings.Join(args, " "), err, tail(stderr.String()))
	}
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-attached:
			attached <- err
			return fail(fmt.Errorf("ended before it was ready: %v", err))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := hold.Write([]byte("\n")); err != nil {
		return fail(err)
	}
	if err := <-worked; err != nil {
		worked <- err
		return fail(fmt.Errorf("the workload: %w\n%s", err, tail(workOut.String())))
	}
	worked <- nil
	if err := <-attached; err != nil {
		attached <- err
		return fail(err)
	}
	return nil
}

// tail is the end of a command's output, for an error message.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// readReport takes the counts and losses out of a JSON report.
func readReport(path string) (Counts, uint64, bool, ProbeTime, error) {
	var probe ProbeTime
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, false, probe, fmt.Errorf("reading hooktrace's report: %w", err)
	}
	var doc struct {
		Stats struct {
			LostEvents *uint64 `json:"lost_events"`
			Complete   *bool   `json:"complete"`
			Calls      Counts  `json:"calls"`
			Traces     []struct {
				ProbeTime map[string]struct {
					Runs uint64 `json:"runs"`
					NS   uint64 `json:"ns"`
				} `json:"probe_time"`
			} `json:"traces"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, 0, false, probe, fmt.Errorf("reading hooktrace's report %s: %w", path, err)
	}
	st := doc.Stats
	if st.LostEvents == nil || st.Complete == nil || st.Calls == nil {
		return nil, 0, false, probe, errors.New("reading hooktrace's report: no stats.calls, lost_events or complete")
	}
	for _, t := range st.Traces {
		pt := t.ProbeTime["uprobe_hook"]
		probe.Runs += pt.Runs
		probe.Time += time.Duration(pt.NS)
	}
	return st.Calls, *st.LostEvents, *st.Complete, probe, nil
}

// Mismatch compares what a tracer counted in a run, less what it counted
// in a run with no iterations (start-up, threads, the output), with the
// workload's own counts. It returns "" when they are equal. The floor has
// one counter for all its probes, "hits": it must equal the sum of the
// workload's uprobe-traced calls (all of Checked but the syscalls).
//
// The calls are exact. mmap and munmap may differ by slack either way:
// glibc maps each thread's arena with one or two mmap and munmap calls,
// depending on where the kernel put the first try (untraced, under
// strace, an empty run makes 2 or 4 munmap calls), so pass the number of
// threads.
func Mismatch(traced, empty, own Counts, slack uint64) string {
	var diffs []string
	if hits, ok := traced["hits"]; ok {
		var want uint64
		for _, k := range Checked {
			if !isSyscall(k) {
				want += own[k]
			}
		}
		if got := hits - empty["hits"]; got != want {
			diffs = append(diffs, fmt.Sprintf("hits %d, want %d", got, want))
		}
		return strings.Join(diffs, ", ")
	}
	for _, k := range Checked {
		got := int64(traced[k]) - int64(empty[k])
		want := int64(own[k])
		switch {
		case !isSyscall(k) && got != want:
			diffs = append(diffs, fmt.Sprintf("%s %d, want %d", k, got, want))
		case isSyscall(k) && (got < want-int64(slack) || got > want+int64(slack)):
			diffs = append(diffs, fmt.Sprintf("%s %d, want %d±%d", k, got, want, slack))
		}
	}
	return strings.Join(diffs, ", ")
}

func isSyscall(call string) bool { return call == "mmap" || call == "munmap" }
