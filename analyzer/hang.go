package analyzer

import (
	"github.com/hooktrace/hooktrace/events"
)

// ArenaHeld tells from a stack whether glibc holds its arena lock there
// (decided is false when the stack does not say), by the rules the
// analysis uses for hooks. Hang detection uses it to find which blocked
// thread holds an arena lock, which records no owner.
func ArenaHeld(st *events.Stack) (held, decided bool) {
	h, _ := decideArena(st)
	return h == holdHeld, h != holdMaybe
}

// hangFindings reports the deadlock that hang detection saw in this
// stream's process, from the trace's footer: the same finding live and
// offline.
func (s *stream) hangFindings() []Finding {
	if s.footer == nil || s.footer.Hang == nil {
		return nil
	}
	h := s.footer.Hang
	waits := make([]Wait, 0, len(h.Threads))
	for i := range h.Threads {
		t := &h.Threads[i]
		waits = append(waits, Wait{
			PID:        h.PID,
			TID:        t.TID,
			Thread:     t.Name,
			WaitingFor: t.Lock,
			Lock:       t.LockName,
			Owner:      t.Owner,
			Stack:      &events.Stack{Frames: t.Stack, Truncated: t.Truncated},
		})
	}
	seen := "every thread on the cycle was blocked for at least " + durationText(h.Timeout)
	if h.AtStart {
		seen = "every thread on the cycle was already blocked when hang detection started, and none of them ran in " +
			itoa(uint64(h.Samples)) + " samples over " + durationText(h.Timeout)
	}
	fs := DeadlockFindings(waits)
	for i := range fs {
		f := &fs[i]
		f.Detail += " Seen live by hang detection: " + seen + "; the target was then " + actionText(h.Action) + "."
		for j := range f.Edges {
			f.Edges[j].Source = s.source
		}
	}
	return fs
}

func actionText(action string) string {
	switch action {
	case "kill":
		return "killed"
	case "detach":
		return "left running (hooktrace detached)"
	}
	return action
}

// durationText renders nanoseconds for people: "2s", "1.5s", "250ms".
func durationText(ns uint64) string {
	ms := ns / 1e6
	switch {
	case ms >= 1000 && ms%1000 == 0:
		return itoa(ms/1000) + "s"
	case ms >= 1000:
		return itoa(ms/1000) + "." + itoa(ms%1000/100) + "s"
	}
	return itoa(ms) + "ms"
}
