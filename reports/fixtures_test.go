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
const (
	fxStartNS   = 5_000_000_000
	fxStartUnix = 1_760_000_000_000_000_000
	fxRoot      = "/src/app"
)

type fxTrace struct {
	recs   []*events.Record
	stacks map[string]uint32
	pid    uint32
	clock  uint64
}

func newFx(h *events.Header) *fxTrace {
	h.Version = events.Version
	h.PID = 4000
	h.Tool = "hooktrace test"
	h.Host = "node01"
	h.Clock = "CLOCK_MONOTONIC"
	h.StartNS = fxStartNS
	h.StartUnix = fxStartUnix
	if h.Mode == "" {
		h.Mode = "aggregate"
	}
	return &fxTrace{pid: 4000, clock: fxStartNS, stacks: map[string]uint32{},
		recs: []*events.Record{{Kind: events.RecHeader, Header: h}}}
}

// fxSources gives some functions a source line, as DWARF would: paths
// under the source root, a relative one and one outside.
var fxSources = map[string]struct {
	file string
	line uint32
}{
	"vma_tree_insert":            {fxRoot + "/rcache/vma_tree.c", 88},
	"vma_tree_iterate":           {fxRoot + "/rcache/vma_tree.c", 142},
	"mca_rcache_base_vma_insert": {fxRoot + "/rcache/base_vma.c", 57},
	"release_buffers":            {"app/release.c", 31},
	"pool_get":                   {fxRoot + "/pool/pool.c", 40},
	"pool_put":                   {fxRoot + "/pool/pool.c", 77},
	"cache_fill":                 {fxRoot + "/pool/cache.c", 19},
	"cache_evict":                {fxRoot + "/pool/cache.c", 63},
	"stats_note":                 {"/opt/vendor/stats.c", 12},
}

// stack interns "function@object" frames, innermost first; objects
// without a slash live in /usr/lib/x86_64-linux-gnu.
func (b *fxTrace) stack(frames []string) uint32 {
	if len(frames) == 0 {
		return 0
	}
	key := strings.Join(frames, "|")
	if id, ok := b.stacks[key]; ok {
		return id
	}
	id := uint32(len(b.stacks) + 1)
	b.stacks[key] = id
	st := &events.Stack{ID: id}
	for i, f := range frames {
		fn, obj, ok := strings.Cut(f, "@")
		if !ok {
			obj = "/usr/bin/app"
		} else if !strings.Contains(obj, "/") {
			obj = "/usr/lib/x86_64-linux-gnu/" + obj
		}
		fr := events.Frame{Addr: 0x401000 + uint64(id)*0x100 + uint64(i)*8, Function: fn, Offset: uint64(8 * (i + 1)), Object: obj}
		if src, ok := fxSources[fn]; ok {
			fr.File, fr.Line = src.file, src.line
		}
		st.Frames = append(st.Frames, fr)
	}
	b.recs = append(b.recs, &events.Record{Kind: events.RecStack, Stack: st})
	return id
}

func (b *fxTrace) ev(e events.Event, frames ...string) {
	b.clock += 1500
	e.Time = b.clock
	e.PID = b.pid
	e.Stack = b.stack(frames)
	b.recs = append(b.recs, &events.Record{Kind: events.RecEvent, Event: e})
}

func (b *fxTrace) lock(tid uint32, addr uint64, frames ...string) {
	b.ev(events.Event{TID: tid, Op: events.OpMutexLock, Flags: events.FlagAcquired, Addr: addr}, frames...)
}

func (b *fxTrace) unlock(tid uint32, addr uint64) {
	b.ev(events.Event{TID: tid, Op: events.OpMutexUnlock, Addr: addr})
}

func (b *fxTrace) name(addr uint64, name string) {
	b.recs = append(b.recs, &events.Record{Kind: events.RecLockName, LockName: events.LockName{PID: b.pid, Addr: addr, Name: name}})
}

func (b *fxTrace) thread(tid uint32, name string) {
	b.recs = append(b.recs, &events.Record{Kind: events.RecThread, Thread: events.Thread{PID: b.pid, TID: tid, Name: name}})
}

func (b *fxTrace) footer() {
	status := 0
	b.recs = append(b.recs, &events.Record{Kind: events.RecFooter, Footer: &events.Footer{
		EndNS: b.clock + 1000, Events: uint64(len(b.recs)), ExitStatus: &status, Reason: "target exited"}})
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
)

// openMPIDeadlock is the seed bug: thread 11 holds vma_lock across
// malloc; thread 12 frees, glibc trims the heap with its arena lock held
// and the patched madvise's hook takes vma_lock.
func openMPIDeadlock(b *fxTrace) {
	b.thread(11, "mpi-send")
	b.thread(12, "progress")
	b.lock(11, addrVMA, "pthread_mutex_lock"+libc, "mca_rcache_base_vma_insert"+rcache, "mca_rcache_register"+rcache, "main")
	b.ev(events.Event{TID: 11, Op: events.OpMalloc, Size: 48, Flags: events.FlagLocksHeld},
		"malloc"+libc, "vma_tree_insert"+rcache, "mca_rcache_base_vma_insert"+rcache, "mca_rcache_register"+rcache, "main")
	b.unlock(11, addrVMA)
	b.ev(events.Event{TID: 12, Op: events.OpFree, Addr: 0x7f1000000010, Size: 0x20000}, "free"+libc, "release_buffers", "progress_loop")
	inFree := events.Event{TID: 12, Flags: events.FlagInAlloc, Addr2: uint64(events.OpFree)}
	e := inFree
	e.Op, e.Flags, e.Addr = events.OpMutexLock, e.Flags|events.FlagAcquired, addrVMA
	b.ev(e, "pthread_mutex_lock"+libc, "vma_tree_iterate"+rcache, "mca_rcache_base_vma_iterate"+rcache,
		"_intercept_madvise"+rcache, "shrink_heap"+libc, "heap_trim"+libc, "_int_free"+libc, "free"+libc, "release_buffers", "progress_loop")
	e = inFree
	e.Op, e.Addr = events.OpMutexUnlock, addrVMA
	b.ev(e)
	e = inFree
	e.Op, e.Addr, e.Size = events.OpMadvise, 0x7f1000020000, 0x10000
	b.ev(e, "__madvise"+libc, "_intercept_madvise"+rcache, "shrink_heap"+libc, "heap_trim"+libc, "_int_free"+libc, "free"+libc, "release_buffers", "progress_loop")
}

// statsHook: a munmap hook takes stats_lock inside free on a path where
// glibc does not hold its arena lock (munmap_chunk): information only.
func statsHook(b *fxTrace) {
	b.thread(13, "reaper")
	b.ev(events.Event{TID: 13, Op: events.OpFree, Addr: 0x7f3000000010, Size: 0x200000}, "free"+libc, "drop_segment", "reaper_main")
	in := events.Event{TID: 13, Flags: events.FlagInAlloc | events.FlagAcquired, Addr2: uint64(events.OpFree), Op: events.OpMutexLock, Addr: addrStats}
	b.ev(in, "pthread_mutex_lock"+libc, "stats_note@libstats.so", "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc, "drop_segment", "reaper_main")
	b.ev(events.Event{TID: 13, Flags: events.FlagInAlloc, Addr2: uint64(events.OpFree), Op: events.OpMutexUnlock, Addr: addrStats})
}

// timedCycle: a → b, b → c, c → a where the last wait is timed: a
// warning (it ends in a timeout).
func timedCycle(b *fxTrace) {
	b.thread(21, "worker-1")
	b.thread(22, "worker-2")
	b.thread(23, "watchdog")
	b.lock(21, addrA, "pthread_mutex_lock"+libc, "stage_one")
	b.lock(21, addrB, "pthread_mutex_lock"+libc, "stage_two")
	b.unlock(21, addrB)
	b.unlock(21, addrA)
	b.lock(22, addrB, "pthread_mutex_lock"+libc, "stage_two")
	b.lock(22, addrC, "pthread_mutex_lock"+libc, "stage_three")
	b.unlock(22, addrC)
	b.unlock(22, addrB)
	b.lock(23, addrC, "pthread_mutex_lock"+libc, "watchdog_tick")
	b.ev(events.Event{TID: 23, Op: events.OpMutexTimedlock, Flags: events.FlagReturn | events.FlagAcquired, Addr: addrA},
		"pthread_mutex_timedlock"+libc, "watchdog_check")
	b.unlock(23, addrA)
	b.unlock(23, addrC)
}

// poolInversion: pool_get takes pool then cache; cache_evict takes cache
// then pool (heap locks, named by where they were initialised).
func poolInversion(b *fxTrace) {
	b.thread(31, "alloc-1")
	b.thread(32, "evictor")
	b.ev(events.Event{TID: 31, Op: events.OpMutexInit, Addr: addrPool}, "pthread_mutex_init"+libc, "pool_create@libpool.so", "main")
	b.ev(events.Event{TID: 31, Op: events.OpMutexInit, Addr: addrCache}, "pthread_mutex_init"+libc, "cache_create@libpool.so", "main")
	b.lock(31, addrPool, "pthread_mutex_lock"+libc, "pool_get@libpool.so", "worker")
	b.lock(31, addrCache, "pthread_mutex_lock"+libc, "cache_fill@libpool.so", "pool_get@libpool.so", "worker")
	// Released out of order: pool first.
	b.unlock(31, addrPool)
	b.unlock(31, addrCache)
	b.lock(32, addrCache, "pthread_mutex_lock"+libc, "cache_evict@libpool.so", "evictor_main")
	b.lock(32, addrPool, "pthread_mutex_lock"+libc, "pool_put@libpool.so", "cache_evict@libpool.so", "evictor_main")
	b.unlock(32, addrPool)
	b.unlock(32, addrCache)
}

func seedTrace() *fxTrace {
	b := newFx(&events.Header{Command: []string{"./app", "--seed"}, Allocator: "glibc"})
	b.name(addrVMA, "vma_lock (librcache.so)")
	b.name(addrA, "lock_a (libstage.so)")
	b.name(addrB, "lock_b (libstage.so)")
	b.name(addrC, "lock_c (libstage.so)")
	b.name(addrStats, "stats_lock (libstats.so)")
	openMPIDeadlock(b)
	timedCycle(b)
	statsHook(b)
	b.footer()
	return b
}

func regressTrace() *fxTrace {
	b := newFx(&events.Header{Command: []string{"./app", "--regress"}, Allocator: "glibc", Mode: "full",
		UserProbes: []string{"_intercept_madvise", "progress_loop"}})
	b.name(addrVMA, "vma_lock (librcache.so)")
	b.name(addrStats, "stats_lock (libstats.so)")
	b.name(addrQueue, "queue_mutex (app)")
	// Allocator calls with no lock held (full mode sends them).
	b.thread(40, "main")
	b.ev(events.Event{TID: 40, Op: events.OpMalloc, Size: 1024, Addr: 0}, "malloc"+libc, "main")
	b.ev(events.Event{TID: 40, Op: events.OpCalloc, Size: 4096}, "calloc"+libc, "main")
	b.ev(events.Event{TID: 40, Op: events.OpThreadCreate, Arg: 12})
	// The progress thread runs a probed progress loop, waits on a
	// condition, and its madvise hook is probed too.
	b.ev(events.Event{TID: 12, Op: events.OpProbeEnter, Arg: 1}, "progress_loop", "thread_start")
	b.lock(12, addrQueue, "pthread_mutex_lock"+libc, "progress_loop", "thread_start")
	b.ev(events.Event{TID: 12, Op: events.OpCondWait, Addr: addrCond, Addr2: addrQueue}, "pthread_cond_wait"+libc, "progress_loop")
	b.ev(events.Event{TID: 12, Op: events.OpCondWait, Flags: events.FlagReturn, Addr: addrCond, Addr2: addrQueue}, "pthread_cond_wait"+libc, "progress_loop")
	b.unlock(12, addrQueue)
	openMPIDeadlock(b)
	b.ev(events.Event{TID: 12, Op: events.OpProbeExit, Flags: events.FlagReturn, Arg: 1})
	statsHook(b)
	poolInversion(b)
	b.ev(events.Event{TID: 40, Op: events.OpFree, Addr: 0x7f5000000010, Size: 1040}, "free"+libc, "main")
	b.ev(events.Event{TID: 31, Op: events.OpThreadExit})
	b.footer()
	return b
}

var fixtures = []struct {
	name  string
	build func() *fxTrace
}{
	{"seed", seedTrace},
	{"regress", regressTrace},
}

// TestFixtures writes the fixture traces with -update, and otherwise
// checks that the committed ones are what the builders make.
func TestFixtures(t *testing.T) {
	for _, fx := range fixtures {
		var buf bytes.Buffer
		w := events.NewWriter(&buf)
		for _, r := range fx.build().recs {
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
