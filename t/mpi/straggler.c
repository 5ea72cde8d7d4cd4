/*
 * straggler.c - the program straggler.sh runs (not a test itself): a job
 * whose last rank is stuck must still end. Every rank but the last
 * allreduces "x" and waits for it; the last rank (the straggler):
 *
 *   sleep    sleeps 600 s, never submitting
 *   spin     spins for 600 s in its own code
 *   read     blocks reading a pipe that nobody writes
 *   late     submits "x" 8 s after the start, after hvd has stopped
 *            (HVD_STALL_SHUTDOWN_TIME=5): its allreduce must fail at once;
 *            the other ranks wait until 10 s before they end, so that it
 *            arrives while they are alive
 *   early    calls hvd_shutdown at once, then returns 0: a normal end
 *            (the others' "x" fails with HVD_ERR_SHUTDOWN)
 *
 * and END says how every rank ends once its "x" has failed:
 *   return   returns 0 from main
 *   exit     calls exit(0)
 *   shutdown calls hvd_shutdown, then returns 0
 *
 * A rank whose "x" completes prints
 *   straggler[R]: 'x' rc=RC after S.S s: MESSAGE
 * (hvd_last_error()) on stdout. STRAGGLER_RANK=R makes rank R the
 * straggler instead of the last. After a stall, hvd's exit handler must end
 * the job (MPI_Abort) instead of waiting in MPI_Finalize for the
 * straggler, which never comes.
 *
 *   straggler sleep|spin|read|late|early return|exit|shutdown
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hvd.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_until(double t0, double s) {
  while (now() - t0 < s) {
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
}

/* Allreduces "x" and prints how it went; returns its result. */
static hvd_result_t reduce_x(int me, double t0) {
  float x[8], y[8];
  int64_t shape[1] = {8};
  for (int i = 0; i < 8; i++)
    x[i] = (float)(me + i);
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce("x", &s, &r, HVD_SUM, 1.0, 1.0);
  printf("straggler[%d]: 'x' rc=%d after %.1f s: %s\n", me, (int)rc,
         now() - t0, rc == HVD_SUCCESS ? "done" : hvd_last_error());
  fflush(stdout);
  return rc;
}

static int end(const char *how) {
  if (strcmp(how, "exit") == 0)
    exit(0);
  if (strcmp(how, "shutdown") == 0)
    hvd_shutdown();
  return 0;
}

int main(int argc, char **argv) {
  static const char *const kinds[] = {"sleep", "spin", "read", "late",
                                      "early"};
  int kind = -1;
  for (int k = 0; argc == 3 && k < 5; k++)
    if (strcmp(argv[1], kinds[k]) == 0)
      kind = k;
  if (kind < 0 || (strcmp(argv[2], "return") && strcmp(argv[2], "exit") &&
                   strcmp(argv[2], "shutdown"))) {
    fprintf(stderr, "usage: straggler sleep|spin|read|late|early "
                    "return|exit|shutdown\n");
    return 2;
  }
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "straggler: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  int me = hvd_rank(), stuck = hvd_size() - 1;
  if (getenv("STRAGGLER_RANK"))
    stuck = atoi(getenv("STRAGGLER_RANK"));
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  if (me != stuck) {
    reduce_x(me, t0);
    if (kind == 3)
      sleep_until(t0, 10.0);
    return end(argv[2]);
  }
  switch (kind) {
  case 0:
    sleep_until(t0, 600.0);
    break;
  case 1:
    for (volatile unsigned long spin = 0; now() - t0 < 600.0; spin++)
      ;
    break;
  case 2: {
    int fd[2];
    char c;
    if (pipe(fd) == 0 && read(fd[0], &c, 1) < 0)
      perror("straggler: read");
    break;
  }
  case 3:
    sleep_until(t0, 8.0);
    reduce_x(me, t0);
    break;
  default:
    hvd_shutdown();
    return 0;
  }
  return end(argv[2]);
}
