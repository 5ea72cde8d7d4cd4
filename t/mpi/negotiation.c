/*
 * negotiation.c - the negotiation's cost per cycle against world size, for
 * t/mpi/negotiation.sh (doc/scale.md), with t/mpi/mpicount.la preloaded.
 *
 *   negotiation cold|cached|grouped ROUNDS BURST
 *
 * Each round submits BURST one-element float32 allreduces and waits for
 * them. cold: every round's names are new ("cold.R.J"), so each goes
 * through the slow path (gathered to the coordinator, rank 0); cached:
 * the same BURST names every round, agreed once before counting, so each
 * round is the response cache's bit vector only; grouped: as cached, the
 * BURST submitted as one hvd_grouped_allreduce. Counting (MPI_Pcontrol)
 * covers the rounds alone. Rank 0 prints
 *   "np P mode M rounds R burst B seconds S"
 * Exit status: 0; 1 when a collective failed or a sum was wrong.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"

#define MAXB 256

static int round_of(const char *mode, int r, int burst) {
  static float in[MAXB], out[MAXB];
  static char names[MAXB][64];
  hvd_request_t *req[MAXB];
  static hvd_tensor_t s[MAXB], d[MAXB];
  static const char *np[MAXB];
  for (int j = 0; j < burst; j++) {
    in[j] = 1.0f;
    s[j] = hvd_tensor_make(&in[j], HVD_FLOAT32, 0, NULL);
    d[j] = hvd_tensor_make(&out[j], HVD_FLOAT32, 0, NULL);
    if (strcmp(mode, "cold") == 0)
      snprintf(names[j], sizeof names[j], "cold.%d.%d", r, j);
    else
      snprintf(names[j], sizeof names[j], "hot.%d", j);
    np[j] = names[j];
    if (strcmp(mode, "grouped") != 0 &&
        hvd_allreduce_async(np[j], &s[j], &d[j], HVD_SUM, 1.0, 1.0,
                            &req[j]) != HVD_SUCCESS)
      return 0;
  }
  if (strcmp(mode, "grouped") == 0 &&
      hvd_grouped_allreduce_async(burst, np, s, d, HVD_SUM, 1.0, 1.0, req) !=
          HVD_SUCCESS)
    return 0;
  for (int j = 0; j < burst; j++)
    if (hvd_wait(req[j]) != HVD_SUCCESS || out[j] != (float)hvd_size())
      return 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: negotiation cold|cached|grouped ROUNDS BURST\n");
    return 2;
  }
  const char *mode = argv[1];
  int rounds = atoi(argv[2]), burst = atoi(argv[3]);
  if (burst < 1 || burst > MAXB || rounds < 1)
    return 2;
  if (hvd_init() != HVD_SUCCESS)
    return 1;
  if (!round_of(mode, -1, burst) || hvd_barrier() != HVD_SUCCESS)
    return 1;
  MPI_Pcontrol(1);
  double t0 = MPI_Wtime();
  for (int r = 0; r < rounds; r++)
    if (!round_of(mode, r, burst)) {
      fprintf(stderr, "negotiation: rank %d: round %d failed: %s\n",
              hvd_rank(), r, hvd_last_error());
      return 1;
    }
  double t1 = MPI_Wtime();
  MPI_Pcontrol(0);
  if (hvd_rank() == 0)
    printf("np %d mode %s rounds %d burst %d seconds %.4f\n", hvd_size(), mode,
           rounds, burst, t1 - t0);
  hvd_shutdown();
  return 0;
}
