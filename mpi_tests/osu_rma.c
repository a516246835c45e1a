/* One-sided measurements between two MPI ranks, written for shmfab's
 * side-by-side comparison (scripts/compare.sh, `shmfab compare`), the
 * counterpart of shmfab's own RMA bench (tools/src/bench.rs, Link::rma_*).
 * Rank 0 is the initiator, rank 1 the target; one window from
 * MPI_Win_allocate (4 MiB or the largest size asked, whichever is larger),
 * locked once with MPI_Win_lock_all. For each size in argv[1] (comma
 * separated) rank 0 prints:
 *   put_lat SIZE US     one MPI_Put, then MPI_Win_flush(1): the time until
 *                       the data is in the target's memory; mean over
 *                       rma_iters(SIZE) ops one after another
 *   put_bw  SIZE GB/S   windows of 64 MPI_Put (fewer when rma_iters is
 *                       smaller), one MPI_Win_flush each
 *   put_mops SIZE MOPS  the same run, in millions of operations a second
 *   get_lat, get_bw, get_mops: the same with MPI_Get (flushed: the data
 *                       is in rank 0's buffer)
 * then, once:
 *   fadd_lat 8 US       MPI_Fetch_and_op(MPI_SUM, 8-byte MPI_UINT64_T) on
 *                       rank 1's word by rank 0 alone, each followed by
 *                       MPI_Win_flush(1)
 *   fadd_rate 8 MOPS    both ranks, FADD_OPS each, on that same word at
 *                       once (rank 1 on its own window through MPI too),
 *                       each op flushed: 2 * FADD_OPS / the time between
 *                       two barriers
 * A tenth as many warm-up operations go before each timed run. Every
 * result is checked: rank 1 compares its window with the last put's
 * pattern, rank 0 the data each get brought, and the word's final value
 * and the ascending fetched values of each rank; a mismatch prints
 * "error ..." and exits with status 1. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FADD_OPS 200000L

/* Same as rma_iters in tools/src/bench.rs: about 128 MiB moved per run. */
static long rma_iters(long size) {
    long n = (128L << 20) / (size > 0 ? size : 1);
    return n < 20 ? 20 : (n > 100000 ? 100000 : n);
}

/* Same as bench::payload with a seed: byte i is (i * 7 + 3 + seed). */
static void pattern(unsigned char *p, long n, long seed) {
    for (long i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + 3 + seed);
}

static void fail(const char *what, long size) {
    printf("error %s %ld\n", what, size);
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Latency: `n` ops, each flushed. Returns microseconds per op. */
static double one_by_one(int put, unsigned char *buf, long size, long n, MPI_Win win) {
    double t0 = 0;
    long warm = n / 10 + 1;
    for (long i = 0; i < warm + n; i++) {
        if (i == warm) t0 = MPI_Wtime();
        if (put)
            MPI_Put(buf, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
        else
            MPI_Get(buf, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
        MPI_Win_flush(1, win);
    }
    return (MPI_Wtime() - t0) * 1e6 / n;
}

/* Streaming: `n` ops in windows of `w`, one flush per window. Returns
 * seconds. */
static double streamed(int put, unsigned char *buf, long size, long n, long w, MPI_Win win) {
    double t0 = 0;
    long warm = n / 10 + 1;
    for (int timed = 0; timed < 2; timed++) {
        long todo = timed ? n : warm;
        if (timed) t0 = MPI_Wtime();
        while (todo > 0) {
            long k = todo < w ? todo : w;
            for (long j = 0; j < k; j++) {
                if (put)
                    MPI_Put(buf, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
                else
                    MPI_Get(buf, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
            }
            MPI_Win_flush(1, win);
            todo -= k;
        }
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv) {
    int rank, nranks;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2 || argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 %s SIZE[,SIZE...]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long max = 4L << 20;
    char *list = strdup(argv[1]);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        long sz = atol(tok);
        if (sz > max) max = sz;
    }
    free(list);
    /* The window: the data area, then the fetch-add word on its own line. */
    unsigned char *base;
    MPI_Win win;
    MPI_Aint wlen = (MPI_Aint)max + 64;
    MPI_Win_allocate(wlen, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, (size_t)wlen);
    MPI_Win_lock_all(0, win);
    unsigned char *src = malloc((size_t)max), *dst = malloc((size_t)max);
    unsigned char *want = malloc((size_t)max);
    list = strdup(argv[1]);
    long seed = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        long sz = atol(tok);
        long n = rma_iters(sz), w = n < 64 ? n : 64;
        for (int put = 1; put >= 0; put--) {
            seed++;
            pattern(want, sz, seed);
            if (put) {
                if (rank == 0) memcpy(src, want, (size_t)sz);
            } else if (rank == 1) {
                /* The target's data for the gets, written through the
                 * window (MPI_Win_sync orders it for the other rank). */
                memcpy(base, want, (size_t)sz);
                MPI_Win_sync(win);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0) {
                MPI_Win_sync(win);
                double lat = one_by_one(put, put ? src : dst, sz, n, win);
                if (!put && memcmp(dst, want, (size_t)sz) != 0) fail("get data", sz);
                memset(dst, 0, (size_t)sz);
                double s = streamed(put, put ? src : dst, sz, n, w, win);
                if (!put && memcmp(dst, want, (size_t)sz) != 0) fail("get data", sz);
                const char *op = put ? "put" : "get";
                printf("%s_lat %ld %.6f\n", op, sz, lat);
                printf("%s_bw %ld %.6f\n", op, sz, (double)n * sz / s / 1e9);
                printf("%s_mops %ld %.6f\n", op, sz, (double)n / s / 1e6);
                fflush(stdout);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            if (put && rank == 1) {
                MPI_Win_sync(win);
                if (memcmp(base, want, (size_t)sz) != 0) fail("put data", sz);
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
    free(list);
    /* Fetch-add on rank 1's word (at offset max): rank 0 alone, then both. */
    MPI_Aint word = (MPI_Aint)max;
    uint64_t one = 1, got = 0, prev = 0;
    long lat_n = FADD_OPS / 2, warm = lat_n / 10 + 1;
    uint64_t expect = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        double t0 = 0;
        for (long i = 0; i < warm + lat_n; i++) {
            if (i == warm) t0 = MPI_Wtime();
            MPI_Fetch_and_op(&one, &got, MPI_UINT64_T, 1, word, MPI_SUM, win);
            MPI_Win_flush(1, win);
            if (got != (uint64_t)i) fail("fetch-add value", 8);
        }
        printf("fadd_lat 8 %.6f\n", (MPI_Wtime() - t0) * 1e6 / lat_n);
        fflush(stdout);
    }
    expect = (uint64_t)(warm + lat_n);
    /* Both ranks: a warm-up tenth, a barrier, the timed run, a barrier. */
    double t0 = 0;
    for (int timed = 0; timed < 2; timed++) {
        long n = timed ? FADD_OPS : FADD_OPS / 10;
        MPI_Barrier(MPI_COMM_WORLD);
        if (timed) t0 = MPI_Wtime();
        for (long i = 0; i < n; i++) {
            MPI_Fetch_and_op(&one, &got, MPI_UINT64_T, 1, word, MPI_SUM, win);
            MPI_Win_flush(1, win);
            if (got <= prev) fail("fetch-add order", 8);
            prev = got;
        }
        expect += 2 * (uint64_t)n;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double el = MPI_Wtime() - t0;
    MPI_Fetch_and_op(&one, &got, MPI_UINT64_T, 1, word, MPI_NO_OP, win);
    MPI_Win_flush(1, win);
    if (got != expect) fail("fetch-add total", 8);
    if (rank == 0) {
        printf("fadd_rate 8 %.6f\n", 2.0 * FADD_OPS / el / 1e6);
        fflush(stdout);
    }
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    free(src);
    free(dst);
    free(want);
    MPI_Finalize();
    return 0;
}
