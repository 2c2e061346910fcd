/* jemalloc's fork discipline: pthread_atfork's prepare handler takes the
 * library's mutex, the parent's handler unlocks it, and the child's
 * initialises it again rather than unlock it (the child's copy of the
 * lock is then fresh). The child then takes and releases it as usual.
 * Nothing here is misused or inconsistent. Prints "forks N". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;

static void prepare(void) { pthread_mutex_lock(&lib_lock); }
static void parent(void) { pthread_mutex_unlock(&lib_lock); }
static void child(void) { pthread_mutex_init(&lib_lock, NULL); }

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 3;
	pthread_atfork(prepare, parent, child);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			pthread_mutex_lock(&lib_lock);
			pthread_mutex_unlock(&lib_lock);
			_exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		pthread_mutex_lock(&lib_lock);
		pthread_mutex_unlock(&lib_lock);
	}
	printf("forks %d\n", n);
	return 0;
}
