//go:build linux && amd64

package tracer

import (
	"path/filepath"
	"strings"

	"github.com/hooktrace/hooktrace/tracer/symbolize"
)

// allocRange is where an allocator's code lies in its object, as file
// offsets. A return address in this range on a thread's stack means the
// thread is inside an allocator call.
type allocRange struct {
	obj    *symbolize.Object
	object string // its path
	name   string // "glibc", "jemalloc", ...
	lo, hi uint64
}

// glibcAllocFuncs are malloc.c's functions, public and internal (named
// through the debug file); together they bound glibc's allocator code.
var glibcAllocFuncs = []string{
	"malloc", "free", "calloc", "realloc", "memalign", "posix_memalign", "aligned_alloc",
	"valloc", "pvalloc", "malloc_trim", "malloc_usable_size", "mallinfo2", "malloc_stats",
	"_int_free", "_int_malloc", "_int_realloc", "_int_memalign", "sysmalloc",
	"malloc_consolidate", "munmap_chunk", "mremap_chunk", "arena_get2", "_int_new_arena",
	"tcache_init", "ptmalloc_init", "new_heap", "alloc_new_heap",
}

// findAllocator says which allocator provides malloc in the plan and
// where its code lies. glibc's allocator is a part of libc, bounded by its
// functions; any other allocator library is all allocator.
func findAllocator(plan []site) *allocRange {
	var object string
	var o *symbolize.Object
	for _, s := range plan {
		if s.fn.name == "malloc" {
			object, o = s.object, s.obj
		}
	}
	if o == nil {
		return nil
	}
	if _, err := o.Func("_int_malloc"); err == nil || strings.HasPrefix(filepath.Base(object), "libc.so") {
		r := &allocRange{obj: o, object: object, name: "glibc"}
		for _, name := range glibcAllocFuncs {
			sym, err := o.Func(name)
			if err != nil || sym.Offset == 0 {
				continue
			}
			if r.lo == 0 || sym.Offset < r.lo {
				r.lo = sym.Offset
			}
			r.hi = max(r.hi, sym.Offset+max(sym.Size, 1))
		}
		if r.lo == 0 {
			return nil
		}
		return r
	}
	off, size, ok := o.CodeSegment()
	if !ok {
		return nil
	}
	return &allocRange{obj: o, object: object, name: allocatorName(object), lo: off, hi: off + size}
}

func allocatorName(object string) string {
	base := filepath.Base(object)
	for _, n := range []string{"jemalloc", "tcmalloc", "mimalloc", "tbbmalloc", "hoard"} {
		if strings.Contains(base, n) {
			return n
		}
	}
	return strings.SplitN(base, ".so", 2)[0]
}

// cookieRange sets, for an allocator probe at file offset off, where the
// allocator's code lies relative to it (see COOKIE_RANGE_* in BPF); it
// leaves c alone when the range does not fit the cookie's fields.
func (r *allocRange) cookieRange(c *probeCookie, off uint64) {
	if r == nil || r.object == "" || off < r.lo {
		return
	}
	back := off - r.lo
	units := (r.hi - r.lo + 1<<cookieLenUnit - 1) >> cookieLenUnit
	if back >= 1<<cookieBackBits || units == 0 || units >= 1<<cookieLenBits {
		return
	}
	c.back, c.length = uint32(back), uint32(units)
}

// contains reports whether runtime address pc is allocator code: in the
// allocator's object, as the process maps it, and inside its range.
func (r *allocRange) contains(sym *symbolize.Symbolizer, pc uint64) bool {
	if r == nil {
		return false
	}
	o, vaddr, ok := sym.ObjectAt(pc)
	if !ok || o != r.obj {
		return false
	}
	off, err := o.FileOffset(vaddr)
	return err == nil && off >= r.lo && off < r.hi
}
