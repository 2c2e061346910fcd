// capture records a user stack sample the way the tracer's BPF side does:
// rip, rsp and rbp at one point inside a function plus a copy of the stack
// from rsp upward. It prints the sample, the addresses of its functions and
// its memory map so the Go test can unwind the sample offline.
//
// "direct" samples inside c() on the chain main -> a -> b -> c.
// "qsort" samples inside a comparator called by glibc's qsort, so the chain
// main -> sort_caller -> qsort internals -> compare crosses glibc.
// "signal" samples inside a signal handler, so the chain
// main -> signal_caller -> raise -> (signal frame) -> on_signal crosses
// glibc's signal trampoline.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STACK_COPY 8192

static uint64_t sample_ip, sample_sp, sample_bp;
static unsigned char sample_stack[STACK_COPY];
static size_t sample_len;
static int sampled;
volatile int sink;

// stack_end returns the end of the mapping containing addr, so the copy
// never reads past the top of the stack.
static uint64_t stack_end(uint64_t addr) {
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	uint64_t end = addr;
	while (f && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= addr && addr < hi) {
			end = hi;
			break;
		}
	}
	if (f)
		fclose(f);
	return end;
}

__attribute__((noipa)) static void save_sample(uint64_t ip, uint64_t sp, uint64_t bp) {
	uint64_t end = stack_end(sp);
	size_t n = end - sp;
	if (n > STACK_COPY)
		n = STACK_COPY;
	sample_ip = ip;
	sample_sp = sp;
	sample_bp = bp;
	memcpy(sample_stack, (void *)sp, n);
	sample_len = n;
	sampled = 1;
}

// SAMPLE reads rip, rsp and rbp in one asm statement, so all three belong
// to the same instruction boundary of the enclosing function.
#define SAMPLE()                                                              \
	do {                                                                  \
		uint64_t ip_, sp_, bp_;                                       \
		__asm__ volatile("lea 0(%%rip), %0\n\t"                       \
				 "mov %%rsp, %1\n\t"                          \
				 "mov %%rbp, %2"                              \
				 : "=&r"(ip_), "=&r"(sp_), "=&r"(bp_));       \
		save_sample(ip_, sp_, bp_);                                   \
	} while (0)

// Every function does work after its call so that no call becomes a tail
// call and every frame stays on the stack.
__attribute__((noipa)) int c(int x) {
	SAMPLE();
	sink = x;
	return x * 7;
}

__attribute__((noipa)) int b(int x) {
	int r = c(x + 1);
	sink = r;
	return r + 3;
}

__attribute__((noipa)) int a(int x) {
	int r = b(x * 2);
	sink = r;
	return r - 1;
}

__attribute__((noipa)) static int compare(const void *p, const void *q) {
	if (!sampled)
		SAMPLE();
	int x = *(const int *)p, y = *(const int *)q;
	return (x > y) - (x < y);
}

__attribute__((noipa)) int sort_caller(int seed) {
	int v[16];
	for (int i = 0; i < 16; i++)
		v[i] = (seed * 7919 + i * 104729) % 1000;
	qsort(v, 16, sizeof v[0], compare);
	sink = v[0];
	return v[15];
}

int main(int argc, char **argv);

__attribute__((noipa)) static void on_signal(int sig) {
	SAMPLE();
	sink = sig;
}

__attribute__((noipa)) int signal_caller(int x) {
	signal(SIGUSR1, on_signal);
	raise(SIGUSR1);
	sink = x;
	return x + 1;
}

static void print_sample(void) {
	printf("ip %lx\nsp %lx\nbp %lx\n", (unsigned long)sample_ip, (unsigned long)sample_sp,
	       (unsigned long)sample_bp);
	printf("func main %lx\nfunc a %lx\nfunc b %lx\nfunc c %lx\n", (unsigned long)&main,
	       (unsigned long)&a, (unsigned long)&b, (unsigned long)&c);
	printf("func sort_caller %lx\nfunc compare %lx\n", (unsigned long)&sort_caller,
	       (unsigned long)&compare);
	printf("func signal_caller %lx\nfunc on_signal %lx\n", (unsigned long)&signal_caller,
	       (unsigned long)&on_signal);
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	while (f && fgets(line, sizeof line, f))
		printf("map %s", line);
	if (f)
		fclose(f);
	printf("stack ");
	for (size_t i = 0; i < sample_len; i++)
		printf("%02x", sample_stack[i]);
	printf("\n");
}

int main(int argc, char **argv) {
	if (argc < 2)
		return 2;
	int r;
	if (strcmp(argv[1], "direct") == 0)
		r = a(argc);
	else if (strcmp(argv[1], "qsort") == 0)
		r = sort_caller(argc);
	else if (strcmp(argv[1], "signal") == 0)
		r = signal_caller(argc);
	else
		return 2;
	if (!sampled)
		return 3;
	print_sample();
	return r == 12345 ? 1 : 0;
}
