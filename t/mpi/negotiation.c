/*
 * negotiation.c - the negotiation's cost per cycle against world size, for
 * t/mpi/negotiation.sh (doc/scale.md), with t/mpi/mpicount.la preloaded.
 *
 *   negotiation cold|cached ROUNDS BURST
 *
 * Each round submits BURST one-element float32 allreduces and waits for
 * them. cold: every round's names are new ("cold.R.J"), so each goes
 * through the slow path (gathered to the coordinator, rank 0); cached:
 * the same BURST names every round, agreed once before counting, so each
 * round is the response cache's bit vector only. Counting (MPI_Pcontrol)
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
  hvd_request_t *req[MAXB];
  char name[64];
  for (int j = 0; j < burst; j++) {
    in[j] = 1.0f;
    hvd_tensor_t s = hvd_tensor_make(&in[j], HVD_FLOAT32, 0, NULL);
    hvd_tensor_t d = hvd_tensor_make(&out[j], HVD_FLOAT32, 0, NULL);
    if (strcmp(mode, "cold") == 0)
      snprintf(name, sizeof name, "cold.%d.%d", r, j);
    else
      snprintf(name, sizeof name, "hot.%d", j);
    if (hvd_allreduce_async(name, &s, &d, HVD_SUM, 1.0, 1.0, &req[j]) !=
        HVD_SUCCESS)
      return 0;
  }
  for (int j = 0; j < burst; j++)
    if (hvd_wait(req[j]) != HVD_SUCCESS || out[j] != (float)hvd_size())
      return 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: negotiation cold|cached ROUNDS BURST\n");
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
