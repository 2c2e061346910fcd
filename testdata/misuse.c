/* Lock misuse, one case a run (argv[1]), each a program bug that glibc
 * lets run to the end:
 *   never     an unlock of a mutex never locked (Helgrind's tc09/tc10);
 *   twice     lock, unlock, unlock (liblockdep's unlock_balance);
 *   foreign   a thread unlocks a mutex main holds (Helgrind's tc09/tc12);
 *   destroy   a destroy of a mutex its thread holds (glibc: EBUSY), then
 *             the right order;
 *   rwdestroy a destroy of a rwlock another thread holds for writing;
 *   rwnever   an unlock of a rwlock nobody holds;
 *   spinforeign a thread unlocks a spinlock main holds (glibc 2.36's
 *             pthread_spin_unlock is pthread_spin_init's code);
 *   clean     the same locks used right: nothing to report.
 * It prints what glibc answered each call. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t never_locked = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t balance_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t handoff_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t doomed_mu;
static pthread_rwlock_t table_rw;
static pthread_rwlock_t idle_rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_spinlock_t handoff_spin;
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cv = PTHREAD_COND_INITIALIZER;
static int step;

/* Steps between the two threads, so each case runs in one order. */
static void wait_step(int want)
{
	pthread_mutex_lock(&step_mu);
	while (step < want)
		pthread_cond_wait(&step_cv, &step_mu);
	pthread_mutex_unlock(&step_mu);
}

static void next_step(void)
{
	pthread_mutex_lock(&step_mu);
	step++;
	pthread_cond_broadcast(&step_cv);
	pthread_mutex_unlock(&step_mu);
}

/* Each call's result is printed by the function that made the call, so
 * that it is on the call's stack (no tail call). */
static void said(const char *what, int r)
{
	printf("%s %d\n", what, r);
}

__attribute__((noinline)) void bogus_unlock(void)
{
	said("unlock", pthread_mutex_unlock(&never_locked));
}

__attribute__((noinline)) void unbalanced_unlock(void)
{
	pthread_mutex_lock(&balance_mu);
	pthread_mutex_unlock(&balance_mu);
	said("second unlock", pthread_mutex_unlock(&balance_mu));
}

__attribute__((noinline)) void handoff_take(void)
{
	said("lock", pthread_mutex_lock(&handoff_mu));
}

__attribute__((noinline)) void handoff_release(void)
{
	said("foreign unlock", pthread_mutex_unlock(&handoff_mu));
}

static void *releaser(void *arg)
{
	(void)arg;
	handoff_release();
	return NULL;
}

__attribute__((noinline)) void spin_take(void)
{
	said("spin lock", pthread_spin_lock(&handoff_spin));
}

__attribute__((noinline)) void spin_release(void)
{
	said("foreign spin unlock", pthread_spin_unlock(&handoff_spin));
}

static void *spin_releaser(void *arg)
{
	(void)arg;
	spin_release();
	return NULL;
}

__attribute__((noinline)) void doomed_setup(void)
{
	said("init", pthread_mutex_init(&doomed_mu, NULL));
}

__attribute__((noinline)) void doomed_teardown(void)
{
	said("destroy", pthread_mutex_destroy(&doomed_mu));
}

__attribute__((noinline)) void table_setup(void)
{
	said("init", pthread_rwlock_init(&table_rw, NULL));
}

__attribute__((noinline)) void table_write(void)
{
	said("write lock", pthread_rwlock_wrlock(&table_rw));
}

__attribute__((noinline)) void table_drop(void)
{
	said("destroy", pthread_rwlock_destroy(&table_rw));
}

static void *writer(void *arg)
{
	(void)arg;
	table_write();
	next_step();
	wait_step(2);
	pthread_rwlock_unlock(&table_rw);
	return NULL;
}

__attribute__((noinline)) void idle_unlock(void)
{
	said("unlock", pthread_rwlock_unlock(&idle_rw));
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "clean";
	pthread_t t;
	if (!strcmp(c, "never")) {
		bogus_unlock();
	} else if (!strcmp(c, "twice")) {
		unbalanced_unlock();
	} else if (!strcmp(c, "foreign")) {
		handoff_take();
		pthread_create(&t, NULL, releaser, NULL);
		pthread_join(t, NULL);
	} else if (!strcmp(c, "destroy")) {
		doomed_setup();
		pthread_mutex_lock(&doomed_mu);
		doomed_teardown(); /* EBUSY */
		pthread_mutex_unlock(&doomed_mu);
		doomed_teardown();
	} else if (!strcmp(c, "rwdestroy")) {
		table_setup();
		pthread_create(&t, NULL, writer, NULL);
		wait_step(1);
		table_drop();
		next_step();
		pthread_join(t, NULL);
	} else if (!strcmp(c, "rwnever")) {
		idle_unlock();
	} else if (!strcmp(c, "spinforeign")) {
		pthread_spin_init(&handoff_spin, PTHREAD_PROCESS_PRIVATE);
		spin_take();
		pthread_create(&t, NULL, spin_releaser, NULL);
		pthread_join(t, NULL);
	} else {
		pthread_mutex_lock(&balance_mu);
		pthread_mutex_unlock(&balance_mu);
		doomed_setup();
		pthread_mutex_lock(&doomed_mu);
		pthread_mutex_unlock(&doomed_mu);
		doomed_teardown();
		table_setup();
		table_write();
		pthread_rwlock_unlock(&table_rw);
		table_drop();
	}
	return 0;
}
