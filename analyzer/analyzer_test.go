package analyzer

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

// scenarioMix is several findings at once: an inversion between heap
// locks, the Open MPI hook deadlock, a self-deadlock, re-entry and a
// forbidden nesting.
func scenarioMix(b *tracebuild.Trace) {
	b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "pool_create@libpool.so")
	b.Lock(1, heapP, "pthread_mutex_lock"+libc, "pool_get@libpool.so")
	b.Lock(1, heapQ, "pthread_mutex_lock"+libc, "cache_fill@libpool.so")
	b.Unlock(1, heapQ).Unlock(1, heapP)
	b.Lock(2, heapQ, "pthread_mutex_lock"+libc, "cache_evict@libpool.so")
	b.Lock(2, heapP, "pthread_mutex_lock"+libc, "pool_put@libpool.so")
	b.Unlock(2, heapP).Unlock(2, heapQ)
	openMPIThreadA(b, 3)
	openMPIThreadB(b, 4, shrinkHeapHookStack...)
	b.Lock(5, lockM, "pthread_mutex_lock"+libc, "enqueue")
	b.Lock(5, lockM, "pthread_mutex_lock"+libc, "enqueue_again")
	b.Alloc(6, events.OpFree, 0x7f2000000010, 0x1000, "free"+libc, "drop")
	b.InAlloc(6, events.OpMalloc, 0, events.OpFree, "malloc"+libc, "hook_log"+rcache, "_intercept_munmap"+rcache, "munmap_chunk"+libc, "free"+libc)
	b.Probe(7, events.OpProbeEnter, 0, "progress", "wait_all")
	b.Probe(7, events.OpProbeEnter, 1, "user_callback", "dispatch", "progress", "wait_all")
}

func mixHeader() *events.Header {
	return &events.Header{UserProbes: []string{"progress", "user_callback"}, Forbid: []string{"progress>user_callback"}}
}

func findingIDs(res *Result) []string {
	var ids []string
	for _, f := range res.Findings {
		ids = append(ids, f.ID)
	}
	sort.Strings(ids)
	return ids
}

func TestIDStability(t *testing.T) {
	build := func(pid, tidBase uint32, addrBase, frameBase uint64) *Result {
		b := tracebuild.New(pid, mixHeader())
		b.TIDBase, b.AddrBase, b.FrameBase = tidBase, addrBase, frameBase
		named(b)
		scenarioMix(b)
		b.Footer(nil)
		return analyze(Options{}, b)
	}
	one := build(100, 0, 0, 0)
	two := build(4242, 9000, 0x10000, 0x7000000)
	if len(one.Findings) != 5 {
		for _, f := range one.Findings {
			t.Logf("%s %s", f.ID, f.Title)
		}
		t.Fatalf("%d findings, want 5", len(one.Findings))
	}
	if a, b := findingIDs(one), findingIDs(two); !reflect.DeepEqual(a, b) {
		t.Fatalf("IDs moved with addresses/TIDs/PIDs:\n%v\n%v", a, b)
	}
	seen := map[string]bool{}
	for _, f := range one.Findings {
		if seen[f.ID] {
			t.Errorf("duplicate ID %s", f.ID)
		}
		seen[f.ID] = true
		if !strings.HasPrefix(f.ID, string(f.Kind)+"-") {
			t.Errorf("ID %s not prefixed by its kind", f.ID)
		}
	}
}

// TestIDsIgnoreFirstSighting: a finding's ID is what it is, not which of
// its sightings came first. The same sightings in two orders (which
// allocator call a hook was first seen in, which hooked call, which site
// held a lock around free first, which site re-took an error-checking
// mutex first) give the same IDs; the titles name every allocator call.
func TestIDsIgnoreFirstSighting(t *testing.T) {
	const hookLock = 0x601300
	sbrkHook := []string{"pthread_mutex_lock" + libc, "ucm_event_enter@libucm.so", "ucm_sbrk@libucm.so",
		"__glibc_morecore" + libc, "sysmalloc" + libc, "_int_malloc" + libc, "_int_realloc" + libc, "realloc" + libc, "grow"}
	munmapHook := []string{"pthread_mutex_lock" + libc, "ucm_event_enter_exclusive@libucm.so", "ucm_munmap@libucm.so",
		"munmap" + libc, "alloc_new_heap" + libc, "new_heap" + libc, "sysmalloc" + libc, "_int_malloc" + libc, "malloc" + libc, "get"}
	pieces := [][2]func(b *tracebuild.Trace){
		{func(b *tracebuild.Trace) {
			b.Alloc(1, events.OpRealloc, 0x7f0000100010, 4096, "realloc"+libc, "grow")
			b.InAlloc(1, events.OpMutexLock, hookLock, events.OpRealloc, sbrkHook...)
			b.Unlock(1, hookLock)
		}, func(b *tracebuild.Trace) {
			b.Alloc(2, events.OpMalloc, 0, 64, "malloc"+libc, "get")
			b.InAlloc(2, events.OpMutexLock, hookLock, events.OpMalloc, munmapHook...)
			b.Unlock(2, hookLock)
		}},
		{func(b *tracebuild.Trace) {
			b.Lock(3, vma, "pthread_mutex_lock"+libc, "vma_insert"+rcache)
			b.Alloc(3, events.OpFree, 0x7f0000200010, 32, "free"+libc, "vma_insert"+rcache)
			b.Unlock(3, vma)
		}, func(b *tracebuild.Trace) {
			b.Lock(4, vma, "pthread_mutex_lock"+libc, "vma_remove"+rcache)
			b.Alloc(4, events.OpFree, 0x7f0000300010, 32, "free"+libc, "vma_remove"+rcache)
			b.Unlock(4, vma)
		}},
		{func(b *tracebuild.Trace) {
			b.LockKind(6, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "enqueue")
			b.LockKind(6, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "enqueue_again")
			b.Unlock(6, lockM)
		}, func(b *tracebuild.Trace) {
			b.LockKind(7, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "requeue")
			b.LockKind(7, lockM, events.MutexErrorCheck, "pthread_mutex_lock"+libc, "requeue_again")
			b.Unlock(7, lockM)
		}},
	}
	build := func(swap bool) *Result {
		b := named(tracebuild.New(100, nil)).Name(hookLock, "event_lock (libucm.so)")
		openMPIThreadB(b, 5, shrinkHeapHookStack...)
		for _, p := range pieces {
			if swap {
				p[1](b)
				p[0](b)
			} else {
				p[0](b)
				p[1](b)
			}
		}
		return analyze(Options{}, b.Footer(nil))
	}
	one, two := build(false), build(true)
	for _, f := range one.Findings {
		t.Logf("%s %s %s", f.ID, f.Severity, f.Title)
	}
	if a, b := findingIDs(one), findingIDs(two); !reflect.DeepEqual(a, b) {
		t.Fatalf("IDs moved with the order of sightings:\n%v\n%v", a, b)
	}
	want := map[Kind]int{KindHookLock: 1, KindSelfDeadlock: 2}
	for kind, n := range want {
		if got := len(ofKind(one, kind)); got != n {
			t.Errorf("%d %s findings, want %d", got, kind, n)
		}
	}
	for _, res := range []*Result{one, two} {
		hook := ofKind(res, KindHookLock)
		if len(hook) != 1 || hook[0].Title != "memory hook takes event_lock (libucm.so) inside malloc and realloc" ||
			!strings.HasPrefix(hook[0].Detail, "First seen: ") || hook[0].Occurrences != 1 || len(hook[0].Edges) != 2 {
			t.Fatalf("hook-lock: %+v", hook)
		}
		// One example per allocator call, in a fixed order.
		for i, fn := range []string{"malloc", "realloc"} {
			if e := hook[0].Edges[i]; !contains(stackFunctions(e.Stack), fn) || e.Arena != "held" {
				t.Errorf("edge %d: %s, arena %s, stack %v; want %s's", i, e.Context, e.Arena, stackFunctions(e.Stack), fn)
			}
		}
	}
}

func TestDeterministicJSON(t *testing.T) {
	var outs []string
	for i := 0; i < 3; i++ {
		b := named(tracebuild.New(100, mixHeader()))
		scenarioMix(b)
		b.Footer(nil)
		js, err := json.Marshal(analyze(Options{}, b))
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, string(js))
	}
	for _, o := range outs[1:] {
		if o != outs[0] {
			t.Fatal("results differ between identical runs")
		}
	}
}

func TestMergeStreams(t *testing.T) {
	// Two ranks run the same code; their stack IDs, PIDs and TIDs are the
	// same numbers but mean different things.
	rank := func(fnPrefix string) *tracebuild.Trace {
		b := named(tracebuild.New(100, nil))
		lk(b, 1, lockA, fnPrefix+"_a_first")
		lk(b, 1, lockB, fnPrefix+"_b_under_a")
		b.Unlock(1, lockB).Unlock(1, lockA)
		lk(b, 2, lockB, fnPrefix+"_b_first")
		lk(b, 2, lockA, fnPrefix+"_a_under_b")
		b.Unlock(2, lockA).Unlock(2, lockB)
		return b.Footer(nil)
	}
	res := analyze(Options{}, rank("rank0"), rank("rank1"))
	cycles := ofKind(res, KindLockOrderCycle)
	if len(cycles) != 1 || cycles[0].Occurrences != 2 {
		t.Fatalf("want one merged cycle seen twice, got %d", len(cycles))
	}
	if fn := stackFunctions(cycles[0].Edges[0].Stack); !contains(fn, "rank0_b_under_a") {
		t.Errorf("edge stack from the wrong stream: %v", fn)
	}
	if len(cycles[0].Instances) != 2 {
		t.Errorf("instances %v", cycles[0].Instances)
	}
	if res.Stats.Threads != 4 || res.Stats.Events != 16 || len(res.Stats.Traces) != 2 || !res.Stats.Complete {
		t.Errorf("stats %+v", res.Stats)
	}
}

func TestStreamsDoNotCollide(t *testing.T) {
	// A → B in one trace and B → A in another are different processes:
	// no cycle. Stack ID 1 means different stacks in each.
	one := named(tracebuild.New(100, nil))
	lk(one, 1, lockA, "one_a")
	lk(one, 1, lockB, "one_b")
	one.Footer(nil)
	two := named(tracebuild.New(100, nil))
	lk(two, 1, lockB, "two_b")
	lk(two, 1, lockA, "two_a")
	two.Footer(nil)
	res := analyze(Options{}, one, two)
	if len(res.Findings) != 0 {
		t.Fatalf("findings across streams: %+v", res.Findings)
	}
	// Without BeginStream, a second Header starts the second stream too.
	a := New(Options{})
	for _, r := range append(one.Records(), two.Records()...) {
		a.Add(r)
	}
	if res := a.Result(); len(res.Findings) != 0 || len(res.Stats.Traces) != 2 {
		t.Fatalf("header did not start a stream: %d findings, %d traces", len(res.Findings), len(res.Stats.Traces))
	}
}

func TestIncompleteStats(t *testing.T) {
	complete := named(tracebuild.New(1, nil))
	lk(complete, 1, lockA, "f")
	complete.Footer(nil)

	lost := named(tracebuild.New(1, nil))
	lk(lost, 1, lockA, "f")
	lost.Lost(1234).Footer(nil)

	cut := named(tracebuild.New(1, nil))
	lk(cut, 1, lockA, "f")

	footerLost := named(tracebuild.New(1, nil))
	footerLost.Footer(&events.Footer{Lost: 7})

	unrecorded := named(tracebuild.New(1, nil))
	unrecorded.Footer(&events.Footer{Unrecorded: 2})

	for _, c := range []struct {
		name     string
		tr       *tracebuild.Trace
		complete bool
		why      string
	}{
		{"complete", complete, true, ""},
		{"lost records", lost, false, "1234 events lost"},
		{"no footer", cut, false, "trace cut short: no footer"},
		{"lost in footer", footerLost, false, "7 events lost"},
		{"processes that could not record", unrecorded, false, "2 processes could not record"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := analyze(Options{}, c.tr).Stats
			if st.Complete != c.complete || st.Incomplete != c.why {
				t.Errorf("complete=%v %q, want %v %q", st.Complete, st.Incomplete, c.complete, c.why)
			}
		})
	}
	st := analyze(Options{}, complete, cut).Stats
	if st.Complete || !strings.Contains(st.Incomplete, "trace1: trace cut short") {
		t.Errorf("merged: %v %q", st.Complete, st.Incomplete)
	}
	if st := analyze(Options{}, unrecorded, unrecorded).Stats; st.UnrecordedProcesses != 4 {
		t.Errorf("merged: %d processes could not record, want 4", st.UnrecordedProcesses)
	}
}

func TestCallsCounting(t *testing.T) {
	build := func() *tracebuild.Trace {
		b := named(tracebuild.New(1, nil))
		b.Alloc(1, events.OpMalloc, 0, 8, "malloc"+libc)
		b.Alloc(1, events.OpMalloc, 0, 8, "malloc"+libc)
		b.Alloc(1, events.OpFree, 0x10, 8, "free"+libc)
		lk(b, 1, lockA, "f")
		b.Unlock(1, lockA)
		b.TryResult(1, events.OpMutexTrylock, lockA, true)
		b.Unlock(1, lockA)
		b.TryResult(1, events.OpMutexTrylock, lockA, false)
		lk(b, 1, lockM, "f")
		b.CondWait(1, condV, lockM)
		b.CondReturn(1, condV, lockM)
		b.Unlock(1, lockM)
		return b
	}
	want := map[string]uint64{
		"malloc": 2, "free": 1, "pthread_mutex_lock": 2, "pthread_mutex_unlock": 3,
		"pthread_mutex_trylock": 2, "pthread_cond_wait": 1,
	}
	if got := analyze(Options{}, build().Footer(nil)).Stats.Calls; !reflect.DeepEqual(got, want) {
		t.Errorf("calls from events %v, want %v", got, want)
	}
	footerCalls := map[string]uint64{"malloc": 1000, "free": 990, "pthread_mutex_lock": 5}
	res := analyze(Options{}, build().Footer(&events.Footer{Calls: footerCalls}), build().Footer(&events.Footer{Calls: footerCalls}))
	want = map[string]uint64{"malloc": 2000, "free": 1980, "pthread_mutex_lock": 10}
	if got := res.Stats.Calls; !reflect.DeepEqual(got, want) {
		t.Errorf("calls from footers %v, want %v", got, want)
	}
}

func TestExitStatus(t *testing.T) {
	status := 3
	b := tracebuild.New(1, nil).Footer(&events.Footer{ExitStatus: &status, Reason: "target exited"})
	st := analyze(Options{}, b).Stats
	if st.ExitStatus == nil || *st.ExitStatus != 3 || st.Traces[0].Reason != "target exited" {
		t.Errorf("exit %v reason %q", st.ExitStatus, st.Traces[0].Reason)
	}
}

func TestLockNaming(t *testing.T) {
	b := tracebuild.New(1, nil)
	b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "reg_init@librcache.so")
	b.Lock(1, heapP, "pthread_mutex_lock"+libc, "reg_lookup@librcache.so")
	b.Lock(1, heapQ, "pthread_mutex_lock"+libc, "worker")
	b.Lock(1, lockA, "pthread_mutex_lock"+libc, "worker")
	b.Unlock(1, lockA).Unlock(1, heapQ).Unlock(1, heapP)
	b.Name(lockA, "late_lock (libx.so)") // named after its first use
	b.Lock(2, lockA, "pthread_mutex_lock"+libc, "other")
	b.Lock(2, heapP, "pthread_mutex_lock"+libc, "other")
	b.Footer(nil)
	res := analyze(Options{}, b)
	var locks []string
	for _, f := range ofKind(res, KindLockOrderCycle) {
		locks = append(locks, f.Locks...)
	}
	for _, w := range []string{
		"mutex initialised at reg_init+0x8 (librcache.so)",
		"late_lock (libx.so)",
	} {
		if !contains(locks, w) {
			t.Errorf("no lock named %q in %v", w, locks)
		}
	}
	n := New(Options{})
	for _, r := range b.Records() {
		n.Add(r)
	}
	names := n.nameInstances()
	var all []string
	for _, inst := range n.instances {
		if inst.used {
			all = append(all, names.of(inst))
		}
	}
	if !contains(all, "mutex first taken at worker+0x8 (prog)") {
		t.Errorf("names %v", all)
	}
}

func TestReusedAddressLabels(t *testing.T) {
	// Two lifetimes of one address in one process, both on cycles (taken
	// on different paths, so they are not folded twins): the labels tell
	// them apart.
	b := tracebuild.New(1, nil)
	for gen := 0; gen < 2; gen++ {
		b.Op(1, events.OpMutexInit, heapP, 0, "pthread_mutex_init"+libc, "obj_new")
		b.Lock(1, heapP, "pthread_mutex_lock"+libc, "obj_update")
		b.Lock(1, heapQ, "pthread_mutex_lock"+libc, []string{"obj_update", "obj_update_again"}[gen])
		b.Unlock(1, heapQ).Unlock(1, heapP)
		b.Lock(2, heapQ, "pthread_mutex_lock"+libc, "list_walk")
		b.Lock(2, heapP, "pthread_mutex_lock"+libc, "list_walk")
		b.Unlock(2, heapP).Unlock(2, heapQ)
		b.Op(1, events.OpMutexDestroy, heapP, 0)
	}
	res := analyze(Options{}, b.Footer(nil))
	if len(res.Findings) != 1 || res.Findings[0].Occurrences != 2 {
		t.Fatalf("want one finding seen twice: %+v", res.Findings)
	}
	sets := fmt.Sprint(res.Findings[0].Instances)
	if !strings.Contains(sets, "obj_new+0x8 (prog) #1") || !strings.Contains(sets, "obj_new+0x8 (prog) #2") {
		t.Errorf("instances %s", sets)
	}
}

func TestDedupPerObjectInversions(t *testing.T) {
	// A thousand objects, each with its own pair of locks taken in both
	// orders: one finding, listing a capped number of instance sets.
	b := tracebuild.New(1, nil)
	for i := uint64(0); i < 1000; i++ {
		p, q := 0x7f0000000000+i*0x100, 0x7f0000000040+i*0x100
		b.Op(1, events.OpMutexInit, p, 0, "pthread_mutex_init"+libc, "conn_new")
		b.Op(1, events.OpMutexInit, q, 0, "pthread_mutex_init"+libc, "conn_new_queue")
		b.Lock(1, p, "pthread_mutex_lock"+libc, "conn_send")
		b.Lock(1, q, "pthread_mutex_lock"+libc, "conn_send")
		b.Unlock(1, q).Unlock(1, p)
		b.Lock(2, q, "pthread_mutex_lock"+libc, "conn_recv")
		b.Lock(2, p, "pthread_mutex_lock"+libc, "conn_recv")
		b.Unlock(2, p).Unlock(2, q)
	}
	res := analyze(Options{}, b.Footer(nil))
	if len(res.Findings) != 1 {
		t.Fatalf("%d findings", len(res.Findings))
	}
	f := res.Findings[0]
	if f.Occurrences != 1000 || len(f.Instances) != maxInstanceSets {
		t.Errorf("occurrences %d, instance sets %d", f.Occurrences, len(f.Instances))
	}
}

func TestExecEndsLocks(t *testing.T) {
	b := named(tracebuild.New(1, nil))
	lk(b, 1, lockA, "f")
	lk(b, 1, lockB, "f")
	b.Op(1, events.OpExec, 0, 0)
	lk(b, 1, lockB, "g")
	lk(b, 1, lockA, "g")
	if res := analyze(Options{}, b.Footer(nil)); len(res.Findings) != 0 {
		t.Fatalf("locks of the old image joined the new one: %+v", res.Findings)
	}
}

func TestDeadlockFindings(t *testing.T) {
	st := &events.Stack{Frames: []events.Frame{{Function: "__lll_lock_wait", Object: "/lib/libc.so.6"}, {Function: "pthread_mutex_lock"}, {Function: "vma_insert", Object: "/usr/lib/librcache.so"}}}
	waits := []Wait{
		{PID: 1, TID: 11, WaitingFor: 0xa0, Lock: "vma_lock (librcache.so)", Owner: 12, Stack: st},
		{PID: 1, TID: 12, WaitingFor: 0xb0, Lock: "list_lock (librcache.so)", Owner: 11, Stack: st},
		{PID: 1, TID: 13, WaitingFor: 0xa0, Lock: "vma_lock (librcache.so)", Owner: 12}, // waits, not on the cycle
		{PID: 1, TID: 14, WaitingFor: 0xc0, Owner: 14, Stack: st},                       // waits for itself
		{PID: 1, TID: 15, WaitingFor: 0xd0, Owner: 0},                                   // owner unknown
	}
	fs := DeadlockFindings(waits)
	if len(fs) != 2 {
		t.Fatalf("%d findings: %+v", len(fs), fs)
	}
	ring := fs[0]
	if ring.Kind != KindDeadlock || ring.Severity != SeverityError || fmt.Sprint(ring.Threads) != "[11 12]" || len(ring.Edges) != 2 {
		t.Errorf("ring %+v", ring)
	}
	if !contains(ring.Locks, "vma_lock (librcache.so)") || !contains(ring.Locks, "list_lock (librcache.so)") {
		t.Errorf("locks %v", ring.Locks)
	}
	if self := fs[1]; len(self.Locks) != 1 || fmt.Sprint(self.Threads) != "[14]" {
		t.Errorf("self %+v", self)
	}
	// The same hang with other TIDs and addresses keeps its IDs.
	moved := append([]Wait(nil), waits...)
	for i := range moved {
		moved[i].TID += 100
		if moved[i].Owner != 0 {
			moved[i].Owner += 100
		}
		moved[i].WaitingFor += 0x1000
	}
	fs2 := DeadlockFindings(moved)
	if len(fs2) != 2 || fs2[0].ID != ring.ID || fs2[1].ID != fs[1].ID {
		t.Errorf("IDs moved: %v %v", fs2[0].ID, ring.ID)
	}
	if fs := DeadlockFindings(waits[2:3]); len(fs) != 0 {
		t.Errorf("a chain without a cycle: %+v", fs)
	}
	res := &Result{}
	res.AddFindings(fs...)
	if !res.Fails(SeverityError) {
		t.Error("a hang must fail the error threshold")
	}
}

func TestSeverityThreshold(t *testing.T) {
	res := &Result{Findings: []Finding{{Severity: SeverityInfo}, {Severity: SeverityWarning}}}
	if res.MaxSeverity() != SeverityWarning || res.Fails(SeverityError) || !res.Fails(SeverityWarning) || !res.Fails(SeverityInfo) {
		t.Errorf("max %s", res.MaxSeverity())
	}
	if (&Result{}).Fails(SeverityInfo) {
		t.Error("no findings cannot fail")
	}
	for _, s := range []string{"info", "warning", "warn", "error"} {
		if _, err := ParseSeverity(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseSeverity("fatal"); err == nil {
		t.Error("fatal accepted")
	}
}

func TestParseRule(t *testing.T) {
	r, err := ParseRule(" progress > user_callback ")
	if err != nil || r != (Rule{Outer: "progress", Inner: "user_callback"}) || r.String() != "progress>user_callback" {
		t.Errorf("%v %v", r, err)
	}
	// C++ names as a debugger prints them: split at the top-level '>'.
	cxx := "my_internal_fn(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>)>upcxx::detail::persona_tls::burst_user"
	r, err = ParseRule(cxx)
	if err != nil || r.Outer != "my_internal_fn(int, upcxx::global_ptr<int, (upcxx::memory_kind)1>)" ||
		r.Inner != "upcxx::detail::persona_tls::burst_user" {
		t.Errorf("%q: %v %v", cxx, r, err)
	}
	for _, bad := range []string{"", "progress", ">x", "x>", "a>b>c", "f<int>g", "f(int>g"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	b := tracebuild.New(1, &events.Header{Forbid: []string{"nonsense"}}).Footer(nil)
	if st := analyze(Options{}, b).Stats; len(st.Warnings) != 1 {
		t.Errorf("warnings %v", st.Warnings)
	}
}

func TestDecideArena(t *testing.T) {
	stack := func(truncated bool, fns ...string) *events.Stack {
		st := &events.Stack{Truncated: truncated}
		for _, f := range fns {
			st.Frames = append(st.Frames, events.Frame{Function: f})
		}
		return st
	}
	for _, c := range []struct {
		st   *events.Stack
		want arenaHold
	}{
		{stack(false, "hook", "shrink_heap", "heap_trim", "_int_free", "free"), holdHeld},
		{stack(false, "hook", "shrink_heap.isra.0", "_int_free"), holdHeld},
		{stack(false, "hook", "mtrim", "__malloc_trim"), holdHeld},
		{stack(false, "hook", "munmap_chunk", "free"), holdNotHeld},
		// munmap_chunk inlined into free: free is the nearest allocator frame.
		{stack(false, "pthread_mutex_lock", "hook", "free", "worker"), holdNotHeld},
		{stack(false, "hook", "alloc_new_heap", "new_heap", "_int_new_arena", "arena_get2", "malloc"), holdNotHeld},
		{stack(false, "hook", "alloc_new_heap", "new_heap", "sysmalloc", "_int_malloc", "malloc"), holdHeld},
		{stack(true, "hook"), holdMaybe},
		{stack(false, "hook", "worker"), holdMaybe},
		{nil, holdMaybe},
	} {
		if got, why := decideArena(c.st); got != c.want || why == "" {
			var fns []string
			if c.st != nil {
				for _, f := range c.st.Frames {
					fns = append(fns, f.Function)
				}
			}
			t.Errorf("%v: %s (%s), want %s", fns, got, why, c.want)
		}
	}
}

func TestMemoryBoundedByLocks(t *testing.T) {
	// Millions of events over a fixed set of locks and stacks leave the
	// analyzer's tables the same size.
	recs := syntheticStream(8, 2000)
	a := New(Options{})
	for _, r := range recs {
		a.Add(r)
	}
	inst, edges := len(a.instances), len(a.edges)
	for i := 0; i < 3; i++ {
		for _, r := range recs[1:] { // skip the header: same stream
			if r.Kind == events.RecEvent {
				a.Add(r)
			}
		}
	}
	if len(a.instances) != inst || len(a.edges) != edges {
		t.Errorf("tables grew with events: instances %d → %d, edges %d → %d", inst, len(a.instances), edges, len(a.edges))
	}
}

func TestForkKeepsLockNames(t *testing.T) {
	b := named(tracebuild.New(100, nil))
	b.Event(events.Event{TID: 100, Op: events.OpThreadCreate, Flags: events.FlagProcess, Arg: 200})
	b.PID = 200
	lk(b, 200, lockA, "child")
	lk(b, 200, lockB, "child")
	b.Unlock(200, lockB).Unlock(200, lockA)
	lk(b, 201, lockB, "child")
	lk(b, 201, lockA, "child")
	res := analyze(Options{}, b.Footer(nil))
	if len(res.Findings) != 1 || !contains(res.Findings[0].Locks, "lock_a (libx.so)") {
		t.Fatalf("findings %+v", res.Findings)
	}
}
