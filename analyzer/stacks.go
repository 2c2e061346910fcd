package analyzer

import (
	"encoding/binary"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// Frame is a stack frame as reports show it.
type Frame struct {
	Function string `json:"function"`
	Offset   uint64 `json:"offset,omitempty"`
	File     string `json:"file"`
	Line     uint32 `json:"line"`
	Object   string `json:"object"`
	Address  string `json:"address"`
}

// internStack returns the analysis's stack with st's frames: one for each
// distinct stack, whichever traces send it (the ranks of a job send the
// same ones), with an ID of the analysis's own. Frames are compared
// without their addresses, which differ between processes (ASLR), unless
// an address is all a frame has. The first sender's addresses are kept.
func (a *Analyzer) internStack(st *events.Stack) *events.Stack {
	h := fnv.New64a()
	var buf [8]byte
	for i := range st.Frames {
		f := &st.Frames[i]
		h.Write([]byte(f.Function))
		h.Write([]byte{0})
		h.Write([]byte(f.Object))
		h.Write([]byte{0})
		h.Write([]byte(f.File))
		binary.LittleEndian.PutUint64(buf[:], f.Offset^uint64(f.Line)<<32)
		h.Write(buf[:])
		if frameByAddress(f) {
			binary.LittleEndian.PutUint64(buf[:], f.Addr)
			h.Write(buf[:])
		}
	}
	if st.Truncated {
		h.Write([]byte{1})
	}
	key := h.Sum64()
	for _, c := range a.stackTable[key] {
		if sameFrames(c, st) {
			return c
		}
	}
	a.nstacks++
	c := &events.Stack{ID: a.nstacks, Frames: st.Frames, Truncated: st.Truncated}
	a.stackTable[key] = append(a.stackTable[key], c)
	return c
}

// frameByAddress reports whether a frame is known by its address alone.
func frameByAddress(f *events.Frame) bool {
	return f.Function == "" && f.Offset == 0
}

func sameFrames(x, y *events.Stack) bool {
	if x.Truncated != y.Truncated || len(x.Frames) != len(y.Frames) {
		return false
	}
	for i := range x.Frames {
		f, g := &x.Frames[i], &y.Frames[i]
		if f.Function != g.Function || f.Offset != g.Offset || f.Object != g.Object || f.File != g.File || f.Line != g.Line ||
			(frameByAddress(f) && f.Addr != g.Addr) {
			return false
		}
	}
	return true
}

func framesOf(st *events.Stack) ([]Frame, bool) {
	if st == nil {
		return []Frame{}, false
	}
	out := make([]Frame, len(st.Frames))
	for i, f := range st.Frames {
		out[i] = Frame{
			Function: f.Function,
			Offset:   f.Offset,
			File:     f.File,
			Line:     f.Line,
			Object:   f.Object,
			Address:  "0x" + strconv.FormatUint(f.Addr, 16),
		}
	}
	return out, st.Truncated
}

// ObjectAddress names a frame with no function by its place in its
// object, "libx.so+0x112e", as TSan and perf do: the same in every run,
// and what addr2line or objdump take. It is "" when the frame has a
// function, or no object-relative address (a trace from an older version).
func (f Frame) ObjectAddress() string {
	if f.Function != "" || f.Offset == 0 || f.Object == "" {
		return ""
	}
	return objectBase(f.Object) + "+0x" + strconv.FormatUint(f.Offset, 16)
}

// baseFunction strips compiler clone suffixes (".isra.0", ".constprop.0",
// ".cold") and symbol versions ("@@GLIBC_2.2.5") so glibc's internal names
// match whatever build they come from.
func baseFunction(name string) string {
	if i := strings.IndexByte(name, '@'); i > 0 {
		name = name[:i]
	}
	if i := strings.IndexByte(name, '.'); i > 0 {
		name = name[:i]
	}
	return name
}

// objectBase is the file name of a mapped object's path.
func objectBase(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// isLockImpl reports whether f is inside the lock call itself rather than
// in the code that called it.
func isLockImpl(f *events.Frame) bool {
	fn := strings.TrimLeft(baseFunction(f.Function), "_")
	if strings.HasPrefix(fn, "pthread_") || strings.HasPrefix(fn, "GI___pthread_") ||
		strings.HasPrefix(fn, "lll_") || strings.HasPrefix(fn, "futex_") {
		return true
	}
	if f.Function == "" {
		obj := objectBase(f.Object)
		return strings.HasPrefix(obj, "libc.so") || strings.HasPrefix(obj, "libpthread.so")
	}
	return false
}

// callerFrame is the innermost frame outside the lock implementation: the
// code that took the lock (or initialised it).
func callerFrame(st *events.Stack) *events.Frame {
	if st == nil {
		return nil
	}
	for i := range st.Frames {
		if !isLockImpl(&st.Frames[i]) {
			return &st.Frames[i]
		}
	}
	return nil
}

// allocatorEntries are the public allocator functions, skipped when
// looking for the code that called the allocator.
var allocatorEntries = map[string]bool{
	"malloc": true, "calloc": true, "realloc": true, "free": true, "cfree": true,
	"posix_memalign": true, "aligned_alloc": true, "memalign": true, "valloc": true,
	"pvalloc": true, "__libc_malloc": true, "__libc_calloc": true, "__libc_realloc": true,
	"__libc_free": true, "__libc_memalign": true, "__posix_memalign": true,
	"__libc_valloc": true, "__libc_pvalloc": true, "_mid_memalign": true,
}

// enclosingAllocCall is the stack of the outermost allocator call that st
// (a hook's, or a call made inside the allocator) runs in: st's frames from
// that call's entry outwards, as the call's own event shows them. nil when
// st has no allocator entry (a frame-pointer walk stops in glibc).
func enclosingAllocCall(st *events.Stack) *events.Stack {
	if st == nil {
		return nil
	}
	for i := len(st.Frames) - 1; i >= 0; i-- {
		if allocatorEntries[baseFunction(st.Frames[i].Function)] {
			return &events.Stack{ID: st.ID, Frames: st.Frames[i:], Truncated: st.Truncated}
		}
	}
	return nil
}

// allocCallerFrame is the innermost frame outside the allocator's entry.
func allocCallerFrame(st *events.Stack) *events.Frame {
	if st == nil {
		return nil
	}
	for i := range st.Frames {
		f := &st.Frames[i]
		if allocatorEntries[baseFunction(f.Function)] {
			continue
		}
		if f.Function == "" && strings.HasPrefix(objectBase(f.Object), "libc.so") {
			continue
		}
		return f
	}
	return nil
}

// site names a code location for people: "reg_init+0x1c (librcache.so)".
func site(f *events.Frame) string {
	if f == nil {
		return "an unknown site"
	}
	obj := objectBase(f.Object)
	if f.Function == "" && f.Offset != 0 && obj != "" {
		return obj + "+0x" + strconv.FormatUint(f.Offset, 16)
	}
	if f.Function == "" {
		s := "0x" + strconv.FormatUint(f.Addr, 16)
		if obj != "" {
			s += " (" + obj + ")"
		}
		return s
	}
	s := f.Function
	if f.Offset != 0 {
		s += "+0x" + strconv.FormatUint(f.Offset, 16)
	}
	if obj != "" {
		s += " (" + obj + ")"
	}
	return s
}

// stableSite names a code location for finding IDs: function and object
// base name only, so the same code on another machine (other addresses,
// other build paths) gives the same ID.
func stableSite(f *events.Frame) string {
	if f == nil {
		return "?"
	}
	fn := f.Function
	if fn == "" {
		fn = "?"
	}
	return fn + " (" + objectBase(f.Object) + ")"
}

// memSyscallNames maps libc's memory-syscall wrappers to the call.
var memSyscallNames = map[string]string{
	"madvise": "madvise", "__madvise": "madvise", "posix_madvise": "madvise",
	"munmap": "munmap", "__munmap": "munmap",
	"mremap": "mremap", "__mremap": "mremap",
	"brk": "brk", "__brk": "brk", "sbrk": "sbrk", "__sbrk": "sbrk",
	"mmap": "mmap", "__mmap": "mmap", "mmap64": "mmap", "__mmap64": "mmap",
}

// hookedCall names the memory call a hook runs in, from the hook's stack: a
// libc wrapper frame, else a hook function named after the call it patches
// ("_intercept_madvise", "ucm_override_munmap").
// selfCall reports whether an allocator call inside an allocator call was
// made by the allocator itself, not by a hook: its caller is in the same
// object as the entry point. glibc's posix_memalign, memalign, valloc and
// aligned_alloc relay to malloc when the alignment asks for nothing more
// than malloc's, and realloc to malloc or free; a hook is always in another
// object (glibc 2.34 has no hook variables left).
func selfCall(st *events.Stack) bool {
	if st == nil || len(st.Frames) < 2 {
		return false
	}
	obj := st.Frames[0].Object
	return obj != "" && st.Frames[1].Object == obj
}

func hookedCall(st *events.Stack) string {
	if st == nil {
		return ""
	}
	for i := range st.Frames {
		if c, ok := memSyscallNames[baseFunction(st.Frames[i].Function)]; ok {
			return c
		}
	}
	for i := range st.Frames {
		fn := baseFunction(st.Frames[i].Function)
		for _, c := range []string{"madvise", "munmap", "mremap", "sbrk", "brk", "mmap"} {
			if strings.Contains(fn, c) {
				return c
			}
		}
	}
	return ""
}
