//go:build linux && amd64

package placement

import (
	"debug/elf"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// spinCalls calls four imported functions through the PLT, one of them
// by a tail call.
const spinCalls = `#include <pthread.h>
__attribute__((noinline)) int tail(pthread_spinlock_t *s) { return pthread_spin_destroy(s); }
int main(void) {
	pthread_spinlock_t s;
	pthread_spin_init(&s, 0);
	pthread_spin_lock(&s);
	pthread_spin_unlock(&s);
	return tail(&s);
}
`

var spinNames = []string{"pthread_spin_init", "pthread_spin_lock", "pthread_spin_unlock", "pthread_spin_destroy"}

// TestCallSites: the calls CallSites finds are the calls objdump shows of
// the functions' PLT stubs (classic .plt, and .plt.sec with IBT), or
// through their GOT slots (-fno-plt), each a call or a tail call's jmp.
func TestCallSites(t *testing.T) {
	objdump := testenv.Tool(t, "apt-get install -y binutils", "objdump")
	for _, c := range []struct {
		name  string
		flags []string
		plt   bool // calls through the PLT, which the kernel emulates
	}{
		{"plt", nil, true},
		{"ibt", []string{"-fcf-protection=full", "-Wl,-z,ibtplt"}, true},
		{"noplt", []string{"-fno-plt"}, false},
		{"nopie", []string{"-no-pie", "-fno-pic"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := testenv.C{Code: spinCalls, Name: "spincalls-" + c.name, Flags: append([]string{"-O2", "-pthread"}, c.flags...)}.Build(t)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			imp, err := CallSites(f, append([]string{"malloc"}, spinNames...))
			if err != nil {
				t.Fatal(err)
			}
			if len(imp.Escapes) != 0 {
				t.Errorf("escapes %v, want none", imp.Escapes)
			}
			want := objdumpCalls(t, objdump, bin, c.plt)
			var got []string
			for _, s := range imp.Sites {
				got = append(got, callText(s.Addr, s.Tail, s.Symbol))
				if s.Emulated != c.plt {
					t.Errorf("%s: emulated %v, want %v", s.Instruction, s.Emulated, c.plt)
				}
				if wantLen := map[bool]int{true: 5, false: 6}[c.plt]; s.Len != wantLen {
					t.Errorf("%s: %d bytes, want %d", s.Instruction, s.Len, wantLen)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) || len(got) != len(spinNames) {
				t.Errorf("calls found:\n%s\nobjdump shows:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestCallSitesEscape: an object that can call the function through a
// pointer says so, whichever way it takes the address.
func TestCallSitesEscape(t *testing.T) {
	for _, c := range []struct {
		name  string
		code  string
		flags []string
		how   string
	}{
		{"data", `#include <pthread.h>
int (*volatile keep)(pthread_spinlock_t *) = pthread_spin_unlock;
int main(void) { pthread_spinlock_t s; pthread_spin_init(&s, 0); return keep(&s); }
`, nil, "relocation stores its address"},
		{"got", `#include <pthread.h>
__attribute__((noinline)) int call(int (*f)(pthread_spinlock_t *), pthread_spinlock_t *s) { return f(s); }
int main(void) { pthread_spinlock_t s; pthread_spin_init(&s, 0); return call(pthread_spin_unlock, &s); }
`, nil, "loads its address"},
		{"canonical plt", `#include <pthread.h>
__attribute__((noinline)) int call(int (*f)(pthread_spinlock_t *), pthread_spinlock_t *s) { return f(s); }
int main(void) { pthread_spinlock_t s; pthread_spin_init(&s, 0); return call(pthread_spin_unlock, &s); }
`, []string{"-no-pie", "-fno-pic"}, "PLT stub at"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := testenv.C{Code: c.code, Name: "escape-" + strings.ReplaceAll(c.name, " ", "-"),
				Flags: append([]string{"-O2", "-pthread"}, c.flags...)}.Build(t)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			imp, err := CallSites(f, spinNames)
			if err != nil {
				t.Fatal(err)
			}
			if len(imp.Escapes) != 1 || !strings.Contains(imp.Escapes["pthread_spin_unlock"], c.how) {
				t.Errorf("escapes %v, want pthread_spin_unlock's: %s", imp.Escapes, c.how)
			}
			if len(imp.Sites) != 1 || imp.Sites[0].Symbol != "pthread_spin_init" {
				t.Errorf("calls %+v, want the one of pthread_spin_init", imp.Sites)
			}
		})
	}
}

// objdumpCalls lists the calls and jmps of spinNames objdump shows in
// bin: to their PLT stubs (plt) or through their GOT slots.
func objdumpCalls(t *testing.T, objdump, bin string, plt bool) []string {
	t.Helper()
	out, err := exec.Command(objdump, "-d", "--no-show-raw-insn", bin).Output()
	if err != nil {
		t.Fatalf("objdump: %v", err)
	}
	names := strings.Join(spinNames, "|")
	re := regexp.MustCompile(`^\s*([0-9a-f]+):\s+(call|jmp)\s+\*?.*<(` + names + `)@GLIBC`)
	if plt {
		re = regexp.MustCompile(`^\s*([0-9a-f]+):\s+(call|jmp)\s+[0-9a-f]+ <(` + names + `)@plt>`)
	}
	var calls []string
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		addr, err := strconv.ParseUint(m[1], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, callText(addr, m[2] == "jmp", m[3]))
	}
	slices.Sort(calls)
	return calls
}

func callText(addr uint64, tail bool, name string) string {
	if tail {
		return strconv.FormatUint(addr, 16) + " jmp " + name
	}
	return strconv.FormatUint(addr, 16) + " call " + name
}

// TestCallSitesSearch: searching only the functions whose bytes may refer
// to a stub or slot finds what decoding every instruction finds, in the
// libraries of this machine that import the functions.
func TestCallSitesSearch(t *testing.T) {
	names := append([]string{"pthread_rwlock_init", "pthread_rwlock_destroy", "malloc", "pthread_mutex_lock"}, spinNames...)
	tried := 0
	for _, path := range []string{"/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/python3", libcPath} {
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		tried++
		search, err1 := callSites(f, names, false)
		sweep, err2 := callSites(f, names, true)
		f.Close()
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v, %v", path, err1, err2)
		}
		if !slices.Equal(search.Sites, sweep.Sites) || len(search.Escapes) != len(sweep.Escapes) {
			t.Errorf("%s: the search found %d calls and %d escapes, the sweep %d and %d",
				path, len(search.Sites), len(search.Escapes), len(sweep.Sites), len(sweep.Escapes))
		}
	}
	if tried == 0 {
		t.Fatal("none of the libraries is here")
	}
}
