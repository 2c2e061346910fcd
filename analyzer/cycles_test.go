package analyzer

import (
	"github.com/hooktrace/hooktrace/internal/tracebuild"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

// onSomeCycle counts the distinct pairs a → b for which b reaches a: the
// dependencies that lie on some cycle (naively, a search per pair).
func onSomeCycle(n int, pairs [][2]int) int {
	adj := make([][]int, n)
	distinct := map[[2]int]bool{}
	for _, p := range pairs {
		if !distinct[p] {
			distinct[p] = true
			adj[p[0]] = append(adj[p[0]], p[1])
		}
	}
	mark := make([]int, n)
	count := 0
	for p := range distinct {
		for i := range mark {
			mark[i] = 0
		}
		queue := []int{p[1]}
		mark[p[1]] = 1
		for len(queue) > 0 && mark[p[0]] == 0 {
			v := queue[0]
			queue = queue[1:]
			for _, w := range adj[v] {
				if mark[w] == 0 {
					mark[w] = 1
					queue = append(queue, w)
				}
			}
		}
		if mark[p[0]] != 0 {
			count++
		}
	}
	return count
}

// TestCycleSearchCapped: in a graph of 5,000 locks taken in random pairs
// (one strongly connected component with a vast number of cycles) the
// search stops at maxComponentCycles cycles, and the findings say how many
// dependencies lie on cycles not reported: with those on reported cycles,
// exactly the dependencies that are on some cycle. Each reported cycle is
// a real one: every edge leaves the lock the previous one entered.
func TestCycleSearchCapped(t *testing.T) {
	const n, seed = 5000, 7
	recs := randomPairsStream(n, seed)
	a := New(Options{})
	for _, r := range recs {
		a.Add(r)
	}
	res := a.Result()
	var cycles, unreported uint64
	for _, f := range res.Findings {
		if f.Kind != KindLockOrderCycle {
			continue
		}
		cycles += f.Occurrences
		if f.Unreported > 0 {
			if unreported != 0 && f.Unreported != unreported {
				t.Errorf("one component, yet findings count %d and %d unreported dependencies", unreported, f.Unreported)
			}
			unreported = f.Unreported
			if !strings.Contains(f.Detail, itoa(f.Unreported)+" more dependencies") {
				t.Errorf("detail does not say what was left out: %s", f.Detail)
			}
		}
		for i, e := range f.Edges {
			next := f.Edges[(i+1)%len(f.Edges)]
			if e.To != next.From {
				t.Fatalf("%s: edge %d ends at %s, edge %d starts at %s", f.ID, i, e.To, i+1, next.From)
			}
		}
	}
	if cycles == 0 || cycles > maxComponentCycles {
		t.Errorf("%d cycles reported, want 1..%d", cycles, maxComponentCycles)
	}
	if unreported == 0 {
		t.Fatal("no finding says what the capped search left out")
	}
	reported := map[cycleStep]bool{}
	for _, cyc := range a.findCycles(a.nameInstances()).cycles {
		for _, st := range cyc {
			reported[st] = true
		}
	}
	want := onSomeCycle(n, randomPairs(n, seed))
	if got := len(reported) + int(unreported); got != want {
		t.Errorf("%d dependencies on reported cycles + %d unreported = %d, want the %d on some cycle",
			len(reported), unreported, got, want)
	}
}

// TestCycleSearchSmallWhole: a small tangle is searched whole: every
// dependency on a cycle is on a reported one and nothing is said left out.
func TestCycleSearchSmallWhole(t *testing.T) {
	const n, seed = 12, 3
	a := New(Options{})
	for _, r := range randomPairsStream(n, seed) {
		a.Add(r)
	}
	res := a.Result()
	found := 0
	for _, f := range res.Findings {
		if f.Kind != KindLockOrderCycle {
			continue
		}
		found++
		if f.Unreported != 0 || strings.Contains(f.Detail, "not reported") {
			t.Errorf("%s: %d unreported in a small graph: %s", f.ID, f.Unreported, f.Detail)
		}
	}
	if found == 0 {
		t.Fatal("want cycles among 12 locks in 24 random pairs")
	}
	reported := map[cycleStep]bool{}
	for _, cyc := range a.findCycles(a.nameInstances()).cycles {
		for _, st := range cyc {
			reported[st] = true
		}
	}
	if want := onSomeCycle(n, randomPairs(n, seed)); len(reported) != want {
		t.Errorf("%d dependencies on reported cycles, want all %d on some cycle", len(reported), want)
	}
}

// TestCycleSearchCappedKeepsClasses: two locks of their own classes, each
// tied into the huge random-pairs component, are taken in both orders.
// The component is capped, and their edges come last, yet their
// inversion is reported: past the cap the search still goes through
// every dependency between classes that no reported cycle joins.
func TestCycleSearchCappedKeepsClasses(t *testing.T) {
	const n, seed = 5000, 11
	const x, y = 0x602000, 0x602040
	recs := randomPairsStream(n, seed)
	heap := func(i int) uint64 { return 0x7e0000000000 + uint64(i)*0x40 }
	b := tracebuild.New(5000, nil)
	b.TIDBase = 0
	b.Name(x, "x_lock (pairs)").Name(y, "y_lock (pairs)")
	pair := func(tid uint32, first, second uint64, fn string) {
		b.Lock(tid, first, "pthread_mutex_lock"+libc, fn)
		b.Lock(tid, second, "pthread_mutex_lock"+libc, fn)
		b.Unlock(tid, second).Unlock(tid, first)
	}
	for i := 0; i < 20; i++ {
		pair(5001, x, heap(i), "x_then_heap")
		pair(5002, heap(20+i), x, "heap_then_x")
	}
	pair(5001, x, y, "x_then_y")
	pair(5002, y, x, "y_then_x")
	for _, r := range b.Records() {
		if r.Kind != events.RecHeader {
			recs = append(recs, r)
		}
	}
	a := New(Options{})
	for _, r := range recs {
		a.Add(r)
	}
	res := a.Result()
	var xy *Finding
	capped := false
	for i, f := range res.Findings {
		if f.Kind != KindLockOrderCycle {
			continue
		}
		capped = capped || f.Unreported > 0
		if sameLocks(f.Locks, "x_lock (pairs)", "y_lock (pairs)") {
			xy = &res.Findings[i]
		}
	}
	if !capped {
		t.Fatal("the random-pairs component was not capped: the test proves nothing")
	}
	if xy == nil {
		t.Fatal("the x_lock/y_lock inversion in the capped component is not reported")
	}
	if xy.Unreported == 0 {
		t.Errorf("x_lock/y_lock are in the capped component, yet their finding counts nothing left out")
	}
}

func sameLocks(got []string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	seen := map[string]bool{}
	for _, g := range got {
		seen[g] = true
	}
	for _, w := range want {
		if !seen[w] {
			return false
		}
	}
	return true
}
