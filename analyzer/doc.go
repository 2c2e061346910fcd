// Package analyzer turns hooktrace event streams into findings: potential
// deadlocks, self-deadlocks, allocator re-entry from memory hooks, locks
// taken by hooks, forbidden nesting of user-probed functions, and lock
// misuse.
//
// It is pure and deterministic: the same records in the same order give the
// same Result, byte for byte once rendered. It never stores events; memory
// grows with live lock instances, lock classes, lock-order edges, stacks
// and threads only: dead instances (their lifetimes over), with the dead
// ones they depend on, are folded into earlier dead ones of the same
// classes and dependencies (fold.go), so a program that creates and
// destroys locks in a loop costs memory per way its locks are used, not
// per lock it ever made. Streams (an MPI job's ranks) share their stacks,
// and a finished stream's locks fold into an earlier stream's used exactly
// the same way (rankfold.go).
//
// # Model
//
// Each thread's held locks are rebuilt from lock, unlock, trylock, timed
// lock, rwlock and condition-variable events. Taking lock B while holding A
// records the dependency A → B between lock INSTANCES: an instance is a lock
// address in one process during one lifetime. A lifetime ends when the
// lock (mutex, rwlock or spinlock) is destroyed or initialised again, when
// free() releases a chunk covering it (Size known),
// when munmap() unmaps it, or when the process execs, so a later lock at the
// same address is a new instance and address reuse never joins two locks
// into a false cycle. Instances are named by their CLASS: the ELF symbol of
// a static lock ("vma_lock (librcache.so)"), else the site that initialised
// or first took it; findings are deduplicated per class cycle.
//
// Acquisition rules (as lockdep):
//   - a blocking lock adds an edge from every held lock to it;
//   - a trylock adds no edge into the tried lock (it cannot wait), but once
//     it succeeded the lock is held and is the source of later edges;
//   - a timed lock is held only when it succeeded; it waits, so it adds
//     edges, but a cycle whose edges were only ever seen as timed waits is a
//     warning: it ends in a timeout, not a hang;
//   - re-taking a recursive mutex counts depth and adds no edge;
//   - re-taking a non-recursive lock the thread already holds is a
//     self-deadlock;
//   - pthread_cond_wait's entry releases its mutex, its return retakes it
//     (adding edges from whatever else the thread holds).
//
// # Read/write locks
//
// Every dependency A → B is typed by how A is held and how B is wanted:
// held Exclusive (mutex, spinlock, write lock) or Shared (read lock), and
// wanted as a Recursive read or Non-recursively (everything else). glibc's
// default rwlocks prefer readers, so a read lock waits only for an active
// writer, never for a queued one: reads are recursive. A rwlock whose
// flags (Event.Arg of the rwlock calls) say
// PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP (2) has non-recursive reads:
// a read waits behind a queued writer.
//
// A waiter blocks on a holder unless the waiter wants a recursive read and
// the holder holds it shared. So a cycle L0 → L1 → … → L0 can deadlock only
// if at no lock Li the edge into Li wants it as a recursive read while the
// edge out of Li holds it shared (lockdep's "strong" path: no -(xR)->
// followed by -(Sy)->). Consequences: a cycle made only of read→read
// dependencies of recursive-read locks is not reported; read(A)→write(B)
// with write(B)→read(A) is not either (the reader of A gets in beside the
// other reader); read(A)→write(B) with write(B)→write(A) is.
//
// # The allocator as a lock
//
// glibc's arena lock is internal, so no probe sees it. The analyzer adds a
// pseudo-lock per process, "glibc malloc arena":
//   - L → arena when a thread holding L calls an allocator function;
//   - arena → L when a memory hook running inside an allocator call takes L
//     (the acquisition carries FlagInAlloc, or happens inside a user-probed
//     function entered from inside the allocator).
//
// Whether glibc holds its arena lock on the hook's path is decided from the
// acquisition's stack (glibc 2.36 internals), innermost decisive frame
// first: _int_free, _int_malloc, _int_realloc, _int_memalign, sysmalloc,
// systrim, heap_trim, shrink_heap, delete_heap, mtrim, malloc_trim,
// malloc_consolidate → held; munmap_chunk, mremap_chunk, _int_new_arena,
// arena_get2 → not held; new_heap and alloc_new_heap are decided by their
// caller (sysmalloc: held; _int_new_arena: not). When the lock's stack does
// not decide (truncated, no glibc symbols), the stack of a memory syscall
// made in the same allocator call, or of a probed hook function's entry,
// decides; otherwise the edge "may hold" the arena lock, and cycles through
// it are warnings instead of errors.
// Paths that do not hold it add no dependency, only an informational
// hook-lock finding. With another allocator (Header.Allocator, e.g.
// jemalloc, whose locks are pthread locks and are traced as such) there is
// no pseudo-lock; an empty Header.Allocator means glibc.
//
// # The allocator as a hook context
//
// As lockdep's fs_reclaim pseudo-lock: once a memory hook of a process was
// seen taking lock M inside an allocator call, every allocator call that
// can make the syscall the hook wraps, made while holding L, may run the
// hook, so L → M "through the hook", whether or not the allocator holds a
// lock of its own on that path. The hook's call is named by its own
// stack (a libc wrapper, or a hook function named after the call), else by
// the first memory syscall of the allocator call after the hook's lock (a
// patched entry runs the hook, then the real call; an mmap made before it,
// as alloc_new_heap does, is not it); a hook known only as a probed
// function, or not named at all, may be reached from every entry point.
//   - L == M, non-recursive: a self-deadlock hazard (error), from a run
//     that did not hang, with the stack of the allocator call under L, the
//     hook's stack, and the glibc path that connects them;
//   - L == M, recursive (or error-checking, or a rwlock whose writer
//     glibc detects): a hook-lock warning; a read held and a recursive
//     read in the hook: nothing. A warning too when the hook's syscall was
//     seen running inside an allocator call made with L held and no hook
//     took L again: the hook re-enters L through a recursive wrapper over a
//     pthread lock (UCX's spinlock), or takes it only on some paths;
//   - L != M: the dependency joins the graph; a cycle through it is a
//     lock-order cycle (error) whose hook edge says which allocator call,
//     which hook and which glibc path. A direct sighting of L → M replaces
//     the hook one as the edge's example.
//
// Which glibc 2.36 entry points can make which memory syscalls (malloc.c,
// arena.c), conservatively: a rare path counts.
//
//	entry                        munmap  mmap  brk  madvise  mremap
//	malloc calloc valloc pvalloc   yes    yes  yes     -        -
//	posix_memalign aligned_alloc   yes    yes  yes    yes       -
//	  memalign
//	free                           yes    yes  yes    yes       -
//	realloc                        yes    yes  yes    yes      yes
//
// The paths:
//   - munmap from malloc: arena_get2 → _int_new_arena → new_heap →
//     alloc_new_heap trims a new heap's mapping to its alignment (a
//     thread's first call), and sysmalloc → new_heap when a non-main arena
//     grows; from free: munmap_chunk (an mmapped chunk), heap_trim →
//     delete_heap.
//   - mmap: sysmalloc (large chunks, new heaps, brk failing); free:
//     shrink_heap's MAP_FIXED remap when overcommit is strict.
//   - brk: sysmalloc grows the main arena; free's systrim shrinks it.
//   - madvise: free's heap_trim → shrink_heap (MADV_DONTNEED), and
//     _int_memalign frees the head and tail it does not use, so the
//     memalign family trims like free. malloc is left out on purpose: its
//     only madvise calls are madvise_thp (the non-default
//     glibc.malloc.hugetlb=1 tunable) and trimming, through sysmalloc's
//     _int_free of a full heap's old top, the heap it just made for the
//     request; counting them would turn every madvise hook that takes a
//     lock held around any malloc into an error no run has shown. A
//     process that does make one is seen doing it, and then it counts.
//   - mremap: only realloc of an mmapped chunk (mremap_chunk).
//
// With another allocator (Header.Allocator, e.g. jemalloc) only what it is
// seen to do counts: the entry point the hook ran in, and any entry point
// seen making the hook's syscall (or, the hook's call unknown, any memory
// syscall) in that process.
//
// # Hooks and the allocator on one thread
//
// A hook inside an allocator call that takes a lock its thread held since
// before the call is a self-deadlock (error) for a non-recursive lock, and
// a re-entrancy warning (hook-lock) for a recursive one: the hook runs in
// the middle of the lock's critical section. An allocator call made inside
// an allocator call (an allocator event with FlagInAlloc) is
// allocator-reentry (error), unless its caller is in the allocator's own
// object: glibc's posix_memalign and its kin call malloc themselves, and
// that is no hook. A hook that takes a lock inside the allocator
// on no reported cycle is hook-lock (info).
//
// # Forbidden nesting
//
// A Rule OUTER>INNER (Options.Forbid and Header.Forbid, on functions traced
// with --probe) is broken when INNER is entered while OUTER is active on the
// same thread: entered and not exited, or a frame of INNER's entry stack.
//
// # Guarded cycles
//
// A cycle whose every dependency was only ever taken while its thread held
// one same other lock exclusively (Goodlock's gate) cannot deadlock: its
// paths exclude each other. It is a warning naming the gate ("cannot
// deadlock while every path holds gate_lock; it will the day one path
// stops taking it"), not an error. Each dependency keeps the intersection
// of the locks held exclusively at each of its sightings; a cycle's gate is
// a lock in all of its dependencies' sets and not on the cycle. A lock
// held for reading guards nothing (readers run side by side); a dependency
// through a hook or the allocator is never guarded. A class cycle is
// guarded only when every instance cycle merged into it is.
//
// # Trace inconsistencies
//
// The analyzer checks its own evidence. A thread that takes a non-recursive
// lock it holds waits forever; if it records another event, the trace is
// wrong (a lost unlock, a failed trylock read as a success, another lock
// at the same address), and the finding would be impossible: it becomes a
// trace-inconsistency warning with the events around it (the error stands
// when some sighting was not outlived). Stats.TraceChecks counts them in
// every report.
//
// # Lock misuse
//
// An unlock of a lock no thread holds, an unlock of a lock another thread
// holds (released from that thread, unless glibc checks the owner: an
// error-checking or recursive mutex), and a destroy of a held lock (a
// held mutex outlives it: glibc refuses with EBUSY) are lock-misuse
// warnings, with the call's stack and the holder's acquisition, merged
// per call, lock class and calling function: whether another thread
// still held the lock is timing, not part of the ID. The recorders send
// such calls with their stack and the holder the lock's word names, so
// a holder whose acquisition aggregate mode only counted is named too.
// A lost event makes the same records, so in a trace that lost events or
// was cut short they are trace inconsistencies that say so, counted in
// Stats.TraceChecks; in a complete one, in Stats.LockMisuse. In an attach
// (a header with no command) a thread's unlock of a lock it was never
// seen taking is neither: it may have taken the lock before the attach
// (and a waiter, traced at its lock call's entry, is not the holder).
//
// # Peers
//
// peer_test.go replays ThreadSanitizer's deadlock-detector stress scenarios
// (mutexes, spinlocks, rwlocks, recursive mutexes; trylock edges; cycles of
// 2 to 30 locks) and liblockdep's sequences (AA, ABBA, ABBCCA, ABBCCDDA,
// ABCABC, ABCDBCDA, ABCDBDDA, WW, unlock balance). hooktrace agrees, except
// on purpose:
//   - read-read cycles of reader-preferring rwlocks (glibc's default):
//     TSan reports them; a reader never waits for a reader there, so
//     hooktrace does not (a writer-preferring rwlock's are reported);
//   - TSan's detector forgets its lock graph once more than 4096 locks were
//     seen; hooktrace keeps every dependency for the whole trace (memory
//     grows with instances and edges, never with events);
//   - WW: liblockdep reports a deadlock; glibc's rwlock knows its writer
//     and fails the second wrlock with EDEADLK, so hooktrace warns;
//   - unlock balance: liblockdep reports the program, and so does
//     hooktrace (lock misuse) when the trace is complete; with events
//     lost it is a trace inconsistency (a lost event and a program bug
//     look alike from outside).
//
// # Cycles
//
// Cycles are found without enumerating them: Tarjan's strongly connected
// components over the dependency graph (with the read/write rule folded
// into the node state), then the shortest cycle through each not yet
// covered edge of a component, by breadth-first search. Each class-level
// cycle is reported once, listing the instances seen. A component gets
// 1000 such searches (each costs up to the component's size); past that,
// up to 1000 more, only for dependencies between two lock classes that no
// reported cycle joins yet, and its findings count the dependencies on
// cycles not reported (Finding.Unreported). A graph of 100,000 locks
// taken in random pairs is analyzed in seconds, not hours, and a
// class-level dependency on a cycle goes unreported only in a component
// with over a thousand such pairs of classes.
package analyzer
