package tracer

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/tracer/placement"
	"github.com/hooktrace/hooktrace/tracer/symbolize"
)

// probeFunc is a function hooktrace traces and how.
type probeFunc struct {
	name string
	op   events.Op
	args int  // integer arguments the handler reads
	ret  bool // also a return probe: its result decides something
}

// The return probe is placed only where the result matters: whether a try
// or timed lock was taken, and when cond_wait takes its mutex back.
var probeFuncs = []probeFunc{
	{"malloc", events.OpMalloc, 1, false},
	{"calloc", events.OpCalloc, 2, false},
	{"realloc", events.OpRealloc, 2, false},
	{"free", events.OpFree, 1, false},
	{"posix_memalign", events.OpPosixMemalign, 3, false},
	{"aligned_alloc", events.OpAlignedAlloc, 2, false},
	{"memalign", events.OpMemalign, 2, false},
	{"valloc", events.OpValloc, 1, false},
	{"pvalloc", events.OpPvalloc, 1, false},
	{"pthread_mutex_lock", events.OpMutexLock, 1, false},
	{"pthread_mutex_trylock", events.OpMutexTrylock, 1, true},
	{"pthread_mutex_timedlock", events.OpMutexTimedlock, 1, true},
	{"pthread_mutex_clocklock", events.OpMutexClocklock, 1, true},
	{"pthread_mutex_unlock", events.OpMutexUnlock, 1, false},
	{"pthread_mutex_init", events.OpMutexInit, 1, false},
	{"pthread_mutex_destroy", events.OpMutexDestroy, 1, false},
	{"pthread_rwlock_rdlock", events.OpRwlockRdlock, 1, false},
	{"pthread_rwlock_wrlock", events.OpRwlockWrlock, 1, false},
	{"pthread_rwlock_tryrdlock", events.OpRwlockTryrdlock, 1, true},
	{"pthread_rwlock_trywrlock", events.OpRwlockTrywrlock, 1, true},
	{"pthread_rwlock_timedrdlock", events.OpRwlockTimedrdlock, 1, true},
	{"pthread_rwlock_timedwrlock", events.OpRwlockTimedwrlock, 1, true},
	{"pthread_rwlock_clockrdlock", events.OpRwlockClockrdlock, 1, true},
	{"pthread_rwlock_clockwrlock", events.OpRwlockClockwrlock, 1, true},
	{"pthread_rwlock_unlock", events.OpRwlockUnlock, 1, false},
	{"pthread_spin_lock", events.OpSpinLock, 1, false},
	{"pthread_spin_trylock", events.OpSpinTrylock, 1, true},
	{"pthread_spin_unlock", events.OpSpinUnlock, 1, false},
	{"pthread_cond_wait", events.OpCondWait, 2, true},
	{"pthread_cond_timedwait", events.OpCondTimedwait, 2, true},
}

// site is one function in one object, ready to attach.
type site struct {
	fn      probeFunc
	object  string // path
	sym     symbolize.Symbol
	userIdx int // for user probes: index into Header.UserProbes
	code    []byte
	choice  placement.Site
	live    uint64 // the function's runtime address, 0 when not mapped yet
}

// planSites finds, for each traced function, the object that really
// provides it to pid (the first definition in the loader's search order: a
// preloaded or linked-in allocator wins over glibc's), and the offset to
// probe at.
func planSites(pid int, exe string, userProbes []string, atEntry bool, warn func(string)) ([]site, error) {
	// One read of the mappings serves the search order and every site's
	// live address; a child not yet exec'd maps none of the target's.
	maps, _ := symbolize.ReadMaps(pid)
	objs, err := searchOrder(pid, exe, maps)
	if err != nil {
		return nil, err
	}
	// A uretprobe swaps a return address on the stack, and Go moves and
	// walks its goroutine stacks: return probes would corrupt them.
	goTarget := symbolize.ExeIsGo(objs[0])
	if goTarget {
		warn(fmt.Sprintf("%s is a Go program: no return probes are placed (they corrupt Go stacks), so try and timed lock results, cond_wait's retake and --probe exits are not traced", objs[0]))
	}
	opened := map[string]*symbolize.Object{}
	open := func(path string) *symbolize.Object {
		if o, ok := opened[path]; ok {
			return o
		}
		o, err := symbolize.Open(path)
		if err != nil {
			warn(fmt.Sprintf("reading %s: %v", path, err))
		}
		opened[path] = o
		return o
	}
	var plan []site
	seen := map[string]bool{} // object:address, so aliases are probed once
	for _, fn := range probeFuncs {
		for _, path := range objs {
			o := open(path)
			if o == nil {
				continue
			}
			sym, err := o.Func(fn.name)
			if err != nil {
				continue
			}
			key := fmt.Sprintf("%s:%x", path, sym.Value)
			if !seen[key] {
				seen[key] = true
				plan = append(plan, site{fn: fn, object: path, sym: sym, userIdx: -1})
			}
			break
		}
	}
	for i, spec := range userProbes {
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
			sym, err := o.Func(name)
			if err != nil {
				if object != "" {
					return nil, fmt.Errorf("--probe %s: %w", spec, err)
				}
				continue
			}
			plan = append(plan, site{fn: probeFunc{name: name, op: events.OpProbeEnter, ret: true},
				object: path, sym: sym, userIdx: i})
			found = true
			break
		}
		if !found {
			return nil, fmt.Errorf("--probe %s: %w in %s", spec, symbolize.ErrSymbolNotFound, strings.Join(objs, ", "))
		}
	}
	for i := range plan {
		s := &plan[i]
		s.code, err = functionCode(s.object, s.sym)
		if err != nil {
			warn(fmt.Sprintf("reading %s in %s: %v", s.fn.name, s.object, err))
			continue
		}
		if s.userIdx < 0 && !atEntry {
			s.choice = placement.Choose(s.code, s.fn.args)
		}
		if goTarget {
			s.fn.ret = false
		}
		s.live = liveAddress(maps, s.object, s.sym.Offset)
	}
	return plan, nil
}

// searchOrder lists the objects whose symbols pid will use, in the
// loader's search order: the executable, preloads, then its libraries
// breadth first, as `ld.so --list` prints them; then anything else mapped
// (dlopen'ed). For a gated child the executable is exe; for a running
// process it is /proc/PID/exe and its environment is the process's.
func searchOrder(pid int, exe string, maps symbolize.Maps) ([]string, error) {
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
	if interp := interpreter(exe); interp != "" {
		cmd := exec.Command(interp, "--list", exe)
		cmd.Env = env
		out, err := cmd.Output()
		if err == nil {
			for _, p := range parseLdList(string(out)) {
				add(p)
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

// parseLdList reads `ld.so --list` output: "name => /path (0x...)" or
// "/path (0x...)".
func parseLdList(out string) []string {
	var paths []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "=>"); i >= 0 {
			line = strings.TrimSpace(line[i+2:])
		}
		if j := strings.LastIndex(line, " (0x"); j >= 0 {
			line = line[:j]
		}
		if strings.HasPrefix(line, "/") {
			paths = append(paths, line)
		}
	}
	return paths
}

func interpreter(exe string) string {
	f, err := elf.Open(exe)
	if err != nil {
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return strings.TrimRight(string(b), "\x00")
			}
		}
	}
	return ""
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
func functionCode(path string, sym symbolize.Symbol) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n := sym.Size
	if n == 0 || n > 4096 {
		n = 4096
	}
	b := make([]byte, n)
	m, err := f.ReadAt(b, int64(sym.Offset))
	if m == 0 && err != nil {
		return nil, fmt.Errorf("reading %s at %#x: %w", path, sym.Offset, err)
	}
	return b[:m], nil
}
