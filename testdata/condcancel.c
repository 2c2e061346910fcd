/* Threads cancelled while they wait on a condition variable, once in each
 * of the three waits, with a cleanup handler that unlocks the mutex (POSIX
 * has the mutex taken back before the handlers run). The program checks
 * what it sees: each thread ends cancelled and leaves the mutex free. */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <time.h>

static pthread_mutex_t cancel_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static sem_t holding;

static void unlock_it(void *m)
{
	pthread_mutex_unlock(m);
}

__attribute__((noinline)) static void *waiter(void *arg)
{
	long kind = (long)arg;
	struct timespec at;
	pthread_mutex_lock(&cancel_lock);
	pthread_cleanup_push(unlock_it, &cancel_lock);
	sem_post(&holding);
	for (;;) {
		switch (kind) {
		case 0:
			pthread_cond_wait(&never, &cancel_lock);
			break;
		case 1:
			clock_gettime(CLOCK_REALTIME, &at);
			at.tv_sec += 3600;
			pthread_cond_timedwait(&never, &cancel_lock, &at);
			break;
		default:
			clock_gettime(CLOCK_MONOTONIC, &at);
			at.tv_sec += 3600;
			pthread_cond_clockwait(&never, &cancel_lock, CLOCK_MONOTONIC, &at);
		}
	}
	pthread_cleanup_pop(1);
	return NULL;
}

int main(void)
{
	int bad = 0;
	sem_init(&holding, 0, 0);
	for (long kind = 0; kind < 3; kind++) {
		pthread_t th;
		pthread_create(&th, NULL, waiter, (void *)kind);
		sem_wait(&holding);
		/* The waiter held the mutex; having it here means it is
		 * inside its wait, which let it go. */
		pthread_mutex_lock(&cancel_lock);
		pthread_mutex_unlock(&cancel_lock);
		pthread_cancel(th);
		void *res;
		pthread_join(th, &res);
		if (res != PTHREAD_CANCELED) {
			fprintf(stderr, "wait %ld: the thread was not cancelled\n", kind);
			bad = 1;
		}
		if (pthread_mutex_trylock(&cancel_lock) != 0) {
			fprintf(stderr, "wait %ld: the mutex is still held\n", kind);
			bad = 1;
		} else {
			pthread_mutex_unlock(&cancel_lock);
		}
	}
	return bad;
}
