/* The process ends while its other threads are busy: "exit" calls exit(),
 * "_exit" calls _exit(), "exec PROG" replaces the image with PROG, from
 * the main thread, once every worker has made some calls. The workers lock, allocate and unlock without end, so the
 * end comes in the middle of their calls. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORKERS 3

static pthread_mutex_t race_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t race_b = PTHREAD_MUTEX_INITIALIZER;
static int rounds[WORKERS];

__attribute__((noinline)) static void *busy(void *arg)
{
	int *done = arg;
	for (;;) {
		pthread_mutex_lock(&race_a);
		void *p = malloc(64);
		pthread_mutex_lock(&race_b);
		free(p);
		pthread_mutex_unlock(&race_b);
		pthread_mutex_unlock(&race_a);
		__atomic_fetch_add(done, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 64;
	pthread_t th[WORKERS];
	for (int i = 0; i < WORKERS; i++)
		pthread_create(&th[i], NULL, busy, &rounds[i]);
	for (int i = 0; i < WORKERS; i++)
		while (__atomic_load_n(&rounds[i], __ATOMIC_RELAXED) < 1000)
			sched_yield();
	if (strcmp(argv[1], "_exit") == 0)
		_exit(0);
	if (strcmp(argv[1], "exec") == 0 && argc > 2) {
		execv(argv[2], argv + 2);
		return 127;
	}
	exit(0);
}
