/* Runs the stripped library's two lock orders, one thread after the other
 * (the inversion is potential, never a real deadlock). */
#include <pthread.h>

void lib_ab(void);
void lib_ba(void);

static void *run_ab(void *arg) { lib_ab(); return arg; }
static void *run_ba(void *arg) { lib_ba(); return arg; }

int main(void)
{
	pthread_t t;
	pthread_create(&t, 0, run_ab, 0);
	pthread_join(t, 0);
	pthread_create(&t, 0, run_ba, 0);
	pthread_join(t, 0);
	return 0;
}
