package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// warnHandler prints hooktrace's warnings as it prints its other messages
// on stderr: one line each, "hooktrace: warning: MESSAGE", not a log
// record with a time stamp and a quoted message.
type warnHandler struct {
	mu *sync.Mutex
	w  io.Writer
}

func newWarnHandler(w io.Writer) slog.Handler { return warnHandler{mu: new(sync.Mutex), w: w} }

func (h warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("hooktrace: warning: ")
	if r.Level >= slog.LevelError {
		b.Reset()
		b.WriteString("hooktrace: error: ")
	}
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

// hooktrace's warnings carry no attributes or groups: they are sentences.
func (h warnHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnHandler) WithGroup(string) slog.Handler      { return h }
