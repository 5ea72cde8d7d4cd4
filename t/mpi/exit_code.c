/*
 * exit_code.c - the program of hvdrun.sh's failure summary: an hvd
 * program whose rank 1 exits with status 3 right after hvd_init, while the
 * others wait in hvd_barrier. Rank 1's exit shuts hvd down, so the others'
 * barrier fails at once and they exit 1: two exits racing, of which hvdrun
 * must name rank 1's (it was first), with its status. An argument names
 * another rank to exit (0 at np 1).
 *
 * "exit_code WHO late": every rank shuts hvd down cleanly; the others exit
 * 0 and WHO, once each of their records (HVD_END_DIR/rank.N) says it has
 * exited, exits with status 3 (60 s at most): hvdrun must not count the
 * ranks that had finished as stopped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"

/* Whether rank r's end record says it has exited. */
static int exited(int r) {
  char path[4096], buf[512] = "";
  const char *dir = getenv("HVD_END_DIR");
  snprintf(path, sizeof path, "%s/rank.%d", dir != NULL ? dir : ".", r);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return strstr(buf, "state exited") != NULL;
}

static int late(int who) {
  int me = hvd_rank(), np = hvd_size();
  hvd_barrier();
  hvd_shutdown();
  if (me != who)
    return 0;
  for (int r = 0; r < np; r++)
    for (int i = 0; r != me && !exited(r) && i < 600; i++)
      usleep(100000);
  fprintf(stderr, "exit_code: rank %d exits with status 3 last\n", who);
  exit(3);
}

int main(int argc, char **argv) {
  int who = argc > 1 ? atoi(argv[1]) : 1;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "exit_code: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  if (argc > 2 && strcmp(argv[2], "late") == 0)
    return late(who);
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
