/* The parent forks; the child takes two locks in both orders (one thread,
 * one order after the other: a potential deadlock all the same). Only a
 * tracer that follows forks sees it. */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t fork_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fork_b = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) void both_orders(void)
{
	pthread_mutex_lock(&fork_a);
	pthread_mutex_lock(&fork_b);
	pthread_mutex_unlock(&fork_b);
	pthread_mutex_unlock(&fork_a);
	pthread_mutex_lock(&fork_b);
	pthread_mutex_lock(&fork_a);
	pthread_mutex_unlock(&fork_a);
	pthread_mutex_unlock(&fork_b);
}

int main(int argc, char **argv)
{
	pid_t pid = fork();
	if (pid == 0) {
		both_orders();
		return 0;
	}
	int status;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
