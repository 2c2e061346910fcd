//go:build linux && amd64

// Package abi is the contract between hooktrace's recorders and its Go
// side, generated from bpf/hooktrace.h: the records the BPF probes and the
// preloaded library write to the ring, and the contract's enums. It is
// generated once, here, and imported by the tracer and the converter.
// The names below are the generated ones, exported; a change to the header
// that drops or renames one fails to build instead of drifting.
package abi

// The records, as the ring carries them.
type (
	Event   = hooktraceEvent
	Stack   = hooktraceStack
	Sample  = hooktraceSample
	Object  = hooktraceObject
	RecType = hooktraceRecType
)

// The record types: each record's first word.
const (
	RecEvent  = hooktraceRecTypeREC_EVENT
	RecStack  = hooktraceRecTypeREC_STACK
	RecSample = hooktraceRecTypeREC_SAMPLE
	RecObject = hooktraceRecTypeREC_OBJECT
	RecSlots  = hooktraceRecTypeREC_SLOTS
)
