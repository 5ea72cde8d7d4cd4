/*
 * slurm_ranks.c - what one rank of a job is, for t/mpi/slurm.sh (hvd under
 * a real Slurm: salloc + hvdrun, srun direct launch, scancel). Not a
 * make-check program of its own (it needs that cluster).
 *
 *   slurm_ranks [--loop]
 *
 * After hvd_init, each rank prints one line on stdout:
 *
 *   rank R size P local_rank L local_size S host H
 *
 * (H: gethostname), then checks an allreduce: the sum over the ranks of
 * rank + 1 must be P (P + 1) / 2, else it says so on stderr and exits 1.
 * With --loop it then prints "rank R looping" and goes on with an
 * allreduce every 10 ms until it is killed (the scancel test).
 * Exit status: 0; 1 when hvd_init or the allreduce failed.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hvd.h"

static int sum_of_ranks(const char *name, double *got) {
  double mine = hvd_rank() + 1;
  hvd_tensor_t send = hvd_tensor_make(&mine, HVD_FLOAT64, 0, NULL);
  hvd_tensor_t recv = hvd_tensor_make(got, HVD_FLOAT64, 0, NULL);
  hvd_result_t rc = hvd_allreduce(name, &send, &recv, HVD_SUM, 1.0, 1.0);
  if (rc != HVD_SUCCESS) {
    fprintf(stderr, "slurm_ranks: rank %d: allreduce %s: %s: %s\n", hvd_rank(),
            name, hvd_strerror(rc), hvd_last_error());
    return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  int loop = argc > 1 && strcmp(argv[1], "--loop") == 0;
  hvd_result_t rc = hvd_init();
  if (rc != HVD_SUCCESS) {
    fprintf(stderr, "slurm_ranks: hvd_init: %s: %s\n", hvd_strerror(rc),
            hvd_last_error());
    return 1;
  }
  char host[256] = "?";
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  printf("rank %d size %d local_rank %d local_size %d host %s\n", hvd_rank(),
         hvd_size(), hvd_local_rank(), hvd_local_size(), host);
  fflush(stdout);

  int p = hvd_size();
  double got = 0;
  if (!sum_of_ranks("slurm.sum", &got))
    return 1;
  if (got != (double)p * (p + 1) / 2) {
    fprintf(stderr, "slurm_ranks: rank %d: the sum of rank + 1 is %g, not %d\n",
            hvd_rank(), got, p * (p + 1) / 2);
    return 1;
  }
  if (loop) {
    printf("rank %d looping\n", hvd_rank());
    fflush(stdout);
    for (;;) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      if (!sum_of_ranks("slurm.loop", &got))
        return 1;
      nanosleep(&ts, NULL);
    }
  }
  hvd_shutdown();
  return 0;
}
