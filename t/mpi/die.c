/*
 * die.c - the program rank_death.sh runs on 3 ranks: every rank loops on
 * allreduces; after 5 of them rank 1 dies, by SIGKILL ("kill") or by
 * exit(3) ("exit", which runs hvd's exit handler, so hvd shuts down and the
 * other ranks' allreduce fails with HVD_ERR_SHUTDOWN). A rank whose
 * allreduce fails prints hvd_last_error() on stderr and exits 1.
 *
 * It never prints "rank N" itself: the test looks for hvd's and mpirun's
 * words naming rank 1.
 *
 *   die kill|exit
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"

int main(int argc, char **argv) {
  float x[16], y[16];
  int64_t shape[1] = {16};
  int kill_it;

  if (argc != 2 || (strcmp(argv[1], "kill") && strcmp(argv[1], "exit"))) {
    fprintf(stderr, "usage: die kill|exit\n");
    return 2;
  }
  kill_it = strcmp(argv[1], "kill") == 0;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "die: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  int me = hvd_rank();
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);

  /* Bounded, so that a library that never notices ends by itself (the
   * test's timeout ends it sooner). */
  for (int step = 0; step < 1000000; step++) {
    if (me == 1 && step == 5) {
      fprintf(stderr, "die[%d]: 5 allreduces done, now %s\n", me,
              kill_it ? "SIGKILL" : "exit(3)");
      if (kill_it)
        raise(SIGKILL);
      exit(3);
    }
    for (int i = 0; i < 16; i++)
      x[i] = (float)(me + i);
    hvd_result_t rc = hvd_allreduce("grad", &s, &r, HVD_SUM, 1.0, 1.0);
    if (rc != HVD_SUCCESS) {
      fprintf(stderr, "die[%d]: allreduce %d failed (%s): %s\n", me, step,
              hvd_strerror(rc), hvd_last_error());
      exit(1);
    }
  }
  fprintf(stderr, "die[%d]: the loop ended and nobody died\n", me);
  hvd_shutdown();
  return 0;
}
