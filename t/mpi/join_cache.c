/*
 * join_cache.c - hvd_join and the response cache. A rank that has joined
 * is ready for every cached allreduce (it takes part with a stub), so a
 * cached allreduce that another rank submits runs without the
 * coordinator; but one that no rank submitted must not run. Before, in
 * the cycle in which the last rank joined, every cached allreduce ran
 * once on every rank with stubs alone (a full allreduce of identities,
 * 0.28 s for 128 MiB cached), and so did the cycle in which all ranks
 * joined together.
 *
 * K allreduces are cached (run twice). Then:
 *   1. mixed: ranks 1.. join; rank 0 runs the K again (cache hits) with
 *      their stubs: its own values exactly, then joins last (last = 0);
 *   2. all ranks join at once (last is some rank).
 * With HVD_LOG_LEVEL=trace each rank's engine logs one line a cycle,
 * "cycle C: N new, F agreed by cache, S by coordinator, ..." (stderr,
 * here a file per rank); the F of every rank add up to 2 K exactly: K
 * for the second warm-up, K for rank 0's hits in 1, none at the joins.
 *
 * Run at 2, 3 and 4 ranks.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define K 4
#define N 1024

static int rank, size;
static float vals[K][N];

static void fill(int k) {
  for (int i = 0; i < N; i++)
    vals[k][i] = (float)((rank + 1) * (k * N + i) % 97);
}

/* allreduce "g<k>" (SUM) of fill(k) into out; rc. */
static hvd_result_t reduce_k(int k, float *out) {
  char name[16];
  int64_t shape[1] = {N};
  snprintf(name, sizeof name, "g%d", k);
  fill(k);
  hvd_tensor_t s = hvd_tensor_make(vals[k], HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(out, HVD_FLOAT32, 1, shape);
  return hvd_allreduce(name, &s, &r, HVD_SUM, 1, 1);
}

static void warm_up(void) {
  static float out[N];
  int good = 1;
  for (int it = 0; it < 2; it++)
    for (int k = 0; k < K; k++)
      good &= reduce_k(k, out) == HVD_SUCCESS;
  ok(good, "warm-up: %d allreduces, twice", K);
}

/* Ranks 1.. join; rank 0 reduces the K (its own values come back). */
static void mixed(void) {
  static float out[K][N];
  int good = 1, exact = 1;
  if (rank == 0) {
    for (int k = 0; k < K; k++) {
      good &= reduce_k(k, out[k]) == HVD_SUCCESS;
      for (int i = 0; i < N; i++)
        exact &= out[k][i] == (float)((k * N + i) % 97);
    }
  }
  int last = -2;
  is_int(HVD_SUCCESS, hvd_join(&last), "mixed: hvd_join");
  is_int(0, last, "  rank 0 joined last");
  ok(good, "  rank 0's %d cached allreduces with the joined ranks", K);
  ok(exact, "  are rank 0's own values, exactly");
}

/* The "agreed by cache" counts of the trace lines in path, summed. */
static long cached_runs(const char *path, long *lines) {
  char *text = hvdt_slurp(path);
  long sum = 0;
  *lines = 0;
  for (char *p = text; p != NULL && (p = strstr(p, "] trace: cycle ")); p++) {
    long c, nnew, fast;
    if (sscanf(p, "] trace: cycle %ld: %ld new, %ld agreed by cache", &c, &nnew,
               &fast) == 3) {
      sum += fast;
      (*lines)++;
    }
  }
  free(text);
  return sum;
}

int main(int argc, char **argv) {
  char path[256];
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  snprintf(path, sizeof path, "/tmp/hvd-join-cache-%d-%d.log", (int)getppid(),
           rank);
  setenv("HVD_LOG_LEVEL", "trace", 1);
  setenv("HVD_CACHE_CAPACITY", "1024", 1);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (saved < 0 || fd < 0 || dup2(fd, STDERR_FILENO) < 0)
    bail("cannot send stderr to %s", path);
  close(fd);
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  warm_up();
  mixed();
  int last = -2;
  is_int(HVD_SUCCESS, hvd_join(&last), "all join at once");
  ok(last >= 0 && last < size, "  last rank %d is a rank", last);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  long lines, runs = cached_runs(path, &lines);
  ok(lines > 0, "the engine logged its cycles (%ld lines)", lines);
  is_int(2 * K, runs,
         "collectives agreed by the cache: %d warm, %d of rank 0 with the "
         "joined ranks, none at a join",
         K, K);
  if (runs == 2 * K)
    unlink(path);
  else
    diag("the engine's log: %s", path);
  return tap_mpi_finish();
}
