/*
 * adasum.c - what HVD_ADASUM costs against HVD_SUM (doc/bench.md,
 * "Adasum"): one grouped allreduce of BERT-base-shaped float32 gradients
 * (the word embeddings, the positions, and 12 layers of four 768 x 768
 * and two 768 x 3072 matrices: 74 tensors, 108.8 M elements, 435 MB),
 * HVD_SUM (postscale 1/2) and HVD_ADASUM alternately, I rounds (default
 * 6, the first a warm-up), a barrier before each; rank 0 prints each
 * round's times and their ratio.
 *
 *   mpicc -O2 -Iinclude bench/adasum.c -Llib/.libs -lhvd -o /tmp/adasum
 *   LD_LIBRARY_PATH=lib/.libs mpirun -np 2 /tmp/adasum [I]
 */
#include "hvd.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define NT 74

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 6;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  static int64_t len[NT];
  static hvd_tensor_t t[NT];
  static char names[2][NT][32];
  int n = 0;
  len[n++] = 30522LL * 768;
  len[n++] = 512 * 768;
  for (int l = 0; l < 12; l++) {
    for (int k = 0; k < 4; k++)
      len[n++] = 768 * 768;
    len[n++] = 768 * 3072;
    len[n++] = 3072 * 768;
  }
  for (int i = 0; i < n; i++) {
    float *p = malloc((size_t)len[i] * sizeof *p);
    if (p == NULL)
      return 1;
    for (int64_t j = 0; j < len[i]; j++)
      p[j] = (float)((j * 7 + i + hvd_rank()) % 13 - 6) * 1e-3f;
    t[i] = hvd_tensor_make(p, HVD_FLOAT32, 1, &len[i]);
  }
  for (int it = 0; it < rounds; it++) {
    double ms[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
      const int ada = (it + k) % 2; /* the order swapped every round */
      const char *nn[NT];
      for (int i = 0; i < n; i++) {
        snprintf(names[ada][i], sizeof names[ada][i], "%s%d.%d",
                 ada ? "adasum" : "sum", it, i);
        nn[i] = names[ada][i];
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (hvd_grouped_allreduce(n, nn, t, t, ada ? HVD_ADASUM : HVD_SUM, 1,
                                ada ? 1 : 1.0 / hvd_size()) != HVD_SUCCESS) {
        fprintf(stderr, "allreduce: %s\n", hvd_last_error());
        return 1;
      }
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      ms[ada] = dt * 1e3;
    }
    if (hvd_rank() == 0 && it > 0)
      printf("round %d: sum %.0f ms, adasum %.0f ms, adasum / sum %.2f\n", it,
             ms[0], ms[1], ms[1] / ms[0]);
  }
  hvd_shutdown();
  return 0;
}
