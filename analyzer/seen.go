package analyzer

import (
	"sort"
	"strconv"
	"strings"
)

// Seen is one process a finding was seen in: which trace, which process
// (and its rank, when the trace knows it), which threads, and how many of
// the finding's occurrences were there.
type Seen struct {
	Source  string `json:"source,omitempty"` // the trace, when several are analysed
	PID     uint32 `json:"pid"`
	Process string `json:"process,omitempty"` // the process's name
	// Rank is the process's rank in its parallel job, when the trace
	// says (its footer's ranks); nil when it does not.
	Rank    *int         `json:"rank,omitempty"`
	Threads []SeenThread `json:"threads"`
	// Count is how many occurrences were seen in this process. A
	// lock-order cycle counts in each process (and on each thread) as
	// often as the most of any of its dependencies were seen there. A
	// finding seen in several processes but not counted per process has
	// 0.
	Count uint64 `json:"count,omitempty"`
}

// SeenThread is one thread a finding was seen on.
type SeenThread struct {
	TID   uint32 `json:"tid"`
	Name  string `json:"name,omitempty"`
	Count uint64 `json:"count,omitempty"`
}

// seenKey is one thread of one process of one stream.
type seenKey struct {
	s        *stream
	pid, tid uint32
}

// seenCounts counts a finding's occurrences by thread.
type seenCounts map[seenKey]uint64

func (c seenCounts) add(s *stream, pid, tid uint32, n uint64) {
	c[seenKey{s, pid, tid}] += n
}

// procKey is one process of one stream.
type procKey struct {
	s   *stream
	pid uint32
}

// list groups the counts by process, in trace and PID order.
func (c seenCounts) list() []Seen {
	procs := map[procKey]uint64{}
	for k, n := range c {
		procs[procKey{k.s, k.pid}] += n
	}
	return listSeen(procs, c)
}

// listSeen makes the Seen list of processes counted procs, with the
// threads counted threads, in trace and PID order.
func listSeen(procs map[procKey]uint64, threads seenCounts) []Seen {
	byProc := map[procKey]*Seen{}
	for p, n := range procs {
		sn := p.s.seenProcess(p.pid)
		sn.Count = n
		byProc[p] = sn
	}
	for k, n := range threads {
		sn := byProc[procKey{k.s, k.pid}]
		sn.Threads = append(sn.Threads, SeenThread{TID: k.tid, Name: k.s.threadName(k.tid), Count: n})
	}
	out := make([]Seen, 0, len(byProc))
	for _, sn := range byProc {
		sort.Slice(sn.Threads, func(i, j int) bool { return sn.Threads[i].TID < sn.Threads[j].TID })
		out = append(out, *sn)
	}
	sortSeen(out)
	return out
}

func sortSeen(out []Seen) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Source != out[j].Source {
			return out[i].Source < out[j].Source
		}
		return out[i].PID < out[j].PID
	})
}

// seenProcess starts the Seen of one of the stream's processes.
func (s *stream) seenProcess(pid uint32) *Seen {
	sn := &Seen{Source: s.source, PID: pid, Process: s.threadName(pid)}
	if r, ok := s.ranks[pid]; ok {
		sn.Rank = &r
	}
	return sn
}

// seenOfCycles lists where a cycle finding's instance cycles were seen.
// A cycle's dependencies are seen on different threads, a folded one's in
// each of its ranks: a cycle counts in a process (or on a thread) as often
// as the most of any of its dependencies were seen there.
func seenOfCycles(cycles [][]cycleStep) []Seen {
	procs := map[procKey]uint64{}
	threads := seenCounts{}
	for _, cyc := range cycles {
		procMax := map[procKey]uint64{}
		threadMax := seenCounts{}
		for _, st := range cyc {
			inProc := map[procKey]uint64{}
			for k, n := range st.edge.seenIn() {
				inProc[procKey{k.s, k.pid}] += n
				threadMax[k] = max(threadMax[k], n)
			}
			for p, n := range inProc {
				procMax[p] = max(procMax[p], n)
			}
		}
		for p, n := range procMax {
			procs[p] += n
		}
		threads.merge(threadMax)
	}
	return listSeen(procs, threads)
}

// seenFromEdges lists, for a finding not counted per process, the
// processes and threads of its edges.
func (a *Analyzer) seenFromEdges(f *Finding) []Seen {
	bySource := map[string]*stream{}
	for _, s := range a.streams {
		bySource[s.source] = s
	}
	procs, threads := map[procKey]uint64{}, seenCounts{}
	for _, e := range f.Edges {
		if s := bySource[e.Source]; s != nil {
			procs[procKey{s, e.PID}] = 0
			threads[seenKey{s, e.PID, e.Thread}] = 0
		}
	}
	return listSeen(procs, threads)
}

// fillSeen gives every finding its processes, and says when it merges
// sightings from several processes or traces.
func (a *Analyzer) fillSeen(fs []Finding) {
	for i := range fs {
		f := &fs[i]
		if len(f.Seen) == 0 {
			f.Seen = a.seenFromEdges(f)
			if len(f.Seen) == 1 {
				// One process (a live deadlock): all its occurrences.
				f.Seen[0].Count = f.Occurrences
			}
		}
		procs, sources := len(f.Seen), map[string]bool{}
		ranks := 0
		for _, sn := range f.Seen {
			sources[sn.Source] = true
			if sn.Rank != nil {
				ranks++
			}
		}
		switch {
		case len(sources) > 1:
			f.Merged = "merged from " + strconv.Itoa(procs) + " processes in " + strconv.Itoa(len(sources)) + " traces"
		case procs > 1 && ranks == procs:
			f.Merged = "merged from " + strconv.Itoa(procs) + " ranks"
		case procs > 1:
			f.Merged = "merged from " + strconv.Itoa(procs) + " processes"
		}
	}
}

// SeenText says where a finding was seen, one process a line:
// "pid 100 (rank 0, p572): 60 times; threads 100 (p572) 58, 102 1".
func (f *Finding) SeenText() []string {
	var out []string
	sources := map[string]bool{}
	for _, sn := range f.Seen {
		sources[sn.Source] = true
	}
	for _, sn := range f.Seen {
		var b strings.Builder
		b.WriteString("pid " + strconv.FormatUint(uint64(sn.PID), 10))
		var tags []string
		if sn.Rank != nil {
			tags = append(tags, "rank "+strconv.Itoa(*sn.Rank))
		}
		if sn.Process != "" {
			tags = append(tags, sn.Process)
		}
		if sn.Source != "" && len(sources) > 1 {
			tags = append(tags, sn.Source)
		}
		if len(tags) > 0 {
			b.WriteString(" (" + strings.Join(tags, ", ") + ")")
		}
		switch {
		case sn.Count == 1:
			b.WriteString(": once")
		case sn.Count > 1:
			b.WriteString(": " + strconv.FormatUint(sn.Count, 10) + " times")
		}
		b.WriteString("; thread")
		if len(sn.Threads) > 1 {
			b.WriteString("s")
		}
		// Per-thread counts say something only where they differ from
		// the process's: a cycle seen once involves each of its threads
		// once.
		perThread := false
		for _, t := range sn.Threads {
			perThread = perThread || t.Count != sn.Count
		}
		for i, t := range sn.Threads {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(" " + strconv.FormatUint(uint64(t.TID), 10))
			if t.Name != "" {
				b.WriteString(" (" + t.Name + ")")
			}
			if t.Count > 0 && len(sn.Threads) > 1 && perThread {
				b.WriteString(" " + strconv.FormatUint(t.Count, 10) + "x")
			}
		}
		out = append(out, b.String())
	}
	return out
}

// threads lists the TIDs counted, sorted.
func (c seenCounts) threads() []uint32 {
	tids := map[uint32]bool{}
	for k := range c {
		tids[k.tid] = true
	}
	return sortedTIDs(tids)
}

// merge adds o's counts.
func (c seenCounts) merge(o seenCounts) {
	for k, n := range o {
		c[k] += n
	}
}
