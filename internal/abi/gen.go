//go:build linux && amd64

package abi

// The record layout is generated from ../../bpf/hooktrace.h (through
// bpf/layout.c), as the tracer's objects are, so that the converter reads
// the structs the probes and the preloaded library write; `make generate`
// runs this with Debian's clang. The files are named layout_*; the
// identifiers keep the tracer's hooktrace stem.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux -output-stem layout -type event -type stack -type sample -type object -type rec_type hooktrace bpf/layout.c
