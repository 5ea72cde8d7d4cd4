/*
 * finalize.c - a program that initialises MPI itself and ends with
 * MPI_Finalize, never calling hvd_shutdown: hvd shuts down inside
 * MPI_Finalize (its attribute on MPI_COMM_SELF, whose deletion MPI runs
 * first, with MPI still whole), so its engine never calls a finalised MPI
 * (before: a crash in MPI_Finalize or after it). A thread waiting on an
 * allreduce that no other rank submits (2+ ranks) is ended with
 * HVD_ERR_SHUTDOWN and the shutdown's message. The checks after
 * MPI_Finalize cannot be collective: each rank says what failed on
 * stderr and exits 1, which fails the test.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int rank, size;
static hvd_request_t *pending;
static hvd_result_t pending_rc = HVD_SUCCESS;
static char pending_msg[512];

static void *waiter(void *arg) {
  (void)arg;
  pending_rc = hvd_wait(pending);
  snprintf(pending_msg, sizeof pending_msg, "%s", hvd_last_error());
  return NULL;
}

/* After MPI_Finalize: 0 when hvd is down and the waiter ended right. */
static int after(pthread_t th) {
  int bad = 0;
  if (hvd_is_initialized()) {
    fprintf(stderr, "finalize: rank %d: hvd still initialised\n", rank);
    bad = 1;
  }
  if (size == 1)
    return bad;
  pthread_join(th, NULL);
  char want[128];
  int by = -1, end = 0;
  snprintf(want, sizeof want,
           "allreduce 'never.r%d': hvd was shut down by "
           "rank",
           rank);
  size_t k = strlen(want);
  if (pending_rc != HVD_ERR_SHUTDOWN || strncmp(pending_msg, want, k) != 0 ||
      sscanf(pending_msg + k, " %d before this collective completed%n", &by,
             &end) != 1 ||
      pending_msg[k + (size_t)end] != '\0' || by < 0 || by >= size) {
    fprintf(stderr, "finalize: rank %d: the waiter got %s '%s'\n", rank,
            hvd_strerror(pending_rc), pending_msg);
    bad = 1;
  }
  return bad;
}

int main(int argc, char **argv) {
  tap_mpi_init_program(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  hvdt_allreduce_works(NULL, HVD_FLOAT32, 6, "an allreduce");
  pthread_t th;
  float x[4] = {0};
  int64_t four = 4;
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, &four);
  char name[32];
  snprintf(name, sizeof name, "never.r%d", rank);
  if (size > 1) {
    is_int(HVD_SUCCESS,
           hvd_allreduce_async(name, &t, &t, HVD_SUM, 1, 1, &pending),
           "an allreduce only this rank submits");
    if (pthread_create(&th, NULL, waiter, NULL) != 0)
      bail("pthread_create failed");
  }
  int status = tap_mpi_finish();
  MPI_Finalize(); /* hvd is still running here */
  return after(th) ? 1 : status;
}
