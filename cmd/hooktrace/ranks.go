package main

import (
	"strconv"
	"strings"
	"sync"

	"github.com/hooktrace/hooktrace/events"
)

// jobRanks learns which traced process is which rank of a parallel job,
// for the footer. A launcher that starts every rank itself says the rank
// in each one's environment (rankVars); GASNet's smp conduit, which
// UPC++'s upcxx-run uses on one node, says only how many ranks there are
// (GASNET_PSHM_NODES): rank 0 is the process upcxx-run started, and it
// forks the others, which are numbered by fork order.
type jobRanks struct {
	mu      sync.Mutex
	envRank int // the traced process's rank from the environment; -1 if none
	nodes   int // GASNET_PSHM_NODES; 0 outside a GASNet smp job
	forks   []fork
}

type fork struct{ parent, child uint32 }

func newJobRanks(getenv func(string) string) *jobRanks {
	j := &jobRanks{envRank: -1}
	if r, ok := envRank(getenv); ok {
		j.envRank = r
	}
	if n, err := strconv.Atoi(strings.TrimSpace(getenv("GASNET_PSHM_NODES"))); err == nil && n > 0 {
		j.nodes = n
	}
	return j
}

// envRank is the rank a launcher put in the environment.
func envRank(getenv func(string) string) (int, bool) {
	for _, v := range rankVars {
		if r := strings.TrimSpace(getenv(v)); r != "" {
			if n, err := strconv.ParseUint(r, 10, 31); err == nil {
				return int(n), true
			}
		}
	}
	return 0, false
}

// observe notes the processes forked, in the order the trace has them.
func (j *jobRanks) observe(r *events.Record) {
	if r.Kind != events.RecEvent {
		return
	}
	e := &r.Event
	if e.Op != events.OpThreadCreate || e.Flags&events.FlagProcess == 0 {
		return
	}
	j.mu.Lock()
	j.forks = append(j.forks, fork{parent: e.PID, child: uint32(e.Arg)})
	j.mu.Unlock()
}

// ranks maps the traced processes to their ranks, root being the process
// hooktrace started or attached to; nil when it is no rank of a job.
func (j *jobRanks) ranks(root uint32) map[uint32]int {
	if root == 0 || (j.envRank < 0 && j.nodes == 0) {
		return nil
	}
	base := max(j.envRank, 0)
	out := map[uint32]int{root: base}
	if j.nodes > 1 {
		j.mu.Lock()
		defer j.mu.Unlock()
		next := 1
		for _, f := range j.forks {
			if f.parent == root && next < j.nodes {
				out[f.child] = base + next
				next++
			}
		}
	}
	return out
}
