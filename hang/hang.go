//go:build linux && amd64

// Package hang detects a deadlocked process from /proc alone: threads
// blocked in lock waits, each waiting for a lock the next one owns. It
// needs no recorder, so it watches whatever a session traces.
package hang

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/unwind"
)

// Options configure a Watcher.
type Options struct {
	// Timeout is how long the threads of a wait-for cycle must have been
	// blocked, without running at all, before it is reported; a cycle
	// already there when the watch starts is confirmed sooner, by samples.
	Timeout time.Duration
	// Interval is how often the threads are sampled; by default a fifth of
	// Timeout, between 50ms and 1s.
	Interval time.Duration
	// ArenaHeld decides from a stack whether glibc holds its arena lock
	// there (analyzer.ArenaHeld). glibc's arena lock records no owner:
	// without this, a thread waiting for it has no known owner.
	ArenaHeld func(*events.Stack) (held, decided bool)
	// Action is recorded in the Hang ("kill" or "detach").
	Action string
	Warn   func(string)
	// Hide is an object whose frames are not the target's (the preloaded
	// recorder's library), left out of the stacks.
	Hide string
}

// Watcher samples the threads of a live process and reports a
// deadlock: threads blocked in lock waits, each waiting for a lock the
// next one owns, none of them running.
//
// A cycle already there when the watch starts (attach to a hung process)
// is confirmed by samples, the way one would check it in a debugger:
// confirmSamples samples, confirmInterval apart, must each find the same
// threads blocked on the same locks with the same owners, none of them
// having run since the first sample. Threads that block later must stay
// blocked, without running, for Timeout.
//
// Everything comes from /proc: a thread's state and the futex it waits on
// (/proc/PID/task/TID/syscall, whose last two fields are the user stack
// pointer and instruction pointer), its run time (schedstat: a thread that
// ran since the last sample is not stuck), the mutex's __owner and the
// stack (/proc/PID/mem), unwound with the objects' CFI. So it needs the
// right to read the process (ptrace's), not eBPF: Check says whether the
// caller has it.
type Watcher struct {
	pid     int
	opts    Options
	found   chan *events.Hang
	settled chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	settle  func() // closes settled, once
}

// Confirming a cycle that was already there when the watch started: each
// of that many samples, that far apart, must find it unchanged. Waits
// with a deadline are left to Timeout: they end by themselves.
const (
	confirmSamples  = 3
	confirmInterval = 100 * time.Millisecond
)

// Watch starts watching pid. Found delivers at most one Hang. The first
// sample is taken before Watch returns: what it finds blocked was blocked
// before the watch.
func Watch(pid int, opts Options) *Watcher {
	if opts.Interval <= 0 {
		opts.Interval = min(max(opts.Timeout/5, 50*time.Millisecond), time.Second)
	}
	if opts.Warn == nil {
		opts.Warn = func(string) {}
	}
	w := &Watcher{pid: pid, opts: opts, found: make(chan *events.Hang, 1), settled: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	w.settle = sync.OnceFunc(func() { close(w.settled) })
	seen := map[int]*waitSample{}
	first := time.Now()
	long, early, ok := w.sample(seen, first, true)
	if !w.ownersBlocked(early) {
		early = nil // no cycle to confirm
	}
	if len(early) == 0 {
		w.settle()
	}
	go w.run(seen, first, long, early, ok)
	return w
}

// Settled is closed once the threads blocked when the watch started are
// known to close no cycle: at once when none of them waits for a mutex
// that one of them owns, else when a sample finds none; not when they are
// deadlocked (Found delivers that). A recorder started only then does not
// compete with the diagnosis of a process already hung.
func (w *Watcher) Settled() <-chan struct{} { return w.settled }

// ownersBlocked reports whether one of the threads waits for a mutex
// owned by one of them (a pthread mutex's __owner, or the futex word of a
// priority-inheritance one; pthread_join's word is the joined thread's
// TID, and no owner), read without a diagnosis: every wait-for
// cycle has such a wait, since a thread waiting for an arena lock holds
// none. When the memory cannot be read, it says true and leaves the
// answer to the diagnosis.
func (w *Watcher) ownersBlocked(threads []*waitSample) bool {
	if len(threads) == 0 {
		return false
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", w.pid))
	if err != nil {
		return true
	}
	defer mem.Close()
	blocked := map[uint32]bool{}
	for _, t := range threads {
		blocked[uint32(t.tid)] = true
	}
	var b [MutexOwnerOffset + 4]byte
	for _, t := range threads {
		if n, _ := mem.ReadAt(b[:], int64(t.uaddr)); n < len(b) {
			continue
		}
		owner := binary.LittleEndian.Uint32(b[MutexOwnerOffset:])
		if t.cmd == futexLockPI || t.cmd == futexLockPI2 {
			owner = binary.LittleEndian.Uint32(b[:]) & futexTIDMask
		}
		if blocked[owner] {
			return true
		}
	}
	return false
}

// Found delivers the deadlock once one is confirmed.
func (w *Watcher) Found() <-chan *events.Hang { return w.found }

// Stop ends the watch and waits for the sampler to finish.
func (w *Watcher) Stop() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	w.settle()
}

// Check says why the caller cannot watch pid: hang detection reads its
// threads' system calls and its memory, which needs the right to ptrace
// it (the same user, or CAP_SYS_PTRACE, and what Yama allows).
func Check(pid int) error {
	for _, f := range []string{"syscall", "mem"} {
		path := fmt.Sprintf("/proc/%d/%s", pid, f)
		file, err := os.Open(path)
		if err == nil {
			if f == "syscall" {
				_, err = file.Read(make([]byte, 128))
			}
			file.Close()
		}
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				return fmt.Errorf("reading pid %d's threads: %w%s", pid, err, proc.PtraceHint())
			}
			return fmt.Errorf("reading pid %d's threads: %w", pid, err)
		}
	}
	return nil
}

// futex(2) commands a lock waiter blocks in (the private flag and clock
// bit masked off).
const (
	futexWait        = 0
	futexLockPI      = 6
	futexWaitBitset  = 9
	futexLockPI2     = 13
	futexCmdMask     = 0x7f
	futexTIDMask     = 0x3fffffff
	glibcHeapMaxSize = 64 << 20 // HEAP_MAX_SIZE on 64-bit: non-main heaps are aligned to it
)

// MutexOwnerOffset is where x86-64 glibc keeps a pthread_mutex_t's owner
// TID (__data.__owner): the BPF side's GLIBC_MUTEX_OWNER_OFFSET in the
// C/Go contract header, generated into package abi.
const MutexOwnerOffset = int(abi.GlibcMutexOwnerOffset)

// waitSample is one thread seen blocked in a futex wait.
type waitSample struct {
	tid   int
	uaddr uint64
	cmd   uint64
	timed bool // the wait has a deadline
	// sched is schedstat: run time, time waiting to run, and times run;
	// unchanged while the thread does not run.
	sched   string
	sp, pc  uint64
	since   time.Time
	atStart bool // blocked so at the watch's first sample, and since
}

// run diagnoses the first sample's threads, then samples and diagnoses
// until it finds a deadlock, the process is gone, or Stop.
func (w *Watcher) run(seen map[int]*waitSample, first time.Time, long, early []*waitSample, ok bool) {
	defer close(w.done)
	// The symbolizer is kept from one diagnosis to the next (it caches the
	// objects it read); the last set of long waits that had no cycle is not
	// diagnosed again: a thread waiting long in pthread_join, say, would
	// otherwise cost a full diagnosis every tick.
	var sym *symbolize.Symbolizer
	unw := &unwind.Unwinder{}
	symbolizer := func() *symbolize.Symbolizer {
		if sym == nil {
			sym = symbolize.New(w.pid)
		} else {
			sym.Refresh()
		}
		return sym
	}
	lastKey := ""
	// The cycle found among the threads blocked since the first sample,
	// and how many samples in a row found it.
	confirming, cycle, agreed := true, "", 0
	now := first
	// Reset drops a tick not received (Go 1.23 timers).
	timer := time.NewTimer(w.opts.Interval)
	defer timer.Stop()
	for ok {
		// Samples are taken at a steady pace, however long a diagnosis
		// takes.
		next := now.Add(w.opts.Interval)
		if confirming {
			confirming = false
			if len(early) > 0 {
				if h, key := w.diagnose(early, now, symbolizer(), unw); h != nil {
					if key != cycle {
						cycle, agreed = key, 0
					}
					agreed++
					if agreed >= confirmSamples {
						h.AtStart, h.Samples, h.Timeout = true, agreed, uint64(now.Sub(first))
						w.found <- h
						return
					}
					confirming = true
					next = now.Add(confirmInterval)
				}
			}
			if !confirming {
				w.settle()
			}
		}
		if len(long) > 0 {
			sort.Slice(long, func(i, j int) bool { return long[i].tid < long[j].tid })
			var key strings.Builder
			for _, s := range long {
				fmt.Fprintf(&key, "%d:%x:%d,", s.tid, s.uaddr, s.since.UnixNano())
			}
			if key.String() != lastKey {
				lastKey = key.String()
				if h, _ := w.diagnose(long, now, symbolizer(), unw); h != nil {
					w.found <- h
					return
				}
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-w.stop:
			return
		case <-timer.C:
		}
		now = time.Now()
		long, early, ok = w.sample(seen, now, false)
	}
	w.settle() // the process is gone
}

// sample reads every thread of the process, updating seen, and returns
// the threads blocked for Timeout and those blocked, without a deadline,
// since the first sample (firstSample says this is it). ok is false when
// the process is gone.
func (w *Watcher) sample(seen map[int]*waitSample, now time.Time, firstSample bool) (long, early []*waitSample, ok bool) {
	tids, err := taskIDs(w.pid)
	if err != nil {
		return nil, nil, false
	}
	live := map[int]bool{}
	for _, tid := range tids {
		s, ok := sampleWait(w.pid, tid)
		if !ok {
			continue
		}
		live[tid] = true
		prev := seen[tid]
		if prev == nil || prev.uaddr != s.uaddr || prev.sched != s.sched {
			s.since, s.atStart = now, firstSample
			seen[tid] = s
			prev = s
		} else {
			prev.sp, prev.pc = s.sp, s.pc
		}
		if prev.atStart && !prev.timed {
			early = append(early, prev)
		}
		if now.Sub(prev.since) >= w.opts.Timeout {
			long = append(long, prev)
		}
	}
	for tid := range seen {
		if !live[tid] {
			delete(seen, tid)
		}
	}
	sort.Slice(early, func(i, j int) bool { return early[i].tid < early[j].tid })
	return long, early, true
}

// taskIDs lists the threads of pid.
func taskIDs(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// sampleWait reads whether tid is blocked in a futex wait, and where.
func sampleWait(pid, tid int) (*waitSample, bool) {
	dir := fmt.Sprintf("/proc/%d/task/%d/", pid, tid)
	stat, err := os.ReadFile(dir + "stat")
	if err != nil {
		return nil, false
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'S' && stat[i+2] != 'D') {
		return nil, false
	}
	sc, err := os.ReadFile(dir + "syscall")
	if err != nil {
		return nil, false
	}
	f := strings.Fields(string(sc))
	// "NR arg1 ... arg6 sp pc" while in a system call.
	if len(f) != 9 {
		return nil, false
	}
	nr, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || nr != unix.SYS_FUTEX {
		return nil, false
	}
	var v [9]uint64
	for k := 1; k < 9; k++ {
		v[k], err = strconv.ParseUint(strings.TrimPrefix(f[k], "0x"), 16, 64)
		if err != nil {
			return nil, false
		}
	}
	cmd := v[2] & futexCmdMask
	if cmd != futexWait && cmd != futexWaitBitset && cmd != futexLockPI && cmd != futexLockPI2 {
		return nil, false
	}
	sched, _ := os.ReadFile(dir + "schedstat")
	// arg4 is the timeout of every command above (a pointer; 0 for none).
	return &waitSample{tid: tid, uaddr: v[1], cmd: cmd, timed: v[4] != 0, sched: strings.TrimSpace(string(sched)),
		sp: v[7], pc: v[8]}, true
}

// blockedThread is a long-blocked thread read in full.
type blockedThread struct {
	waitSample
	name       string
	stack      *events.Stack
	data       []byte // stack memory from sp up
	kind       string
	lockName   string
	owner      uint32
	ownerFrom  string
	holdsArena bool // its stack is in glibc code that holds an arena lock
}

// diagnose reads the blocked threads in full and returns a Hang when
// their wait-for graph has a cycle, and the cycle: each thread on it, the
// lock it waits for and that lock's owner.
func (w *Watcher) diagnose(blocked []*waitSample, now time.Time, sym *symbolize.Symbolizer, unw *unwind.Unwinder) (*events.Hang, string) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", w.pid))
	if err != nil {
		w.opts.Warn(fmt.Sprintf("hang detection: reading pid %d's memory: %v", w.pid, err))
		return nil, ""
	}
	defer mem.Close()
	maps := sym.Maps()
	readMem := func(addr uint64, n int) []byte {
		b := make([]byte, n)
		k, _ := mem.ReadAt(b, int64(addr))
		return b[:k]
	}
	mainArena := func(addr uint64) bool {
		name, ok := sym.Data(addr)
		return ok && strings.HasPrefix(name, "main_arena")
	}

	threads := make([]*blockedThread, 0, len(blocked))
	byTID := map[uint32]*blockedThread{}
	for _, s := range blocked {
		t := &blockedThread{waitSample: *s, name: proc.ThreadName(w.pid, s.tid)}
		size := 64 << 10
		if m, ok := maps.Find(s.sp); ok {
			size = int(min(uint64(size), m.End-s.sp))
		}
		t.data = readMem(s.sp, size)
		pcs, complete := unwindBlocked(unw, sym, maps, s.pc, s.sp, t.data)
		if w.opts.Hide != "" {
			pcs, complete = maps.DropObject(pcs, complete, w.opts.Hide)
		}
		t.stack = &events.Stack{Frames: sym.Frames(pcs), Truncated: !complete}
		if w.opts.ArenaHeld != nil {
			held, _ := w.opts.ArenaHeld(t.stack)
			t.holdsArena = held
		}
		classifyWait(t, readMem, mainArena, sym)
		threads = append(threads, t)
		byTID[uint32(t.tid)] = t
	}
	inferArenaOwners(threads)

	// A cycle: following owners from some thread comes back to it.
	sort.Slice(threads, func(i, j int) bool { return threads[i].tid < threads[j].tid })
	var cycle strings.Builder
	for _, t := range threads {
		cur, steps := t, 0
		for cur != nil && cur.owner != 0 && steps <= len(threads) {
			cur = byTID[cur.owner]
			steps++
			if cur == t {
				fmt.Fprintf(&cycle, "%d:%x:%d,", t.tid, t.uaddr, t.owner)
				break
			}
		}
	}
	if cycle.Len() == 0 {
		return nil, ""
	}
	h := &events.Hang{
		Time:    proc.Now(),
		PID:     uint32(w.pid),
		Timeout: uint64(w.opts.Timeout),
		Action:  w.opts.Action,
	}
	for _, t := range threads {
		h.Threads = append(h.Threads, events.HangThread{
			TID:       uint32(t.tid),
			Name:      t.name,
			Lock:      t.uaddr,
			LockName:  t.lockName,
			LockKind:  t.kind,
			Owner:     t.owner,
			OwnerFrom: t.ownerFrom,
			BlockedNS: uint64(now.Sub(t.since)),
			Stack:     t.stack.Frames,
			Truncated: t.stack.Truncated,
		})
	}
	return h, cycle.String()
}

// inMutexLock reports whether the stack is inside a pthread mutex lock
// call.
func inMutexLock(st *events.Stack) bool {
	for _, f := range st.Frames {
		fn := strings.TrimLeft(f.Function, "_")
		if strings.HasPrefix(fn, "pthread_mutex_lock") || strings.HasPrefix(fn, "pthread_mutex_timedlock") ||
			strings.HasPrefix(fn, "pthread_mutex_clocklock") || strings.HasPrefix(fn, "GI___pthread_mutex_lock") {
			return true
		}
	}
	return false
}

// classifyWait decides what t waits for: a pthread mutex (its owner from
// __owner, or from the futex word for priority-inheritance mutexes), or
// glibc's arena lock (main_arena's, or a non-main arena at the start of a
// heap: the heap's first word points to it).
func classifyWait(t *blockedThread, readMem func(uint64, int) []byte, mainArena func(uint64) bool, sym *symbolize.Symbolizer) {
	t.kind = "futex"
	switch {
	case t.cmd == futexLockPI || t.cmd == futexLockPI2:
		if b := readMem(t.uaddr, 4); len(b) == 4 {
			t.kind = "mutex"
			t.owner = binary.LittleEndian.Uint32(b) & futexTIDMask
			t.ownerFrom = "the PI mutex's futex word"
		}
	case inMutexLock(t.stack):
		// pthread_mutex_t on x86-64 glibc: __lock at 0, then __owner.
		const owner = MutexOwnerOffset
		if b := readMem(t.uaddr, owner+4); len(b) == owner+4 {
			t.kind = "mutex"
			t.owner = binary.LittleEndian.Uint32(b[owner:])
			t.ownerFrom = "the mutex's __owner"
		}
	case mainArena(t.uaddr):
		t.kind = "arena"
	default:
		heap := t.uaddr &^ (glibcHeapMaxSize - 1)
		if b := readMem(heap, 8); len(b) == 8 && binary.LittleEndian.Uint64(b) == t.uaddr && t.uaddr-heap < 4096 {
			t.kind = "arena"
		}
	}
	switch t.kind {
	case "mutex":
		t.lockName, _ = sym.Data(t.uaddr)
	case "arena":
		t.lockName = "glibc malloc arena"
	}
}

// inferArenaOwners finds who holds each waited-for arena lock, which glibc
// does not record: a blocked thread whose stack is inside glibc code that
// holds an arena lock (free → _int_free → ... → a hook, say) and that
// keeps that arena's address in its live stack (the arena pointer _int_free
// needs to unlock it later). When no stack holds the address but exactly
// one thread holds an arena lock and one arena is waited for, that thread
// is the owner.
func inferArenaOwners(threads []*blockedThread) {
	var holders []*blockedThread
	waited := map[uint64]bool{}
	for _, t := range threads {
		if t.kind == "arena" {
			waited[t.uaddr] = true
			continue // a thread waiting for an arena lock holds none
		}
		if t.holdsArena {
			holders = append(holders, t)
		}
	}
	if len(waited) == 0 || len(holders) == 0 {
		return
	}
	owner := map[uint64]*blockedThread{}
	how := map[uint64]string{}
	for _, h := range holders {
		for arena := range waited {
			if stackHolds(h.data, arena) {
				owner[arena] = h
				how[arena] = "the arena's address in the live stack of thread " + strconv.Itoa(h.tid) +
					", inside glibc code that holds the arena lock"
			}
		}
	}
	if len(owner) == 0 && len(holders) == 1 && len(waited) == 1 {
		for arena := range waited {
			owner[arena] = holders[0]
			how[arena] = "the only blocked thread inside glibc code that holds an arena lock"
		}
	}
	for _, t := range threads {
		if h := owner[t.uaddr]; t.kind == "arena" && h != nil {
			t.owner = uint32(h.tid)
			t.ownerFrom = how[t.uaddr]
		}
	}
}

// stackHolds reports whether the aligned words of data hold v.
func stackHolds(data []byte, v uint64) bool {
	for i := 0; i+8 <= len(data) && i < 16<<10; i += 8 {
		if binary.LittleEndian.Uint64(data[i:]) == v {
			return true
		}
	}
	return false
}

// unwindBlocked unwinds a thread blocked in a system call from its stack
// pointer and instruction pointer alone: /proc gives no other register.
// CFI recovers what the callees saved; the frame pointer of code built with
// frame pointers is often not among it, and then the walk stops at the
// first such frame. The caller's frame pointer is then searched for: a
// stack slot holding a saved frame pointer (0, or an address higher up the
// stack) followed by a return address into code; the first guess with
// which the walk reaches the end of the stack wins. With none, the short
// stack is kept and marked truncated.
func unwindBlocked(unw *unwind.Unwinder, sym *symbolize.Symbolizer, maps symbolize.Maps, pc, sp uint64, data []byte) ([]uint64, bool) {
	pcs, complete := unw.Unwind(sym.ResolveCFI, pc, sp, 0, data)
	first := append([]uint64(nil), pcs...)
	if complete {
		return first, true
	}
	end := sp + uint64(len(data))
	for off := 0; off+16 <= len(data) && off < 16<<10; off += 8 {
		slot := sp + uint64(off)
		saved := binary.LittleEndian.Uint64(data[off:])
		ra := binary.LittleEndian.Uint64(data[off+8:])
		if saved != 0 && (saved <= slot || saved >= end) {
			continue
		}
		if m, ok := maps.Find(ra); !ok || !m.Executable() {
			continue
		}
		if pcs, complete := unw.Unwind(sym.ResolveCFI, pc, sp, slot, data); complete && len(pcs) > len(first) {
			return append([]uint64(nil), pcs...), true
		}
	}
	return first, false
}
