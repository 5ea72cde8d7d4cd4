/*
 * die.c - the program of rank_death.sh (3 ranks) and hvdrun_blame.sh (4):
 * every rank loops on allreduces; after 5 of them rank VICTIM (default 1)
 * dies, by SIGKILL ("kill"), by a segmentation fault ("segv": a store
 * through a null pointer) or by exit(3) ("exit", which runs hvd's exit
 * handler, so hvd shuts down and the other ranks' allreduce fails with
 * HVD_ERR_SHUTDOWN), or by MPI_Abort(MPI_COMM_WORLD, 5) ("abort": the
 * others wait in their allreduce until the launcher stops them). A rank
 * whose allreduce fails prints hvd_last_error(); "neg" is exit(-1), which
 * the parent sees as status 255; "quiet" is _exit(3), which leaves no
 * record of the end (the record still says running); "early" faults before hvd_init
 * on stderr and exits 1 at once: it races the victim's own end, which is
 * what hvdrun must see through.
 *
 * It never prints "rank N" itself: the tests look for hvd's, mpirun's and
 * hvdrun's words naming the victim.
 *
 *   die kill|segv|exit|abort|neg|quiet|early [VICTIM]
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"

int main(int argc, char **argv) {
  float x[16], y[16];
  int64_t shape[1] = {16};
  const char *how = argc >= 2 ? argv[1] : "";
  int victim = argc == 3 ? atoi(argv[2]) : 1;

  if (argc < 2 || argc > 3 ||
      (strcmp(how, "kill") && strcmp(how, "exit") && strcmp(how, "segv") &&
       strcmp(how, "abort") && strcmp(how, "neg") && strcmp(how, "quiet") &&
       strcmp(how, "early"))) {
    fprintf(stderr, "usage: die kill|segv|exit|abort|neg|quiet|early [VICTIM]\n");
    return 2;
  }
  const char *lr = getenv("OMPI_COMM_WORLD_RANK");
  if (how[1] == 'a' && lr != NULL && atoi(lr) == victim)
    *(volatile int *)(uintptr_t)argc = 0; /* "early": before hvd_init */
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
    if (me == victim && step == 5) {
      fprintf(stderr, "die[%d]: 5 allreduces done, now %s\n", me,
              how[0] == 'k'   ? "SIGKILL"
              : how[0] == 's' ? "a segmentation fault"
              : how[0] == 'a' ? "MPI_Abort(5)"
              : how[0] == 'n' ? "exit(-1)"
              : how[0] == 'q' ? "_exit(3)"
                              : "exit(3)");
      if (how[0] == 'k')
        raise(SIGKILL);
      if (how[0] == 's')
        *(volatile int *)(uintptr_t)argc = 0; /* not mapped */
      if (how[0] == 'a')
        MPI_Abort(MPI_COMM_WORLD, 5);
      if (how[0] == 'q')
        _exit(3); /* no exit handler: no record */
      exit(how[0] == 'n' ? -1 : 3);
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
