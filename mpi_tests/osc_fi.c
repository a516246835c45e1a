/* Open MPI's one-sided MPI over shmfab's libfabric provider: run under
 * mpirun with `--mca osc rdma --mca btl ofi,vader,self --mca osc_rdma_btls
 * ofi --mca btl_ofi_provider_include shmfab` and FI_PROVIDER_PATH naming
 * the provider (scripts/mpi-tests.sh does). Open MPI's osc rdma reaches a
 * window made with MPI_Win_create (malloc'd memory, not shared) through
 * its btl's RDMA calls, here btl ofi, which registers the window with
 * fi_mr_reg and moves data with fi_write, fi_read and the fetch atomics.
 *
 * Every rank, on every other rank's window, in a passive-target epoch
 * (MPI_Win_lock_all): puts of a pattern (8 B to 64 KiB) each flushed and
 * read back with MPI_Get; MPI_Fetch_and_op (sum) on a word of rank 0 by
 * all ranks, the total checked; MPI_Accumulate (sum) into a word of each
 * rank. A mismatch prints "error ..." and exits with status 1. Not
 * MPI_Compare_and_swap: Open MPI 4.1's btl ofi dereferences the local
 * registration handle osc rdma passes it as NULL there
 * (mca_btl_ofi_acswap: `local_handle->desc`) and crashes, whatever the
 * provider.
 *
 * With SHMFAB_REGIONS=named, each rank also checks that the provider made
 * its RMA file in the shared memory directory (`shmfab.<uid>.<job>.<token>
 * .rma`, made when memory is first registered for remote access), so a
 * run through another path (vader, or osc rdma's own shared memory)
 * cannot pass for one through shmfab. */
#include <dirent.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WIN_BYTES (1 << 20)
#define DATA_OFF 4096 /* bytes 0..4095: words for the atomics */

static int rank, nranks;

static void fail(const char *what, long a, long b)
{
	printf("error rank %d: %s (%ld, expected %ld)\n", rank, what, a, b);
	fflush(stdout);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pattern(int from, int to, size_t i, size_t size)
{
	return (unsigned char)(from * 31 + to * 7 + i * 13 + size);
}

/* RMA files of this user in the shared memory directory. */
static int rma_files(void)
{
	char prefix[64];
	const char *dir = getenv("SHMFAB_SHM_DIR") ? getenv("SHMFAB_SHM_DIR") : "/dev/shm";
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	snprintf(prefix, sizeof(prefix), "shmfab.%u.", (unsigned)getuid());
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (!strncmp(e->d_name, prefix, strlen(prefix)) && l > 4 && !strcmp(e->d_name + l - 4, ".rma"))
			n++;
	}
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	unsigned char *base = calloc(1, WIN_BYTES), *back = malloc(65536), *src = malloc(65536);
	MPI_Win w;
	if (!base || !back || !src)
		fail("malloc", 0, 1);
	MPI_Win_create(base, WIN_BYTES, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &w);
	MPI_Win_lock_all(0, w);

	/* Puts and gets of every size to every other rank's window, at an
	 * offset of its own per sender. */
	static const size_t sizes[] = { 8, 100, 4096, 65536 };
	for (int p = 0; p < nranks; p++) {
		if (p == rank)
			continue;
		for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
			size_t size = sizes[k];
			MPI_Aint off = DATA_OFF + (MPI_Aint)rank * 65536 * 2;
			if (off + (MPI_Aint)size > WIN_BYTES)
				fail("window too small for this many ranks", (long)off, WIN_BYTES);
			for (size_t i = 0; i < size; i++)
				src[i] = pattern(rank, p, i, size);
			MPI_Put(src, (int)size, MPI_BYTE, p, off, (int)size, MPI_BYTE, w);
			MPI_Win_flush(p, w);
			memset(back, 0, size);
			MPI_Get(back, (int)size, MPI_BYTE, p, off, (int)size, MPI_BYTE, w);
			MPI_Win_flush(p, w);
			for (size_t i = 0; i < size; i++)
				if (back[i] != src[i])
					fail("get after put: byte differs", (long)i, (long)size);
		}
	}

	/* Fetch-and-add on rank 0's word 0 by every rank, 500 times each:
	 * every old value is below the total, and the total is exact. */
	const int adds = 500;
	uint64_t one = 1, old = 0, prev = 0;
	for (int i = 0; i < adds; i++) {
		MPI_Fetch_and_op(&one, &old, MPI_UINT64_T, 0, 0, MPI_SUM, w);
		MPI_Win_flush(0, w);
		if (old >= (uint64_t)adds * nranks || (i > 0 && old <= prev))
			fail("fetch-and-add: old value out of order", (long)old, (long)prev);
		prev = old;
	}
	/* Accumulate (sum) of rank+1 into word 1 of every rank. */
	for (int p = 0; p < nranks; p++) {
		uint64_t v = (uint64_t)rank + 1;
		MPI_Accumulate(&v, 1, MPI_UINT64_T, p, 8, 1, MPI_UINT64_T, MPI_SUM, w);
		MPI_Win_flush(p, w);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	uint64_t total = 0;
	MPI_Fetch_and_op(&one, &total, MPI_UINT64_T, 0, 0, MPI_NO_OP, w);
	MPI_Win_flush(0, w);
	if (total != (uint64_t)adds * nranks)
		fail("fetch-and-add total", (long)total, (long)adds * nranks);
	uint64_t acc = 0;
	MPI_Fetch_and_op(&one, &acc, MPI_UINT64_T, rank, 8, MPI_NO_OP, w);
	MPI_Win_flush(rank, w);
	if (acc != (uint64_t)nranks * (nranks + 1) / 2)
		fail("accumulate total", (long)acc, (long)nranks * (nranks + 1) / 2);

	if (getenv("SHMFAB_REGIONS") && !strcmp(getenv("SHMFAB_REGIONS"), "named")) {
		int n = rma_files();
		if (n < nranks)
			fail("shmfab RMA files in the shared memory directory", n, nranks);
	}
	MPI_Win_unlock_all(w);
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Win_free(&w);
	if (rank == 0)
		printf("osc_fi: %d ranks, puts/gets 8 B-64 KiB, %d fetch-adds each, accumulate: ok\n",
		       nranks, adds);
	free(base);
	free(back);
	free(src);
	MPI_Finalize();
	return 0;
}
