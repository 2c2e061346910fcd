/* A server-like inversion that cannot deadlock: two threads take
 * cache_lock and stats_lock in opposite orders, but both always hold
 * gate_lock around it, so the two paths exclude each other (Goodlock's
 * guarded cycle). With "skip" as argument a third thread takes the
 * inverted order without the gate: then it can deadlock. The threads run
 * one after the other: the run never hangs. */
#include <pthread.h>
#include <string.h>

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile long hits, reports;

__attribute__((noinline)) void update_cache(void)
{
	pthread_mutex_lock(&gate_lock);
	pthread_mutex_lock(&cache_lock);
	pthread_mutex_lock(&stats_lock);
	hits++;
	pthread_mutex_unlock(&stats_lock);
	pthread_mutex_unlock(&cache_lock);
	pthread_mutex_unlock(&gate_lock);
}

__attribute__((noinline)) void report_stats(void)
{
	pthread_mutex_lock(&gate_lock);
	pthread_mutex_lock(&stats_lock);
	pthread_mutex_lock(&cache_lock);
	reports++;
	pthread_mutex_unlock(&cache_lock);
	pthread_mutex_unlock(&stats_lock);
	pthread_mutex_unlock(&gate_lock);
}

/* The same inversion, without the gate. */
__attribute__((noinline)) void fast_report(void)
{
	pthread_mutex_lock(&stats_lock);
	pthread_mutex_lock(&cache_lock);
	reports++;
	pthread_mutex_unlock(&cache_lock);
	pthread_mutex_unlock(&stats_lock);
}

static void *run(void *fn)
{
	((void (*)(void))fn)();
	return NULL;
}

static void in_thread(void (*fn)(void))
{
	pthread_t t;
	pthread_create(&t, NULL, run, (void *)fn);
	pthread_join(t, NULL);
}

int main(int argc, char **argv)
{
	in_thread(update_cache);
	in_thread(report_stats);
	if (argc > 1 && strcmp(argv[1], "skip") == 0)
		in_thread(fast_report);
	return hits + reports > 0 ? 0 : 1;
}
