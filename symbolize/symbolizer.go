//go:build linux && amd64

package symbolize

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/unwind"
	"golang.org/x/sys/unix"
)

// cacheSize bounds each generation of a Symbolizer's address caches; at
// most twice as many results are kept.
const cacheSize = 1 << 16

// minRefreshGap keeps addresses no mapping holds (corrupt stack frames)
// from re-reading /proc/PID/maps on every lookup.
const minRefreshGap = 20 * time.Millisecond

// Symbolizer symbolizes addresses of one process. It works from a snapshot
// of the process's mappings, taken by New and renewed by Refresh (the
// tracer calls it when it sees the process map or unmap memory) or when an
// address falls outside every mapping (the process may have dlopen'ed a
// library since). The files mapped are opened when the snapshot is taken,
// so addresses can still be symbolized after the process has exited.
//
// Addresses are symbolized behind the process: by the time a stack is
// looked up, what it points into may have been unmapped (dlclose). So a
// refresh keeps the mappings of objects that went away as long as nothing
// new is mapped over them; only when none of the snapshot's files is still mapped
// as it was (an exec) does the new snapshot start afresh.
//
// A Symbolizer is safe for concurrent use.
type Symbolizer struct {
	pid int

	mu        sync.Mutex
	maps      Maps
	bound     []binding // bound[i] is maps[i]'s object
	files     map[fileID]*Object
	refreshed time.Time
	gone      bool // the process has exited: keep the last snapshot
	// pins: the code of libraries the process loaded, by load base, from
	// the recorder's records of dlopen, kept over whatever a later
	// snapshot finds at those addresses until dlclose unpins them.
	pins map[uint64]pinned

	frames cache[frameKey, []events.Frame]
	data   cache[uint64, string]

	hits, misses int // for tests of the caches
}

// pinned is a loaded library's code mappings and their bindings.
type pinned struct {
	maps  Maps
	bound []binding
}

// binding is a mapping's object and load bias (process address minus the
// object's virtual address).
type binding struct {
	obj  *Object
	bias uint64
}

type fileID struct {
	major, minor uint32
	inode        uint64
	path         string
}

type frameKey struct {
	addr     uint64
	isReturn bool
}

// New returns a Symbolizer for process pid and takes the first snapshot of
// its mappings. It does not fail: an unreadable process symbolizes nothing
// until Refresh succeeds.
func New(pid int) *Symbolizer {
	s := &Symbolizer{pid: pid, files: map[fileID]*Object{}}
	s.mu.Lock()
	_ = s.refresh()
	s.mu.Unlock()
	return s
}

// Fork returns a Symbolizer for pid, a child that s's process forked. The
// child's address space starts as a copy of its parent's, so it starts
// from s's snapshot, then reads its own mappings: a child gone (or
// already exec'ing) before it is looked at still symbolizes what it ran
// between its fork and its end.
func (s *Symbolizer) Fork(pid int) *Symbolizer {
	c := &Symbolizer{pid: pid, files: map[fileID]*Object{}}
	s.mu.Lock()
	c.maps = append(Maps(nil), s.maps...)
	c.bound = append([]binding(nil), s.bound...)
	for id, o := range s.files {
		c.files[id] = o
	}
	for base, p := range s.pins {
		if c.pins == nil {
			c.pins = map[uint64]pinned{}
		}
		c.pins[base] = p
	}
	s.mu.Unlock()
	c.mu.Lock()
	_ = c.refresh()
	c.mu.Unlock()
	return c
}

// Refresh re-reads the process's mappings. After the process has exited it
// keeps the last snapshot and returns an error.
func (s *Symbolizer) Refresh() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refresh()
}

// Maps returns the current snapshot.
func (s *Symbolizer) Maps() Maps {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(Maps(nil), s.maps...)
}

func (s *Symbolizer) refresh() error {
	s.refreshed = time.Now()
	if s.gone {
		return fmt.Errorf("refreshing maps of pid %d: process has exited", s.pid)
	}
	maps, err := ReadMaps(s.pid)
	if err != nil {
		// The snapshot stays. An address space that ended under the
		// read is an exit, or an exec: the process has another one to
		// read, the next image's.
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) ||
			errors.Is(err, ErrSpaceEnded) && exited(s.pid) {
			s.gone = true
		}
		return err
	}

	roots := processRoots(s.pid)
	bound := make([]binding, len(maps))
	for i, m := range maps {
		var obj *Object
		switch {
		case m.IsFile():
			id := fileID{m.Major, m.Minor, m.Inode, m.Path}
			var ok bool
			if obj, ok = s.files[id]; !ok {
				if f, err := openMapped(s.pid, m); err == nil {
					obj, _ = openFile(f, m.Path, roots)
				}
				s.files[id] = obj
			}
		case m.Path == "[vdso]":
			obj = vdsoObject()
		}
		if obj == nil {
			continue
		}
		if bias, ok := obj.bias(m); ok {
			bound[i] = binding{obj: obj, bias: bias}
		}
	}

	if keep := gone(s.maps, s.bound, maps); len(keep) > 0 && survives(s.maps, maps) {
		maps, bound = merge(maps, bound, keep, s.maps, s.bound)
	}
	maps, bound = s.overlay(maps, bound)
	if !onlyAdded(s.maps, maps) {
		// Something was unmapped or replaced: cached results may name the
		// wrong object now.
		s.frames.clear()
		s.data.clear()
	}
	s.maps, s.bound = maps, bound
	return nil
}

// Pin names addresses in the code of the library the process loaded at
// base (dlopen's link_map: its l_addr and l_name) after that library,
// whatever a later snapshot finds there, until Unpin(base). Snapshots are
// taken behind the process, and a library it unloaded by then may have
// another one in its place, or nothing.
func (s *Symbolizer) Pin(base uint64, path string) error {
	if !filepath.IsAbs(path) {
		// dlopen("./libx.so"): the loader keeps the name it was given.
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", s.pid)); err == nil {
			path = filepath.Join(cwd, path)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The file the process mapped, while it maps it: the path may name
	// another file by now (a library rebuilt in place).
	o := s.mappedAt(base, path)
	if o == nil && !s.gone {
		_ = s.refresh()
		o = s.mappedAt(base, path)
	}
	if o == nil {
		var err error
		if o, err = OpenIn(s.pid, path); err != nil {
			return err
		}
	}
	// The identity of the file read, which the path may no longer name.
	var key fileKey
	if f, ok := o.r.(*os.File); ok {
		_, key, _ = fileIdentity(f)
	}
	page := uint64(os.Getpagesize())
	var p pinned
	for _, l := range o.loads {
		if l.Flags&elf.PF_X == 0 || l.Filesz == 0 {
			continue
		}
		m := Mapping{
			Start:  (base + l.Vaddr) &^ (page - 1),
			End:    (base + l.Vaddr + l.Memsz + page - 1) &^ (page - 1),
			Perms:  "r-xp",
			Offset: l.Off &^ (page - 1),
			Major:  unix.Major(key.dev),
			Minor:  unix.Minor(key.dev),
			Inode:  max(key.ino, 1),
			Path:   path,
		}
		if bias, ok := o.bias(m); ok {
			p.maps = append(p.maps, m)
			p.bound = append(p.bound, binding{obj: o, bias: bias})
		}
	}
	if len(p.maps) == 0 {
		return fmt.Errorf("%s has no code to pin", path)
	}
	if s.pins == nil {
		s.pins = map[uint64]pinned{}
	}
	s.pins[base] = p
	s.maps, s.bound = s.overlay(s.maps, s.bound)
	s.frames.clear()
	s.data.clear()
	return nil
}

// mappedAt returns the object of the snapshot's code mapping of the
// library at path loaded at base (the same load bias, the same file), or
// nil.
func (s *Symbolizer) mappedAt(base uint64, path string) *Object {
	paths := []string{path}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		paths = append(paths, real)
	}
	for i, m := range s.maps {
		if b := s.bound[i]; b.obj != nil && b.bias == base && m.Executable() && slices.Contains(paths, m.Path) {
			return b.obj
		}
	}
	return nil
}

// Unpin ends Pin(base): the library is being unloaded. Its mappings stay
// in the snapshot until the next one, which keeps them while nothing else
// is mapped there.
func (s *Symbolizer) Unpin(base uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pins, base)
}

// overlay puts the pinned libraries' mappings into maps, in place of
// whatever overlaps them.
func (s *Symbolizer) overlay(maps Maps, bound []binding) (Maps, []binding) {
	if len(s.pins) == 0 {
		return maps, bound
	}
	var pins []boundMapping
	for _, p := range s.pins {
		for i := range p.maps {
			pins = append(pins, boundMapping{p.maps[i], p.bound[i]})
		}
	}
	all := make([]boundMapping, 0, len(maps)+len(pins))
	for i, m := range maps {
		covered := false
		for _, p := range pins {
			if m.Start < p.m.End && p.m.Start < m.End {
				covered = true
				break
			}
		}
		if !covered {
			all = append(all, boundMapping{m, bound[i]})
		}
	}
	return sorted(append(all, pins...))
}

// processRoots returns the process's root directory, seen through /proc,
// when it is not ours (a container): debug files may be installed there.
func processRoots(pid int) []string {
	root := fmt.Sprintf("/proc/%d/root", pid)
	theirs, err := os.Stat(root + "/")
	if err != nil {
		return nil
	}
	// Compared as directories: readlink says "/" for a container's root too.
	if ours, err := os.Stat("/"); err == nil && os.SameFile(ours, theirs) {
		return nil
	}
	return []string{root}
}

// gone returns the indexes of old's mappings of objects that overlap
// nothing in new: unmapped since, with nothing mapped there again.
// Anonymous memory is not kept: it names nothing, and a process that
// maps and unmaps it at changing addresses would make the list grow.
func gone(old Maps, oldBound []binding, new Maps) []int {
	var out []int
	for i, m := range old {
		if oldBound[i].obj == nil {
			continue
		}
		j := sort.Search(len(new), func(j int) bool { return new[j].End > m.Start })
		if j == len(new) || new[j].Start >= m.End {
			out = append(out, i)
		}
	}
	return out
}

// survives reports whether a file mapping of old is still in new as it
// was: the process still runs the same image (an exec replaces them all).
func survives(old, new Maps) bool {
	for _, m := range old {
		if !m.IsFile() {
			continue
		}
		if i := new.find(m.Start); i >= 0 && new[i] == m {
			return true
		}
	}
	return false
}

// merge adds old's mappings keep (indexes), with their bindings, to new.
func merge(maps Maps, bound []binding, keep []int, old Maps, oldBound []binding) (Maps, []binding) {
	all := make([]boundMapping, 0, len(maps)+len(keep))
	for i := range maps {
		all = append(all, boundMapping{maps[i], bound[i]})
	}
	for _, i := range keep {
		all = append(all, boundMapping{old[i], oldBound[i]})
	}
	return sorted(all)
}

// boundMapping is a mapping with its binding, while a snapshot is rebuilt.
type boundMapping struct {
	m Mapping
	b binding
}

// sorted splits all, sorted by address, into a snapshot's two slices.
func sorted(all []boundMapping) (Maps, []binding) {
	sort.Slice(all, func(i, j int) bool { return all[i].m.Start < all[j].m.Start })
	maps, bound := make(Maps, len(all)), make([]binding, len(all))
	for i, p := range all {
		maps[i], bound[i] = p.m, p.b
	}
	return maps, bound
}

// onlyAdded reports whether every mapping of old is still in new.
func onlyAdded(old, new Maps) bool {
	j := 0
	for _, m := range old {
		for j < len(new) && new[j].Start < m.Start {
			j++
		}
		if j == len(new) || new[j] != m {
			return false
		}
	}
	return true
}

// locate finds the mapping holding addr and, when it belongs to an ELF
// object, the object and the address inside it.
func (s *Symbolizer) locate(addr uint64) (m Mapping, b binding, vaddr uint64, ok bool) {
	i := s.maps.find(addr)
	if i < 0 && !s.gone && time.Since(s.refreshed) >= minRefreshGap {
		if s.refresh() == nil {
			i = s.maps.find(addr)
		}
	}
	if i < 0 {
		return Mapping{}, binding{}, 0, false
	}
	m, b = s.maps[i], s.bound[i]
	if b.obj == nil && m.Path == "" && i > 0 {
		// The tail of a .bss too big for the last file page is anonymous
		// memory right after the object's data mapping.
		prev, pb := s.maps[i-1], s.bound[i-1]
		if pb.obj != nil && prev.End == m.Start && pb.obj.inBSS(addr-pb.bias) {
			return prev, pb, addr - pb.bias, true
		}
	}
	return m, b, addr - b.bias, true
}

// ObjectAt returns the object mapped at addr in the current snapshot and
// addr's virtual address inside it.
func (s *Symbolizer) ObjectAt(addr uint64) (obj *Object, vaddr uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.maps.find(addr)
	if i < 0 || s.bound[i].obj == nil {
		return nil, 0, false
	}
	b := s.bound[i]
	return b.obj, addr - b.bias, true
}

// ResolveCFI is an unwind.Resolver over the current snapshot: the CFI of
// the object mapped at addr, read from the file the process mapped, and
// the mapping's load bias. It does not re-read the mappings: the caller
// refreshes them before a walk, not for each of its frames.
func (s *Symbolizer) ResolveCFI(addr uint64) (*unwind.Object, uint64, bool) {
	s.mu.Lock()
	i := s.maps.find(addr)
	var b binding
	if i >= 0 {
		b = s.bound[i]
	}
	s.mu.Unlock()
	if b.obj == nil {
		return nil, 0, false
	}
	cfi := b.obj.CFI()
	if cfi == nil {
		return nil, 0, false
	}
	return cfi, b.bias, true
}

// Lookup symbolizes one address: the function holding it and, when DWARF
// says code of other functions was inlined there, those too, innermost
// first. isReturn says addr is a return address: it points after the call,
// so the call itself is looked up (addr-1), while Addr stays addr.
// The result is never empty.
func (s *Symbolizer) Lookup(addr uint64, isReturn bool) []events.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]events.Frame(nil), s.lookup(addr, isReturn)...)
}

func (s *Symbolizer) lookup(addr uint64, isReturn bool) []events.Frame {
	key := frameKey{addr, isReturn}
	if f, ok := s.frames.get(key); ok {
		s.hits++
		return f
	}
	s.misses++
	pc := addr
	if isReturn && pc > 0 {
		pc--
	}
	m, b, vaddr, ok := s.locate(pc)
	if !ok {
		// Not cached: a later refresh may find a mapping for it.
		return []events.Frame{{Addr: addr}}
	}
	var frames []events.Frame
	if b.obj == nil {
		frames = []events.Frame{{Addr: addr, Object: m.Path}}
	} else {
		frames = b.obj.frames(vaddr, addr-b.bias, m.Path)
		for i := range frames {
			frames[i].Addr = addr
		}
	}
	s.frames.put(key, frames)
	return frames
}

// Frame symbolizes an instruction pointer. The function is the one the
// symbol table says holds addr, and the line is in that function's own
// source: where code inlined into it was called, when addr is in such code
// (Lookup has the inlined functions).
func (s *Symbolizer) Frame(addr uint64) events.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return outermost(s.lookup(addr, false))
}

// Frames symbolizes a stack, one frame per address, as Frame does: addrs[0]
// is the instruction pointer, the rest are return addresses.
func (s *Symbolizer) Frames(addrs []uint64) []events.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]events.Frame, len(addrs))
	for i, a := range addrs {
		out[i] = outermost(s.lookup(a, i > 0))
	}
	return out
}

func outermost(chain []events.Frame) events.Frame { return chain[len(chain)-1] }

// FramesInlined is Frames with every inlined function as a frame of its
// own, innermost first and all with their address's Addr, as pprof and
// perf --inline show stacks.
func (s *Symbolizer) FramesInlined(addrs []uint64) []events.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]events.Frame, 0, len(addrs))
	for i, a := range addrs {
		out = append(out, s.lookup(a, i > 0)...)
	}
	return out
}

// Data names the static variable holding addr, for naming locks:
// "vma_lock (librcache.so)", or "table+0x40 (prog)" inside one.
func (s *Symbolizer) Data(addr uint64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name, ok := s.data.get(addr); ok {
		s.hits++
		return name, name != ""
	}
	s.misses++
	m, b, vaddr, ok := s.locate(addr)
	if !ok {
		return "", false
	}
	var name string
	if b.obj != nil {
		name, _ = b.obj.dataName(vaddr, m.Path)
	}
	s.data.put(addr, name)
	return name, name != ""
}

// cache is a bounded map: when the current generation is full it becomes
// the previous one, and hits there move back into the current one.
type cache[K comparable, V any] struct {
	cur, prev map[K]V
}

func (c *cache[K, V]) get(k K) (V, bool) {
	if v, ok := c.cur[k]; ok {
		return v, true
	}
	if v, ok := c.prev[k]; ok {
		c.put(k, v)
		return v, true
	}
	var zero V
	return zero, false
}

func (c *cache[K, V]) put(k K, v V) {
	if c.cur == nil {
		c.cur = map[K]V{}
	}
	if len(c.cur) >= cacheSize {
		c.prev, c.cur = c.cur, map[K]V{}
	}
	c.cur[k] = v
}

func (c *cache[K, V]) clear() { c.cur, c.prev = nil, nil }

var vdso struct {
	once sync.Once
	obj  *Object
}

// vdsoObject reads the vDSO mapped into this process. The kernel maps the
// same image into every process of an ABI, so it symbolizes the target's.
func vdsoObject() *Object {
	vdso.once.Do(func() {
		maps, err := ReadMaps(os.Getpid())
		if err != nil {
			return
		}
		for _, m := range maps {
			if m.Path != "[vdso]" || m.End-m.Start > 1<<20 {
				continue
			}
			mem, err := os.Open("/proc/self/mem")
			if err != nil {
				return
			}
			defer mem.Close()
			image := make([]byte, m.End-m.Start)
			if _, err := mem.ReadAt(image, int64(m.Start)); err != nil && err != io.EOF {
				return
			}
			vdso.obj, _ = newObject(bytes.NewReader(image), "[vdso]", nil)
			return
		}
	})
	return vdso.obj
}
