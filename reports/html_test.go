package reports

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hooktrace/hooktrace/internal/testenv"
)

// TestHTMLSelfContained: the page loads nothing from elsewhere.
func TestHTMLSelfContained(t *testing.T) {
	for _, c := range gateCases()[1:] {
		page := string(renderCase(t, c, "html"))
		if regexp.MustCompile(`(?i)<(script|link|img|iframe|object)\b`).MatchString(page) {
			t.Errorf("%s: the page has an element that loads something", c.name)
		}
		if regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//`).MatchString(page) ||
			regexp.MustCompile(`(?i)url\(\s*['"]?(https?:)?//`).MatchString(page) || strings.Contains(page, "@import") {
			t.Errorf("%s: the page refers to another site", c.name)
		}
		if !strings.Contains(page, "<svg") || (c.name != "misuse" && !strings.Contains(page, `class="edge cycle"`)) {
			t.Errorf("%s: no inline graph with cycle edges", c.name)
		}
	}
	// Names are escaped.
	res := analyzeFixture(t, "regress")
	res.Findings[0].Title = `<b onmouseover="x">&`
	var buf bytes.Buffer
	if err := HTML(&buf, plain(res)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), `<b onmouseover`) {
		t.Error("a title was not escaped")
	}
}

// chromium finds a headless browser: the test fails without one under CI
// (CI installs Debian's chromium) and skips elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	return testenv.Tool(t, "apt-get install -y chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
}

func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestHTMLInChromium opens the report in a real headless browser, offline:
// the DOM has the graph and every finding, and the screenshot shows the
// red cycle edges.
func TestHTMLInChromium(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	// A passing gate: no red verdict and the findings folded, so the red
	// in the picture is the graph's.
	c := gateCase{"pass", "regress", func(t *testing.T) Options {
		o := plainOpts(t)
		o.FailOn = "none"
		return o
	}, nil}
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, renderCase(t, c, "html"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "file://" + page
	dom := string(runChromium(t, bin, "--dump-dom", url))
	g := mustJudge(t, c)
	for _, want := range []string{"<svg", `class="edge cycle"`, "hooktrace: nothing at or above none", "vma_lock (librcache.so)"} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered DOM lacks %q", want)
		}
	}
	for _, f := range g.Findings {
		if !strings.Contains(dom, `id="finding-`+f.ID+`"`) {
			t.Errorf("rendered DOM lacks finding %s", f.ID)
		}
	}
	if n := strings.Count(dom, `<g class="node`); n != 5 {
		t.Errorf("rendered DOM has %d graph nodes, want 5", n)
	}

	shot := filepath.Join(dir, "shot.png")
	runChromium(t, bin, "--hide-scrollbars", "--window-size=1280,900", "--screenshot="+shot, url)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	red, other := 0, 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			switch {
			case r > 170 && g < 90 && bl < 100:
				red++
			case r < 200 || g < 200 || bl < 200:
				other++
			}
		}
	}
	if red < 200 || other < 5000 {
		t.Errorf("screenshot %dx%d: %d red pixels (cycle edges), %d non-white: the page did not render", b.Dx(), b.Dy(), red, other)
	}
	if os.Getenv("HOOKTRACE_KEEP_SHOT") != "" {
		data, _ := os.ReadFile(shot)
		os.WriteFile(os.Getenv("HOOKTRACE_KEEP_SHOT"), data, 0o644)
	}
}
