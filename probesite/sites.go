//go:build linux && amd64

package probesite

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/funcname"
	"github.com/hooktrace/hooktrace/placement"
	"github.com/hooktrace/hooktrace/symbolize"
)

// ProbeFunc is a function hooktrace traces and how.
type ProbeFunc struct {
	Name string
	Op   events.Op
	Args int  // integer arguments the handler reads
	Ret  bool // also a return probe: its result decides something
}

// The return probe is placed only where the result matters: whether a try
// or timed lock was taken, and when cond_wait takes its mutex back. Each
// function is named by its op (events.Op.String is the function's name), so
// the op list in bpf/hooktrace.h, events.Op and this list cannot drift apart
// (tracer/contract_test.go checks the first two).
var ProbeFuncs = named([]ProbeFunc{
	{Op: events.OpMalloc, Args: 1},
	{Op: events.OpCalloc, Args: 2},
	{Op: events.OpRealloc, Args: 2},
	{Op: events.OpFree, Args: 1},
	{Op: events.OpPosixMemalign, Args: 3},
	{Op: events.OpAlignedAlloc, Args: 2},
	{Op: events.OpMemalign, Args: 2},
	{Op: events.OpValloc, Args: 1},
	{Op: events.OpPvalloc, Args: 1},
	{Op: events.OpMutexLock, Args: 1},
	{Op: events.OpMutexTrylock, Args: 1, Ret: true},
	{Op: events.OpMutexTimedlock, Args: 1, Ret: true},
	{Op: events.OpMutexClocklock, Args: 1, Ret: true},
	{Op: events.OpMutexUnlock, Args: 1},
	{Op: events.OpMutexInit, Args: 1},
	{Op: events.OpMutexDestroy, Args: 1},
	{Op: events.OpRwlockRdlock, Args: 1},
	{Op: events.OpRwlockWrlock, Args: 1},
	{Op: events.OpRwlockTryrdlock, Args: 1, Ret: true},
	{Op: events.OpRwlockTrywrlock, Args: 1, Ret: true},
	{Op: events.OpRwlockTimedrdlock, Args: 1, Ret: true},
	{Op: events.OpRwlockTimedwrlock, Args: 1, Ret: true},
	{Op: events.OpRwlockClockrdlock, Args: 1, Ret: true},
	{Op: events.OpRwlockClockwrlock, Args: 1, Ret: true},
	{Op: events.OpRwlockUnlock, Args: 1},
	{Op: events.OpSpinLock, Args: 1},
	{Op: events.OpSpinTrylock, Args: 1, Ret: true},
	{Op: events.OpSpinUnlock, Args: 1},
	{Op: events.OpCondWait, Args: 2, Ret: true},
	{Op: events.OpCondTimedwait, Args: 2, Ret: true},
	{Op: events.OpRwlockInit, Args: 2},
	{Op: events.OpRwlockDestroy, Args: 1},
	{Op: events.OpSpinInit, Args: 1},
	{Op: events.OpSpinDestroy, Args: 1},
})

// countedAs are functions traced as another op: the analyzer knows one
// timed condition wait, and pthread_cond_clockwait is one (the preloaded
// library counts it so too).
var countedAs = []ProbeFunc{
	{Name: "pthread_cond_clockwait", Op: events.OpCondTimedwait, Args: 2, Ret: true},
}

func named(fs []ProbeFunc) []ProbeFunc {
	for i := range fs {
		fs[i].Name = fs[i].Op.String()
	}
	return fs
}

// site is one function in one object, ready to attach.
type Site struct {
	Fn     ProbeFunc
	Object string // path
	Obj    *symbolize.Object
	// file is the path to attach through: for an object pid maps, a
	// handle on the mapped file (/proc/PID/map_files/...), since a uprobe
	// goes on the file its path names when it is attached.
	File    string
	Sym     symbolize.Symbol
	UserIdx int // for user probes: index into Header.UserProbes
	// alias is an init whose entry point is this unlock's address (glibc
	// 2.36's pthread_spin_init is pthread_spin_unlock); OpNone for most.
	Alias  events.Op
	Code   []byte
	Choice placement.Site
	Live   uint64 // the function's runtime address, 0 when not mapped yet
	// Calls, when not nil, are the calls of the function through the
	// PLTs of the process's objects (placement.CallSites): it has no
	// instruction the kernel emulates, and its calls are probed instead
	// of its entry, unless CallNote says why they cannot be.
	Calls    []CallProbe
	CallNote string
}

// CallProbe is a call of a traced function, probed in the caller.
type CallProbe struct {
	Op     events.Op // what the call is: the name it calls (an alias's own)
	Object string    // the caller's object
	File   string    // the path to attach through (as Site.File)
	Offset uint64    // the instruction's file offset in Object
	placement.CallSite
	Live uint64 // the instruction's runtime address, 0 when not mapped yet
	Code []byte // the instruction's bytes in the file
}

// PlanSites finds, for each traced function, the object that really
// provides it to pid (the first definition in the loader's search order: a
// preloaded or linked-in allocator wins over glibc's), and the offset to
// probe at.
func PlanSites(pid int, exe string, userProbes []string, warn func(string)) ([]Site, error) {
	// One read of the mappings serves the search order and every site's
	// live address; a child not yet exec'd maps none of the target's.
	maps, _ := symbolize.ReadMaps(pid)
	// Each object is read from the file pid maps, when it maps it: the
	// same file (and the same cached Object) its stacks are symbolized and
	// unwound with, even if its path now names another one.
	opened := map[string]*symbolize.Object{}
	via := map[string]string{}
	open := func(path string) *symbolize.Object {
		if o, ok := opened[path]; ok {
			return o
		}
		var o *symbolize.Object
		var err error
		via[path] = path
		if m, ok := fileMapping(maps, path); ok {
			o, via[path], err = symbolize.OpenMapped(pid, m)
		} else {
			o, err = symbolize.OpenIn(pid, path)
		}
		if err != nil {
			warn(fmt.Sprintf("reading %s: %v", path, err))
		}
		opened[path] = o
		return o
	}
	objs, err := searchOrder(pid, exe, maps, open)
	if err != nil {
		return nil, err
	}
	// A uretprobe swaps a return address on the stack, and Go moves and
	// walks its goroutine stacks: return probes would corrupt them.
	goTarget := false
	if o := open(objs[0]); o != nil {
		goTarget = o.IsGo()
	}
	if goTarget {
		warn(fmt.Sprintf("%s is a Go program: no return probes are placed (they corrupt Go stacks), so try and timed lock results, cond_wait's retake and --probe exits are not traced", objs[0]))
	}
	var plan []Site
	seen := map[string]int{} // object:address -> plan index, so aliases are probed once
	for _, fn := range append(slices.Clone(ProbeFuncs), countedAs...) {
		for _, path := range objs {
			o := open(path)
			if o == nil {
				continue
			}
			sym, err := o.Func(fn.Name)
			if err != nil {
				continue
			}
			key := fmt.Sprintf("%s:%x", path, sym.Value)
			i, dup := seen[key]
			switch {
			case !dup:
				seen[key] = len(plan)
				plan = append(plan, Site{Fn: fn, Object: path, Obj: o, File: via[path], Sym: sym, UserIdx: -1})
			case plan[i].Fn.Op.IsUnlock() && fn.Op.IsLockInit():
				plan[i].Alias = fn.Op
			case plan[i].Fn.Op.IsLockInit() && fn.Op.IsUnlock():
				plan[i].Alias, plan[i].Fn = plan[i].Fn.Op, fn
			}
			break
		}
	}
	for i, spec := range userProbes {
		spec, optional := strings.CutPrefix(spec, OptionalProbe)
		name, object, _ := strings.Cut(spec, "@")
		found := false
		for _, path := range objs {
			if object != "" && filepath.Base(path) != object && path != object {
				continue
			}
			o := open(path)
			if o == nil {
				continue
			}
			syms, err := o.Funcs(name)
			if err != nil {
				if object != "" {
					return nil, fmt.Errorf("--probe %s: %w", spec, err)
				}
				continue
			}
			plan = appendUserSites(plan, Site{Fn: ProbeFunc{Name: name, Op: events.OpProbeEnter, Ret: true},
				Object: path, Obj: o, File: via[path], UserIdx: i}, syms, warn)
			found = true
			break
		}
		if !found && strings.Contains(object, "/") {
			// A library the program loads later with dlopen, named by
			// its file: armed when it is loaded.
			path := object
			if r, err := filepath.EvalSymlinks(path); err == nil {
				path = r
			}
			o := open(path)
			if o == nil {
				return nil, fmt.Errorf("--probe %s: %s cannot be read", spec, object)
			}
			syms, err := o.Funcs(name)
			if err != nil {
				return nil, fmt.Errorf("--probe %s: %w", spec, err)
			}
			plan = appendUserSites(plan, Site{Fn: ProbeFunc{Name: name, Op: events.OpProbeEnter, Ret: true},
				Object: path, Obj: o, File: via[path], UserIdx: i}, syms, warn)
			found = true
		}
		if !found && optional {
			warn(fmt.Sprintf("%s%s is not a function of %s", MissingRulePrefix, name, objs[0]))
			continue
		}
		if !found {
			if object != "" && !strings.Contains(object, "/") {
				return nil, fmt.Errorf("--probe %s: %w in %s (a library loaded later with dlopen is named by its path: %s@/path/to/%s)",
					spec, symbolize.ErrSymbolNotFound, strings.Join(objs, ", "), name, object)
			}
			return nil, fmt.Errorf("--probe %s: %w in %s", spec, symbolize.ErrSymbolNotFound, strings.Join(objs, ", "))
		}
	}
	for i := range plan {
		s := &plan[i]
		s.Code, err = functionCode(s.Obj, s.Sym)
		if err != nil {
			warn(fmt.Sprintf("reading %s in %s: %v", s.Fn.Name, s.Object, err))
			continue
		}
		if s.UserIdx < 0 {
			s.Choice = placement.Choose(s.Code, s.Fn.Args)
		}
		if goTarget {
			s.Fn.Ret = false
		}
		s.Live = liveAddress(maps, s.Object, s.Sym.Offset)
	}
	scan := CallNames(plan)
	for i := range plan {
		planCalls(&plan[i], scan, objs, open, via, maps)
	}
	probeAlike(plan, events.OpSpinLock, events.OpSpinUnlock)
	return plan, nil
}

// probeAlike keeps a lock call and its release probed the same way, both
// on their calls or both on their entries: calls the probes on the calls
// miss (a library loaded later, until its calls are probed) then miss
// both, where a lock seen taken and never released would be held for
// good (a destroy of a held lock, false orders). pthread_spin_lock's
// entry is emulated, past its lock-prefixed first instruction, and so
// are its calls: it costs the same on them.
func probeAlike(plan []Site, lock, unlock events.Op) {
	var l, u *Site
	for i := range plan {
		switch plan[i].Fn.Op {
		case lock:
			l = &plan[i]
		case unlock:
			u = &plan[i]
		}
	}
	if l == nil || u == nil || l.Calls == nil || u.Calls == nil {
		return
	}
	if u.CallNote != "" && l.CallNote == "" {
		l.CallNote = "entry kept, as " + u.Fn.Name + "'s"
	}
	if l.CallNote != "" && u.CallNote == "" {
		u.CallNote = "entry kept, as " + l.Fn.Name + "'s"
	}
}

// planCalls fills s.Calls when the function's entry would be
// single-stepped, with its calls: every call the objects of the process
// make through their PLT, the calls a preloaded library interposes. Return
// probes need the entry, and a user probe's function may be called from
// anywhere. s.CallNote says why the calls cannot replace the entry, if so.
func planCalls(s *Site, scan []string, objs []string, open func(string) *symbolize.Object, via map[string]string, mapped symbolize.Maps) {
	if !callable(s) {
		return
	}
	s.Calls = []CallProbe{}
	for _, path := range objs {
		o := open(path)
		if o == nil {
			continue
		}
		calls, why := CallsIn(s, scan, path, via[path], o, mapped)
		s.Calls = append(s.Calls, calls...)
		if s.CallNote == "" {
			s.CallNote = why
		}
	}
}

// callable says whether s's function may be probed on its calls: its
// entry would be single-stepped (or it is pthread_spin_lock, probed as
// its unlock is, see probeAlike), and neither a return probe nor a user's
// probe needs the entry.
func callable(s *Site) bool {
	return s.UserIdx < 0 && !s.Fn.Ret && s.Code != nil && (!s.Choice.Emulated || s.Fn.Op == events.OpSpinLock)
}

// siteNames are the names a call of s's function is made by: its own and
// its alias's.
func siteNames(s *Site) map[string]events.Op {
	ops := map[string]events.Op{s.Fn.Name: s.Fn.Op}
	if s.Alias != events.OpNone {
		ops[s.Alias.String()] = s.Alias
	}
	return ops
}

// CallNames are the names of the functions of plan that may be probed on
// their calls, which an object's code is searched for once (CallsIn).
func CallNames(plan []Site) []string {
	var names []string
	for i := range plan {
		if callable(&plan[i]) {
			names = slices.AppendSeq(names, maps.Keys(siteNames(&plan[i])))
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// CallsIn lists the calls of s's function (and of its alias) the object o
// at path makes, attached through file, and why they cannot stand for its
// entry ("" when they can): the object can call it otherwise than through
// its PLT (a pointer to it), or its code could not be read. The object's
// code is searched once for the calls of scan (CallNames), which holds
// s's names. mapped are the process's mappings, for the calls' live
// addresses.
func CallsIn(s *Site, scan []string, path, file string, o *symbolize.Object, mapped symbolize.Maps) ([]CallProbe, string) {
	ops := siteNames(s)
	names := slices.Sorted(maps.Keys(ops))
	imp, err := callSitesOf(o, scan)
	if err != nil {
		return nil, fmt.Sprintf("entry kept: the calls in %s cannot be read: %v", path, err)
	}
	why := ""
	for _, name := range names {
		if how, ok := imp.Escapes[name]; ok {
			why = fmt.Sprintf("entry kept: %s can call %s other than through its PLT: %s", filepath.Base(path), name, how)
		}
	}
	var calls []CallProbe
	for _, c := range imp.Sites {
		if _, ok := ops[c.Symbol]; !ok {
			continue
		}
		off, err := o.FileOffset(c.Addr)
		code := make([]byte, c.Len)
		if err == nil {
			_, err = o.ReadAt(code, int64(off))
		}
		if err != nil {
			why = fmt.Sprintf("entry kept: reading the call at %#x in %s: %v", c.Addr, path, err)
			continue
		}
		calls = append(calls, CallProbe{Op: ops[c.Symbol], Object: path, File: file, Offset: off, CallSite: c,
			Live: liveAddress(mapped, path, off), Code: code})
	}
	return calls, why
}

// callSites caches placement.CallSites by object (objects are shared by
// file identity): a followed fork storm maps the same executable again
// and again.
var callSites = struct {
	sync.Mutex
	m map[callSitesKey]callSitesVal
}{m: map[callSitesKey]callSitesVal{}}

type callSitesKey struct {
	obj   *symbolize.Object
	names string
}

type callSitesVal struct {
	imp placement.Imports
	err error
}

func callSitesOf(o *symbolize.Object, names []string) (placement.Imports, error) {
	k := callSitesKey{o, strings.Join(names, ",")}
	callSites.Lock()
	defer callSites.Unlock()
	if v, ok := callSites.m[k]; ok {
		return v.imp, v.err
	}
	imp, err := placement.CallSites(o.ELF(), names)
	callSites.m[k] = callSitesVal{imp, err}
	return imp, err
}

// OptionalProbe starts a user probe a rule pack asks for: a program
// without the function is not checked against the rules on it, and that is
// no error. The warning saying so starts with MissingRulePrefix.
const (
	OptionalProbe     = "?"
	MissingRulePrefix = "--rules: "
)

// appendUserSites adds a --probe site for each of syms, the function and
// the clones gcc made of it, and says which were probed when there are
// several: a caller may enter only a clone.
func appendUserSites(plan []Site, site Site, syms []symbolize.Symbol, warn func(string)) []Site {
	names := make([]string, 0, len(syms))
	clones := false
	for _, sym := range syms {
		site.Sym = sym
		plan = append(plan, site)
		names = append(names, fmt.Sprintf("%s (0x%x)", sym.Mangled, sym.Value))
		if base, _ := funcname.Clone(sym.Mangled); base != sym.Mangled {
			clones = true
		}
	}
	if clones {
		warn(fmt.Sprintf("--probe %s: gcc's copies of it are probed in %s: %s", site.Fn.Name, filepath.Base(site.Object), strings.Join(names, ", ")))
	}
	return plan
}

// searchOrder lists the objects whose symbols pid will use, in the
// loader's search order: the executable, preloads, then its libraries
// breadth first, as `ld.so --list` prints them; then anything else mapped
// (dlopen'ed). For a gated child the executable is exe; for a running
// process it is /proc/PID/exe and its environment is the process's.
func searchOrder(pid int, exe string, maps symbolize.Maps, open func(string) *symbolize.Object) ([]string, error) {
	var env []string
	// A gated child maps hooktrace's own binary until its exec: only the
	// objects exe will load are the target's.
	gated := exe != ""
	if !gated {
		p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			return nil, fmt.Errorf("reading pid %d's executable: %w", pid, err)
		}
		exe = strings.TrimSuffix(p, " (deleted)")
		env = loaderEnv(pid)
	} else {
		env = os.Environ()
		exe = interpreterOf(exe)
	}
	// Paths as /proc/PID/maps shows them (symlinks resolved: /lib is
	// often a link to /usr/lib), so sites and mappings compare equal.
	canonical := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	exe = canonical(exe)
	objs := []string{exe}
	have := map[string]bool{exe: true}
	add := func(p string) {
		p = canonical(p)
		if p != "" && !have[p] {
			have[p] = true
			objs = append(objs, p)
		}
	}
	interp := ""
	if o := open(exe); o != nil {
		interp = o.Interpreter()
	}
	if interp != "" {
		// The loader resolves a relative RUNPATH, LD_LIBRARY_PATH or
		// LD_PRELOAD entry against the process's working directory (not
		// the executable's): it is asked from there, and what it prints
		// relative is taken from there.
		dir, cwd := processDir(pid)
		cmd := exec.Command(interp, "--list", exe)
		cmd.Env = env
		cmd.Dir = dir
		out, err := cmd.Output()
		if err == nil {
			for _, l := range parseLdList(string(out)) {
				if l.path != "" && !filepath.IsAbs(l.path) {
					l.path = filepath.Join(cwd, l.path)
				}
				if !gated {
					l.path = mappedAs(maps, l)
				}
				add(l.path)
			}
		}
	}
	if !gated && pid > 0 {
		for _, p := range mappedObjects(maps) {
			add(p)
		}
	}
	return objs, nil
}

// interpreterOf is the program the kernel runs to exec exe: exe itself,
// or for a script ("#!"), its interpreter, followed as the kernel follows
// them, up to four levels deep.
func interpreterOf(exe string) string {
	for range 4 {
		f, err := os.Open(exe)
		if err != nil {
			return exe
		}
		head := make([]byte, 256)
		n, _ := io.ReadFull(f, head)
		f.Close()
		line, ok := bytes.CutPrefix(head[:n], []byte("#!"))
		if !ok {
			return exe
		}
		line, _, _ = bytes.Cut(line, []byte("\n"))
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return exe
		}
		exe = fields[0]
	}
	return exe
}

// processDir is the directory to run the loader in for pid (its working
// directory, through /proc, which reaches it in another mount namespace
// too) and that directory's path as pid sees it. pid 0 is this process.
func processDir(pid int) (dir, path string) {
	if pid > 0 {
		link := fmt.Sprintf("/proc/%d/cwd", pid)
		if p, err := os.Readlink(link); err == nil {
			return link, p
		}
	}
	wd, _ := os.Getwd()
	return "", wd
}

// ldEntry is one object `ld.so --list` names: the name it was asked for
// (a DT_NEEDED entry, a preload) and the file the loader found for it
// ("" when it found none).
type ldEntry struct {
	name, path string
}

// parseLdList reads `ld.so --list` output: "name => path (0x...)",
// "name => not found" or "path (0x...)". A path is a file the loader
// opened: it has a slash, and may be relative to the working directory
// (the vDSO's line has none).
func parseLdList(out string) []ldEntry {
	var entries []ldEntry
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		name, path, found := strings.Cut(line, "=>")
		if j := strings.LastIndex(line, " (0x"); j >= 0 && !found {
			name, path = line[:j], line[:j]
		}
		name, path = strings.TrimSpace(name), strings.TrimSpace(path)
		if j := strings.LastIndex(path, " (0x"); j >= 0 {
			path = path[:j]
		}
		if !strings.Contains(path, "/") {
			path = ""
		}
		if path != "" || (found && strings.Contains(line, "not found")) {
			entries = append(entries, ldEntry{name: name, path: path})
		}
	}
	return entries
}

// mappedAs is the file a running process maps for the loader's entry l:
// l's path, or, where the process maps no such file (it has changed
// directory since the loader resolved a relative path, or the loader
// finds nothing from here), the mapped file of the same name.
func mappedAs(maps symbolize.Maps, l ldEntry) string {
	if len(maps) == 0 {
		return l.path
	}
	if l.path != "" {
		if _, ok := fileMapping(maps, l.path); ok {
			return l.path
		}
		if r, err := filepath.EvalSymlinks(l.path); err == nil {
			if _, ok := fileMapping(maps, r); ok {
				return l.path
			}
		}
	}
	for _, m := range maps {
		if m.IsFile() && filepath.Base(m.Path) == filepath.Base(l.name) {
			return m.Path
		}
	}
	return l.path
}

// loaderEnv is the part of pid's environment that steers the loader.
func loaderEnv(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil
	}
	var env []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			env = append(env, kv)
		}
	}
	return env
}

// mappedObjects lists the files mapped executable, in address order.
func mappedObjects(maps symbolize.Maps) []string {
	var out []string
	for _, m := range maps {
		if m.IsFile() && m.Executable() {
			out = append(out, m.Path)
		}
	}
	return out
}

// fileMapping returns a mapping of the file at path, when maps has one.
func fileMapping(maps symbolize.Maps, path string) (symbolize.Mapping, bool) {
	for _, m := range maps {
		if m.IsFile() && m.Path == path {
			return m, true
		}
	}
	return symbolize.Mapping{}, false
}

// liveAddress is where the file offset off of object is mapped, or 0 when
// it is not mapped (yet).
func liveAddress(maps symbolize.Maps, object string, off uint64) uint64 {
	for _, m := range maps {
		if m.Path == object && off >= m.Offset && off < m.Offset+(m.End-m.Start) {
			return m.Start + off - m.Offset
		}
	}
	return 0
}

// functionCode reads a function's bytes from its file: the placement needs
// the whole body to see branches back to the chosen site.
func functionCode(o *symbolize.Object, sym symbolize.Symbol) ([]byte, error) {
	n := sym.Size
	if n == 0 || n > 4096 {
		n = 4096
	}
	b := make([]byte, n)
	m, err := o.ReadAt(b, int64(sym.Offset))
	if m == 0 && err != nil {
		return nil, fmt.Errorf("reading %s at %#x: %w", o.Path(), sym.Offset, err)
	}
	return b[:m], nil
}
