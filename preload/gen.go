// Package preload holds hooktrace's user-space source of events: the C
// library (src/shim.c) that hooktrace preloads into a target to record its
// allocator, lock and thread calls into shared memory without a kernel trap
// per call, and Preload, which sets that memory up, reads it and turns the
// records into events with package source, as the BPF tracer (package
// tracer) does its own.
// The built library is committed and embedded, so hooktrace stays one
// binary that needs nothing installed; `make generate` rebuilds it with
// gcc, and `make check-generated` checks it matches its source.
package preload

import _ "embed"

//go:generate sh build.sh
//go:generate go run ./internal/shmlayout -o shm_layout.go

// Shim is the built library.
//
//go:embed libhooktrace_preload.so
var Shim []byte

// Injected is the build attach loads into a running process (dlopen,
// through ptrace): the same recorder, with per-thread state small enough
// for the static TLS a library loaded late may take.
//
//go:embed libhooktrace_inject.so
var Injected []byte
