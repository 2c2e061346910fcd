//go:build linux && amd64

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hooktrace/hooktrace/events"
)

// clearReady removes a --ready-file left by an earlier run before anything
// starts: a script waiting for it must not see a stale one.
func (s *recording) clearReady() error {
	path := s.flags.readyFile
	if path == "" {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the old --ready-file: %w", err)
	}
	return nil
}

// writeReady writes --ready-file once the probes are live: the traced
// PID and a newline. It appears whole (written aside, then renamed), so a
// script may read it as soon as it exists.
func (s *recording) writeReady(pid int) error {
	path := s.flags.readyFile
	if path == "" {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hooktrace-ready-*")
	if err == nil {
		_, err = fmt.Fprintf(tmp, "%d\n", pid)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		return fmt.Errorf("writing the --ready-file: %w", err)
	}
	return nil
}

// checkPlaced says on stderr how many probes were placed, and where, and
// fails when none of them catches a lock being taken: the report of such
// a run could only ever say "no findings". exe names what was searched.
func (s *recording) checkPlaced(pid int, exe string) error {
	sites := s.tr.Sites()
	perObject := map[string]int{}
	uprobes, locks := 0, 0
	for _, p := range sites {
		if p.Object == "" {
			continue
		}
		uprobes++
		perObject[filepath.Base(p.Object)]++
		if op, ok := events.OpByName(p.Name); ok && op.IsLockAcquire() {
			locks++
		}
	}
	if exe == "" {
		exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	}
	if locks == 0 {
		if uprobes == 0 {
			return fmt.Errorf("no probe placed in pid %d (%s): it links none of the functions hooktrace traces (a static binary, or a Go program without cgo?), or every site was refused (see the warnings above)", pid, exe)
		}
		return fmt.Errorf("no lock probe placed in pid %d (%s): it uses no pthread lock function (a static binary, or a Go program without cgo?), or every lock site was refused (see the warnings above); %d other probes were placed", pid, exe, uprobes)
	}
	objs := make([]string, 0, len(perObject))
	for o, n := range perObject {
		objs = append(objs, fmt.Sprintf("%s (%d)", o, n))
	}
	sort.Strings(objs)
	fmt.Fprintf(os.Stderr, "hooktrace: pid %d: %d probes placed (%d on lock calls) in %s\n", pid, uprobes, locks, strings.Join(objs, ", "))
	return nil
}
