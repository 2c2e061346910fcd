/* A library shipped stripped, as vendor and distribution libraries are: its
 * two locks and the static functions taking them have no symbol left, only
 * the exported entry points keep theirs (.dynsym). take_ab and take_ba take
 * the locks in opposite orders: a lock-order inversion whose locks and
 * frames can only be named by their place in the library. */
#include <pthread.h>

static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) static void hidden_ab(void)
{
	pthread_mutex_lock(&lock_a);
	pthread_mutex_lock(&lock_b);
	pthread_mutex_unlock(&lock_b);
	pthread_mutex_unlock(&lock_a);
}

__attribute__((noinline)) static void hidden_ba(void)
{
	pthread_mutex_lock(&lock_b);
	pthread_mutex_lock(&lock_a);
	pthread_mutex_unlock(&lock_a);
	pthread_mutex_unlock(&lock_b);
}

void lib_ab(void) { hidden_ab(); }
void lib_ba(void) { hidden_ba(); }
