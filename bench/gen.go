package bench

// The floor's BPF object is generated from bpf/floor.c and committed, like
// hooktrace's; `make generate` runs this with Debian's clang.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux floor bpf/floor.c
