package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// These tests trace real C programs with real probes and check the findings
// a user would read: kind, severity, lock names, and the functions on each
// edge's stack.

type finding struct {
	ID       string   `json:"id"`
	Kind     string   `json:"kind"`
	Severity string   `json:"severity"`
	Title    string   `json:"title"`
	Locks    []string `json:"locks"`
	Gate     string   `json:"gate"`
	Edges    []struct {
		From   string `json:"from"`
		To     string `json:"to"`
		Thread uint32 `json:"thread"`
		Stack  []struct {
			Function string `json:"function"`
			File     string `json:"file"`
			Line     int    `json:"line"`
		} `json:"stack"`
	} `json:"edges"`
}

func findings(t *testing.T, stdout string) []finding {
	t.Helper()
	var r struct {
		Findings []finding `json:"findings"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, stdout)
	}
	return r.Findings
}

// traceFindings runs prog under hooktrace and returns its findings. Unless
// extra names a mode, it runs in both modes, which must agree: the
// aggregate mode's chain cache may hide repeats, never a finding.
func traceFindings(t *testing.T, extra []string, prog string, args ...string) []finding {
	t.Helper()
	if !slices.Contains(extra, "--mode") {
		full := traceFindingsOnce(t, append(slices.Clone(extra), "--mode", "full"), prog, args...)
		agg := traceFindingsOnce(t, append(slices.Clone(extra), "--mode", "aggregate"), prog, args...)
		if a, b := findingIDs(full), findingIDs(agg); a != b {
			t.Errorf("%s %v: full and aggregate modes disagree:\nfull:      %s\naggregate: %s", prog, args, a, b)
		}
		return agg
	}
	return traceFindingsOnce(t, extra, prog, args...)
}

func traceFindingsOnce(t *testing.T, extra []string, prog string, args ...string) []finding {
	t.Helper()
	argv := append([]string{"--fail-on", "none"}, extra...)
	argv = append(append(argv, "--", prog), args...)
	report, _, stderr, code := runJSON(t, argv...)
	if code != 0 {
		t.Fatalf("hooktrace exit %d\n%s", code, stderr)
	}
	noTraceChecks(t, fmt.Sprint(prog, args), parseReport(t, report))
	return findings(t, report)
}

func ofKind(fs []finding, kind, severity string) []finding {
	var out []finding
	for _, f := range fs {
		if f.Kind == kind && f.Severity == severity {
			out = append(out, f)
		}
	}
	return out
}

func (f finding) edgeStackHas(i int, fns ...string) bool {
	if i >= len(f.Edges) {
		return false
	}
	have := map[string]bool{}
	for _, fr := range f.Edges[i].Stack {
		have[fr.Function] = true
	}
	for _, fn := range fns {
		if !have[fn] {
			return false
		}
	}
	return true
}

func (f finding) String() string {
	b, _ := json.MarshalIndent(f, "", "  ")
	return string(b)
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		seen[s]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// TestInversionAcrossThreads: a→b on one thread, b→a on another, run one
// after the other (nothing hangs): one lock-order-cycle error naming both
// locks, with the function that took each pair on its edge. Its twin takes
// the locks in one order everywhere and gets no finding.
func TestInversionAcrossThreads(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "inversion")
	fs := ofKind(traceFindings(t, nil, prog), "lock-order-cycle", "error")
	if len(fs) != 1 {
		t.Fatalf("want 1 lock-order-cycle error, got %d: %v", len(fs), fs)
	}
	f := fs[0]
	if !sameSet(f.Locks, []string{"lock_a (inversion)", "lock_b (inversion)"}) {
		t.Errorf("locks %q", f.Locks)
	}
	var sawAB, sawBA bool
	for i := range f.Edges {
		sawAB = sawAB || f.edgeStackHas(i, "take_a_then_b")
		sawBA = sawBA || f.edgeStackHas(i, "take_b_then_a")
	}
	if !sawAB || !sawBA {
		t.Errorf("edge stacks lack take_a_then_b / take_b_then_a:\n%v", f)
	}
	if len(f.Edges) == 2 && f.Edges[0].Thread == f.Edges[1].Thread {
		t.Errorf("both edges on thread %d", f.Edges[0].Thread)
	}
	if fs := ofKind(traceFindings(t, nil, prog, "consistent"), "lock-order-cycle", "error"); len(fs) != 0 {
		t.Errorf("consistent order: want no cycle, got %v", fs)
	}
}

// TestThreeLockRing: a→b, b→c, c→a on three threads: one finding, three
// locks.
func TestThreeLockRing(t *testing.T) {
	testenv.RequireBPF(t)
	fs := ofKind(traceFindings(t, nil, testenv.Program(t, "ring")), "lock-order-cycle", "error")
	if len(fs) != 1 {
		t.Fatalf("want 1 cycle, got %v", fs)
	}
	if !sameSet(fs[0].Locks, []string{"ring_a (ring)", "ring_b (ring)", "ring_c (ring)"}) || len(fs[0].Edges) != 3 {
		t.Errorf("want the three ring locks on three edges:\n%v", fs[0])
	}
	for i := range fs[0].Edges {
		if !fs[0].edgeStackHas(i, "nest") {
			t.Errorf("edge %d stack lacks nest:\n%v", i, fs[0])
		}
	}
}

// TestOpenMPIMadviseHook: the seed bug. A hook patched into libc's madvise
// takes reg_lock; one thread calls malloc holding reg_lock, another frees
// memory so that glibc trims its arena's heap, calling madvise with the
// arena lock held. The cycle reg_lock → arena → reg_lock must be an error,
// its arena edge's stack going through free and glibc's _int_free (seen
// only by unwinding glibc, which has no frame pointers) into the hook.
// The twin frees a large mmapped block instead (munmap_chunk → munmap:
// glibc holds no arena lock there) and must give no cycle, only the
// hazard of reg_lock on itself through the hook context.
func TestOpenMPIMadviseHook(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "ompi")
	fs := ofKind(traceFindings(t, nil, prog), "lock-order-cycle", "error")
	if len(fs) != 1 {
		t.Fatalf("want 1 lock-order-cycle error, got %v", fs)
	}
	f := fs[0]
	var arena string
	for _, l := range f.Locks {
		if strings.Contains(l, "arena") {
			arena = l
		}
	}
	if arena == "" || !sameSet(f.Locks, []string{"reg_lock (ompi)", arena}) {
		t.Errorf("locks %q: want reg_lock (ompi) and the glibc arena", f.Locks)
	}
	var under, hook bool
	for i := range f.Edges {
		under = under || f.edgeStackHas(i, "malloc", "register_region")
		hook = hook || f.edgeStackHas(i, "pthread_mutex_lock", "release_hook", "_int_free", "free", "churn")
	}
	if !under || !hook {
		t.Errorf("want one edge with register_region → malloc and one with churn → free → _int_free → release_hook → pthread_mutex_lock:\n%v", f)
	}
	twin := traceFindings(t, nil, prog, "munmap")
	if fs := ofKind(twin, "lock-order-cycle", "error"); len(fs) != 0 {
		t.Errorf("munmap_chunk path holds no arena lock: want no error, got %v", fs)
	}
	// But malloc can munmap too (a new arena, a new heap: the registrar's
	// first malloc is seen doing it), and register_region holds reg_lock
	// around one: the hook would then wait for its own thread.
	if fs := ofKind(twin, "self-deadlock", "error"); len(fs) != 1 || !sameSet(fs[0].Locks, []string{"reg_lock (ompi)"}) ||
		!fs[0].edgeStackHas(0, "malloc", "register_region") || !fs[0].edgeStackHas(1, "pthread_mutex_lock", "unmap_hook") {
		t.Errorf("munmap twin: want one self-deadlock hazard on reg_lock (ompi), malloc in register_region and the lock in unmap_hook, got %v", twin)
	}
}

// TestProgressLevelViolation: --forbid 'verify_segment>run_user_rpcs'
// catches user-level progress inside a function documented to make only
// internal progress, with the stack where the RPC ran; the fixed twin is
// clean.
func TestProgressLevelViolation(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "progress")
	rule := []string{"--forbid", "verify_segment>run_user_rpcs"}
	fs := ofKind(traceFindings(t, rule, prog), "forbidden-nesting", "error")
	if len(fs) != 1 {
		t.Fatalf("want 1 forbidden-nesting error, got %v", fs)
	}
	if !fs[0].edgeStackHas(0, "run_user_rpcs", "verify_segment", "main") {
		t.Errorf("stack where run_user_rpcs ran:\n%v", fs[0])
	}
	if fs := traceFindings(t, rule, prog, "fixed"); len(ofKind(fs, "forbidden-nesting", "error")) != 0 {
		t.Errorf("fixed: want no finding, got %v", fs)
	}
}

var _ = fmt.Sprint

// TestHookContext: a munmap hook takes hook_lock inside a thread's first
// malloc (glibc trims the new arena's heap with munmap, no arena lock
// held). In both modes:
//   - self: another malloc is called with hook_lock held: a self-deadlock
//     hazard (error) showing the allocator call under the lock and the
//     hook's stack through _int_new_arena;
//   - recursive: the same with hook_lock recursive: a warning;
//   - wrapper: UCX's pattern, a recursive wrapper over a pthread spinlock
//     held around a free whose munmap runs the hook (which re-enters
//     through the wrapper, calling no lock): warnings, no error;
//   - cross: cfg_lock is held around malloc, another thread takes
//     hook_lock then cfg_lock: a cycle through the hook (error);
//   - consistent: the other thread takes cfg_lock then hook_lock, the
//     order the hook implies: no error, the hook-lock info only.
func TestHookContext(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "hookctx")
	ids := map[string]string{}
	for _, mode := range []string{"aggregate", "full"} {
		t.Run(mode, func(t *testing.T) {
			extra := []string{"--recorder", "ebpf", "--mode", mode}
			self := traceFindings(t, extra, prog, "self")
			fs := ofKind(self, "self-deadlock", "error")
			if len(fs) != 1 || !sameSet(fs[0].Locks, []string{"hook_lock (hookctx)"}) || len(fs[0].Edges) != 2 ||
				!strings.Contains(fs[0].Title, "hazard") {
				t.Fatalf("self: want one self-deadlock hazard on hook_lock (hookctx), got %v", self)
			}
			if !fs[0].edgeStackHas(0, "malloc", "alloc_under", "main") {
				t.Errorf("self: edge 0 should show malloc called in alloc_under:\n%v", fs[0])
			}
			if !fs[0].edgeStackHas(1, "pthread_mutex_lock", "munmap_hook", "_int_new_arena", "malloc", "make_arena") {
				t.Errorf("self: edge 1 should show the hook under _int_new_arena in make_arena's malloc:\n%v", fs[0])
			}
			if len(ofKind(self, "hook-lock", "info")) != 0 {
				t.Errorf("self: the hook-lock info is superseded by the hazard: %v", self)
			}

			rec := traceFindings(t, extra, prog, "recursive")
			if rs := ofKind(rec, "hook-lock", "warning"); len(rs) != 1 || !sameSet(rs[0].Locks, []string{"hook_lock (hookctx)"}) ||
				len(ofKind(rec, "self-deadlock", "error")) != 0 {
				t.Errorf("recursive: want one hook-lock warning on hook_lock (hookctx) and no error, got %v", rec)
			}

			cross := traceFindings(t, extra, prog, "cross")
			cs := ofKind(cross, "lock-order-cycle", "error")
			if len(cs) != 1 || !sameSet(cs[0].Locks, []string{"hook_lock (hookctx)", "cfg_lock (hookctx)"}) ||
				!strings.Contains(cs[0].Title, "memory hook") {
				t.Fatalf("cross: want one cycle through the hook on cfg_lock and hook_lock, got %v", cross)
			}
			var direct, hook bool
			for i := range cs[0].Edges {
				direct = direct || cs[0].edgeStackHas(i, "pthread_mutex_lock", "hook_then_cfg")
				hook = hook || cs[0].edgeStackHas(i, "pthread_mutex_lock", "munmap_hook", "_int_new_arena", "malloc")
			}
			if !direct || !hook {
				t.Errorf("cross: want the edge taken in hook_then_cfg and the hook edge through _int_new_arena:\n%v", cs[0])
			}

			quiet := traceFindings(t, extra, prog, "consistent")
			for _, f := range quiet {
				if f.Severity == "error" || f.Severity == "warning" {
					t.Errorf("consistent: want no error or warning, got %v", f)
				}
			}
			if hl := ofKind(quiet, "hook-lock", "info"); len(hl) != 1 || !sameSet(hl[0].Locks, []string{"hook_lock (hookctx)"}) {
				t.Errorf("consistent: want the hook-lock info on hook_lock (hookctx), got %v", quiet)
			}
			wrap := traceFindings(t, extra, prog, "wrapper")
			ws := ofKind(wrap, "hook-lock", "warning")
			if len(ofKind(wrap, "self-deadlock", "error")) != 0 || len(ws) == 0 {
				t.Fatalf("wrapper: want hook-lock warnings and no self-deadlock error, got %v", wrap)
			}
			for _, f := range ws {
				if !sameSet(f.Locks, []string{"wrap_lock (hookctx)"}) || !strings.Contains(f.Title, "may re-enter") ||
					!f.edgeStackHas(1, "pthread_spin_lock", "rlock_lock", "munmap_hook_wrapped") {
					t.Errorf("wrapper: want the hook's re-entry of wrap_lock (hookctx) through rlock_lock:\n%v", f)
				}
			}

			ids[mode] = findingIDs(self, rec, wrap, cross, quiet)
		})
	}
	if ids["aggregate"] != ids["full"] {
		t.Errorf("the modes disagree:\naggregate %s\nfull      %s", ids["aggregate"], ids["full"])
	}
}

// findingIDs lists the findings' IDs, sorted, for comparing two runs.
func findingIDs(runs ...[]finding) string {
	var out []string
	for _, fs := range runs {
		for _, f := range fs {
			out = append(out, f.ID)
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestGuardedCycle: cache_lock and stats_lock inverted by two threads,
// both under gate_lock: a warning naming the gate, not an error. When a
// third thread takes the inverted order without the gate: an error. Both
// modes.
func TestGuardedCycle(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "gated")
	locks := []string{"cache_lock (gated)", "stats_lock (gated)"}
	ids := map[string]string{}
	for _, mode := range []string{"aggregate", "full"} {
		t.Run(mode, func(t *testing.T) {
			extra := []string{"--recorder", "ebpf", "--mode", mode}
			guarded := traceFindings(t, extra, prog)
			if errs := ofKind(guarded, "lock-order-cycle", "error"); len(errs) != 0 {
				t.Errorf("guarded: want no error, got %v", errs)
			}
			ws := ofKind(guarded, "lock-order-cycle", "warning")
			if len(ws) != 1 || !sameSet(ws[0].Locks, locks) || ws[0].Gate != "gate_lock (gated)" ||
				!strings.Contains(ws[0].Title, "guarded by gate_lock (gated)") {
				t.Fatalf("guarded: want one warning on cache_lock and stats_lock naming gate_lock (gated), got %v", guarded)
			}
			var upd, rep bool
			for i := range ws[0].Edges {
				upd = upd || ws[0].edgeStackHas(i, "pthread_mutex_lock", "update_cache")
				rep = rep || ws[0].edgeStackHas(i, "pthread_mutex_lock", "report_stats")
			}
			if !upd || !rep {
				t.Errorf("guarded: edge stacks lack update_cache / report_stats:\n%v", ws[0])
			}

			skip := traceFindings(t, extra, prog, "skip")
			es := ofKind(skip, "lock-order-cycle", "error")
			if len(es) != 1 || !sameSet(es[0].Locks, locks) || es[0].Gate != "" {
				t.Fatalf("skip: want one error on cache_lock and stats_lock with no gate, got %v", skip)
			}
			ids[mode] = findingIDs(guarded, skip)
		})
	}
	if ids["aggregate"] != ids["full"] {
		t.Errorf("the modes disagree:\naggregate %s\nfull      %s", ids["aggregate"], ids["full"])
	}
}
