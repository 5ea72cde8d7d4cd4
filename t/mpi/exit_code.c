/*
 * exit_code.c - the program of hvdrun.sh's failure summary: an hvd
 * program whose rank 1 exits with status 3 right after hvd_init, while the
 * others wait in hvd_barrier. Rank 1's exit shuts hvd down, so the others'
 * barrier fails at once and they exit 1: two exits racing, of which hvdrun
 * must name rank 1's (it was first), with its status. An argument names
 * another rank to exit (0 at np 1).
 */
#include <stdio.h>
#include <stdlib.h>

#include "hvd.h"

int main(int argc, char **argv) {
  int who = argc > 1 ? atoi(argv[1]) : 1;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "exit_code: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  if (hvd_rank() == who) {
    fprintf(stderr, "exit_code: rank %d exits with status 3\n", who);
    exit(3);
  }
  if (hvd_barrier() != HVD_SUCCESS) {
    fprintf(stderr, "exit_code: rank %d: %s\n", hvd_rank(), hvd_last_error());
    return 1;
  }
  hvd_shutdown();
  return 0;
}
