/* x86-64 glibc's structure layouts, as both recorders read them: the BPF
 * probes (hooktrace.c, through bpf_probe_read_user) and the preloaded
 * recorder (preload/src, in the process itself). Read in glibc 2.36's
 * source and checked here. The enum reaches the BPF object's BTF and,
 * through bpf2go -type, the Go side (tracer/contract_test.go).
 *
 * The helpers take words already read, in plain types, so that the BPF
 * compiler (no pointers to user memory) and the shim's compiler both take
 * them. */
#ifndef HOOKTRACE_GLIBC_H
#define HOOKTRACE_GLIBC_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

enum glibc_layout {
	GLIBC_MUTEX_LOCK_OFFSET = 0, /* pthread_mutex_t.__data.__lock: 0 when unlocked */
	GLIBC_MUTEX_OWNER_OFFSET = 8, /* pthread_mutex_t.__data.__owner (hang detection) */
	GLIBC_MUTEX_KIND_OFFSET = 16, /* pthread_mutex_t.__data.__kind */
	GLIBC_RWLOCK_FLAGS_OFFSET = 48, /* pthread_rwlock_t.__data.__flags: the preference */
	GLIBC_RWLOCKATTR_KIND_OFFSET = 0, /* pthread_rwlockattr_t's lockkind */
	/* pthread_rwlock_t.__data.__readers: bit 1 while a writer holds the
	 * lock, the readers that hold it from bit 3 (bit 0, the write phase,
	 * stays after a writer leaves). */
	GLIBC_RWLOCK_READERS_OFFSET = 0,
	GLIBC_RWLOCK_WRLOCKED = 2,
	GLIBC_RWLOCK_READER_SHIFT = 3,
	GLIBC_RWLOCK_WRITER_OFFSET = 24, /* pthread_rwlock_t.__data.__cur_writer: the writer's TID */
	/* The 32-bit words of a mutex or rwlock that say whether it is held
	 * and by whom (glibc_lock_held): the offsets above lie in them. */
	GLIBC_LOCK_WORDS = 8,
	/* pthread_spinlock_t: pthread_spin_init and pthread_spin_unlock (one
	 * function) store 1, unlocked; pthread_spin_lock's `lock decl` takes
	 * it to 0, and each thread that then tries it takes it lower. */
	GLIBC_SPIN_UNLOCKED = 1,
	GLIBC_MALLOC_ALIGNMENT = 16, /* what malloc aligns to: memalign asks it for less */
	/* malloc's chunk header, the two words before the pointer malloc
	 * returns, where the chunk starts: prev_size, which of a chunk glibc
	 * mmapped is how far before the chunk its mapping starts; then the
	 * chunk's size, flags in its low bits. */
	GLIBC_CHUNK_HEADER = 16,
	GLIBC_CHUNK_SIZE_AT = 8, /* the size word: 8 bytes before the pointer */
	GLIBC_CHUNK_FLAGS = 7,   /* PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA */
	GLIBC_CHUNK_IS_MMAPPED = 2,
};

/* The bytes of a chunk, header included, from its size word. */
static __always_inline __u64 glibc_chunk_bytes(__u64 size_word)
{
	return size_word & ~(__u64)GLIBC_CHUNK_FLAGS;
}

/* Whether glibc mmapped the chunk (its free is a munmap), from its size
 * word. */
static __always_inline int glibc_chunk_mmapped(__u64 size_word)
{
	return (size_word & GLIBC_CHUNK_IS_MMAPPED) != 0;
}

/* The size a free of the chunk reports, from its size word: its bytes
 * less the size word itself. */
static __always_inline __u64 glibc_chunk_freed(__u64 size_word)
{
	return glibc_chunk_bytes(size_word) - GLIBC_CHUNK_SIZE_AT;
}

/* Whether a spinlock whose word is word is held. */
static __always_inline int glibc_spin_held(__s32 word)
{
	return word < GLIBC_SPIN_UNLOCKED;
}

/* Whether the mutex (mutex set) or rwlock whose first GLIBC_LOCK_WORDS
 * words are w is held, and in *holder the thread that holds it where the
 * lock names one: a mutex's __owner, a rwlock's writer; 0 for readers or
 * nobody. */
static __always_inline int glibc_lock_held(int mutex, const __u32 *w, __u32 *holder)
{
	*holder = 0;
	if (mutex) {
		*holder = w[GLIBC_MUTEX_OWNER_OFFSET / 4];
		return w[GLIBC_MUTEX_LOCK_OFFSET / 4] != 0;
	}
	__u32 readers = w[GLIBC_RWLOCK_READERS_OFFSET / 4];
	if (readers & GLIBC_RWLOCK_WRLOCKED)
		*holder = w[GLIBC_RWLOCK_WRITER_OFFSET / 4];
	return (readers & GLIBC_RWLOCK_WRLOCKED) || (readers >> GLIBC_RWLOCK_READER_SHIFT);
}

#endif
