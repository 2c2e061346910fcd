/*
 * rcache-workload: drives the registration cache the way an MPI library's
 * threads do, in three modes.
 *
 *   (default)  A communication thread registers and sends from fresh
 *              mappings (each a new registration), small heap buffers and
 *              large mmapped blocks (free() unmaps them, arena lock not
 *              held); an application thread allocates and frees working
 *              memory of its own arena, which glibc trims with madvise from
 *              inside free(), arena lock held, where the hook runs. Each
 *              thread frees only its own memory, so this run cannot
 *              deadlock, yet it shows both halves of the legacy variant's
 *              cycle. Paced, so that a tracer records it completely.
 *   --stress   Producers register buffers and hand them to consumers,
 *              which deregister and free them, and send from fresh
 *              mappings in between: a consumer's free() holds the
 *              producer's arena lock while its hook waits for vma_lock, and
 *              the producer holds vma_lock while its malloc (or its free of
 *              a dropped registration's page list) waits for that arena. The legacy variant deadlocks for real;
 *              a watchdog ends the process if nothing progresses for
 *              --watchdog seconds (exit 3).
 *   --check    Concurrency test of the cache's promise: no registration is
 *              ever returned for memory whose release has completed.
 *              Exit 0 when it held, 1 when it was broken.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rcache.h"

#define KiB 1024UL
#define MEDIUM (96 * KiB)   /* below the mmap threshold: from the arena */
#define LARGE (1024 * KiB)  /* above it: mmapped */
#define MEDIUM_BATCH 4      /* freed together, they trim the arena */

static enum rc_variant variant = RC_LEGACY;
static double seconds = 2.0;
static int nthreads = 1; /* --stress: producer/consumer pairs (one deadlocks soonest) */
static int watchdog_seconds = 10;
static const char *summary_path;
static atomic_ulong progress;
static atomic_int stop;
static atomic_ulong batches;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "rcache-workload: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* send stands for the network transfer: it touches the buffer. */
__attribute__((noinline)) static void send_buffer(char *buf, size_t len, rc_reg_t *reg)
{
	for (size_t i = 0; i < len; i += 4096)
		buf[i] = (char)reg->key;
	atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
}

/* register_and_send is an MPI_Send's path through the cache. */
__attribute__((noinline)) static void register_and_send(char *buf, size_t len)
{
	rc_reg_t *reg = rc_register(buf, len);
	if (!reg)
		die("rc_register");
	send_buffer(buf, len, reg);
	rc_deregister(reg);
}

/* ---- default mode -------------------------------------------------------- */

/* pace keeps the default run at a rate a tracer records completely: it
 * is about which paths run, not how fast. */
static void pace(void)
{
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL);
}

/* compute_batch is an application thread's working memory: medium blocks
 * from its own arena, freed newest first, so that each merges with the
 * arena's top, which grows past the trim threshold; glibc then gives the
 * pages back with madvise from inside free(), arena lock held, and the
 * hook runs there. */
__attribute__((noinline)) static void compute_batch(unsigned seed)
{
	char *bufs[MEDIUM_BATCH];
	for (int i = 0; i < MEDIUM_BATCH; i++) {
		bufs[i] = malloc(MEDIUM + (seed % 7) * 512);
		if (!bufs[i])
			die("malloc");
		memset(bufs[i], (int)seed, 4096);
	}
	for (int i = MEDIUM_BATCH - 1; i >= 0; i--)
		free(bufs[i]);
	atomic_fetch_add(&batches, 1);
	atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
}

__attribute__((noinline)) static void send_small(unsigned seed)
{
	size_t len = 256 + (seed % 32) * 256;
	char *buf = malloc(len);
	if (!buf)
		die("malloc");
	register_and_send(buf, len);
	free(buf);
}

/* send_large: a block above the mmap threshold; free() unmaps it, arena
 * lock not held. */
__attribute__((noinline)) static void send_large(void)
{
	char *buf = malloc(LARGE);
	if (!buf)
		die("malloc");
	register_and_send(buf, LARGE);
	free(buf);
}

static void send_fresh_mapping(size_t len);

/* comm_thread is the communication thread: it sends from fresh mappings
 * (each a new registration: tree nodes and page lists allocated, in the
 * legacy variant with vma_lock held), from small heap buffers (cache hits
 * after the first) and from large mmapped blocks. */
static void *comm_thread(void *arg)
{
	(void)arg;
	free(malloc(64)); /* the thread's arena exists before the cache sees it */
	for (unsigned round = 0; !atomic_load(&stop); round++) {
		send_fresh_mapping((1 + round % 4) * 256 * KiB);
		for (int i = 0; i < 4; i++)
			send_small(round * 4 + i);
		if (round % 2 == 0)
			send_large();
		pace();
	}
	return NULL;
}

/* compute_thread frees only its own memory, and the communication thread
 * only its own registrations' memory: neither ever waits for an arena the
 * other holds, so this run cannot deadlock. The legacy variant's paths
 * that can, with other threads, are all here. */
static void *compute_thread(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg * 7919u;
	free(malloc(64));
	while (!atomic_load(&stop)) {
		seed = seed * 1103515245u + 12345u;
		compute_batch(seed >> 8);
		pace();
	}
	return NULL;
}

/* ---- stress mode --------------------------------------------------------- */

#define QUEUE_LEN 64

/* A batch of registered buffers on its way from a producer to a consumer. */
struct batch {
	char *bufs[MEDIUM_BATCH];
	rc_reg_t *regs[MEDIUM_BATCH];
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t more, room;
	struct batch items[QUEUE_LEN];
	int head, count;
} queue = {.lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER, .room = PTHREAD_COND_INITIALIZER};

static void queue_put(struct batch *b)
{
	pthread_mutex_lock(&queue.lock);
	while (queue.count == QUEUE_LEN && !atomic_load(&stop))
		pthread_cond_wait(&queue.room, &queue.lock);
	int full = queue.count == QUEUE_LEN;
	if (!full) {
		queue.items[(queue.head + queue.count) % QUEUE_LEN] = *b;
		queue.count++;
		pthread_cond_signal(&queue.more);
	}
	pthread_mutex_unlock(&queue.lock);
	if (full) { /* stopping, and no consumer will take it */
		for (int i = 0; i < MEDIUM_BATCH; i++) {
			rc_deregister(b->regs[i]);
			free(b->bufs[i]);
		}
	}
}

static int queue_get(struct batch *b)
{
	pthread_mutex_lock(&queue.lock);
	while (queue.count == 0 && !atomic_load(&stop))
		pthread_cond_wait(&queue.more, &queue.lock);
	int ok = queue.count > 0;
	if (ok) {
		*b = queue.items[queue.head];
		queue.head = (queue.head + 1) % QUEUE_LEN;
		queue.count--;
		pthread_cond_signal(&queue.room);
	}
	pthread_mutex_unlock(&queue.lock);
	return ok;
}

/* send_fresh_mapping sends from memory mapped for the purpose (a file,
 * a window, a GPU buffer...): it is never in the cache, so the registration
 * pins it and allocates its page list, too big for malloc's per-thread
 * cache; in the legacy variant that malloc waits for the thread's arena
 * with vma_lock held. */
__attribute__((noinline)) static void send_fresh_mapping(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	rc_reg_t *reg = rc_register(p, len);
	if (!reg)
		die("rc_register");
	p[0] = (char)reg->key;
	rc_deregister(reg);
	munmap(p, len); /* the hook drops the registration */
	atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
}

/* producer registers buffers from its own arena and hands them to a
 * consumer, and sends from fresh mappings in between. */
static void *producer(void *arg)
{
	(void)arg;
	free(malloc(64));
	for (unsigned round = 0; !atomic_load(&stop); round++) {
		struct batch b;
		for (int i = 0; i < MEDIUM_BATCH; i++) {
			b.bufs[i] = malloc(MEDIUM);
			if (!b.bufs[i])
				die("malloc");
			b.regs[i] = rc_register(b.bufs[i], MEDIUM);
			if (!b.regs[i])
				die("rc_register");
			send_buffer(b.bufs[i], MEDIUM, b.regs[i]);
		}
		queue_put(&b);
		for (int i = 0; i < 4; i++)
			send_fresh_mapping((1 + (round + i) % 4) * 1024 * KiB);
	}
	return NULL;
}

/* consumer completes the sends: it frees the producer's buffers, taking
 * the producer's arena lock, and glibc trims that arena from inside free. */
static void *consumer(void *arg)
{
	(void)arg;
	free(malloc(64));
	struct batch b;
	while (queue_get(&b)) {
		for (int i = MEDIUM_BATCH - 1; i >= 0; i--) {
			rc_deregister(b.regs[i]);
			free(b.bufs[i]);
		}
		atomic_fetch_add(&batches, 1);
		atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
	}
	return NULL;
}

static void say(const char *msg)
{
	/* write(2), not stdio: the other threads may hold stdio's locks. */
	ssize_t r = write(2, msg, strlen(msg));
	(void)r;
}

/* watchdog ends a run that stopped making progress: the legacy variant's
 * deadlock must never hang whoever runs this. */
static void *watchdog(void *arg)
{
	(void)arg;
	unsigned long last = atomic_load(&progress);
	double since = now();
	while (!atomic_load(&stop)) {
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
		unsigned long cur = atomic_load(&progress);
		if (cur != last) {
			last = cur;
			since = now();
		} else if (now() - since >= watchdog_seconds) {
			char msg[200];
			snprintf(msg, sizeof(msg),
				 "rcache-workload: watchdog: no progress for %d s, the %s variant deadlocked\n",
				 watchdog_seconds, rc_variant_name(variant));
			say(msg);
			_exit(3);
		}
	}
	return NULL;
}

/* ---- check mode ---------------------------------------------------------- */

#define CHECK_OWNERS 4
#define CHECK_CHECKERS 2
#define MAX_KEYS (1u << 20)

static atomic_ulong check_clock;
static atomic_ulong *released_at; /* by key: check_clock after the release returned */
static atomic_ulong violations;
static int check_rounds = 3000;

static struct {
	_Atomic uintptr_t addr;
	_Atomic size_t len;
} slots[CHECK_OWNERS];

static void violation(const char *who, rc_reg_t *r, uintptr_t addr, size_t len, unsigned long rel, unsigned long e0)
{
	if (atomic_fetch_add(&violations, 1) < 5)
		fprintf(stderr,
			"rcache-workload: VIOLATION (%s): lookup of [%#lx, +%zu) returned registration %lu [%#lx, %#lx], "
			"whose memory was released at tick %lu, before the lookup began (tick %lu)\n",
			who, (unsigned long)addr, len, (unsigned long)r->key, (unsigned long)r->base,
			(unsigned long)r->bound, rel, e0);
}

static void released(rc_reg_t *r)
{
	if (r->key < MAX_KEYS)
		atomic_store(&released_at[r->key], atomic_fetch_add(&check_clock, 1) + 1);
}

/* check_after_release: a lookup begun after the release returned must not
 * see the released registration. */
static void check_after_release(rc_reg_t *old, char *p, size_t len)
{
	unsigned long e0 = atomic_load(&check_clock);
	rc_reg_t *r = rc_find(p, len);
	if (r) {
		if (r->key == old->key)
			violation("owner", r, (uintptr_t)p, len, released_at[old->key], e0);
		rc_deregister(r);
	}
}

static uint64_t flush_count(void)
{
	struct rc_stats st;
	rc_get_stats(&st);
	return st.flushes;
}

static void *check_owner(void *arg)
{
	int me = (int)(uintptr_t)arg;
	long pg = sysconf(_SC_PAGESIZE);
	unsigned seed = 12345u + me * 7u;
	free(malloc(64));
	for (int round = 0; round < check_rounds; round++) {
		seed = seed * 1103515245u + 12345u;
		size_t len = (1 + (seed >> 8) % 8) * pg;
		char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			die("mmap");
		/* A queue overflow drops every registration (safe, not lazy):
		 * the checks that live memory stays registered hold only across
		 * no such flush. The promise itself is checked regardless. */
		uint64_t flushes = flush_count();
		rc_reg_t *reg = rc_register(p, len);
		if (!reg)
			die("rc_register");
		if (reg->base > (uintptr_t)p || reg->bound < (uintptr_t)p + len - 1) {
			fprintf(stderr, "rcache-workload: registration %lu does not cover its range\n", (unsigned long)reg->key);
			atomic_fetch_add(&violations, 1);
		}
		rc_reg_t *again = rc_register(p + pg / 2, len - pg); /* covered: must reuse */
		rc_reg_t *found = rc_find(p, len);
		int flushed = flush_count() != flushes;
		if (again && again != reg && len > (size_t)pg && !flushed) {
			fprintf(stderr, "rcache-workload: a covered range got a new registration\n");
			atomic_fetch_add(&violations, 1);
		}
		if (again)
			rc_deregister(again);
		atomic_store(&slots[me].len, len);
		atomic_store(&slots[me].addr, (uintptr_t)p);
		if (found != reg && !flushed) {
			fprintf(stderr, "rcache-workload: lookup of live, registered memory returned %p, want %p\n",
				(void *)found, (void *)reg);
			atomic_fetch_add(&violations, 1);
		}
		if (found)
			rc_deregister(found);
		switch ((seed >> 16) % 3) {
		case 0: /* released while still referenced */
			if (munmap(p, len) != 0)
				die("munmap");
			released(reg);
			check_after_release(reg, p, len);
			rc_deregister(reg);
			break;
		case 1: /* part of it given back with madvise */
			if (madvise(p + pg * ((seed >> 20) % (len / pg)), pg, MADV_DONTNEED) != 0)
				die("madvise");
			released(reg);
			check_after_release(reg, p, len);
			rc_deregister(reg);
			munmap(p, len);
			break;
		default: { /* deregistered first: cached, then released */
			uint64_t key = reg->key;
			rc_deregister(reg); /* reg may be freed from here on */
			if (munmap(p, len) != 0)
				die("munmap");
			if (key < MAX_KEYS)
				atomic_store(&released_at[key], atomic_fetch_add(&check_clock, 1) + 1);
			break;
		}
		}
		atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
	}
	return NULL;
}

static void *check_checker(void *arg)
{
	unsigned seed = 99u + (unsigned)(uintptr_t)arg;
	while (!atomic_load(&stop)) {
		seed = seed * 1103515245u + 12345u;
		int s = (seed >> 8) % CHECK_OWNERS;
		uintptr_t addr = atomic_load(&slots[s].addr);
		size_t len = atomic_load(&slots[s].len);
		if (!addr)
			continue;
		unsigned long e0 = atomic_load(&check_clock);
		rc_reg_t *r = rc_find((void *)addr, len);
		if (!r)
			continue;
		unsigned long rel = r->key < MAX_KEYS ? atomic_load(&released_at[r->key]) : 0;
		if (rel != 0 && rel <= e0)
			violation("checker", r, addr, len, rel, e0);
		rc_deregister(r);
	}
	return NULL;
}

/* churn frees memory from inside glibc: arena trims (madvise, arena lock
 * held) and mmapped chunks (munmap), so hooks run while the others hold
 * vma_lock, and the fixed variant defers. */
static void *churn(void *arg)
{
	(void)arg;
	free(malloc(64));
	while (!atomic_load(&stop)) {
		compute_batch(1);
		free(malloc(LARGE));
	}
	return NULL;
}

static int run_check(void)
{
	released_at = calloc(MAX_KEYS, sizeof(*released_at));
	if (!released_at)
		die("calloc");
	pthread_t owners[CHECK_OWNERS], checkers[CHECK_CHECKERS], ch;
	for (int i = 0; i < CHECK_OWNERS; i++)
		pthread_create(&owners[i], NULL, check_owner, (void *)(uintptr_t)i);
	for (int i = 0; i < CHECK_CHECKERS; i++)
		pthread_create(&checkers[i], NULL, check_checker, (void *)(uintptr_t)i);
	pthread_create(&ch, NULL, churn, NULL);
	for (int i = 0; i < CHECK_OWNERS; i++)
		pthread_join(owners[i], NULL);
	atomic_store(&stop, 1);
	for (int i = 0; i < CHECK_CHECKERS; i++)
		pthread_join(checkers[i], NULL);
	pthread_join(ch, NULL);
	return atomic_load(&violations) == 0 ? 0 : 1;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr,
		"usage: rcache-workload --variant legacy|fixed [--stress | --check] [--seconds S] [--threads N]\n"
		"                       [--watchdog S] [--rounds N] [--summary FILE]\n"
		"  --seconds S   run this long (default 2; not with --check)\n"
		"  --threads N   --stress: producer/consumer pairs (default 1)\n"
		"  --watchdog S  --stress: exit 3 after S seconds without progress (default 10)\n"
		"  --rounds N    --check: rounds per owner thread (default 3000)\n"
		"  --summary F   write the run's counts as JSON to F (default: stderr)\n");
	exit(2);
}

static void write_summary(const char *mode, double elapsed, int code)
{
	struct rc_stats st;
	rc_get_stats(&st);
	FILE *f = summary_path ? fopen(summary_path, "w") : NULL;
	if (summary_path && !f)
		die(summary_path);
	char line[1024];
	snprintf(line, sizeof(line),
		 "{\"variant\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"seconds\":%.3f,\"exit\":%d,"
		 "\"registrations\":%lu,\"hits\":%lu,\"lookups\":%lu,\"invalidated\":%lu,\"hook_calls\":%lu,"
		 "\"hook_deferred\":%lu,\"overflows\":%lu,\"flushes\":%lu,\"evicted\":%lu,\"cached\":%lu,\"trim_batches\":%lu,"
		 "\"violations\":%lu}\n",
		 rc_variant_name(variant), mode, nthreads, elapsed, code, (unsigned long)st.registrations,
		 (unsigned long)st.hits, (unsigned long)st.lookups, (unsigned long)st.invalidated,
		 (unsigned long)st.hook_calls, (unsigned long)st.hook_deferred, (unsigned long)st.overflows,
		 (unsigned long)st.flushes, (unsigned long)st.evicted, (unsigned long)st.cached, atomic_load(&batches),
		 atomic_load(&violations));
	if (f) {
		fputs(line, f);
		fclose(f);
	} else {
		fputs(line, stderr);
	}
}

int main(int argc, char **argv)
{
	const char *mode = "default";
	int have_variant = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--variant") && v) {
			if (!strcmp(v, "legacy"))
				variant = RC_LEGACY;
			else if (!strcmp(v, "fixed"))
				variant = RC_FIXED;
			else
				usage();
			have_variant = 1;
			i++;
		} else if (!strcmp(a, "--stress")) {
			mode = "stress";
		} else if (!strcmp(a, "--check")) {
			mode = "check";
		} else if (!strcmp(a, "--seconds") && v) {
			seconds = atof(v);
			i++;
		} else if (!strcmp(a, "--threads") && v) {
			nthreads = atoi(v);
			i++;
		} else if (!strcmp(a, "--watchdog") && v) {
			watchdog_seconds = atoi(v);
			i++;
		} else if (!strcmp(a, "--rounds") && v) {
			check_rounds = atoi(v);
			i++;
		} else if (!strcmp(a, "--summary") && v) {
			summary_path = v;
			i++;
		} else {
			usage();
		}
	}
	if (!have_variant || seconds <= 0 || nthreads < 1 || nthreads > 64 || watchdog_seconds < 1 ||
	    check_rounds < 1 || (check_rounds > (int)(MAX_KEYS / (CHECK_OWNERS * 3)) && !strcmp(mode, "check")))
		usage();

	/* Fixed thresholds: glibc would otherwise raise them after the first
	 * large free, and stop trimming arenas at this workload's sizes. */
	mallopt(M_MMAP_THRESHOLD, 256 * KiB);
	mallopt(M_TRIM_THRESHOLD, 128 * KiB);
	/* The hooks patch libc's entries in place, and must put them back. */
	const char *patched[] = {"munmap", "madvise"};
	unsigned char entry[2][16];
	for (int i = 0; i < 2; i++)
		memcpy(entry[i], dlsym(RTLD_DEFAULT, patched[i]), sizeof(entry[i]));
	if (rc_init(variant) != 0)
		die("rc_init (installing the munmap/madvise hooks)");
	for (int i = 0; i < 2; i++) {
		if (!memcmp(entry[i], dlsym(RTLD_DEFAULT, patched[i]), sizeof(entry[i]))) {
			fprintf(stderr, "rcache-workload: %s is not patched after rc_init\n", patched[i]);
			return 1;
		}
	}

	double t0 = now();
	int code = 0;
	if (!strcmp(mode, "check")) {
		nthreads = CHECK_OWNERS + CHECK_CHECKERS + 1;
		code = run_check();
	} else {
		int n = !strcmp(mode, "stress") ? 2 * nthreads : 2;
		pthread_t *tids = calloc(n, sizeof(*tids));
		pthread_t wd;
		if (!strcmp(mode, "stress")) {
			pthread_create(&wd, NULL, watchdog, NULL);
			for (int i = 0; i < nthreads; i++) {
				pthread_create(&tids[2 * i], NULL, producer, NULL);
				pthread_create(&tids[2 * i + 1], NULL, consumer, NULL);
			}
		} else {
			pthread_create(&tids[0], NULL, comm_thread, NULL);
			pthread_create(&tids[1], NULL, compute_thread, (void *)(uintptr_t)1);
		}
		struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
		nanosleep(&ts, NULL);
		atomic_store(&stop, 1);
		pthread_mutex_lock(&queue.lock);
		pthread_cond_broadcast(&queue.more);
		pthread_cond_broadcast(&queue.room);
		pthread_mutex_unlock(&queue.lock);
		for (int i = 0; i < n; i++)
			pthread_join(tids[i], NULL);
		if (!strcmp(mode, "stress"))
			pthread_join(wd, NULL);
		free(tids);
	}
	double elapsed = now() - t0;
	write_summary(mode, elapsed, code);
	if (!strcmp(mode, "check"))
		fprintf(stderr, "rcache-workload: check (%s): %lu violations\n", rc_variant_name(variant),
			atomic_load(&violations));
	rc_finalize();
	for (int i = 0; i < 2; i++) {
		if (memcmp(entry[i], dlsym(RTLD_DEFAULT, patched[i]), sizeof(entry[i]))) {
			fprintf(stderr, "rcache-workload: %s's entry was not restored by rc_finalize\n", patched[i]);
			code = 1;
		}
	}
	return code;
}
