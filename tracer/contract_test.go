//go:build linux && amd64

package tracer

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/hang"
	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/internal/testenv"
	"github.com/hooktrace/hooktrace/probesite"
)

// The BPF side's numbers are enums in bpf/hooktrace.h; these tests read
// them from the committed object's BTF (what the kernel really runs) and
// hold the Go side to them.

func objectEnum(t *testing.T, name string) map[string]uint64 {
	t.Helper()
	spec, err := btf.LoadSpec("hooktrace_x86_bpfel.o")
	if err != nil {
		t.Fatalf("reading the object's BTF: %v", err)
	}
	var e *btf.Enum
	if err := spec.TypeByName(name, &e); err != nil {
		t.Fatalf("enum %s: %v", name, err)
	}
	out := map[string]uint64{}
	for _, v := range e.Values {
		out[v.Name] = v.Value
	}
	return out
}

// cName is the op's name in the C enum: OP_ and its function's name
// without the pthread_ prefix.
func cName(op events.Op) string {
	return "OP_" + strings.ToUpper(strings.TrimPrefix(op.String(), "pthread_"))
}

// Hang detection reads a mutex's owner where the BPF side does.
func TestHangMutexOwnerMatchesBPF(t *testing.T) {
	c := objectEnum(t, "glibc_layout")
	if got, want := uint64(hang.MutexOwnerOffset), c["GLIBC_MUTEX_OWNER_OFFSET"]; got != want {
		t.Errorf("hang.MutexOwnerOffset = %d, GLIBC_MUTEX_OWNER_OFFSET = %d", got, want)
	}
}

func TestOpsMatchBPF(t *testing.T) {
	c := objectEnum(t, "op")
	goNames := map[string]bool{}
	for _, op := range events.Ops() {
		n := cName(op)
		goNames[n] = true
		v, ok := c[n]
		if !ok {
			t.Errorf("events.%v (%d) has no %s in bpf/hooktrace.h", op, op, n)
		} else if v != uint64(op) {
			t.Errorf("%s = %d in C, events op %v = %d", n, v, op, op)
		}
	}
	for n, v := range c {
		if n == "OP_COUNT" {
			if want := uint64(len(events.Ops()) + 1); v != want {
				t.Errorf("OP_COUNT = %d, want %d (events.Ops has %d)", v, want, len(events.Ops()))
			}
			continue
		}
		if !goNames[n] {
			t.Errorf("%s = %d in bpf/hooktrace.h has no events.Op", n, v)
		}
	}
	if uint64(abi.OpCount) != c["OP_COUNT"] {
		t.Errorf("generated OP_COUNT %d, object %d: run make generate", abi.OpCount, c["OP_COUNT"])
	}
}

func TestFlagsMatchBPF(t *testing.T) {
	want := map[string]events.Flags{
		"F_RETURN":     events.FlagReturn,
		"F_ACQUIRED":   events.FlagAcquired,
		"F_IN_ALLOC":   events.FlagInAlloc,
		"F_PROCESS":    events.FlagProcess,
		"F_LOCKS_HELD": events.FlagLocksHeld,
		"F_BUSY":       events.FlagBusy,
	}
	c := objectEnum(t, "event_flag")
	var all events.Flags
	for n, f := range want {
		all |= f
		if v, ok := c[n]; !ok || v != uint64(f) {
			t.Errorf("%s: C %d (present %v), Go %d", n, v, ok, f)
		}
	}
	for n := range c {
		if _, ok := want[n]; !ok {
			t.Errorf("C flag %s has no events.Flags bit", n)
		}
	}
	// Every Go flag is in the table: they are the low bits, in order.
	if all&(all+1) != 0 {
		t.Errorf("events.Flags %#x are not contiguous low bits", all)
	}
}

func TestProbeFuncsAreOps(t *testing.T) {
	c := objectEnum(t, "op")
	probed := map[events.Op]bool{}
	for _, f := range probesite.ProbeFuncs {
		probed[f.Op] = true
		if f.Name != f.Op.String() {
			t.Errorf("probe %s for op %v", f.Name, f.Op)
		}
		if _, ok := c[cName(f.Op)]; !ok {
			t.Errorf("probe %s has no BPF op", f.Name)
		}
	}
	// Every library call the model has is probed (syscalls, thread events
	// and user probes come from elsewhere).
	for _, op := range events.Ops() {
		if op.IsAllocator() || op.IsLockAcquire() || op.IsUnlock() || op.IsLockInit() || op.IsLockDestroy() {
			if !probed[op] {
				t.Errorf("%v is not probed", op)
			}
		}
	}
}

func TestCookieRoundTrip(t *testing.T) {
	for _, c := range []probeCookie{
		{op: events.OpFree, adj: 8},
		{op: events.OpMalloc, adj: 0x28, back: 0x123456, length: 0xab},
		{op: events.OpProbeEnter, adj: 0xffff, user: 7},
		{op: events.OpSpinTrylock, user: 0xfff},
		{op: events.OpSpinUnlock, adj: 8, alias: events.OpSpinInit},
		{op: events.OpSpinLock, adj: 0, refires: true},
		{op: events.OpSpinInit, call: 5},
		{op: events.OpSpinUnlock, call: 15, alias: events.OpSpinInit},
	} {
		if got := decodeCookie(c.encode()); got.op != c.op || got.adj != c.adj ||
			(c.user != 0 && got.user != c.user) || (c.alias != 0 && got.alias != c.alias) || got.refires != c.refires ||
			(!c.op.IsAllocator() && c.user == 0 && got.call != c.call) ||
			(c.op.IsAllocator() && (got.back != c.back || got.length != c.length)) {
			t.Errorf("%+v decodes as %+v", c, got)
		}
	}
}

// TestCookieMatchesC decodes Go-encoded cookies with the C macros the
// probes use, compiled from bpf/hooktrace.h.
func TestCookieMatchesC(t *testing.T) {
	hdr, err := filepath.Abs("../bpf/hooktrace.h")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "cookie.c")
	prog := fmt.Sprintf(`#include <linux/types.h>
#include <stdio.h>
#include <stdlib.h>
#include %q
int main(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		__u64 c = strtoull(argv[i], 0, 0);
		printf("%%u %%u %%u %%llu %%llu %%u %%u %%u\n", COOKIE_OP(c), COOKIE_ADJ(c), COOKIE_USER(c),
		       (unsigned long long)COOKIE_RANGE_BACK(c), (unsigned long long)COOKIE_RANGE_LEN(c),
		       COOKIE_ALIAS(c), (unsigned)COOKIE_REFIRES(c), COOKIE_CALL(c));
	}
	return 0;
}
`, hdr)
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := testenv.C{Source: src, Name: "cookie"}.Build(t)
	r := &probesite.AllocRange{Object: "libc.so.6", Lo: 0x9a000, Hi: 0x9a000 + 0x1c345}
	alloc := probeCookie{op: events.OpMalloc, adj: 0x18}
	alloc.setRange(r, 0xa1230)
	if alloc.length == 0 {
		t.Fatal("the allocator range did not fit the cookie")
	}
	cookies := []probeCookie{
		alloc,
		{op: events.OpFree, adj: 8},
		{op: events.OpProbeExit, user: 3},
		{op: events.OpMutexTrylock, user: 0xfff},
		{op: events.OpSpinUnlock, adj: 8, alias: events.OpSpinInit},
		{op: events.OpSpinLock, refires: true},
		{op: events.OpSpinInit, call: 6},
		{op: events.OpSpinUnlock, call: 5, alias: events.OpSpinInit},
	}
	args := make([]string, len(cookies))
	for i, c := range cookies {
		args[i] = fmt.Sprint(c.encode())
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, c := range cookies {
		// Go's decoding of its own encoding, which TestCookieRoundTrip
		// holds to the fields set.
		d := decodeCookie(c.encode())
		want := fmt.Sprintf("%d %d %d %d %d %d %d %d", d.op, d.adj, d.user, d.back, d.rangeBytes(), d.alias, b2u64(d.refires), d.call)
		if i >= len(lines) || lines[i] != want {
			t.Errorf("cookie %+v: C reads %q, want %q", c, lines[min(i, len(lines)-1)], want)
		}
	}
	if alloc.back != 0xa1230-0x9a000 || alloc.rangeBytes() < r.Hi-r.Lo {
		t.Errorf("allocator range back %#x, %#x bytes; want %#x, at least %#x", alloc.back, alloc.rangeBytes(), 0xa1230-0x9a000, r.Hi-r.Lo)
	}
}
