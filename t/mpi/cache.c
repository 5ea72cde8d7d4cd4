/*
 * cache.c - the response cache: a name that is cached with one set of
 * parameters and then submitted with others (shape, dtype) must be
 * renegotiated, never run with the stale parameters; eviction (capacity
 * smaller than the working set, names submitted in a different order on
 * every rank and step) and no cache at all give the same results; a
 * mismatch on a cached name fails on every rank with the coordinator's
 * exact message and the next step works.
 *
 * Every configuration runs the same steps, with HVD_CACHE_CAPACITY unset
 * (1024), 4, 1 and 0 (off); hvd_shutdown/hvd_init in between (settings
 * are read by hvd_init). Every value is a small integer, so every result
 * is exact. Run at 1..4 ranks.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P; /* this rank, world size */

/* Rank q's element i of a tensor salted with k: -5..5. */
static double value(const struct hvdt_ar *a, int q, int64_t i) {
  return (double)((q * 3 + i + a->salt * 7) % 11) - 5;
}

/* Prepares j, an allreduce of a [n] tensor (ops limited to exact ones),
 * and submits it async. */
static void job_submit(struct hvdt_ar *j, const char *name, hvd_dtype_t dt,
                       hvd_op_t op, int64_t n, int salt, int in_place) {
  if (op == HVD_AVERAGE)
    bail("op %d not used here", (int)op);
  snprintf(j->name, sizeof j->name, "%s", name);
  j->dtype = dt;
  j->op = op;
  j->ndim = 1;
  j->n = n;
  j->pre = j->post = 1.0;
  j->salt = salt;
  j->in_place = in_place;
  hvdt_ar_submit(j, value, -99);
}

/* 1 if j succeeded with the right values; else notes why and returns 0. */
static int job_good(const struct hvdt_ar *j) {
  char why[600];
  if (hvdt_ar_check(j, value, P, why, sizeof why))
    return 1;
  tap_note("%s", why);
  return 0;
}

/* ---- the steps ---- */

static struct hvdt_ar jobs[16];
static const char *cfg; /* label of the configuration */

/* "w" alternates [10] and [12] while "v" (always [7]) stays cached. */
static void shapes_alternate(void) {
  for (int s = 0; s < 6; s++) {
    int64_t n = s % 2 ? 12 : 10;
    job_submit(&jobs[0], "v", HVD_FLOAT32, HVD_SUM, 7, s, s % 2);
    job_submit(&jobs[1], "w", HVD_FLOAT32, HVD_SUM, n, s + 1, s % 3 == 0);
    hvdt_ar_wait(&jobs[1]);
    hvdt_ar_wait(&jobs[0]);
    int a = job_good(&jobs[1]);
    int b = job_good(&jobs[0]);
    ok(a && b, "%s: step %d: 'w' shape [%lld] and 'v' [7] right", cfg, s,
       (long long)n);
  }
}

/* "d" changes dtype (and op) every step. */
static void dtypes_change(void) {
  static const hvd_dtype_t dts[4] = {HVD_FLOAT32, HVD_INT32, HVD_FLOAT64,
                                     HVD_FLOAT16};
  static const hvd_op_t ops[3] = {HVD_SUM, HVD_MAX, HVD_PRODUCT};
  for (int s = 0; s < 6; s++) {
    job_submit(&jobs[0], "d", dts[s % 4], ops[s % 3], 5, s, s % 2);
    hvdt_ar_wait(&jobs[0]);
    ok(job_good(&jobs[0]), "%s: step %d: 'd' as %s %s right", cfg, s,
       hvd_dtype_name(dts[s % 4]), hvd_op_name(ops[s % 3]));
  }
}

/* "w" is cached as [12] (the last step of shapes_alternate); on some
 * steps ranks disagree, on the others everything works. "v" runs in the
 * same cycles and must not be disturbed. */
static void mismatch_on_cached(void) {
  char vals[64][HVDT_VAL_LEN], what[128];
  for (int s = 0; s < 6; s++) {
    int64_t n = 12;
    if (s == 2)
      n = 12 + R; /* rank 0 still matches the cache */
    else if (s == 4 && R == P - 1)
      n = 11; /* only the last rank differs */
    job_submit(&jobs[0], "v", HVD_FLOAT32, HVD_SUM, 7, 10 + s, 0);
    job_submit(&jobs[1], "w", HVD_FLOAT32, HVD_SUM, n, 20 + s, 1);
    hvdt_ar_wait(&jobs[0]);
    hvdt_ar_wait(&jobs[1]);
    ok(job_good(&jobs[0]), "%s: mismatch step %d: 'v' right", cfg, s);
    int bad = P > 1 && (s == 2 || s == 4);
    if (!bad) {
      ok(job_good(&jobs[1]), "%s: mismatch step %d: 'w' [%lld] right", cfg, s,
         (long long)n);
      continue;
    }
    for (int q = 0; q < P; q++)
      snprintf(vals[q], HVDT_VAL_LEN, "[%d]",
               s == 2 ? 12 + q : (q == P - 1 ? 11 : 12));
    snprintf(what, sizeof what, "%s: mismatch step %d", cfg, s);
    hvdt_expect_mismatch(jobs[1].rc, jobs[1].msg, "allreduce 'w'", "shape",
                         vals, NULL, what);
  }
  /* A dtype mismatch on the cached "d" (int32 since dtypes_change step 5,
   * op max): odd ranks say float32. */
  job_submit(&jobs[0], "d", R % 2 ? HVD_FLOAT32 : HVD_INT32, HVD_MAX, 5, 40, 0);
  hvdt_ar_wait(&jobs[0]);
  if (P > 1) {
    for (int q = 0; q < P; q++)
      snprintf(vals[q], HVDT_VAL_LEN, "%s", q % 2 ? "float32" : "int32");
    snprintf(what, sizeof what, "%s: dtype mismatch on cached 'd'", cfg);
    hvdt_expect_mismatch(jobs[0].rc, jobs[0].msg, "allreduce 'd'", "dtype",
                         vals, NULL, what);
  } else {
    ok(job_good(&jobs[0]), "%s: 'd' int32 max right", cfg);
  }
  job_submit(&jobs[0], "d", HVD_INT32, HVD_MAX, 5, 41, 0);
  hvdt_ar_wait(&jobs[0]);
  ok(job_good(&jobs[0]), "%s: 'd' int32 max right after the mismatch", cfg);
}

/* 12 names, submitted in a different order on every rank and step, and
 * waited for in yet another order. */
static void many_names(void) {
  static const hvd_op_t ops[4] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT};
  unsigned seed = 12345u + (unsigned)R * 7919u;
  for (int s = 0; s < 8; s++) {
    int order[12];
    seed = hvdt_shuffle(order, 12, seed); /* rank-dependent */
    for (int k = 0; k < 12; k++) {
      int id = order[k];
      char name[16];
      snprintf(name, sizeof name, "e%d", id);
      job_submit(&jobs[id], name, id % 2 ? HVD_INT32 : HVD_FLOAT32, ops[id % 4],
                 id + 1, s * 12 + id, (id + s) % 2);
    }
    int good = 1;
    for (int k = 0; k < 12; k++)
      hvdt_ar_wait(&jobs[(k * 5 + s) % 12]); /* 5 is prime to 12 */
    for (int k = 0; k < 12; k++)
      good &= job_good(&jobs[k]);
    ok(good, "%s: step %d: 12 names in order %d,%d,%d,... right", cfg, s,
       order[0], order[1], order[2]);
  }
}

int main(int argc, char **argv) {
  static const char *caps[] = {NULL, "4", "1", "0"};
  static const char *labels[] = {"cache 1024 (default)", "cache 4", "cache 1",
                                 "cache off"};
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P > 64)
    bail("at most 64 ranks");

  for (int c = 0; c < 4; c++) {
    cfg = labels[c];
    if (caps[c])
      setenv("HVD_CACHE_CAPACITY", caps[c], 1);
    else
      unsetenv("HVD_CACHE_CAPACITY");
    hvd_result_t rc = hvd_init();
    tap_note("%s", hvd_last_error());
    if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
      bail("hvd_init: %s", hvd_last_error());
    shapes_alternate();
    dtypes_change();
    mismatch_on_cached();
    many_names();
    for (int k = 0; k < 16; k++)
      hvdt_ar_free(&jobs[k]);
    is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
  }
  return tap_mpi_finish();
}
