package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// everydayPython runs threads that share a queue, then a subprocess.
const everydayPython = `import queue, subprocess, threading
q = queue.Queue()
def work(n):
    for i in range(2000):
        q.put(sum(range(n + i % 7)))
ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
subprocess.run(["true"], check=True)
print(q.qsize())
`

// TestEverydayPrograms: programs nobody here wrote are clean under every
// recorder: exit 0, no finding of any severity, a complete trace that
// does not contradict itself. Coreutils (which call reallocarray), perl,
// git log -p in a repository the test makes, gcc -c, and python3 with
// threads and a subprocess (followed, with its descriptors closed before
// the exec). Where a program allocates the same on every run (coreutils,
// git), the recorders count the same allocator calls: one call of the
// program's is one call, whatever glibc makes of it inside. (Not where a
// program copies its environment, as a shell or gcc does: the preload
// recorder's variables are three more to copy.) A program growing an
// array with reallocarray: TestAllocatorCallsCountedOnce.
func TestEverydayPrograms(t *testing.T) {
	testenv.RequireBPF(t)
	var b strings.Builder
	for i := 0; i < 2000; i++ {
		fmt.Fprintln(&b, (i*7919)%2000)
	}
	nums := writeFile(t, "nums.txt", b.String())
	src := writeFile(t, "unit.c", "int twice(int x) { return 2 * x; }\n")
	git := testenv.Tool(t, "apt-get install -y git", "git")
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	gitEnv := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.org", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@example.org", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	runTool(t, gitEnv, git, "init", "-q", repo)
	for i, line := range []string{"one", "two"} {
		f, err := os.OpenFile(filepath.Join(repo, "f.txt"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, line)
		f.Close()
		runTool(t, gitEnv, git, "-C", repo, "add", "f.txt")
		runTool(t, gitEnv, git, "-C", repo, "commit", "-q", "-m", fmt.Sprint("change ", i))
	}

	programs := []struct {
		name       string
		argv       []string
		flags      []string
		sameAllocs bool // the same allocator calls on every run
	}{
		{"ls", []string{"ls", "-la", "/"}, nil, true},
		{"sort", []string{"sort", "-n", nums}, nil, true},
		{"wc", []string{"wc", nums}, nil, true},
		{"grep", []string{"grep", "-c", "1", nums}, nil, true},
		{"sed", []string{"sed", "-n", "s/1/x/p", nums}, nil, true},
		{"perl", []string{testenv.Tool(t, "apt-get install -y perl", "perl"), "-e",
			`my %h; $h{$_} = $_ * 2 for 1 .. 5000; my @k = sort { $a <=> $b } keys %h; print scalar(@k), "\n";`}, nil, false},
		{"git log -p", []string{git, "-C", repo, "--no-pager", "log", "-p"}, nil, true},
		{"gcc -c", []string{testenv.Tool(t, "apt-get install -y gcc", "gcc"), "-c", "-o", filepath.Join(dir, "unit.o"), src}, nil, false},
		{"python3", []string{systemPython(t), "-c", everydayPython}, []string{"--follow-forks"}, false},
	}
	for _, p := range programs {
		t.Run(p.name, func(t *testing.T) {
			allocs := map[string]map[string]uint64{}
			for _, rec := range []string{"preload", "auto", "ebpf"} {
				argv := append([]string{"--recorder", rec}, p.flags...)
				argv = append(append(argv, "--"), p.argv...)
				report, _, stderr, code := runJSON(t, argv...)
				if code != 0 {
					t.Fatalf("%s: exit %d\n%s", rec, code, stderr)
				}
				rep := parseReport(t, report)
				if fs := findings(t, report); len(fs) != 0 {
					t.Errorf("%s: want no finding, got%s", rec, verdicts(fs))
				}
				if !rep.Stats.Complete || rep.Stats.LostEvents != 0 {
					t.Errorf("%s: complete %v (%s), %d events lost", rec, rep.Stats.Complete, rep.Stats.Incomplete, rep.Stats.LostEvents)
				}
				noTraceChecks(t, rec, rep)
				allocs[rec] = map[string]uint64{}
				for _, op := range []string{"malloc", "calloc", "realloc", "free"} {
					allocs[rec][op] = rep.Stats.Calls[op]
				}
			}
			if p.sameAllocs {
				for _, rec := range []string{"auto", "ebpf"} {
					if fmt.Sprint(allocs[rec]) != fmt.Sprint(allocs["preload"]) {
						t.Errorf("allocator calls: %s %v, preload %v", rec, allocs[rec], allocs["preload"])
					}
				}
			}
		})
	}
}

// runTool runs a program the test sets up with, failing the test with
// its output when it fails.
func runTool(t *testing.T, env []string, prog string, args ...string) {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}
