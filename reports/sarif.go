package reports

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path"
	"path/filepath"
	"strings"

	"github.com/hooktrace/hooktrace/analyzer"
)

// SARIF 2.1.0, the subset hooktrace writes. Field order is the output's.
const (
	sarifVersion = "2.1.0"
	sarifSchema  = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
	// FingerprintKey names the partial fingerprint that carries the
	// finding ID: code scanning deduplicates alerts on it.
	FingerprintKey = "hooktraceFindingId/v1"
	srcRoot        = "SRCROOT"
	maxSARIFFrames = 64
)

type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool               sarifTool                   `json:"tool"`
	Invocations        []sarifInvocation           `json:"invocations"`
	OriginalURIBaseIDs map[string]sarifArtifactLoc `json:"originalUriBaseIds,omitempty"`
	Results            []sarifResult               `json:"results"`
	Properties         map[string]any              `json:"properties,omitempty"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	Version        string      `json:"version,omitempty"`
	InformationURI string      `json:"informationUri,omitempty"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID                   string          `json:"id"`
	Name                 string          `json:"name"`
	ShortDescription     sarifMessage    `json:"shortDescription"`
	FullDescription      sarifMessage    `json:"fullDescription"`
	Help                 sarifMessage    `json:"help"`
	DefaultConfiguration sarifRuleConfig `json:"defaultConfiguration"`
	Properties           map[string]any  `json:"properties,omitempty"`
}

type sarifRuleConfig struct {
	Level string `json:"level"`
}

type sarifMessage struct {
	Text     string `json:"text"`
	Markdown string `json:"markdown,omitempty"`
}

type sarifInvocation struct {
	ExecutionSuccessful bool                `json:"executionSuccessful"`
	Notifications       []sarifNotification `json:"toolExecutionNotifications,omitempty"`
}

type sarifNotification struct {
	Level   string       `json:"level"`
	Message sarifMessage `json:"message"`
}

type sarifResult struct {
	RuleID              string             `json:"ruleId"`
	RuleIndex           int                `json:"ruleIndex"`
	Level               string             `json:"level"`
	Message             sarifMessage       `json:"message"`
	Locations           []sarifLocation    `json:"locations"`
	PartialFingerprints map[string]string  `json:"partialFingerprints"`
	OccurrenceCount     uint64             `json:"occurrenceCount,omitempty"`
	Stacks              []sarifStack       `json:"stacks,omitempty"`
	CodeFlows           []sarifCodeFlow    `json:"codeFlows,omitempty"`
	RelatedLocations    []sarifLocation    `json:"relatedLocations,omitempty"`
	Suppressions        []sarifSuppression `json:"suppressions,omitempty"`
	BaselineState       string             `json:"baselineState,omitempty"`
	Properties          map[string]any     `json:"properties,omitempty"`
}

type sarifLocation struct {
	ID               *int                   `json:"id,omitempty"`
	PhysicalLocation *sarifPhysical         `json:"physicalLocation,omitempty"`
	LogicalLocations []sarifLogicalLocation `json:"logicalLocations,omitempty"`
	Message          *sarifMessage          `json:"message,omitempty"`
}

type sarifPhysical struct {
	ArtifactLocation sarifArtifactLoc `json:"artifactLocation"`
	Region           *sarifRegion     `json:"region,omitempty"`
}

type sarifArtifactLoc struct {
	URI       string `json:"uri"`
	URIBaseID string `json:"uriBaseId,omitempty"`
}

type sarifRegion struct {
	StartLine int `json:"startLine"`
}

type sarifLogicalLocation struct {
	Name               string `json:"name"`
	FullyQualifiedName string `json:"fullyQualifiedName,omitempty"`
	Kind               string `json:"kind"`
}

type sarifStack struct {
	Message sarifMessage `json:"message"`
	Frames  []sarifFrame `json:"frames"`
}

type sarifFrame struct {
	Location sarifLocation `json:"location"`
	Module   string        `json:"module,omitempty"`
}

type sarifCodeFlow struct {
	Message     sarifMessage      `json:"message"`
	ThreadFlows []sarifThreadFlow `json:"threadFlows"`
}

type sarifThreadFlow struct {
	Message   sarifMessage              `json:"message"`
	Locations []sarifThreadFlowLocation `json:"locations"`
}

type sarifThreadFlowLocation struct {
	Location       sarifLocation `json:"location"`
	Stack          *sarifStack   `json:"stack,omitempty"`
	Kinds          []string      `json:"kinds,omitempty"`
	NestingLevel   int           `json:"nestingLevel"`
	ExecutionOrder int           `json:"executionOrder"`
	Importance     string        `json:"importance"`
}

type sarifSuppression struct {
	Kind          string `json:"kind"`
	Justification string `json:"justification"`
}

// ruleInfo describes each kind of finding for SARIF rules.
var ruleInfo = []struct {
	kind  analyzer.Kind
	name  string
	short string
	help  string
	level string
}{
	{analyzer.KindLockOrderCycle, "LockOrderCycle", "Potential deadlock: a lock-order cycle",
		"Each lock on the cycle was taken while the previous one was held, on the stacks shown. Threads running these paths at the same time can deadlock even if this run did not hang. Cycles through \"glibc malloc arena\" are the memory-hook deadlock: a lock held across an allocator call, and taken by a hook that runs inside the allocator. Fix: take the locks in one order, or do not call the allocator with the lock held, or do not take the lock in the hook.",
		"error"},
	{analyzer.KindSelfDeadlock, "SelfDeadlock", "A thread takes a non-recursive lock it already holds",
		"A thread that takes a lock it already holds waits for itself forever (or, for error-checking mutexes and rwlocks, gets EDEADLK). A memory hook running inside an allocator call made with the lock held does this too.",
		"error"},
	{analyzer.KindAllocatorReentry, "AllocatorReentry", "The allocator is re-entered from a hook running inside it",
		"A memory hook that runs inside malloc or free calls the allocator again. The allocator is not re-entrant: it may hold its arena lock (a self-deadlock) or be in the middle of updating its lists (heap corruption).",
		"error"},
	{analyzer.KindHookLock, "HookLock", "A memory hook takes a lock inside an allocator call",
		"A hook running inside the allocator takes a lock. It is the dangerous half of the memory-hook deadlock: any thread that calls the allocator while holding that lock can deadlock with it.",
		"note"},
	{analyzer.KindForbiddenNesting, "ForbiddenNesting", "A function ran inside another it must never run inside",
		"A --forbid OUTER>INNER rule was broken: INNER was entered while OUTER was active on the same thread.",
		"error"},
	{analyzer.KindDeadlock, "Deadlock", "Threads were deadlocked",
		"The traced threads were waiting for each other when the trace was taken: a real deadlock, not a potential one.",
		"error"},
	{analyzer.KindLockMisuse, "LockMisuse", "A lock is unlocked by a thread that does not hold it, or destroyed while held",
		"A thread unlocked a lock no thread held or another thread held, or destroyed a lock while it was held: undefined in POSIX. glibc releases a normal mutex whoever unlocks it, and corrupts a rwlock's count of readers; it refuses to destroy a held mutex (EBUSY). Reported from a complete trace only: with events lost, the same records are a trace inconsistency.",
		"warning"},
	{analyzer.KindTraceInconsistency, "TraceInconsistency", "Trace records contradict each other",
		"The trace holds records that cannot all be true: a thread went on after taking a non-recursive lock it held; or, in a trace that lost events or was cut short, a thread unlocked a lock it did not hold or destroyed a held one, which lock misuse and a lost event both explain. No other finding is drawn from them.",
		"warning"},
}

// SARIF writes the gate as a SARIF 2.1.0 log: one result per finding (the
// fixed ones are not results), a thread flow per edge, locations from the
// stacks, the finding ID as a partial fingerprint.
func SARIF(w io.Writer, g *Gate) error {
	run := sarifRun{
		Tool: sarifTool{Driver: sarifDriver{
			Name:    "hooktrace",
			Version: strings.TrimPrefix(g.Tool, "hooktrace "),
		}},
		Results: []sarifResult{},
	}
	ruleIndex := map[analyzer.Kind]int{}
	for i, r := range ruleInfo {
		ruleIndex[r.kind] = i
		run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, sarifRule{
			ID:                   string(r.kind),
			Name:                 r.name,
			ShortDescription:     sarifMessage{Text: r.short},
			FullDescription:      sarifMessage{Text: r.help},
			Help:                 sarifMessage{Text: r.help},
			DefaultConfiguration: sarifRuleConfig{Level: r.level},
			Properties:           map[string]any{"tags": []string{"concurrency", "deadlock"}},
		})
	}
	st := &g.Result.Stats
	inv := sarifInvocation{ExecutionSuccessful: true}
	if !st.Complete {
		inv.Notifications = append(inv.Notifications, sarifNotification{Level: "warning",
			Message: sarifMessage{Text: "Incomplete trace: " + st.Incomplete + ". Findings may be missing."}})
	}
	for _, warn := range st.Warnings {
		inv.Notifications = append(inv.Notifications, sarifNotification{Level: "warning", Message: sarifMessage{Text: warn}})
	}
	for _, u := range g.Unused {
		inv.Notifications = append(inv.Notifications, sarifNotification{Level: "warning",
			Message: sarifMessage{Text: "Unused suppression at " + u.Source + " (" + u.String() + "): it matched no finding."}})
	}
	run.Invocations = []sarifInvocation{inv}
	lc := locator{root: g.SourceRoot}
	for i := range g.Findings {
		run.Results = append(run.Results, lc.result(&g.Findings[i], ruleIndex))
	}
	if lc.usedRoot && g.SourceRoot != "" {
		run.OriginalURIBaseIDs = map[string]sarifArtifactLoc{srcRoot: {URI: dirURI(g.SourceRoot)}}
	}
	props := map[string]any{
		"complete": st.Complete,
		"events":   st.Events,
		"threads":  st.Threads,
	}
	if st.Incomplete != "" {
		props["incomplete"] = st.Incomplete
	}
	if n := st.UnrecordedProcesses; n > 0 {
		props["unrecorded_processes"] = n
	}
	if g.HasBaseline {
		fixed := []string{}
		for _, f := range g.Fixed {
			fixed = append(fixed, f.ID)
		}
		props["baseline"] = g.BaselineName
		props["fixed"] = fixed
	}
	run.Properties = props
	log := sarifLog{Schema: sarifSchema, Version: sarifVersion, Runs: []sarifRun{run}}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(log)
}

func sarifLevel(s analyzer.Severity) string {
	switch s {
	case analyzer.SeverityError:
		return "error"
	case analyzer.SeverityWarning:
		return "warning"
	}
	return "note"
}

// locator turns frames into SARIF locations.
type locator struct {
	root     string
	usedRoot bool
}

func (lc *locator) result(j *Judged, ruleIndex map[analyzer.Kind]int) sarifResult {
	f := j.Finding
	msg := f.Title
	if f.Detail != "" {
		msg += ". " + f.Detail
	}
	r := sarifResult{
		RuleID:              string(f.Kind),
		RuleIndex:           ruleIndex[f.Kind],
		Level:               sarifLevel(f.Severity),
		Message:             sarifMessage{Text: msg},
		PartialFingerprints: map[string]string{FingerprintKey: f.ID},
		OccurrenceCount:     f.Occurrences,
		BaselineState:       j.State,
		Properties: map[string]any{
			"id":       f.ID,
			"severity": string(f.Severity),
			"fails":    j.Fails,
		},
	}
	if _, ok := ruleIndex[f.Kind]; !ok {
		r.RuleIndex = -1
	}
	if len(f.Locks) > 0 {
		r.Properties["locks"] = f.Locks
	}
	if len(f.Threads) > 0 {
		r.Properties["threads"] = f.Threads
	}
	if f.Gate != "" {
		r.Properties["gate"] = f.Gate
	}
	if len(f.Seen) > 0 {
		r.Properties["seen"] = f.Seen
	}
	if f.Merged != "" {
		r.Properties["merged"] = f.Merged
	}
	// The primary location: the first edge's site with a source line, else
	// the first edge's site.
	var primary *sarifLocation
	for _, e := range f.Edges {
		if fr := siteFrame(e.Stack); fr != nil && fr.File != "" && fr.Line > 0 {
			primary = lc.location(fr, f.Title)
			break
		}
	}
	if primary == nil {
		for _, e := range f.Edges {
			if fr := siteFrame(e.Stack); fr != nil {
				primary = lc.location(fr, f.Title)
				break
			}
		}
	}
	if primary != nil {
		r.Locations = []sarifLocation{*primary}
	} else {
		r.Locations = []sarifLocation{{Message: &sarifMessage{Text: f.Title + " (no stack recorded)"}}}
	}
	var flows []sarifThreadFlow
	for i := range f.Edges {
		e := &f.Edges[i]
		flow := sarifThreadFlow{Message: sarifMessage{Text: fmt.Sprintf("edge %d, %s: %s → %s", i+1, threadLabel(e), e.From, e.To)}}
		order := 1
		if len(e.HeldStack) > 0 {
			loc := lc.siteLocation(e.HeldStack, heldLabel(e))
			flow.Locations = append(flow.Locations, sarifThreadFlowLocation{
				Location: loc, Stack: lc.stack(e.HeldStack, heldLabel(e)),
				Kinds: []string{"acquire"}, ExecutionOrder: order, Importance: "important",
			})
			order++
		}
		loc := lc.siteLocation(e.Stack, e.Context)
		flow.Locations = append(flow.Locations, sarifThreadFlowLocation{
			Location: loc, Stack: lc.stack(e.Stack, takenLabel(e)),
			Kinds: []string{"acquire"}, NestingLevel: 1, ExecutionOrder: order, Importance: "essential",
		})
		flows = append(flows, flow)
		if st := lc.stack(e.Stack, fmt.Sprintf("edge %d: %s", i+1, takenLabel(e))); st != nil {
			r.Stacks = append(r.Stacks, *st)
		}
		if fr := siteFrame(e.Stack); fr != nil {
			rel := lc.location(fr, fmt.Sprintf("edge %d: %s", i+1, e.Context))
			id := len(r.RelatedLocations)
			rel.ID = &id
			r.RelatedLocations = append(r.RelatedLocations, *rel)
		}
	}
	if len(flows) > 0 {
		r.CodeFlows = []sarifCodeFlow{{Message: sarifMessage{Text: f.Title}, ThreadFlows: flows}}
	}
	if s := j.Suppressed; s != nil {
		r.Suppressions = []sarifSuppression{{Kind: "external",
			Justification: s.Reason + " (" + s.Source + ")"}}
	}
	return r
}

func threadLabel(e *analyzer.Edge) string {
	who := fmt.Sprintf("thread %d", e.Thread)
	if e.ThreadName != "" {
		who += " (" + e.ThreadName + ")"
	}
	if e.Source != "" {
		who += " in " + e.Source
	}
	return who
}

// siteLocation is the location of a stack's site frame, with msg.
func (lc *locator) siteLocation(frames []analyzer.Frame, msg string) sarifLocation {
	if fr := siteFrame(frames); fr != nil {
		return *lc.location(fr, msg)
	}
	return sarifLocation{Message: &sarifMessage{Text: msg + " (no stack recorded)"}}
}

func (lc *locator) stack(frames []analyzer.Frame, msg string) *sarifStack {
	if len(frames) == 0 {
		return nil
	}
	st := &sarifStack{Message: sarifMessage{Text: msg}}
	for i := range frames {
		if i == maxSARIFFrames {
			break
		}
		fr := &frames[i]
		loc := lc.location(fr, "")
		st.Frames = append(st.Frames, sarifFrame{Location: *loc, Module: path.Base(fr.Object)})
	}
	return st
}

// location is a frame as a SARIF location: its source file and line when
// known, else its object; its function as a logical location.
func (lc *locator) location(fr *analyzer.Frame, msg string) *sarifLocation {
	loc := &sarifLocation{}
	switch {
	case fr.File != "":
		art := lc.artifact(fr.File)
		loc.PhysicalLocation = &sarifPhysical{ArtifactLocation: art}
		if fr.Line > 0 {
			loc.PhysicalLocation.Region = &sarifRegion{StartLine: int(fr.Line)}
		}
	case fr.Object != "":
		loc.PhysicalLocation = &sarifPhysical{ArtifactLocation: lc.artifact(fr.Object)}
	}
	name := fr.Function
	if name == "" {
		name = fr.ObjectAddress()
	}
	if name == "" {
		name = fr.Address
	}
	if name != "" {
		loc.LogicalLocations = []sarifLogicalLocation{{Name: name, Kind: "function"}}
	}
	if msg != "" {
		loc.Message = &sarifMessage{Text: msg}
	}
	return loc
}

// artifact names a file: relative to the source root (uriBaseId SRCROOT)
// when it is under it or relative already, else an absolute file URI.
func (lc *locator) artifact(p string) sarifArtifactLoc {
	if !filepath.IsAbs(p) {
		lc.usedRoot = true
		return sarifArtifactLoc{URI: relURI(p), URIBaseID: srcRoot}
	}
	if lc.root != "" {
		if rel, err := filepath.Rel(lc.root, p); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			lc.usedRoot = true
			return sarifArtifactLoc{URI: relURI(rel), URIBaseID: srcRoot}
		}
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(p)}
	return sarifArtifactLoc{URI: u.String()}
}

func relURI(p string) string {
	p = filepath.ToSlash(path.Clean(p))
	u := url.URL{Path: p}
	s := u.String()
	// A first segment with a colon would read as a scheme.
	if strings.HasPrefix(s, "./") {
		return s[2:]
	}
	return s
}

func dirURI(dir string) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(dir)}
	s := u.String()
	if !strings.HasSuffix(s, "/") {
		s += "/"
	}
	return s
}

// siteFrame is the frame a person should look at in a stack: the
// innermost one outside the C library and the dynamic loader, preferring
// one with a source line; the first frame if all are inside.
func siteFrame(frames []analyzer.Frame) *analyzer.Frame {
	var outside *analyzer.Frame
	for i := range frames {
		fr := &frames[i]
		if systemObject(fr.Object) {
			continue
		}
		if fr.File != "" && fr.Line > 0 {
			return fr
		}
		if outside == nil {
			outside = fr
		}
	}
	if outside != nil {
		return outside
	}
	if len(frames) > 0 {
		return &frames[0]
	}
	return nil
}

// systemObject: glibc and the loader, whose frames are never the bug.
func systemObject(obj string) bool {
	base := path.Base(obj)
	for _, p := range []string{"libc.so", "libc-", "libpthread.so", "libpthread-", "ld-linux", "ld-musl", "libc.musl"} {
		if strings.HasPrefix(base, p) {
			return true
		}
	}
	return false
}
