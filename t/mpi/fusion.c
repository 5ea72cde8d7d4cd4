/*
 * fusion.c - fused and chunked allreduce: a burst of mixed tensors
 * (scalars, [3], [1000] and [300000] elements; float32, float64, float16,
 * int32; every op; prescale and postscale on the float dtypes; in place
 * and out of place) submitted async at once, under every combination of
 * HVD_CHUNK_SIZE 64, 4096, unset (1 MiB), 8388608, 214748364800 (200 GiB:
 * the staging buffer is what a group packs, not a chunk) and
 * HVD_FUSION_THRESHOLD 0 (no fusion) and unset (128 MiB).
 *
 * Each configuration runs the burst twice: first in an order that keeps
 * tensors of one dtype and op together (long fused groups, through the
 * coordinator), then in a different order on every rank (through the
 * response cache). Then join: rank size-1 joins while the others run a
 * burst of cached and of new names; their results are the reduction of
 * the other ranks' values (the joined rank contributes the identity) and
 * an average still divides by the world size.
 *
 * Inputs are small integers (and halves) chosen so that every result is
 * exact in every dtype; the one exception is a float32 average whose
 * quotient is not representable: within 2 ulps. Integer averages
 * truncate toward zero. Run at 1..4 ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P; /* this rank, world size */

#define BIG 300000

static struct hvdt_ar specs[256];
static struct hvdt_ar jobs[256];

/* The burst into specs (see hvdt_burst): a scalar, [3] and [1000] (the
 * first nsizes of them) for every dtype and op, and up to big [BIG]
 * tensors. Returns the number of specs. */
static int burst(const char *prefix, int nsizes, int big) {
  static const int64_t sizes[3] = {1, 3, 1000};
  return hvdt_burst(specs, prefix, sizes, nsizes, 7, big, BIG);
}

/* Submits specs[0..n) in the given order (NULL: as listed), waits for all
 * in reverse order, and checks them against ranks 0..active-1. Returns the
 * number of wrong ones per dtype in bad[4]; the first wrong one of each
 * dtype is described in why[dtype]. */
static void run_burst(int n, const int *order, int active, int salt, int bad[4],
                      char why[4][600]) {
  for (int k = 0; k < n; k++) {
    int id = order ? order[k] : k;
    jobs[id] = specs[id];
    jobs[id].salt += salt;
    hvdt_ar_submit(&jobs[id], hvdt_burst_value, -77);
  }
  for (int k = n - 1; k >= 0; k--)
    hvdt_ar_wait(&jobs[order ? order[k] : k]);
  for (int d = 0; d < 4; d++) {
    bad[d] = 0;
    why[d][0] = '\0';
  }
  for (int k = 0; k < n; k++) {
    char w[512];
    if (!hvdt_ar_check(&jobs[k], hvdt_burst_value, active, w, sizeof w)) {
      int d = 0;
      while (hvdt_burst_dtypes[d] != jobs[k].dtype)
        d++;
      if (bad[d]++ == 0)
        snprintf(why[d], 600, "%s", w);
    }
    hvdt_ar_free(&jobs[k]);
  }
}

/* Reports a burst, one line per dtype. */
static void report(const int bad[4], char why[4][600], const char *cfg,
                   const char *what) {
  for (int d = 0; d < 4; d++) {
    if (bad[d])
      tap_note("%d wrong; first: %s", bad[d], why[d]);
    ok(bad[d] == 0, "%s: %s: %s", cfg, what,
       hvd_dtype_name(hvdt_burst_dtypes[d]));
  }
}

static void set_or_unset(const char *var, const char *v) {
  if (v)
    setenv(var, v, 1);
  else
    unsetenv(var);
}

/* Join: rank P-1 joins while the others run a burst of names cached
 * before (through the fast path) and of new names (the coordinator). */
static void join_burst(const char *cfg) {
  int order[256], bad[4], n;
  char why[4][600];
  n = burst("j", 3, 0);
  run_burst(n, NULL, P, 1, bad, why);
  report(bad, why, cfg, "before join: burst 'j' on every rank");

  int bad_cached[4] = {0}, bad_new[4] = {0}, last = -5;
  char why_cached[4][600] = {""}, why_new[4][600] = {""};
  hvd_result_t jrc;
  char jmsg[512] = "";
  if (R == P - 1) {
    jrc = hvd_join(&last);
  } else {
    n = burst("j", 3, 0); /* cached: same names and params */
    hvdt_shuffle(order, n, 99u + (unsigned)R);
    run_burst(n, order, P - 1, 2, bad_cached, why_cached);
    n = burst("jn", 2, 4); /* new names, a few big ones */
    run_burst(n, NULL, P - 1, 3, bad_new, why_new);
    jrc = hvd_join(&last);
  }
  if (jrc != HVD_SUCCESS)
    snprintf(jmsg, sizeof jmsg, "%s", hvd_last_error());
  tap_note("%s", jmsg);
  is_int(HVD_SUCCESS, jrc, "%s: hvd_join", cfg);
  {
    int lo = last, hi = last;
    /* the same last rank everywhere, one of the ranks that joined late */
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    tap_note("last_rank %d (min %d, max %d)", last, lo, hi);
    ok(lo == hi && (P == 1 ? last == 0 : last >= 0 && last < P - 1),
       "%s: join: the same last_rank on every rank, not rank %d", cfg, P - 1);
  }
  report(bad_cached, why_cached, cfg,
         "rank size-1 joined: cached burst 'j' (identity for it)");
  report(bad_new, why_new, cfg,
         "rank size-1 joined: new burst 'jn' (identity for it)");

  n = burst("j", 3, 0);
  run_burst(n, NULL, P, 4, bad, why);
  report(bad, why, cfg, "after join: burst 'j' on every rank");
}

int main(int argc, char **argv) {
  /* the last: 200 GiB, far beyond any group here (the staging buffer is
   * what a group packs, not the chunk: before, it failed every group) */
  static const char *chunks[5] = {"64", "4096", NULL, "8388608",
                                  "214748364800"};
  static const char *fusions[2] = {"0", NULL};
  int order[256], bad[4];
  char why[4][600], cfg[96];

  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();

  for (int c = 0; c < 5; c++)
    for (int f = 0; f < 2; f++) {
      snprintf(cfg, sizeof cfg, "chunk %s, fusion %s",
               chunks[c] ? chunks[c] : "default",
               fusions[f] ? fusions[f] : "default");
      set_or_unset("HVD_CHUNK_SIZE", chunks[c]);
      set_or_unset("HVD_FUSION_THRESHOLD", fusions[f]);
      hvd_result_t rc = hvd_init();
      tap_note("%s", hvd_last_error());
      if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
        bail("hvd_init: %s", hvd_last_error());
      /* 64-byte chunks take one MPI call per 16 floats: one big tensor */
      int big = c == 0 ? 1 : 12;
      int n = burst("b", 3, big);
      run_burst(n, NULL, P, 0, bad, why);
      report(bad, why, cfg, "burst in dtype/op order");
      hvdt_shuffle(order, n, 7u + 31u * (unsigned)R);
      run_burst(n, order, P, 5, bad, why);
      report(bad, why, cfg, "burst again, shuffled per rank (cached)");
      if (c == 1 || c == 2)
        join_burst(cfg);
      is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
    }
  unsetenv("HVD_CHUNK_SIZE");
  unsetenv("HVD_FUSION_THRESHOLD");
  return tap_mpi_finish();
}
