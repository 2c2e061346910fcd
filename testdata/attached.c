// A long-running program to attach to: it reads commands on stdin, and
// for each "phase N" runs a phase of known counts, then prints a checksum
// line; "hold" starts a thread that waits on a condition variable until
// "release" (each answers "held", "released"); "exec" execs a shell that
// says "execd" and then echoes the rest of stdin; "exit" ends it with
// status 7. Between commands it is blocked in
// read(2), as a server between requests is.
//
// A phase: thread 1 takes A then B, N times, calling malloc and free
// under them; then thread 2 takes B then A, N times (an inversion, never
// a deadlock: the threads run one after the other). So a phase is exactly
// N malloc, N free and 4N pthread_mutex_lock calls.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;
static long n;
static unsigned long sum;
/* Where each block goes: the compiler must not elide the malloc-free pair. */
static char *volatile last;

__attribute__((noinline)) static void *a_then_b(void *arg)
{
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&lock_a);
		pthread_mutex_lock(&lock_b);
		char *p = malloc(64 + (i & 7));
		memset(p, (int)i, 64);
		last = p;
		sum += (unsigned char)last[3];
		free(last);
		pthread_mutex_unlock(&lock_b);
		pthread_mutex_unlock(&lock_a);
	}
	return arg;
}

__attribute__((noinline)) static void *b_then_a(void *arg)
{
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&lock_b);
		pthread_mutex_lock(&lock_a);
		sum += (unsigned long)i;
		pthread_mutex_unlock(&lock_a);
		pthread_mutex_unlock(&lock_b);
	}
	return arg;
}

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static int holding, released;

static void *hold(void *arg)
{
	pthread_mutex_lock(&hold_lock);
	holding = 1;
	pthread_cond_broadcast(&hold_cond);
	while (!released)
		pthread_cond_wait(&hold_cond, &hold_lock);
	pthread_mutex_unlock(&hold_lock);
	return arg;
}

int main(void)
{
	pthread_t holder;
	char line[128];
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "exit", 4) == 0)
			return 7;
		if (strncmp(line, "exec", 4) == 0) {
			execl("/bin/sh", "sh", "-c", "echo execd; exec cat", (char *)NULL);
			return 1;
		}
		if (strncmp(line, "hold", 4) == 0) {
			pthread_create(&holder, NULL, hold, NULL);
			pthread_mutex_lock(&hold_lock);
			while (!holding)
				pthread_cond_wait(&hold_cond, &hold_lock);
			pthread_mutex_unlock(&hold_lock);
			printf("held\n");
			continue;
		}
		if (strncmp(line, "release", 7) == 0) {
			pthread_mutex_lock(&hold_lock);
			released = 1;
			pthread_cond_broadcast(&hold_cond);
			pthread_mutex_unlock(&hold_lock);
			pthread_join(holder, NULL);
			printf("released\n");
			continue;
		}
		if (sscanf(line, "phase %ld", &n) != 1)
			continue;
		pthread_t t;
		pthread_create(&t, NULL, a_then_b, NULL);
		pthread_join(t, NULL);
		pthread_create(&t, NULL, b_then_a, NULL);
		pthread_join(t, NULL);
		printf("phase %ld sum %lu\n", n, sum);
	}
	return 0;
}
