package reports

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Formats lists the report formats Render knows.
var Formats = []string{"text", "json", "sarif", "junit", "markdown", "dot", "html"}

// Render writes g in format.
func Render(w io.Writer, format string, g *Gate) error {
	switch format {
	case "text":
		return TextGate(w, g)
	case "json":
		return JSONGate(w, g)
	case "sarif":
		return SARIF(w, g)
	case "junit":
		return JUnit(w, g)
	case "markdown", "md":
		return Markdown(w, g)
	case "dot":
		return DOT(w, g)
	case "html":
		return HTML(w, g)
	}
	return fmt.Errorf("unknown report format %q: want %s", format, strings.Join(Formats, ", "))
}

// KnownFormat reports whether Render knows format.
func KnownFormat(format string) bool {
	for _, f := range Formats {
		if f == format {
			return true
		}
	}
	return format == "md"
}

// FormatOf picks a report format from a file name's extension: .txt,
// .json, .sarif, .xml (JUnit), .md, .dot/.gv, .html/.htm.
func FormatOf(path string) (string, bool) {
	name := strings.ToLower(filepath.Base(path))
	switch {
	case strings.HasSuffix(name, ".sarif"), strings.HasSuffix(name, ".sarif.json"):
		return "sarif", true
	case strings.HasSuffix(name, ".json"):
		return "json", true
	case strings.HasSuffix(name, ".xml"):
		return "junit", true
	case strings.HasSuffix(name, ".md"), strings.HasSuffix(name, ".markdown"):
		return "markdown", true
	case strings.HasSuffix(name, ".dot"), strings.HasSuffix(name, ".gv"):
		return "dot", true
	case strings.HasSuffix(name, ".html"), strings.HasSuffix(name, ".htm"):
		return "html", true
	case strings.HasSuffix(name, ".txt"), strings.HasSuffix(name, ".log"):
		return "text", true
	}
	return "", false
}
