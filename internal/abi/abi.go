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

// OpCount is one more than the highest op (enum op's OP_COUNT): the size
// of the BPF side's per-op tables.
const OpCount = hooktraceOpOP_COUNT

// A process's state in the BPF side's traced map: traced, or gated (a
// child that has not exec'd its target yet).
type TraceState = hooktraceTraceState

const (
	TraceStateTraced = hooktraceTraceStateTRACED
	TraceStateGated  = hooktraceTraceStateGATED
)

// The probe cookie's bit fields (COOKIE_* in the header): shifts and
// widths.
type CookieLayout = hooktraceCookieLayout

const (
	CookieOpShift      = hooktraceCookieLayoutCOOKIE_OP_SHIFT
	CookieOpBits       = hooktraceCookieLayoutCOOKIE_OP_BITS
	CookieAdjShift     = hooktraceCookieLayoutCOOKIE_ADJ_SHIFT
	CookieAdjBits      = hooktraceCookieLayoutCOOKIE_ADJ_BITS
	CookieUserShift    = hooktraceCookieLayoutCOOKIE_USER_SHIFT
	CookieAliasShift   = hooktraceCookieLayoutCOOKIE_ALIAS_SHIFT
	CookieAliasBits    = hooktraceCookieLayoutCOOKIE_ALIAS_BITS
	CookieRefiresShift = hooktraceCookieLayoutCOOKIE_REFIRES_SHIFT
	CookieCallShift    = hooktraceCookieLayoutCOOKIE_CALL_SHIFT
	CookieCallBits     = hooktraceCookieLayoutCOOKIE_CALL_BITS
	CookieBackShift    = hooktraceCookieLayoutCOOKIE_BACK_SHIFT
	CookieBackBits     = hooktraceCookieLayoutCOOKIE_BACK_BITS
	CookieLenShift     = hooktraceCookieLayoutCOOKIE_LEN_SHIFT
	CookieLenBits      = hooktraceCookieLayoutCOOKIE_LEN_BITS
	CookieLenUnitShift = hooktraceCookieLayoutCOOKIE_LEN_UNIT_SHIFT
)

// GlibcMutexOwnerOffset is where x86-64 glibc keeps a pthread_mutex_t's
// owner TID (GLIBC_MUTEX_OWNER_OFFSET), which the probes and hang
// detection both read.
const GlibcMutexOwnerOffset = hooktraceGlibcLayoutGLIBC_MUTEX_OWNER_OFFSET
