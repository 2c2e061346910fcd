/* A library memcalls loads with dlopen: plugin_step is called from the
 * program through a pointer dlsym gave, and from plugin_run inside the
 * library, where no PLT is crossed. */
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t plugin_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile keep;

__attribute__((noinline)) void plugin_step(int i)
{
	pthread_mutex_lock(&plugin_lock);
	keep = malloc(32 + i);
	pthread_mutex_unlock(&plugin_lock);
	free(keep);
}
