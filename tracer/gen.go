//go:build linux && amd64

package tracer

// The BPF objects are generated from ../bpf and committed, so that building
// hooktrace needs no clang; `make generate` runs this with Debian's clang.
// The probes read x86-64 registers, syscall numbers and glibc layouts, so
// the objects are built for amd64 only. The contract's types and enums
// (bpf/hooktrace.h) are generated once, in internal/abi, not here.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux -no-global-types hooktrace ../bpf/hooktrace.c
