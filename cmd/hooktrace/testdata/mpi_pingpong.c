/* A real MPI job for the end-to-end Open MPI tests: ranks play ping-pong
 * in pairs (0 with 1, 2 with 3, ...), the even one checking what comes
 * back, while an extra thread per rank mallocs and frees blocks whose free
 * makes glibc unmap or madvise memory.
 * Open MPI and UCX patch libc's munmap and madvise so that their memory
 * hooks see those calls (to drop registrations of unmapped memory), so the
 * hooks run inside free, some with the thread's arena lock held:
 *   - a 1 MiB block is above the mmap threshold: free → munmap_chunk →
 *     munmap, no arena lock held;
 *   - the thread allocates from its own (non-main) arena; freeing a run of
 *     96 KiB blocks coalesces them into the top chunk beyond the trim
 *     threshold: free → _int_free → heap_trim → shrink_heap → madvise, with
 *     that arena's lock held.
 *
 * Each even rank plays for the number of seconds given as argv[1], at most
 * 30 s; rank 0 also stops when a line arrives on its stdin (mpirun forwards
 * its own stdin to rank 0). Rank 0 prints its PID first, for a test to
 * attach to it. Each rank prints one line of results. */
#include <malloc.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAYLOAD 4096
#define BLOCKS 8

static atomic_int stop;
static atomic_long churned;
static void *volatile sink;

static void *churn(void *arg)
{
	(void)arg;
	void *p[BLOCKS];
	while (!atomic_load(&stop)) {
		for (int i = 0; i < BLOCKS; i++) {
			p[i] = malloc(96 * 1024);
			memset(p[i], i, 4096);
		}
		for (int i = BLOCKS - 1; i >= 0; i--)
			free(p[i]);
		void *big = malloc(1 << 20);
		memset(big, 1, 4096);
		/* Seen from outside: the compiler may not drop the pair. */
		sink = big;
		free(big);
		atomic_fetch_add(&churned, 1);
		usleep(500);
	}
	return NULL;
}

static void *wait_stdin(void *arg)
{
	(void)arg;
	char line[64];
	/* EOF counts too: a closed stdin stops the play. */
	if (!fgets(line, sizeof line, stdin))
		line[0] = 0;
	atomic_store(&stop, 1);
	return NULL;
}

int main(int argc, char **argv)
{
	int rank, size, provided;
	double seconds = argc > 1 ? atof(argv[1]) : 0;
	if (seconds <= 0 || seconds > 30)
		seconds = 30;

	MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	/* Fixed thresholds: glibc would otherwise raise the mmap threshold
	 * after the first free of a mapped block, and the 1 MiB blocks would
	 * stop being mapped. */
	mallopt(M_MMAP_THRESHOLD, 512 * 1024);
	mallopt(M_TRIM_THRESHOLD, 128 * 1024);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size % 2 != 0) {
		if (rank == 0)
			fprintf(stderr, "run with an even number of ranks, not %d\n", size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	if (rank == 0) {
		printf("rank 0 pid %d\n", (int)getpid());
		fflush(stdout);
	}

	pthread_t churner, waiter;
	pthread_create(&churner, NULL, churn, NULL);
	if (rank == 0 && argc > 2 && strcmp(argv[2], "stdin") == 0)
		pthread_create(&waiter, NULL, wait_stdin, NULL);

	int *buf = malloc(PAYLOAD * sizeof(int));
	long rounds = 0, bad = 0;
	int peer = rank ^ 1, leader = rank % 2 == 0;
	double end = MPI_Wtime() + seconds;
	for (;;) {
		/* The first int says whether to go on: the leader decides. */
		if (leader) {
			int go = !atomic_load(&stop) && MPI_Wtime() < end;
			buf[0] = go;
			for (int i = 1; i < PAYLOAD; i++)
				buf[i] = (int)(rounds + i);
			MPI_Send(buf, PAYLOAD, MPI_INT, peer, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, PAYLOAD, MPI_INT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (int i = 1; i < PAYLOAD; i++)
				if (buf[i] != (int)(rounds + i) + 1)
					bad++;
			if (!go)
				break;
		} else {
			MPI_Recv(buf, PAYLOAD, MPI_INT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (int i = 1; i < PAYLOAD; i++)
				buf[i]++;
			MPI_Send(buf, PAYLOAD, MPI_INT, peer, 0, MPI_COMM_WORLD);
			if (!buf[0])
				break;
		}
		rounds++;
	}
	atomic_store(&stop, 1);
	pthread_join(churner, NULL);
	free(buf);

	if (leader)
		printf("rank %d: %ld round trips, %ld bad values, %ld churns\n", rank, rounds, bad, atomic_load(&churned));
	else
		printf("rank %d: %ld round trips, %ld churns\n", rank, rounds, atomic_load(&churned));
	fflush(stdout);
	MPI_Finalize();
	/* The stdin waiter may still block in fgets: exit ends it. */
	return bad != 0;
}
