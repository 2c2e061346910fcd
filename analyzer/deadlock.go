package analyzer

import (
	"sort"
	"strconv"
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// Wait is one blocked thread of a hung process, as the tracer reads it:
// the lock it waits in, and that lock's owner (a mutex's __owner field).
type Wait struct {
	PID        uint32
	TID        uint32
	Thread     string // the thread's name, if known
	WaitingFor uint64 // the lock's address
	Lock       string // the lock's name, if known
	Owner      uint32 // the owner's TID; 0 when unknown
	Stack      *events.Stack
}

func (w *Wait) lockName() string {
	if w.Lock != "" {
		return w.Lock
	}
	return "mutex at 0x" + strconv.FormatUint(w.WaitingFor, 16)
}

// lockKey names the lock for finding IDs: its name, else the code that
// waits for it (never an address).
func (w *Wait) lockKey() string {
	if w.Lock != "" {
		return w.Lock
	}
	return "waited for at " + stableSite(callerFrame(w.Stack))
}

// DeadlockFindings finds the cycles of a wait-for snapshot (thread → the
// owner of the lock it waits for) and reports each as a real deadlock.
func DeadlockFindings(waits []Wait) []Finding {
	type key struct{ pid, tid uint32 }
	sorted := append([]Wait(nil), waits...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].PID != sorted[j].PID {
			return sorted[i].PID < sorted[j].PID
		}
		return sorted[i].TID < sorted[j].TID
	})
	byThread := map[key]int{}
	for i, w := range sorted {
		byThread[key{w.PID, w.TID}] = i
	}
	next := func(i int) int {
		w := &sorted[i]
		if w.Owner == 0 {
			return -1
		}
		if j, ok := byThread[key{w.PID, w.Owner}]; ok {
			return j
		}
		return -1
	}
	// Each thread waits for one owner: follow the chain, colouring nodes
	// by the walk that reached them; a walk that meets itself found a cycle.
	walk := make([]int, len(sorted))
	for i := range walk {
		walk[i] = -1
	}
	var out []Finding
	for start := range sorted {
		if walk[start] >= 0 {
			continue
		}
		i := start
		for i >= 0 && walk[i] < 0 {
			walk[i] = start
			i = next(i)
		}
		if i < 0 || walk[i] != start {
			continue
		}
		var cyc []int
		for j := i; ; {
			cyc = append(cyc, j)
			j = next(j)
			if j == i {
				break
			}
		}
		out = append(out, deadlockFinding(sorted, cyc))
	}
	return out
}

// deadlockFinding: cyc[k] waits for a lock owned by cyc[k+1].
func deadlockFinding(waits []Wait, cyc []int) Finding {
	n := len(cyc)
	f := Finding{Kind: KindDeadlock, Severity: SeverityError, Occurrences: 1, Locks: []string{}}
	keys := make([]string, n)
	var tids []uint32
	for k, i := range cyc {
		w := &waits[i]
		f.Locks = append(f.Locks, w.lockName())
		keys[k] = w.lockKey()
		tids = append(tids, w.TID)
	}
	for k, i := range cyc {
		w := &waits[i]
		prev := &waits[cyc[(k+n-1)%n]] // waits for a lock w holds
		owner := &waits[cyc[(k+1)%n]]
		e := Edge{
			From:       prev.lockName(),
			To:         w.lockName(),
			Thread:     w.TID,
			ThreadName: w.Thread,
			PID:        w.PID,
			Context: "thread " + itoa(uint64(w.TID)) + " holds " + prev.lockName() + " and waits for " +
				w.lockName() + ", owned by thread " + itoa(uint64(owner.TID)),
		}
		e.Stack, e.StackTruncated = framesOf(w.Stack)
		f.Edges = append(f.Edges, e)
	}
	f.ID = findingID(KindDeadlock, canonicalRotation(keys)...)
	if n == 1 {
		w := &waits[cyc[0]]
		f.Title = "deadlock: thread " + itoa(uint64(w.TID)) + " waits for " + w.lockName() + ", which it holds itself"
		f.Detail = "The process hung: the thread waits for a non-recursive lock it already owns."
	} else {
		f.Title = "deadlock: " + strings.Join(append(append([]string(nil), f.Locks...), f.Locks[0]), " → ")
		f.Detail = "The process hung: each thread on the cycle waits for a lock the next one holds."
		for k := range cyc {
			f.Scenario = append(f.Scenario, Step{Thread: threadLetter(k), Action: "lock(" + waits[cyc[(k+n-1)%n]].lockName() + ")"})
		}
		for k, i := range cyc {
			f.Scenario = append(f.Scenario, Step{Thread: threadLetter(k), Action: "lock(" + waits[i].lockName() + ")"})
		}
	}
	sort.Slice(tids, func(i, j int) bool { return tids[i] < tids[j] })
	f.Threads = tids
	return f
}
