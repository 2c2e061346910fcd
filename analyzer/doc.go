// Package analyzer turns hooktrace event streams into findings: potential
// deadlocks, self-deadlocks, allocator re-entry from memory hooks, locks
// taken by hooks, and forbidden nesting of user-probed functions.
//
// It is pure and deterministic: the same records in the same order give the
// same Result, byte for byte once rendered. It never stores events; memory
// grows with live lock instances, lock classes, lock-order edges, stacks
// and threads only: dead instances (their lifetimes over), with the dead
// ones they depend on, are folded into earlier dead ones of the same
// classes and dependencies (fold.go), so a program that creates and
// destroys locks in a loop costs memory per way its locks are used, not
// per lock it ever made.
//
// # Model
//
// Each thread's held locks are rebuilt from lock, unlock, trylock, timed
// lock, rwlock and condition-variable events. Taking lock B while holding A
// records the dependency A → B between lock INSTANCES: an instance is a lock
// address in one process during one lifetime. A lifetime ends when the
// mutex is destroyed, when free() releases a chunk covering it (Size known),
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
// # Hooks and the allocator on one thread
//
// A hook inside an allocator call that takes a lock its thread held since
// before the call is a self-deadlock (error) for a non-recursive lock, and
// a re-entrancy warning (hook-lock) for a recursive one: the hook runs in
// the middle of the lock's critical section. An allocator call made inside
// an allocator call (an allocator event with FlagInAlloc) is
// allocator-reentry (error). A hook that takes a lock inside the allocator
// on no reported cycle is hook-lock (info).
//
// # Forbidden nesting
//
// A Rule OUTER>INNER (Options.Forbid and Header.Forbid, on functions traced
// with --probe) is broken when INNER is entered while OUTER is active on the
// same thread: entered and not exited, or a frame of INNER's entry stack.
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
