//go:build linux && amd64

// Package tracer is hooktrace's BPF source of events: Tracer loads the
// objects generated from ../bpf, places uprobes on the functions
// probesite.PlanSites finds, attaches the tracepoints and reads the ring
// buffer. The other source is the preloaded recorder (package preload);
// both write the same records, which package source converts into events.
// Launching and holding the target (package launch), tracing a command
// with either source (package session) and hang detection (package hang)
// are not theirs.
package tracer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/probesite"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/symbolize"
)

// Errors a user can hit, for distinct exit codes.
var (
	ErrPermission = errors.New("not permitted to load BPF programs (run as root, or grant CAP_BPF and CAP_PERFMON)")
)

// Tracer is one tracing session over one process (and, with FollowForks,
// its children).
type Tracer struct {
	opts  source.Options
	objs  hooktraceObjects
	links []link.Link
	rd    *ringbuf.Reader

	mu        sync.Mutex // guards what Attach, the reader and the status line share
	conv      *source.Converter
	allocator string
	sites     []events.ProbeSite
	// attached holds the processes whose probes are placed or being
	// placed; each channel is closed once its placement is done.
	attached map[int]chan struct{}
	closed   bool // the probes were detached: place no more
	// placeMu serializes placements: the gate's goroutine places a held
	// child's probes while the reader may place another's.
	placeMu sync.Mutex
	placed  map[string]bool  // pid:object:offset:ret of every probe placed
	plans   map[int]callPlan // each process's calls probed, for the libraries it loads
	follows sync.WaitGroup   // placements started by the reader

	// What was read from the ring: records and bytes, for the bench's
	// bandwidth figures.
	ringRecords, ringBytes atomic.Uint64
	stopped                bool           // Run is stopping: tracing stays off
	nowRec                 ringbuf.Record // ReadNow's buffer
	noDirectMap            string         // why stacks are read with bpf_probe_read_user from the start
}

// Allocator names the allocator the target uses ("glibc", "jemalloc"...),
// once Attach has found it.
func (t *Tracer) Allocator() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.allocator
}

// New loads the BPF objects and attaches the global tracepoints. Nothing is
// traced until Attach names a process.
func New(opts source.Options) (*Tracer, error) {
	if err := opts.Defaults(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPermission, err)
	}
	spec, err := loadHooktrace()
	if err != nil {
		return nil, fmt.Errorf("reading the BPF objects: %w", err)
	}
	// What the kernel lacks, said before the verifier's seconds of work
	// and in terms a user can act on; a failed load still says what this
	// check cannot foresee (classifyLoad).
	if err := checkKernel(spec, opts.SyscallsOnly); err != nil {
		return nil, err
	}
	set := func(name string, v uint32) error {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
		return nil
	}
	if err := set("full_mode", b2u(opts.Mode == source.ModeFull)); err != nil {
		return nil, err
	}
	if err := set("follow_forks", b2u(opts.FollowForks)); err != nil {
		return nil, err
	}
	if err := set("want_samples", b2u(!opts.NoSamples)); err != nil {
		return nil, err
	}
	mask, why := directMapMask(haveKfunc("bpf_rdonly_cast"))
	if err := spec.Variables["phys_addr_mask"].Set(mask); err != nil {
		return nil, fmt.Errorf("setting phys_addr_mask: %w", err)
	}
	if opts.RingBytes > 0 {
		spec.Maps["ring"].MaxEntries = uint32(opts.RingBytes)
	}
	if !haveUprobeMulti() {
		// One perf-event uprobe per site (attachUprobes): a kernel that
		// knows uprobe_multi refuses those for a program loaded for it.
		for _, p := range spec.Programs {
			if p.AttachType == ebpf.AttachTraceUprobeMulti {
				p.AttachType = ebpf.AttachNone
			}
		}
	}
	t := &Tracer{opts: opts, noDirectMap: why}
	// sys_enter alone (auto's part) reads no allocator caller's stack.
	if t.noDirectMap != "" && !opts.SyscallsOnly {
		t.warnSlowStacks()
	}
	if err := loadObjects(spec, &t.objs, opts.SyscallsOnly); err != nil {
		err = classifyLoad(err)
		if errors.Is(err, ErrPermission) {
			return nil, err // it says what it is about
		}
		return nil, fmt.Errorf("loading the BPF programs: %w", err)
	}
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"sys_enter", t.objs.SysEnter},
		{"sched_process_fork", t.objs.SchedFork},
		{"sched_process_exit", t.objs.SchedExit},
		{"sched_process_exec", t.objs.SchedExec},
	} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.prog})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching raw tracepoint %s: %w", tp.name, err)
		}
		t.links = append(t.links, l)
		t.sites = append(t.sites, events.ProbeSite{Name: tp.name, Kind: "raw_tracepoint"})
	}
	t.rd, err = ringbuf.NewReader(t.objs.Ring)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("opening the ring buffer: %w", err)
	}
	t.conv = source.NewConverter(opts.Warn)
	return t, nil
}

// syscallObjects is what a tracer that places no uprobes loads: the
// tracepoints. The uprobe programs are
// most of the verifier's work (seconds); a short program run with the
// preload recorder and sys_enter must not wait for them.
type syscallObjects struct {
	SchedExec *ebpf.Program `ebpf:"sched_exec"`
	SchedExit *ebpf.Program `ebpf:"sched_exit"`
	SchedFork *ebpf.Program `ebpf:"sched_fork"`
	SysEnter  *ebpf.Program `ebpf:"sys_enter"`
	hooktraceMaps
	hooktraceVariables
}

// loadObjects loads spec into objs: every program, or with syscallsOnly
// only syscallObjects' (the others stay nil).
func loadObjects(spec *ebpf.CollectionSpec, objs *hooktraceObjects, syscallsOnly bool) error {
	if !syscallsOnly {
		return spec.LoadAndAssign(objs, nil)
	}
	var o syscallObjects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		return err
	}
	objs.SchedExec, objs.SchedExit, objs.SchedFork = o.SchedExec, o.SchedExit, o.SchedFork
	objs.SysEnter = o.SysEnter
	objs.hooktraceMaps, objs.hooktraceVariables = o.hooktraceMaps, o.hooktraceVariables
	return nil
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// Attach traces pid: it is added to the tracepoints' filter and the probe
// sites are placed in the objects it maps, or, for a gated child that has
// not exec'd yet, in the objects exe will load.
//
// It returns once pid's probes are in place, also when another goroutine
// is placing them: run lets a held child go when Attach returns.
func (t *Tracer) Attach(pid int, exe string) error {
	t.mu.Lock()
	if done, ok := t.attached[pid]; ok {
		// A followed child can be reported both by ptrace and by the
		// fork event: place its probes once, and wait for them.
		t.mu.Unlock()
		<-done
		return nil
	}
	if t.attached == nil {
		t.attached = map[int]chan struct{}{}
	}
	done := make(chan struct{})
	t.attached[pid] = done
	t.mu.Unlock()
	defer close(done)
	if err := source.CheckProcess(pid); err != nil {
		return err
	}
	// A gated child is only traced from its exec: its own start-up is
	// hooktrace's, not the target's.
	state := uint8(abi.TraceStateTraced)
	if exe != "" {
		state = uint8(abi.TraceStateGated)
	}
	key := uint32(pid)
	if err := t.objs.Traced.Put(&key, &state); err != nil {
		return fmt.Errorf("adding pid %d to the filter: %w", pid, err)
	}
	if !t.opts.SyscallsOnly {
		if err := t.place(pid, exe); err != nil {
			return err
		}
	}
	// Every probe of pid is placed: tracing can be on from here (see On).
	return t.On()
}

// Exec places the probes pid's new image needs, called while pid is held
// at its exec (run holds it there): the new program may take its
// allocator or pthreads from other objects than the old one (a shell
// script, env LD_PRELOAD=..., an MPI launcher exec'ing the rank). Sites
// already placed are kept.
func (t *Tracer) Exec(pid int) {
	t.mu.Lock()
	_, known := t.attached[pid]
	t.mu.Unlock()
	if !known || t.opts.SyscallsOnly {
		return
	}
	if err := t.place(pid, ""); err != nil {
		t.opts.Warn(fmt.Sprintf("placing probes after pid %d's exec: %v", pid, err))
	}
	t.conv.RefreshMaps(uint32(pid))
}

// place plans and attaches pid's probe sites.
func (t *Tracer) place(pid int, exe string) error {
	t.placeMu.Lock()
	defer t.placeMu.Unlock()
	prog, retProg := t.objs.UprobeHook, t.objs.UretprobeHook
	plan, err := probesite.PlanSites(pid, exe, t.opts.UserProbes, t.opts.Warn)
	if err != nil {
		return err
	}
	alloc := probesite.FindAllocator(plan)
	t.conv.SetAllocator(uint32(pid), alloc)
	t.conv.SetCalls(plan)
	if alloc != nil {
		alloc.Obj.PrefetchDWARF() // the probes' stacks start in it
	}
	t.mu.Lock()
	if alloc != nil {
		t.allocator = alloc.Name
	}
	t.mu.Unlock()
	if t.placed == nil {
		t.placed = map[string]bool{}
	}
	links, sites := attachPlan(pid, plan, prog, retProg, alloc, t.placed, t.opts.Warn)
	if t.plans == nil {
		t.plans = map[int]callPlan{}
	}
	t.plans[pid] = callPlanOf(plan)
	// Return probes corrupt Go's moving stacks (see PlanSites).
	exePath := exe
	if exePath == "" {
		exePath = fmt.Sprintf("/proc/%d/exe", pid)
	}
	if !symbolize.ExeIsGo(exePath) {
		links = append(links, attachLoaderCalls(pid, plan, &t.objs, t.placed, t.opts.Warn)...)
	}
	t.mu.Lock()
	if t.closed {
		// Tracing ended while these were placed.
		t.mu.Unlock()
		for _, l := range links {
			l.Close()
		}
		return nil
	}
	t.links = append(t.links, links...)
	t.sites = append(t.sites, sites...)
	t.mu.Unlock()
	return nil
}

// callPlan is what a process's plan says of the functions that may be
// probed on their calls, kept while it runs: the sites, without their
// code (a few KiB each, in every process of a fork storm), and the names
// an object's code is searched for.
type callPlan struct {
	sites []probesite.Site
	scan  []string
}

func callPlanOf(plan []probesite.Site) callPlan {
	p := callPlan{scan: probesite.CallNames(plan)}
	for _, s := range plan {
		if s.Calls != nil {
			s.Code, s.Calls = nil, nil
			p.sites = append(p.sites, s)
		}
	}
	return p
}

// loaded probes the calls that libraries pid loaded since its probes were
// placed (dlopen) make of the functions probed on their calls: nothing
// else sees those calls. What such a library called before this (its
// constructors, run inside dlopen, and until the reader has seen the
// dlopen return) is missed.
func (t *Tracer) loaded(pid int) {
	t.placeMu.Lock()
	defer t.placeMu.Unlock()
	var onCalls []probesite.Site
	for _, s := range t.plans[pid].sites {
		if t.placed[fmt.Sprintf("%d:calls:%s", pid, s.Fn.Name)] {
			onCalls = append(onCalls, s)
		}
	}
	if len(onCalls) == 0 {
		return
	}
	maps, err := symbolize.ReadMaps(pid)
	if err != nil {
		return // it has exited
	}
	scan := t.plans[pid].scan
	for i := range onCalls {
		onCalls[i].Calls, onCalls[i].CallNote = nil, ""
	}
	seen := map[string]bool{}
	for _, m := range maps {
		if !m.IsFile() || !m.Executable() || seen[m.Path] {
			continue
		}
		seen[m.Path] = true
		o, via, err := symbolize.OpenMapped(pid, m)
		if err != nil {
			continue
		}
		for i := range onCalls {
			s := &onCalls[i]
			calls, why := probesite.CallsIn(s, scan, m.Path, via, o, maps)
			s.Calls = append(s.Calls, calls...)
			if why != "" && s.CallNote == "" {
				s.CallNote = why
			}
		}
	}
	t.conv.SetCalls(onCalls)
	links, sites := attachPlan(pid, onCalls, t.objs.UprobeHook, t.objs.UretprobeHook, nil, t.placed, t.opts.Warn)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		for _, l := range links {
			l.Close()
		}
		return
	}
	t.links = append(t.links, links...)
	t.sites = append(t.sites, sites...)
}

// Sites lists where the tracer attached.
func (t *Tracer) Sites() []events.ProbeSite {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sites)
}

// On turns the probes on. Run does it too; a caller that lets a gated
// target exec must call On first, synchronously: the exec tracepoint only
// turns a gated process into a traced one while tracing is on, so a target
// that won the race against Run's goroutine stayed gated for its whole
// run, its locks seen by the uprobes but its exec and memory syscalls
// never counted.
//
// Once Run is stopping, tracing stays off: a late Attach (a followed
// child) must not turn it back on behind the drain.
func (t *Tracer) On() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return nil
	}
	if err := t.objs.TracingOn.Set(uint32(1)); err != nil {
		return fmt.Errorf("turning tracing on: %w", err)
	}
	return nil
}

// pollInterval bounds how long a record can wait in the ring unread.
const pollInterval = 50 * time.Millisecond

// Run reads the ring buffer and hands each record to emit until stop is
// closed; then it closes the probes, drains what is left and returns.
func (t *Tracer) Run(stop <-chan struct{}, emit func(*events.Record) error) error {
	t.conv.Emit = emit
	if t.opts.FollowForks {
		// The kernel already filters the child in; its uprobes are
		// per-process and must be placed for it.
		// Placing takes milliseconds: not on the reader, which would
		// let the ring fill during a fork storm. Under run's ptrace gate
		// the child is held until its probes are in place either way.
		t.conv.OnFork = func(pid uint32) {
			t.follows.Add(1)
			go func() {
				defer t.follows.Done()
				if err := t.Attach(int(pid), ""); err != nil {
					t.opts.Warn(fmt.Sprintf("following child %d: %v", pid, err))
				}
			}()
		}
	}
	if !t.opts.SyscallsOnly {
		// As for a fork: the reader must not wait for the placing.
		t.conv.OnLoad = func(pid uint32) {
			t.follows.Add(1)
			go func() {
				defer t.follows.Done()
				t.loaded(int(pid))
			}()
		}
	}
	if err := t.On(); err != nil {
		return err
	}
	defer keepFed()()
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		// Stop new events, then let the reader drain what is queued: after
		// Flush, reads return what is in the ring, then ErrFlushed.
		t.Stop()
		t.rd.Flush()
	}()
	defer close(done)
	var rec ringbuf.Record
	lostTick := time.Now()
	reportLost := func() error {
		if time.Since(lostTick) < time.Second {
			return nil
		}
		lostTick = time.Now()
		return t.conv.ReportLost(t.Lost())
	}
	// The kernel wakes the reader only once a batch is waiting
	// (WAKE_BYTES in hooktrace.c): poll for the rest. The deadline is
	// renewed when it fires on an empty ring, not for every record.
	t.rd.SetDeadline(time.Now().Add(pollInterval))
	for n := 1; ; n++ {
		err := t.rd.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.rd.SetDeadline(time.Now().Add(pollInterval))
			if err := reportLost(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			if errors.Is(err, ringbuf.ErrFlushed) || errors.Is(err, ringbuf.ErrClosed) {
				return t.conv.ReportLost(t.Lost())
			}
			return fmt.Errorf("reading the ring buffer: %w", err)
		}
		t.ringRecords.Add(1)
		t.ringBytes.Add(uint64(len(rec.RawSample)))
		if err := t.conv.Raw(rec.RawSample); err != nil {
			return err
		}
		if n%4096 == 0 {
			if err := reportLost(); err != nil {
				return err
			}
		}
	}
}

// Stop turns tracing off for good and detaches the probes: what is in
// the ring stays to be read.
func (t *Tracer) Stop() {
	t.mu.Lock()
	already := t.stopped
	t.stopped = true
	t.objs.TracingOn.Set(uint32(0))
	t.mu.Unlock()
	t.closeLinks()
	// Said at New when it was so from the start.
	if !already && t.noDirectMap == "" && !t.opts.SyscallsOnly {
		t.warnSlowStacks()
	}
}

// ReadNow hands f each record the ring holds, without waiting and without
// converting it, for a reader that merges them by time with another
// source's records (the preload recorder, with the memory syscalls). f
// must copy what it keeps.
func (t *Tracer) ReadNow(f func(rec []byte) error) error {
	t.rd.SetDeadline(time.Now())
	for {
		err := t.rd.ReadInto(&t.nowRec)
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, ringbuf.ErrFlushed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the ring buffer: %w", err)
		}
		if err := f(t.nowRec.RawSample); err != nil {
			return err
		}
	}
}

// readerNice is the reader thread's nice value. The reader competes with
// the target for the CPU, and busy-polling targets (MPI ranks spinning on
// their network queues) left it so little that the ring filled.
const readerNice = -10

// keepFed runs the calling goroutine on its own thread at readerNice (when
// permitted: root, or CAP_SYS_NICE) and returns what undoes it.
func keepFed() func() {
	runtime.LockOSThread()
	tid := unix.Gettid()
	// The raw getpriority value is 20 - nice.
	old, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, tid, readerNice) != nil {
		return runtime.UnlockOSThread
	}
	return func() {
		unix.Setpriority(unix.PRIO_PROCESS, tid, 20-old)
		runtime.UnlockOSThread()
	}
}

// RingRead is how many records, and bytes, were read from the ring.
func (t *Tracer) RingRead() (records, bytes uint64) {
	return t.ringRecords.Load(), t.ringBytes.Load()
}

// Lost is how many records the ring buffer had no room for.
func (t *Tracer) Lost() uint64 {
	var total uint64
	for k := uint32(0); k < uint32(abi.RecSlots); k++ {
		var per []uint64
		if err := t.objs.Lost.Lookup(&k, &per); err == nil {
			for _, v := range per {
				total += v
			}
		}
	}
	return total
}

// Calls counts every probe hit by the name of its call, emitted or not.
func (t *Tracer) Calls() map[string]uint64 {
	out := map[string]uint64{}
	for _, op := range events.Ops() {
		k := uint32(op)
		var per []uint64
		if err := t.objs.Calls.Lookup(&k, &per); err != nil {
			continue
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		if n > 0 {
			out[op.String()] = n
		}
	}
	return out
}

// ProbeTime is the probe programs' own run count and time, by program,
// when the kernel counts them (kernel.bpf_stats_enabled, or a process
// holding BPF_ENABLE_STATS); nil when it counted none.
func (t *Tracer) ProbeTime() map[string]events.ProgramTime {
	out := map[string]events.ProgramTime{}
	for name, p := range map[string]*ebpf.Program{
		"uprobe_hook": t.objs.UprobeHook, "uretprobe_hook": t.objs.UretprobeHook, "sys_enter": t.objs.SysEnter,
	} {
		if p == nil { // not loaded (SyscallsOnly)
			continue
		}
		st, err := p.Stats()
		if err != nil || st.Runtime <= 0 || st.RunCount == 0 {
			continue
		}
		out[name] = events.ProgramTime{Runs: st.RunCount, NS: uint64(st.Runtime)}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Seen counts the threads and lock addresses seen so far.
func (t *Tracer) Seen() (threads, locks int64) {
	return t.conv.Seen()
}

// Events is the number of event records handed out so far.
func (t *Tracer) Events() uint64 { return t.conv.Events() }

// closeLinks detaches every probe. Removing a uprobe waits for a grace
// period (tens of milliseconds, more on a busy machine); one at a time,
// forty of them took seconds, so they go together.
func (t *Tracer) closeLinks() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	var wg sync.WaitGroup
	for _, l := range t.links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Close()
		}()
	}
	wg.Wait()
	t.links = nil
}

// Close releases everything.
func (t *Tracer) Close() error {
	t.follows.Wait()
	t.closeLinks()
	if t.rd != nil {
		t.rd.Close()
	}
	return t.objs.Close()
}

// Exiting is called while pid is held at its exit, memory intact: the last
// chance to read its mappings.
func (t *Tracer) Exiting(pid int) {
	t.conv.RefreshMaps(uint32(pid))
	t.placeMu.Lock()
	delete(t.plans, pid)
	t.placeMu.Unlock()
}
