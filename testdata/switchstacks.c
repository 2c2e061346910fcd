/* Probed functions whose thread leaves them other ways than by returning
 * in order: two user-level contexts (swapcontext, as Argobots, Qthreads
 * and Boost.Context do) each enter coro_step and switch out, and the
 * first one entered returns first; then leave_by_jump is left by longjmp
 * more times than the recorder keeps return addresses, and plain_step
 * must still be seen returning after.
 *
 *   switchstacks [JUMPS [nocoro]]     JUMPS default 100; nocoro: no contexts
 *
 * The kernel's uretprobes (the eBPF recorder's exits) cannot follow a
 * thread onto another stack: it kills the program with SIGILL. nocoro
 * leaves the contexts out for it.
 */
#include <string.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

static ucontext_t main_ctx, a_ctx, b_ctx;
static char a_stack[256 << 10] __attribute__((aligned(16)));
static char b_stack[256 << 10] __attribute__((aligned(16)));

__attribute__((noinline)) int coro_step(ucontext_t *self, int v)
{
	swapcontext(self, &main_ctx);
	return v + 1;
}

static void run_a(void)
{
	printf("a %d\n", coro_step(&a_ctx, 10));
}

static void run_b(void)
{
	printf("b %d\n", coro_step(&b_ctx, 20));
}

static void start(ucontext_t *c, char *stack, size_t size, void (*fn)(void))
{
	getcontext(c);
	c->uc_stack.ss_sp = stack;
	c->uc_stack.ss_size = size;
	c->uc_link = &main_ctx;
	makecontext(c, fn, 0);
}

static jmp_buf back;

__attribute__((noinline)) void leave_by_jump(int i)
{
	longjmp(back, i + 1);
}

__attribute__((noinline)) int plain_step(int v)
{
	__asm__ volatile("" ::: "memory");
	return v * 2;
}

int main(int argc, char **argv)
{
	int jumps = argc > 1 ? atoi(argv[1]) : 100;
	if (argc < 3 || strcmp(argv[2], "nocoro") != 0) {
		start(&a_ctx, a_stack, sizeof(a_stack), run_a);
		start(&b_ctx, b_stack, sizeof(b_stack), run_b);
		swapcontext(&main_ctx, &a_ctx); /* a enters coro_step, switches out */
		swapcontext(&main_ctx, &b_ctx); /* b enters coro_step, switches out */
		swapcontext(&main_ctx, &a_ctx); /* a returns first: not the newest entry */
		swapcontext(&main_ctx, &b_ctx);
	}

	volatile int left = 0;
	if (setjmp(back) < jumps) {
		if (left < jumps) {
			left++;
			leave_by_jump(left - 1);
		}
	}
	int sum = 0;
	for (int i = 0; i < 5; i++)
		sum += plain_step(i);
	printf("jumped %d, sum %d\n", left, sum);
	return 0;
}
