//go:build linux && amd64

package tracer

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPhysAddressMask(t *testing.T) {
	for _, c := range []struct {
		name, cpuinfo string
		want          uint64
	}{
		{"48 bits", "processor\t: 0\nflags\t\t: fpu sse2 nx\naddress sizes\t: 48 bits physical, 48 bits virtual\n", 0xffff_ffff_f000},
		{"encryption bits taken off", "flags\t\t: sme sev\naddress sizes\t: 43 bits physical, 48 bits virtual\n", 0x7ff_ffff_f000},
		{"5-level paging", "flags\t\t: fpu la57 nx\naddress sizes\t: 52 bits physical, 57 bits virtual\n", 0},
		{"no address sizes", "flags\t\t: fpu\n", 0},
	} {
		f := filepath.Join(t.TempDir(), "cpuinfo")
		if err := os.WriteFile(f, []byte(c.cpuinfo), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := physAddressMask(f); got != c.want {
			t.Errorf("%s: physAddressMask = %#x, want %#x", c.name, got, c.want)
		}
	}
	if got := physAddressMask(filepath.Join(t.TempDir(), "missing")); got != 0 {
		t.Errorf("no cpuinfo: physAddressMask = %#x, want 0", got)
	}
}
