//go:build linux && amd64

package preload

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBootstrapRealloc: before the real allocator is found (dlsym may
// allocate while the shim looks it up), blocks come from the shim's own
// bootstrap pool. A realloc of one moves it to the real allocator and
// must keep all of it, up to the new size: it once kept 256 bytes. The
// program is the shim itself, compiled into it, so the pool's own
// functions make the blocks.
func TestBootstrapRealloc(t *testing.T) {
	prog := `#include "shim.c"
#include <stdio.h>
int main(void)
{
	for (size_t n = 16; n <= 16384; n *= 4) {
		unsigned char *p = boot_alloc(n);
		if (!p || !is_boot(p)) {
			printf("no bootstrap block of %zu bytes\n", n);
			return 1;
		}
		for (size_t i = 0; i < n; i++)
			p[i] = (unsigned char)(i * 7 + n);
		for (size_t to = n / 2; to <= 4 * n; to *= 4) {
			unsigned char *q = realloc(p, to);
			size_t keep = to < n ? to : n;
			for (size_t i = 0; i < keep; i++)
				if (q[i] != (unsigned char)(i * 7 + n)) {
					printf("realloc of a %zu-byte bootstrap block to %zu: byte %zu lost\n", n, to, i);
					return 1;
				}
			free(q);
		}
	}
	printf("ok\n");
	return 0;
}
`
	bin := buildAgainstShim(t, "boot", prog, "-O2", "-std=gnu11", "-fno-omit-frame-pointer", "-ftls-model=initial-exec",
		"-ldl", "-lpthread")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v: %s", err, out)
	}
}
