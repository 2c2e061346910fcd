//go:build linux && amd64

package symbolize

import (
	"strings"

	"github.com/ianlancetaylor/demangle"
)

// isMangled reports whether name looks like an Itanium C++ or Rust v0 name.
func isMangled(name string) bool {
	return strings.HasPrefix(name, "_Z") || strings.HasPrefix(name, "_R")
}

// demangleName returns the human-readable form of a C++ or Rust name, or the
// name itself when it is not mangled or the demangler does not understand it.
func demangleName(name string) string {
	return demangleWith(name)
}

// demangleNoParams demangles without the argument list, the form people
// type when they do not care which overload (there must be only one).
func demangleNoParams(name string) string {
	return demangleWith(name, demangle.NoParams)
}

func demangleWith(name string, opts ...demangle.Option) (out string) {
	if !isMangled(name) {
		return name
	}
	defer func() {
		// Symbol names come from the traced program: a demangler bug must
		// not take the tracer down.
		if recover() != nil {
			out = name
		}
	}()
	s, err := demangle.ToString(name, opts...)
	if err != nil {
		return name
	}
	return s
}
