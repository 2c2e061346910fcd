package analyzer

import (
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// Spinlocks and rwlocks have lifetimes as mutexes do: destroying one, or
// initialising another at its address, makes a new lock there.
func TestLifetimesOfEveryKind(t *testing.T) {
	kinds := []struct {
		name                string
		lock, unlock        events.Op
		init, destroy       events.Op
		initFn, lockFn      string
		destroyFn, unlockFn string
	}{
		{"spinlock", events.OpSpinLock, events.OpSpinUnlock, events.OpSpinInit, events.OpSpinDestroy,
			"pthread_spin_init", "pthread_spin_lock", "pthread_spin_destroy", "pthread_spin_unlock"},
		{"rwlock", events.OpRwlockWrlock, events.OpRwlockUnlock, events.OpRwlockInit, events.OpRwlockDestroy,
			"pthread_rwlock_init", "pthread_rwlock_wrlock", "pthread_rwlock_destroy", "pthread_rwlock_unlock"},
	}
	for _, k := range kinds {
		take := func(b *tracebuild.Trace, tid uint32, first, second uint64, fn string) {
			for _, l := range []uint64{first, second} {
				b.Event(events.Event{TID: tid, Op: k.lock, Flags: events.FlagAcquired, Addr: l}, k.lockFn+libc, fn)
			}
			b.Event(events.Event{TID: tid, Op: k.unlock, Addr: second})
			b.Event(events.Event{TID: tid, Op: k.unlock, Addr: first})
		}
		for _, c := range []struct {
			name    string
			between func(b *tracebuild.Trace)
			cycle   bool
		}{
			{"kept alive", func(b *tracebuild.Trace) {}, true},
			{"destroyed", func(b *tracebuild.Trace) {
				b.Op(1, k.destroy, heapP, 0, k.destroyFn+libc, "obj_free")
				b.Op(1, k.destroy, heapQ, 0, k.destroyFn+libc, "obj_free")
			}, false},
			{"initialised again", func(b *tracebuild.Trace) {
				b.Op(1, k.init, heapP, 0, k.initFn+libc, "obj_new")
				b.Op(1, k.init, heapQ, 0, k.initFn+libc, "obj_new")
			}, false},
		} {
			b := tracebuild.New(1, nil)
			b.Op(1, k.init, heapP, 0, k.initFn+libc, "obj_new")
			b.Op(1, k.init, heapQ, 0, k.initFn+libc, "obj_new")
			take(b, 1, heapP, heapQ, "obj_update")
			c.between(b)
			take(b, 2, heapQ, heapP, "list_walk")
			res := analyze(Options{}, b)
			if got := len(ofKind(res, KindLockOrderCycle)) > 0; got != c.cycle {
				t.Errorf("%s %s: cycle %v, want %v: %+v", k.name, c.name, got, c.cycle, res.Findings)
			}
		}
	}
}

// pthread_rwlock_init's attribute says whether readers queue behind
// writers, before any lock call carries the lock's flags.
func TestRwlockInitPreference(t *testing.T) {
	for _, pref := range []uint64{0, rwlockPreferWriterNonrecursive} {
		b := tracebuild.New(1, nil)
		b.Event(events.Event{TID: 1, Op: events.OpRwlockInit, Addr: heapP, Arg: pref}, "pthread_rwlock_init"+libc, "table_new")
		// Read lock calls whose flags say nothing (a lock word not read).
		b.RWLock(1, events.OpRwlockRdlock, heapP, 0, "pthread_rwlock_rdlock"+libc, "lookup")
		b.RWLock(1, events.OpRwlockRdlock, heapP, 0, "pthread_rwlock_rdlock"+libc, "lookup")
		b.RWUnlock(1, heapP).RWUnlock(1, heapP)
		res := analyze(Options{}, b)
		if got, want := len(ofKind(res, KindSelfDeadlock)), map[bool]int{true: 1}[pref != 0]; got != want {
			t.Errorf("preference %d: %d self-deadlock findings, want %d: %+v", pref, got, want, res.Findings)
		}
	}
}
