/* The other lock kinds, one after the other on two threads so nothing
 * hangs: a write lock then a mutex on one thread and the mutex then a read
 * lock on the other (a read waits for a writer: a potential deadlock); a
 * trylock against the order of two mutexes (a try cannot wait: no cycle);
 * a spinlock in one order; a condition variable handed over once; a
 * timed and a clock wait that time out at once. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>

static pthread_rwlock_t table_rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t stats_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t try_x = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t try_y = PTHREAD_MUTEX_INITIALIZER;
static pthread_spinlock_t spin;
static pthread_mutex_t cond_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready;
static volatile int shared;

__attribute__((noinline)) void write_then_stats(void)
{
	pthread_rwlock_wrlock(&table_rw);
	pthread_mutex_lock(&stats_mu);
	shared++;
	pthread_mutex_unlock(&stats_mu);
	pthread_rwlock_unlock(&table_rw);
}

__attribute__((noinline)) void stats_then_read(void)
{
	pthread_mutex_lock(&stats_mu);
	pthread_rwlock_rdlock(&table_rw);
	shared++;
	pthread_rwlock_unlock(&table_rw);
	pthread_mutex_unlock(&stats_mu);
}

__attribute__((noinline)) void x_then_y(void)
{
	pthread_mutex_lock(&try_x);
	pthread_mutex_lock(&try_y);
	pthread_spin_lock(&spin);
	shared++;
	pthread_spin_unlock(&spin);
	pthread_mutex_unlock(&try_y);
	pthread_mutex_unlock(&try_x);
}

__attribute__((noinline)) void y_then_try_x(void)
{
	pthread_mutex_lock(&try_y);
	if (pthread_mutex_trylock(&try_x) == 0) {
		shared++;
		pthread_mutex_unlock(&try_x);
	}
	pthread_mutex_unlock(&try_y);
}

static void *first(void *arg)
{
	write_then_stats();
	x_then_y();
	pthread_mutex_lock(&cond_mu);
	ready = 1;
	pthread_cond_signal(&cond);
	pthread_mutex_unlock(&cond_mu);
	return arg;
}

static void *second(void *arg)
{
	pthread_mutex_lock(&cond_mu);
	while (!ready)
		pthread_cond_wait(&cond, &cond_mu);
	pthread_mutex_unlock(&cond_mu);
	stats_then_read();
	y_then_try_x();
	return arg;
}

/* Deadlines already past: each wait times out at once. */
__attribute__((noinline)) void timed_waits(void)
{
	struct timespec past = {0, 0};
	pthread_mutex_lock(&cond_mu);
	pthread_cond_timedwait(&cond, &cond_mu, &past);
	pthread_cond_clockwait(&cond, &cond_mu, CLOCK_MONOTONIC, &past);
	pthread_mutex_unlock(&cond_mu);
}

int main(void)
{
	pthread_spin_init(&spin, PTHREAD_PROCESS_PRIVATE);
	timed_waits();
	pthread_t a, b;
	pthread_create(&b, NULL, second, NULL);
	pthread_create(&a, NULL, first, NULL);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	return shared == 4 ? 0 : 1;
}
