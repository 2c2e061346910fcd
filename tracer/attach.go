//go:build linux && amd64

package tracer

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/placement"
	"github.com/hooktrace/hooktrace/probesite"
)

// probeBatch is one uprobe_multi link: every entry (or every return) probe
// of one program in one object. Removing a uprobe waits for a grace period
// (about 90 ms here, serialized in the kernel); one link per object instead
// of one per function makes detaching take one such wait, not forty.
type probeBatch struct {
	object  string
	file    string // the path to attach through (see site.file)
	ret     bool
	addrs   []uint64 // file offsets
	cookies []uint64
	sites   []events.ProbeSite
}

// attachPlan places the plan's probes for pid and returns the links and
// the sites placed. A site whose code in memory is not the code in the
// file is refused with a warning: a uprobe on a function a runtime patcher
// has overwritten kills the process on its next call.
// Sites in placed (by pid, object, offset, kind) are skipped, and the new
// ones added to it: a re-planned process keeps its probes.
func attachPlan(pid int, plan []probesite.Site, prog, retProg *ebpf.Program, alloc *probesite.AllocRange, placed map[string]bool, warn func(string)) ([]link.Link, []events.ProbeSite) {
	batches := map[[2]string]*probeBatch{}
	var order [][2]string
	add := func(object, file string, ret bool, addr, cookie uint64, ps events.ProbeSite) {
		id := fmt.Sprintf("%d:%s:%x:%v", pid, object, addr, ret)
		if placed[id] {
			return
		}
		placed[id] = true
		key := [2]string{object, fmt.Sprint(ret)}
		b, ok := batches[key]
		if !ok {
			b = &probeBatch{object: object, file: file, ret: ret}
			batches[key] = b
			order = append(order, key)
		}
		b.addrs = append(b.addrs, addr)
		b.cookies = append(b.cookies, cookie)
		b.sites = append(b.sites, ps)
	}
	for i := range plan {
		s := &plan[i]
		// The calls are checked one by one; the function's code is not
		// needed (Tracer.loaded keeps none).
		if useCalls(pid, s, placed, warn) {
			for i := range s.Calls {
				attachCall(pid, s, &s.Calls[i], add, warn)
			}
			continue
		}
		if s.Code == nil {
			continue
		}
		if s.Live != 0 {
			err := placement.CheckLive(pid, s.Live, s.Code[:min(len(s.Code), 16)])
			// Our own breakpoints (a followed child inherits them) are safe.
			if err != nil && !errors.Is(err, placement.ErrBreakpoint) {
				warn(fmt.Sprintf("not probing %s in %s: %v", s.Fn.Name, s.Object, err))
				continue
			}
		}
		if s.UserIdx < 0 {
			placed[fmt.Sprintf("%d:entry:%s", pid, s.Fn.Name)] = true
		}
		op := s.Fn.Op
		offset := uint64(s.Choice.Offset)
		cookie := probeCookie{op: op, adj: uint16(s.Choice.StackAdjust)}
		note := s.Choice.Note
		if s.CallNote != "" {
			note += "; " + s.CallNote
		}
		if s.UserIdx >= 0 {
			cookie.user = uint32(s.UserIdx)
		} else if op.IsAllocator() && alloc != nil && s.Obj == alloc.Obj {
			cookie.setRange(alloc, s.Sym.Offset+offset)
		} else if op.IsLockAcquire() && s.Choice.Refires {
			cookie.refires = true
		} else if s.Alias != events.OpNone {
			cookie.alias = s.Alias
			note = strings.TrimPrefix(note+"; ", "; ") + "also " + s.Alias.String() +
				" (same address): a call on a lock the thread does not hold is that"
		}
		if s.Fn.Ret {
			// The return probe hooks the entry; the entry probe goes there
			// too, where the arguments are as the caller passed them.
			offset, note = 0, "entry: a return probe is placed here anyway"
			cookie = probeCookie{op: op, user: userField(s.UserIdx)}
		}
		add(s.Object, s.File, false, s.Sym.Offset+offset, cookie.encode(), events.ProbeSite{Name: s.Fn.Name, Object: s.Object,
			Offset: offset, Address: s.Sym.Value + offset, Kind: "uprobe", Note: note})
		if s.Fn.Ret && retProg != nil {
			retOp := op
			if op == events.OpProbeEnter {
				retOp = events.OpProbeExit
			}
			add(s.Object, s.File, true, s.Sym.Offset, probeCookie{op: retOp, user: userField(s.UserIdx)}.encode(),
				events.ProbeSite{Name: s.Fn.Name, Object: s.Object, Address: s.Sym.Value, Kind: "uretprobe"})
		}
	}
	var links []link.Link
	var sites []events.ProbeSite
	for _, key := range order {
		b := batches[key]
		file := b.file
		if file == "" {
			file = b.object
		}
		ex, err := link.OpenExecutable(file)
		if err != nil {
			warn(fmt.Sprintf("opening %s: %v", b.object, err))
			continue
		}
		p := prog
		if b.ret {
			p = retProg
		}
		ls, err := attachUprobes(ex, p, b.ret, pid, b.addrs, b.cookies)
		if err != nil {
			warn(fmt.Sprintf("attaching %d probes in %s: %v", len(b.addrs), b.object, err))
			continue
		}
		links = append(links, ls...)
		sites = append(sites, b.sites...)
	}
	return links, sites
}

// useCalls decides whether s's function is probed on its calls: when it
// can be, unless its entry is probed for pid already; or when its calls
// are, whatever the objects loaded since allow (a probe on the entry too
// would count each call twice). Either probe stays, as an exec keeps it.
func useCalls(pid int, s *probesite.Site, placed map[string]bool, warn func(string)) bool {
	if s.Calls == nil {
		return false
	}
	calls := fmt.Sprintf("%d:calls:%s", pid, s.Fn.Name)
	switch {
	case placed[calls]:
		if said := fmt.Sprintf("%d:said:%s", pid, s.CallNote); s.CallNote != "" && !placed[said] {
			placed[said] = true
			warn(fmt.Sprintf("%s stays probed on its calls, which miss some now: %s", s.Fn.Name, s.CallNote))
		}
	case s.CallNote != "" || placed[fmt.Sprintf("%d:entry:%s", pid, s.Fn.Name)]:
		return false
	}
	placed[calls] = true
	return true
}

// attachCall plans the probe on one call of s's function, in place of
// its entry probe: the kernel emulates a call or jmp, where it
// single-steps the function's first instruction.
func attachCall(pid int, s *probesite.Site, c *probesite.CallProbe, add func(object, file string, ret bool, addr, cookie uint64, ps events.ProbeSite), warn func(string)) {
	if c.Live != 0 {
		if err := placement.CheckLive(pid, c.Live, c.Code); err != nil && !errors.Is(err, placement.ErrBreakpoint) {
			warn(fmt.Sprintf("not probing the call of %s at %#x in %s: %v", c.Symbol, c.Addr, c.Object, err))
			return
		}
	}
	cookie := probeCookie{op: c.Op}
	where := "a tail call"
	if !c.Tail {
		cookie.call = uint8(c.Len)
		where = "a call"
	}
	how := "emulated"
	if !c.Emulated {
		how = "single-stepped, as the entry is"
	}
	add(c.Object, c.File, false, c.Offset, cookie.encode(), events.ProbeSite{Name: c.Symbol, Object: c.Object,
		Address: c.Addr, Kind: "uprobe",
		Note: fmt.Sprintf("%s of %s in %s: %s (%s); %s", where, c.Symbol, filepath.Base(s.Object), c.Instruction, how, s.Choice.Note)})
}

// userField is a user probe's index for its cookie; 0 for the others,
// whose high half carries other fields.
func userField(idx int) uint32 {
	if idx < 0 {
		return 0
	}
	return uint32(idx)
}

// attachLoaderCalls places the probes that tell the converter which
// library the process loaded where: the results of dlopen and dlmopen and
// the argument of dlclose, in each object of the plan that defines them
// (libc since glibc 2.34, libdl before). Stacks are named behind the
// process; with these, a library it unloaded by then keeps its names.
// dlopen's return probe is one trap more for each library loaded. Two
// links an object, as attachPlan's batches: each link's removal waits for
// a grace period.
func attachLoaderCalls(pid int, plan []probesite.Site, objs *hooktraceObjects, placed map[string]bool, warn func(string)) []link.Link {
	var links []link.Link
	seen := map[string]bool{}
	for i := range plan {
		s := &plan[i]
		if s.Obj == nil || seen[s.Object] {
			continue
		}
		seen[s.Object] = true
		var entries, cookies, returns []uint64
		for _, c := range []struct {
			name   string
			closes bool
		}{{"dlopen", false}, {"dlmopen", false}, {"dlclose", true}} {
			sym, err := s.Obj.Func(c.name)
			if err != nil {
				continue
			}
			id := fmt.Sprintf("%d:%s:%x:loader", pid, s.Object, sym.Offset)
			if placed[id] {
				continue
			}
			placed[id] = true
			entries = append(entries, sym.Offset)
			if c.closes {
				cookies = append(cookies, 1)
			} else {
				cookies = append(cookies, 0)
				returns = append(returns, sym.Offset)
			}
		}
		if len(entries) == 0 {
			continue
		}
		ex, err := link.OpenExecutable(s.File)
		if err != nil {
			warn(fmt.Sprintf("opening %s for its loader calls: %v", s.Object, err))
			continue
		}
		// The entries first: dlopen's counts its return probe as pending.
		ls, err := attachUprobes(ex, objs.UprobeLoader, false, pid, entries, cookies)
		if err == nil {
			links = append(links, ls...)
			if len(returns) > 0 {
				ls, err = attachUprobes(ex, objs.UretprobeDlopen, true, pid, returns, nil)
				if err == nil {
					links = append(links, ls...)
				}
			}
		}
		if err != nil {
			warn(fmt.Sprintf("probing the loader calls in %s: %v (stacks of a library unloaded early may be misnamed)", s.Object, err))
		}
	}
	return links
}

// attachUprobes places prog at the file offsets addrs of ex for pid, each
// with its cookie (none: 0): one uprobe_multi link, or, on kernels without
// uprobe_multi (before 6.6), one perf-event uprobe per site, whose cookie
// the kernel passes too (5.15 and later). On error no link is left open.
func attachUprobes(ex *link.Executable, prog *ebpf.Program, ret bool, pid int, addrs, cookies []uint64) ([]link.Link, error) {
	var l link.Link
	var err error
	if haveUprobeMulti() {
		opts := &link.UprobeMultiOptions{Addresses: addrs, Cookies: cookies, PID: uint32(pid)}
		if ret {
			l, err = ex.UretprobeMulti(nil, prog, opts)
		} else {
			l, err = ex.UprobeMulti(nil, prog, opts)
		}
		if err != nil {
			return nil, err
		}
		return []link.Link{l}, nil
	}
	// By address: each probe gets its program only after its breakpoint
	// is in place, and a program that waits for the breakpoints of a
	// library it loaded (a test's) then knows which one may lack it.
	order := make([]int, len(addrs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(addrs[a], addrs[b]) })
	links := make([]link.Link, 0, len(addrs))
	for _, i := range order {
		addr := addrs[i]
		o := &link.UprobeOptions{Address: addr, PID: pid}
		if i < len(cookies) {
			o.Cookie = cookies[i]
		}
		if ret {
			l, err = ex.Uretprobe("", prog, o)
		} else {
			l, err = ex.Uprobe("", prog, o)
		}
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			return nil, fmt.Errorf("uprobe at offset %#x (no uprobe_multi links on this kernel): %w", addr, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// haveUprobeMulti says whether the kernel has uprobe_multi links: whether
// its own BTF lists the attach type. cilium/ebpf's probe for them is not
// consulted when the kernel answers EINVAL, which 6.1 does.
var haveUprobeMulti = sync.OnceValue(func() bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var types *btf.Enum
	if spec.TypeByName("bpf_attach_type", &types) != nil {
		return false
	}
	for _, v := range types.Values {
		if v.Name == "BPF_TRACE_UPROBE_MULTI" {
			return true
		}
	}
	return false
})
