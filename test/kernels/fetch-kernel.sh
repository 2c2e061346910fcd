#!/bin/bash
# fetch-kernel.sh SERIES: print the path of a bootable Debian kernel image
# of SERIES (6.1: Debian 12's stock kernel; 6.12: its newer one), with its
# modules unpacked beside it, downloading it once into $KERNEL_CACHE
# (default /var/cache/hooktrace/kernels). The package is unpacked with
# dpkg-deb, never installed: the host's own kernel and boot are untouched.
#
# Prints two lines: the image, then the root under which lib/modules/ holds
# its modules (vm-run.sh's VM_MODDIR).
set -euo pipefail
series=${1:?usage: fetch-kernel.sh 6.1|6.12}
cache=${KERNEL_CACHE:-/var/cache/hooktrace/kernels}
mkdir -p "$cache"

case $series in
6.1) meta=linux-image-amd64 ;;
*) meta=linux-image-$series-amd64 ;;
esac
pkg=$(apt-cache depends "$meta" 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1)
if [ -z "$pkg" ]; then
	apt-get update -qq >&2
	pkg=$(apt-cache depends "$meta" | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1)
fi
[ -n "$pkg" ] || { echo "fetch-kernel: no kernel package behind $meta" >&2; exit 1; }
kver=${pkg#linux-image-}
root=$cache/$kver
img=$root/boot/vmlinuz-$kver
if [ ! -s "$root/.done" ]; then
	tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
	chmod 755 "$tmp" # apt-get download drops to its own user
	(cd "$tmp" && apt-get download -qq "$pkg" >&2)
	rm -rf "$root"
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$root"
	rm -rf "$tmp"
	depmod -b "$root" "$kver"
	echo "$pkg" >"$root/.done"
fi
echo "$img"
echo "$root"
