/* An MPI program for the parallel-launch test: in every rank, main takes
 * table_lock then queue_lock and a worker thread takes them the other way
 * round (a lock-order inversion per rank), then the ranks pass a token
 * around a ring. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg)
{
	(void)arg;
	/* queue, then table: the reverse of main's order. */
	pthread_mutex_lock(&queue_lock);
	pthread_mutex_lock(&table_lock);
	void *p = malloc(512);
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&queue_lock);
	free(p);
	return NULL;
}

int main(int argc, char **argv)
{
	int rank, size, token = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);

	pthread_mutex_lock(&table_lock);
	pthread_mutex_lock(&queue_lock);
	void *p = malloc(256);
	pthread_mutex_unlock(&queue_lock);
	pthread_mutex_unlock(&table_lock);
	free(p);

	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);

	if (size > 1) {
		if (rank == 0) {
			token = 42;
			MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(&token, 1, MPI_INT, size - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(&token, 1, MPI_INT, rank - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 0, MPI_COMM_WORLD);
		}
	}
	printf("rank %d of %d token %d\n", rank, size, token);
	MPI_Finalize();
	return 0;
}
