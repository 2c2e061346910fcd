#!/usr/bin/env bash
# Build and install UPC++ 2020.10.0 (with its embedded GASNet-EX) once, into a
# cache outside the repository, for the tests that trace real UPC++ programs.
#
# Usage: testdata/upcxx/build.sh [PREFIX]
#   PREFIX  install prefix (default: $UPCXX_PREFIX, else
#           /var/cache/hooktrace/upcxx-2020.10.0); a finished install there
#           (its .hooktrace-built stamp) is reused, so a second run is instant.
#           UPC++'s own test programs are copied to PREFIX/test.
#
# The source tarball is $UPCXX_SOURCE, else the first
# upcxx-2020.10.0-src.tar.gz a bounded search of the file system finds; its
# sha256 must be the release's. Conduits smp and udp, codemodes debug (-O0 -g,
# which keeps upcxx::detail::persona_tls::burst_user as a symbol) and opt.
# JOBS=N sets the make parallelism (default: nproc). About 13 minutes on 2 cores.
set -euo pipefail

SHA256=1bbe56f43b52f6b27a964a6e1d6ead338e32970b35c5a5a9d9505b4966f25e1b
NAME=upcxx-2020.10.0-src.tar.gz
PREFIX=${1:-${UPCXX_PREFIX:-/var/cache/hooktrace/upcxx-2020.10.0}}
JOBS=${JOBS:-$(nproc)}
STAMP=$PREFIX/.hooktrace-built

if [[ -f $STAMP && -f $PREFIX/test/rput.cpp ]]; then
	echo "upcxx: cached in $PREFIX"
	exit 0
fi

src=${UPCXX_SOURCE:-}
if [[ -z $src ]]; then
	src=$(find / -maxdepth 6 -name "$NAME" -type f \
		-not -path '/proc/*' -not -path '/sys/*' 2>/dev/null | head -n 1 || true)
fi
if [[ -z $src || ! -f $src ]]; then
	echo "upcxx: no $NAME found; set UPCXX_SOURCE to the UPC++ 2020.10.0 source tarball" >&2
	exit 1
fi
got=$(sha256sum "$src" | cut -d' ' -f1)
if [[ $got != "$SHA256" ]]; then
	echo "upcxx: $src has sha256 $got, want $SHA256" >&2
	exit 1
fi

# UPC++'s own test programs, which the tests build against the install.
copy_tests() {
	local tmp
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/upcxx-test.XXXXXX")
	tar xzf "$src" -C "$tmp" upcxx-2020.10.0/test
	rm -rf "$PREFIX/test"
	mv "$tmp/upcxx-2020.10.0/test" "$PREFIX/test"
	rm -rf "$tmp"
}

mkdir -p "$(dirname "$PREFIX")"
# One build at a time: a second caller waits for the first and reuses it.
exec 9>"$PREFIX.lock"
flock 9
if [[ -f $STAMP ]]; then
	[[ -f $PREFIX/test/rput.cpp ]] || copy_tests
	echo "upcxx: cached in $PREFIX"
	exit 0
fi

for tool in gcc g++ make python3 perl; do
	command -v "$tool" >/dev/null || { echo "upcxx: $tool is needed to build UPC++" >&2; exit 1; }
done

# upcxx-run's interpreter: the system's, which every user can run (a
# python3 found first on root's PATH may live in its home).
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3)

work=$(mktemp -d "${TMPDIR:-/tmp}/upcxx-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "upcxx: building from $src in $work, installing into $PREFIX"
tar xzf "$src" -C "$work"
mkdir -p "$work/build"
cd "$work/build"
"$work/upcxx-2020.10.0/configure" --prefix="$PREFIX" \
	--with-cc="$(command -v gcc)" --with-cxx="$(command -v g++)" \
	--with-python="$python" --with-default-network=smp \
	--disable-mpi --disable-mpi-compat --disable-ibv --disable-ofi --disable-ucx
make -j"$JOBS" all
make install
copy_tests
echo "$SHA256" >"$STAMP"
echo "upcxx: installed in $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
