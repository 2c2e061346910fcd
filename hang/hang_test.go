//go:build linux && amd64

package hang

import (
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/rcache"
)

// Hang detection reads /proc only: these tests need a C compiler and the
// right to read a child's memory, not eBPF.

func TestMain(m *testing.M) { testenv.Main(m) }

// startWatched starts argv and watches it; the process is killed at the
// end of the test. It execs argv only once the watch has taken its first
// sample, so that what it does, deadlock included, happens while watched.
// exited receives its Wait's result: the only Wait, so that the test and
// the clean-up never wait on the same process together.
func startWatched(t *testing.T, timeout time.Duration, argv ...string) (cmd *exec.Cmd, w *Watcher, exited <-chan error) {
	t.Helper()
	cmd = exec.Command("/bin/sh", append([]string{"-c", `read go && exec "$0" "$@"`}, argv...)...)
	gate, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w = Watch(cmd.Process.Pid, Options{Timeout: timeout, ArenaHeld: analyzer.ArenaHeld, Action: "kill",
		Warn: func(s string) { t.Log(s) }})
	io.WriteString(gate, "go\n")
	result := make(chan error, 1)
	waited := make(chan struct{})
	go func() {
		result <- cmd.Wait()
		close(waited)
	}()
	t.Cleanup(func() {
		w.Stop()
		cmd.Process.Kill()
		<-waited
	})
	return cmd, w, result
}

// watchAgain watches pid, already deadlocked, with a timeout no test
// waits out: only the samples taken at the start can confirm the
// deadlock.
func watchAgain(t *testing.T, pid int) *events.Hang {
	t.Helper()
	w := Watch(pid, Options{Timeout: time.Hour, ArenaHeld: analyzer.ArenaHeld, Action: "detach",
		Warn: func(s string) { t.Log(s) }})
	defer w.Stop()
	select {
	case h := <-w.Found():
		select {
		case <-w.Settled():
			t.Error("settled, yet deadlocked")
		default:
		}
		if !h.AtStart || h.Samples < confirmSamples || h.Timeout < uint64((confirmSamples-1)*confirmInterval) || h.Action != "detach" {
			t.Errorf("hang header: at start %v, %d samples over %v, action %s: want the deadlock confirmed by %d samples %v apart",
				h.AtStart, h.Samples, time.Duration(h.Timeout), h.Action, confirmSamples, confirmInterval)
		}
		return h
	case <-time.After(60 * time.Second):
		t.Fatal("the deadlock already there was not reported in 60s")
	}
	return nil
}

func hangThread(h *events.Hang, lock string) *events.HangThread {
	for i := range h.Threads {
		if h.Threads[i].LockName == lock {
			return &h.Threads[i]
		}
	}
	return nil
}

func framesHave(frames []events.Frame, fn string) bool {
	for _, f := range frames {
		if f.Function == fn {
			return true
		}
	}
	return false
}

func framesText(frames []events.Frame) string {
	var b strings.Builder
	for _, f := range frames {
		b.WriteString("\n    " + f.Function + " (" + filepath.Base(f.Object) + ")")
	}
	return b.String()
}

// TestHangFindsABBA: two threads each hold one mutex and wait for the
// other's. The hang names both locks by their symbols, each waiter's owner
// from the mutex's __owner, and whole stacks with the program's functions.
func TestHangFindsABBA(t *testing.T) {
	prog := testenv.Program(t, "deadlock")
	start := time.Now()
	cmd, w, _ := startWatched(t, 500*time.Millisecond, prog)
	var h *events.Hang
	select {
	case h = <-w.Found():
	case <-time.After(20 * time.Second):
		t.Fatal("no deadlock reported in 20s")
	}
	took := time.Since(start)
	if took < 500*time.Millisecond {
		t.Errorf("reported after %v, before the timeout", took)
	}
	if h.PID != uint32(cmd.Process.Pid) || h.Action != "kill" || h.Timeout != uint64(500*time.Millisecond) || h.AtStart {
		t.Errorf("hang header: %+v", h)
	}
	checkABBA(t, h, 500*time.Millisecond)
}

// checkABBA checks the hang of testdata/deadlock.c: both locks by their
// symbols, each waiter's owner from the mutex's __owner, whole stacks
// with the program's functions, main waiting in pthread_join, and what
// the analyzer makes of it.
func checkABBA(t *testing.T, h *events.Hang, blocked time.Duration) {
	t.Helper()
	a := hangThread(h, "accounts_lock (deadlock)")
	l := hangThread(h, "ledger_lock (deadlock)")
	if a == nil || l == nil {
		t.Fatalf("want waits for accounts_lock and ledger_lock, got %+v", h.Threads)
	}
	// The thread waiting for ledger_lock holds accounts_lock: it is the
	// owner the other waiter sees, and the other way round.
	if a.Owner != l.TID || l.Owner != a.TID || a.OwnerFrom != "the mutex's __owner" {
		t.Errorf("owners: %d waits (owner %d), %d waits (owner %d), from %q", a.TID, a.Owner, l.TID, l.Owner, a.OwnerFrom)
	}
	if a.LockKind != "mutex" || l.LockKind != "mutex" || a.BlockedNS < uint64(blocked) {
		t.Errorf("kinds %s %s, blocked %v", a.LockKind, l.LockKind, time.Duration(a.BlockedNS))
	}
	for _, c := range []struct {
		th *events.HangThread
		fn string
	}{{l, "post_to_ledger"}, {a, "audit_accounts"}} {
		if !framesHave(c.th.Stack, c.fn) || !framesHave(c.th.Stack, "start_thread") || c.th.Truncated {
			t.Errorf("thread %d's stack lacks %s or is cut short (truncated=%v):%s", c.th.TID, c.fn, c.th.Truncated, framesText(c.th.Stack))
		}
		if c.th.Stack[0].Function == c.fn {
			t.Errorf("stack starts at %s: the lock call's frames are missing", c.fn)
		}
	}
	// main waits in pthread_join: blocked, but on no lock.
	if len(h.Threads) != 3 {
		t.Errorf("want 3 blocked threads (the two lockers and main in pthread_join), got %d", len(h.Threads))
	}
	for _, th := range h.Threads {
		if th.LockName == "" && (th.LockKind != "futex" || th.Owner != 0 || !framesHave(th.Stack, "main")) {
			t.Errorf("main's wait: %+v", th)
		}
	}
	// What the analyzer makes of it: one deadlock, both locks, both stacks.
	var waits []analyzer.Wait
	for _, th := range h.Threads {
		waits = append(waits, analyzer.Wait{PID: h.PID, TID: th.TID, WaitingFor: th.Lock, Lock: th.LockName,
			Owner: th.Owner, Stack: &events.Stack{Frames: th.Stack}})
	}
	fs := analyzer.DeadlockFindings(waits)
	if len(fs) != 1 || len(fs[0].Locks) != 2 || len(fs[0].Edges) != 2 {
		t.Fatalf("deadlock findings: %+v", fs)
	}
}

// waitHung waits for the watch of a process that deadlocks to report it.
func waitHung(t *testing.T, w *Watcher, exited <-chan error) *events.Hang {
	t.Helper()
	select {
	case h := <-w.Found():
		w.Stop()
		return h
	case err := <-exited:
		t.Fatalf("the program exited (%v) instead of deadlocking", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no deadlock reported in 60s")
	}
	return nil
}

// TestHangAlreadyThere: a watch that starts on a process already
// deadlocked confirms the deadlock by samples taken at once, the timeout
// (an hour) not waited out, with all that the timeout's report has: the
// ABBA deadlock, and a memory hook waiting for a lock its own thread holds
// (inside malloc: a thread's first malloc unmaps).
func TestHangAlreadyThere(t *testing.T) {
	t.Run("abba", func(t *testing.T) {
		cmd, w, exited := startWatched(t, 300*time.Millisecond, testenv.Program(t, "deadlock"))
		before := waitHung(t, w, exited)
		h := watchAgain(t, cmd.Process.Pid)
		checkABBA(t, h, (confirmSamples-1)*confirmInterval)
		if len(h.Threads) != len(before.Threads) {
			t.Errorf("%d threads blocked, the timeout's report had %d", len(h.Threads), len(before.Threads))
		}
	})
	t.Run("hook", func(t *testing.T) {
		cmd, w, exited := startWatched(t, 300*time.Millisecond, testenv.Program(t, "hookhang"))
		waitHung(t, w, exited)
		h := watchAgain(t, cmd.Process.Pid)
		th := hangThread(h, "hook_lock (hookhang)")
		if th == nil || th.Owner != th.TID || th.LockKind != "mutex" {
			t.Fatalf("want a thread waiting for hook_lock, which it owns: %+v", h.Threads)
		}
		for _, fn := range []string{"pthread_mutex_lock", "munmap_hook", "malloc", "register_region", "worker"} {
			if !framesHave(th.Stack, fn) {
				t.Errorf("the hook's stack lacks %s:%s", fn, framesText(th.Stack))
			}
		}
		fs := analyzer.DeadlockFindings([]analyzer.Wait{{PID: h.PID, TID: th.TID, Lock: th.LockName, WaitingFor: th.Lock,
			Owner: th.Owner, Stack: &events.Stack{Frames: th.Stack}}})
		if len(fs) != 1 || !strings.Contains(fs[0].Title, "which it holds itself") {
			t.Errorf("findings: %+v", fs)
		}
	})
}

// TestHangTimedWaitWaitsOut: a cycle one of whose threads waits with a
// deadline (pthread_mutex_timedlock, an hour ahead) can end by itself: it
// is not confirmed by samples but reported once the timeout has passed,
// as any wait that began while watched.
func TestHangTimedWaitWaitsOut(t *testing.T) {
	prog := testenv.C{Name: "timedabba", Code: `#include <pthread.h>
#include <time.h>
pthread_mutex_t left_lock = PTHREAD_MUTEX_INITIALIZER, right_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t both;
static void *lefty(void *a) {
	(void)a;
	pthread_mutex_lock(&left_lock);
	pthread_barrier_wait(&both);
	pthread_mutex_lock(&right_lock);
	return 0;
}
static void *righty(void *a) {
	(void)a;
	pthread_mutex_lock(&right_lock);
	pthread_barrier_wait(&both);
	struct timespec deadline;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 3600;
	pthread_mutex_timedlock(&left_lock, &deadline);
	return 0;
}
int main(void) {
	pthread_t a, b;
	pthread_barrier_init(&both, 0, 2);
	pthread_create(&a, 0, lefty, 0);
	pthread_create(&b, 0, righty, 0);
	pthread_join(a, 0);
	return 0;
}
`}.Build(t)
	cmd, w, exited := startWatched(t, 300*time.Millisecond, prog)
	waitHung(t, w, exited)
	w = Watch(cmd.Process.Pid, Options{Timeout: 300 * time.Millisecond, ArenaHeld: analyzer.ArenaHeld, Action: "kill"})
	defer w.Stop()
	// The thread waiting without a deadline waits for a lock of one that
	// has one: nothing to confirm at the start.
	select {
	case <-w.Settled():
	default:
		t.Error("not settled at once")
	}
	select {
	case h := <-w.Found():
		if h.AtStart || h.Timeout != uint64(300*time.Millisecond) {
			t.Errorf("at start %v, timeout %v: want the timed cycle reported by the timeout", h.AtStart, time.Duration(h.Timeout))
		}
		if hangThread(h, "left_lock (timedabba)") == nil || hangThread(h, "right_lock (timedabba)") == nil {
			t.Errorf("want waits for both locks: %+v", h.Threads)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no deadlock reported in 60s")
	}
}

// TestHangNeedsACycle: a thread that holds a mutex while it sleeps keeps
// another blocked for longer than the timeout, but that is no deadlock.
func TestHangNeedsACycle(t *testing.T) {
	prog := testenv.C{Name: "slow", Code: `#include <pthread.h>
#include <unistd.h>
pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;
static void *waiter(void *a) { (void)a; usleep(100000); pthread_mutex_lock(&slow_lock); pthread_mutex_unlock(&slow_lock); return 0; }
int main(void) {
	pthread_t t;
	pthread_mutex_lock(&slow_lock);
	pthread_create(&t, 0, waiter, 0);
	sleep(2);
	pthread_mutex_unlock(&slow_lock);
	pthread_join(t, 0);
	return 0;
}
`}.Build(t)
	_, w, exited := startWatched(t, 300*time.Millisecond, prog)
	select {
	case h := <-w.Found():
		t.Fatalf("reported a deadlock for a slow lock holder: %+v", h)
	case err := <-exited:
		if err != nil {
			t.Fatalf("program failed: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the program did not finish")
	}
}

// TestHangFindsSelfDeadlock: a thread waiting for a normal mutex it
// holds is a cycle of one.
func TestHangFindsSelfDeadlock(t *testing.T) {
	prog := testenv.C{Name: "self", Code: `#include <pthread.h>
pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
volatile int reloads;
__attribute__((noinline)) static void reload_config(void) { pthread_mutex_lock(&config_lock); reloads++; }
int main(void) { pthread_mutex_lock(&config_lock); reload_config(); return 0; }
`}.Build(t)
	cmd, w, _ := startWatched(t, 300*time.Millisecond, prog)
	select {
	case h := <-w.Found():
		th := hangThread(h, "config_lock (self)")
		if len(h.Threads) != 1 || th == nil || th.Owner != uint32(cmd.Process.Pid) || !framesHave(th.Stack, "reload_config") {
			t.Fatalf("hang: %+v", h)
		}
		fs := analyzer.DeadlockFindings([]analyzer.Wait{{PID: h.PID, TID: th.TID, Lock: th.LockName, WaitingFor: th.Lock,
			Owner: th.Owner, Stack: &events.Stack{Frames: th.Stack}}})
		if len(fs) != 1 || !strings.Contains(fs[0].Title, "which it holds itself") {
			t.Errorf("findings: %+v", fs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no deadlock reported")
	}
}

// TestHangFindsArenaOwner: the legacy registration cache under stress
// deadlocks between vma_lock and glibc's arena lock, which records no
// owner. The owner must be found from the stacks: the thread inside free()
// whose hook waits for vma_lock. The deadlock is a race: three chances.
// Once it is reported, a second watch finds it already there and confirms
// it at once, with the same owners.
func TestHangFindsArenaOwner(t *testing.T) {
	if _, err := rcache.Compiler(); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	b, err := rcache.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		cmd, w, exited := startWatched(t, time.Second, b.Workload, "--variant", "legacy", "--stress", "--seconds", "20", "--watchdog", "60")
		var h *events.Hang
		select {
		case h = <-w.Found():
		case <-exited:
			t.Logf("attempt %d: no deadlock this time", attempt)
			continue
		case <-time.After(40 * time.Second):
			t.Fatal("neither a deadlock nor an exit in 40s")
		}
		holder, hook := checkArenaHang(t, h)
		t.Logf("attempt %d: deadlock: %d waits for the arena held by %d; %d waits for vma_lock held by %d",
			attempt, holder.TID, hook.TID, hook.TID, holder.TID)
		again := watchAgain(t, cmd.Process.Pid)
		holder2, hook2 := checkArenaHang(t, again)
		if holder2.TID != holder.TID || hook2.TID != hook.TID {
			t.Errorf("the watch at the start found %d holding vma_lock and %d the arena, the timeout's %d and %d",
				holder2.TID, hook2.TID, holder.TID, hook.TID)
		}
		return
	}
	t.Fatal("the legacy variant did not deadlock in three stress runs")
}

// checkArenaHang checks the registration cache's deadlock: the arena
// waiter's owner is a thread waiting for vma_lock from a hook inside
// free, found from its stack, and vma_lock's owner waits for the arena.
// It returns the thread holding vma_lock and the hook's.
func checkArenaHang(t *testing.T, h *events.Hang) (holder, hook *events.HangThread) {
	t.Helper()
	cache := hangThread(h, "vma_lock (librcache.so)")
	arena := hangThread(h, "glibc malloc arena")
	if cache == nil || arena == nil {
		t.Fatalf("want waits for vma_lock and the arena, got %+v", h.Threads)
	}
	for i := range h.Threads {
		th := &h.Threads[i]
		if th.LockKind == "arena" && th.Owner != 0 {
			for j := range h.Threads {
				if h.Threads[j].TID == th.Owner {
					hook = &h.Threads[j]
				}
			}
		}
	}
	if hook == nil || hook.LockName != "vma_lock (librcache.so)" {
		t.Fatalf("the arena's owner is not a thread waiting for vma_lock: %+v", h.Threads)
	}
	for i := range h.Threads {
		if h.Threads[i].TID == hook.Owner {
			holder = &h.Threads[i]
		}
	}
	if holder == nil || holder.LockKind != "arena" {
		t.Fatalf("vma_lock's owner %d is not waiting for the arena: %+v", hook.Owner, h.Threads)
	}
	for _, fn := range []string{"pthread_mutex_lock", "rc_mem_cb", "rc_mem_release_hook", "rc_intercept_madvise", "_int_free", "free"} {
		if !framesHave(hook.Stack, fn) {
			t.Errorf("the hook's stack lacks %s:%s", fn, framesText(hook.Stack))
		}
	}
	if !strings.Contains(arena.OwnerFrom, "stack") {
		t.Errorf("arena owner found by %q", arena.OwnerFrom)
	}
	return holder, hook
}
