package analyzer

import (
	"errors"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
)

// Severity ranks findings.
type Severity string

const (
	SeverityInfo    Severity = "info"
	SeverityWarning Severity = "warning"
	SeverityError   Severity = "error"
)

// Rank orders severities: info 1, warning 2, error 3; 0 for anything else.
func (s Severity) Rank() int {
	switch s {
	case SeverityInfo:
		return 1
	case SeverityWarning:
		return 2
	case SeverityError:
		return 3
	}
	return 0
}

// ParseSeverity accepts "info", "warning" (or "warn") and "error".
func ParseSeverity(text string) (Severity, error) {
	switch strings.ToLower(strings.TrimSpace(text)) {
	case "info":
		return SeverityInfo, nil
	case "warning", "warn":
		return SeverityWarning, nil
	case "error":
		return SeverityError, nil
	}
	return "", errors.New("unknown severity " + quote(text) + ": want info, warning or error")
}

// Kind is the type of a finding.
type Kind string

const (
	KindLockOrderCycle   Kind = "lock-order-cycle"
	KindSelfDeadlock     Kind = "self-deadlock"
	KindAllocatorReentry Kind = "allocator-reentry"
	KindHookLock         Kind = "hook-lock"
	KindForbiddenNesting Kind = "forbidden-nesting"
	KindDeadlock         Kind = "deadlock"
	// KindLockMisuse: an unlock of a lock the thread does not hold, or a
	// destroy of a held lock, in a complete trace (misuse.go).
	KindLockMisuse Kind = "lock-misuse"
	// KindTraceInconsistency: records that cannot all be true (a lost or
	// misattributed event); never an error.
	KindTraceInconsistency Kind = "trace-inconsistency"
)

// Result is what an analysis found.
type Result struct {
	Version  int       `json:"version"`
	Stats    Stats     `json:"stats"`
	Findings []Finding `json:"findings"`
	// Graph is the lock graph the findings come from (for the graph
	// reports). It is not part of the JSON report.
	Graph *Graph `json:"-"`
}

// Finding is one problem, deduplicated by lock classes and code sites.
type Finding struct {
	// ID is stable across machines and runs: it hashes what the finding
	// is (the kind, lock classes, allocator calls, function names), never
	// addresses, TIDs, PIDs or which sighting came first, which the detail
	// and edges give.
	ID       string   `json:"id"`
	Kind     Kind     `json:"kind"`
	Severity Severity `json:"severity"`
	Title    string   `json:"title"`
	// Detail explains why this is a problem and what decided its severity.
	Detail string `json:"detail,omitempty"`
	// Locks lists the lock instances involved, in cycle order.
	Locks []string `json:"locks"`
	// Edges are the dependencies, each with the stack where its target
	// was taken (Stack) and where its source was taken (HeldStack).
	Edges   []Edge   `json:"edges"`
	Threads []uint32 `json:"threads,omitempty"`
	// Scenario is a lockdep-style interleaving that deadlocks.
	Scenario []Step `json:"scenario,omitempty"`
	// Gate, on a guarded lock-order cycle (a warning), is the lock every
	// dependency on it was taken under: the paths exclude each other.
	Gate string `json:"gate,omitempty"`
	// Occurrences counts the instance-level sightings merged here.
	Occurrences uint64 `json:"occurrences"`
	// Instances lists the lock instances of each merged sighting (capped).
	Instances [][]string `json:"instances,omitempty"`
	// Unreported counts, for a lock-order cycle, the dependencies of the
	// same strongly connected component that lie on cycles not reported:
	// the search stops after a fixed number of cycles per component.
	Unreported uint64 `json:"unreported,omitempty"`
	// Seen lists each process (and its threads) the finding was seen in,
	// with counts per process where the finding is counted so.
	Seen []Seen `json:"seen"`
	// Merged says when the finding merges sightings from several
	// processes, ranks or traces ("merged from 2 ranks").
	Merged string `json:"merged,omitempty"`
}

// Edge is one dependency of a finding: To was taken while From was held.
type Edge struct {
	From       string `json:"from"`
	To         string `json:"to"`
	Thread     uint32 `json:"thread"`
	ThreadName string `json:"thread_name,omitempty"`
	PID        uint32 `json:"pid,omitempty"`
	Source     string `json:"source,omitempty"`
	Context    string `json:"context"`
	// Action is what the call at Stack did to To when it did not take it:
	// "unlocked" or "destroyed" (lock misuse).
	Action             string  `json:"action,omitempty"`
	Arena              string  `json:"arena,omitempty"` // allocator → lock: "held", "may hold", "not held"
	Stack              []Frame `json:"stack"`
	StackTruncated     bool    `json:"stack_truncated,omitempty"`
	HeldStack          []Frame `json:"held_stack,omitempty"`
	HeldStackTruncated bool    `json:"held_stack_truncated,omitempty"`
}

// Step is one line of a possible scenario: what one thread does.
type Step struct {
	Thread string `json:"thread"` // "A", "B", ...
	Action string `json:"action"`
}

// MaxSeverity is the highest severity among the findings, "" with none.
func (r *Result) MaxSeverity() Severity {
	var max Severity
	for _, f := range r.Findings {
		if f.Severity.Rank() > max.Rank() {
			max = f.Severity
		}
	}
	return max
}

// Fails reports whether any finding is at least as severe as threshold.
func (r *Result) Fails(threshold Severity) bool {
	return len(r.Findings) > 0 && r.MaxSeverity().Rank() >= threshold.Rank()
}

// AddFindings adds findings made elsewhere (a hang's DeadlockFindings).
func (r *Result) AddFindings(fs ...Finding) {
	r.Findings = append(r.Findings, fs...)
	r.Sort()
}

// Sort orders findings: most severe first, then by kind, title and ID.
func (r *Result) Sort() {
	sort.SliceStable(r.Findings, func(i, j int) bool {
		a, b := &r.Findings[i], &r.Findings[j]
		if a.Severity.Rank() != b.Severity.Rank() {
			return a.Severity.Rank() > b.Severity.Rank()
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Title != b.Title {
			return a.Title < b.Title
		}
		return a.ID < b.ID
	})
}

// findingID hashes a kind and its stable parts.
func findingID(kind Kind, parts ...string) string {
	h := fnv.New64a()
	h.Write([]byte(kind))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	sum := strconv.FormatUint(h.Sum64(), 16)
	for len(sum) < 16 {
		sum = "0" + sum
	}
	return string(kind) + "-" + sum[:12]
}

// maxInstanceSets caps Finding.Instances.
const maxInstanceSets = 20
