/*
 * shutdown.c - hvd_shutdown(): requests in flight complete with
 * HVD_ERR_SHUTDOWN; it is idempotent; calls after it say hvd_init() has
 * not been called; hvd_init() works again after it; and one rank's
 * shutdown stops the engine of every rank.
 *
 * Run at 2 and 3 ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MSG_LEN 512

static int rank, size;

/* Checks "<head>: hvd was shut down by rank R before this collective
 * completed" for any rank R of the job (every rank called hvd_shutdown, so
 * any of them may have been first). */
static void is_shut_down_in_flight(hvd_result_t rc, const char *msg,
                                   const char *head, const char *what) {
  char prefix[MSG_LEN];
  const char *tail = " before this collective completed";
  int by = -1, used = 0, good = 0;
  snprintf(prefix, sizeof prefix, "%s: hvd was shut down by rank ", head);
  is_int(HVD_ERR_SHUTDOWN, rc, "%s: HVD_ERR_SHUTDOWN", what);
  if (strncmp(msg, prefix, strlen(prefix)) == 0 &&
      sscanf(msg + strlen(prefix), "%d%n", &by, &used) == 1 && by >= 0 &&
      by < size && strcmp(msg + strlen(prefix) + used, tail) == 0)
    good = 1;
  tap_note("message \"%s\"", msg);
  ok(good, "%s: message names a rank of the job", what);
}

int main(int argc, char **argv) {
  char name[64], head[96], msg[MSG_LEN], want[MSG_LEN];
  hvd_result_t rc;

  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());

  /* (a) Requests in flight at shutdown. Each rank submits names of its
   * own, which no other rank submits, so they can never complete. */
  {
    float x[4] = {1, 2, 3, 4}, y[4];
    int64_t shape[1] = {4};
    hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
    hvd_tensor_t gathered;
    hvd_request_t *ar = NULL, *ag = NULL;
    char gname[64];
    int done = -1;
    memset(&gathered, 0, sizeof gathered);
    snprintf(name, sizeof name, "orphan.%d", rank);
    snprintf(gname, sizeof gname, "gathered.%d", rank);
    rc = hvd_allreduce_async(name, &s, &r, HVD_SUM, 1.0, 1.0, &ar);
    is_int(HVD_SUCCESS, rc, "orphan allreduce submitted");
    rc = hvd_allgather_async(gname, &s, &gathered, &ag);
    is_int(HVD_SUCCESS, rc, "orphan allgather submitted");
    hvd_result_t test_rc = hvd_test(ar, &done);
    ok(test_rc == HVD_SUCCESS && done == 0, "orphan is still in flight");

    MPI_Barrier(MPI_COMM_WORLD);
    is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown with requests in flight");

    /* (If hvd_test said done, the request is gone already.) */
    rc = done ? test_rc : hvd_wait(ar);
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
    snprintf(head, sizeof head, "allreduce '%s'", name);
    is_shut_down_in_flight(rc, msg, head, "orphan allreduce");
    rc = hvd_wait(ag);
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
    snprintf(head, sizeof head, "allgather '%s'", gname);
    is_shut_down_in_flight(rc, msg, head, "orphan allgather");
    hvd_tensor_free(&gathered);
  }

  /* (b) Idempotent; afterwards every call says hvd is not initialised. */
  {
    float x[4] = {0};
    int64_t shape[1] = {4};
    hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    hvd_request_t *req = NULL;
    is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown again");
    is_int(0, hvd_is_initialized(), "hvd_is_initialized() after shutdown");
    is_int(-1, hvd_rank(), "hvd_rank() after shutdown");
    is_int(-1, hvd_local_size(), "hvd_local_size() after shutdown");
    rc = hvd_allreduce("x", &t, &t, HVD_SUM, 1.0, 1.0);
    is_int(HVD_ERR_NOT_INITIALIZED, rc, "hvd_allreduce after shutdown");
    is_string("hvd_allreduce: hvd_init() has not been called", hvd_last_error(),
              "hvd_allreduce after shutdown: message");
    rc = hvd_broadcast_async("x", &t, 0, &req);
    is_int(HVD_ERR_NOT_INITIALIZED, rc, "hvd_broadcast_async after shutdown");
    is_string("hvd_broadcast_async: hvd_init() has not been called",
              hvd_last_error(), "hvd_broadcast_async after shutdown: message");
    rc = hvd_barrier();
    is_int(HVD_ERR_NOT_INITIALIZED, rc, "hvd_barrier after shutdown");
    is_string("hvd_barrier: hvd_init() has not been called", hvd_last_error(),
              "hvd_barrier after shutdown: message");
  }

  /* (c) init, allreduce, shutdown, three times over, reusing one name. */
  for (int round = 1; round <= 3; round++) {
    char what[32];
    snprintf(what, sizeof what, "round %d", round);
    rc = hvd_init();
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "%s: hvd_init", what);
    ok(hvd_is_initialized() == 1 && hvd_rank() == rank && hvd_size() == size,
       "%s: initialised with rank and size", what);
    /* a correct allreduce: sum over ranks of rank+1+i */
    hvdt_allreduce_works("again", HVD_FLOAT64, 4, "%s: allreduce", what);
    is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", what);
  }

  /* (d) Only rank 1 calls hvd_shutdown, while the others wait on 'late',
   * which rank 1 never submits. */
  {
    float x[4] = {1, 2, 3, 4}, y[4];
    int64_t shape[1] = {4};
    hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
    hvd_request_t *late = NULL;
    hvd_result_t stop_rc, after_rc, want_rc;
    char stop_msg[MSG_LEN], after_msg[MSG_LEN];

    rc = hvd_init();
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "lone shutdown: hvd_init");
    rc = HVD_SUCCESS;
    if (rank != 1)
      rc = hvd_allreduce_async("late", &s, &r, HVD_SUM, 1.0, 1.0, &late);
    is_int(HVD_SUCCESS, rc, "lone shutdown: 'late' submitted off rank 1");
    MPI_Barrier(MPI_COMM_WORLD);

    /* Rank 1 shuts down; the others' 'late' is ended by it. */
    if (rank == 1) {
      stop_rc = hvd_shutdown();
      want_rc = HVD_SUCCESS;
      snprintf(stop_msg, sizeof stop_msg, "%s", "");
      snprintf(want, sizeof want, "%s", "");
    } else {
      stop_rc = hvd_wait(late);
      want_rc = HVD_ERR_SHUTDOWN;
      snprintf(stop_msg, sizeof stop_msg, "%s", hvd_last_error());
      snprintf(want, sizeof want,
               "allreduce 'late': hvd was shut down by "
               "rank 1 before this collective completed");
    }
    is_int(want_rc, stop_rc,
           "lone shutdown: rank 1 shuts down, 'late' ends elsewhere");
    is_string(want, stop_msg, "lone shutdown: 'late' message");

    /* A new submission: stopped by rank 1 elsewhere, uninitialised on 1. */
    after_rc = hvd_allreduce("after", &s, &r, HVD_SUM, 1.0, 1.0);
    snprintf(after_msg, sizeof after_msg, "%s", hvd_last_error());
    if (rank == 1) {
      want_rc = HVD_ERR_NOT_INITIALIZED;
      snprintf(want, sizeof want,
               "hvd_allreduce: hvd_init() has not been called");
    } else {
      want_rc = HVD_ERR_SHUTDOWN;
      snprintf(want, sizeof want,
               "allreduce 'after': hvd was shut down by rank 1");
    }
    is_int(want_rc, after_rc, "lone shutdown: a new submission fails");
    is_string(want, after_msg, "lone shutdown: new submission's message");

    rc = rank == 1 ? HVD_SUCCESS : hvd_shutdown();
    is_int(HVD_SUCCESS, rc, "lone shutdown: the others then shut down too");
    is_int(0, hvd_is_initialized(), "lone shutdown: not initialised");

    rc = hvd_init();
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "lone shutdown: hvd_init again everywhere");
    hvdt_allreduce_works("after", HVD_FLOAT64, 4,
                         "after a lone shutdown: allreduce");
  }

  is_int(HVD_SUCCESS, hvd_shutdown(), "final hvd_shutdown");
  return tap_mpi_finish();
}
