/* Open MPI's two-sided MPI over shmfab's libfabric provider: run under
 * mpirun with `--mca pml ob1 --mca btl ofi,self --mca btl_ofi_mode 2
 * --mca btl_ofi_provider_include shmfab` and FI_PROVIDER_PATH naming the
 * provider (scripts/mpi-tests.sh does). With `btl ofi,self` the only way
 * between two ranks is Open MPI's btl ofi, here over shmfab: its sends ask
 * FI_DELIVERY_COMPLETE.
 *
 * Every rank: a ring of MPI_Sendrecv of each size (0 B to 1 MiB), blocking
 * MPI_Send/MPI_Recv ping-pongs with rank 0, MPI_Isend to every rank with
 * MPI_Irecv from MPI_ANY_SOURCE (tags matched, sources checked), then
 * MPI_Allreduce and MPI_Barrier (built on the point-to-point path). Every
 * byte received is checked; a mismatch prints "error ..." and exits with
 * status 1. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

static void fail(const char *what, long a, long b)
{
	printf("error rank %d: %s (%ld, expected %ld)\n", rank, what, a, b);
	fflush(stdout);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pattern(int from, int to, size_t i, size_t size, int round)
{
	return (unsigned char)(from * 31 + to * 7 + i * 13 + size + round * 5);
}

static void fill(unsigned char *b, int from, int to, size_t size, int round)
{
	for (size_t i = 0; i < size; i++)
		b[i] = pattern(from, to, i, size, round);
}

static void check(const unsigned char *b, int from, int to, size_t size, int round, const char *what)
{
	for (size_t i = 0; i < size; i++)
		if (b[i] != pattern(from, to, i, size, round))
			fail(what, (long)i, (long)size);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	static const size_t sizes[] = { 0, 8, 1000, 4096, 65536, 1 << 20 };
	enum { MAX = 1 << 20 };
	unsigned char *s = malloc(MAX), *r = malloc(MAX);
	if (!s || !r)
		fail("malloc", 0, 1);
	int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];
		MPI_Status st;
		int got;
		/* Ring. */
		fill(s, rank, right, n, (int)k);
		memset(r, 0, n);
		MPI_Sendrecv(s, (int)n, MPI_BYTE, right, 10 + (int)k, r, (int)n, MPI_BYTE, left, 10 + (int)k,
			     MPI_COMM_WORLD, &st);
		MPI_Get_count(&st, MPI_BYTE, &got);
		if (got != (int)n)
			fail("sendrecv: count", got, (long)n);
		check(r, left, rank, n, (int)k, "sendrecv: byte differs");
		/* Ping-pong with rank 0, a few rounds. */
		for (int round = 0; round < 5; round++) {
			if (rank == 0) {
				for (int p = 1; p < nranks; p++) {
					fill(s, 0, p, n, round);
					MPI_Send(s, (int)n, MPI_BYTE, p, 1, MPI_COMM_WORLD);
					MPI_Recv(r, (int)n, MPI_BYTE, p, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					check(r, p, 0, n, round, "pong: byte differs");
				}
			} else {
				MPI_Recv(r, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check(r, 0, rank, n, round, "ping: byte differs");
				fill(s, rank, 0, n, round);
				MPI_Send(s, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
			}
		}
	}

	/* Non-blocking to every rank, received from any source. */
	enum { SZ = 3000 };
	unsigned char *out = malloc((size_t)SZ * nranks), *in = malloc((size_t)SZ * nranks);
	MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * nranks);
	int *seen = calloc(nranks, sizeof(int));
	for (int p = 0; p < nranks; p++) {
		MPI_Irecv(in + (size_t)p * SZ, SZ, MPI_BYTE, MPI_ANY_SOURCE, 77, MPI_COMM_WORLD, &req[p]);
	}
	for (int p = 0; p < nranks; p++) {
		fill(out + (size_t)p * SZ, rank, p, SZ, 9);
		MPI_Isend(out + (size_t)p * SZ, SZ, MPI_BYTE, p, 77, MPI_COMM_WORLD, &req[nranks + p]);
	}
	MPI_Status *sts = malloc(sizeof(MPI_Status) * 2 * nranks);
	MPI_Waitall(2 * nranks, req, sts);
	for (int p = 0; p < nranks; p++) {
		int from = sts[p].MPI_SOURCE;
		if (from < 0 || from >= nranks || seen[from]++)
			fail("any-source: source", from, p);
		check(in + (size_t)p * SZ, from, rank, SZ, 9, "any-source: byte differs");
	}

	long v = rank + 1, sum = 0;
	MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (sum != (long)nranks * (nranks + 1) / 2)
		fail("allreduce", sum, (long)nranks * (nranks + 1) / 2);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("p2p_fi: %d ranks, 0 B-1 MiB sendrecv ring and ping-pongs, any-source isends, allreduce: ok\n",
		       nranks);
	free(s);
	free(r);
	free(out);
	free(in);
	free(req);
	free(seen);
	free(sts);
	MPI_Finalize();
	return 0;
}
