#!/bin/bash
# run.sh [SERIES...]: the kernel matrix, `make test-kernels`. For each
# kernel series (default: Debian 12's 6.1 and 6.12), boots that kernel once
# in a VM over this machine's root filesystem (vm-run.sh) and runs
# inside.sh there: the eBPF recorder's findings, attach, and auto's
# fallback where eBPF cannot load. Needs root, qemu-system-x86,
# busybox-static, kmod, cpio, zstd and the Go toolchain.
#
# KERNEL_CACHE: where the kernels are kept (fetch-kernel.sh);
# KERNEL_TIMEOUT: seconds one kernel's VM may take (default 1200).
set -euo pipefail
cd "$(dirname "$0")/../.."
here=$PWD/test/kernels
series=${*:-6.1 6.12}

work=$(mktemp -d /tmp/hooktrace-kernels.XXXXXX)
chmod 755 "$work" # one test runs hooktrace as nobody
trap 'rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -o "$work/hooktrace" ./cmd/hooktrace
go test -c -o "$work/cmd.test" ./cmd/hooktrace

failed=
for s in $series; do
	kernel=$("$here/fetch-kernel.sh" "$s")
	img=$(sed -n 1p <<<"$kernel")
	moddir=$(sed -n 2p <<<"$kernel")
	echo "=== kernel $s: $(basename "$img")"
	start=$(date +%s)
	if VM_MODDIR=$moddir VM_TIMEOUT=${KERNEL_TIMEOUT:-1200} "$here/vm-run.sh" "$img" bash "$here/inside.sh" "$work"; then
		echo "=== kernel $s: passed in $(($(date +%s) - start))s"
	else
		echo "=== kernel $s: FAILED after $(($(date +%s) - start))s"
		failed="$failed $s"
	fi
done
if [ -n "$failed" ]; then
	echo "test-kernels: failed on:$failed" >&2
	exit 1
fi
echo "test-kernels: passed on $series"
