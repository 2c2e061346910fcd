#!/bin/sh
# Builds the preloaded recorder reproducibly: fixed flags, no paths of the
# build machine in the object, no build ID that depends on them.
set -eu
cd "$(dirname "$0")"
build() {
${CC:-gcc} -shared -fPIC -O2 -g0 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter \
	-fno-omit-frame-pointer -fno-optimize-sibling-calls -fvisibility=hidden \
	-ftls-model=initial-exec -fno-stack-protector -fno-asynchronous-unwind-tables -funwind-tables \
	-ffile-prefix-map="$(pwd)"=. -Isrc -I../bpf \
	-Wl,--build-id=none -Wl,-z,now -Wl,--hash-style=gnu \
	"$@" -o "$out.tmp" src/shim.c -ldl -lpthread
strip --strip-unneeded -R .comment "$out.tmp"
mv "$out.tmp" "$out"
}
out=libhooktrace_preload.so build -Wl,-soname,libhooktrace_preload.so
# The build hooktrace attach loads into a running process with dlopen:
# its own references bind to its own definitions (-Bsymbolic-functions, which leaves the
# loader's lookups from it in the program's scope), since the
# program's were bound before it came.
out=libhooktrace_inject.so build -DHOOKTRACE_INJECT -Wl,-Bsymbolic-functions -Wl,-soname,libhooktrace_inject.so
