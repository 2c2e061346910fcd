//go:build linux && amd64

package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// errTruncated is returned whenever a read would run past the end of the
// data. Everything this package parses comes from files or process memory
// that may be corrupt or hostile, so every read is bounds-checked.
var errTruncated = errors.New("truncated data")

// reader decodes little-endian DWARF/ELF primitives from a byte slice. The
// first failing read sets err and all later reads return zero, so callers can
// decode a run of fields and check err once.
type reader struct {
	buf []byte
	pos int
	err error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errTruncated
	}
	r.pos = len(r.buf)
}

func (r *reader) remaining() int { return len(r.buf) - r.pos }

func (r *reader) bytes(n int) []byte {
	if n < 0 || n > r.remaining() {
		r.fail()
		return nil
	}
	b := r.buf[r.pos : r.pos+n]
	r.pos += n
	return b
}

func (r *reader) u8() uint8 {
	b := r.bytes(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) u16() uint16 {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (r *reader) u32() uint32 {
	b := r.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) u64() uint64 {
	b := r.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// uleb decodes an unsigned LEB128 number. Bits beyond 64 are dropped rather
// than rejected; a number longer than any sane encoding is an error.
func (r *reader) uleb() uint64 {
	var v uint64
	var shift uint
	for i := 0; ; i++ {
		if i >= 16 {
			r.fail()
			return 0
		}
		b := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= uint64(b&0x7f) << shift
		}
		shift += 7
		if b&0x80 == 0 {
			return v
		}
	}
}

// sleb decodes a signed LEB128 number.
func (r *reader) sleb() int64 {
	var v int64
	var shift uint
	for i := 0; ; i++ {
		if i >= 16 {
			r.fail()
			return 0
		}
		b := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= int64(b&0x7f) << shift
		}
		shift += 7
		if b&0x80 == 0 {
			if shift < 64 && b&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring() string {
	for i := r.pos; i < len(r.buf); i++ {
		if r.buf[i] == 0 {
			s := string(r.buf[r.pos:i])
			r.pos = i + 1
			return s
		}
	}
	r.fail()
	return ""
}

// Pointer encodings (DW_EH_PE_*) used by .eh_frame and .eh_frame_hdr. The low
// nibble says how the value is stored, the high bits what it is relative to.
const (
	pePtr     = 0x00 // absolute pointer of the target's address size
	peULEB128 = 0x01
	peUData2  = 0x02
	peUData4  = 0x03
	peUData8  = 0x04
	peSLEB128 = 0x09
	peSData2  = 0x0a
	peSData4  = 0x0b
	peSData8  = 0x0c

	peAbs      = 0x00
	pePCRel    = 0x10
	peTextRel  = 0x20
	peDataRel  = 0x30
	peFuncRel  = 0x40
	peAligned  = 0x50
	peIndirect = 0x80

	peOmit = 0xff

	peFormatMask = 0x0f
	peApplyMask  = 0x70
)

// pointerBases gives the addresses that relative pointer encodings are
// relative to.
type pointerBases struct {
	// section is the link-time address of buf[0] of the reader the pointer is
	// read from; pc-relative values are relative to the field's own address.
	section uint64
	// data is the base for DW_EH_PE_datarel, valid when hasData is set.
	// Only .eh_frame_hdr defines one that matters here.
	data    uint64
	hasData bool
}

// pointerSize returns the fixed size of an encoded pointer, or 0 when the
// encoding is variable-length or invalid.
func pointerSize(enc byte, addrSize int) int {
	switch enc & peFormatMask {
	case pePtr:
		return addrSize
	case peUData2, peSData2:
		return 2
	case peUData4, peSData4:
		return 4
	case peUData8, peSData8:
		return 8
	}
	return 0
}

// rawPointer reads the value of an encoded pointer without applying its
// relative base.
func (r *reader) rawPointer(enc byte, addrSize int) (uint64, error) {
	var v uint64
	switch enc & peFormatMask {
	case pePtr:
		switch addrSize {
		case 4:
			v = uint64(r.u32())
		case 8:
			v = r.u64()
		default:
			return 0, fmt.Errorf("unsupported address size %d", addrSize)
		}
	case peULEB128:
		v = r.uleb()
	case peUData2:
		v = uint64(r.u16())
	case peUData4:
		v = uint64(r.u32())
	case peUData8:
		v = r.u64()
	case peSLEB128:
		v = uint64(r.sleb())
	case peSData2:
		v = uint64(int64(int16(r.u16())))
	case peSData4:
		v = uint64(int64(int32(r.u32())))
	case peSData8:
		v = r.u64()
	default:
		return 0, fmt.Errorf("unsupported pointer format 0x%x", enc)
	}
	return v, r.err
}

// pointer reads an encoded pointer and applies its relative base. Indirect
// pointers would need a read of process memory; nothing on the unwinding path
// uses them, so they are rejected.
func (r *reader) pointer(enc byte, addrSize int, bases pointerBases) (uint64, error) {
	if enc == peOmit {
		return 0, errors.New("omitted pointer where one is required")
	}
	if enc&peIndirect != 0 {
		return 0, fmt.Errorf("indirect pointer encoding 0x%x not supported", enc)
	}
	fieldAddr := bases.section + uint64(r.pos)
	v, err := r.rawPointer(enc, addrSize)
	if err != nil {
		return 0, err
	}
	switch enc & peApplyMask {
	case peAbs:
		return v, nil
	case pePCRel:
		return v + fieldAddr, nil
	case peDataRel:
		if !bases.hasData {
			return 0, errors.New("datarel pointer without a data base")
		}
		return v + bases.data, nil
	}
	return 0, fmt.Errorf("unsupported pointer application 0x%x", enc&peApplyMask)
}

// skipPointer consumes an encoded pointer whose value is not needed (for
// example a personality routine), accepting any base.
func (r *reader) skipPointer(enc byte, addrSize int) error {
	if enc == peOmit {
		return nil
	}
	_, err := r.rawPointer(enc, addrSize)
	return err
}
