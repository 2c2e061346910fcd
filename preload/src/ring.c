/* Part of the shim (shim.c includes it; shim.h declares what the parts share): the ring in shared memory: reserve, commit, and a full ring's wait. */
#include "shim.h"

/* ---- the ring ----------------------------------------------------------- */

void count_lost(__u32 type)
{
	__atomic_fetch_add(H64(SHM_OFF_LOST) + (type & 3), 1, __ATOMIC_RELAXED);
}

/* A short sleep that is not a cancellation point (nanosleep is one): the
 * shim must not add one to a call that has none. */
static void pause_10us(void)
{
	struct timespec ts10 = {0, 10000};
	syscall(SYS_nanosleep, &ts10, NULL);
}

/* Starts a record; returns 0 when the image is ending in another thread,
 * whose end would cut the record short: the call is counted, not
 * recorded. */
int write_begin(void)
{
	__u32 *flag = ts.writing;
	if (likely(flag != NULL)) {
		/* An exchange, for the full barrier before closing_tid is read
		 * (cheaper than a store and mfence). */
		__atomic_exchange_n(flag, 1, __ATOMIC_SEQ_CST);
	} else {
		__atomic_fetch_add(&writing_shared, 1, __ATOMIC_SEQ_CST);
	}
	__u32 closing = __atomic_load_n(&closing_tid, __ATOMIC_RELAXED);
	if (unlikely(closing != 0) && closing != ts.shared.tid) {
		if (flag)
			__atomic_store_n(flag, 0, __ATOMIC_RELEASE);
		else
			__atomic_fetch_sub(&writing_shared, 1, __ATOMIC_RELEASE);
		return 0;
	}
	return 1;
}

void write_end(void)
{
	if (likely(ts.writing != NULL))
		__atomic_store_n(ts.writing, 0, __ATOMIC_RELEASE);
	else
		__atomic_fetch_sub(&writing_shared, 1, __ATOMIC_RELEASE);
}

static void wait_unflagged(__u32 *flag)
{
	/* Bounded like a writer's wait for room: a writer waiting for the
	 * reader finishes within it. */
	for (unsigned k = 0; __atomic_load_n(flag, __ATOMIC_ACQUIRE) && k < 40000; k++) {
		if (k < 64)
			__builtin_ia32_pause();
		else
			pause_10us();
	}
}

/* How many per-thread slots the process's threads have taken. */
__u32 slots_taken(void)
{
	__u32 n = __atomic_load_n(H32(SHM_OFF_NEXT_SLOT), __ATOMIC_RELAXED);
	return n < SHM_SLOTS ? n : SHM_SLOTS;
}

/* This thread ends the image: no other thread starts a record from now on,
 * and the records under way are finished first. */
void end_writes(struct tstate *self)
{
	__atomic_store_n(&closing_tid, self->shared.tid, __ATOMIC_SEQ_CST);
	__u32 n = slots_taken();
	for (__u32 i = 0; i < n; i++)
		if (&writing[i].v != self->writing)
			wait_unflagged(&writing[i].v);
	wait_unflagged(&writing_shared);
}

/* Reserves room for a body of len bytes and returns where it goes, or NULL
 * (counted as lost) when the reader has not made room within a bounded
 * wait. *seq_at receives the position to publish. */
int reader_stalled;

unsigned char *ring_reserve(__u32 len, __u64 *pos_out)
{
	__u64 need = (SHM_REC_HDR + len + 15) & ~15ULL, size = ring_mask + 1;
	__u64 *headp = H64(SHM_OFF_HEAD), *tailp = H64(SHM_OFF_TAIL);
	unsigned waited = 0;
	for (;;) {
		__u64 head = __atomic_load_n(headp, __ATOMIC_RELAXED);
		__u64 off = head & ring_mask, pad = 0;
		if (off + need > size)
			pad = size - off;
		__u64 tail = __atomic_load_n(tailp, __ATOMIC_ACQUIRE);
		if (head + pad + need - tail > size) {
			/* Full: wait for the reader, boundedly; a reader that never
			 * comes back (hooktrace killed) must not hang the target. */
			if (reader_stalled || waited > 20000 || (*H32(SHM_OFF_FLAGS) & SHM_F_DETACHED))
				return NULL;
			waited++;
			if (waited < 64) {
				__builtin_ia32_pause();
			} else if (waited < 20000) {
				pause_10us();
				if (waited == 19999)
					reader_stalled = 1;
			}
			continue;
		}
		reader_stalled = 0;
		if (!__atomic_compare_exchange_n(headp, &head, head + pad + need, 0, __ATOMIC_ACQ_REL,
						 __ATOMIC_RELAXED))
			continue;
		if (pad) {
			unsigned char *p = ring + off;
			*(__u32 *)(p + 8) = (__u32)(pad - SHM_REC_HDR);
			*(__u32 *)(p + 12) = SHM_KIND_PAD;
			__atomic_store_n((__u64 *)p, head + 1, __ATOMIC_RELEASE);
		}
		__u64 pos = head + pad;
		unsigned char *p = ring + (pos & ring_mask);
		*(__u32 *)(p + 8) = len;
		*(__u32 *)(p + 12) = SHM_KIND_DATA;
		*pos_out = pos;
		return p + SHM_REC_HDR;
	}
}

void ring_commit(unsigned char *body, __u64 pos)
{
	__atomic_store_n((__u64 *)(body - SHM_REC_HDR), pos + 1, __ATOMIC_RELEASE);
}

void ring_output(const void *rec, __u32 len, __u32 type)
{
	if (!write_begin())
		return;
	__u64 pos;
	unsigned char *p = ring_reserve(len, &pos);
	if (!p) {
		count_lost(type);
	} else {
		memcpy(p, rec, len);
		ring_commit(p, pos);
	}
	write_end();
}
