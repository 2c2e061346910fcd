//go:build linux && amd64

package bench

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/hooktrace/hooktrace/launch"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/tracer"
)

// floor is the counting-only program (floor.c) attached for one process.
type floor struct {
	objs  floorObjects
	links []link.Link
}

// attachFloor attaches the counting program where hooktrace would put its
// probes in the gated process g, or at those functions' first instructions
// when atEntry. The sites are hooktrace's own: a tracer is attached while g
// waits at its gate and closed again, so the floor is always measured at the
// sites of the code being benchmarked.
func attachFloor(g *launch.Gated, atEntry bool, warn func(string)) (*floor, error) {
	tr, err := tracer.New(source.Options{Warn: warn})
	if err != nil {
		return nil, err
	}
	if err := tr.Attach(g.Cmd.Process.Pid, g.Path); err != nil {
		tr.Close()
		return nil, err
	}
	sites := tr.Sites()
	if err := tr.Close(); err != nil {
		return nil, fmt.Errorf("closing the tracer that found the sites: %w", err)
	}

	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("lifting the memlock limit: %w", err)
	}
	f := &floor{}
	if err := loadFloorObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the floor program: %w", err)
	}
	// uprobe_multi takes file offsets; the sites give virtual addresses.
	var order []string
	offsets := map[string][]uint64{}
	for _, s := range sites {
		if s.Kind != "uprobe" {
			continue // the floor has no return probes
		}
		addr := s.Address
		if atEntry {
			addr -= s.Offset
		}
		off, err := fileOffset(s.Object, addr)
		if err != nil {
			f.close()
			return nil, err
		}
		if offsets[s.Object] == nil {
			order = append(order, s.Object)
		}
		offsets[s.Object] = append(offsets[s.Object], off)
	}
	for _, object := range order {
		ex, err := link.OpenExecutable(object)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("opening %s: %w", object, err)
		}
		l, err := ex.UprobeMulti(nil, f.objs.UprobeFloor, &link.UprobeMultiOptions{
			Addresses: offsets[object], PID: uint32(g.Cmd.Process.Pid)})
		if err != nil {
			f.close()
			return nil, fmt.Errorf("attaching the floor's %d probes in %s: %w", len(offsets[object]), object, err)
		}
		f.links = append(f.links, l)
	}
	if len(f.links) == 0 {
		f.close()
		return nil, errors.New("attaching the floor: hooktrace placed no uprobe")
	}
	return f, nil
}

// hits is how many times the program ran.
func (f *floor) hits() (uint64, error) {
	var per []uint64
	if err := f.objs.FloorHits.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("reading the floor's counter: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

func (f *floor) close() {
	for _, l := range f.links {
		l.Close()
	}
	f.objs.Close()
}

// fileOffset converts a virtual address of object to its file offset.
func fileOffset(object string, addr uint64) (uint64, error) {
	ef, err := elf.Open(object)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", object, err)
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && addr >= p.Vaddr && addr < p.Vaddr+p.Filesz {
			return addr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("finding %#x in %s: in no executable segment", addr, object)
}

// runFloor runs argv behind hooktrace's gate with the floor attached and
// returns its counter.
func runFloor(argv []string, atEntry bool, warn func(string)) (uint64, ProbeTime, error) {
	g, err := launch.Start(argv)
	if err != nil {
		return 0, ProbeTime{}, err
	}
	fl, err := attachFloor(g, atEntry, warn)
	if err != nil {
		g.Abort()
		return 0, ProbeTime{}, err
	}
	defer fl.close()
	if err := g.Open(); err != nil {
		g.Cmd.Process.Kill()
		g.Cmd.Wait()
		return 0, ProbeTime{}, fmt.Errorf("letting the workload run: %w", err)
	}
	if err := g.Cmd.Wait(); err != nil {
		return 0, ProbeTime{}, fmt.Errorf("the workload: %w", err)
	}
	hits, err := fl.hits()
	var probe ProbeTime
	if st, err := fl.objs.UprobeFloor.Stats(); err == nil {
		probe = ProbeTime{Runs: st.RunCount, Time: st.Runtime}
	}
	return hits, probe, err
}
