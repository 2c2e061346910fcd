package events

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Writer encodes Records into a trace file as they come. It holds one block
// (about 64 KiB) of records at a time, plus what it needs to encode later
// records compactly: every distinct string it has written and every thread it
// has seen, never the records themselves.
//
// The first record written must be the header and the last the footer; a
// file closed without a footer reads as truncated. A Writer is not safe for
// concurrent use.
type Writer struct {
	w      io.Writer
	closer io.Closer // set by Create: the file Close closes
	err    error     // the first write error; every later call returns it

	// block holds blockHeaderSize bytes reserved for the block header, then
	// the payload, so that a block goes out in a single write.
	block   []byte
	scratch []byte // a record being encoded while its strings go into block

	started   bool // the preamble is written
	sawHeader bool
	sawFooter bool
	closed    bool

	strings map[string]uint32 // interned string -> id; "" is always 0
	slotOf  map[uint64]uint32 // pid<<32|tid -> index into ev.slots
	ev      eventState

	json bytes.Buffer
}

// NewWriter returns a Writer that writes a trace file to w. Close does not
// close w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{
		w:       w,
		block:   make([]byte, blockHeaderSize, blockHeaderSize+blockTarget+1024),
		strings: map[string]uint32{"": 0},
		slotOf:  make(map[uint64]uint32),
		ev:      newEventState(),
	}
}

// Create creates (or truncates) the file at path and returns a Writer to it.
// The Writer's Close also closes the file.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating trace file: %w", err)
	}
	w := NewWriter(f)
	w.closer = f
	return w, nil
}

// Write adds rec to the file. Records that break the file's rules (header
// first, footer last, nothing after the footer, the size limits on strings,
// stacks and JSON) are refused with an error and leave the Writer usable; an
// error writing to the underlying writer is returned by every later call.
// Writing the footer flushes.
func (w *Writer) Write(rec *Record) error {
	if w.err != nil {
		return w.err
	}
	if rec.Kind == RecEvent && w.sawHeader && !w.sawFooter && !w.closed {
		w.block = w.appendEvent(w.block, &rec.Event)
		return w.endRecord()
	}
	if err := w.check(rec); err != nil {
		return fmt.Errorf("writing trace record: %w", err)
	}
	switch rec.Kind {
	case RecHeader:
		if err := w.appendJSON(tagHeader, rec.Header); err != nil {
			return err
		}
		w.sawHeader = true
	case RecStack:
		if err := w.appendStack(rec.Stack); err != nil {
			return err
		}
	case RecThread:
		name, err := w.intern(rec.Thread.Name)
		if err != nil {
			return err
		}
		b := append(w.block, tagThread)
		b = appendUvarint(b, uint64(rec.Thread.PID))
		b = appendUvarint(b, uint64(rec.Thread.TID))
		w.block = appendUvarint(b, uint64(name))
	case RecLockName:
		name, err := w.intern(rec.LockName.Name)
		if err != nil {
			return err
		}
		b := append(w.block, tagLockName)
		b = appendUvarint(b, uint64(rec.LockName.PID))
		b = appendUvarint(b, rec.LockName.Addr)
		w.block = appendUvarint(b, uint64(name))
	case RecLost:
		b := append(w.block, tagLost)
		b = appendUvarint(b, rec.Lost.Time)
		w.block = appendUvarint(b, rec.Lost.Count)
	case RecFooter:
		if err := w.appendJSON(tagFooter, rec.Footer); err != nil {
			return err
		}
		w.sawFooter = true
		return w.Flush()
	}
	return w.endRecord()
}

// check refuses the records Write must not encode.
func (w *Writer) check(rec *Record) error {
	if w.closed {
		return errors.New("the writer is closed")
	}
	if w.sawFooter {
		return errors.New("no record may follow the footer")
	}
	if !w.sawHeader && rec.Kind != RecHeader {
		return errors.New("the first record must be the header")
	}
	switch rec.Kind {
	case RecHeader:
		if w.sawHeader {
			return errors.New("a trace has only one header")
		}
		if rec.Header == nil {
			return errors.New("header record without a header")
		}
	case RecEvent, RecLost:
	case RecStack:
		s := rec.Stack
		if s == nil {
			return errors.New("stack record without a stack")
		}
		if len(s.Frames) > maxFrames {
			return fmt.Errorf("stack %d has %d frames, more than the limit of %d", s.ID, len(s.Frames), maxFrames)
		}
		for i := range s.Frames {
			f := &s.Frames[i]
			for _, str := range [...]string{f.Function, f.File, f.Object} {
				if err := checkString(str); err != nil {
					return fmt.Errorf("stack %d frame %d: %w", s.ID, i, err)
				}
			}
		}
	case RecThread:
		return checkString(rec.Thread.Name)
	case RecLockName:
		return checkString(rec.LockName.Name)
	case RecFooter:
		if rec.Footer == nil {
			return errors.New("footer record without a footer")
		}
	default:
		return fmt.Errorf("unknown record kind %d", rec.Kind)
	}
	return nil
}

func checkString(s string) error {
	if len(s) > maxString {
		return fmt.Errorf("string of %d bytes exceeds the limit of %d", len(s), maxString)
	}
	return nil
}

// endRecord closes the block once it is full enough. Blocks are only closed
// between records, so no record spans two blocks.
func (w *Writer) endRecord() error {
	if len(w.block)-blockHeaderSize >= blockTarget {
		return w.writeBlock()
	}
	return nil
}

// intern returns the id of s, defining it in the stream if it is new.
func (w *Writer) intern(s string) (uint32, error) {
	if id, ok := w.strings[s]; ok {
		return id, nil
	}
	id := uint32(len(w.strings))
	w.strings[s] = id
	w.block = appendString(append(w.block, tagString), s)
	return id, w.endRecord()
}

// appendStack writes a stack's new strings, then the stack. Frame addresses
// are deltas from the frame before, since most frames of a stack share a
// mapping.
func (w *Writer) appendStack(s *Stack) error {
	b := append(w.scratch[:0], tagStack)
	b = appendUvarint(b, uint64(s.ID))
	var flags byte
	if s.Truncated {
		flags |= stackTruncated
	}
	b = append(b, flags)
	b = appendUvarint(b, uint64(len(s.Frames)))
	var prev uint64
	for i := range s.Frames {
		f := &s.Frames[i]
		fn, err := w.intern(f.Function)
		if err != nil {
			return err
		}
		file, err := w.intern(f.File)
		if err != nil {
			return err
		}
		obj, err := w.intern(f.Object)
		if err != nil {
			return err
		}
		b = appendUvarint(b, zigzag(int64(f.Addr-prev)))
		prev = f.Addr
		b = appendUvarint(b, uint64(fn))
		b = appendUvarint(b, f.Offset)
		b = appendUvarint(b, uint64(file))
		b = appendUvarint(b, uint64(f.Line))
		b = appendUvarint(b, uint64(obj))
	}
	w.scratch = b
	w.block = append(w.block, b...)
	return nil
}

// appendJSON writes a header or footer, starting a new block first if the
// current one could not hold it under the reader's block limit.
func (w *Writer) appendJSON(tag byte, v any) error {
	w.json.Reset()
	enc := json.NewEncoder(&w.json)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding trace record: %w", err)
	}
	js := bytes.TrimSuffix(w.json.Bytes(), []byte("\n"))
	if len(js) > maxJSON {
		return fmt.Errorf("writing trace record: %d bytes of JSON exceed the limit of %d", len(js), maxJSON)
	}
	if len(w.block)+len(js)+16 > blockHeaderSize+maxBlock {
		if err := w.writeBlock(); err != nil {
			return err
		}
	}
	w.block = append(appendUvarint(append(w.block, tag), uint64(len(js))), js...)
	return nil
}

// appendEvent encodes e as
//
//	tag [slot [pid tid]] [op] [mask] time [stack] [addr] [size] [ret] [flags] [arg] [addr2]
//
// all uvarints after the tag. The slot (the thread's index in order of first
// appearance) is there when the thread differs from the last event's, and
// the PID and TID only on the thread's first event. The op is there when it
// does not fit the tag, the mask when it is not the op's last mask. The time
// is a zigzag delta from the thread's last event. The mask says which of the
// other fields are there; an absent field is zero, except flags, which are
// then the op's last flags.
func (w *Writer) appendEvent(b []byte, e *Event) []byte {
	s := &w.ev
	op := e.Op
	slot := s.cur
	switched := slot < 0 || s.slots[slot].pid != e.PID || s.slots[slot].tid != e.TID
	isNew := false
	if switched {
		key := uint64(e.PID)<<32 | uint64(e.TID)
		i, ok := w.slotOf[key]
		if !ok {
			i = uint32(len(s.slots))
			w.slotOf[key] = i
			s.newSlot(e.PID, e.TID)
			isNew = true
		}
		slot = int(i)
		s.cur = slot
	}
	st := &s.slots[slot]

	// Choose each field's encoding, updating the registers as the reader will.
	var mask uint16
	if e.Stack != 0 {
		mask |= evStack
	}
	var addrCode, lockDelta uint64
	if e.Addr != 0 {
		mask |= evAddr
		if isLockClass(op) {
			addrCode = lockCacheSize
			for i, a := range s.lockCache {
				if a == e.Addr {
					addrCode = uint64(i)
					break
				}
			}
			if addrCode == lockCacheSize {
				lockDelta = zigzag(int64(e.Addr - st.lockAddr))
				s.cacheLock(e.Addr)
			}
			st.lockAddr = e.Addr
		} else {
			addrCode = zigzag(int64(e.Addr - st.memAddr))
			st.memAddr = e.Addr
		}
	}
	if e.Size != 0 {
		mask |= evSize
	}
	var retCode uint64
	if e.Ret != 0 {
		mode := uint16(retPlain)
		retCode = zigzag(e.Ret)
		if c := zigzag(int64(uint64(e.Ret) - st.retAddr)); uvarintLen(c) < uvarintLen(retCode) {
			mode, retCode = retFromRet, c
		}
		if c := zigzag(int64(uint64(e.Ret) - st.memAddr)); uvarintLen(c) < uvarintLen(retCode) {
			mode, retCode = retFromAddr, c
		}
		if mode != retPlain {
			st.memAddr = uint64(e.Ret)
			st.retAddr = uint64(e.Ret)
		}
		mask |= mode << evRetShift
	}
	predictedMask, predictedFlags := s.predicted(op)
	if e.Flags != predictedFlags {
		mask |= evFlags
	}
	if e.Arg != 0 {
		mask |= evArg
	}
	addr2Code := e.Addr2
	if e.Addr2 != 0 {
		mode := uint16(addr2Plain)
		if c := zigzag(int64(e.Addr2 - e.Addr)); uvarintLen(c) < uvarintLen(addr2Code) {
			mode, addr2Code = addr2FromAdr, c
		}
		mask |= mode << evAddr2Shift
	}
	s.remember(op, mask, e.Flags)

	tag := byte(tagEvent)
	if op < opEscape {
		tag |= byte(op)
	} else {
		tag |= opEscape
	}
	if switched {
		tag |= tagThreadSwitch
	}
	if mask == predictedMask {
		tag |= tagSameMask
	}
	b = append(b, tag)
	if switched {
		b = appendUvarint(b, uint64(slot))
		if isNew {
			b = appendUvarint(b, uint64(e.PID))
			b = appendUvarint(b, uint64(e.TID))
		}
	}
	if op >= opEscape {
		b = appendUvarint(b, uint64(op))
	}
	if mask != predictedMask {
		b = appendUvarint(b, uint64(mask))
	}
	b = appendUvarint(b, zigzag(int64(e.Time-st.time)))
	st.time = e.Time
	s.lastTime = e.Time
	if mask&evStack != 0 {
		b = appendUvarint(b, uint64(e.Stack))
	}
	if mask&evAddr != 0 {
		b = appendUvarint(b, addrCode)
		if addrCode == lockCacheSize && isLockClass(op) {
			b = appendUvarint(b, lockDelta)
		}
	}
	if mask&evSize != 0 {
		b = appendUvarint(b, e.Size)
	}
	if mask&(retModeMask<<evRetShift) != 0 {
		b = appendUvarint(b, retCode)
	}
	if mask&evFlags != 0 {
		b = appendUvarint(b, uint64(e.Flags))
	}
	if mask&evArg != 0 {
		b = appendUvarint(b, e.Arg)
	}
	if mask&(addr2Mask<<evAddr2Shift) != 0 {
		b = appendUvarint(b, addr2Code)
	}
	return b
}

// writeBlock writes the records held so far as one block.
func (w *Writer) writeBlock() error {
	if len(w.block) == blockHeaderSize {
		return w.writeRaw(nil)
	}
	putBlockHeader(w.block[:blockHeaderSize], w.block[blockHeaderSize:])
	err := w.writeRaw(w.block)
	w.block = w.block[:blockHeaderSize]
	return err
}

// writeRaw writes b, after the preamble if this is the file's first write.
func (w *Writer) writeRaw(b []byte) error {
	if w.err != nil {
		return w.err
	}
	if !w.started {
		w.started = true
		var p [preambleSize]byte
		copy(p[:], fileMagic)
		binary.LittleEndian.PutUint32(p[len(fileMagic):], Version)
		b = append(p[:], b...)
	}
	if len(b) == 0 {
		return nil
	}
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("writing trace file: %w", err)
	}
	return w.err
}

// Flush writes every record written so far to the underlying writer as
// complete blocks, and flushes that writer too if it has a Flush method, so
// that a reader sees them all even if this process is killed next. It does
// not sync a file to disk: call its Sync for that.
func (w *Writer) Flush() error {
	if err := w.writeBlock(); err != nil {
		return err
	}
	if f, ok := w.w.(interface{ Flush() error }); ok {
		if err := f.Flush(); err != nil {
			w.err = fmt.Errorf("flushing trace file: %w", err)
			return w.err
		}
	}
	return nil
}

// Close flushes, and closes the file if the Writer came from Create. It
// does not write a footer: write one first, or the file reads as truncated.
// Close may be called more than once.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	err := w.Flush()
	if w.closer != nil {
		if cerr := w.closer.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing trace file: %w", cerr)
		}
		w.closer = nil
	}
	return err
}
