/* A function called with every signal blocked, as a runtime's memory hook
 * is when glibc's thread exit (all signals blocked) calls madvise on the
 * thread's stack: an int3 there cannot reach a handler, and the kernel
 * kills the process with SIGTRAP. */
#include <signal.h>
#include <stdio.h>

__attribute__((noinline)) int release_hook(int x)
{
	return x * 3 + 1;
}

int main(void)
{
	int sum = release_hook(1);
	sigset_t all;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, NULL);
	sum += release_hook(2);
	printf("sum %d\n", sum);
	return 0;
}
