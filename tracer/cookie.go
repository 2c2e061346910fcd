//go:build linux && amd64

package tracer

import (
	"github.com/hooktrace/hooktrace/events"
	"github.com/hooktrace/hooktrace/internal/abi"
	"github.com/hooktrace/hooktrace/probesite"
)

// probeCookie is what a uprobe's BPF cookie tells the probe: the layout of
// COOKIE_* in bpf/hooktrace.h, whose shifts and widths are the generated
// abi.Cookie* constants.
type probeCookie struct {
	op  events.Op
	adj uint16 // bytes pushed since the function's entry at the probe site
	// user is the --probe index (user probes and return probes).
	user uint32
	// For allocator probes: how far back the allocator's code starts from
	// the probe, and its length in 64 KiB units; 0, 0 when unknown.
	back   uint32
	length uint32
	// For an unlock probe: the init whose entry point is the same address
	// (the probe tells them apart by whether the thread holds the lock).
	alias events.Op
	// refires: the site can fire more than once in one call.
	refires bool
	// call (lock probes): the probe is on a call of the function, this
	// many bytes long (0 for an entry, or a tail call's jmp, which leaves
	// the stack as the entry finds it).
	call uint8
}

const (
	cookieOpShift    = uint64(abi.CookieOpShift)
	cookieOpBits     = uint64(abi.CookieOpBits)
	cookieAdjShift   = uint64(abi.CookieAdjShift)
	cookieAdjBits    = uint64(abi.CookieAdjBits)
	cookieUserShift  = uint64(abi.CookieUserShift)
	cookieAliasShift = uint64(abi.CookieAliasShift)
	cookieAliasBits  = uint64(abi.CookieAliasBits)
	cookieRefires    = uint64(abi.CookieRefiresShift)
	cookieCallShift  = uint64(abi.CookieCallShift)
	cookieCallBits   = uint64(abi.CookieCallBits)
	cookieBackShift  = uint64(abi.CookieBackShift)
	cookieBackBits   = uint64(abi.CookieBackBits)
	cookieLenShift   = uint64(abi.CookieLenShift)
	cookieLenBits    = uint64(abi.CookieLenBits)
	cookieLenUnit    = uint64(abi.CookieLenUnitShift)
)

func field(v, shift, bits uint64) uint64 { return v >> shift & (1<<bits - 1) }

// encode packs the cookie. The user index, the allocator range and the
// alias share the high half: a probe sets one of them.
func (c probeCookie) encode() uint64 {
	return uint64(c.op)&(1<<cookieOpBits-1)<<cookieOpShift |
		uint64(c.adj)&(1<<cookieAdjBits-1)<<cookieAdjShift |
		uint64(c.user)<<cookieUserShift |
		uint64(c.back)&(1<<cookieBackBits-1)<<cookieBackShift |
		uint64(c.length)&(1<<cookieLenBits-1)<<cookieLenShift |
		uint64(c.alias)&(1<<cookieAliasBits-1)<<cookieAliasShift |
		b2u64(c.refires)<<cookieRefires |
		uint64(c.call)&(1<<cookieCallBits-1)<<cookieCallShift
}

func b2u64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// decodeCookie reads a cookie back; user, the range and the alias are all
// filled from the shared high half.
func decodeCookie(v uint64) probeCookie {
	return probeCookie{
		op:      events.Op(field(v, cookieOpShift, cookieOpBits)),
		adj:     uint16(field(v, cookieAdjShift, cookieAdjBits)),
		user:    uint32(v >> cookieUserShift),
		back:    uint32(field(v, cookieBackShift, cookieBackBits)),
		length:  uint32(field(v, cookieLenShift, cookieLenBits)),
		alias:   events.Op(field(v, cookieAliasShift, cookieAliasBits)),
		refires: field(v, cookieRefires, 1) != 0,
		call:    uint8(field(v, cookieCallShift, cookieCallBits)),
	}
}

// rangeBytes is the allocator's length in bytes, as COOKIE_RANGE_LEN.
func (c probeCookie) rangeBytes() uint64 { return uint64(c.length) << cookieLenUnit }

// setRange sets, for an allocator probe at file offset off, where the
// allocator's code r lies relative to it (see COOKIE_RANGE_* in BPF); it
// leaves c alone when the range does not fit the cookie's fields.
func (c *probeCookie) setRange(r *probesite.AllocRange, off uint64) {
	if r == nil || r.Object == "" || off < r.Lo {
		return
	}
	back := off - r.Lo
	units := (r.Hi - r.Lo + 1<<cookieLenUnit - 1) >> cookieLenUnit
	if back >= 1<<cookieBackBits || units == 0 || units >= 1<<cookieLenBits {
		return
	}
	c.back, c.length = uint32(back), uint32(units)
}
