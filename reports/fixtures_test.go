package reports

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// go test ./reports -run 'TestFixtures|TestGolden' -update rewrites the
// fixture traces and every golden file from the builders below.
var update = flag.Bool("update", false, "rewrite testdata fixtures and golden files")

// The fixture traces: small hand-built runs of an Open MPI-like program,
// written with events.Writer as the tracer would.
//
//	seed.htr     the "main branch" run: the memory-hook deadlock (error), a
//	             three-lock cycle closed by a timed wait (warning), and a
//	             hook that takes a lock on a path that cannot deadlock (info)
//	regress.htr  the "pull request" run, recorded in full mode: the
//	             memory-hook deadlock and the hook lock again, the timed
//	             cycle gone, a new lock-order inversion (error); plus
//	             probed hooks, a condition wait, unlocks out of order and
//	             allocator calls for the timeline
//	misuse.htr   lock misuse (warnings): a mutex unlocked by a thread that
//	             does not hold it, one unlocked twice, a held rwlock
//	             destroyed
const (
	fxStartNS   = 5_000_000_000
	fxStartUnix = 1_760_000_000_000_000_000
	fxRoot      = "/src/app"
)

func newFx(h *events.Header) *tracebuild.Trace {
	h.Tool = "hooktrace test"
	h.Host = "node01"
	h.Clock = "CLOCK_MONOTONIC"
	h.StartNS = fxStartNS
	h.StartUnix = fxStartUnix
	if h.Mode == "" {
		h.Mode = "aggregate"
	}
	b := tracebuild.New(4000, h)
	b.Clock, b.Step = fxStartNS, 1500
	b.Program, b.FrameOffset, b.Sources = "/usr/bin/app", 8, fxSources
	return b
}

// fxSources gives some functions a source line, as DWARF would: paths
// under the source root, a relative one and one outside.
var fxSources = map[string]tracebuild.Source{
	"vma_tree_insert":            {File: fxRoot + "/rcache/vma_tree.c", Line: 88},
	"vma_tree_iterate":           {File: fxRoot + "/rcache/vma_tree.c", Line: 142},
	"mca_rcache_base_vma_insert": {File: fxRoot + "/rcache/base_vma.c", Line: 57},
	"release_buffers":            {File: "app/release.c", Line: 31},
	"pool_get":                   {File: fxRoot + "/pool/pool.c", Line: 40},
	"pool_put":                   {File: fxRoot + "/pool/pool.c", Line: 77},
	"cache_fill":                 {File: fxRoot + "/pool/cache.c", Line: 19},
	"cache_evict":                {File: fxRoot + "/pool/cache.c", Line: 63},
	"stats_note":                 {File: "/opt/vendor/stats.c", Line: 12},
	"job_post":                   {File: fxRoot + "/jobs/queue.c", Line: 23},
	"job_take":                   {File: fxRoot + "/jobs/queue.c", Line: 51},
	"job_done":                   {File: fxRoot + "/jobs/queue.c", Line: 30},
	"table_free":                 {File: fxRoot + "/jobs/table.c", Line: 88},
}

// fxFooter ends a fixture: the target exited 0.
func fxFooter(b *tracebuild.Trace) {
	status := 0
	b.Footer(&events.Footer{EndNS: b.Clock + 1000, Events: uint64(len(b.Records())), ExitStatus: &status, Reason: "target exited"})
}

const (
	libc      = "@libc.so.6"
	rcache    = "@librcache.so"
	addrVMA   = 0x601200
	addrA     = 0x601000
	addrB     = 0x601040
	addrC     = 0x601080
	addrStats = 0x601300
	addrPool  = 0x7f0000001010
	addrCache = 0x7f0000002010
	addrCond  = 0x601400
	addrQueue = 0x601440
	addrJob   = 0x601480
)

// openMPIDeadlock is the seed bug: thread 11 holds vma_lock across
// malloc; thread 12 frees, glibc trims the heap with its arena lock held
// and the patched madvise's hook takes vma_lock.
func openMPIDeadlock(b *tracebuild.Trace) {
	b.Thread(11, "mpi-send")
	b.Thread(12, "progress")
	b.Lock(11, addrVMA, "pthread_mutex_lock"+libc, "mca_rcache_base_vma_insert"+rcache, "mca_rcache_register"+rcache, "main")
	b.Event(events.Event{TID: 11, Op: events.OpMalloc, Size: 48, Flags: events.FlagLocksHeld},
		"malloc"+libc, "vma_tree_insert"+rcache, "mca_rcache_base_vma_insert"+rcache, "mca_rcache_register"+rcache, "main")
	b.Unlock(11, addrVMA)
	b.Event(events.Event{TID: 12, Op: events.OpFree, Addr: 0x7f1000000010, Size: 0x20000}, "free"+libc, "release_buffers", "progress_loop")
	inFree := events.Event{TID: 12, Flags: events.FlagInAlloc, Addr2: uint64(events.OpFree)}
	e := inFree
	e.Op, e.Flags, e.Addr = events.OpMutexLock, e.Flags|events.FlagAcquired, addrVMA
	b.Event(e, "pthread_mutex_lock"+libc, "vma_tree_iterate"+rcache, "mca_rcache_base_vma_iterate"+rcache,
		"_intercept_madvise"+rcache, "shrink_heap"+libc, "heap_trim"+libc, "_int_free"+libc, "free"+libc, "release_buffers", "progress_loop")
	e = inFree
	e.Op, e.Addr = events.OpMutexUnlock, addrVMA
	b.Event(e)
	e = inFree
	e.Op, e.Addr, e.Size = events.OpMadvise, 0x7f1000020000, 0x10000
	b.Event(e, "__madvise"+libc, "_intercept_madvise"+rcache, "shrink_heap"+libc, "heap_trim"+libc, "_int_free"+libc, "free"+libc, "release_buffers", "progress_loop")
}

// statsHook: a munmap hook takes stats_lock inside free on a path where
// glibc does not hold its arena lock (munmap_chunk): information only.
func statsHook(b *tracebuild.Trace) {
	b.Thread(13, "reaper")
	b.Event(events.Event{TID: 13, Op: events.OpFree, Addr: 0x7f3000000010, Size: 0x200000}, "free"+libc, "drop_segment", "reaper_main")
	in := events.Event{TID: 13, Flags: events.FlagInAlloc | events.FlagAcquired, Addr2: uint64(events.OpFree), Op: events.OpMutexLock, Addr: addrStats}
	b.Event(in, "pthread_mutex_lock"+libc, "stats_note@libstats.so", "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc, "drop_segment", "reaper_main")
	b.Event(events.Event{TID: 13, Flags: events.FlagInAlloc, Addr2: uint64(events.OpFree), Op: events.OpMutexUnlock, Addr: addrStats})
}

// timedCycle: a → b, b → c, c → a where the last wait is timed: a
// warning (it ends in a timeout).
func timedCycle(b *tracebuild.Trace) {
	b.Thread(21, "worker-1")
	b.Thread(22, "worker-2")
	b.Thread(23, "watchdog")
	b.Lock(21, addrA, "pthread_mutex_lock"+libc, "stage_one")
	b.Lock(21, addrB, "pthread_mutex_lock"+libc, "stage_two")
	b.Unlock(21, addrB)
	b.Unlock(21, addrA)
	b.Lock(22, addrB, "pthread_mutex_lock"+libc, "stage_two")
	b.Lock(22, addrC, "pthread_mutex_lock"+libc, "stage_three")
	b.Unlock(22, addrC)
	b.Unlock(22, addrB)
	b.Lock(23, addrC, "pthread_mutex_lock"+libc, "watchdog_tick")
	b.Event(events.Event{TID: 23, Op: events.OpMutexTimedlock, Flags: events.FlagReturn | events.FlagAcquired, Addr: addrA},
		"pthread_mutex_timedlock"+libc, "watchdog_check")
	b.Unlock(23, addrA)
	b.Unlock(23, addrC)
}

// poolInversion: pool_get takes pool then cache; cache_evict takes cache
// then pool (heap locks, named by where they were initialised).
func poolInversion(b *tracebuild.Trace) {
	b.Thread(31, "alloc-1")
	b.Thread(32, "evictor")
	b.Event(events.Event{TID: 31, Op: events.OpMutexInit, Addr: addrPool}, "pthread_mutex_init"+libc, "pool_create@libpool.so", "main")
	b.Event(events.Event{TID: 31, Op: events.OpMutexInit, Addr: addrCache}, "pthread_mutex_init"+libc, "cache_create@libpool.so", "main")
	b.Lock(31, addrPool, "pthread_mutex_lock"+libc, "pool_get@libpool.so", "worker")
	b.Lock(31, addrCache, "pthread_mutex_lock"+libc, "cache_fill@libpool.so", "pool_get@libpool.so", "worker")
	// Released out of order: pool first.
	b.Unlock(31, addrPool)
	b.Unlock(31, addrCache)
	b.Lock(32, addrCache, "pthread_mutex_lock"+libc, "cache_evict@libpool.so", "evictor_main")
	b.Lock(32, addrPool, "pthread_mutex_lock"+libc, "pool_put@libpool.so", "cache_evict@libpool.so", "evictor_main")
	b.Unlock(32, addrPool)
	b.Unlock(32, addrCache)
}

// misuseTrace: a producer locks job_lock and a consumer unlocks it, as a
// hand-made semaphore would (an unlock by a thread that does not hold
// the lock); the producer's own unlock then finds it unlocked; a rwlock
// is destroyed while its writer holds it. Each call is recorded with its
// stack, as the recorders send misuse.
func misuseTrace() *tracebuild.Trace {
	b := newFx(&events.Header{Command: []string{"./app", "--jobs"}, Allocator: "glibc"})
	b.Name(addrJob, "job_lock (app)")
	b.Thread(41, "producer")
	b.Thread(42, "consumer")
	b.Lock(41, addrJob, "pthread_mutex_lock"+libc, "job_post", "producer_main")
	b.Event(events.Event{TID: 42, Op: events.OpMutexUnlock, Addr: addrJob, Addr2: 41},
		"pthread_mutex_unlock"+libc, "job_take", "consumer_main")
	b.Event(events.Event{TID: 41, Op: events.OpMutexUnlock, Addr: addrJob},
		"pthread_mutex_unlock"+libc, "job_done", "producer_main")
	b.Event(events.Event{TID: 41, Op: events.OpRwlockInit, Addr: addrPool}, "pthread_rwlock_init"+libc, "table_create", "producer_main")
	b.RWLock(41, events.OpRwlockWrlock, addrPool, 0, "pthread_rwlock_wrlock"+libc, "table_resize", "producer_main")
	b.Event(events.Event{TID: 42, Op: events.OpRwlockDestroy, Addr: addrPool, Flags: events.FlagBusy, Addr2: 41},
		"pthread_rwlock_destroy"+libc, "table_free", "consumer_main")
	fxFooter(b)
	return b
}

func seedTrace() *tracebuild.Trace {
	b := newFx(&events.Header{Command: []string{"./app", "--seed"}, Allocator: "glibc"})
	b.Name(addrVMA, "vma_lock (librcache.so)")
	b.Name(addrA, "lock_a (libstage.so)")
	b.Name(addrB, "lock_b (libstage.so)")
	b.Name(addrC, "lock_c (libstage.so)")
	b.Name(addrStats, "stats_lock (libstats.so)")
	openMPIDeadlock(b)
	timedCycle(b)
	statsHook(b)
	fxFooter(b)
	return b
}

func regressTrace() *tracebuild.Trace {
	b := newFx(&events.Header{Command: []string{"./app", "--regress"}, Allocator: "glibc", Mode: "full",
		UserProbes: []string{"_intercept_madvise", "progress_loop"}})
	b.Name(addrVMA, "vma_lock (librcache.so)")
	b.Name(addrStats, "stats_lock (libstats.so)")
	b.Name(addrQueue, "queue_mutex (app)")
	// Allocator calls with no lock held (full mode sends them).
	b.Thread(40, "main")
	b.Event(events.Event{TID: 40, Op: events.OpMalloc, Size: 1024, Addr: 0}, "malloc"+libc, "main")
	b.Event(events.Event{TID: 40, Op: events.OpCalloc, Size: 4096}, "calloc"+libc, "main")
	b.Event(events.Event{TID: 40, Op: events.OpThreadCreate, Arg: 12})
	// The progress thread runs a probed progress loop, waits on a
	// condition, and its madvise hook is probed too.
	b.Event(events.Event{TID: 12, Op: events.OpProbeEnter, Arg: 1}, "progress_loop", "thread_start")
	b.Lock(12, addrQueue, "pthread_mutex_lock"+libc, "progress_loop", "thread_start")
	b.Event(events.Event{TID: 12, Op: events.OpCondWait, Addr: addrCond, Addr2: addrQueue}, "pthread_cond_wait"+libc, "progress_loop")
	b.Event(events.Event{TID: 12, Op: events.OpCondWait, Flags: events.FlagReturn, Addr: addrCond, Addr2: addrQueue}, "pthread_cond_wait"+libc, "progress_loop")
	b.Unlock(12, addrQueue)
	openMPIDeadlock(b)
	b.Event(events.Event{TID: 12, Op: events.OpProbeExit, Flags: events.FlagReturn, Arg: 1})
	statsHook(b)
	poolInversion(b)
	b.Event(events.Event{TID: 40, Op: events.OpFree, Addr: 0x7f5000000010, Size: 1040}, "free"+libc, "main")
	b.Event(events.Event{TID: 31, Op: events.OpThreadExit})
	fxFooter(b)
	return b
}

var fixtures = []struct {
	name  string
	build func() *tracebuild.Trace
}{
	{"seed", seedTrace},
	{"regress", regressTrace},
	{"misuse", misuseTrace},
}

// TestFixtures writes the fixture traces with -update, and otherwise
// checks that the committed ones are what the builders make.
func TestFixtures(t *testing.T) {
	for _, fx := range fixtures {
		var buf bytes.Buffer
		w := events.NewWriter(&buf)
		for _, r := range fx.build().Records() {
			if err := w.Write(r); err != nil {
				t.Fatalf("%s: %v", fx.name, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", fx.name+".htr")
		if *update {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./reports -update)", err)
		}
		if !bytes.Equal(have, buf.Bytes()) {
			t.Errorf("%s is stale: run go test ./reports -update", path)
		}
	}
}

// analyzeFixture reads a committed fixture trace as the CLI does.
func analyzeFixture(t *testing.T, name string) *analyzer.Result {
	t.Helper()
	a := analyzer.New(analyzer.Options{})
	a.BeginStream(name + ".htr")
	eachFixtureRecord(t, name, func(r *events.Record) { a.Add(r) })
	return a.Result()
}

func eachFixtureRecord(t *testing.T, name string, fn func(*events.Record)) {
	t.Helper()
	r, err := events.Open(filepath.Join("testdata", name+".htr"))
	if err != nil {
		t.Fatalf("%v (run go test ./reports -update)", err)
	}
	defer r.Close()
	for {
		var rec events.Record
		err := r.NextInto(&rec)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(&rec)
	}
}

// golden compares got with testdata/golden/NAME, or rewrites it.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./reports -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (run go test ./reports -update and review the diff):\n%s", path, firstDiff(want, got))
	}
}

func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + w + "\n  got:  " + g
		}
	}
	return ""
}

// analyzeFixtures merges several fixture traces, as analyze does.
func analyzeFixtures(t *testing.T, names ...string) *analyzer.Result {
	t.Helper()
	a := analyzer.New(analyzer.Options{})
	for _, name := range names {
		a.BeginStream(name + ".htr")
		eachFixtureRecord(t, name, func(r *events.Record) { a.Add(r) })
	}
	return a.Result()
}
