package events

import (
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

const benchEvents = 1_000_000

var benchTrace = sync.OnceValue(func() []Record { return synthTrace(benchEvents) })

// BenchmarkRead reads a synthetic million-event trace from a file, as the
// analyzer does, and reports events per second.
func BenchmarkRead(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.htr")
	data := encode(b, benchTrace())
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	events := 0
	for b.Loop() {
		r, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		for {
			rec, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if rec.Kind == RecEvent {
				events++
			}
		}
		r.Close()
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(len(data))/benchEvents, "bytes/event")
}

// BenchmarkWrite encodes the same trace to io.Discard.
func BenchmarkWrite(b *testing.B) {
	recs := benchTrace()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		w := NewWriter(io.Discard)
		for i := range recs {
			if err := w.Write(&recs[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchEvents*b.N)/b.Elapsed().Seconds(), "events/s")
}
