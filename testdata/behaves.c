/* A program that checks it behaves as if untraced: errno and return
 * values of the allocator and lock calls, a try and a timed lock that
 * fail, and a signal handler that locks while the main thread allocates
 * and locks in a loop (so signals land inside the recorder). It prints the
 * number of handler runs to stderr and exits 0 when every check holds. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static pthread_mutex_t main_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile sig_atomic_t handled;
static void *volatile keep;

static void on_alarm(int sig)
{
	(void)sig;
	if (pthread_mutex_trylock(&handler_lock) == 0) {
		handled++;
		pthread_mutex_unlock(&handler_lock);
	}
}

#define CHECK(cond)                                                       \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
			return 1;                                         \
		}                                                         \
	} while (0)

int main(void)
{
	errno = 1234;
	void *p = malloc(100);
	CHECK(p != NULL && errno == 1234);
	free(p);
	free(NULL);
	CHECK(errno == 1234);
	CHECK(pthread_mutex_lock(&main_lock) == 0 && errno == 1234);
	CHECK(pthread_mutex_trylock(&main_lock) == EBUSY);
	struct timespec soon;
	clock_gettime(CLOCK_REALTIME, &soon);
	soon.tv_nsec += 1000000;
	if (soon.tv_nsec >= 1000000000)
		soon.tv_sec++, soon.tv_nsec -= 1000000000;
	CHECK(pthread_mutex_timedlock(&main_lock, &soon) == ETIMEDOUT);
	CHECK(pthread_mutex_unlock(&main_lock) == 0 && errno == 1234);
	errno = 0;
	size_t huge = SIZE_MAX - 4096;
	keep = &huge; /* not a constant: no compiler warning */
	CHECK(malloc(*(volatile size_t *)&huge) == NULL && errno == ENOMEM);
	void *q = NULL;
	CHECK(posix_memalign(&q, 3, 64) == EINVAL);
	CHECK(posix_memalign(&q, 64, 64) == 0 && ((uintptr_t)q & 63) == 0);
	free(q);
	char *r = calloc(1000, 1);
	CHECK(r && r[999] == 0);
	r = realloc(r, 5000);
	CHECK(r != NULL);
	free(r);

	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 200}, {0, 200}};
	setitimer(ITIMER_REAL, &it, NULL);
	for (int i = 0; i < 300000; i++) {
		pthread_mutex_lock(&main_lock);
		keep = malloc(32 + i % 200);
		pthread_mutex_unlock(&main_lock);
		free(keep);
	}
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	fprintf(stderr, "handled %d\n", (int)handled);
	return 0;
}
