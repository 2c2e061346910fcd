/* Takes a lock, then replaces itself with the program named by argv[1]:
 * the trace must go on in the new image, same PID. */
#include <pthread.h>
#include <unistd.h>

static pthread_mutex_t before_exec = PTHREAD_MUTEX_INITIALIZER;

int main(int argc, char **argv)
{
	pthread_mutex_lock(&before_exec);
	pthread_mutex_unlock(&before_exec);
	if (argc > 1)
		execv(argv[1], argv + 1);
	return 127;
}
