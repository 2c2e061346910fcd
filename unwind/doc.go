//go:build linux && amd64

// Package unwind turns a raw user-stack sample into a call chain using the
// DWARF call-frame information (.eh_frame, .debug_frame) of the mapped
// objects, the way `perf --call-graph dwarf` does.
//
// Frame-pointer walks fail inside code built without frame pointers, which
// includes glibc and most optimised HPC libraries. With CFI the walk goes
// through such frames, so a probe inside free() shows the glibc-internal
// path (free, _int_free, ...) that decides which locks are held.
//
// The tracer captures rip, rsp, rbp and a copy of the stack from rsp upward
// (Sample). Unwind replays the CFA rules of each frame over that copy,
// resolving each pc to an Object and load bias through a caller-supplied
// Resolver: the tracer's object layer (package symbolize) opens each mapped
// file once and builds its Object with New. Only x86-64 is supported.
package unwind
