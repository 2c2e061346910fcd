package events

import (
	"errors"
	"fmt"
)

var (
	// ErrTruncated reports a trace file that stops early: its writer was
	// killed mid-block, or stopped between blocks without writing a footer.
	// Every record of the complete blocks before the cut has been delivered
	// when a Reader returns it, so callers may use what they got. Errors
	// wrap it with where the cut is; test with errors.Is.
	ErrTruncated = errors.New("trace file truncated")

	// ErrNotTrace reports input that does not start with the trace-file magic.
	ErrNotTrace = errors.New("not a hooktrace trace file")

	// ErrVersion reports a trace file of a format version this build cannot
	// read. Errors wrap it with the version found.
	ErrVersion = errors.New("unsupported trace file version")
)

// CorruptError reports a trace file whose bytes are damaged or were not
// written by a Writer: a checksum mismatch, an impossible length, an unknown
// record kind, a malformed number, a reference to a string never defined...
type CorruptError struct {
	Offset int64  // in the file, of the block or byte found wrong
	Reason string // what was wrong there
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("trace file corrupt at offset %d: %s", e.Offset, e.Reason)
}

func truncatedError(offset, incomplete int64) error {
	if incomplete == 0 {
		return fmt.Errorf("%w: file ends at offset %d without a footer", ErrTruncated, offset)
	}
	return fmt.Errorf("%w: %d bytes at offset %d are an incomplete block", ErrTruncated, incomplete, offset)
}
