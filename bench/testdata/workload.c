/* The benchmark's workload: allocations made under locks, the way a
 * registration cache makes them. THREADS threads (2) share MUTEXES mutexes
 * (4); each does ITERS lock holds, and inside every hold 3 malloc and 3 free
 * of 16-271 bytes, plus a 256 KiB block (mapped: above the mmap threshold)
 * every 1024th hold.
 *
 *     workload [ITERS [THREADS [MUTEXES [OUT]]]]
 *
 * It times its own phase, from the first worker's start (once every thread
 * is ready) to the last one's end, so that start-up and a tracer's attach
 * are not counted, and then writes one line to OUT (stdout when absent or "-"):
 *
 *     phase_ns=N cpu_ns=N pthread_mutex_lock=N pthread_mutex_unlock=N malloc=N free=N big=N
 *
 * with the phase's wall time, the process's CPU time in it (user + system,
 * all threads: a probe's kernel work counts, and it is steadier than wall
 * time on a loaded machine), and the calls it made itself in that phase,
 * under the names hooktrace counts them by. Exit 0, or 2 on bad arguments.
 * With WORKLOAD_HOLD set in its environment it waits, once its threads
 * are ready, for a line on stdin before the phase: the bench attaches to
 * it then.
 *
 * These are the only calls to those functions after start-up: each thread
 * allocates once before the phase (its arena and tcache exist before it),
 * and none exits before the process does (an exiting thread frees its
 * tcache's blocks through free, a number that depends on the run). So a
 * tracer's counts minus a run with ITERS=0 equal these, exactly; each
 * mapped block is one mmap and one munmap, give or take one per thread
 * (glibc maps an arena with one or two of each, depending on where the
 * kernel put it).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_MUTEXES 256
#define SMALL 3
#define BIG_EVERY 1024
#define BIG_SIZE (256 * 1024)

struct slot {
	pthread_mutex_t mu;
	unsigned long uses; /* guarded by mu: shared data, as a cache's */
	char pad[64];
};

struct counts {
	unsigned long lock, unlock, malloc, free, big;
};

struct worker {
	pthread_t t;
	int id;
	struct counts n;
	struct timespec start, end;
};

static struct slot slots[MAX_MUTEXES];
static long iters = 100000;
static int nmutex = 4;
static pthread_barrier_t ready, done;

/* Keeps the compiler from pairing a malloc with its free and dropping both. */
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static inline uint32_t next(uint32_t *s)
{
	uint32_t x = *s;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return *s = x;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	uint32_t seed = 2463534242u + 977u * (uint32_t)w->id;
	void *warm = malloc(16);
	ESCAPE(warm);
	free(warm);
	pthread_barrier_wait(&ready);
	clock_gettime(CLOCK_MONOTONIC, &w->start);
	for (long i = 0; i < iters; i++) {
		struct slot *s = &slots[next(&seed) % (uint32_t)nmutex];
		pthread_mutex_lock(&s->mu);
		w->n.lock++;
		char *p[SMALL];
		for (int k = 0; k < SMALL; k++) {
			size_t size = 16 + (next(&seed) & 255);
			p[k] = malloc(size);
			p[k][0] = (char)i;
			ESCAPE(p[k]);
		}
		w->n.malloc += SMALL;
		if (i % BIG_EVERY == BIG_EVERY - 1) {
			char *b = malloc(BIG_SIZE);
			b[0] = b[BIG_SIZE - 1] = 1;
			ESCAPE(b);
			free(b);
			w->n.big++;
			w->n.malloc++;
			w->n.free++;
		}
		s->uses++;
		for (int k = 0; k < SMALL; k++)
			free(p[k]);
		w->n.free += SMALL;
		pthread_mutex_unlock(&s->mu);
		w->n.unlock++;
	}
	clock_gettime(CLOCK_MONOTONIC, &w->end);
	pthread_barrier_wait(&done);
	for (;;)
		pause(); /* until exit ends the process */
	return NULL;
}

static long long ts_ns(struct timespec t)
{
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long tv_ns(struct timeval tv)
{
	return (long long)tv.tv_sec * 1000000000LL + (long long)tv.tv_usec * 1000LL;
}

int main(int argc, char **argv)
{
	int threads = 2;
	const char *out = "-";
	if (argc > 1)
		iters = atol(argv[1]);
	if (argc > 2)
		threads = atoi(argv[2]);
	if (argc > 3)
		nmutex = atoi(argv[3]);
	if (argc > 4)
		out = argv[4];
	if (argc > 5 || iters < 0 || threads < 1 || threads > MAX_THREADS || nmutex < 1 || nmutex > MAX_MUTEXES) {
		fprintf(stderr, "usage: workload [ITERS [THREADS(1-%d) [MUTEXES(1-%d) [OUT]]]]\n", MAX_THREADS, MAX_MUTEXES);
		return 2;
	}
	/* A fixed threshold: glibc would otherwise raise it after the first
	 * mapped block is freed and serve the rest from the heap. */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	for (int i = 0; i < nmutex; i++)
		pthread_mutex_init(&slots[i].mu, NULL);

	static struct worker w[MAX_THREADS];
	pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
	pthread_barrier_init(&done, NULL, (unsigned)threads + 1);
	for (int i = 0; i < threads; i++) {
		w[i].id = i;
		if (pthread_create(&w[i].t, NULL, work, &w[i])) {
			perror("pthread_create");
			return 1;
		}
	}
	/* The workers time themselves: on a busy machine main may get the CPU
	 * back only after they are done. CPU time is the whole process's,
	 * taken while the workers wait. */
	struct rusage r0, r1;
	if (getenv("WORKLOAD_HOLD")) {
		/* Held until a line on stdin, every thread started and ready:
		 * a tracer attaches to the running process meanwhile. */
		char c;
		while (read(0, &c, 1) == 1 && c != '\n')
			;
	}
	getrusage(RUSAGE_SELF, &r0);
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&done);
	getrusage(RUSAGE_SELF, &r1);
	long long first = -1, last = 0;
	for (int i = 0; i < threads; i++) {
		long long a = ts_ns(w[i].start), b = ts_ns(w[i].end);
		if (first < 0 || a < first)
			first = a;
		if (b > last)
			last = b;
	}

	struct counts n = {0};
	for (int i = 0; i < threads; i++) {
		n.lock += w[i].n.lock;
		n.unlock += w[i].n.unlock;
		n.malloc += w[i].n.malloc;
		n.free += w[i].n.free;
		n.big += w[i].n.big;
	}
	unsigned long uses = 0;
	for (int i = 0; i < nmutex; i++)
		uses += slots[i].uses;
	if (uses != n.lock) {
		fprintf(stderr, "workload: %lu uses for %lu holds\n", uses, n.lock);
		return 1;
	}
	FILE *f = stdout;
	if (strcmp(out, "-") != 0 && !(f = fopen(out, "w"))) {
		perror(out);
		return 1;
	}
	long long ns = last - first;
	long long cpu = tv_ns(r1.ru_utime) + tv_ns(r1.ru_stime) - tv_ns(r0.ru_utime) - tv_ns(r0.ru_stime);
	fprintf(f, "phase_ns=%lld cpu_ns=%lld pthread_mutex_lock=%lu pthread_mutex_unlock=%lu malloc=%lu free=%lu big=%lu\n",
		ns, cpu, n.lock, n.unlock, n.malloc, n.free, n.big);
	if (f != stdout && fclose(f) != 0) {
		perror(out);
		return 1;
	}
	exit(0); /* the workers are still there, in pause */
}
