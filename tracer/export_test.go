//go:build linux && amd64

package tracer

import "testing"

// WithoutUprobeMulti makes the tracer place one uprobe per site for the
// rest of the test, as on kernels without uprobe_multi links (before 6.6).
func WithoutUprobeMulti(t *testing.T) {
	was := haveUprobeMulti
	haveUprobeMulti = func() bool { return false }
	t.Cleanup(func() { haveUprobeMulti = was })
}
