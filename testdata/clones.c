// A function gcc copies at -O2: main calls only its .constprop clone, and
// the unlikely error path of each is split into a .cold fragment.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int total;

__attribute__((noinline, cold, noreturn)) static void too_large(int v, int i, int k) {
	fprintf(stderr, "worker: %d is too large (%d of %d)\n", v, i, k);
	abort();
}

__attribute__((noinline)) static void worker(int n, int k) {
	for (int i = 0; i < k; i++) {
		if (n + i > 1000000)
			too_large(n + i, i, k);
		pthread_mutex_lock(&mu);
		total += n + i;
		pthread_mutex_unlock(&mu);
	}
}

int main(int argc, char **argv) {
	(void)argv;
	worker(argc, 3);
	worker(argc + 1, 3);
	printf("total %d\n", total);
	return 0;
}
