/* Calls libc's memory wrappers directly, through the PLT, a known number
 * of times: 5 each of mmap, madvise, mremap and munmap, and one sbrk(0).
 * With a library's path as argument it then loads it with dlopen and
 * calls its plugin_step 3 times; with "reload" after it, it unloads the
 * library, loads it again and calls plugin_step 3 times more. With "swap"
 * and a second library's path, it loads that one instead, and calls its
 * plugin_stop 3 times: the same code under another name, so it lands where
 * the first one's was (it prints "same address" or "moved"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *volatile keep;

__attribute__((noinline)) void map_and_release(void)
{
	for (int i = 0; i < 5; i++) {
		char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return;
		p[0] = 1;
		madvise(p, 1 << 20, MADV_DONTNEED);
		void *q = mremap(p, 1 << 20, 2 << 20, MREMAP_MAYMOVE);
		munmap(q, 2 << 20);
	}
	keep = sbrk(0);
}

static int run_plugin(const char *path, const char *fn, void **handle, void **at)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*step)(int) = (void (*)(int))dlsym(h, fn);
	if (!step) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	for (int i = 0; i < 3; i++)
		step(i);
	*handle = h;
	*at = (void *)step;
	return 0;
}

int main(int argc, char **argv)
{
	map_and_release();
	if (argc < 2)
		return 0;
	void *h, *first, *second;
	if (run_plugin(argv[1], "plugin_step", &h, &first))
		return 1;
	if (argc > 3 && strcmp(argv[2], "swap") == 0) {
		dlclose(h);
		if (run_plugin(argv[3], "plugin_stop", &h, &second))
			return 1;
		printf("%s\n", first == second ? "same address" : "moved");
		return 0;
	}
	if (argc > 2) {
		dlclose(h);
		return run_plugin(argv[1], "plugin_step", &h, &second);
	}
	return 0;
}
