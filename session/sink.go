//go:build linux && amd64

package session

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hooktrace/hooktrace/analyzer"
	"github.com/hooktrace/hooktrace/events"
)

// Sink receives a session's live stream: it feeds the analyzer and writes
// the trace file. The header goes to the file at once and the records at least
// every flushEvery, even when few arrive (an aggregate trace sends little
// once the patterns are known): a hooktrace killed with SIGKILL, or a node
// lost, leaves a readable trace of all but the last moments.
type Sink struct {
	an   *analyzer.Analyzer
	f    *os.File
	mu   sync.Mutex // guards w: the reader writes, the flusher flushes
	w    *events.Writer
	err  error // the flusher's, returned by the next add
	quit chan struct{}
	done chan struct{}
}

const flushEvery = time.Second

// NewSink starts the analysis of a stream whose header is h and, unless
// path is "", the trace file at path.
func NewSink(path string, h *events.Header) (*Sink, error) {
	s := &Sink{an: analyzer.New(analyzer.Options{})}
	s.an.BeginStream("live")
	s.an.Add(&events.Record{Kind: events.RecHeader, Header: h})
	if path == "" {
		return s, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating the trace file: %w", err)
	}
	s.f = f
	s.w = events.NewWriter(f)
	err = s.w.Write(&events.Record{Kind: events.RecHeader, Header: h})
	if err == nil {
		err = s.w.Flush()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	s.quit, s.done = make(chan struct{}), make(chan struct{})
	go s.flusher()
	return s, nil
}

func (s *Sink) flusher() {
	defer close(s.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-tick.C:
			s.mu.Lock()
			if err := s.w.Flush(); err != nil && s.err == nil {
				s.err = fmt.Errorf("writing the trace: %w", err)
			}
			s.mu.Unlock()
		}
	}
}

// Add analyzes r and writes it to the trace file.
func (s *Sink) Add(r *events.Record) error {
	s.an.Add(r)
	if s.w == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if err := s.w.Write(r); err != nil {
		return fmt.Errorf("writing the trace: %w", err)
	}
	return nil
}

// stopFlusher ends the periodic flushes; the writer is the caller's alone
// afterwards.
func (s *Sink) stopFlusher() {
	if s.quit != nil {
		close(s.quit)
		<-s.done
		s.quit = nil
	}
}

// Abandon closes the file without a footer: tracing never started.
func (s *Sink) Abandon() {
	if s.w != nil {
		s.stopFlusher()
		s.w.Close()
		s.f.Close()
	}
}

// Close writes the footer and closes the trace file.
func (s *Sink) Close(foot *events.Footer) error {
	if s.w == nil {
		return nil
	}
	s.stopFlusher()
	err := s.w.Write(&events.Record{Kind: events.RecFooter, Footer: foot})
	if cerr := s.w.Close(); err == nil {
		err = cerr
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("closing the trace file: %w", err)
	}
	return nil
}

// Analyzer is the analysis of what the sink received; add the footer to
// it before reading its result.
func (s *Sink) Analyzer() *analyzer.Analyzer { return s.an }
