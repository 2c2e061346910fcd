//go:build linux && amd64

package probesite

import (
	"slices"
	"testing"

	"github.com/hooktrace/hooktrace/symbolize"
)

// The loader's list as glibc 2.36's ld.so prints it: a relative RUNPATH's
// library and a relative preload keep the loader's relative paths, a
// library it did not find keeps its name, the vDSO is no file.
func TestParseLdList(t *testing.T) {
	out := "\t./lib/libpre.so (0x00007f0000000000)\n" +
		"\tlinux-vdso.so.1 (0x00007ffd5a1e6000)\n" +
		"\tlibjemalloc.so.2 => lib/libjemalloc.so.2 (0x00007f81d4e00000)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f81d4c1e000)\n" +
		"\tlibgone.so.1 => not found\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f81d52e1000)\n"
	want := []ldEntry{
		{"./lib/libpre.so", "./lib/libpre.so"},
		{"libjemalloc.so.2", "lib/libjemalloc.so.2"},
		{"libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"},
		{"libgone.so.1", ""},
		{"/lib64/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"},
	}
	if got := parseLdList(out); !slices.Equal(got, want) {
		t.Errorf("parseLdList:\n got %+v\nwant %+v", got, want)
	}
}

// A running process that changed directory since the loader resolved a
// relative RUNPATH: asked now, the loader finds another file or none, and
// the file the process maps under that name is the one.
func TestMappedAs(t *testing.T) {
	maps := symbolize.Maps{
		{Start: 0x1000, End: 0x2000, Perms: "r-xp", Inode: 7, Path: "/opt/app/lib/libjemalloc.so.2"},
		{Start: 0x3000, End: 0x4000, Perms: "r-xp", Inode: 8, Path: "/usr/lib/x86_64-linux-gnu/libc.so.6"},
	}
	for _, c := range []struct {
		l    ldEntry
		want string
	}{
		{ldEntry{"libjemalloc.so.2", "/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "/opt/app/lib/libjemalloc.so.2"},
		{ldEntry{"libjemalloc.so.2", ""}, "/opt/app/lib/libjemalloc.so.2"},
		{ldEntry{"libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"}, "/usr/lib/x86_64-linux-gnu/libc.so.6"},
		{ldEntry{"libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"}, "/usr/lib/x86_64-linux-gnu/libm.so.6"},
	} {
		if got := mappedAs(maps, c.l); got != c.want {
			t.Errorf("mappedAs(%+v) = %q, want %q", c.l, got, c.want)
		}
	}
	// At an exec, before the loader ran, nothing is mapped yet: the
	// loader's answer stands.
	if got := mappedAs(nil, ldEntry{"libjemalloc.so.2", "/x/lib/libjemalloc.so.2"}); got != "/x/lib/libjemalloc.so.2" {
		t.Errorf("nothing mapped: %q", got)
	}
}
