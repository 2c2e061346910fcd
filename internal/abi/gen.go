//go:build linux && amd64

package abi

// The records and the contract's enums are generated from
// ../../bpf/hooktrace.h (through bpf/layout.c), once, for the tracer, which
// loads the probes, and the converter, which reads the structs the probes
// and the preloaded library write; `make generate` runs this with Debian's
// clang. The files are named layout_*; the identifiers keep the hooktrace
// stem, and abi.go exports them.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux -output-stem layout -type event -type stack -type sample -type object -type rec_type -type limits -type trace_state -type op -type event_flag -type cookie_layout -type glibc_layout hooktrace bpf/layout.c
