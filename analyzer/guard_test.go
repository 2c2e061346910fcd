package analyzer

import (
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

const (
	gateL  = 0x601300
	cacheL = 0x601340
	statsL = 0x601380
)

func gated(b *tracebuild.Trace) *tracebuild.Trace {
	return b.Name(gateL, "gate_lock (srv)").Name(cacheL, "cache_lock (srv)").Name(statsL, "stats_lock (srv)")
}

// inverted: thread tid takes first then second, under gate when gate is
// nonzero.
func inverted(b *tracebuild.Trace, tid uint32, gate, first, second uint64, fn string) {
	if gate != 0 {
		lk(b, tid, gate, fn)
	}
	lk(b, tid, first, fn)
	lk(b, tid, second, fn)
	b.Unlock(tid, second).Unlock(tid, first)
	if gate != 0 {
		b.Unlock(tid, gate)
	}
}

func guardCases() []ruleCase {
	return []ruleCase{
		{
			name: "guarded inversion: a warning naming the gate",
			build: func(b *tracebuild.Trace) {
				gated(b)
				inverted(b, 1, gateL, cacheL, statsL, "update_cache")
				inverted(b, 2, gateL, statsL, cacheL, "report_stats")
			},
			want: []want{{KindLockOrderCycle, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if f.Gate != "gate_lock (srv)" || !strings.Contains(f.Title, "guarded by gate_lock (srv)") {
					t.Errorf("gate %q title %q", f.Gate, f.Title)
				}
				if !strings.Contains(f.Detail, "cannot deadlock while every path holds gate_lock (srv); it will the day one path stops taking it") {
					t.Errorf("detail %s", f.Detail)
				}
				if contains(f.Locks, "gate_lock (srv)") {
					t.Errorf("the gate is not on the cycle: %v", f.Locks)
				}
			},
		},
		{
			name: "one path skips the gate: an error",
			build: func(b *tracebuild.Trace) {
				gated(b)
				inverted(b, 1, gateL, cacheL, statsL, "update_cache")
				inverted(b, 2, gateL, statsL, cacheL, "report_stats")
				inverted(b, 3, 0, statsL, cacheL, "fast_path_stats")
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if res.Findings[0].Gate != "" {
					t.Errorf("gate %q", res.Findings[0].Gate)
				}
			},
		},
		{
			name: "each path under a different lock: an error",
			build: func(b *tracebuild.Trace) {
				gated(b)
				inverted(b, 1, gateL, cacheL, statsL, "update_cache")
				inverted(b, 2, lockC, statsL, cacheL, "report_stats")
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
		},
		{
			name: "gate held for reading excludes nothing: an error",
			build: func(b *tracebuild.Trace) {
				gated(b)
				for _, p := range []struct {
					tid           uint32
					first, second uint64
				}{{1, cacheL, statsL}, {2, statsL, cacheL}} {
					b.RWLock(p.tid, events.OpRwlockRdlock, gateL, 0, "pthread_rwlock_rdlock"+libc, "reader")
					lk(b, p.tid, p.first, "reader")
					lk(b, p.tid, p.second, "reader")
					b.Unlock(p.tid, p.second).Unlock(p.tid, p.first).RWUnlock(p.tid, gateL)
				}
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
		},
		{
			name: "gate taken as a recursive mutex twice still guards",
			build: func(b *tracebuild.Trace) {
				gated(b)
				b.LockKind(1, gateL, events.MutexRecursive, "pthread_mutex_lock"+libc, "outer")
				inverted(b, 1, 0, cacheL, statsL, "update_cache")
				b.Unlock(1, gateL)
				b.LockKind(2, gateL, events.MutexRecursive, "pthread_mutex_lock"+libc, "outer")
				inverted(b, 2, 0, statsL, cacheL, "report_stats")
				b.Unlock(2, gateL)
			},
			want: []want{{KindLockOrderCycle, SeverityWarning}},
		},
		{
			// Per instance: objects of one class, each with its own gate
			// and pair; the class finding is guarded while every instance
			// cycle is, and names the gate's class.
			name: "per instance: every object's cycle under its own gate",
			build: func(b *tracebuild.Trace) {
				for i, base := range []uint64{0x7f0000100000, 0x7f0000200000} {
					tid := uint32(10 * (i + 1))
					b.Op(tid, events.OpMutexInit, base, 0, "pthread_mutex_init"+libc, "obj_gate_init")
					b.Op(tid, events.OpMutexInit, base+0x40, 0, "pthread_mutex_init"+libc, "obj_a_init")
					b.Op(tid, events.OpMutexInit, base+0x80, 0, "pthread_mutex_init"+libc, "obj_b_init")
					inverted(b, tid, base, base+0x40, base+0x80, "obj_update")
					inverted(b, tid+1, base, base+0x80, base+0x40, "obj_report")
				}
			},
			want: []want{{KindLockOrderCycle, SeverityWarning}},
			check: func(t *testing.T, res *Result) {
				f := res.Findings[0]
				if !strings.HasPrefix(f.Gate, "mutex initialised at obj_gate_init") || f.Occurrences != 2 {
					t.Errorf("gate %q occurrences %d", f.Gate, f.Occurrences)
				}
			},
		},
		{
			name: "per instance: one object's cycle unguarded makes the class an error",
			build: func(b *tracebuild.Trace) {
				for i, base := range []uint64{0x7f0000100000, 0x7f0000200000} {
					tid := uint32(10 * (i + 1))
					b.Op(tid, events.OpMutexInit, base, 0, "pthread_mutex_init"+libc, "obj_gate_init")
					b.Op(tid, events.OpMutexInit, base+0x40, 0, "pthread_mutex_init"+libc, "obj_a_init")
					b.Op(tid, events.OpMutexInit, base+0x80, 0, "pthread_mutex_init"+libc, "obj_b_init")
					gate := base
					if i == 1 {
						gate = 0
					}
					inverted(b, tid, base, base+0x40, base+0x80, "obj_update")
					inverted(b, tid+1, gate, base+0x80, base+0x40, "obj_report")
				}
			},
			want: []want{{KindLockOrderCycle, SeverityError}},
			check: func(t *testing.T, res *Result) {
				if res.Findings[0].Gate != "" || res.Findings[0].Occurrences != 2 {
					t.Errorf("gate %q occurrences %d", res.Findings[0].Gate, res.Findings[0].Occurrences)
				}
			},
		},
	}
}

func TestGuardedCycles(t *testing.T) {
	runRuleCases(t, guardCases())
}
