/* The way runtimes patch libc's memory entry points (Open MPI's patcher,
 * UCX's bistro mode), for the test programs that need it: included, not
 * built alone. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Overwrites fn's first 13 bytes with movabs $hook,%r11; jmp *%r11. */
static void patch(void *fn, void *hook)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)fn & ~(uintptr_t)(page - 1);
	mprotect((void *)start, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC);
	unsigned char code[13] = {0x49, 0xbb};
	uint64_t target = (uint64_t)hook;
	memcpy(code + 2, &target, 8);
	code[10] = 0x41, code[11] = 0xff, code[12] = 0xe3;
	memcpy(fn, code, sizeof code);
	mprotect((void *)start, 2 * page, PROT_READ | PROT_EXEC);
}
