/* A fork storm: the parent forks NCHILD children in quick succession
 * without waiting between forks; each child locks and unlocks a mutex
 * NITER times with a small malloc inside, then exits. The parent takes the
 * mutex 100 times first. Every lock call must be counted, in every child:
 * a child that ran before its probes were placed would be short. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t storm_lock = PTHREAD_MUTEX_INITIALIZER;
static void *volatile sink;

__attribute__((noinline)) static void churn(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&storm_lock);
		void *p = malloc(24);
		sink = p;
		free(p);
		pthread_mutex_unlock(&storm_lock);
	}
}

int main(int argc, char **argv)
{
	int nchild = argc > 1 ? atoi(argv[1]) : 200;
	int niter = argc > 2 ? atoi(argv[2]) : 1000;
	churn(100);
	for (int i = 0; i < nchild; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0) {
			churn(niter);
			_exit(0);
		}
	}
	int status, bad = 0;
	while (wait(&status) > 0)
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			bad++;
	return bad ? 1 : 0;
}
