/*
 * stall_prog.c - the program stall.sh runs (not a test itself). Every rank
 * but rank 1 allreduces "x"; rank 1 does something else:
 *
 *   stall_prog never   rank 1 never submits "x": 0.5 s after the start it
 *                      submits "y", which nobody else does, and waits on it.
 *                      With HVD_STALL_SHUTDOWN_TIME set, hvd stops on every
 *                      rank and both waits return HVD_ERR_STALL.
 *   stall_prog cached  as never, after every rank allreduced "x" and "y"
 *                      twice, so that both wait in the response cache:
 *                      a hit waits the first of HVD_STALL_CHECK_TIME and
 *                      HVD_STALL_SHUTDOWN_TIME, then goes to the
 *                      coordinator, whose inspector counts from its
 *                      submission and warns or stops hvd.
 *   stall_prog late    rank 1 submits "x" 3 s after the start: the stall
 *                      warning comes (HVD_STALL_CHECK_TIME=2) but "x"
 *                      completes, with the right sum.
 *   stall_prog create  every rank but 1 calls hvd_process_set_create (of
 *                      every rank); rank 1 never does: it waits in an
 *                      MPI_Barrier of MPI_COMM_WORLD for the others to
 *                      return (bounded by the test's timeout only), then
 *                      calls hvd_barrier. With HVD_STALL_SHUTDOWN_TIME set,
 *                      the creates return HVD_ERR_STALL naming rank 1, and
 *                      rank 1's barrier fails at once with the same stop.
 *                      Prints "stall_prog[R]: create rc=RC: MESSAGE" (rank
 *                      1: "barrier") instead of the 'x' line.
 *   stall_prog create0 as create with rank 0 the one that never calls
 *                      it, and the callers' own stall times 0 (no
 *                      bound): rank 0's times bound every rank's wait,
 *                      as for a collective.
 *   stall_prog set     (3 ranks or more) "x" in a process set of ranks 1
 *                      and 2 only, rank 2 submitting it 3 s late: the set's
 *                      own stall inspector (on rank 1, the set's first)
 *                      warns naming world ranks; "x" completes with the
 *                      set's sum; the other ranks print that they are not
 *                      in the set.
 *
 * Every rank prints one line on stdout about its request:
 *   stall_prog[R]: 'x' rc=RC after S.S s: MESSAGE
 * (MESSAGE is hvd_last_error(), or "sum ok" / "sum wrong: ..." on success)
 * then "stall_prog[R]: shutdown rc=RC" and exits 0. Waits are polled and
 * bounded (20 s): a request that never completes prints
 * "stall_prog[R]: 'x' still pending after 20 s", shuts hvd down and exits
 * 1. The start is a barrier after hvd_init.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* stall_prog create (absent 1) and create0 (absent 0), after hvd_init. */
static int create_mode(int me, int size, int absent) {
  int all[64];
  hvd_process_set_t *ps = NULL;
  hvd_result_t rc = HVD_SUCCESS;
  for (int r = 0; r < size && r < 64; r++)
    all[r] = r;
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != absent)
    rc = hvd_process_set_create(all, size, &ps);
  MPI_Barrier(MPI_COMM_WORLD); /* the absent rank waits here, outside hvd */
  if (me == absent)
    rc = hvd_barrier();
  printf("stall_prog[%d]: %s rc=%d: %s\n", me,
         me == absent ? "barrier" : "create",
         (int)rc, rc == HVD_SUCCESS ? "" : hvd_last_error());
  hvd_process_set_destroy(ps);
  rc = hvd_shutdown();
  printf("stall_prog[%d]: shutdown rc=%d\n", me, (int)rc);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  int late;
  float x[8], y[8];
  int64_t shape[1] = {8};

  if (argc != 2 || (strcmp(argv[1], "never") && strcmp(argv[1], "late") &&
                    strcmp(argv[1], "set") && strcmp(argv[1], "cached") &&
                    strcmp(argv[1], "create") && strcmp(argv[1], "create0"))) {
    fprintf(stderr,
            "usage: stall_prog never|late|set|cached|create|create0\n");
    return 2;
  }
  const char *world = getenv("OMPI_COMM_WORLD_RANK");
  if (strcmp(argv[1], "create0") == 0 && world != NULL && atoi(world) != 0) {
    setenv("HVD_STALL_CHECK_TIME", "0", 1); /* the callers: no bound */
    setenv("HVD_STALL_SHUTDOWN_TIME", "0", 1);
  }
  late = strcmp(argv[1], "late") == 0;
  int in_set = strcmp(argv[1], "set") == 0;
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "stall_prog: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  int me = hvd_rank(), size = hvd_size();
  if (strcmp(argv[1], "create") == 0 || strcmp(argv[1], "create0") == 0)
    return create_mode(me, size, argv[1][6] == '0' ? 0 : 1);
  hvd_process_set_t *ps = NULL;
  const int pair[2] = {1, 2};
  if (in_set && hvd_process_set_create(pair, 2, &ps) != HVD_SUCCESS) {
    fprintf(stderr, "stall_prog: hvd_process_set_create: %s\n",
            hvd_last_error());
    return 2;
  }
  for (int k = 0; strcmp(argv[1], "cached") == 0 && k < 4; k++) {
    hvd_tensor_t w = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    hvd_tensor_t v = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
    if (hvd_allreduce(k % 2 ? "y" : "x", &w, &v, HVD_SUM, 1, 1) !=
        HVD_SUCCESS) {
      fprintf(stderr, "stall_prog: warm-up: %s\n", hvd_last_error());
      return 2;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();

  const char *name = "x";
  if (in_set && hvd_process_set_rank(ps) < 0) {
    printf("stall_prog[%d]: not in the set\n", me);
    fflush(stdout);
  } else if (in_set) {
    if (me == 2)
      sleep_s(3.0);
  } else if (me == 1) {
    sleep_s(late ? 3.0 : 0.5);
    if (!late)
      name = "y";
  }
  for (int i = 0; i < 8; i++) {
    x[i] = (float)(me + i);
    y[i] = -1.0f;
  }
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
  hvd_request_t *req = NULL;
  hvd_result_t rc = HVD_SUCCESS;
  int done;
  if (in_set && hvd_process_set_rank(ps) < 0) {
    done = 1, rc = HVD_ERR_INVALID_ARG; /* nothing to submit here */
    goto finish;
  }
  rc = in_set ? hvd_ps_allreduce_async(ps, name, &s, &r, HVD_SUM, 1.0, 1.0,
                                       &req)
              : hvd_allreduce_async(name, &s, &r, HVD_SUM, 1.0, 1.0, &req);
  done = rc != HVD_SUCCESS;
  while (!done && now() - t0 < 20.0) {
    rc = hvd_test(req, &done);
    if (!done)
      sleep_s(0.01);
  }
  if (!done) {
    printf("stall_prog[%d]: '%s' still pending after 20 s\n", me, name);
    fflush(stdout);
    hvd_shutdown();
    hvd_wait(req);
    return 1;
  }
  double took = now() - t0;
  char msg[1024];
  if (rc == HVD_SUCCESS) {
    int good = 1;
    for (int i = 0; i < 8; i++) /* the set: ranks 1 and 2 */
      good &= y[i] == (in_set ? (float)(3 + 2 * i)
                              : (float)(size * (size - 1) / 2 + size * i));
    snprintf(msg, sizeof msg, good ? "sum ok" : "sum wrong: y[0] = %g",
             (double)y[0]);
  } else {
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  }
  printf("stall_prog[%d]: '%s' rc=%d after %.1f s: %s\n", me, name, (int)rc,
         took, msg);
  fflush(stdout);
finish:
  hvd_process_set_destroy(ps);
  rc = hvd_shutdown();
  printf("stall_prog[%d]: shutdown rc=%d\n", me, (int)rc);
  fflush(stdout);
  return 0;
}
