/*
 * thread_level.c LEVEL - a program that initialises MPI itself at LEVEL
 * (single: MPI_Init; funneled or serialized: MPI_Init_thread) and then
 * starts hvd: hvd_init and hvd_init_comm refuse with HVD_ERR_UNSUPPORTED
 * and a message naming the level and MPI_THREAD_MULTIPLE (hvd's engine
 * calls MPI from its own thread, which a lower level makes a race inside
 * MPI); hvd is not initialised after; MPI is left to the program, which
 * finalises it. t/mpi/thread_level.sh runs it at np 2. Plain TAP from
 * rank 0; any rank's failure makes its exit status 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "hvd.h"
#include "hvd_mpi.h"
#include "tap/tap.h"

int main(int argc, char **argv) {
  static const char *const names[] = {"single", "funneled", "serialized"};
  static const char *const consts[] = {
      "MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED"};
  static const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED,
                               MPI_THREAD_SERIALIZED};
  int k = -1, provided = -1, rank = 0;
  for (int i = 0; argc == 2 && i < 3; i++)
    if (strcmp(argv[1], names[i]) == 0)
      k = i;
  if (k < 0) {
    fprintf(stderr, "usage: thread_level single|funneled|serialized\n");
    return 2;
  }
  if (k == 0)
    MPI_Init(&argc, &argv);
  else
    MPI_Init_thread(&argc, &argv, levels[k], &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) /* quiet: only the exit status speaks */
    freopen("/dev/null", "w", stdout);
  plan(5);
  int level = -1;
  MPI_Query_thread(&level);
  is_int(levels[k], level, "MPI runs at %s", consts[k]);
  char want[600];
  const char *tail =
      "(MPI_Query_thread); hvd's engine calls MPI from a thread of its own "
      "beside the program's, which needs MPI_THREAD_MULTIPLE: initialise "
      "MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
      "&provided) instead of MPI_Init, or leave it to hvd_init";
  snprintf(want, sizeof want, "hvd_init: MPI was initialised at %s %s",
           consts[k], tail);
  is_int(HVD_ERR_UNSUPPORTED, hvd_init(), "hvd_init refuses");
  is_string(want, hvd_last_error(), "... naming the level and the cure");
  snprintf(want, sizeof want, "hvd_init_comm: MPI was initialised at %s %s",
           consts[k], tail);
  hvd_result_t rc = hvd_init_comm(MPI_COMM_WORLD);
  ok(rc == HVD_ERR_UNSUPPORTED && strcmp(want, hvd_last_error()) == 0,
     "hvd_init_comm refuses the same way ('%s')", hvd_last_error());
  ok(!hvd_is_initialized() && hvd_rank() == -1,
     "hvd is not initialised; MPI is the program's to finalise");
  MPI_Finalize();
  return tap_exit_status();
}
