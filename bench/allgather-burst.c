/*
 * allgather-burst.c - a burst of small allgathers through hvd, against the
 * same allgathers one MPI_Allgatherv each (plus the MPI_Allgather of the
 * row counts that a real program needs when ranks' rows differ): what
 * fusing them into one MPI_Allgatherv (lib/ops/mpi_ops.c) buys.
 *
 *   mpicc -O2 -Iinclude bench/allgather-burst.c -Llib/.libs -lhvd \
 *     -o /tmp/allgather-burst
 *   LD_LIBRARY_PATH=lib/.libs mpirun -np 2 /tmp/allgather-burst [N [W [I]]]
 *
 * N tensors (default 64) of rank + 1 rows of W float32 (default 16),
 * submitted with hvd_allgather_async and then waited for, I iterations
 * (default 200, 10 warm-up) with a barrier before each; the median of the
 * slowest rank's time. Every result is checked. Rank 0 prints one line.
 */
#include "hvd.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64, w = argc > 2 ? atoi(argv[2]) : 16;
  int iters = argc > 3 ? atoi(argv[3]) : 200, warm = 10, bad = 0;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  int rank = hvd_rank(), size = hvd_size(), rows = rank + 1, total = 0;
  for (int q = 0; q < size; q++)
    total += q + 1;
  float *send = malloc(sizeof *send * (size_t)(n * rows * w));
  float *recv = malloc(sizeof *recv * (size_t)(total * w));
  int *counts = malloc(sizeof *counts * (size_t)size);
  int *displs = malloc(sizeof *displs * (size_t)size);
  hvd_request_t **req = malloc(sizeof *req * (size_t)n);
  hvd_tensor_t *out = malloc(sizeof *out * (size_t)n);
  double *t = malloc(sizeof *t * (size_t)iters);
  char name[32];
  for (int i = 0; i < n * rows * w; i++)
    send[i] = (float)(rank * 1000 + i);
  for (int m = 0; m < 2; m++) {
    for (int k = -warm; k < iters; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      if (m == 0) {
        for (int i = 0; i < n; i++) {
          int64_t shape[2] = {rows, w};
          hvd_tensor_t s = hvd_tensor_make(send + (size_t)i * rows * w,
                                           HVD_FLOAT32, 2, shape);
          snprintf(name, sizeof name, "burst.%d", i);
          if (hvd_allgather_async(name, &s, &out[i], &req[i]) != HVD_SUCCESS)
            bad++;
        }
        for (int i = 0; i < n; i++) {
          bad += hvd_wait(req[i]) != HVD_SUCCESS || out[i].shape[0] != total;
          bad += ((float *)out[i].data)[0] != (float)(i * 1 * w);
          hvd_tensor_free(&out[i]);
        }
      } else {
        for (int i = 0; i < n; i++) {
          int mine = rows * w;
          MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
          for (int q = 0, at = 0; q < size; q++)
            displs[q] = at, at += counts[q];
          MPI_Allgatherv(send + (size_t)i * rows * w, mine, MPI_FLOAT, recv,
                         counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
          bad += recv[0] != (float)(i * 1 * w);
        }
      }
      if (k >= 0)
        t[k] = (now() - t0) * 1e6;
    }
    double med = median_max(t, iters);
    if (rank == 0)
      printf("%s: %d allgathers of [rank+1, %d] float32 at np %d: median %.1f "
             "us (%.2f us each)\n",
             m == 0 ? "hvd (async burst)" : "MPI (Allgather + Allgatherv each)",
             n, w, size, med, med / n);
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("results: %s\n", bad ? "WRONG" : "all right");
  hvd_shutdown();
  return bad != 0;
}
