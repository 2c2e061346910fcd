// Package events owns hooktrace's event model and its trace-file format.
//
// It is the leaf every other package shares: the tracer turns probe hits into
// Events and Stacks, the trace file stores them, and the analyzer reads them
// back, live or offline. It imports nothing outside the standard library so
// that offline analysis builds anywhere Go does.
package events

// Op names the traced call or kernel event an Event reports.
type Op uint16

// The order of these constants is part of the trace-file format: append only.
const (
	OpNone Op = iota

	// Allocator entry points.
	OpMalloc
	OpCalloc
	OpRealloc
	OpFree
	OpPosixMemalign
	OpAlignedAlloc
	OpMemalign
	OpValloc
	OpPvalloc

	// Memory syscalls, seen at the syscall tracepoint however they were made.
	OpMadvise
	OpMunmap
	OpMremap
	OpBrk
	OpMmap

	// pthread mutexes.
	OpMutexLock
	OpMutexTrylock
	OpMutexTimedlock
	OpMutexClocklock
	OpMutexUnlock
	OpMutexInit
	OpMutexDestroy

	// pthread rwlocks.
	OpRwlockRdlock
	OpRwlockWrlock
	OpRwlockTryrdlock
	OpRwlockTrywrlock
	OpRwlockTimedrdlock
	OpRwlockTimedwrlock
	OpRwlockClockrdlock
	OpRwlockClockwrlock
	OpRwlockUnlock

	// pthread spinlocks.
	OpSpinLock
	OpSpinTrylock
	OpSpinUnlock

	// Condition variables: the entry releases Addr2 (the mutex), the return
	// takes it back.
	OpCondWait
	OpCondTimedwait

	// Threads and processes.
	OpThreadCreate // TID created Arg (a new thread or, with FlagProcess, a process)
	OpThreadExit
	OpExec

	// User-chosen functions (--probe); Arg is the index into Header.UserProbes.
	OpProbeEnter
	OpProbeExit

	// Lifetimes of rwlocks and spinlocks (mutexes have theirs above).
	// rwlock_init's Arg is the attribute's preference (0 without one).
	OpRwlockInit
	OpRwlockDestroy
	OpSpinInit
	OpSpinDestroy

	opCount
)

var opNames = [...]string{
	OpNone:              "none",
	OpMalloc:            "malloc",
	OpCalloc:            "calloc",
	OpRealloc:           "realloc",
	OpFree:              "free",
	OpPosixMemalign:     "posix_memalign",
	OpAlignedAlloc:      "aligned_alloc",
	OpMemalign:          "memalign",
	OpValloc:            "valloc",
	OpPvalloc:           "pvalloc",
	OpMadvise:           "madvise",
	OpMunmap:            "munmap",
	OpMremap:            "mremap",
	OpBrk:               "brk",
	OpMmap:              "mmap",
	OpMutexLock:         "pthread_mutex_lock",
	OpMutexTrylock:      "pthread_mutex_trylock",
	OpMutexTimedlock:    "pthread_mutex_timedlock",
	OpMutexClocklock:    "pthread_mutex_clocklock",
	OpMutexUnlock:       "pthread_mutex_unlock",
	OpMutexInit:         "pthread_mutex_init",
	OpMutexDestroy:      "pthread_mutex_destroy",
	OpRwlockRdlock:      "pthread_rwlock_rdlock",
	OpRwlockWrlock:      "pthread_rwlock_wrlock",
	OpRwlockTryrdlock:   "pthread_rwlock_tryrdlock",
	OpRwlockTrywrlock:   "pthread_rwlock_trywrlock",
	OpRwlockTimedrdlock: "pthread_rwlock_timedrdlock",
	OpRwlockTimedwrlock: "pthread_rwlock_timedwrlock",
	OpRwlockClockrdlock: "pthread_rwlock_clockrdlock",
	OpRwlockClockwrlock: "pthread_rwlock_clockwrlock",
	OpRwlockUnlock:      "pthread_rwlock_unlock",
	OpSpinLock:          "pthread_spin_lock",
	OpSpinTrylock:       "pthread_spin_trylock",
	OpSpinUnlock:        "pthread_spin_unlock",
	OpCondWait:          "pthread_cond_wait",
	OpCondTimedwait:     "pthread_cond_timedwait",
	OpThreadCreate:      "thread_create",
	OpThreadExit:        "thread_exit",
	OpExec:              "exec",
	OpProbeEnter:        "probe_enter",
	OpProbeExit:         "probe_exit",
	OpRwlockInit:        "pthread_rwlock_init",
	OpRwlockDestroy:     "pthread_rwlock_destroy",
	OpSpinInit:          "pthread_spin_init",
	OpSpinDestroy:       "pthread_spin_destroy",
}

// String returns the traced function's or syscall's name, as users write it.
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op(" + itoa(uint64(o)) + ")"
}

// Valid reports whether o is an op this version knows.
func (o Op) Valid() bool { return o > OpNone && o < opCount }

// OpByName returns the op whose String is name.
func OpByName(name string) (Op, bool) {
	for i, n := range opNames {
		if n == name && i != int(OpNone) {
			return Op(i), true
		}
	}
	return OpNone, false
}

// Ops lists every valid op in order.
func Ops() []Op {
	ops := make([]Op, 0, opCount-1)
	for o := OpNone + 1; o < opCount; o++ {
		ops = append(ops, o)
	}
	return ops
}

// IsAllocator reports whether o is an allocator entry point.
func (o Op) IsAllocator() bool { return o >= OpMalloc && o <= OpPvalloc }

// IsMemSyscall reports whether o is a memory syscall.
func (o Op) IsMemSyscall() bool { return o >= OpMadvise && o <= OpMmap }

// IsLockAcquire reports whether o tries to take a lock.
func (o Op) IsLockAcquire() bool {
	switch o {
	case OpMutexLock, OpMutexTrylock, OpMutexTimedlock, OpMutexClocklock,
		OpRwlockRdlock, OpRwlockWrlock, OpRwlockTryrdlock, OpRwlockTrywrlock,
		OpRwlockTimedrdlock, OpRwlockTimedwrlock, OpRwlockClockrdlock, OpRwlockClockwrlock,
		OpSpinLock, OpSpinTrylock:
		return true
	}
	return false
}

// IsTry reports whether o gives up instead of waiting (it can never be the
// waiting half of a deadlock).
func (o Op) IsTry() bool {
	return o == OpMutexTrylock || o == OpRwlockTryrdlock || o == OpRwlockTrywrlock || o == OpSpinTrylock
}

// IsTimed reports whether o waits with a deadline.
func (o Op) IsTimed() bool {
	switch o {
	case OpMutexTimedlock, OpMutexClocklock, OpRwlockTimedrdlock, OpRwlockTimedwrlock,
		OpRwlockClockrdlock, OpRwlockClockwrlock:
		return true
	}
	return false
}

// IsRead reports whether o takes a rwlock for reading.
func (o Op) IsRead() bool {
	switch o {
	case OpRwlockRdlock, OpRwlockTryrdlock, OpRwlockTimedrdlock, OpRwlockClockrdlock:
		return true
	}
	return false
}

// IsLockInit reports whether o starts a lock's lifetime.
func (o Op) IsLockInit() bool {
	return o == OpMutexInit || o == OpRwlockInit || o == OpSpinInit
}

// IsLockDestroy reports whether o ends a lock's lifetime.
func (o Op) IsLockDestroy() bool {
	return o == OpMutexDestroy || o == OpRwlockDestroy || o == OpSpinDestroy
}

// IsUnlock reports whether o releases a lock.
func (o Op) IsUnlock() bool {
	return o == OpMutexUnlock || o == OpRwlockUnlock || o == OpSpinUnlock
}

// Flags qualify an Event.
type Flags uint16

const (
	// FlagReturn marks the return half of a call traced at both ends
	// (trylock and timed locks, cond_wait, user probes). Ret is valid.
	FlagReturn Flags = 1 << iota
	// FlagAcquired: the lock call took the lock. Blocking lock calls are
	// traced at entry only and carry it, because a thread that is seen again
	// got its lock (a thread that never comes back is what hang detection is
	// for).
	FlagAcquired
	// FlagInAlloc: the thread was inside an allocator call when this event
	// happened (a hook running inside malloc/free, or a nested allocator call).
	// Addr2 holds the op of the enclosing allocator call.
	FlagInAlloc
	// FlagProcess: with OpThreadCreate, the new task is a process (fork), not
	// a thread.
	FlagProcess
	// FlagLocksHeld: the kernel side saw this thread holding at least one lock.
	FlagLocksHeld
	// FlagBusy: a mutex or rwlock destroy found the lock held, as its word
	// says; Addr2 is the holder's TID where the word names one (a mutex's
	// owner, a rwlock's writer). On OpSpinInit: the eBPF recorder saw the
	// call at the address pthread_spin_init shares with
	// pthread_spin_unlock (glibc 2.36), the caller not holding the lock,
	// and its word saying held (0 or below): by another thread, or memory
	// not yet a lock (zeroed, a reused chunk). The analysis takes it for
	// a release when another thread holds the lock.
	FlagBusy
)

// MutexKind is the type of a pthread mutex, read from the mutex itself
// (__kind at offset 16 on x86-64 glibc).
type MutexKind uint8

const (
	MutexNormal     MutexKind = 0
	MutexRecursive  MutexKind = 1
	MutexErrorCheck MutexKind = 2
	MutexAdaptive   MutexKind = 3
)

func (k MutexKind) String() string {
	switch k {
	case MutexNormal:
		return "normal"
	case MutexRecursive:
		return "recursive"
	case MutexErrorCheck:
		return "error-check"
	case MutexAdaptive:
		return "adaptive"
	}
	return "kind(" + itoa(uint64(k)) + ")"
}

// Event is one traced call or kernel event. Field meaning by op:
//
//	allocator:     Addr = pointer argument (realloc, free), Size = requested
//	               bytes (calloc: nmemb*size; free: the chunk's size from its
//	               header, 0 when unknown), Arg = alignment (memalign family).
//	madvise:       Addr, Size = len, Arg = advice.
//	munmap:        Addr, Size = len.
//	mremap:        Addr, Size = old len, Arg = new len.
//	mmap:          Addr (hint), Size = len, Arg = prot | flags<<32.
//	brk:           Addr.
//	lock calls:    Addr = the lock, Arg = MutexKind (mutexes; raw __kind),
//	               the preference (rwlocks; glibc's __flags, 2 for
//	               PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP),
//	               Ret = the call's result where FlagReturn is set.
//	unlock:        of a mutex or rwlock the thread does not hold: sent
//	               with its stack, Addr2 = the holder's TID its word names
//	               (0: nobody, or readers).
//	init/destroy:  Addr = the lock; rwlock_init: Arg = the attribute's
//	               preference; a destroy of a held mutex or rwlock has
//	               FlagBusy and its stack.
//	cond_wait:     Addr = the condition variable, Addr2 = the mutex.
//	thread_create: Arg = the new TID.
//	thread_exit:   Ret = exit code (processes).
//	exec:          PID keeps its number; everything before belongs to the
//	               old image.
//	probe_*:       Arg = index into Header.UserProbes.
//	probe_enter:   Addr = the function's first integer argument (rdi);
//	               Size = the stack slot of its return address, which its
//	               probe_exit carries too (0 in older traces): a user-level
//	               thread may return on another thread.
//
// FlagInAlloc events carry the enclosing allocator call in Addr2: its op in
// the low 16 bits, and above them a number the thread's outermost allocator
// calls count up with, so that events of two calls can be told apart
// (InAllocCall).
type Event struct {
	Time  uint64 // CLOCK_MONOTONIC, ns
	PID   uint32 // thread group (process) ID
	TID   uint32
	Op    Op
	Flags Flags
	Addr  uint64
	Addr2 uint64
	Size  uint64
	Arg   uint64
	Ret   int64
	Stack uint32 // Stack.ID, 0 when none was taken
}

// InAllocCall returns, for a FlagInAlloc event, the allocator call it ran
// in: its op and the thread's number for that call.
func (e *Event) InAllocCall() (Op, uint64) {
	return Op(e.Addr2 & 0xffff), e.Addr2 >> 16
}

// Has reports whether every flag in f is set.
func (e *Event) Has(f Flags) bool { return e.Flags&f == f }

// Frame is one symbolized stack frame.
type Frame struct {
	Addr     uint64 // the return address (or the IP, for the first frame)
	Function string // demangled; empty when unknown
	Offset   uint64 // Addr - the function's start; with no function, Addr's place in Object (its ELF address)
	File     string // source file, from DWARF; empty when unknown
	Line     uint32
	Object   string // the mapped file's path
}

// Stack is a user stack, innermost frame first. Truncated is set when the
// unwinder stopped early (frame pointers missing in glibc or in -O2 code), so
// reports do not print a short stack as if it were whole.
type Stack struct {
	ID        uint32
	Frames    []Frame
	Truncated bool
}

// Thread names a thread.
type Thread struct {
	PID  uint32
	TID  uint32
	Name string // comm
}

// LockName names a lock instance at its first sighting: static locks by
// their ELF data symbol, heap locks by where they were initialised or first
// taken.
type LockName struct {
	PID  uint32
	Addr uint64
	Name string // "vma_lock (librcache.so)", or empty when it has no symbol
}

// Lost reports events the kernel could not deliver (ring buffer full).
type Lost struct {
	Time  uint64
	Count uint64
}

// ProbeSite is one place the tracer attached.
type ProbeSite struct {
	Name    string `json:"name"`             // function or tracepoint
	Object  string `json:"object,omitempty"` // the file probed; empty for tracepoints
	Offset  uint64 `json:"offset,omitempty"` // from the function's start
	Address uint64 `json:"address,omitempty"`
	Kind    string `json:"kind"`           // uprobe, uretprobe, raw_tracepoint, preload (interposed), preload-got (a GOT slot the shim rewrites)
	Note    string `json:"note,omitempty"` // why an offset was chosen, or why a site was refused
}

// Header opens a trace file and says what it holds.
type Header struct {
	Version    int         `json:"version"`
	Tool       string      `json:"tool"`    // "hooktrace <version>"
	Command    []string    `json:"command"` // run: argv; attach: empty
	PID        uint32      `json:"pid"`
	Exe        string      `json:"exe,omitempty"`
	Host       string      `json:"host"`
	Kernel     string      `json:"kernel"`
	Clock      string      `json:"clock"` // always "CLOCK_MONOTONIC"
	StartNS    uint64      `json:"start_ns"`
	StartUnix  int64       `json:"start_unix_ns"`
	Mode       string      `json:"mode"` // "aggregate" or "full"
	Probes     []ProbeSite `json:"probes"`
	UserProbes []string    `json:"user_probes,omitempty"`
	Forbid     []string    `json:"forbid,omitempty"`
	Allocator  string      `json:"allocator,omitempty"` // "glibc", "jemalloc", ...
	// Recorder is what recorded the events: "ebpf" (uprobes and
	// tracepoints) or "preload" (the preloaded library). Empty in files
	// written before there was a choice: ebpf. "none" when nothing was
	// recorded and hang detection alone watched the process; Unrecorded
	// then says why (attach without the right to load BPF programs, or a
	// deadlock found before the probes were placed).
	Recorder   string `json:"recorder,omitempty"`
	Unrecorded string `json:"unrecorded,omitempty"`
	// NoEBPF is why the eBPF half did not record with --recorder auto:
	// what the kernel lacks or its verifier refused (the preload recorder
	// then recorded alone, without the kernel's syscall tracepoint).
	NoEBPF string `json:"no_ebpf,omitempty"`
}

// Footer closes a trace file. A file without one was cut short.
type Footer struct {
	EndNS      uint64            `json:"end_ns"`
	Events     uint64            `json:"events"`      // event records written
	Lost       uint64            `json:"lost_events"` // ring-buffer drops
	Calls      map[string]uint64 `json:"calls"`       // every traced call, including those aggregated in the kernel
	ExitStatus *int              `json:"exit_status,omitempty"`
	ExitSignal string            `json:"exit_signal,omitempty"`
	Reason     string            `json:"reason,omitempty"` // why tracing stopped
	// Hang is the deadlock hang detection found in the live process, if
	// it found one (tracing then stopped).
	Hang *Hang `json:"hang,omitempty"`
	// ProbeTime is the eBPF recorder's programs' own time, by program,
	// when the kernel counted it (kernel.bpf_stats_enabled): what the
	// probes cost beyond their traps.
	ProbeTime map[string]ProgramTime `json:"probe_time,omitempty"`
	// StackReads is how the eBPF recorder's probes read the threads'
	// stacks: "direct map", or "bpf_probe_read_user (why)", which makes
	// every allocator call dearer. Empty when no probe read a stack.
	StackReads string `json:"stack_reads,omitempty"`
	// Unrecorded counts the process images that ran traced and could not
	// record (the preload recorder: a static or setuid program, or the
	// library's shared memory out of its reach).
	Unrecorded uint64 `json:"unrecorded_processes,omitempty"`
	// Ranks are the ranks of a parallel job's processes, by PID, where
	// the recorder learnt them: from the environment (MPI, GASNet, UPC++)
	// or, for UPC++'s smp conduit, where rank 0 forks the others, by fork
	// order (rank 0's first child is rank 1).
	Ranks map[uint32]int `json:"ranks,omitempty"`
}

// ProgramTime is a BPF program's runs and the time they took.
type ProgramTime struct {
	Runs uint64 `json:"runs"`
	NS   uint64 `json:"ns"`
}

// Hang is what hang detection read from a process whose threads stayed
// blocked in lock waits: every such thread, the lock it waits for and that
// lock's owner, so that the deadlock can be explained offline.
type Hang struct {
	Time    uint64 `json:"time_ns"` // CLOCK_MONOTONIC when it was confirmed
	PID     uint32 `json:"pid"`
	Timeout uint64 `json:"timeout_ns"` // every thread listed was blocked at least this long
	Action  string `json:"action"`     // what hooktrace did then: "kill" or "detach"
	// AtStart is true when the cycle was already there when hang detection
	// began (attach to a hung process): Samples samples, over Timeout,
	// found every thread listed blocked on the same lock, with the same
	// owners, and none of them ran in between; the timeout was not waited
	// out.
	AtStart bool         `json:"at_start,omitempty"`
	Samples int          `json:"samples,omitempty"`
	Threads []HangThread `json:"threads"`
}

// HangThread is one blocked thread of a Hang.
type HangThread struct {
	TID  uint32 `json:"tid"`
	Name string `json:"name,omitempty"`
	// Lock is the address waited on: a pthread mutex, or glibc's arena
	// lock (inside main_arena or a heap's arena).
	Lock     uint64 `json:"lock"`
	LockName string `json:"lock_name,omitempty"` // "vma_lock (librcache.so)", "glibc malloc arena"
	LockKind string `json:"lock_kind"`           // "mutex", "arena", "futex" (unknown)
	// Owner is the TID holding the lock, 0 when unknown; OwnerFrom says
	// how it was found (a mutex's __owner field, or for the arena lock,
	// which records no owner, the owner's stack).
	Owner     uint32  `json:"owner,omitempty"`
	OwnerFrom string  `json:"owner_from,omitempty"`
	BlockedNS uint64  `json:"blocked_ns"`
	Stack     []Frame `json:"stack"`
	Truncated bool    `json:"stack_truncated,omitempty"`
}

// Version is the trace-file format version this package writes.
const Version = 1

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// RecordKind says which field of a Record is set.
type RecordKind uint8

// The order of these constants is part of the trace-file format: append only.
const (
	RecHeader RecordKind = iota + 1
	RecEvent
	RecStack
	RecThread
	RecLockName
	RecLost
	RecFooter
)

// Record is one item of an event stream, live from the tracer or read from a
// trace file. Exactly the field named by Kind is meaningful. A stack record
// comes before the first event that refers to it.
type Record struct {
	Kind     RecordKind
	Header   *Header
	Event    Event
	Stack    *Stack
	Thread   Thread
	LockName LockName
	Lost     Lost
	Footer   *Footer
}
