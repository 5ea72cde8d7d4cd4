/*
 * cachefail.c - one rank unable to cache what every rank agreed (site
 * "cache" of lib/base/fault.h's HVD_STANDIN_HOST_ALLOC_FAIL: the response
 * cache's copy of the name, core/cache.c's hvd__cache_put). Before, that
 * rank left the entry's bit free while its peers cached it, so the names
 * learnt after it took other bits there than on its peers, and a cycle
 * in which ranks were ready on one bit for different names ran one rank's
 * tensor against another's: wrong sums, then a stall. Now that rank's
 * cache stays as it was and its next negotiation round makes every rank
 * empty its cache (HVD__FAST_FLUSH). R is the last rank; every sum is
 * checked exactly, on every rank. In each case the fault is set on R
 * while one allreduce is learnt, between two mismatched allreduces "sync"
 * (shape [1] on R, [2] elsewhere: HVD_ERR_MISMATCH on every rank, and not
 * cached): a collective is learnt after its completion, so they make sure
 * that R's engine learns just that one under the fault.
 *  1. "victim" learnt with the fault, "other" after it; then both
 *     together, twice (before: R's "other" took the bit of its peers'
 *     "victim", and ran against it);
 *  2. HVD_CACHE_CAPACITY=2: "a" and "b" cached, "c" learnt with the
 *     fault (R evicts nothing), "d" after it; then "c" and "d" together,
 *     twice, then "a" and "b" (before: R's "d" took its peers' "c"'s bit);
 *  3. a grouped allreduce of two cached first, then a lone allreduce
 *     learnt with the fault, then the group again, twice (its hits go to
 *     the coordinator in the round that empties the caches).
 * The stall times are short (3 s and 10 s), so that the old code's
 * mismatched caches end in a stall rather than at the harness's timeout.
 * Registered at np 2, 3 and 4 (t/standin/local.mk); `cachefail N` runs
 * case N only.
 */
#include "hvd.h"
#include "tap/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 4, MAXT = 4 };

static int rank, size, last;

/* Rank q's element i of tensor `salt`: distinct per tensor and rank. */
static float value(int salt, int q, int i) {
  return (float)(salt * 1000 + q * 10 + i);
}

/* The sum over the ranks of element i of tensor `salt`. */
static float sum(int salt, int i) {
  float s = 0;
  for (int q = 0; q < size; q++)
    s += value(salt, q, i);
  return s;
}

/* Every rank fails "sync" (R's shape differs) and caches nothing: once it
 * returns, R's engine has learnt what came before it. */
static void sync_mismatch(const char *what) {
  float v[2] = {1, 1};
  int64_t shape[1] = {rank == last ? 1 : 2};
  hvd_tensor_t t = hvd_tensor_make(v, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce("sync", &t, &t, HVD_SUM, 1.0, 1.0);
  is_int(HVD_ERR_MISMATCH, rc, "%s: 'sync' fails on every rank", what);
}

/* R's fault, once R's engine has learnt what came before. */
static void fault_on(const char *what) {
  char v[64];
  sync_mismatch(what);
  snprintf(v, sizeof v, "%d:cache", last);
  setenv("HVD_STANDIN_HOST_ALLOC_FAIL", v, 1);
}

static void start(const char *capacity) {
  setenv("HVD_STALL_CHECK_TIME", "3", 1);
  setenv("HVD_STALL_SHUTDOWN_TIME", "10", 1);
  if (capacity != NULL)
    setenv("HVD_CACHE_CAPACITY", capacity, 1);
  hvd_result_t rc = hvd_init();
  unsetenv("HVD_CACHE_CAPACITY");
  if (rc != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
}

static void stop(const char *what) {
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown returns", what);
}

/* Allreduces of names[k] (tensor salts[k]) submitted together (or as one
 * group), each checked exactly on every rank. */
static void reduce(int n, const char *const *names, const int *salts, int group,
                   const char *what) {
  float in[MAXT][N], out[MAXT][N];
  hvd_tensor_t s[MAXT], o[MAXT];
  hvd_request_t *reqs[MAXT];
  hvd_result_t rc[MAXT];
  int64_t shape[1] = {N};
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < N; i++) {
      in[k][i] = value(salts[k], rank, i);
      out[k][i] = -1;
    }
    s[k] = hvd_tensor_make(in[k], HVD_FLOAT32, 1, shape);
    o[k] = hvd_tensor_make(out[k], HVD_FLOAT32, 1, shape);
  }
  hvd_result_t sub = HVD_SUCCESS;
  if (group)
    sub = hvd_grouped_allreduce_async(n, names, s, o, HVD_SUM, 1.0, 1.0, reqs);
  for (int k = 0; !group && k < n && sub == HVD_SUCCESS; k++)
    sub = hvd_allreduce_async(names[k], &s[k], &o[k], HVD_SUM, 1.0, 1.0,
                              &reqs[k]);
  if (sub != HVD_SUCCESS)
    bail("%s: submission: %s", what, hvd_last_error());
  for (int k = 0; k < n; k++)
    rc[k] = hvd_wait(reqs[k]);
  for (int k = 0; k < n; k++) {
    int exact = rc[k] == HVD_SUCCESS;
    for (int i = 0; i < N && exact; i++)
      exact = out[k][i] == sum(salts[k], i);
    ok(exact, "%s: '%s' exact (%s; element 0 %g, want %g)", what, names[k],
       rc[k] == HVD_SUCCESS ? "done" : hvd_strerror(rc[k]), out[k][0],
       sum(salts[k], 0));
  }
}

static void reduce1(const char *name, int salt, const char *what) {
  reduce(1, &name, &salt, 0, what);
}

/* 1. */
static void case_lone(void) {
  const char *what = "lone allreduces";
  const char *both[2] = {"victim", "other"};
  const int salts[2] = {1, 2};
  start(NULL);
  fault_on(what);
  reduce1("victim", 1, what);
  sync_mismatch(what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  reduce1("other", 2, what);
  reduce(2, both, salts, 0, what);
  reduce(2, both, salts, 0, what);
  stop(what);
}

/* 2. */
static void case_evict(void) {
  const char *what = "a full cache";
  const char *cd[2] = {"c", "d"}, *ab[2] = {"a", "b"};
  const int cd_salts[2] = {3, 4}, ab_salts[2] = {1, 2};
  start("2");
  reduce1("a", 1, what);
  reduce1("b", 2, what);
  fault_on(what);
  reduce1("c", 3, what);
  sync_mismatch(what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  reduce1("d", 4, what);
  reduce(2, cd, cd_salts, 0, what);
  reduce(2, cd, cd_salts, 0, what);
  reduce(2, ab, ab_salts, 0, what);
  stop(what);
}

/* 3. */
static void case_group(void) {
  const char *what = "a group";
  const char *g[2] = {"g.0", "g.1"};
  const int salts[2] = {5, 6};
  start(NULL);
  reduce(2, g, salts, 1, what);
  reduce(2, g, salts, 1, what); /* from the cache */
  fault_on(what);
  reduce1("x", 7, what);
  sync_mismatch(what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  reduce(2, g, salts, 1, what);
  reduce(2, g, salts, 1, what);
  reduce1("x", 7, what);
  stop(what);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  last = size - 1;
  int only = argc > 1 ? atoi(argv[1]) : 0;
  if (!only || only == 1)
    case_lone();
  if (!only || only == 2)
    case_evict();
  if (!only || only == 3)
    case_group();
  return tap_mpi_finish();
}
