/* Calls of the functions hooktrace probes at their calls (glibc 2.36's
 * pthread_rwlock_init and _destroy, pthread_spin_init, _unlock and
 * _destroy, whose entries the kernel must single-step): direct calls
 * through the executable's PLT, tail calls, and calls from a shared
 * library of its own (libcalls.c). Two rwlocks made through the
 * library's tail call are taken in both orders: one lock-order cycle,
 * between locks named by where they were made. Prints nothing.
 *   calls N: N spinlock lives here and N in the library, N rwlock lives.
 *   calls N dlopen LIB SITES: N spinlock lives in LIB (libcalls.so),
 *   loaded with dlopen, once SITES breakpoints more than the file has
 *   show in its code from lib_spin_life to the end of lib_probes_end (a
 *   tracer's probes on the calls there; 0: at once).
 *   calls N await FILE: says "ready", then N spinlock lives in the
 *   library it links once FILE exists (a tracer attached to it wrote it,
 *   its probes placed and on). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int lib_rwlock_init(pthread_rwlock_t *l);
void lib_rwlock_pair(pthread_rwlock_t *first, pthread_rwlock_t *second);
void lib_rwlock_end(pthread_rwlock_t *l);
void lib_spin_life(int n);

/* Tail calls through the executable's PLT. */
__attribute__((noinline)) int spin_make(pthread_spinlock_t *s)
{
	return pthread_spin_init(s, PTHREAD_PROCESS_PRIVATE);
}

__attribute__((noinline)) int spin_end(pthread_spinlock_t *s)
{
	return pthread_spin_destroy(s);
}

__attribute__((noinline)) int rwlock_end(pthread_rwlock_t *l)
{
	return pthread_rwlock_destroy(l);
}

__attribute__((noinline)) static void spin_lives(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_spinlock_t s;
		if (i % 2) {
			spin_make(&s);
		} else {
			pthread_spin_init(&s, PTHREAD_PROCESS_PRIVATE);
		}
		pthread_spin_lock(&s);
		pthread_spin_unlock(&s);
		if (i % 2) {
			spin_end(&s);
		} else {
			pthread_spin_destroy(&s);
		}
		__asm__ volatile("" ::: "memory");
	}
}

__attribute__((noinline)) static void rwlock_lives(int n)
{
	for (int i = 0; i < n; i++) {
		pthread_rwlock_t l;
		if (i % 2) {
			lib_rwlock_init(&l);
		} else {
			pthread_rwlock_init(&l, NULL);
		}
		pthread_rwlock_rdlock(&l);
		pthread_rwlock_unlock(&l);
		if (i % 2) {
			rwlock_end(&l);
		} else {
			lib_rwlock_end(&l);
		}
		__asm__ volatile("" ::: "memory");
	}
}

/* Waits until sites bytes of the code from fn to end read 0xcc (int3)
 * that did not at first: a uprobe shows so in the process's own copy of
 * its code. Gives up (exit 2) after a minute: the probes never came. It
 * polls every millisecond: a loop of system calls (sched_yield) while
 * the tracer enabled its syscall tracepoint stalled a 6.1 guest under
 * software emulation (see test/kernels/run.sh). */
static void await_probes(const unsigned char *fn, const unsigned char *end, int sites)
{
	enum { WINDOW = 1024 };
	unsigned char first[WINDOW];
	size_t len = end > fn && end - fn < WINDOW ? (size_t)(end - fn) : WINDOW;
	memcpy(first, fn, len);
	time_t give_up = time(NULL) + 60;
	for (;;) {
		int armed = 0;
		for (size_t i = 0; i < len; i++)
			armed += ((const volatile unsigned char *)fn)[i] == 0xcc && first[i] != 0xcc;
		if (armed >= sites)
			return;
		if (time(NULL) > give_up) {
			fprintf(stderr, "calls: %d of %d probes on the loaded library's calls\n", armed, sites);
			exit(2);
		}
		usleep(1000);
	}
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	if (argc == 4 && !strcmp(argv[2], "await")) {
		printf("ready\n");
		fflush(stdout);
		time_t give_up = time(NULL) + 60;
		while (access(argv[3], F_OK)) {
			if (time(NULL) > give_up) {
				fprintf(stderr, "calls: %s never came\n", argv[3]);
				return 2;
			}
			usleep(1000); /* as await_probes */
		}
		lib_spin_life(n);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[2], "dlopen")) {
		void *lib = dlopen(argv[3], RTLD_NOW);
		if (!lib) {
			fprintf(stderr, "calls: %s\n", dlerror());
			return 1;
		}
		void (*life)(int) = (void (*)(int))dlsym(lib, "lib_spin_life");
		/* lib_probes_end's call is within its first 32 bytes. */
		const unsigned char *end = (const unsigned char *)dlsym(lib, "lib_probes_end") + 32;
		await_probes((const unsigned char *)life, end, atoi(argv[4]));
		life(n);
		return 0;
	}
	spin_lives(n);
	lib_spin_life(n);
	rwlock_lives(n);
	pthread_rwlock_t *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
	lib_rwlock_init(a);
	lib_rwlock_init(b);
	lib_rwlock_pair(a, b);
	lib_rwlock_pair(b, a);
	lib_rwlock_end(a);
	lib_rwlock_end(b);
	free(a);
	free(b);
	return 0;
}
