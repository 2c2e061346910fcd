package events

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fullHeader and fullFooter set every field.
func fullHeader() *Header {
	return &Header{
		Version: Version, Tool: "hooktrace 0.1.0", Command: []string{"./app", "-x", "ünïcode <&>"},
		PID: 1234, Exe: "/opt/app/bin/app", Host: "host-1", Kernel: "6.8.0", Clock: "CLOCK_MONOTONIC",
		StartNS: 1 << 50, StartUnix: -5, Mode: "full",
		Probes: []ProbeSite{{
			Name: "malloc", Object: "/lib/libc.so.6", Offset: 4, Address: 0xa50a0,
			Kind: "uprobe", Note: "skipped the endbr64",
		}},
		UserProbes: []string{"app_flush"}, Forbid: []string{"mmap"}, Allocator: "glibc",
	}
}

func fullFooter() *Footer {
	status := -3
	return &Footer{
		EndNS: math.MaxUint64, Events: 7, Lost: 3, Calls: map[string]uint64{"malloc": 10, "free": 9},
		ExitStatus: &status, ExitSignal: "SIGSEGV", Reason: "target exited",
	}
}

func hdr() Record                { return Record{Kind: RecHeader, Header: fullHeader()} }
func ftr() Record                { return Record{Kind: RecFooter, Footer: fullFooter()} }
func ev(e Event) Record          { return Record{Kind: RecEvent, Event: e} }
func stack(s *Stack) Record      { return Record{Kind: RecStack, Stack: s} }
func wrap(rs ...Record) []Record { return append(append([]Record{hdr()}, rs...), ftr()) }

func TestRoundTrip(t *testing.T) {
	allFlags := FlagReturn | FlagAcquired | FlagInAlloc | FlagProcess | FlagLocksHeld | FlagBusy
	longString := strings.Repeat("x", maxString)
	var deepStack Stack
	deepStack.ID = math.MaxUint32
	for i := range maxFrames {
		deepStack.Frames = append(deepStack.Frames, Frame{Addr: uint64(i) * 0x1000, Function: fmt.Sprint("f", i%7)})
	}
	var manyLocks []Record
	for i := range 3 * lockCacheSize {
		addr := 0x5000 + uint64(i%(lockCacheSize+3))*64
		manyLocks = append(manyLocks,
			ev(Event{Time: uint64(i), PID: 1, TID: uint32(i % 3), Op: OpMutexLock, Flags: FlagAcquired, Addr: addr}),
			ev(Event{Time: uint64(i), PID: 1, TID: uint32(i % 3), Op: OpMutexUnlock, Addr: addr}))
	}

	tests := []struct {
		name string
		recs []Record
	}{
		{"header only, no footer", []Record{hdr()}},
		{"header and footer", wrap()},
		{"empty header and footer", []Record{{Kind: RecHeader, Header: &Header{}}, {Kind: RecFooter, Footer: &Footer{}}}},
		{"every field of an event", wrap(ev(Event{
			Time: 1e15, PID: 7, TID: 8, Op: OpRealloc, Flags: allFlags,
			Addr: 0x7f00_0000_1000, Addr2: uint64(OpMalloc), Size: 4096, Arg: 64, Ret: 0x7f00_0000_2000, Stack: 3,
		}))},
		{"extreme values", wrap(
			ev(Event{Time: math.MaxUint64, PID: math.MaxUint32, TID: math.MaxUint32, Op: math.MaxUint16,
				Flags: math.MaxUint16, Addr: math.MaxUint64, Addr2: math.MaxUint64, Size: math.MaxUint64,
				Arg: math.MaxUint64, Ret: math.MinInt64, Stack: math.MaxUint32}),
			ev(Event{Time: 0, PID: math.MaxUint32, TID: math.MaxUint32, Op: OpMutexLock, Addr: math.MaxUint64, Ret: math.MaxInt64}),
			ev(Event{Time: 5, PID: math.MaxUint32, TID: math.MaxUint32, Op: OpMutexLock, Addr: 1, Ret: -1}),
			ev(Event{}),
			ev(Event{Op: OpCondWait, Addr: math.MaxUint64, Addr2: 1}),
		)},
		{"every op", func() []Record {
			var rs []Record
			for op := Op(0); op < 70; op++ {
				rs = append(rs, ev(Event{Time: uint64(op) * 100, PID: 1, TID: 2, Op: op, Flags: Flags(op) % 3, Addr: uint64(op) << 12, Ret: int64(op) - 3}))
			}
			return wrap(rs...)
		}()},
		{"time going backwards and thread switches", wrap(
			ev(Event{Time: 1000, PID: 1, TID: 1, Op: OpMalloc, Size: 8, Ret: 0x1000}),
			ev(Event{Time: 900, PID: 1, TID: 2, Op: OpMalloc, Size: 8, Ret: 0x2000}),
			ev(Event{Time: 800, PID: 1, TID: 1, Op: OpFree, Addr: 0x1000}),
			ev(Event{Time: 2000, PID: 2, TID: 1, Op: OpFree, Addr: 0x2000}),
			ev(Event{Time: 2000, PID: 2, TID: 1, Op: OpFree, Addr: 0x2000}),
		)},
		{"lock cache hits, misses and evictions", wrap(manyLocks...)},
		{"stacks", wrap(
			stack(&Stack{ID: 1, Truncated: true, Frames: []Frame{
				{Addr: 0x401000, Function: "main", Offset: 16, File: "main.c", Line: 42, Object: "/bin/app"},
				{Addr: 0x7f00_0000_0000, Function: "__libc_start_main", Offset: math.MaxUint64, File: "", Line: math.MaxUint32, Object: "/lib/libc.so.6"},
				{Addr: 0, Function: "main", Object: "/bin/app"},
			}}),
			stack(&Stack{ID: 2}),
			stack(&Stack{ID: 3, Frames: []Frame{{Function: longString, File: longString + "", Object: "\x00\xff"}}}),
			stack(&deepStack),
		)},
		{"threads, lock names and lost events", wrap(
			Record{Kind: RecThread, Thread: Thread{PID: 1, TID: 2, Name: "worker"}},
			Record{Kind: RecThread, Thread: Thread{PID: math.MaxUint32, TID: math.MaxUint32, Name: "worker"}},
			Record{Kind: RecThread, Thread: Thread{}},
			Record{Kind: RecLockName, LockName: LockName{PID: 1, Addr: math.MaxUint64, Name: "vma_lock (librcache.so)"}},
			Record{Kind: RecLockName, LockName: LockName{}},
			Record{Kind: RecLost, Lost: Lost{Time: math.MaxUint64, Count: math.MaxUint64}},
			Record{Kind: RecLost, Lost: Lost{}},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := encode(t, tt.recs)
			got, err := decodeAll(data)
			wantErr := io.EOF
			if tt.recs[len(tt.recs)-1].Kind != RecFooter {
				wantErr = ErrTruncated
			}
			if !errors.Is(err, wantErr) {
				t.Fatalf("reading ended with %v, want %v", err, wantErr)
			}
			compareRecords(t, got, tt.recs)
		})
	}
}

func compareRecords(t *testing.T, got, want []Record) {
	t.Helper()
	for i := range min(len(got), len(want)) {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("record %d:\n got %s\nwant %s", i, describe(got[i]), describe(want[i]))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
}

func describe(r Record) string {
	s := fmt.Sprintf("%+v", r)
	if r.Header != nil {
		s += fmt.Sprintf(" header=%+v", *r.Header)
	}
	if r.Stack != nil {
		s += fmt.Sprintf(" stack=%+v", *r.Stack)
	}
	if r.Footer != nil {
		s += fmt.Sprintf(" footer=%+v", *r.Footer)
	}
	return s
}

func TestLargeRoundTrip(t *testing.T) {
	recs := synthTrace(300_000)
	data := encode(t, recs)
	if blocks := len(data) / blockTarget; blocks < 10 {
		t.Fatalf("only about %d blocks: the test should span many", blocks)
	}
	got, err := decodeAll(data)
	if err != io.EOF {
		t.Fatalf("reading ended with %v, want io.EOF", err)
	}
	compareRecords(t, got, recs)
}

func TestSyntheticSize(t *testing.T) {
	const n = 1_000_000
	if testing.Short() {
		t.Skip("encodes a million events")
	}
	data := encode(t, synthTrace(n))
	perEvent := float64(len(data)) / n
	t.Logf("%d events in %d bytes: %.2f bytes/event", n, len(data), perEvent)
	if perEvent > 9 {
		t.Errorf("%.2f bytes/event: the encoding got bigger", perEvent)
	}
}

// smallTrace writes a few records per block, flushing in between as the
// tracer does, and returns the file with, for each block boundary, its
// offset and how many records precede it.
func smallTrace(t *testing.T) (data []byte, boundaries []boundary, recs []Record) {
	t.Helper()
	recs = wrap(
		stack(&Stack{ID: 1, Frames: []Frame{{Addr: 0x401000, Function: "main", File: "main.c", Line: 3, Object: "/bin/app"}}}),
		Record{Kind: RecThread, Thread: Thread{PID: 1, TID: 1, Name: "app"}},
		ev(Event{Time: 100, PID: 1, TID: 1, Op: OpMalloc, Size: 32, Ret: 0x55000010, Stack: 1}),
		ev(Event{Time: 150, PID: 1, TID: 2, Op: OpMutexLock, Flags: FlagAcquired, Addr: 0x601040, Stack: 1}),
		ev(Event{Time: 180, PID: 1, TID: 2, Op: OpMutexUnlock, Addr: 0x601040}),
		Record{Kind: RecLockName, LockName: LockName{PID: 1, Addr: 0x601040, Name: "big_lock (app)"}},
		ev(Event{Time: 200, PID: 1, TID: 1, Op: OpFree, Addr: 0x55000010, Size: 48, Stack: 1}),
		Record{Kind: RecLost, Lost: Lost{Time: 250, Count: 2}},
	)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 || i == len(recs)-1 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			boundaries = append(boundaries, boundary{offset: buf.Len(), records: i + 1})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), boundaries, recs
}

type boundary struct{ offset, records int }

func TestTruncationAtEveryByte(t *testing.T) {
	data, boundaries, recs := smallTrace(t)
	if len(boundaries) < 3 {
		t.Fatalf("only %d blocks", len(boundaries))
	}
	for cut := range len(data) {
		// The last whole block before the cut, if any.
		last := boundary{offset: preambleSize}
		for _, b := range boundaries {
			if b.offset <= cut {
				last = b
			}
		}
		r, err := NewReader(bytes.NewReader(data[:cut]))
		if cut < preambleSize {
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("cut at %d: NewReader: %v, want ErrTruncated", cut, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut at %d: NewReader: %v", cut, err)
		}
		var got []Record
		for {
			rec, err := r.Next()
			if err != nil {
				if !errors.Is(err, ErrTruncated) {
					t.Fatalf("cut at %d: after %d records: %v, want ErrTruncated", cut, len(got), err)
				}
				want := fmt.Sprintf("%d bytes at offset %d", cut-last.offset, last.offset)
				if cut == last.offset {
					want = fmt.Sprintf("ends at offset %d without a footer", cut)
				}
				if !strings.Contains(err.Error(), want) {
					t.Errorf("cut at %d: error %q does not say %q", cut, err, want)
				}
				if _, again := r.Next(); again != err {
					t.Errorf("cut at %d: Next after the error returned %v, want the same error", cut, again)
				}
				break
			}
			got = append(got, *rec)
		}
		compareRecords(t, got, recs[:last.records])
		if r.Footer() != nil {
			t.Errorf("cut at %d: Footer() = %+v, want nil", cut, r.Footer())
		}
	}
}

func TestBitFlips(t *testing.T) {
	data, _, _ := smallTrace(t)
	for i := range len(data) * 8 {
		flipped := bytes.Clone(data)
		flipped[i/8] ^= 1 << (i % 8)
		_, err := decodeAll(flipped)
		var corrupt *CorruptError
		switch {
		case i/8 < len(fileMagic):
			if !errors.Is(err, ErrNotTrace) {
				t.Errorf("bit %d (magic): %v, want ErrNotTrace", i, err)
			}
		case i/8 < preambleSize:
			if !errors.Is(err, ErrVersion) {
				t.Errorf("bit %d (version): %v, want ErrVersion", i, err)
			}
		case !errors.As(err, &corrupt):
			t.Errorf("bit %d (byte %d): %v, want a *CorruptError", i, i/8, err)
		case corrupt.Offset < int64(preambleSize) || corrupt.Offset > int64(i/8):
			t.Errorf("bit %d (byte %d): error at offset %d, want between the preamble and the flip", i, i/8, corrupt.Offset)
		case !strings.Contains(err.Error(), fmt.Sprintf("trace file corrupt at offset %d: ", corrupt.Offset)):
			t.Errorf("bit %d: message %q does not name the offset", i, err)
		}
	}
}

// rawFile builds a trace file from hand-made block payloads.
func rawFile(version uint32, payloads ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32([]byte(fileMagic), version)
	for _, p := range payloads {
		var h [blockHeaderSize]byte
		putBlockHeader(h[:], p)
		b = append(append(b, h[:]...), p...)
	}
	return b
}

func TestCorruptContent(t *testing.T) {
	header := []byte{tagHeader, 2, '{', '}'}
	footer := []byte{tagFooter, 2, '{', '}'}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	// Offsets are counted from the first byte after the header record.
	tests := []struct {
		name     string
		payload  []byte
		reason   string
		atOffset int // -1: anywhere in the payload
	}{
		{"unknown record kind", []byte{0x20}, "unknown record kind 0x20", 0},
		{"event tag used as a record kind", []byte{byte(RecEvent)}, "unknown record kind 0x02", 0},
		{"bad varint", []byte{tagLost, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0}, "bad varint", 1},
		{"record past the block end", []byte{tagLost, 0x80}, "runs past the end", -1},
		{"string id out of range", []byte{tagThread, 1, 2, 5}, "string id 5 out of range", -1},
		{"string too long", []byte{tagString, 0x80, 0x80, 0x08}, "exceeds the limit", -1},
		{"string past the block end", []byte{tagString, 10, 'a'}, "runs past the end", -1},
		{"too many frames", []byte{tagStack, 1, 0, 0x81, 0x10}, "stack of 2049 frames", -1},
		{"frames past the block end", []byte{tagStack, 1, 0, 10, 0, 0}, "runs past the end", -1},
		{"unknown stack flags", []byte{tagStack, 1, 0x80, 0}, "unknown stack flags", -1},
		{"thread id out of range", []byte{tagThread, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 0}, "out of range", -1},
		{"event before any thread", []byte{tagEvent | byte(OpMalloc), 0, 0}, "an event without a thread", -1},
		{"thread slot out of range", []byte{tagEvent | tagThreadSwitch | byte(OpMalloc), 3, 0, 0}, "thread slot 3 out of range", -1},
		{"unknown event fields", []byte{tagEvent | tagThreadSwitch | byte(OpMalloc), 0, 1, 1, 0x80, 0x10, 0}, "unknown event fields", -1},
		{"op out of range", []byte{tagEvent | tagThreadSwitch | opEscape, 0, 1, 1, 0x80, 0x80, 0x10, 0, 0}, "out of range", -1},
		{"flags out of range", []byte{tagEvent | tagThreadSwitch | byte(OpMalloc), 0, 1, 1, evFlags, 0, 0x80, 0x80, 0x10}, "out of range", -1},
		{"bad lock address code", []byte{tagEvent | tagThreadSwitch | byte(OpMutexLock), 0, 1, 1, evAddr, 0, lockCacheSize + 1}, "bad lock address code", -1},
		{"bad second address encoding", []byte{tagEvent | tagThreadSwitch | byte(OpMalloc), 0, 1, 1, 0x80, 0x03, 0, 0}, "bad second address encoding", -1},
		{"a second header", header, "a second header", -1},
		{"bad footer JSON", []byte{tagFooter, 3, 'a', 'b', 'c'}, "decoding footer", 2},
		{"data after the footer", cat(footer, []byte{tagLost, 1, 1}), "data after the footer", len(footer)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := rawFile(Version, cat(header, tt.payload))
			_, err := decodeAll(data)
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("got %v, want a *CorruptError", err)
			}
			if !strings.Contains(corrupt.Reason, tt.reason) {
				t.Errorf("reason %q does not say %q", corrupt.Reason, tt.reason)
			}
			start := int64(preambleSize + blockHeaderSize + len(header))
			if tt.atOffset >= 0 && corrupt.Offset != start+int64(tt.atOffset) {
				t.Errorf("offset %d, want %d", corrupt.Offset, start+int64(tt.atOffset))
			}
			if corrupt.Offset < start || corrupt.Offset > int64(len(data)) {
				t.Errorf("offset %d outside the bad record", corrupt.Offset)
			}
		})
	}
}

func TestCorruptBlocks(t *testing.T) {
	header := []byte{tagHeader, 2, '{', '}'}
	footer := []byte{tagFooter, 2, '{', '}'}
	good := rawFile(Version, header)
	secondBlock := int64(len(good))

	badCRC := bytes.Clone(good)
	badCRC[len(badCRC)-1] ^= 0x40
	fixHeader := func(b []byte, length uint32) []byte {
		h := b[preambleSize : preambleSize+blockHeaderSize]
		binary.LittleEndian.PutUint32(h[0:], length)
		binary.LittleEndian.PutUint32(h[8:], crc32c(h[:8]))
		return b
	}
	tests := []struct {
		name   string
		data   []byte
		reason string
		offset int64
	}{
		{"block checksum mismatch", badCRC, "block checksum mismatch", int64(preambleSize)},
		{"block header checksum mismatch", func() []byte {
			b := bytes.Clone(good)
			b[preambleSize] ^= 1
			return b
		}(), "block header checksum mismatch", int64(preambleSize)},
		{"block too long", fixHeader(bytes.Clone(good), maxBlock+1), "block length 16777217 exceeds the limit", int64(preambleSize)},
		{"first record not a header", rawFile(Version, []byte{tagLost, 1, 1}), "the first record is not a header", int64(preambleSize + blockHeaderSize)},
		{"data after the footer block", append(rawFile(Version, header, footer), 0), "data after the footer", secondBlock + blockHeaderSize + int64(len(footer))},
		{"block after the footer block", rawFile(Version, header, footer, []byte{tagLost, 1, 1}), "data after the footer", secondBlock + blockHeaderSize + int64(len(footer))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeAll(tt.data)
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("got %v, want a *CorruptError", err)
			}
			if !strings.Contains(corrupt.Reason, tt.reason) || corrupt.Offset != tt.offset {
				t.Errorf("got %q at offset %d, want %q at offset %d", corrupt.Reason, corrupt.Offset, tt.reason, tt.offset)
			}
			want := fmt.Sprintf("trace file corrupt at offset %d: %s", corrupt.Offset, corrupt.Reason)
			if err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
		})
	}
}

func crc32c(b []byte) uint32 {
	var h [blockHeaderSize]byte
	putBlockHeader(h[:], b) // its second word is the CRC-32C of b
	return binary.LittleEndian.Uint32(h[4:])
}

func TestNotATrace(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  error
	}{
		{"text", "hello, world\n", ErrNotTrace},
		{"ELF", "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", ErrNotTrace},
		{"JSON", `{"version":1}`, ErrNotTrace},
		{"one wrong byte", "\x89HTR\r\n\x1a\x0b\x01\x00\x00\x00", ErrNotTrace},
		{"magic after a CR LF conversion", "\x89HTR\n\x1a\n\x01\x00\x00\x00", ErrNotTrace},
		{"empty", "", ErrTruncated},
		{"half the magic", fileMagic[:4], ErrTruncated},
		{"magic without a version", fileMagic + "\x01", ErrTruncated},
		{"version 0", fileMagic + "\x00\x00\x00\x00", ErrVersion},
		{"a future version", fileMagic + "\x02\x00\x00\x00", ErrVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReader(strings.NewReader(tt.input))
			if !errors.Is(err, tt.want) || r != nil {
				t.Fatalf("NewReader = %v, %v; want nil, %v", r, err, tt.want)
			}
		})
	}
}

func TestFutureVersionMessage(t *testing.T) {
	data := rawFile(Version + 1)
	_, err := NewReader(bytes.NewReader(data))
	want := fmt.Sprintf("unsupported trace file version %d (this build reads version %d)", Version+1, Version)
	if !errors.Is(err, ErrVersion) || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestWriterRefuses(t *testing.T) {
	tooDeep := &Stack{ID: 1, Frames: make([]Frame, maxFrames+1)}
	tooLong := strings.Repeat("a", maxString+1)
	tests := []struct {
		name   string
		before []Record
		rec    Record
		want   string
	}{
		{"an event before the header", nil, ev(Event{}), "the first record must be the header"},
		{"a second header", []Record{hdr()}, hdr(), "only one header"},
		{"a record after the footer", wrap(), ev(Event{}), "no record may follow the footer"},
		{"a nil header", nil, Record{Kind: RecHeader}, "header record without a header"},
		{"a nil stack", []Record{hdr()}, Record{Kind: RecStack}, "stack record without a stack"},
		{"a nil footer", []Record{hdr()}, Record{Kind: RecFooter}, "footer record without a footer"},
		{"an unknown kind", []Record{hdr()}, Record{Kind: 99}, "unknown record kind 99"},
		{"kind zero", []Record{hdr()}, Record{}, "unknown record kind 0"},
		{"too many frames", []Record{hdr()}, stack(tooDeep), "1025 frames"},
		{"a long function name", []Record{hdr()}, stack(&Stack{ID: 1, Frames: []Frame{{Function: tooLong}}}), "exceeds the limit"},
		{"a long thread name", []Record{hdr()}, Record{Kind: RecThread, Thread: Thread{Name: tooLong}}, "exceeds the limit"},
		{"a long lock name", []Record{hdr()}, Record{Kind: RecLockName, LockName: LockName{Name: tooLong}}, "exceeds the limit"},
		{"a huge header", nil, Record{Kind: RecHeader, Header: &Header{Tool: strings.Repeat("a", maxJSON)}}, "exceed the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			for i := range tt.before {
				if err := w.Write(&tt.before[i]); err != nil {
					t.Fatal(err)
				}
			}
			err := w.Write(&tt.rec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write = %v, want an error saying %q", err, tt.want)
			}
			// The refusal leaves the writer usable and the file sound.
			if len(tt.before) == 0 || tt.before[len(tt.before)-1].Kind != RecFooter {
				rest := wrap()
				if len(tt.before) > 0 {
					rest = rest[1:]
				}
				for i := range rest {
					if err := w.Write(&rest[i]); err != nil {
						t.Fatalf("writing after the refusal: %v", err)
					}
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := decodeAll(buf.Bytes()); err != io.EOF {
				t.Fatalf("reading the file back: %v", err)
			}
		})
	}
}

func TestFlushMakesRecordsReadable(t *testing.T) {
	var file bytes.Buffer
	buffered := bufio.NewWriter(&file)
	w := NewWriter(buffered)
	recs := []Record{hdr(), ev(Event{Time: 1, PID: 1, TID: 1, Op: OpMalloc, Size: 10, Ret: 0x1000})}
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if file.Len() != 0 {
		t.Fatalf("%d bytes reached the file before Flush", file.Len())
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// A tracer killed now leaves a readable, footer-less file.
	got, err := decodeAll(file.Bytes())
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("reading ended with %v, want ErrTruncated", err)
	}
	compareRecords(t, got, recs)
}

type failingWriter struct{ n int }

var errDiskFull = errors.New("disk full")

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.n--; f.n < 0 {
		return 0, errDiskFull
	}
	return len(p), nil
}

func TestWriteErrorsStick(t *testing.T) {
	w := NewWriter(&failingWriter{n: 1})
	recs := synthTrace(50_000)
	var err error
	for i := range recs {
		if err = w.Write(&recs[i]); err != nil {
			break
		}
	}
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("Write = %v, want disk full", err)
	}
	if err := w.Write(&recs[len(recs)-2]); !errors.Is(err, errDiskFull) {
		t.Errorf("Write after the error = %v, want disk full", err)
	}
	if err := w.Close(); !errors.Is(err, errDiskFull) {
		t.Errorf("Close = %v, want disk full", err)
	}
}

type failingReader struct {
	r io.Reader
	n int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errDiskFull
	}
	n, err := f.r.Read(p[:min(len(p), f.n)])
	f.n -= n
	return n, err
}

func TestReadErrorsAreReported(t *testing.T) {
	data := encode(t, synthTrace(10_000))
	r, err := NewReader(&failingReader{r: bytes.NewReader(data), n: len(data) / 2})
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = r.Next()
	}
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("got %v, want disk full", err)
	}
}

func TestCreateAndOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.htr")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	recs := synthTrace(1000)
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, *rec)
	}
	compareRecords(t, got, recs)
	if r.Header() == nil || r.Footer() == nil || r.Version() != Version {
		t.Errorf("Header, Footer, Version = %v, %v, %d", r.Header(), r.Footer(), r.Version())
	}

	if _, err := Open(filepath.Join(t.TempDir(), "missing.htr")); err == nil {
		t.Error("opening a missing file succeeded")
	}
	notTrace := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(notTrace, []byte("just some text, long enough"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(notTrace); !errors.Is(err, ErrNotTrace) || !strings.Contains(err.Error(), notTrace) {
		t.Errorf("opening a text file: %v, want ErrNotTrace naming the file", err)
	}
}

func TestReadingEventsDoesNotAllocate(t *testing.T) {
	data := encode(t, synthTrace(100_000))
	var reads int
	allocs := testing.AllocsPerRun(3, func() {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := r.Next(); err != nil {
				break
			}
			reads++
		}
	})
	perEvent := allocs / 100_000
	t.Logf("%.0f allocations reading %d records", allocs, reads/4)
	if perEvent > 0.01 {
		t.Errorf("%.3f allocations per event (%.0f per file)", perEvent, allocs)
	}
}
