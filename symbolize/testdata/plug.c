// A library the test program loads with dlopen after its first snapshot.
#include <pthread.h>

static pthread_mutex_t plug_lock = PTHREAD_MUTEX_INITIALIZER;

int plug_fn(int x) {
	pthread_mutex_lock(&plug_lock);
	x++;
	pthread_mutex_unlock(&plug_lock);
	return x;
}

void *plug_lock_addr(void) { return &plug_lock; }

static __attribute__((noinline)) int hidden_fn(int x) { return x * 3; }

int exported_fn(int x) { return hidden_fn(x) + 1; }
