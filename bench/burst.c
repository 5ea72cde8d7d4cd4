/*
 * burst.c - a burst of small allgathers or reducescatters through hvd,
 * against the same collectives through MPI one tensor at a time: what
 * fusing them (lib/ops/mpi_ops.c: one MPI_Allgatherv, one
 * MPI_Reduce_scatter) buys.
 *
 *   mpicc -O2 -Iinclude bench/burst.c -Llib/.libs -lhvd -o /tmp/burst
 *   LD_LIBRARY_PATH=lib/.libs mpirun -np 2 /tmp/burst COLL [N [W [I]]]
 *
 * COLL allgather: N tensors (default 64) of rank + 1 rows of W float32
 * (default 16); MPI's way is an MPI_Allgather of the row counts (which a
 * program whose ranks' rows differ needs) and an MPI_Allgatherv each.
 * COLL reducescatter: N tensors of 2P + 1 rows of W float32, summed;
 * MPI's way is one MPI_Reduce_scatter each (what ZeRO-1 does per
 * parameter). Submitted with the _async call and then waited for, I
 * iterations (default 200, 10 warm-up) with a barrier before each; the
 * median of the slowest rank's time. Every result is checked. Rank 0
 * prints one line per way.
 */
#include "hvd.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of the slowest rank's times (t[0..n) is overwritten). */
static double median_max(double *t, int n) {
  MPI_Allreduce(MPI_IN_PLACE, t, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  qsort(t, (size_t)n, sizeof *t, cmp);
  return t[n / 2];
}

static int rank, size, n, w, rs; /* rs: reducescatter, else allgather */
static int rows, total;          /* rows sent; an allgather's rows back */
static float *send, *recv;
static int *counts, *displs;

/* Element 0 of tensor i's result, as it must be. */
static float want0(int i) {
  if (!rs) /* rank 0's, which sends 1 row a tensor */
    return (float)(i * w);
  float s = 0; /* block `rank` starts at row first(rank) */
  int first = rank * (rows / size) + (rank < rows % size ? rank : rows % size);
  for (int q = 0; q < size; q++)
    s += (float)(q * 1000 + i * rows * w + first * w);
  return s;
}

static int hvd_burst(hvd_request_t **req, hvd_tensor_t *out) {
  int bad = 0;
  char name[32];
  for (int i = 0; i < n; i++) {
    int64_t shape[2] = {rows, w};
    hvd_tensor_t s =
        hvd_tensor_make(send + (size_t)i * rows * w, HVD_FLOAT32, 2, shape);
    snprintf(name, sizeof name, "burst.%d", i);
    hvd_result_t rc =
        rs ? hvd_reducescatter_async(name, &s, &out[i], HVD_SUM, 1, 1, &req[i])
           : hvd_allgather_async(name, &s, &out[i], &req[i]);
    bad += rc != HVD_SUCCESS;
  }
  for (int i = 0; i < n; i++) {
    int64_t want = rs ? rows / size + (rank < rows % size) : total;
    bad += hvd_wait(req[i]) != HVD_SUCCESS || out[i].shape[0] != want;
    bad += ((float *)out[i].data)[0] != want0(i);
    hvd_tensor_free(&out[i]);
  }
  return bad;
}

static int mpi_each(void) {
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const float *mine = send + (size_t)i * rows * w;
    if (rs) {
      MPI_Reduce_scatter(mine, recv, counts, MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
    } else {
      int cnt = rows * w;
      MPI_Allgather(&cnt, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
      for (int q = 0, at = 0; q < size; q++)
        displs[q] = at, at += counts[q];
      MPI_Allgatherv(mine, cnt, MPI_FLOAT, recv, counts, displs, MPI_FLOAT,
                     MPI_COMM_WORLD);
    }
    bad += recv[0] != want0(i);
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "allgather") != 0 &&
                   strcmp(argv[1], "reducescatter") != 0)) {
    fprintf(stderr, "usage: burst allgather|reducescatter [N [W [I]]]\n");
    return 2;
  }
  rs = strcmp(argv[1], "reducescatter") == 0;
  n = argc > 2 ? atoi(argv[2]) : 64, w = argc > 3 ? atoi(argv[3]) : 16;
  int iters = argc > 4 ? atoi(argv[4]) : 200, warm = 10, bad = 0;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  rank = hvd_rank(), size = hvd_size();
  rows = rs ? 2 * size + 1 : rank + 1;
  for (int q = 0; q < size; q++)
    total += q + 1;
  send = malloc(sizeof *send * (size_t)(n * rows * w));
  recv = malloc(sizeof *recv * (size_t)((rs ? rows : total) * w));
  counts = malloc(sizeof *counts * (size_t)size);
  displs = malloc(sizeof *displs * (size_t)size);
  hvd_request_t **req = malloc(sizeof *req * (size_t)n);
  hvd_tensor_t *out = malloc(sizeof *out * (size_t)n);
  double *t = malloc(sizeof *t * (size_t)iters);
  for (int i = 0; i < n * rows * w; i++)
    send[i] = (float)(rank * 1000 + i);
  for (int q = 0; rs && q < size; q++)
    counts[q] = (rows / size + (q < rows % size)) * w;
  for (int m = 0; m < 2; m++) {
    for (int k = -warm; k < iters; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      bad += m == 0 ? hvd_burst(req, out) : mpi_each();
      if (k >= 0)
        t[k] = (now() - t0) * 1e6;
    }
    double med = median_max(t, iters);
    if (rank == 0)
      printf("%s: %d %ss of [%s, %d] float32 at np %d: median %.1f us "
             "(%.2f us each)\n",
             m == 0 ? "hvd (async burst)"
             : rs   ? "MPI (Reduce_scatter each)"
                    : "MPI (Allgather + Allgatherv each)",
             n, argv[1], rs ? "2 size + 1" : "rank + 1", w, size, med, med / n);
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("results: %s\n", bad ? "WRONG" : "all right");
  hvd_shutdown();
  return bad != 0;
}
