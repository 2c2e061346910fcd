//go:build linux && amd64

package preload

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/proc"
	"github.com/hooktrace/hooktrace/probesite"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/symbolize"
)

// The shared-memory layout (shmMagic, shmOff*, ...) is src/shm.h's,
// generated into shm_layout.go.

// shimFD is the descriptor the target finds the shared memory at: the
// gate's pipe is 3, the first extra file 4.
const shimFD = 4

// Preload is the user-space recorder: hooktrace preloads a small library
// (src/shim.c) into the target, which records its allocator, lock and
// thread calls into a ring in shared memory, in the BPF ring's record
// layout. It needs no privileges and no kernel trap per call; what it
// cannot see is a call that does not go through the PLT (inside one
// object: glibc's own free -> madvise) and raw system calls.
type Preload struct {
	opts      source.Options
	memfd     *os.File
	id        uint64 // the run's, in the memory and the environment
	mem       []byte
	ring      []byte
	dir       string // holds the library written out for the loader
	shim      string
	conv      *source.Converter
	allocator string
	tail      uint64
	lostTail  uint64 // records skipped that a killed writer never finished

	// The images seen starting (run holds each process at its exec) and
	// the exec records their library sent, by pid: an image that sent
	// none could not record.
	imagesMu      sync.Mutex
	images, execs map[uint32]int
	breakpoints   []events.ProbeSite // the --probe functions the shim breaks on

	// sys, when set, is a BPF tracer with only its tracepoints: the memory
	// syscalls glibc makes inside free, which no interposition sees.
	sys      Syscalls
	sysGroup [][]byte     // stack records waiting for their event
	sysQueue []sysPending // read, not yet merged into the stream

	// live is the running process the library was injected into
	// (attach), until Detach; safeSym reads that process's objects for
	// the safe-point check.
	live    *injected
	safeSym *symbolize.Symbolizer
}

// sysPending is a syscall event (with the records it names) waiting to be
// merged by time with the shim's records.
type sysPending struct {
	time uint64
	recs [][]byte
}

// Syscalls is the kernel's view of the memory syscalls: a BPF tracer
// (tracer.Tracer) opened with SyscallsOnly. Its records are in the shim's
// layout, and this recorder converts them with its own: one converter
// numbers the stacks and watches the processes of both.
type Syscalls interface {
	Attach(pid int, exe string) error
	On() error
	// Stop turns the tracepoints off; what they recorded stays to read.
	Stop()
	// ReadNow hands over the records there are, without waiting.
	ReadNow(f func(rec []byte) error) error
	Sites() []events.ProbeSite
	Lost() uint64
	Calls() map[string]uint64
	Close() error
}

// AddSyscalls adds the kernel's view of the memory syscalls, before the
// target starts. Its events are merged by time into this recorder's
// stream; its thread and exec events are the shim's already. It reads the
// shim's per-thread state, so that a syscall glibc makes inside free is
// flagged inside that free on both sides: told that the kernel records
// (shmFSyscalls), the shim names where that state lies with a syscall the
// tracepoint sees.
//
// The kernel then sees every memory syscall, the libc wrappers' too: the
// shim is told to leave their GOT slots alone, so that each call is
// recorded, and counted in Calls, once.
func (p *Preload) AddSyscalls(s Syscalls) error {
	p.sys = s
	flags := (*uint32)(unsafe.Pointer(&p.mem[shmOffFlags]))
	atomic.StoreUint32(flags, atomic.LoadUint32(flags)|shmFSyscalls)
	return nil
}

// Syscalls says whether the kernel's syscall tracepoint is added.
func (p *Preload) Syscalls() bool { return p.sys != nil }

// New prepares the shared memory and the library. The ring's size
// is opts.RingBytes.
func New(opts source.Options) (*Preload, error) {
	if err := opts.Defaults(); err != nil {
		return nil, err
	}
	if len(opts.UserProbes) > shmProbes {
		return nil, fmt.Errorf("%d functions to probe: the preload recorder takes at most %d", len(opts.UserProbes), shmProbes)
	}
	size := opts.RingBytes
	if size == 0 {
		size = 16 << 20
	}
	if size&(size-1) != 0 || size < 4096 {
		return nil, fmt.Errorf("ring size %d is not a power of two from 4K", size)
	}
	p := &Preload{opts: opts, images: map[uint32]int{}, execs: map[uint32]int{}}
	fd, err := unix.MemfdCreate("hooktrace-ring", 0)
	if err != nil {
		return nil, fmt.Errorf("creating the shared memory: %w", err)
	}
	p.memfd = os.NewFile(uintptr(fd), "hooktrace-ring")
	total := shmHeaderBytes + size
	if err := p.memfd.Truncate(int64(total)); err != nil {
		p.Close()
		return nil, fmt.Errorf("sizing the shared memory: %w", err)
	}
	p.mem, err = unix.Mmap(fd, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("mapping the shared memory: %w", err)
	}
	p.ring = p.mem[shmHeaderBytes:]
	var flags uint32
	if opts.Mode == source.ModeFull {
		flags |= shmFFull
	}
	if opts.FollowForks {
		flags |= shmFFollow
	}
	if !opts.NoSamples {
		flags |= shmFSamples
	}
	le := binary.LittleEndian
	le.PutUint32(p.mem[shmOffVersion:], shmVersion)
	le.PutUint32(p.mem[shmOffFlags:], flags)
	le.PutUint64(p.mem[shmOffDataSize:], uint64(size))
	le.PutUint64(p.mem[shmOffData:], shmHeaderBytes)
	var id [8]byte
	for le.Uint64(id[:]) == 0 {
		if _, err := rand.Read(id[:]); err != nil {
			p.Close()
			return nil, fmt.Errorf("making the run's id: %w", err)
		}
	}
	p.id = le.Uint64(id[:])
	le.PutUint64(p.mem[shmOffID:], p.id)
	// The magic last: a shim that sees it sees the rest.
	atomic.StoreUint64(p.u64(shmOffMagic), shmMagic)
	if err := p.writeShim(); err != nil {
		p.Close()
		return nil, err
	}
	p.conv = source.NewConverter(opts.Warn)
	p.conv.Hide = p.shim
	return p, nil
}

// writeShim writes the library to a private directory: the loader needs a
// path, and one that later children of the target can open too.
func (p *Preload) writeShim() error {
	dir, err := os.MkdirTemp("", "hooktrace-")
	if err != nil {
		return fmt.Errorf("making a directory for the preloaded library: %w", err)
	}
	p.dir = dir
	sum := sha256.Sum256(Shim)
	// The name carries the content: a stack symbolized later names the
	// library that ran.
	p.shim = filepath.Join(dir, "libhooktrace_preload-"+hex.EncodeToString(sum[:6])+".so")
	if err := os.WriteFile(p.shim, Shim, 0o500); err != nil {
		return fmt.Errorf("writing the preloaded library: %w", err)
	}
	return nil
}

// moveMemory makes f, sized and mapped as the memory New made, this
// recorder's shared memory, with the same header; the ring must be empty.
func (p *Preload) moveMemory(f *os.File) error {
	if err := f.Truncate(int64(len(p.mem))); err != nil {
		f.Close()
		return fmt.Errorf("sizing the shared memory: %w", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, len(p.mem), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return fmt.Errorf("mapping the shared memory: %w", err)
	}
	// The magic last, as New writes it.
	copy(mem[8:shmHeaderBytes], p.mem[8:shmHeaderBytes])
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[shmOffMagic])), shmMagic)
	unix.Munmap(p.mem)
	p.memfd.Close()
	p.mem, p.ring, p.memfd = mem, mem[shmHeaderBytes:], f
	return nil
}

func (p *Preload) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[off])) }

// Env returns environ with the library preloaded ahead of the user's own
// LD_PRELOAD entries (a preloaded jemalloc stays the allocator: the shim
// forwards to the next definition), the shared memory's descriptor, and
// its name: this process's own descriptor of it, through /proc, with the
// run's id, for a process whose parent closed the descriptor it inherited
// before exec'ing it (Python's subprocess does, by default).
func (p *Preload) Env(environ []string) []string {
	out := make([]string, 0, len(environ)+3)
	pre := p.shim
	for _, kv := range environ {
		switch {
		case strings.HasPrefix(kv, "LD_PRELOAD="):
			if v := strings.TrimPrefix(kv, "LD_PRELOAD="); v != "" {
				pre += ":" + v
			}
		case strings.HasPrefix(kv, shmEnv+"="), strings.HasPrefix(kv, shmNameEnv+"="):
		default:
			out = append(out, kv)
		}
	}
	return append(out, "LD_PRELOAD="+pre, fmt.Sprintf("%s=%d", shmEnv, shimFD),
		fmt.Sprintf("%s=%016x:/proc/%d/fd/%d", shmNameEnv, p.id, os.Getpid(), p.memfd.Fd()))
}

// Files are the descriptors the target inherits, from fd 4 on.
func (p *Preload) Files() []*os.File { return []*os.File{p.memfd} }

// Attach names the traced process: a gated child, before it execs. Only
// it (and with FollowForks its children) records.
func (p *Preload) Attach(pid int, exe string) error {
	if err := source.CheckProcess(pid); err != nil {
		return err
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&p.mem[shmOffTraced])), uint32(pid))
	if p.sys != nil {
		if err := p.sys.Attach(pid, exe); err != nil {
			return err
		}
	}
	// Watch its mappings from now on: a short-lived target may be gone
	// before its first record is read.
	p.conv.Track(uint32(pid))
	if exe != "" {
		// Which allocator the target will use, for the header: the
		// shim forwards to it and knows exactly when a call is inside
		// it, so the converter needs no address range.
		plan, err := probesite.PlanSites(pid, exe, p.opts.UserProbes, p.probeWarn)
		if err != nil {
			if len(p.opts.UserProbes) > 0 {
				return err
			}
			return nil
		}
		if a := probesite.FindAllocator(plan); a != nil {
			p.allocator = a.Name
			// Where its code is, so that its own lock calls inside
			// an allocator call are not taken for a hook's.
			p.conv.SetAllocatorCode(uint32(pid), a)
			if p.sys != nil {
				// The kernel's tracepoint sees the memory syscalls
				// glibc and the loader make, from the first: their
				// stacks are in libc.
				a.Obj.PrefetchDWARF()
			}
		}
		// And where the user's probes go.
		return p.writeProbes(plan, exe)
	}
	return nil
}

// probeWarn passes on what planning says about the --probe functions
// (which clones are probed); the rest concerns uprobes the shim does not use.
func (p *Preload) probeWarn(msg string) {
	if p.opts.Warn != nil && (strings.HasPrefix(msg, "--probe ") || strings.HasPrefix(msg, probesite.MissingRulePrefix)) {
		p.opts.Warn(msg)
	}
}

// On turns the kernel side on, when there is one (the memory syscalls'
// tracepoint); the shim records from the target's first instruction.
func (p *Preload) On() error {
	if p.sys != nil {
		return p.sys.On()
	}
	return nil
}

// Exec counts a new image of pid, which the shim in it starts with an
// exec record (the shim's exec wrappers put the library back into an
// environment that dropped it, and a process whose descriptor of the
// shared memory was closed opens it again by name, so every image of a
// recorded process records, but for what cannot be preloaded).
func (p *Preload) Exec(pid int) {
	p.imagesMu.Lock()
	p.images[uint32(pid)]++
	p.imagesMu.Unlock()
}

// Unrecorded lists the processes an image of which ran and sent no exec
// record: a static or setuid program, or one the shared memory was out
// of reach of. Complete once Run has returned.
func (p *Preload) Unrecorded() []int {
	p.imagesMu.Lock()
	defer p.imagesMu.Unlock()
	var out []int
	for pid, n := range p.images {
		for range n - p.execs[pid] {
			out = append(out, int(pid))
		}
	}
	slices.Sort(out)
	return out
}

// Exiting takes the last snapshot of pid's mappings, held at its exit.
func (p *Preload) Exiting(pid int) { p.conv.RefreshMaps(uint32(pid)) }

// Library is the path of the library the target preloads.
func (p *Preload) Library() string { return p.shim }

// Allocator names the target's allocator.
func (p *Preload) Allocator() string { return p.allocator }

// Recorder names this recorder in trace headers.
func (p *Preload) Recorder() string { return "preload" }

// Sites lists what the shim interposes.
func (p *Preload) Sites() []events.ProbeSite {
	var out []events.ProbeSite
	lib := "libhooktrace_preload.so"
	if p.live != nil {
		lib = "libhooktrace_inject.so"
	}
	for _, f := range probesite.ProbeFuncs {
		out = append(out, events.ProbeSite{Name: f.Name, Object: lib, Kind: "preload"})
	}
	for _, name := range []string{"pthread_cond_clockwait", "reallocarray", "pthread_create", "pthread_exit",
		"fork", "_Fork", "vfork", "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "execveat",
		"posix_spawn", "posix_spawnp", "_exit", "_Exit", "dlopen", "dlmopen"} {
		out = append(out, events.ProbeSite{Name: name, Object: lib, Kind: "preload"})
	}
	if p.sys != nil {
		out = append(out, p.sys.Sites()...)
	} else {
		// libc's memory wrappers, reached through the GOT slots the
		// shim rewrites in every object but libc.
		for _, name := range []string{"madvise", "munmap", "mmap", "mremap", "brk", "sbrk"} {
			out = append(out, events.ProbeSite{Name: name, Object: lib, Kind: "preload-got"})
		}
	}
	p.imagesMu.Lock()
	out = append(out, p.breakpoints...)
	p.imagesMu.Unlock()
	return out
}

// Run reads the ring and hands each record to emit until stop is closed
// and the ring is drained.
func (p *Preload) Run(stop <-chan struct{}, emit func(*events.Record) error) error {
	p.conv.Emit = emit
	stopped := false
	idle := time.Millisecond
	lostTick := time.Now()
	for {
		if stopped && p.sys != nil {
			p.sys.Stop()
		}
		if err := p.readSys(); err != nil {
			return err
		}
		n, err := p.drain(stopped)
		if err != nil {
			return err
		}
		// Syscall events no shim record will come before any more.
		upTo := proc.Now() - uint64(100*time.Millisecond)
		if stopped {
			upTo = ^uint64(0)
		}
		if err := p.flushSys(upTo); err != nil {
			return err
		}
		if time.Since(lostTick) > time.Second || stopped {
			lostTick = time.Now()
			if err := p.conv.ReportLost(p.Lost()); err != nil {
				return err
			}
		}
		if stopped {
			p.warnUnrecorded()
			return nil
		}
		if n > 0 {
			// A busy ring must not hide the stop: an attach ends when
			// asked to (--duration), while the target goes on writing.
			idle = time.Millisecond
			select {
			case <-stop:
			default:
				continue
			}
		} else {
			select {
			case <-stop:
			case <-time.After(idle):
				idle = min(2*idle, 20*time.Millisecond)
				continue
			}
		}
		// The target is gone (or tracing ends): one last pass, in which
		// records a killed writer left unfinished are skipped. A live
		// process the library was injected into stops recording first.
		if p.live != nil {
			// The slots are restored once no thread is inside the
			// library, and a writer waiting for room in a full ring is:
			// the ring is read meanwhile, so that it gets room, writes
			// and leaves, and nothing is dropped.
			detached := make(chan error, 1)
			go func() { detached <- p.detach() }()
			for waiting := true; waiting; {
				select {
				case err := <-detached:
					if err != nil {
						p.opts.Warn(err.Error())
					}
					waiting = false
				case <-time.After(2 * time.Millisecond):
				}
				if _, err := p.drain(false); err != nil {
					<-detached
					return err
				}
			}
			// Records under way when the threads were stopped, and those
			// of writers that were still waiting for room: they finish
			// as the backlog is read. No new call comes to the library,
			// so the ring goes quiet.
			for quiet := 0; quiet < 2; {
				time.Sleep(10 * time.Millisecond)
				n, err := p.drain(false)
				if err != nil {
					return err
				}
				if n == 0 {
					quiet++
				} else {
					quiet = 0
				}
			}
			p.markDetached()
		}
		stopped = true
	}
}

// drain converts every committed record and returns how many it read.
// final: no writer is left, so an unfinished record will stay unfinished.
func (p *Preload) drain(final bool) (int, error) {
	size := uint64(len(p.ring))
	head := atomic.LoadUint64(p.u64(shmOffHead))
	n := 0
	for p.tail < head {
		off := p.tail & (size - 1)
		hdr := p.ring[off:]
		seq := atomic.LoadUint64((*uint64)(unsafe.Pointer(&hdr[0])))
		ln := uint64(binary.LittleEndian.Uint32(hdr[8:]))
		kind := binary.LittleEndian.Uint32(hdr[12:])
		step := (shmRecHdr + ln + 15) &^ 15
		if seq != p.tail+1 {
			if !final {
				break
			}
			// Reserved and never committed: its writer died in it.
			if kind > shmKindPad || off+step > size || p.tail+step > head {
				p.lostTail++
				p.tail = head
				break
			}
			p.lostTail++
			p.tail += step
			continue
		}
		if kind == shmKindData {
			body := hdr[shmRecHdr : shmRecHdr+ln]
			if len(body) >= source.SizeEvent && binary.LittleEndian.Uint32(body) == recEvent {
				// The kernel's syscall events that happened before
				// this one go first.
				if err := p.flushSys(binary.LittleEndian.Uint64(body[16:])); err != nil {
					return n, err
				}
				if events.Op(binary.LittleEndian.Uint16(body[4:])) == events.OpExec {
					p.imagesMu.Lock()
					p.execs[binary.LittleEndian.Uint32(body[8:])]++
					p.imagesMu.Unlock()
				}
			}
			if err := p.conv.Raw(body); err != nil {
				return n, err
			}
			n++
		}
		p.tail += step
		if n%256 == 0 {
			atomic.StoreUint64(p.u64(shmOffTail), p.tail)
		}
	}
	atomic.StoreUint64(p.u64(shmOffTail), p.tail)
	return n, nil
}

// warnUnrecorded says which processes could not record, once the last
// records are read.
func (p *Preload) warnUnrecorded() {
	pids := p.Unrecorded()
	if len(pids) == 0 {
		return
	}
	what := "1 process could not record (pid"
	if len(pids) > 1 {
		what = fmt.Sprintf("%d processes could not record (pids", len(pids))
	}
	for i, pid := range pids {
		if i == 10 {
			what += " ..."
			break
		}
		what += " " + strconv.Itoa(pid)
	}
	p.opts.Warn(what + "): a static or setuid program (the loader preloads nothing into it), or the recorder's shared memory out of its reach; --recorder ebpf records them")
}

// The record type and ops the merge looks at (bpf/hooktrace.h).
const recEvent = 1

// readSys queues what the syscall tracepoint recorded, without waiting.
func (p *Preload) readSys() error {
	if p.sys == nil {
		return nil
	}
	return p.sys.ReadNow(func(b []byte) error {
		rec := append([]byte(nil), b...)
		if len(b) < source.SizeEvent || binary.LittleEndian.Uint32(b) != recEvent {
			p.sysGroup = append(p.sysGroup, rec)
			return nil
		}
		switch events.Op(binary.LittleEndian.Uint16(b[4:])) {
		case events.OpExec, events.OpThreadCreate, events.OpThreadExit:
			// The shim reports these, from inside the process.
			p.sysGroup = p.sysGroup[:0]
			return nil
		}
		p.sysQueue = append(p.sysQueue, sysPending{time: binary.LittleEndian.Uint64(b[16:]), recs: append(p.sysGroup, rec)})
		p.sysGroup = nil
		return nil
	})
}

// flushSys converts the queued syscall events up to time upTo.
func (p *Preload) flushSys(upTo uint64) error {
	if len(p.sysQueue) == 0 || p.sysQueue[0].time > upTo {
		return nil
	}
	// The BPF ring is in reservation order across CPUs, nearly by time.
	slices.SortStableFunc(p.sysQueue, func(a, b sysPending) int { return cmp.Compare(a.time, b.time) })
	i := 0
	for ; i < len(p.sysQueue) && p.sysQueue[i].time <= upTo; i++ {
		for _, r := range p.sysQueue[i].recs {
			if err := p.conv.Raw(r); err != nil {
				return err
			}
		}
	}
	p.sysQueue = p.sysQueue[i:]
	return nil
}

// Lost is how many records the shim had no room for, plus any a killed
// writer left unfinished.
func (p *Preload) Lost() uint64 {
	n := p.lostTail
	if p.sys != nil {
		n += p.sys.Lost()
	}
	for i := 0; i < 4; i++ {
		n += atomic.LoadUint64(p.u64(shmOffLost + 8*i))
	}
	return n
}

// Calls counts every interposed call by name, recorded or not.
func (p *Preload) Calls() map[string]uint64 {
	out := map[string]uint64{}
	for _, op := range events.Ops() {
		if int(op) >= shmSlotOps {
			continue
		}
		n := atomic.LoadUint64(p.u64(shmOffShared + 8*int(op)))
		for s := 0; s < shmSlots; s++ {
			n += atomic.LoadUint64(p.u64(shmOffSlots + 8*(s*shmSlotOps+int(op))))
		}
		if n > 0 {
			out[op.String()] = n
		}
	}
	if p.sys != nil {
		// The memory syscalls are the kernel's: told so (shmFSyscalls),
		// the shim records and counts none.
		for name, n := range p.sys.Calls() {
			if op, ok := events.OpByName(name); ok && op.IsMemSyscall() {
				out[name] = n
			}
		}
	}
	return out
}

// Seen counts the threads and lock addresses seen so far.
func (p *Preload) Seen() (threads, locks int64) {
	return p.conv.Seen()
}

// Events is the number of event records handed out so far.
func (p *Preload) Events() uint64 { return p.conv.Events() }

// Close releases the shared memory and removes the library (a process
// it was injected into keeps it, dormant).
func (p *Preload) Close() error {
	if p.live != nil {
		if err := p.Detach(); err != nil {
			p.opts.Warn(err.Error())
		}
	}
	if p.mem != nil {
		unix.Munmap(p.mem)
		p.mem = nil
	}
	if p.memfd != nil {
		p.memfd.Close()
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
	if p.sys != nil {
		p.sys.Close()
	}
	return nil
}
