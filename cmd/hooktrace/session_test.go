//go:build linux && amd64

package main

import "testing"

// TestRingSizes: --ring takes K, M and G up to the 1G the message names.
func TestRingSizes(t *testing.T) {
	for in, want := range map[string]int{"4K": 4096, "16M": 16 << 20, "1G": 1 << 30, "1024M": 1 << 30, "8192": 8192} {
		if got, err := parseRingSize(in); err != nil || got != want {
			t.Errorf("--ring %s: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"2G", "2048M", "2K", "3M", "0", "-4K", "1T", "G", "99999999999999999G"} {
		if got, err := parseRingSize(in); err == nil {
			t.Errorf("--ring %s: accepted as %d", in, got)
		}
	}
}
