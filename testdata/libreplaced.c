/* The library of replaced.c, built twice by the test: the build the
 * program maps (SUFFIX=old) and the one the test then renames over it on
 * disk (SUFFIX=new), whose functions and lock have other names and whose
 * code lies elsewhere (PAD). Built without frame pointers: only the CFI
 * of the mapped build unwinds through it. */
#include <pthread.h>
#include <stdlib.h>

#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define NAME(x) CAT(x, SUFFIX)

pthread_mutex_t NAME(x_lock) = PTHREAD_MUTEX_INITIALIZER;
void *volatile NAME(x_sink);

#if PAD
/* Moves the new build's functions away from the old one's addresses. */
__attribute__((noinline)) int NAME(x_pad)(int x)
{
	volatile int v[PAD];
	for (int i = 0; i < PAD; i++)
		v[i] = x + i;
	return v[x % PAD];
}
#endif

__attribute__((noinline)) static void *NAME(x_inner)(size_t n)
{
	volatile char frame[FRAME];
	frame[0] = 1;
	pthread_mutex_lock(&NAME(x_lock));
	void *p = malloc(n); /* big enough for malloc to mmap */
	NAME(x_sink) = p;
	pthread_mutex_unlock(&NAME(x_lock));
	frame[FRAME - 1] = 2;
	return p;
}

__attribute__((noinline)) static void *NAME(x_outer)(size_t n)
{
	volatile char frame[FRAME / 2];
	frame[0] = 1;
	void *p = NAME(x_inner)(n + frame[0] - 1);
	frame[1] = 2;
	return p;
}

void *x_entry(size_t n)
{
	void *p = NAME(x_outer)(n);
	NAME(x_sink) = 0;
	return p;
}
