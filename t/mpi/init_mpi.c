/*
 * init_mpi.c - a program that leaves MPI to hvd: hvd_init() initialises
 * MPI with MPI_THREAD_MULTIPLE, hvd_shutdown() leaves it initialised so
 * hvd_init() works again, and hvd finalises MPI when the process exits
 * (this program never calls MPI_Finalize, and exits with hvd still
 * initialised; the harness fails it if the exit goes wrong).
 *
 * tap attaches to the MPI that hvd started, so it must not finalise it.
 * Run at 2 ranks.
 */
#include <mpi.h>
#include <stdio.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int rank, size;

/* An allreduce named name that must give the sum over ranks of
 * rank + 1 + i. */
static void allreduce_works(const char *name) {
  char why[200];
  int right;
  hvd_result_t rc =
      hvdt_sum_allreduce(name, HVD_FLOAT32, 3, &right, why, sizeof why);
  tap_note("rc %d: %s; %s", rc, hvd_last_error(), why);
  ok(rc == HVD_SUCCESS && right, "%s: allreduce", name);
}

int main(int argc, char **argv) {
  int before = -1, after = -1, provided = -1, finalized = -1;
  hvd_result_t rc;

  MPI_Initialized(&before);
  rc = hvd_init();
  MPI_Initialized(&after);
  if (rc != HVD_SUCCESS || !after) {
    /* No MPI to report through: say so and fail. */
    printf("1..1\nnot ok 1 - hvd_init initialises MPI (rc %d: %s)\n", rc,
           hvd_last_error());
    return 1;
  }
  MPI_Query_thread(&provided);

  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  plan(13);
  is_int(0, before, "MPI is not initialised before hvd_init");
  is_int(HVD_SUCCESS, rc, "hvd_init");
  is_int(1, after, "hvd_init initialised MPI");
  is_int(MPI_THREAD_MULTIPLE, provided, "with MPI_THREAD_MULTIPLE");
  is_int(rank, hvd_rank(), "hvd_rank is the world rank");
  is_int(size, hvd_size(), "hvd_size is the world size");
  allreduce_works("first");

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  MPI_Initialized(&after);
  MPI_Finalized(&finalized);
  ok(after == 1 && finalized == 0, "hvd_shutdown leaves MPI initialised");

  rc = hvd_init();
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "hvd_init again");
  allreduce_works("second");
  hvd_shutdown();
  rc = hvd_init();
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "hvd_init a third time");
  allreduce_works("third");

  /* Exit with hvd initialised: its exit handler shuts it down and
   * finalises MPI; tap_mpi_finish must not. */
  return tap_mpi_finish();
}
