/* fork in a multi-threaded process, with fork handlers that lock: the
 * prepare handler takes fh_guard, the parent's and the child's handlers
 * release it, and a worker thread locks fh_work meanwhile. The child takes
 * fh_x and fh_y in both orders (a cycle only a tracer that follows forks
 * sees) and exits. The child's handler runs in the child before fork
 * returns: it is the child's call, not the parent's. The child's thread
 * holds fh_guard from the fork (fork copies it locked), so the child's
 * handler takes fh_x inside it, and the child later takes them the other
 * way round: a second cycle, seen only by a tracer that knows what a
 * child holds when it starts. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t fh_guard = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fh_work = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fh_x = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fh_y = PTHREAD_MUTEX_INITIALIZER;
static volatile int forked;

static void prepare(void)
{
	pthread_mutex_lock(&fh_guard);
}

static void release(void)
{
	pthread_mutex_unlock(&fh_guard);
}

static void child_release(void)
{
	pthread_mutex_lock(&fh_x);
	pthread_mutex_unlock(&fh_x);
	pthread_mutex_unlock(&fh_guard);
}

static void *work(void *arg)
{
	/* 10000 rounds at least, some of them while the fork is made. */
	for (int i = 0; i < 10000 || !forked; i++) {
		pthread_mutex_lock(&fh_work);
		pthread_mutex_unlock(&fh_work);
	}
	return NULL;
}

__attribute__((noinline)) static void child_orders(void)
{
	pthread_mutex_lock(&fh_x);
	pthread_mutex_lock(&fh_y);
	pthread_mutex_unlock(&fh_y);
	pthread_mutex_unlock(&fh_x);
	pthread_mutex_lock(&fh_y);
	pthread_mutex_lock(&fh_x);
	pthread_mutex_unlock(&fh_x);
	pthread_mutex_unlock(&fh_y);
	pthread_mutex_lock(&fh_x);
	pthread_mutex_lock(&fh_guard);
	pthread_mutex_unlock(&fh_guard);
	pthread_mutex_unlock(&fh_x);
}

int main(void)
{
	pthread_atfork(prepare, release, child_release);
	pthread_t th;
	pthread_create(&th, NULL, work, NULL);
	pid_t pid = fork();
	if (pid == 0) {
		child_orders();
		_exit(0);
	}
	forked = 1;
	int status;
	waitpid(pid, &status, 0);
	pthread_join(th, NULL);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
