/* vfork as it is used: the child borrows the parent's memory (it sets a
 * variable the parent then reads) until it execs or exits.
 *   exec PROG ARGS...  the child execs PROG with an empty environment
 *   exec-large PROG ARGS...  with 6000 variables, too many for the stack of
 *                      a recorder that adds its own: the parent checks its
 *                      mappings are as they were
 *   exit               the child takes vf_c then vf_a, and _exits
 * Then the parent takes vf_a and vf_b in both orders, and vf_a then vf_c:
 * only the parent's own records give one cycle (vf_a, vf_b); the child's
 * counted as the parent's would close a second (vf_a, vf_c). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t vf_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t vf_b = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t vf_c = PTHREAD_MUTEX_INITIALIZER;
static volatile int child_ran;
static char *large[6001];
static char text[6000][24];

static int mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static void take(pthread_mutex_t *first, pthread_mutex_t *second)
{
	pthread_mutex_lock(first);
	pthread_mutex_lock(second);
	pthread_mutex_unlock(second);
	pthread_mutex_unlock(first);
}

__attribute__((noinline)) static void parent_orders(void)
{
	take(&vf_a, &vf_b);
	take(&vf_b, &vf_a);
	take(&vf_a, &vf_c);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 64;
	int exec = strcmp(argv[1], "exec") == 0, exec_large = strcmp(argv[1], "exec-large") == 0;
	if ((exec || exec_large) && argc < 3)
		return 64;
	for (int i = 0; i < 6000; i++) {
		snprintf(text[i], sizeof text[i], "VFORKER_%d=x", i);
		large[i] = text[i];
	}
	int before = mappings();
	pid_t pid = vfork();
	if (pid == 0) {
		child_ran = 1;
		if (exec || exec_large) {
			char *env[] = {NULL};
			execve(argv[2], argv + 2, exec ? env : large);
			_exit(127);
		}
		take(&vf_c, &vf_a);
		_exit(0);
	}
	if (pid < 0)
		return 2;
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !child_ran)
		return 3;
	if (mappings() != before)
		return 4;
	parent_orders();
	return 0;
}
