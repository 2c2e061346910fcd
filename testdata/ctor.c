/* Locks taken in a constructor, before main, and by main: a tracer that
 * starts from the first instruction counts all three. Built static too, to
 * trace an allocator and pthreads linked into the executable. */
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t early_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep;

__attribute__((constructor)) static void before_main(void)
{
	pthread_mutex_lock(&early_lock);
	keep = malloc(4321);
	pthread_mutex_unlock(&early_lock);
	pthread_mutex_lock(&early_lock);
	pthread_mutex_unlock(&early_lock);
}

int main(void)
{
	pthread_mutex_lock(&early_lock);
	free(keep);
	pthread_mutex_unlock(&early_lock);
	return 0;
}
