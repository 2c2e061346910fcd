# hooktrace: `make build` needs only Go (the BPF objects and the preloaded
# library are committed); `make generate` needs Debian's clang, libbpf-dev
# and gcc.
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build generate check-generated test test-kernels lint bench fuzz clean demo realworld upcxx

all: build

# A static binary: the gate that execs a traced target is hooktrace itself,
# and without cgo it runs no libc code the target's probes would see.
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/hooktrace ./cmd/hooktrace

generate:
	$(GO) generate ./tracer ./internal/abi ./bench ./preload

# The committed objects must be what the committed C produces.
check-generated: generate
	git diff --exit-code -- tracer/hooktrace_x86_bpfel.go tracer/hooktrace_x86_bpfel.o internal/abi/layout_x86_bpfel.go internal/abi/layout_x86_bpfel.o bench/floor_x86_bpfel.go bench/floor_x86_bpfel.o preload/libhooktrace_preload.so preload/libhooktrace_inject.so preload/shm_layout.go

# staticcheck, pinned; go run fetches it through the module proxy once.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

SHIM_PARTS := $(filter-out preload/src/shim.c,$(wildcard preload/src/*.c))
SHIM_CFLAGS := -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -Ipreload/src -Ibpf

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	# Tracing is x86-64 Linux; reading traces works everywhere.
	GOOS=darwin $(GO) build -o /dev/null ./cmd/hooktrace
	GOOS=darwin $(GO) build ./events ./analyzer ./reports
	GOARCH=arm64 $(GO) build ./...
	GOARCH=arm64 $(GO) vet ./...
	# Each part of the preloaded library compiles alone through shim.h, in
	# both builds (shim.c includes them all into one unit, for inlining).
	for f in $(SHIM_PARTS); do for d in -UHOOKTRACE_INJECT -DHOOKTRACE_INJECT; do \
		$(CC) -fsyntax-only $(SHIM_CFLAGS) $$d $$f || exit 1; done; done

# UPC++ 2020.10.0, built once per machine into a cache outside the
# repository for the tests that trace real UPC++ programs (about 13
# minutes on 2 cores, then instant). The source tarball is $UPCXX_SOURCE or
# found on the file system; UPCXX_PREFIX moves the cache.
upcxx:
	testdata/upcxx/build.sh

# The test command (README, .ci/run): every test, under the race detector
# (the tracer's reader, gate and status line share state). eBPF tests need
# root; with CI set they fail instead of skipping when eBPF is unavailable.
test: lint
	$(GO) test -race -count=1 -timeout 45m ./...

# The eBPF recorder under other kernels: Debian 12's 6.1 and 6.12, each
# booted once in QEMU (test/kernels/run.sh; KERNELS picks others). Needs
# root and qemu-system-x86; the kernels are cached outside the repository.
KERNELS ?= 6.1 6.12
test-kernels:
	test/kernels/run.sh $(KERNELS)

# Overhead of tracing a workload that allocates under locks: untraced,
# hooktrace's recorders and modes, the eBPF floor, TSan and Helgrind,
# round-robin; prints a Markdown table (bench/README.md). Needs root.
# BENCH_ROUNDS, BENCH_ITERS (lock holds per thread), BENCH_THREADS,
# BENCH_MUTEXES and BENCH_CONFIGS (comma-separated keys) tune it;
# BENCH_LIFE_ITERS, the lock-lifetime workloads' iterations a thread.
BENCH_ROUNDS ?= 5
BENCH_ITERS ?= 100000
BENCH_THREADS ?= 2
BENCH_MUTEXES ?= 4
BENCH_CONFIGS ?=
BENCH_LIFE_ITERS ?= 2000
bench: build
	HOOKTRACE_BENCH_ROUNDS=$(BENCH_ROUNDS) HOOKTRACE_BENCH_ITERS=$(BENCH_ITERS) \
	HOOKTRACE_BENCH_THREADS=$(BENCH_THREADS) HOOKTRACE_BENCH_MUTEXES=$(BENCH_MUTEXES) \
	HOOKTRACE_BENCH_CONFIGS="$(BENCH_CONFIGS)" HOOKTRACE_BENCH_BIN=$(CURDIR)/bin/hooktrace \
	HOOKTRACE_BENCH_LIFE_ITERS=$(BENCH_LIFE_ITERS) \
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 0 ./bench/

# The reference registration cache, legacy and fixed, traced for real
# (needs root and gcc; see rcache/README.md).
demo: build
	bin/hooktrace demo

# libuv's and jemalloc's own test suites, built from the checkouts given
# (LIBUV_SRC, JEMALLOC_SRC) and run untraced and under hooktrace; prints a
# Markdown summary (bench/realworld.sh lists the knobs). Before a release,
# not in CI: the whole of it takes about half an hour on 2 cores.
realworld: build
	bench/realworld.sh

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzReader -fuzztime 60s ./events

clean:
	rm -rf bin
