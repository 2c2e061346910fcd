package analyzer

import (
	"strings"

	"github.com/hooktrace/hooktrace/internal/tracebuild"
)

func analyze(opts Options, streams ...*tracebuild.Trace) *Result {
	a := New(opts)
	for i, s := range streams {
		a.BeginStream("trace" + itoa(uint64(i)))
		for _, r := range s.Records() {
			a.Add(r)
		}
	}
	return a.Result()
}

func ofKind(res *Result, kind Kind) []Finding {
	var out []Finding
	for _, f := range res.Findings {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

func stackFunctions(fr []Frame) []string {
	var out []string
	for _, f := range fr {
		out = append(out, f.Function)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func anyContains(list []string, sub string) bool {
	for _, x := range list {
		if strings.Contains(x, sub) {
			return true
		}
	}
	return false
}
