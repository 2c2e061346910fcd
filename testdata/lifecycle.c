/* A target whose end is chosen by its argument, for the tests of what run
 * does with it: "exit N" exits N; "segv" is killed by SIGSEGV; "wait"
 * takes its lock a few times, says "waiting" on stdout and blocks until a
 * line on stdin or a signal ends it (SIGTERM's default action: killed).
 * Each takes and frees a lock first, so there is something to trace. Its
 * stdout has only its own words, for the tests that check it unmixed. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) static void take(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&life_lock);
		pthread_mutex_unlock(&life_lock);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 64;
	take(3);
	if (strcmp(argv[1], "exit") == 0 && argc > 2) {
		printf("exiting %s\n", argv[2]);
		return atoi(argv[2]);
	}
	if (strcmp(argv[1], "segv") == 0) {
		printf("raising SIGSEGV\n");
		fflush(stdout);
		raise(SIGSEGV);
		return 0;
	}
	if (strcmp(argv[1], "wait") == 0) {
		printf("waiting\n");
		fflush(stdout);
		char line[64];
		if (fgets(line, sizeof line, stdin))
			take(1);
		printf("done\n");
		return 0;
	}
	return 64;
}
