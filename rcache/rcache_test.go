package rcache

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// build compiles the cache once per test binary; without a C compiler the
// tests skip, except under CI, where the compiler is part of the set-up.
func build(t *testing.T) *Built {
	t.Helper()
	if _, err := Compiler(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	b, err := Build(sharedCache)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var sharedCache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rcache-test")
	if err != nil {
		panic(err)
	}
	sharedCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type summary struct {
	Variant       string `json:"variant"`
	Mode          string `json:"mode"`
	Exit          int    `json:"exit"`
	Registrations uint64 `json:"registrations"`
	Hits          uint64 `json:"hits"`
	Lookups       uint64 `json:"lookups"`
	Invalidated   uint64 `json:"invalidated"`
	HookCalls     uint64 `json:"hook_calls"`
	HookDeferred  uint64 `json:"hook_deferred"`
	Overflows     uint64 `json:"overflows"`
	Flushes       uint64 `json:"flushes"`
	Violations    uint64 `json:"violations"`
	TrimBatches   uint64 `json:"trim_batches"`
}

// workload runs the workload with args and returns its summary, exit code
// and stderr.
func workload(t *testing.T, b *Built, env []string, args ...string) (summary, int, string) {
	t.Helper()
	sumPath := filepath.Join(t.TempDir(), "summary.json")
	cmd := exec.Command(b.Workload, append(args, "--summary", sumPath)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running the workload: %v", err)
	}
	var s summary
	if data, err := os.ReadFile(sumPath); err == nil {
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatalf("summary %s: %v", data, err)
		}
	}
	return s, code, stderr.String()
}

func TestBuildIsCachedByContent(t *testing.T) {
	cc, err := Compiler()
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	dir := t.TempDir()
	a, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.Cached {
		t.Errorf("first build reported as cached")
	}
	b, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Cached || b.Dir != a.Dir {
		t.Errorf("second build: cached=%v dir %s, want the first's %s", b.Cached, b.Dir, a.Dir)
	}
	key, err := Key(cc)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(a.Dir) != key {
		t.Errorf("build dir %s is not keyed by %s", a.Dir, key)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("cache dir holds %d entries, want only the build (no leftovers)", len(ents))
	}
	for _, p := range []string{a.Library, a.Workload} {
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// TestNeverReturnsReleasedMemory is the cache's promise under concurrency,
// for both variants: four threads register fresh mappings and release them
// (munmap while registered, madvise(MADV_DONTNEED) of a page, munmap after
// deregistering) while two threads look their ranges up and a third trims
// its arena and unmaps blocks from inside free(); a lookup begun after a
// release returned must never see the released registration.
func TestNeverReturnsReleasedMemory(t *testing.T) {
	b := build(t)
	const rounds = 3000
	for _, variant := range []string{"legacy", "fixed"} {
		t.Run(variant, func(t *testing.T) {
			s, code, stderr := workload(t, b, nil, "--variant", variant, "--check", "--rounds", "3000")
			if code != 0 || s.Violations != 0 {
				t.Fatalf("exit %d, %d violations\n%s", code, s.Violations, stderr)
			}
			// Every owner's registration was made, and dropped by a
			// release: the hooks really ran.
			if s.Registrations < 4*rounds || s.Invalidated < 4*rounds {
				t.Errorf("registrations %d, invalidated %d: want at least %d each", s.Registrations, s.Invalidated, 4*rounds)
			}
			// Each round re-registers a covered sub-range (the workload
			// counts a new registration for it as a violation); one-page
			// ranges have none.
			if s.Hits < 4*rounds/2 {
				t.Errorf("hits %d: covered re-registrations did not reuse registrations", s.Hits)
			}
			if s.Lookups == 0 || s.HookCalls < s.Invalidated/2 {
				t.Errorf("lookups %d, hook calls %d", s.Lookups, s.HookCalls)
			}
			switch variant {
			case "fixed":
				// Hooks found vma_lock taken and deferred: the queue is
				// exercised, not just present.
				if s.HookDeferred == 0 {
					t.Errorf("no hook was deferred: the deferred-invalidation path went untested")
				}
			case "legacy":
				if s.HookDeferred != 0 {
					t.Errorf("legacy deferred %d hooks; it has no queue", s.HookDeferred)
				}
			}
		})
	}
}

// TestDeferredQueueOverflow: with a deferred queue of two entries, hooks
// overflow it and the next operation drops every registration. That must
// keep the promise too.
func TestDeferredQueueOverflow(t *testing.T) {
	b := build(t)
	for attempt := 1; ; attempt++ {
		s, code, stderr := workload(t, b, []string{"RCACHE_TEST_QUEUE=2"}, "--variant", "fixed", "--check", "--rounds", "3000")
		if code != 0 || s.Violations != 0 {
			t.Fatalf("exit %d, %d violations\n%s", code, s.Violations, stderr)
		}
		if s.Overflows > 0 && s.Flushes > 0 {
			t.Logf("%d overflows, %d flushes, %d deferred hooks, no violation", s.Overflows, s.Flushes, s.HookDeferred)
			return
		}
		if attempt == 3 {
			t.Fatalf("no overflow in three runs: the path went untested (%+v)", s)
		}
	}
}

// TestCheckCatchesABrokenCache: with the hook disabled by fault injection
// the same check must fail: it can tell.
func TestCheckCatchesABrokenCache(t *testing.T) {
	b := build(t)
	s, code, stderr := workload(t, b, []string{"RCACHE_TEST_FAULT=ignore-releases"}, "--variant", "fixed", "--check", "--rounds", "200")
	if code != 1 || s.Violations == 0 || !strings.Contains(stderr, "VIOLATION") {
		t.Fatalf("exit %d, %d violations: the check did not catch a cache that ignores releases\n%s", code, s.Violations, stderr)
	}
}

// TestStress: the fixed variant runs the stress workload to its end; the
// legacy one deadlocks for real and its watchdog ends it (exit 3). The
// deadlock is a race: it is given three chances.
func TestStress(t *testing.T) {
	b := build(t)
	t.Run("fixed", func(t *testing.T) {
		s, code, stderr := workload(t, b, nil, "--variant", "fixed", "--stress", "--seconds", "2", "--watchdog", "5")
		if code != 0 {
			t.Fatalf("fixed variant under stress: exit %d\n%s", code, stderr)
		}
		if s.TrimBatches == 0 || s.HookCalls == 0 || s.Registrations == 0 {
			t.Errorf("the stress run did not do its work: %+v", s)
		}
	})
	t.Run("legacy", func(t *testing.T) {
		for attempt := 1; attempt <= 3; attempt++ {
			start := time.Now()
			_, code, stderr := workload(t, b, nil, "--variant", "legacy", "--stress", "--seconds", "20", "--watchdog", "1")
			if code == 3 {
				if !strings.Contains(stderr, "legacy variant deadlocked") {
					t.Errorf("watchdog message: %q", stderr)
				}
				t.Logf("deadlocked and caught by the watchdog after %v (attempt %d)", time.Since(start).Round(time.Millisecond), attempt)
				return
			}
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
		}
		t.Fatalf("the legacy variant did not deadlock in three 20s stress runs")
	})
}

func TestBadUsage(t *testing.T) {
	b := build(t)
	for _, args := range [][]string{
		{},
		{"--variant", "neither"},
		{"--variant", "legacy", "--seconds", "-1"},
		{"--variant", "fixed", "--no-such-flag"},
	} {
		cmd := exec.Command(b.Workload, args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "usage:") {
			t.Errorf("%v: %v, %q: want exit 2 with usage", args, err, out)
		}
	}
}
