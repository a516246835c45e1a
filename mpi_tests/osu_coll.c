/* Collective latency under Open MPI, written for shmfab's side-by-side
 * comparison (scripts/compare.sh --only coll, `shmfab compare`), the
 * counterpart of examples/coll_bench.rs and printing the same lines:
 *   barrier ranks=N latency_us=US median_us=US
 *   allreduce ranks=N size=S latency_us=US median_us=US
 * (MPI_Barrier; MPI_Allreduce of S/8 doubles, MPI_SUM). As OSU's
 * osu_barrier / osu_allreduce: each rank times ITERS back-to-back calls
 * (a fortieth, at least 20, from 1 MiB up) after a tenth as many warm-up
 * calls; the figure is the mean over ranks of each rank's mean (and of
 * each rank's median). Usage: osu_coll [ITERS [SIZE,SIZE,...]] (default
 * 2000 and 8,1024,1048576). The allreduce result is checked; a mismatch
 * prints "error ..." and exits with status 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Mean over ranks of v, at rank 0. */
static double over_ranks(double v, int n) {
  double s = 0;
  MPI_Reduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  return s / n;
}

/* Mean and median of lat[0..k) in *mean, *med. */
static void stats(double *lat, int k, double *mean, double *med) {
  double s = 0;
  for (int i = 0; i < k; i++) s += lat[i];
  *mean = s / k;
  qsort(lat, k, sizeof *lat, cmp);
  *med = lat[k / 2];
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  if (iters < 1) iters = 1;
  const char *list = argc > 2 ? argv[2] : "8,1024,1048576";
  double *lat = malloc(sizeof(double) * (iters + 1));
  double mean, med;
  for (int i = 0; i < iters / 10; i++) MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < iters; i++) {
    double t = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    lat[i] = (MPI_Wtime() - t) * 1e6;
  }
  stats(lat, iters, &mean, &med);
  mean = over_ranks(mean, n);
  med = over_ranks(med, n);
  if (rank == 0) printf("barrier ranks=%d latency_us=%.3f median_us=%.3f\n", n, mean, med);
  char *sizes = strdup(list);
  for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
    long size = atol(tok);
    long cnt = (size + 7) / 8;
    if (cnt < 1) cnt = 1;
    double *send = malloc(cnt * sizeof(double)), *recv = malloc(cnt * sizeof(double));
    for (long k = 0; k < cnt; k++) send[k] = (double)(k % 17);
    int it = size >= (1 << 20) ? (iters / 40 > 20 ? iters / 40 : 20) : iters;
    if (it > iters) it = iters;
    for (int i = 0; i < it / 10 + 1; i++)
      MPI_Allreduce(send, recv, (int)cnt, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < it; i++) {
      double t = MPI_Wtime();
      MPI_Allreduce(send, recv, (int)cnt, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      lat[i] = (MPI_Wtime() - t) * 1e6;
    }
    for (long k = 0; k < cnt; k++) {
      if (recv[k] != (double)(k % 17) * n) {
        fprintf(stderr, "error rank %d: allreduce of %ld B, element %ld is %g\n", rank, size, k, recv[k]);
        return 1;
      }
    }
    stats(lat, it, &mean, &med);
    mean = over_ranks(mean, n);
    med = over_ranks(med, n);
    if (rank == 0) printf("allreduce ranks=%d size=%ld latency_us=%.3f median_us=%.3f\n", n, cnt * 8, mean, med);
    free(send);
    free(recv);
  }
  free(sizes);
  free(lat);
  MPI_Finalize();
  return 0;
}
