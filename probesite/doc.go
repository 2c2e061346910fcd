//go:build linux && amd64

// Package probesite finds where hooktrace records each traced function in
// a process, for both recorders (the BPF tracer and the preloaded library):
// the definition the loader will bind (the first in its search order, as
// `ld.so --list` prints it), the instruction to probe in it (package
// placement), and where the allocator's code lies.
package probesite
