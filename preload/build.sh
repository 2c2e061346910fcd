#!/bin/sh
# Builds the preloaded recorder reproducibly: fixed flags, no paths of the
# build machine in the object, no build ID that depends on them.
set -eu
cd "$(dirname "$0")"
${CC:-gcc} -shared -fPIC -O2 -g0 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter \
	-fno-omit-frame-pointer -fno-optimize-sibling-calls -fvisibility=hidden \
	-ftls-model=initial-exec -fno-stack-protector -fno-asynchronous-unwind-tables -funwind-tables \
	-ffile-prefix-map="$(pwd)"=. -Isrc -I../bpf \
	-Wl,--build-id=none -Wl,-z,now -Wl,--hash-style=gnu -Wl,-soname,libhooktrace_preload.so \
	-o libhooktrace_preload.so.tmp src/shim.c -ldl -lpthread
strip --strip-unneeded -R .comment libhooktrace_preload.so.tmp
mv libhooktrace_preload.so.tmp libhooktrace_preload.so
