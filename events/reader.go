package events

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"slices"
)

// Reader decodes a trace file record by record. It holds one block of the
// file at a time plus every distinct string and thread seen so far, so its
// memory does not grow with the number of events.
//
// Next returns io.EOF after the footer. A file that stops early makes Next
// return an error wrapping ErrTruncated once every record of its complete
// blocks has been delivered; damaged bytes make it return a *CorruptError.
// Either way the records already returned are sound. Errors are final: every
// later call returns the same one. A Reader is not safe for concurrent use.
type Reader struct {
	r       io.Reader
	closer  io.Closer // set by Open
	version int
	offset  int64 // of the next byte to read from r

	hdr     [blockHeaderSize]byte
	payload []byte  // storage for the current block
	d       decoder // over the current block's payload
	rec     Record  // what Next returns
	err     error

	header  *Header
	footer  *Footer
	strings []string // by id; 0 is ""
	ev      eventState
}

// NewReader reads the preamble of the trace file in r and returns a Reader
// for its records. It fails with ErrNotTrace if r does not hold a trace file,
// ErrVersion if it holds one of a version this build cannot read, and
// ErrTruncated if r ends inside the preamble.
func NewReader(r io.Reader) (*Reader, error) {
	var p [preambleSize]byte
	n, err := io.ReadFull(r, p[:])
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, fmt.Errorf("reading trace file: %w", err)
	}
	magicLen := min(n, len(fileMagic))
	if string(p[:magicLen]) != fileMagic[:magicLen] {
		return nil, ErrNotTrace
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrTruncated)
	}
	if n < preambleSize {
		return nil, fmt.Errorf("%w: %d bytes at offset 0 are an incomplete file preamble", ErrTruncated, n)
	}
	version := binary.LittleEndian.Uint32(p[len(fileMagic):])
	if version != Version {
		return nil, fmt.Errorf("%w %d (this build reads version %d)", ErrVersion, version, Version)
	}
	return &Reader{
		r:       r,
		version: int(version),
		offset:  int64(preambleSize),
		strings: []string{""},
		ev:      newEventState(),
	}, nil
}

// Open opens the trace file at path. Close the Reader to close the file.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening trace file: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("opening trace file %s: %w", path, err)
	}
	r.closer = f
	return r, nil
}

// Close closes the file if the Reader came from Open, and does nothing
// otherwise.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	err := r.closer.Close()
	r.closer = nil
	return err
}

// Version returns the file's format version.
func (r *Reader) Version() int { return r.version }

// Header returns the file's header once Next has returned it, nil before.
func (r *Reader) Header() *Header { return r.header }

// Footer returns the file's footer once Next has returned it, nil before
// and for a file cut short.
func (r *Reader) Footer() *Footer { return r.footer }

// Next returns the next record. The Record itself is reused by the next call
// to Next, so copy what you keep of it; the Header, Stack and Footer it
// points to are new each time and may be kept.
func (r *Reader) Next() (*Record, error) {
	if err := r.NextInto(&r.rec); err != nil {
		return nil, err
	}
	return &r.rec, nil
}

// NextInto is Next decoding into rec, which it overwrites whole. After an
// error rec holds nothing meaningful.
func (r *Reader) NextInto(rec *Record) error {
	if r.err != nil {
		return r.err
	}
	for {
		d := &r.d
		if d.pos == len(d.buf) {
			if err := r.nextBlock(); err != nil {
				r.err = err
				return err
			}
			continue
		}
		if r.footer != nil {
			r.err = d.corrupt(d.pos, "data after the footer")
			return r.err
		}
		start := d.pos
		tag := d.buf[start]
		d.pos++
		if tag != tagString && tag != tagHeader && r.header == nil {
			r.err = d.corrupt(start, "the first record is not a header")
			return r.err
		}
		*rec = Record{}
		switch {
		case tag >= tagEvent:
			rec.Kind = RecEvent
			r.decodeEvent(tag, &rec.Event)
		case tag == tagString:
			r.decodeString()
		case tag == tagHeader:
			if r.header != nil {
				d.fail("a second header")
				break
			}
			rec.Kind = RecHeader
			rec.Header = new(Header)
			if r.decodeJSON("header", rec.Header) {
				r.header = rec.Header
			}
		case tag == tagStack:
			rec.Kind = RecStack
			rec.Stack = r.decodeStack()
		case tag == tagThread:
			rec.Kind = RecThread
			rec.Thread.PID = d.uint32()
			rec.Thread.TID = d.uint32()
			rec.Thread.Name = r.string()
		case tag == tagLockName:
			rec.Kind = RecLockName
			rec.LockName.PID = d.uint32()
			rec.LockName.Addr = d.uvarint()
			rec.LockName.Name = r.string()
		case tag == tagLost:
			rec.Kind = RecLost
			rec.Lost.Time = d.uvarint()
			rec.Lost.Count = d.uvarint()
		case tag == tagFooter:
			rec.Kind = RecFooter
			footer := new(Footer)
			if r.decodeJSON("footer", footer) {
				rec.Footer = footer
				r.footer = footer
			}
		default:
			d.err = d.corrupt(start, fmt.Sprintf("unknown record kind 0x%02x", tag))
		}
		if d.err != nil {
			r.err = d.err
			return r.err
		}
		if rec.Kind != 0 {
			return nil
		}
	}
}

// nextBlock reads and checks the next block and points the decoder at it.
func (r *Reader) nextBlock() error {
	start := r.offset
	n, err := io.ReadFull(r.r, r.hdr[:])
	r.offset += int64(n)
	switch {
	case err == io.EOF && r.footer != nil:
		return io.EOF
	case r.footer != nil && n > 0:
		return &CorruptError{Offset: start, Reason: "data after the footer"}
	case err == io.EOF:
		return truncatedError(start, 0)
	case err == io.ErrUnexpectedEOF:
		return truncatedError(start, int64(n))
	case err != nil:
		return fmt.Errorf("reading trace file: %w", err)
	}
	if crc32.Checksum(r.hdr[:8], castagnoli) != binary.LittleEndian.Uint32(r.hdr[8:]) {
		return &CorruptError{Offset: start, Reason: "block header checksum mismatch"}
	}
	length := binary.LittleEndian.Uint32(r.hdr[0:])
	if length > maxBlock {
		return &CorruptError{Offset: start, Reason: fmt.Sprintf("block length %d exceeds the limit of %d", length, maxBlock)}
	}
	got, err := r.readPayload(int(length))
	r.offset += int64(got)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return truncatedError(start, int64(blockHeaderSize+got))
	}
	if err != nil {
		return fmt.Errorf("reading trace file: %w", err)
	}
	if crc32.Checksum(r.payload, castagnoli) != binary.LittleEndian.Uint32(r.hdr[4:]) {
		return &CorruptError{Offset: start, Reason: "block checksum mismatch"}
	}
	r.d = decoder{buf: r.payload, base: start + blockHeaderSize}
	return nil
}

// readPayload reads n bytes into r.payload. It grows the buffer as the bytes
// arrive, so a damaged length in a short file costs no more memory than the
// file holds.
func (r *Reader) readPayload(n int) (int, error) {
	buf := r.payload[:0]
	for len(buf) < n {
		chunk := min(n-len(buf), 1<<20)
		buf = slices.Grow(buf, chunk)
		m, err := io.ReadFull(r.r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+m]
		if err != nil {
			r.payload = buf
			return len(buf), err
		}
	}
	r.payload = buf
	return n, nil
}

// decodeEvent is appendEvent's inverse.
func (r *Reader) decodeEvent(tag byte, e *Event) {
	d := &r.d
	s := &r.ev
	if tag&tagThreadSwitch != 0 {
		slot := d.uvarint()
		switch {
		case slot < uint64(len(s.slots)):
		case slot == uint64(len(s.slots)) && d.err == nil:
			pid := d.uint32()
			tid := d.uint32()
			s.newSlot(pid, tid)
		default:
			d.fail(fmt.Sprintf("thread slot %d out of range", slot))
			return
		}
		s.cur = int(slot)
	} else if s.cur < 0 {
		d.fail("an event without a thread")
		return
	}
	op := Op(tag & tagOpMask)
	if op == opEscape {
		op = Op(d.uint16())
	}
	mask, flags := s.predicted(op)
	if tag&tagSameMask == 0 {
		m := d.uvarint()
		if m >= evMaskLimit {
			d.fail(fmt.Sprintf("unknown event fields 0x%x", m))
			return
		}
		mask = uint16(m)
	}
	if d.err != nil {
		return
	}

	st := &s.slots[s.cur]
	e.Op = op
	e.PID = st.pid
	e.TID = st.tid
	e.Time = st.time + uint64(unzigzag(d.uvarint()))
	st.time = e.Time
	s.lastTime = e.Time
	e.Stack = 0
	if mask&evStack != 0 {
		e.Stack = d.uint32()
	}
	e.Addr = 0
	if mask&evAddr != 0 {
		code := d.uvarint()
		switch {
		case !isLockClass(op):
			st.memAddr += uint64(unzigzag(code))
			e.Addr = st.memAddr
		case code < lockCacheSize:
			e.Addr = s.lockCache[code]
			st.lockAddr = e.Addr
		case code == lockCacheSize:
			e.Addr = st.lockAddr + uint64(unzigzag(d.uvarint()))
			st.lockAddr = e.Addr
			s.cacheLock(e.Addr)
		default:
			d.fail(fmt.Sprintf("bad lock address code %d", code))
		}
	}
	e.Size = 0
	if mask&evSize != 0 {
		e.Size = d.uvarint()
	}
	e.Ret = 0
	switch (mask >> evRetShift) & retModeMask {
	case retPlain:
		e.Ret = unzigzag(d.uvarint())
	case retFromAddr:
		e.Ret = int64(st.memAddr + uint64(unzigzag(d.uvarint())))
		st.memAddr, st.retAddr = uint64(e.Ret), uint64(e.Ret)
	case retFromRet:
		e.Ret = int64(st.retAddr + uint64(unzigzag(d.uvarint())))
		st.memAddr, st.retAddr = uint64(e.Ret), uint64(e.Ret)
	}
	if mask&evFlags != 0 {
		flags = Flags(d.uint16())
	}
	e.Flags = flags
	s.remember(op, mask, flags)
	e.Arg = 0
	if mask&evArg != 0 {
		e.Arg = d.uvarint()
	}
	e.Addr2 = 0
	switch (mask >> evAddr2Shift) & addr2Mask {
	case addr2Plain:
		e.Addr2 = d.uvarint()
	case addr2FromAdr:
		e.Addr2 = e.Addr + uint64(unzigzag(d.uvarint()))
	case addr2Mask:
		d.fail("bad second address encoding")
	}
}

// decodeString defines the next interned string.
func (r *Reader) decodeString() {
	d := &r.d
	n := d.uvarint()
	if n > maxString {
		d.fail(fmt.Sprintf("string of %d bytes exceeds the limit of %d", n, maxString))
		return
	}
	b := d.bytes(n)
	if d.err == nil {
		r.strings = append(r.strings, string(b))
	}
}

// string reads a reference to an interned string.
func (r *Reader) string() string {
	d := &r.d
	id := d.uvarint()
	if id >= uint64(len(r.strings)) {
		d.fail(fmt.Sprintf("string id %d out of range (%d defined)", id, len(r.strings)))
		return ""
	}
	return r.strings[id]
}

// minFrameSize is the fewest bytes an encoded frame takes: six varints.
const minFrameSize = 6

func (r *Reader) decodeStack() *Stack {
	d := &r.d
	s := &Stack{ID: d.uint32()}
	flags := d.byte()
	if flags&^stackFlagsMask != 0 {
		d.fail(fmt.Sprintf("unknown stack flags 0x%02x", flags))
		return nil
	}
	s.Truncated = flags&stackTruncated != 0
	n := d.uvarint()
	if n > maxFrames {
		d.fail(fmt.Sprintf("stack of %d frames exceeds the limit of %d", n, maxFrames))
		return nil
	}
	if n*minFrameSize > uint64(len(d.buf)-d.pos) {
		d.fail("record runs past the end of its block")
		return nil
	}
	if n > 0 {
		s.Frames = make([]Frame, n)
	}
	var addr uint64
	for i := range s.Frames {
		f := &s.Frames[i]
		addr += uint64(unzigzag(d.uvarint()))
		f.Addr = addr
		f.Function = r.string()
		f.Offset = d.uvarint()
		f.File = r.string()
		f.Line = d.uint32()
		f.Object = r.string()
	}
	return s
}

// decodeJSON decodes a header or footer into v and reports whether it could.
func (r *Reader) decodeJSON(what string, v any) bool {
	d := &r.d
	n := d.uvarint()
	start := d.pos
	js := d.bytes(n)
	if d.err != nil {
		return false
	}
	if err := json.Unmarshal(js, v); err != nil {
		d.err = d.corrupt(start, fmt.Sprintf("decoding %s: %v", what, err))
		return false
	}
	return true
}

// decoder reads varints from one block's payload. Its first error sticks:
// after it every read returns zero, so decoding functions need only check
// d.err before using a value to index something.
type decoder struct {
	buf  []byte
	pos  int
	base int64 // file offset of buf[0]
	err  error
}

func (d *decoder) corrupt(pos int, reason string) *CorruptError {
	return &CorruptError{Offset: d.base + int64(pos), Reason: reason}
}

func (d *decoder) fail(reason string) {
	if d.err == nil {
		d.err = d.corrupt(d.pos, reason)
	}
	d.pos = len(d.buf)
}

func (d *decoder) uvarint() uint64 {
	if d.pos < len(d.buf) && d.buf[d.pos] < 0x80 {
		v := d.buf[d.pos]
		d.pos++
		return uint64(v)
	}
	return d.uvarintSlow()
}

func (d *decoder) uvarintSlow() uint64 {
	v, n := binary.Uvarint(d.buf[d.pos:])
	switch {
	case n > 0:
		d.pos += n
		return v
	case n == 0:
		d.fail("record runs past the end of its block")
	default:
		d.fail("bad varint")
	}
	return 0
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail(fmt.Sprintf("value %d out of range", v))
		return 0
	}
	return uint32(v)
}

func (d *decoder) uint16() uint16 {
	v := d.uvarint()
	if v > math.MaxUint16 {
		d.fail(fmt.Sprintf("value %d out of range", v))
		return 0
	}
	return uint16(v)
}

func (d *decoder) byte() byte {
	if d.pos >= len(d.buf) {
		d.fail("record runs past the end of its block")
		return 0
	}
	b := d.buf[d.pos]
	d.pos++
	return b
}

func (d *decoder) bytes(n uint64) []byte {
	if n > uint64(len(d.buf)-d.pos) {
		d.fail("record runs past the end of its block")
		return nil
	}
	b := d.buf[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b
}
