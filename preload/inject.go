//go:build linux && amd64

package preload

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hooktrace/hooktrace/inject"
	"github.com/hooktrace/hooktrace/symbolize"
	"github.com/hooktrace/hooktrace/unwind"
)

// NotInjectableError says why the recorder cannot be loaded into a
// running process at all: attach then needs the eBPF recorder.
type NotInjectableError struct{ Reason string }

func (e *NotInjectableError) Error() string { return e.Reason }

// injectName is the injected library's file name prefix: a process that
// maps one already (an earlier attach) has it called again, not loaded
// anew.
const injectName = "libhooktrace_inject-"

// Exported by src/inject.c.
const (
	symAttach = "hooktrace_attach"
	symDetach = "hooktrace_detach"
)

// InjectOptions bound the wait for a safe point.
type InjectOptions struct {
	// Wait is how long to keep trying while some thread is where a call
	// into the loader is unsafe (inside the allocator, the loader, the
	// library itself); 0 means 2 s.
	Wait time.Duration
	// Cancel, when closed, ends the wait (the attach is over before the
	// recorder was loaded).
	Cancel <-chan struct{}
}

// ErrCanceled is Inject's error when InjectOptions.Cancel ended it.
var ErrCanceled = errors.New("canceled before the recorder was loaded")

// injected is a live process the library records in.
type injected struct {
	pid    int
	base   uint64 // the library's load address in it
	detach uint64
	slots  int // GOT slots rewritten
}

// Injected says how many GOT slots of the process the library rewrote,
// 0 when it was not injected into one.
func (p *Preload) Injected() int {
	if p.live == nil {
		return 0
	}
	return p.live.slots
}

// Inject loads the recorder library into the running process pid (or
// finds it there from an earlier attach) and starts it recording into
// this recorder's shared memory: every thread is stopped with ptrace at a
// point where none is inside the allocator or the loader, one of them
// calls dlopen and then the library's hooktrace_attach, which rewrites
// the GOT slots of the traced calls in every loaded object, and all
// resume. Attach(pid, "") must have named pid first. Detach (Run does it
// when told to stop) puts every slot back.
func (p *Preload) Inject(pid int, o InjectOptions) error {
	if o.Wait == 0 {
		o.Wait = 2 * time.Second
	}
	if stoppedByJobControl(pid) {
		// The calls would run its threads while the user has it stopped.
		return &NotInjectableError{fmt.Sprintf("pid %d is stopped (SIGSTOP, Ctrl-Z): continue it first", pid)}
	}
	maps, err := symbolize.ReadMaps(pid)
	if err != nil {
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	libc, err := findDlopen(pid, maps)
	if err != nil {
		return err
	}
	offAttach, offDetach, err := injectedSymbols()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(o.Wait)
	slots := 0
	for {
		base, mapped := loadedInjected(pid)
		err = inject.With(pid, func(s *inject.Stopped) error {
			t, err := callingThread(s)
			if err != nil {
				return err
			}
			if why := unsafePoint(s, p.safetySymbolizer(pid)); why != "" {
				return &unsafeError{why}
			}
			if base == 0 {
				if err := loadLibrary(s, t, libc); err != nil {
					return err
				}
				if base, mapped = loadedInjected(pid); base == 0 {
					return fmt.Errorf("pid %d: the recorder library is not mapped after dlopen", pid)
				}
			}
			fd, err := p.memoryIn(s, t, libc)
			if err != nil {
				return err
			}
			memPath := fmt.Sprintf("/proc/self/fd/%d", fd)
			at, err := s.PushString(t, memPath)
			if err != nil {
				return err
			}
			// The memories of earlier attaches go when no thread is
			// anywhere in the library (a wrapper's wait included).
			release := uint64(0)
			if unsafeWhere(s, p.safetySymbolizer(pid), anyLibraryFrame) == "" {
				release = 1
			}
			rc, err := s.Call(t, base+offAttach, at, p.id, release)
			if err == nil {
				// Mapped: the process keeps no descriptor of it.
				_, err = s.Call(t, libc.close, fd)
			}
			if err != nil {
				return fmt.Errorf("starting the recorder in pid %d: %w", pid, err)
			}
			if int64(rc) < 0 {
				return fmt.Errorf("pid %d: the recorder library could not map the shared memory: errno %d", pid, -int64(rc))
			}
			slots = int(rc)
			return nil
		})
		var unsafe *unsafeError
		if errors.As(err, &unsafe) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pid %d: no safe point to load the recorder in %v: %s (tried again and again)", pid, o.Wait, unsafe.why)
			}
			select {
			case <-o.Cancel:
				return ErrCanceled
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return err
		}
		if slots == 0 {
			p.live = &injected{pid: pid, base: base, detach: base + offDetach}
			p.Detach()
			return &NotInjectableError{fmt.Sprintf("pid %d calls none of the traced functions through a GOT slot the library could rewrite", pid)}
		}
		p.live = &injected{pid: pid, base: base, detach: base + offDetach, slots: slots}
		// Stacks hide the library's frames, whichever file it was loaded
		// from (an earlier attach's, removed since).
		p.conv.Hide = mapped
		return nil
	}
}

// Detach stops the library recording in the process Inject loaded it
// into: every rewritten slot gets back what it held, and the library
// stays, dormant. What threads were writing is in the ring once Detach
// returns but for a thread that was stopped in the middle of a record.
func (p *Preload) Detach() error {
	// A reader that goes away must not make a late writer wait.
	p.markDetached()
	return p.detach()
}

// markDetached tells the library's writers that no reader will make room
// in a full ring any more: they drop and count instead of waiting.
func (p *Preload) markDetached() {
	flags := (*uint32)(unsafe.Pointer(&p.mem[shmOffFlags]))
	atomic.StoreUint32(flags, atomic.LoadUint32(flags)|shmFDetached)
}

// detach restores the slots, leaving the writers waiting for room, for a
// reader that drains the ring after (Run), then marks it.
func (p *Preload) detach() error {
	if p.live == nil {
		return nil
	}
	l := p.live
	p.live = nil
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := inject.With(l.pid, func(s *inject.Stopped) error {
			// An exec since replaced the image the library was in:
			// nothing of it is left to restore.
			if base, _ := loadedInjected(l.pid); base != l.base {
				return nil
			}
			t, err := callingThread(s)
			if err != nil {
				return err
			}
			judge := func(i int, fn, obj string) string { return inLibrary(i, obj) }
			if why := unsafeWhere(s, p.safetySymbolizer(l.pid), judge); why != "" {
				return &unsafeError{why}
			}
			_, err = s.Call(t, l.detach)
			return err
		})
		var unsafe *unsafeError
		if errors.As(err, &unsafe) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil && !os.IsNotExist(err) {
			if _, serr := os.Stat(fmt.Sprintf("/proc/%d", l.pid)); serr != nil {
				return nil // gone: nothing to restore
			}
			return fmt.Errorf("detaching the recorder from pid %d: %w", l.pid, err)
		}
		return nil
	}
}

// stoppedByJobControl says whether pid is stopped by a signal (state T).
func stoppedByJobControl(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

type unsafeError struct{ why string }

func (e *unsafeError) Error() string { return e.why }

// injectedFile is the injected library's name: the memory file it is
// loaded from is called so (maps show "/memfd:NAME"), and the content
// hash in it tells a process that has this very build loaded already.
func injectedFile() string {
	sum := sha256.Sum256(Injected)
	return injectName + hex.EncodeToString(sum[:6]) + ".so"
}

// loadLibrary has thread t load the injected library from a memory file
// it makes and hooktrace fills: no file is left behind, and the process
// finds it whatever its mount namespace (a container's) or user.
func loadLibrary(s *inject.Stopped, t *inject.Thread, libc libcFuncs) error {
	fd, f, err := memfdIn(s, t, libc, injectedFile())
	if err != nil {
		return err
	}
	_, err = f.Write(Injected)
	f.Close()
	if err != nil {
		s.Call(t, libc.close, fd)
		return fmt.Errorf("writing the recorder library into pid %d: %w", s.PID(), err)
	}
	at, err := s.PushString(t, fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return err
	}
	// RTLD_NOW | RTLD_LOCAL: bound at once, and found by no later lookup
	// of the program's.
	h, err := s.Call(t, libc.dlopen, at, 2)
	if err == nil && h == 0 {
		err = errors.New(dlError(s, t, libc))
	}
	if _, cerr := s.Call(t, libc.close, fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pid %d: loading the recorder library: %w", s.PID(), err)
	}
	return nil
}

// memfdIn has thread t make a memory file called name (close-on-exec),
// and opens it through /proc; it returns the process's descriptor too.
func memfdIn(s *inject.Stopped, t *inject.Thread, libc libcFuncs, name string) (uint64, *os.File, error) {
	at, err := s.PushString(t, name)
	if err != nil {
		return 0, nil, err
	}
	fd, err := s.Call(t, libc.memfdCreate, at, 1)
	if err != nil {
		return 0, nil, fmt.Errorf("calling memfd_create in pid %d: %w", s.PID(), err)
	}
	if int32(fd) < 0 {
		return 0, nil, fmt.Errorf("pid %d: memfd_create: errno %d", s.PID(), -int32(fd))
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", s.PID(), fd), os.O_RDWR, 0)
	if err != nil {
		s.Call(t, libc.close, fd)
		return 0, nil, fmt.Errorf("opening pid %d's memory file: %w", s.PID(), err)
	}
	return fd, f, nil
}

// injectedSymbols are the offsets of the library's entry points.
func injectedSymbols() (attach, detach uint64, err error) {
	f, err := elf.NewFile(bytes.NewReader(Injected))
	if err != nil {
		return 0, 0, fmt.Errorf("reading the recorder library: %w", err)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, 0, fmt.Errorf("reading the recorder library's symbols: %w", err)
	}
	for _, s := range syms {
		switch s.Name {
		case symAttach:
			attach = s.Value
		case symDetach:
			detach = s.Value
		}
	}
	if attach == 0 || detach == 0 {
		return 0, 0, errors.New("the recorder library lacks its entry points")
	}
	return attach, detach, nil
}

// loadedInjected finds the injected library in pid's mappings: its load
// address and the path it was loaded from.
func loadedInjected(pid int) (uint64, string) {
	maps, err := symbolize.ReadMaps(pid)
	if err != nil {
		return 0, ""
	}
	want := injectedFile()
	for _, m := range maps {
		if m.Offset == 0 && strings.TrimPrefix(filepath.Base(m.Path), "memfd:") == want {
			return m.Start, m.Path
		}
	}
	return 0, ""
}

// findDlopen is libc's dlopen in pid (glibc 2.34 and later have it in
// libc), or why the process cannot load a library.
func findDlopen(pid int, maps symbolize.Maps) (libcFuncs, error) {
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if exe != "" && symbolize.ExeIsGo(fmt.Sprintf("/proc/%d/exe", pid)) {
		return libcFuncs{}, &NotInjectableError{fmt.Sprintf("%s is a Go program: it calls no libc allocator or pthread locks a library could see", exe)}
	}
	var libc *symbolize.Mapping
	for i, m := range maps {
		if m.Offset == 0 && m.IsFile() && strings.HasPrefix(filepath.Base(m.Path), "libc.so") {
			libc = &maps[i]
			break
		}
	}
	if libc == nil {
		return libcFuncs{}, &NotInjectableError{fmt.Sprintf("pid %d maps no libc (a static program): there is no loader to load a library", pid)}
	}
	o, _, err := symbolize.OpenMapped(pid, *libc)
	if err != nil {
		return libcFuncs{}, fmt.Errorf("pid %d: reading its libc: %w", pid, err)
	}
	sym, err := o.Func("dlopen")
	if err != nil {
		return libcFuncs{}, &NotInjectableError{fmt.Sprintf("pid %d's libc %s has no dlopen (glibc before 2.34)", pid, libc.Path)}
	}
	// A shared library is linked at 0: its first mapping is its bias.
	f := libcFuncs{dlopen: libc.Start + sym.Value}
	for name, at := range map[string]*uint64{"dlerror": &f.dlerror, "memfd_create": &f.memfdCreate, "close": &f.close} {
		if e, err := o.Func(name); err == nil {
			*at = libc.Start + e.Value
		}
	}
	if f.memfdCreate == 0 || f.close == 0 {
		return libcFuncs{}, &NotInjectableError{fmt.Sprintf("pid %d's libc %s has no memfd_create", pid, libc.Path)}
	}
	return f, nil
}

// libcFuncs are the functions of the target's libc hooktrace calls.
type libcFuncs struct{ dlopen, dlerror, memfdCreate, close uint64 }

// memoryIn makes the shared memory the process records into: a memfd of
// its own, which hooktrace opens through /proc and maps, so that it is
// reachable whoever the two run as (a process cannot open a root
// hooktrace's descriptors). This recorder's memory moves there, header
// and all (its ring is still empty). Returns the process's descriptor.
func (p *Preload) memoryIn(s *inject.Stopped, t *inject.Thread, libc libcFuncs) (uint64, error) {
	fd, f, err := memfdIn(s, t, libc, "hooktrace-ring")
	if err != nil {
		return 0, err
	}
	if err = p.moveMemory(f); err != nil {
		s.Call(t, libc.close, fd)
		return 0, fmt.Errorf("pid %d's shared memory: %w", s.PID(), err)
	}
	return fd, nil
}

// callingThread picks the thread that makes the calls: one whose signal
// mask lets the fault that ends a call through (it is how hooktrace sees
// the call return) and that no seccomp filter confines, the main thread
// when it can.
func callingThread(s *inject.Stopped) (*inject.Thread, error) {
	const segv = 1 << (11 - 1)
	var best *inject.Thread
	for _, t := range s.Threads() {
		// A filtered thread may be killed by its first call the library
		// adds (it reads /proc/self/maps once per thread).
		if t.Seccomp != 0 {
			return nil, &NotInjectableError{fmt.Sprintf("pid %d runs under seccomp (thread %d): the library's system calls may break its filter", s.PID(), t.TID)}
		}
		if t.Blocked&segv != 0 || t.Ignored&segv != 0 {
			continue
		}
		if best == nil || t.TID == s.PID() {
			best = t
		}
	}
	if best != nil {
		return best, nil
	}
	return nil, &NotInjectableError{fmt.Sprintf("every thread of pid %d blocks or ignores SIGSEGV, which hooktrace's calls end with", s.PID())}
}

// dlError is dlerror's message in the target, for a dlopen that failed.
func dlError(s *inject.Stopped, t *inject.Thread, libc libcFuncs) string {
	if libc.dlerror == 0 {
		return "no dlerror to ask why"
	}
	at, err := s.Call(t, libc.dlerror)
	if err != nil || at == 0 {
		return "dlerror gave no reason"
	}
	b, _ := s.ReadMemory(at, 512)
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// safetySymbolizer reads the target's objects for the safe-point check;
// one per recorder.
func (p *Preload) safetySymbolizer(pid int) *symbolize.Symbolizer {
	if p.safeSym == nil {
		p.safeSym = symbolize.New(pid)
	} else {
		p.safeSym.Refresh()
	}
	return p.safeSym
}

// unsafePoint says which thread is where a call into the loader could
// deadlock or corrupt state, or "": inside the allocator (glibc's arena
// lock), the loader (its lock), thread creation or exit (the stack cache
// lock dlopen takes for static TLS), fork, or the recorder library.
func unsafePoint(s *inject.Stopped, sym *symbolize.Symbolizer) string {
	return unsafeWhere(s, sym, unsafeFrame)
}

// unsafeWhere says which thread has a frame judge finds unsafe (judge is
// given the frame's index, 0 innermost, its function and object), or "".
func unsafeWhere(s *inject.Stopped, sym *symbolize.Symbolizer, judge func(i int, fn, obj string) string) string {
	maps := sym.Maps()
	for _, t := range s.Threads() {
		data := readStack(s, maps, t.Regs.Rsp)
		pcs, _ := unwind.AppendUnwind(nil, unwind.Sample{IP: t.Regs.Rip, SP: t.Regs.Rsp, BP: t.Regs.Rbp, Stack: data}, sym.ResolveCFI, 64)
		for i, f := range sym.Frames(pcs) {
			if why := judge(i, f.Function, f.Object); why != "" {
				where := f.Function
				if where == "" {
					where = filepath.Base(f.Object)
				}
				if i > 0 {
					where = "in " + where + " (frame " + fmt.Sprint(i) + ")"
				}
				return fmt.Sprintf("thread %d is %s %s", t.TID, why, where)
			}
		}
	}
	return ""
}

// inLibrary says why frame i, of object obj, is one of the recorder
// library's where starting or stopping it is unsafe, or "": the thread is
// running its code, or a function it called directly (memcpy of a
// record). A thread blocked in a lock call its wrapper made, further up,
// only returns through the wrapper, which may record into the memory of
// an earlier attach, still mapped.
func inLibrary(i int, obj string) string {
	base := strings.TrimPrefix(filepath.Base(obj), "memfd:")
	if i <= 1 && (strings.HasPrefix(base, injectName) || strings.HasPrefix(base, "libhooktrace_preload")) {
		return "inside the recorder library:"
	}
	return ""
}

// anyLibraryFrame is inLibrary at any depth.
func anyLibraryFrame(i int, fn, obj string) string { return inLibrary(0, obj) }

// unsafeFrame says why frame i, in function fn of object obj, makes a
// call into the loader unsafe, or "".
func unsafeFrame(i int, fn, obj string) string {
	if why := inLibrary(i, obj); why != "" {
		return why
	}
	base := filepath.Base(obj)
	switch {
	case strings.HasPrefix(base, "ld-linux") || strings.HasPrefix(base, "ld-"):
		return "inside the loader:"
	case !strings.HasPrefix(base, "libc.so") && !strings.HasPrefix(base, "libc-"):
		return ""
	}
	name := strings.TrimLeft(fn, "_")
	for _, p := range []string{"libc_malloc", "libc_free", "libc_calloc", "libc_realloc", "int_malloc", "int_free",
		"int_realloc", "int_memalign", "malloc", "free", "calloc", "realloc", "tcache", "arena", "sysmalloc",
		"heap_trim", "shrink_heap", "new_heap", "alloc_new_heap", "munmap_chunk", "mremap_chunk", "mtrim",
		"memalign", "posix_memalign", "aligned_alloc", "valloc", "pvalloc", "unlink_chunk", "malloc_consolidate"} {
		if name == p || strings.HasPrefix(name, p+"_") || strings.HasPrefix(name, p+".") {
			return "inside the allocator:"
		}
	}
	for _, p := range []string{"dl_", "libc_dl", "dlopen", "dlclose", "dlsym", "dladdr", "dlmopen", "dlerror",
		"do_dlopen", "do_dlclose", "dl_iterate_phdr", "tls_get_addr"} {
		if strings.HasPrefix(name, p) {
			return "inside the loader:"
		}
	}
	for _, p := range []string{"pthread_create", "allocate_stack", "nptl_deallocate_stack", "nptl_free_stacks",
		"libc_fork", "fork", "Fork", "run_fork_handlers"} {
		if strings.HasPrefix(name, p) {
			return "creating or ending a thread or process:"
		}
	}
	return ""
}

// readStack reads a thread's stack from sp up (at most 32 KiB).
func readStack(s *inject.Stopped, maps symbolize.Maps, sp uint64) []byte {
	size := 32 << 10
	if m, ok := maps.Find(sp); ok {
		size = int(min(uint64(size), m.End-sp))
	}
	b, _ := s.ReadMemory(sp, size)
	return b
}
