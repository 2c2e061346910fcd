//go:build linux && amd64

package probesite

import (
	"path/filepath"
	"strings"

	"github.com/hooktrace/hooktrace/symbolize"
)

// AllocRange is where an allocator's code lies in its object, as file
// offsets. A return address in this range on a thread's stack means the
// thread is inside an allocator call.
type AllocRange struct {
	Obj    *symbolize.Object
	Object string // its path
	Name   string // "glibc", "jemalloc", ...
	Lo, Hi uint64
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

// FindAllocator says which allocator provides malloc in the plan and
// where its code lies. glibc's allocator is a part of libc, bounded by its
// functions; any other allocator library is all allocator.
func FindAllocator(plan []Site) *AllocRange {
	var object string
	var o *symbolize.Object
	for _, s := range plan {
		if s.Fn.Name == "malloc" {
			object, o = s.Object, s.Obj
		}
	}
	if o == nil {
		return nil
	}
	if _, err := o.Func("_int_malloc"); err == nil || strings.HasPrefix(filepath.Base(object), "libc.so") {
		r := &AllocRange{Obj: o, Object: object, Name: "glibc"}
		for _, name := range glibcAllocFuncs {
			sym, err := o.Func(name)
			if err != nil || sym.Offset == 0 {
				continue
			}
			if r.Lo == 0 || sym.Offset < r.Lo {
				r.Lo = sym.Offset
			}
			r.Hi = max(r.Hi, sym.Offset+max(sym.Size, 1))
		}
		if r.Lo == 0 {
			return nil
		}
		return r
	}
	off, size, ok := o.CodeSegment()
	if !ok {
		return nil
	}
	return &AllocRange{Obj: o, Object: object, Name: allocatorName(object), Lo: off, Hi: off + size}
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

// Contains reports whether runtime address pc is allocator code: in the
// allocator's object, as the process maps it, and inside its range.
func (r *AllocRange) Contains(sym *symbolize.Symbolizer, pc uint64) bool {
	if r == nil {
		return false
	}
	o, vaddr, ok := sym.ObjectAt(pc)
	if !ok || o != r.Obj {
		return false
	}
	off, err := o.FileOffset(vaddr)
	return err == nil && off >= r.Lo && off < r.Hi
}
