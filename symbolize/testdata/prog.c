// A target for the symbolize tests: it prints addresses of its functions and
// data, then waits on stdin so the test can symbolize them while it runs.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static pthread_mutex_t vma_lock = PTHREAD_MUTEX_INITIALIZER;
static char big_table[1 << 20]; // .bss larger than a page: its tail is anonymous memory
int counter;
void *recorded_ret;

// Written without a .size directive, like hand-written assembly often is.
__asm__(".text\n.globl asm_nosize\n.type asm_nosize, @function\nasm_nosize:\n\tnop\n\tnop\n\tret\n");
void asm_nosize(void);

__attribute__((noinline)) int after_asm(int x) { return x * 7; }

__attribute__((noinline)) int target_fn(int x) { /* LINE_TARGET */
	counter += x;
	return counter;
}

__attribute__((noinline)) void record(void) { recorded_ret = __builtin_return_address(0); }

__attribute__((noinline)) void caller(void) {
	record(); /* LINE_CALL */
	counter++; /* LINE_AFTER */
}

static void print_bytes(const char *name, const void *p) {
	const unsigned char *b = p;
	printf("%s %p ", name, p);
	for (int i = 0; i < 16; i++)
		printf("%02x", b[i]);
	printf("\n");
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	caller();
	asm_nosize();
	void *heap = malloc(64);
	printf("target_fn %p\n", (void *)target_fn);
	printf("after_asm %p\n", (void *)after_asm);
	printf("asm_nosize %p\n", (void *)asm_nosize);
	printf("recorded_ret %p\n", recorded_ret);
	printf("vma_lock %p\n", (void *)&vma_lock);
	printf("big_table %p\n", (void *)big_table);
	printf("heap %p\n", heap);
	print_bytes("malloc", (void *)malloc);
	print_bytes("pthread_mutex_lock", (void *)pthread_mutex_lock);
	printf("ready\n");

	char cmd[64];
	void *h = NULL, *plug_page = NULL;
	while (fgets(cmd, sizeof cmd, stdin)) {
		if (strncmp(cmd, "dlclose", 7) == 0 && h) {
			dlclose(h);
			h = NULL;
			printf("ready\n");
		} else if (strncmp(cmd, "cover", 5) == 0 && plug_page) {
			/* Anonymous memory where the unloaded library's code was. */
			void *p = mmap(plug_page, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			if (p == MAP_FAILED)
				printf("error mmap %p\n", plug_page);
			printf("ready\n");
		} else if (strncmp(cmd, "dlopen", 6) == 0 && argc > 1) {
			h = dlopen(argv[1], RTLD_NOW);
			if (!h) {
				printf("error %s\n", dlerror());
				continue;
			}
			printf("plug_fn %p\n", dlsym(h, "plug_fn"));
			plug_page = (void *)((unsigned long)dlsym(h, "plug_fn") & ~4095UL);
			printf("plug_lock %p\n", dlsym(h, "plug_lock_addr") ? ((void *(*)(void))dlsym(h, "plug_lock_addr"))() : NULL);
			printf("ready\n");
		}
	}
	pthread_mutex_lock(&vma_lock);
	pthread_mutex_unlock(&vma_lock);
	free(heap);
	return after_asm(counter) + big_table[0];
}
