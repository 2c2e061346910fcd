//go:build linux && amd64

package tracer

import "github.com/hooktrace/hooktrace/events"

// probeCookie is what a uprobe's BPF cookie tells the probe: the layout of
// COOKIE_* in bpf/hooktrace.h, whose shifts and widths are the generated
// hooktraceCookieLayout constants.
type probeCookie struct {
	op  events.Op
	adj uint16 // bytes pushed since the function's entry at the probe site
	// user is the --probe index (user probes and return probes).
	user uint32
	// For allocator probes: how far back the allocator's code starts from
	// the probe, and its length in 64 KiB units; 0, 0 when unknown.
	back   uint32
	length uint32
}

const (
	cookieOpShift   = uint64(hooktraceCookieLayoutCOOKIE_OP_SHIFT)
	cookieOpBits    = uint64(hooktraceCookieLayoutCOOKIE_OP_BITS)
	cookieAdjShift  = uint64(hooktraceCookieLayoutCOOKIE_ADJ_SHIFT)
	cookieAdjBits   = uint64(hooktraceCookieLayoutCOOKIE_ADJ_BITS)
	cookieUserShift = uint64(hooktraceCookieLayoutCOOKIE_USER_SHIFT)
	cookieBackShift = uint64(hooktraceCookieLayoutCOOKIE_BACK_SHIFT)
	cookieBackBits  = uint64(hooktraceCookieLayoutCOOKIE_BACK_BITS)
	cookieLenShift  = uint64(hooktraceCookieLayoutCOOKIE_LEN_SHIFT)
	cookieLenBits   = uint64(hooktraceCookieLayoutCOOKIE_LEN_BITS)
	cookieLenUnit   = uint64(hooktraceCookieLayoutCOOKIE_LEN_UNIT_SHIFT)
)

func field(v, shift, bits uint64) uint64 { return v >> shift & (1<<bits - 1) }

// encode packs the cookie. The user index and the allocator range share the
// high half: a probe sets one or the other.
func (c probeCookie) encode() uint64 {
	return uint64(c.op)&(1<<cookieOpBits-1)<<cookieOpShift |
		uint64(c.adj)&(1<<cookieAdjBits-1)<<cookieAdjShift |
		uint64(c.user)<<cookieUserShift |
		uint64(c.back)&(1<<cookieBackBits-1)<<cookieBackShift |
		uint64(c.length)&(1<<cookieLenBits-1)<<cookieLenShift
}

// decodeCookie reads a cookie back; user and the range are both filled
// from the shared high half.
func decodeCookie(v uint64) probeCookie {
	return probeCookie{
		op:     events.Op(field(v, cookieOpShift, cookieOpBits)),
		adj:    uint16(field(v, cookieAdjShift, cookieAdjBits)),
		user:   uint32(v >> cookieUserShift),
		back:   uint32(field(v, cookieBackShift, cookieBackBits)),
		length: uint32(field(v, cookieLenShift, cookieLenBits)),
	}
}

// rangeBytes is the allocator's length in bytes, as COOKIE_RANGE_LEN.
func (c probeCookie) rangeBytes() uint64 { return uint64(c.length) << cookieLenUnit }
