//go:build linux && amd64

package tracer

import (
	"bytes"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/hooktrace/hooktrace/tracer/symbolize"
)

// liveMaps keeps a process's symbolizer up to date with its mappings while
// the process lives. Events are read behind the process: by the time a
// short-lived target's stacks are symbolized it may be gone, and with it
// /proc/PID/maps, so the mappings are read as they appear, not when needed.
type liveMaps struct {
	sym  atomic.Pointer[symbolize.Symbolizer]
	stop chan struct{}
}

// pollEvery is how often the maps are checked; a read of an unchanged
// maps file costs tens of microseconds.
const pollEvery = 2 * time.Millisecond

func startLiveMaps(pid uint32, sym *symbolize.Symbolizer) *liveMaps {
	l := &liveMaps{stop: make(chan struct{})}
	l.sym.Store(sym)
	go l.run(fmt.Sprintf("/proc/%d/maps", pid))
	return l
}

func (l *liveMaps) run(path string) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var last []byte
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			return // gone: the symbolizer keeps its last snapshot
		}
		if !bytes.Equal(b, last) {
			last = b
			l.sym.Load().Refresh()
		}
	}
}

func (l *liveMaps) close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
}
