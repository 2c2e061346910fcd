/* Probed functions whose exits are not where they were entered:
 *
 * - ult_step, which a user-level thread enters on one thread and returns
 *   from on another, as Argobots and Qthreads move their threads between
 *   workers: each round, a context enters it on one thread and switches
 *   back to that thread's scheduler; another thread resumes it, and it
 *   returns there;
 * - tail_outer, which tail-calls tail_inner (a jmp): both return at once,
 *   through the one return address.
 *
 *   migrate [ROUNDS [nomigrate]]     ROUNDS default 20
 *
 * The kernel's uretprobes (the eBPF recorder's exits) cannot follow a
 * function to another thread (nomigrate leaves ult_step out for it); the
 * preloaded recorder's exits can.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

static ucontext_t ult, sched1, sched2;
int tail_outer(int v);
static char stack[256 << 10] __attribute__((aligned(16)));
static int round_no, sum;

__attribute__((noinline)) int ult_step(int v)
{
	swapcontext(&ult, &sched1); /* suspended here on the first thread */
	return v + 1;               /* resumed on the second */
}

static void body(void)
{
	sum += ult_step(round_no);
}

__attribute__((noinline)) int tail_inner(int v)
{
	return v * 2;
}

/* int tail_outer(int v) { return tail_inner(v + 1); }, as a tail call
 * whatever the optimisation level. */
__asm__(".text\n"
	".globl tail_outer\n"
	".type tail_outer,@function\n"
	"tail_outer:\n"
	"\tadd $1, %edi\n"
	"\tjmp tail_inner\n"
	".size tail_outer, .-tail_outer\n");

static sem_t suspended, resumed;

/* The first thread starts the context, which suspends inside ult_step;
 * once the second thread has finished it, the first calls tail_outer: a
 * rule "ult_step > tail_inner" must not see ult_step still running here. */
static void *first(void *arg)
{
	int *tails = arg;
	getcontext(&ult);
	ult.uc_stack.ss_sp = stack;
	ult.uc_stack.ss_size = sizeof(stack);
	ult.uc_link = &sched2; /* where body ends: the second thread */
	makecontext(&ult, body, 0);
	swapcontext(&sched1, &ult);
	sem_post(&suspended);
	sem_wait(&resumed);
	*tails += tail_outer(round_no);
	return NULL;
}

static void *second(void *arg)
{
	(void)arg;
	sem_wait(&suspended);
	swapcontext(&sched2, &ult);
	sem_post(&resumed);
	return NULL;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	int tails = 0;
	for (int i = 0; i < rounds; i++)
		tails += tail_outer(i);
	printf("tail calls %d, sum %d\n", rounds, tails);
	if (argc > 2 && strcmp(argv[2], "nomigrate") == 0)
		return 0;
	sem_init(&suspended, 0, 0);
	sem_init(&resumed, 0, 0);
	tails = 0;
	for (round_no = 0; round_no < rounds; round_no++) {
		pthread_t t1, t2;
		pthread_create(&t1, NULL, first, &tails);
		pthread_create(&t2, NULL, second, NULL);
		pthread_join(t1, NULL);
		pthread_join(t2, NULL);
	}
	printf("migrated %d, sum %d, tail calls after %d\n", rounds, sum, tails);
	return 0;
}
