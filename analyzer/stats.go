package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// Stats summarises the traces analysed.
type Stats struct {
	Events     uint64 `json:"events"`
	LostEvents uint64 `json:"lost_events"`
	Threads    int    `json:"threads"`
	// UnrecordedProcesses counts the process images that ran traced and
	// could not record (see events.Footer).
	UnrecordedProcesses uint64 `json:"unrecorded_processes,omitempty"`
	// Complete is false when events were lost, a process could not record
	// or a trace has no footer (it was cut short): findings may then be
	// missing, or, with lost unlocks, wrong.
	Complete   bool   `json:"complete"`
	Incomplete string `json:"incomplete,omitempty"` // why not complete
	// Calls counts every traced call by name: the footers' counts (they
	// include calls the kernel aggregated without sending events) where a
	// trace has them, else the events.
	Calls      map[string]uint64 `json:"calls"`
	ExitStatus *int              `json:"exit_status,omitempty"`
	ExitSignal string            `json:"exit_signal,omitempty"`

	Locks             int    `json:"locks"`        // lock instances taken
	LockClasses       int    `json:"lock_classes"` // their classes
	Dependencies      int    `json:"dependencies"` // lock-order edges between instances
	UnbalancedUnlocks uint64 `json:"unbalanced_unlocks,omitempty"`
	// LockMisuse counts the misused lock calls of complete traces: the
	// program's (lock-misuse findings).
	LockMisuse LockMisuse `json:"lock_misuse"`
	// TraceChecks counts records that contradict each other: nonzero means
	// the tracer lost or misattributed events (or, for the lock misuse of
	// a trace that lost events or was cut short, may have).
	TraceChecks TraceChecks `json:"trace_checks"`
	Warnings    []string    `json:"warnings,omitempty"`

	Traces []TraceStats `json:"traces"`
}

// TraceStats describes one stream.
type TraceStats struct {
	Source    string   `json:"source,omitempty"`
	PID       uint32   `json:"pid,omitempty"`
	Command   []string `json:"command,omitempty"`
	Allocator string   `json:"allocator"`
	Recorder  string   `json:"recorder,omitempty"` // "ebpf" or "preload"; empty in older traces
	// NoEBPF: why the eBPF half could not record (see events.Header).
	NoEBPF string `json:"no_ebpf,omitempty"`
	// ProbeTime is the BPF programs' own time, when the kernel counted it
	// (see events.Footer).
	ProbeTime map[string]events.ProgramTime `json:"probe_time,omitempty"`
	// StackReads is how the probes read stacks (see events.Footer).
	StackReads string `json:"stack_reads,omitempty"`
	Events     uint64 `json:"events"`
	LostEvents uint64 `json:"lost_events"`
	Complete   bool   `json:"complete"`
	Incomplete string `json:"incomplete,omitempty"`
	ExitStatus *int   `json:"exit_status,omitempty"`
	ExitSignal string `json:"exit_signal,omitempty"`
	Reason     string `json:"reason,omitempty"` // why tracing stopped
	// UnrecordedProcesses: see Stats.
	UnrecordedProcesses uint64 `json:"unrecorded_processes,omitempty"`
	// Ranks are the job's processes' ranks, by PID (see events.Footer).
	Ranks map[uint32]int `json:"ranks,omitempty"`
}

func (a *Analyzer) stats(n *naming) Stats {
	st := Stats{
		Complete: true,
		Calls:    map[string]uint64{},
		Warnings: append([]string(nil), a.warnings...),
		Traces:   []TraceStats{},
	}
	var why []string
	st.TraceChecks = a.checks
	for _, s := range a.streams {
		ts := s.stats()
		st.Traces = append(st.Traces, ts)
		st.Events += ts.Events
		st.LostEvents += ts.LostEvents
		st.UnrecordedProcesses += ts.UnrecordedProcesses
		st.Threads += s.threadsRun
		st.UnbalancedUnlocks += s.unbalanced
		if ts.Complete {
			st.LockMisuse.add(s.misuse)
		} else {
			st.TraceChecks.LockMisuse.add(s.misuse)
			st.Complete = false
			if len(a.streams) > 1 && ts.Source != "" {
				why = append(why, ts.Source+": "+ts.Incomplete)
			} else {
				why = append(why, ts.Incomplete)
			}
		}
		if ts.ExitStatus != nil && (st.ExitStatus == nil || (*st.ExitStatus == 0 && *ts.ExitStatus != 0)) {
			st.ExitStatus = ts.ExitStatus
		}
		if st.ExitSignal == "" {
			st.ExitSignal = ts.ExitSignal
		}
		for name, c := range s.calls() {
			st.Calls[name] += c
		}
	}
	if len(a.streams) == 0 {
		st.Complete = false
		why = append(why, "no trace")
	}
	st.Incomplete = strings.Join(why, "; ")
	// The unlocks not counted as misuse: in an attach, of locks taken
	// before it began.
	if early := st.UnbalancedUnlocks - st.LockMisuse.unlocks() - st.TraceChecks.unlocks(); early > 0 {
		st.Warnings = append(st.Warnings, itoa(early)+" unlocks of locks the thread was not seen taking (taken before the attach began)")
	}
	for _, c := range n.order {
		if c.instances[0].typ == typeArena {
			continue
		}
		st.LockClasses++
		st.Locks += c.weight()
	}
	for _, ed := range a.edgeList {
		st.Dependencies += int(ed.weight)
	}
	return st
}

func (s *stream) stats() TraceStats {
	ts := TraceStats{
		Source:     s.source,
		Allocator:  s.allocator,
		Events:     s.events,
		LostEvents: s.lost,
		Complete:   true,
	}
	if h := s.header; h != nil {
		ts.PID = h.PID
		ts.Command = h.Command
		ts.Recorder = h.Recorder
		ts.NoEBPF = h.NoEBPF
	}
	var why []string
	if f := s.footer; f != nil {
		if f.Lost > ts.LostEvents {
			ts.LostEvents = f.Lost
		}
		ts.ExitStatus = f.ExitStatus
		ts.ExitSignal = f.ExitSignal
		ts.Reason = f.Reason
		ts.ProbeTime = f.ProbeTime
		ts.StackReads = f.StackReads
		ts.UnrecordedProcesses = f.Unrecorded
		ts.Ranks = f.Ranks
	}
	if s.header != nil && s.header.Unrecorded != "" {
		why = append(why, "no calls traced, hang detection alone watched the process: "+s.header.Unrecorded)
	}
	if ts.LostEvents > 0 {
		why = append(why, itoa(ts.LostEvents)+" events lost")
	}
	switch n := ts.UnrecordedProcesses; {
	case n == 1:
		why = append(why, "1 process could not record")
	case n > 1:
		why = append(why, itoa(n)+" processes could not record")
	}
	if s.footer == nil {
		why = append(why, "trace cut short: no footer")
	}
	if len(why) > 0 {
		ts.Complete = false
		ts.Incomplete = strings.Join(why, "; ")
	}
	return ts
}

// calls counts one stream's calls: the footer's counts when it has them;
// else the events, each call once: calls traced at both ends by their
// entry, calls traced only at return (trylock and timed-lock results) by
// their return.
func (s *stream) calls() map[string]uint64 {
	out := map[string]uint64{}
	if s.footer != nil && len(s.footer.Calls) > 0 {
		for name, c := range s.footer.Calls {
			out[name] += c
		}
		return out
	}
	for op := events.Op(1); int(op) < opSlots; op++ {
		c := s.entries[op]
		if c == 0 {
			c = s.returns[op]
		}
		if c > 0 {
			out[op.String()] += c
		}
	}
	return out
}
