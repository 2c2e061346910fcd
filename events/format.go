package events

import (
	"encoding/binary"
	"hash/crc32"
)

// Trace file layout, version 1 (all fixed-width integers little-endian):
//
//	file     = preamble block*
//	preamble = magic (8 bytes) version (uint32)
//	block    = length (uint32) payloadCRC (uint32) headerCRC (uint32) payload
//
// length is the payload's size, payloadCRC its CRC-32C, and headerCRC the
// CRC-32C of the eight bytes before it, so that a damaged length is reported
// as corruption rather than mistaken for a file cut short. A payload is a
// sequence of whole records; decoding state (interned strings, per-thread
// deltas) carries over from block to block, so every record in a complete
// block can be decoded from the blocks before it alone.
//
// A record is a tag byte and uvarints, except where noted. Tags below 0x80
// are the RecordKind of the record, or tagString; tags from 0x80 are events:
//
//	string   = tagString len bytes      defines the next string id (0 is "")
//	header   = tag len JSON             the Header; footer likewise
//	stack    = tag id flags(byte) n frame*n
//	frame    = zigzag(addr - previous frame's addr) function offset file line object
//	thread   = tag pid tid name
//	lockname = tag pid addr name
//	lost     = tag time count
//	event    = see appendEvent
//
// where function, file, object and name are string ids, defined by string
// records before the record that uses them.
const (
	fileMagic       = "\x89HTR\r\n\x1a\n" // non-ASCII first byte and CR LF catch text-mode mangling
	preambleSize    = len(fileMagic) + 4
	blockHeaderSize = 12

	// blockTarget is the payload size at which the writer closes a block: big
	// enough that block headers cost nothing, small enough that a killed
	// tracer loses little.
	blockTarget = 64 << 10

	// Limits that keep a hostile or damaged file from making the reader
	// allocate without bound. The writer refuses records beyond them.
	maxBlock  = 16 << 20
	maxString = 64 << 10
	maxFrames = 1024
	maxJSON   = maxBlock - 64 // a header or footer must fit in one block
)

// Record tags.
const (
	tagHeader   = byte(RecHeader)
	tagStack    = byte(RecStack)
	tagThread   = byte(RecThread)
	tagLockName = byte(RecLockName)
	tagLost     = byte(RecLost)
	tagFooter   = byte(RecFooter)
	tagString   = 0x10

	// An event's tag holds its op in the low five bits (opEscape: a uvarint
	// op follows) and says whether the event's thread differs from the last
	// event's and whether its field mask is the last one of its op.
	tagEvent        = 0x80
	tagThreadSwitch = 0x40
	tagSameMask     = 0x20
	tagOpMask       = 0x1f
	opEscape        = 0x1f
)

// predictedOps bounds the ops whose last mask and flags are remembered (all
// the ops of this version); events of higher ops are predicted to have no
// fields and no flags.
const predictedOps = 64

// Event field bits. An event's mask is a uvarint, so the fields most events
// carry get the low seven bits and the mask usually takes a single byte.
const (
	evStack      = 1 << 0 // uvarint Stack
	evAddr       = 1 << 1 // see appendAddr
	evSize       = 1 << 2 // uvarint Size
	evRetShift   = 3      // two bits: a retMode
	evFlags      = 1 << 5 // uvarint Flags; absent: the flags of the last event with this op
	evArg        = 1 << 6 // uvarint Arg
	evAddr2Shift = 7      // two bits: an addr2Mode
	evMaskLimit  = 1 << 9
)

// How Ret is stored. Allocators return pointers near the thread's last
// returned pointer or last address; everything else returns small numbers.
const (
	retZero      = 0 // not stored: Ret is 0
	retPlain     = 1 // zigzag Ret
	retFromAddr  = 2 // zigzag delta from the thread's memory register
	retFromRet   = 3 // zigzag delta from the thread's last pointer result
	retModeMask  = 3
	addr2Zero    = 0 // not stored: Addr2 is 0
	addr2Plain   = 1 // uvarint Addr2 (an op, with FlagInAlloc)
	addr2FromAdr = 2 // zigzag delta from Addr (cond_wait's mutex, near its condition variable)
	addr2Mask    = 3
)

// lockCacheSize is how many recent lock addresses, across threads, an event
// can name by index rather than by address: programs hammer a few locks.
const lockCacheSize = 16

// Stack flag bits.
const (
	stackTruncated = 1 << 0
	stackFlagsMask = stackTruncated
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// eventState is what events are encoded against. The writer and the reader
// update it alike, event by event.
type eventState struct {
	slots     []threadState // threads in order of their first event
	cur       int           // slot of the last event, -1 before the first
	lastTime  uint64        // of the last event of any thread
	lastMask  [predictedOps]uint16
	lastFlags [predictedOps]Flags
	lockCache [lockCacheSize]uint64
	lockNext  int // the lockCache entry a new lock address replaces
}

// threadState is what one thread's events are delta-encoded against. Lock
// and memory addresses get separate registers because they live far apart
// and alternate, while each class stays close to itself.
type threadState struct {
	pid, tid uint32
	time     uint64
	memAddr  uint64 // last allocator or syscall address, or returned pointer
	retAddr  uint64 // last returned pointer
	lockAddr uint64 // last lock or condition variable address
}

func newEventState() eventState { return eventState{cur: -1} }

// newSlot adds a thread. Its first time delta is from the last event of any
// thread, which is close, rather than from zero.
func (s *eventState) newSlot(pid, tid uint32) {
	s.slots = append(s.slots, threadState{pid: pid, tid: tid, time: s.lastTime})
}

// predicted returns the mask and flags an event of op is expected to have.
func (s *eventState) predicted(op Op) (uint16, Flags) {
	if op < predictedOps {
		return s.lastMask[op], s.lastFlags[op]
	}
	return 0, 0
}

func (s *eventState) remember(op Op, mask uint16, flags Flags) {
	if op < predictedOps {
		s.lastMask[op] = mask
		s.lastFlags[op] = flags
	}
}

func (s *eventState) cacheLock(addr uint64) {
	s.lockCache[s.lockNext] = addr
	s.lockNext = (s.lockNext + 1) % lockCacheSize
}

func isLockClass(op Op) bool {
	return op >= OpMutexLock && op <= OpCondTimedwait
}

func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendString(b []byte, s string) []byte {
	b = appendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func putBlockHeader(h []byte, payload []byte) {
	binary.LittleEndian.PutUint32(h[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(h[8:], crc32.Checksum(h[:8], castagnoli))
}
