/*
 * hierarchical.c - HVD_HIERARCHICAL_ALLREDUCE=1 (reduce within the node,
 * allreduce across nodes among the local roots, broadcast within the
 * node) on nodes simulated by HVD_HOSTNAME, set per rank before hvd_init.
 * Its results must equal the flat computation: both the exact values
 * computed here and, bit for bit, what the flat allreduce gave for the
 * same inputs.
 *
 * The burst: float32, float64, float16, int32 x every op x a scalar, [7]
 * and [3000] elements (12000 bytes in float32: several 4096-byte chunks,
 * HVD_CHUNK_SIZE=4096) in and out of place, prescale/postscale on the
 * floats, submitted async at once (fused groups), then again in another
 * order on every rank (through the cache).
 *
 * Layouts: at np 4, 2 nodes x 2 ranks, blocked (AABB) and interleaved
 * (ABAB), then 3 + 1; at np 6, 2 nodes x 3 blocked and interleaved,
 * 3 nodes x 2, 4 + 2, and 3 + 2 + 1 (a node of one rank, whose local
 * size alone does not call for two levels: every rank must still take
 * the same path). Registered at np 4 and 6 (6 is oversubscribed on small
 * machines, so the tensors stay small). A round that does not finish
 * within 15 s bails out (a deadlock) rather than wait for the harness.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P; /* this rank, world size */

#define NSPECS 120
#define WAIT_LIMIT 15 /* seconds; a round takes well under 1 s */

static const char *cur_cfg = "";

/* A spec's result buffer from the flat run, kept for comparison. */
static void *flat[NSPECS][2]; /* [spec][round] */

static struct hvdt_ar specs[NSPECS];
static struct hvdt_ar jobs[NSPECS];

/* The burst (see hvdt_burst): a scalar, [7] and [3000] for every dtype and
 * op. Returns the number of specs. */
static int make_specs(void) {
  static const int64_t sizes[3] = {1, 7, 3000};
  return hvdt_burst(specs, "h", sizes, 3, 5, 0, 0);
}

/* Runs every spec (in order, or shuffled per rank) and checks each against
 * the exact values and, if ref, bit for bit against ref[k]. keep: store
 * the results (the flat run) instead of freeing them. Returns the number
 * of wrong ones; the first is described in why. */
static int run_round(int n, int round, int shuffled, int keep, char *why,
                     size_t whylen) {
  int order[NSPECS];
  if (shuffled)
    hvdt_shuffle(order, n, 31u * (unsigned)R + (unsigned)round);
  else
    for (int k = 0; k < n; k++)
      order[k] = k;
  hvdt_burst_submit(jobs, specs, n, shuffled,
                    31u * (unsigned)R + (unsigned)round, round * 1000);
  /* Polled against a deadline: a hierarchical allreduce that deadlocks
   * (ranks taking different paths) ends the test with a clear bail-out
   * instead of the harness's timeout. */
  double deadline = MPI_Wtime() + WAIT_LIMIT;
  for (int k = 0; k < n; k++) {
    struct hvdt_ar *j = &jobs[order[(k * 7) % n]];
    int done = 0;
    while (j->req != NULL && !done) {
      j->rc = hvd_test(j->req, &done);
      if (done || j->rc != HVD_SUCCESS) {
        j->req = NULL;
        if (j->rc != HVD_SUCCESS)
          snprintf(j->msg, sizeof j->msg, "%s", hvd_last_error());
        break;
      }
      if (MPI_Wtime() > deadline)
        bail("%s: '%s' not done after %d s: the allreduce hangs", cur_cfg,
             j->name, WAIT_LIMIT);
      nanosleep(&(struct timespec){0, 200000}, NULL);
    }
  }
  int bad = 0;
  why[0] = '\0';
  for (int k = 0; k < n; k++) {
    struct hvdt_ar *j = &jobs[k];
    char w[600] = "";
    size_t bytes = (size_t)j->n * hvdt_size(j->dtype);
    int good = hvdt_ar_check(j, hvdt_burst_value, P, w, sizeof w);
    if (good && !keep && flat[k][round] != NULL &&
        memcmp(flat[k][round], j->recv, bytes) != 0) {
      int64_t i = 0;
      while (i < j->n && hvdt_get(j->dtype, flat[k][round], i) ==
                             hvdt_get(j->dtype, j->recv, i))
        i++;
      snprintf(w, sizeof w,
               "'%.47s': differs from the flat allreduce at element %lld: "
               "%.9g vs %.9g",
               j->name, (long long)i, hvdt_get(j->dtype, j->recv, i),
               hvdt_get(j->dtype, flat[k][round], i));
    }
    if (w[0]) {
      if (!bad)
        snprintf(why, whylen, "%s", w);
      bad++;
    }
    if (keep) { /* the flat run's result stays, in flat */
      flat[k][round] = j->recv;
      if (j->in_place)
        j->send = NULL;
      j->recv = NULL;
    }
    hvdt_ar_free(j);
  }
  return bad;
}

/* Runs both rounds under the current environment and reports them. */
static void run_config(const char *cfg, int keep) {
  char why[700];
  int n = make_specs();
  cur_cfg = cfg;
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
    bail("hvd_init: %s", hvd_last_error());
  for (int round = 0; round < 2; round++) {
    int bad = run_round(n, round, round == 1, keep, why, sizeof why);
    if (bad)
      tap_note("%d of %d wrong; first: %s", bad, n, why);
    ok(bad == 0, "%s: %s: %d allreduces right%s", cfg,
       round ? "again, shuffled per rank (cached)" : "burst", n,
       keep ? "" : ", equal to the flat ones");
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
}

/* node[q] for layout l; returns its label, or NULL past the last one. */
static const char *layout(int l, char node[][16]) {
  static const char *const lay4[][2] = {{"AABB", "2 nodes x 2, blocked"},
                                        {"ABAB", "2 nodes x 2, interleaved"},
                                        {"AAAB", "nodes of 3 and 1"},
                                        {NULL, NULL}};
  static const char *const lay6[][2] = {{"AAABBB", "2 nodes x 3, blocked"},
                                        {"ABABAB", "2 nodes x 3, interleaved"},
                                        {"AABBCC", "3 nodes x 2"},
                                        {"AAAABB", "nodes of 4 and 2"},
                                        {"AAABBC", "nodes of 3, 2 and 1"},
                                        {NULL, NULL}};
  const char *const(*lay)[2] = P == 4 ? lay4 : lay6;
  static char label[64];
  if (lay[l][0] == NULL)
    return NULL;
  for (int q = 0; q < P; q++)
    snprintf(node[q], 16, "node%c", lay[l][0][q]);
  snprintf(label, sizeof label, "%s (%s)", lay[l][1], lay[l][0]);
  return label;
}

int main(int argc, char **argv) {
  char node[8][16], cfg[128];
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P != 4 && P != 6)
    skip_all("layouts are written for 4 and 6 ranks, not %d", P);
  setenv("HVD_CHUNK_SIZE", "4096", 1);

  /* The reference: flat allreduce, one node. */
  unsetenv("HVD_HOSTNAME");
  setenv("HVD_HIERARCHICAL_ALLREDUCE", "0", 1);
  run_config("flat", 1);

  setenv("HVD_HIERARCHICAL_ALLREDUCE", "1", 1);
  for (int l = 0;; l++) {
    const char *label = layout(l, node);
    if (label == NULL)
      break;
    int local_size = 0, local_rank = 0;
    for (int q = 0; q < P; q++)
      if (strcmp(node[q], node[R]) == 0) {
        local_size++;
        local_rank += q < R;
      }
    setenv("HVD_HOSTNAME", node[R], 1);
    snprintf(cfg, sizeof cfg, "hierarchical, %s", label);
    run_config(cfg, 0);
    /* (topology itself is t/mpi/topology's; here only that the layout is
     * the intended one) */
    hvd_init();
    tap_note("local %d/%d, expected %d/%d", hvd_local_rank(), hvd_local_size(),
             local_rank, local_size);
    ok(hvd_local_rank() == local_rank && hvd_local_size() == local_size,
       "%s: local rank and size as laid out", cfg);
    hvd_shutdown();
  }
  unsetenv("HVD_HOSTNAME");
  unsetenv("HVD_HIERARCHICAL_ALLREDUCE");
  unsetenv("HVD_CHUNK_SIZE");
  for (int k = 0; k < NSPECS; k++)
    for (int r = 0; r < 2; r++)
      free(flat[k][r]);
  return tap_mpi_finish();
}
