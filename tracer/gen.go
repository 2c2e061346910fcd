package tracer

// The BPF objects are generated from ../bpf and committed, so that building
// hooktrace needs no clang; `make generate` runs this with Debian's clang.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu" -target bpfel -type event -type stack -type sample -type thread_state hooktrace ../bpf/hooktrace.c
