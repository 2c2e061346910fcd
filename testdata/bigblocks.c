/* Allocates and frees 7 blocks above glibc's mmap threshold, from a
 * function of its own: each is one mmap inside malloc and one munmap
 * inside free, made by glibc itself, through no PLT. The threshold is set
 * so that glibc does not raise it after the first free. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

/* The blocks pass through here, so the compiler keeps the calls. */
char *volatile last_block;

__attribute__((noinline)) static void map_blocks(void)
{
	for (int i = 0; i < 7; i++) {
		char *p = malloc(1 << 20);
		memset(p, 1, 64);
		last_block = p;
		free(last_block);
	}
}

int main(void)
{
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
	map_blocks();
	return 0;
}
