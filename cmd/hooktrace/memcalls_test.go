//go:build linux && amd64

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestPreloadMemoryCalls: as an ordinary user, a program that calls
// mmap, madvise, mremap and munmap 5 times each and sbrk once, through
// the PLT. The preload recorder sees each call (through the GOT slots
// the shim rewrites), counts it exactly, and records it with the
// program's function on its stack and the call's arguments.
func TestPreloadMemoryCalls(t *testing.T) {
	prog := testenv.Program(t, "memcalls")
	report, read := nobodyReport(t)
	trace := filepath.Join(filepath.Dir(report), "memcalls.htr")
	cmd := asNobody(t, prog, hooktraceBin, "run", "--recorder", "preload", "--report", "json:"+report, "-o", trace,
		"--fail-on", "none", "--", prog)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hooktrace as nobody: %v", err)
	}
	rep := parseReport(t, read())
	want := map[string]uint64{"mmap": 5, "madvise": 5, "mremap": 5, "munmap": 5, "brk": 1}
	for op, n := range want {
		if rep.Stats.Calls[op] != n {
			t.Errorf("calls.%s = %d, want %d (calls %v)", op, rep.Stats.Calls[op], n, rep.Stats.Calls)
		}
	}
	if rep.Stats.LostEvents != 0 || !rep.Stats.Complete {
		t.Errorf("lost %d, complete %v", rep.Stats.LostEvents, rep.Stats.Complete)
	}
	evs, stacks, _ := readTrace(t, trace)
	seen := map[events.Op]int{}
	for _, e := range evs {
		if !e.Op.IsMemSyscall() {
			continue
		}
		seen[e.Op]++
		if st := stacks[e.Stack]; !stackHas(st, "map_and_release") || !stackHas(st, "main") {
			t.Errorf("%s at %#x: stack lacks map_and_release and main:%s", e.Op, e.Addr, stackString(st))
		}
		switch e.Op {
		case events.OpMadvise:
			if e.Size != 1<<20 || e.Arg != 4 { // MADV_DONTNEED
				t.Errorf("madvise size %d advice %d, want 1 MiB, 4", e.Size, e.Arg)
			}
		case events.OpMremap:
			if e.Size != 1<<20 || e.Arg != 2<<20 {
				t.Errorf("mremap from %d to %d, want 1 MiB to 2 MiB", e.Size, e.Arg)
			}
		case events.OpMunmap:
			if e.Size != 2<<20 {
				t.Errorf("munmap of %d, want 2 MiB", e.Size)
			}
		}
	}
	for _, op := range []events.Op{events.OpMmap, events.OpMadvise, events.OpMremap, events.OpMunmap, events.OpBrk} {
		if uint64(seen[op]) != want[op.String()] {
			t.Errorf("%d %s events, want %d", seen[op], op, want[op.String()])
		}
	}
}

// TestAutoMemoryCallsCountedOnce: under auto with eBPF permitted, the
// kernel's sys_enter tracepoint sees every memory syscall, the libc
// wrappers' too, so the shim leaves their GOT slots alone and each call is
// counted once. Only madvise and mremap are the program's alone (the loader
// maps and unmaps memory itself, which the kernel sees as well).
func TestAutoMemoryCallsCountedOnce(t *testing.T) {
	testenv.RequireBPF(t)
	prog := testenv.Program(t, "memcalls")
	out, _, stderr, code := runJSON(t, "--recorder", "auto", "--fail-on", "none", "--", prog)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	rep := parseReport(t, out)
	if rep.Stats.Calls["madvise"] != 5 || rep.Stats.Calls["mremap"] != 5 || rep.Stats.Calls["munmap"] < 5 {
		t.Errorf("calls %v: want 5 madvise and 5 mremap, counted once", rep.Stats.Calls)
	}
}

// TestPreloadProbeInDlopenedLibrary: --probe names a function of a
// library the program loads later with dlopen, by its path. The preload
// recorder arms it when the library is loaded, and again when it is
// loaded after a dlclose unmapped it, and every call fires, also as an
// ordinary user; eBPF counts the same entries and exits. Loaded by name, the library is found through the
// program's own RUNPATH, as untraced: the shim's dlopen hands glibc the
// program's return address, from which glibc takes the caller's search
// path (an interposer that called dlopen itself would make the shim the
// caller, and the library would not be found).
func TestPreloadProbeInDlopenedLibrary(t *testing.T) {
	lib := testenv.C{Source: filepath.Join(testenv.RepoRoot(t), "testdata", "plugin.c"), Name: "libplugin.so",
		Flags: append(slices.Clone(testenv.CFlags), "-fPIC", "-shared")}.Build(t)
	for _, c := range []struct {
		name, prog string
		args       []string
		steps      uint64
	}{
		{"by path", testenv.Program(t, "memcalls"), []string{lib}, 3},
		{"by name", testenv.Program(t, "memcalls", "-Wl,-rpath,"+filepath.Dir(lib), "-Wl,--enable-new-dtags"), []string{"libplugin.so"}, 3},
		{"reloaded", testenv.Program(t, "memcalls"), []string{lib, "reload"}, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			report, read := nobodyReport(t)
			argv := append([]string{hooktraceBin, "run", "--recorder", "preload", "--report", "json:" + report,
				"--probe", "plugin_step@" + lib, "--fail-on", "none", "--", c.prog}, c.args...)
			cmd := asNobody(t, c.prog, argv...)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("hooktrace as nobody: %v", err)
			}
			rep := parseReport(t, read())
			if rep.Stats.ExitStatus == nil || *rep.Stats.ExitStatus != 0 {
				t.Fatalf("the program exited with %v: it did not load its library", rep.Stats.ExitStatus)
			}
			if rep.Stats.Calls["probe_enter"] != c.steps || rep.Stats.Calls["probe_exit"] != c.steps {
				t.Errorf("calls %v: want %d probe_enter and probe_exit", rep.Stats.Calls, c.steps)
			}
			// The library's own lock calls are seen too, and the
			// program's memory calls still are.
			if rep.Stats.Calls["pthread_mutex_lock"] < 3 || rep.Stats.Calls["madvise"] != 5 {
				t.Errorf("calls %v: want the plugin's 3 locks and the program's 5 madvise calls", rep.Stats.Calls)
			}
			// The uprobes are on the file: they hold in every mapping
			// of it, and count each exit too.
			t.Run("ebpf", func(t *testing.T) {
				testenv.RequireBPF(t)
				e := traceProc(t, "ebpf", []string{"--probe", "plugin_step@" + lib}, c.prog, c.args...)
				if calls := e.rep.Stats.Calls; calls["probe_enter"] != c.steps || calls["probe_exit"] != c.steps {
					t.Errorf("calls %v: want %d probe_enter and probe_exit", calls, c.steps)
				}
			})
		})
	}
}

// TestProbeWhereAnotherLibraryWas: a library is unloaded and another one
// loaded in its place, with a probed function where the first had its
// own. Each call is counted under its own function, by both recorders. The
// eBPF probe remembers, per thread, which probe fired at an address
// (code_epoch ends that memory when code is unmapped or mapped): kept
// across the swap, it would name the second library's calls after the
// first one's function. And each library's lock calls are named after its
// own function: the stacks are named after both libraries came and went,
// from what dlopen said was loaded where. In aggregate mode a repeated
// lock call is only counted, so each library's is named once at least.
func TestProbeWhereAnotherLibraryWas(t *testing.T) {
	src := filepath.Join(testenv.RepoRoot(t), "testdata", "plugin.c")
	flags := append(slices.Clone(testenv.CFlags), "-fPIC", "-shared")
	one := testenv.C{Source: src, Name: "libplugin.so", Flags: flags}.Build(t)
	two := testenv.C{Source: src, Name: "libplugtwo.so", Flags: append(slices.Clone(flags), "-DSTEP=plugin_stop")}.Build(t)
	prog := testenv.Program(t, "memcalls")
	for _, run := range []struct{ recorder, mode string }{
		{"ebpf", "full"}, {"ebpf", "aggregate"}, {"preload", "full"}, {"preload", "aggregate"},
	} {
		t.Run(run.recorder+" "+run.mode, func(t *testing.T) {
			if run.recorder == "ebpf" {
				testenv.RequireBPF(t)
			}
			trace := filepath.Join(t.TempDir(), "swap.htr")
			_, stdout, stderr, code := runJSON(t, "--recorder", run.recorder, "--mode", run.mode, "--fail-on", "none", "-o", trace,
				"--probe", "plugin_step@"+one, "--probe", "plugin_stop@"+two, "--", prog, one, "swap", two)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			// Else the kernel placed the second library elsewhere, and
			// this test no longer tests what it is for.
			if !strings.Contains(stdout, "same address") {
				t.Fatalf("the second library was not loaded where the first was: %q", stdout)
			}
			evs, stacks, r := readTrace(t, trace)
			entered, lockedIn := map[string]int{}, map[string]int{}
			for _, e := range evs {
				if e.Op == events.OpProbeEnter && int(e.Arg) < len(r.Header().UserProbes) {
					entered[r.Header().UserProbes[e.Arg]]++
				}
				if st := stacks[e.Stack]; e.Op == events.OpMutexLock && st != nil {
					for _, f := range st.Frames {
						if strings.HasPrefix(f.Function, "plugin_") {
							lockedIn[f.Function]++
						}
					}
				}
			}
			if entered["plugin_step@"+one] != 3 || entered["plugin_stop@"+two] != 3 {
				t.Errorf("probe entries %v: want 3 of each", entered)
			}
			switch {
			case run.mode == "full" && (lockedIn["plugin_step"] != 3 || lockedIn["plugin_stop"] != 3):
				t.Errorf("lock calls in %v: want 3 in each library's function", lockedIn)
			case lockedIn["plugin_step"] < 1 || lockedIn["plugin_stop"] < 1 || len(lockedIn) != 2:
				t.Errorf("lock calls in %v: want each library's function", lockedIn)
			}
		})
	}
}

// TestPreloadMemoryCallsInsideAllocator: jemalloc, preloaded, maps and
// advises memory through the PLT from inside malloc and free. The preload
// recorder records those calls flagged as inside the allocator call,
// naming it, with a raw stack copy that hooktrace unwinds through
// jemalloc (built without frame pointers) to the program's caller, as the
// BPF side's syscall tracepoint does.
func TestPreloadMemoryCallsInsideAllocator(t *testing.T) {
	const je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
	testenv.File(t, je, "apt-get install -y libjemalloc2")
	trace := filepath.Join(t.TempDir(), "je.htr")
	cmd := exec.Command(hooktraceBin, "run", "--recorder", "preload", "--ignore-target-status", "--fail-on", "none",
		"-o", trace, "--", testenv.Program(t, "mallocs"))
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+je)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	evs, stacks, _ := readTrace(t, trace)
	inside := 0
	for _, e := range evs {
		if !e.Op.IsMemSyscall() || e.Flags&events.FlagInAlloc == 0 {
			continue
		}
		inside++
		if op, _ := e.InAllocCall(); op != events.OpMalloc && op != events.OpFree {
			t.Errorf("%s inside %s, want inside malloc or free", e.Op, op)
		}
		st := stacks[e.Stack]
		jemallocFrame := false
		if st != nil {
			for _, f := range st.Frames {
				jemallocFrame = jemallocFrame || strings.Contains(f.Object, "jemalloc")
			}
		}
		if !jemallocFrame || !stackHas(st, "worker_alloc") {
			t.Errorf("%s inside the allocator: stack not unwound through jemalloc to worker_alloc:%s", e.Op, stackString(st))
		}
	}
	if inside == 0 {
		t.Error("no memory call recorded inside jemalloc's malloc or free")
	}
}

// TestPreloadMappedBlocks: glibc maps a block above its mmap threshold
// with its own mmap inside malloc, and gives it back with its own munmap
// inside free, calls no interposition sees. The preload recorder alone
// reads the chunk's header and records both, inside the allocator call
// that made them, with the program's function on the stack: 7 blocks are
// 7 of each, as the kernel counts them.
func TestPreloadMappedBlocks(t *testing.T) {
	prog := testenv.Program(t, "bigblocks")
	trace := filepath.Join(t.TempDir(), "big.htr")
	if _, stderr, code := hooktrace(t, nil, "run", "--recorder", "preload", "--mode", "full", "--fail-on", "none", "-o", trace, "--", prog); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	evs, stacks, _ := readTrace(t, trace)
	in := map[events.Op]int{}
	for _, e := range evs {
		if (e.Op == events.OpMmap || e.Op == events.OpMunmap) && e.Size >= 1<<20 && e.Has(events.FlagInAlloc) &&
			stackHas(stacks[e.Stack], "map_blocks") {
			in[e.Op]++
		}
	}
	if in[events.OpMmap] != 7 || in[events.OpMunmap] != 7 {
		t.Errorf("mmap %d, munmap %d of the blocks inside malloc and free from map_blocks; want 7 each", in[events.OpMmap], in[events.OpMunmap])
	}
}

// TestPreloadMemoryCallsFullRELRO: linked with -z now, the program's GOT
// is read-only once relocated; the shim makes its page writable for the
// store alone, and sees each call as with lazy binding.
func TestPreloadMemoryCallsFullRELRO(t *testing.T) {
	prog := testenv.Program(t, "memcalls", "-Wl,-z,now")
	stdout, _, stderr, code := runJSON(t, "--recorder", "preload", "--fail-on", "none", "--", prog)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	calls := parseReport(t, stdout).Stats.Calls
	for op, n := range map[string]uint64{"mmap": 5, "madvise": 5, "mremap": 5, "munmap": 5, "brk": 1} {
		if calls[op] != n {
			t.Errorf("calls.%s = %d, want %d (calls %v)", op, calls[op], n, calls)
		}
	}
}
