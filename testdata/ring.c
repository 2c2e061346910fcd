/* Three threads, one after the other, take a->b, b->c and c->a: a ring of
 * three locks that no pair of threads shows on its own. */
#include <pthread.h>

static pthread_mutex_t ring_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ring_b = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ring_c = PTHREAD_MUTEX_INITIALIZER;

struct pair {
	pthread_mutex_t *outer, *inner;
};

__attribute__((noinline)) void nest(pthread_mutex_t *outer, pthread_mutex_t *inner)
{
	pthread_mutex_lock(outer);
	pthread_mutex_lock(inner);
	pthread_mutex_unlock(inner);
	pthread_mutex_unlock(outer);
}

static void *run(void *arg)
{
	struct pair *p = arg;
	nest(p->outer, p->inner);
	return 0;
}

int main(void)
{
	struct pair pairs[3] = {{&ring_a, &ring_b}, {&ring_b, &ring_c}, {&ring_c, &ring_a}};
	for (int i = 0; i < 3; i++) {
		pthread_t t;
		pthread_create(&t, 0, run, &pairs[i]);
		pthread_join(t, 0);
	}
	return 0;
}
