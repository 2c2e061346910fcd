/* A library memcalls loads with dlopen: plugin_step is called from the
 * program through a pointer dlsym gave, and from plugin_run inside the
 * library, where no PLT is crossed. */
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t plugin_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep;

/* Built a second time with -DSTEP=plugin_stop: a name of the same length
 * keeps every offset in the library the same. */
#ifndef STEP
#define STEP plugin_step
#endif

__attribute__((noinline)) void STEP(int i)
{
	pthread_mutex_lock(&plugin_lock);
	keep = malloc(32 + i);
	pthread_mutex_unlock(&plugin_lock);
	free(keep);
}
