/* The UPC++ progress-level bug in miniature: verify_segment is documented
 * to make only internal progress, but its wait loop calls progress_user,
 * which runs user RPCs, one of which uses a segment not registered yet.
 * With "fixed" as argument the wait uses progress_internal. */
#include <stdio.h>
#include <string.h>

static volatile int segment_registered, rpcs_run;

__attribute__((noinline)) void run_user_rpcs(void)
{
	rpcs_run++;
}

__attribute__((noinline)) void progress_user(void)
{
	run_user_rpcs();
}

__attribute__((noinline)) void progress_internal(void)
{
	__asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void verify_segment(int fixed)
{
	for (int i = 0; i < 3; i++) {
		if (fixed)
			progress_internal();
		else
			progress_user();
	}
	segment_registered = 1;
}

int main(int argc, char **argv)
{
	int fixed = argc > 1 && strcmp(argv[1], "fixed") == 0;
	verify_segment(fixed);
	progress_user();
	fprintf(stderr, "rpcs %d\n", rpcs_run);
	return 0;
}
