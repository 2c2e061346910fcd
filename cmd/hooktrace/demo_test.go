package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// stackIndex is the position of the first frame whose function is one of
// fns, or -1.
func stackIndex(e *analyzer.Edge, fns ...string) int {
	for i, f := range e.Stack {
		for _, fn := range fns {
			if f.Function == fn {
				return i
			}
		}
	}
	return -1
}

// TestDemo runs `hooktrace demo --format json` as CI does, under each
// recorder, and checks the verdicts a reader of the README is promised:
// the legacy cache has a potential deadlock through vma_lock and glibc's
// arena lock, with the two stacks that tell the story; the fixed cache has
// no error finding. Both recorders find the same.
func TestDemo(t *testing.T) {
	testenv.RequireBPF(t)
	cache := t.TempDir()
	found := map[string]map[string][]finding{}
	for _, recorder := range recorders {
		t.Run(recorder, func(t *testing.T) {
			start := time.Now()
			stdout, stderr, code := hooktrace(t, nil, "demo", "--recorder", recorder, "--format", "json", "--cache-dir", cache)
			t.Logf("demo took %v", time.Since(start).Round(time.Millisecond))
			if code != 0 {
				t.Fatalf("demo: exit %d\n%s\n%s", code, stderr, stdout)
			}
			found[recorder] = checkDemo(t, recorder, stdout)
		})
	}
	e, p := found["ebpf"], found["preload"]
	for _, variant := range []string{"legacy", "fixed"} {
		if e != nil && p != nil && !sameFindings(e[variant], p[variant]) {
			t.Errorf("%s: the recorders disagree:\nebpf:    %v\npreload: %v", variant, e[variant], p[variant])
		}
	}
}

// checkDemo checks the demo's JSON output, recorded by recorder, and
// returns each variant's findings.
func checkDemo(t *testing.T, recorder, stdout string) map[string][]finding {
	t.Helper()
	var both map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stdout), &both); err != nil {
		t.Fatalf("demo output is not JSON: %v\n%s", err, stdout)
	}
	if len(both) != 2 || both["legacy"] == nil || both["fixed"] == nil {
		t.Fatalf("want exactly legacy and fixed reports, got keys %v", keysOf(both))
	}
	legacyRep, legacy := findingsOf(t, string(both["legacy"]))
	fixedRep, fixed := findingsOf(t, string(both["fixed"]))
	for name, rep := range map[string]jsonReport{"legacy": legacyRep, "fixed": fixedRep} {
		if !rep.Stats.Complete || rep.Stats.LostEvents != 0 {
			t.Errorf("%s: trace incomplete (%d lost events)", name, rep.Stats.LostEvents)
		}
		// Only the kernel sees glibc's own madvise and munmap (see
		// sameFindings).
		if rep.Stats.Calls["pthread_mutex_lock"] == 0 || rep.Stats.Calls["free"] == 0 ||
			(recorder == "ebpf" && (rep.Stats.Calls["madvise"] == 0 || rep.Stats.Calls["munmap"] == 0)) {
			t.Errorf("%s: calls %v: the workload's locks and memory releases were not traced", name, rep.Stats.Calls)
		}
	}

	// Legacy: the lock-order cycle, an error, through vma_lock and the arena.
	var cycle *analyzer.Finding
	for i := range legacy {
		f := &legacy[i]
		locks := strings.Join(f.Locks, "; ")
		if f.Kind == analyzer.KindLockOrderCycle && f.Severity == analyzer.SeverityError &&
			strings.Contains(locks, "vma_lock (librcache.so)") && strings.Contains(locks, "arena") {
			cycle = f
		}
	}
	if cycle == nil {
		t.Fatalf("legacy: no error lock-order-cycle through vma_lock (librcache.so) and the arena: %+v", legacy)
	}
	if len(cycle.Edges) != 2 {
		t.Fatalf("legacy cycle: want 2 edges, got %d", len(cycle.Edges))
	}
	var toArena, fromArena *analyzer.Edge
	for i := range cycle.Edges {
		e := &cycle.Edges[i]
		switch {
		case e.From == "vma_lock (librcache.so)" && strings.Contains(e.To, "arena"):
			toArena = e
		case strings.Contains(e.From, "arena") && e.To == "vma_lock (librcache.so)":
			fromArena = e
		}
	}
	if toArena == nil || fromArena == nil {
		t.Fatalf("legacy cycle edges: %+v", cycle.Edges)
	}
	// vma_lock held, the tree insert calls malloc.
	if m, ins := stackIndex(toArena, "malloc"), stackIndex(toArena, "rc_vma_tree_insert"); m < 0 || ins < 0 || m > ins {
		t.Errorf("vma_lock → arena: want malloc called from rc_vma_tree_insert:%s", edgeStackText(toArena))
	}
	// free, glibc's trim under the arena lock, the patched madvise's hook,
	// the lock: innermost first.
	order := []int{
		stackIndex(fromArena, "pthread_mutex_lock"),
		stackIndex(fromArena, "rc_mem_cb"),
		stackIndex(fromArena, "rc_intercept_madvise"),
		stackIndex(fromArena, "_int_free", "shrink_heap", "heap_trim", "madvise", "__madvise"),
		stackIndex(fromArena, "free"),
	}
	for i, at := range order {
		if at < 0 || (i > 0 && at <= order[i-1]) {
			t.Errorf("arena → vma_lock: want free → _int_free → rc_intercept_madvise → rc_mem_cb → pthread_mutex_lock (positions %v):%s",
				order, edgeStackText(fromArena))
			break
		}
	}
	if fromArena.Arena != "held" {
		t.Errorf("arena → vma_lock: arena %q, want held", fromArena.Arena)
	}
	if fromArena.Thread == toArena.Thread {
		t.Logf("both edges on thread %d", fromArena.Thread)
	}

	// Fixed: no error finding at all.
	for _, f := range fixed {
		if f.Severity == analyzer.SeverityError {
			t.Errorf("fixed: error finding %s: %s", f.Kind, f.Title)
		}
	}
	return map[string][]finding{"legacy": findings(t, string(both["legacy"])), "fixed": findings(t, string(both["fixed"]))}
}

func keysOf(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestDemoUsage(t *testing.T) {
	_, stderr, code := hooktrace(t, nil, "demo", "--format", "yaml")
	if code != exitUsage || !strings.Contains(stderr, "--format") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// TestDemoStress: with --stress the legacy cache deadlocks for real and
// hang detection catches it: a deadlock finding through vma_lock and the
// arena, the hook's thread inside free, the other inside the cache with
// vma_lock held; the fixed cache runs the same stress to its end. The
// deadlock is a race: two chances.
func TestDemoStress(t *testing.T) {
	testenv.RequireBPF(t)
	cache := t.TempDir()
	for attempt := 1; attempt <= 2; attempt++ {
		start := time.Now()
		stdout, stderr, code := hooktrace(t, nil, "demo", "--stress", "--format", "json", "--cache-dir", cache)
		var both map[string]json.RawMessage
		if err := json.Unmarshal([]byte(stdout), &both); err != nil {
			t.Fatalf("exit %d, output is not JSON: %v\n%s", code, err, stderr)
		}
		_, legacy := findingsOf(t, string(both["legacy"]))
		dl := findingOfKind(legacy, analyzer.KindDeadlock)
		if dl == nil && code == exitFindings {
			t.Logf("attempt %d: the legacy variant did not deadlock this time", attempt)
			continue
		}
		if code != 0 || dl == nil {
			t.Fatalf("exit %d, deadlock finding %v\n%s", code, dl, stderr)
		}
		t.Logf("attempt %d: caught in %v", attempt, time.Since(start).Round(time.Millisecond))
		locks := strings.Join(dl.Locks, "; ")
		if !strings.Contains(locks, "vma_lock (librcache.so)") || !strings.Contains(locks, "glibc malloc arena") {
			t.Errorf("deadlock locks: %v", dl.Locks)
		}
		for i := range dl.Edges {
			e := &dl.Edges[i]
			switch e.To {
			case "vma_lock (librcache.so)":
				if stackIndex(e, "rc_mem_cb") < 0 || stackIndex(e, "free") < stackIndex(e, "rc_intercept_madvise") {
					t.Errorf("the hook's stack:%s", edgeStackText(e))
				}
			case "glibc malloc arena":
				if stackIndex(e, "rc_register", "rc_deregister", "rc_find") < 0 {
					t.Errorf("the vma_lock holder's stack is not in the cache:%s", edgeStackText(e))
				}
			default:
				t.Errorf("edge to %q", e.To)
			}
		}
		if !strings.Contains(stderr, "hooktrace: deadlock in pid") {
			t.Errorf("stderr: %s", stderr)
		}
		_, fixed := findingsOf(t, string(both["fixed"]))
		for _, f := range fixed {
			if f.Severity == analyzer.SeverityError {
				t.Errorf("fixed under stress: %s: %s", f.Kind, f.Title)
			}
		}
		return
	}
	t.Fatal("the legacy variant did not deadlock in two stress demos")
}
