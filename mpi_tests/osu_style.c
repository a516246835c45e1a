/* osu-style point-to-point measurements between two MPI ranks, written for
 * shmfab's side-by-side comparison (scripts/compare.sh). For each size in
 * argv[1] (comma separated) rank 0 prints:
 *   lat  SIZE HALF_RTT_US      ping-pong, MPI_Send/MPI_Recv
 *   bw   SIZE GB_PER_S         window of MPI_Isend, one ack per window
 *   rate SIZE MMSG_PER_S       as bw, window 64 (osu_mbw_mr's default), 2000
 *                              windows (sizes <= 64 only)
 * Same method as shmfab's own bench (src/bench.rs): iterations scaled by
 * size, a tenth of them as warm-up. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long iters_for(long size) {
    long n = 400000000L / (size + 20000);
    return n < 20 ? 20 : (n > 100000 ? 100000 : n);
}

/* Separate send and receive buffers, as osu_latency. */
static double lat(char *sbuf, char *rbuf, long size, int rank) {
    long iters = iters_for(size), warm = iters / 10 + 2;
    double t0 = 0;
    for (long i = 0; i < warm + iters; i++) {
        if (i == warm) t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(sbuf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)size, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)size, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
}

/* Returns seconds for `iters` windows of `window` messages. */
static double stream(char **bufs, long size, int window, long iters, int rank) {
    MPI_Request req[4096];
    char ack[4] = {0};
    long warm = iters / 10 + 1;
    double t0 = 0;
    for (long i = 0; i < warm + iters; i++) {
        if (i == warm) t0 = MPI_Wtime();
        if (rank == 0) {
            for (int w = 0; w < window; w++)
                MPI_Isend(bufs[w], (int)size, MPI_BYTE, 1, 3, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Recv(ack, 4, MPI_BYTE, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < window; w++)
                MPI_Irecv(bufs[w], (int)size, MPI_BYTE, 0, 3, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Send(ack, 4, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2 || argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 %s SIZE[,SIZE...]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    char *list = strdup(argv[1]);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        long sz = atol(tok);
        int window = sz >= (1 << 20) ? 16 : 64;
        char **bufs = malloc(sizeof(char *) * 256);
        for (int w = 0; w < 256; w++) {
            bufs[w] = malloc(sz > 0 ? sz : 1);
            memset(bufs[w], w, sz > 0 ? sz : 1);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double l = lat(bufs[0], bufs[1], sz, rank);
        long it = iters_for(sz) / window;
        if (it < 10) it = 10;
        double s = stream(bufs, sz, window, it, rank);
        double bw = (double)window * it * sz / s / 1e9;
        if (rank == 0) {
            printf("lat %ld %.6f\n", sz, l);
            printf("bw %ld %.6f\n", sz, bw);
        }
        if (sz <= 64) {
            double r = stream(bufs, sz, 64, 2000, rank);
            if (rank == 0) printf("rate %ld %.6f\n", sz, 64.0 * 2000 / r / 1e6);
        }
        fflush(stdout);
        for (int w = 0; w < 256; w++) free(bufs[w]);
        free(bufs);
    }
    free(list);
    MPI_Finalize();
    return 0;
}
