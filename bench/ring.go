//go:build linux && amd64

package bench

import (
	"fmt"
	"time"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/session"
	"github.com/hooktrace/hooktrace/source"
	"github.com/hooktrace/hooktrace/tracer"
)

// RingResult is what crossed the kernel's ring buffer in one traced run.
type RingResult struct {
	Wall time.Duration // from letting the target exec to its exit
	Lost uint64
	// Records (events, stacks, raw stack samples) and bytes read from
	// the ring.
	RingRecords, RingBytes uint64
}

// countingWriter counts what the trace-file writer produces.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	return len(b), nil
}

// RunRing traces argv with hooktrace's tracer in this process, encoding
// the stream as a trace file (to a byte counter) as a real run does, and
// reports the ring's traffic: the one thing the CLI does not show.
func RunRing(opts source.Options, argv []string) (RingResult, error) {
	var res RingResult
	tr, err := tracer.New(opts)
	if err != nil {
		return res, err
	}
	defer tr.Close()
	tg, err := session.Launch(tr, argv)
	if err != nil {
		return res, err
	}
	if err := tg.Attach(); err != nil {
		tg.Abort()
		return res, err
	}
	var sink countingWriter
	w := events.NewWriter(&sink)
	h := &events.Header{Version: events.Version, Tool: "hooktrace bench", Clock: "CLOCK_MONOTONIC", Mode: opts.Mode}
	tg.Header(h)
	if err := w.Write(&events.Record{Kind: events.RecHeader, Header: h}); err != nil {
		tg.Abort()
		return res, err
	}
	reading, err := session.Record(tr, w.Write)
	if err != nil {
		tg.Abort()
		return res, err
	}
	start := time.Now()
	_, waitErr := tg.WaitUnheld()
	res.Wall = time.Since(start)
	err = reading.Stop()
	if err == nil {
		err = w.Write(&events.Record{Kind: events.RecFooter, Footer: session.Footer(tr)})
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("tracing: %w", err)
	}
	if waitErr != nil {
		return res, fmt.Errorf("the workload: %w", waitErr)
	}
	res.Lost = tr.Lost()
	res.RingRecords, res.RingBytes = tr.RingRead()
	return res, nil
}
