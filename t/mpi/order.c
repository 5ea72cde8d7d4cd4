/*
 * order.c - ranks submit the same 50 allreduces in different orders.
 *
 * Rank r submits 50 tensors (every dtype and op, sizes from 0 to 20000
 * elements, in place and not) asynchronously in an order shuffled with
 * seed r, then waits for them in another shuffled order and checks every
 * element. A second round reuses the names, which is allowed once the
 * first requests have completed. Runs at 1..4 ranks.
 *
 * Values are small integers, exact in every dtype (see collectives.c).
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NTENSORS 50
#define ROUNDS 2

static int P, R; /* world size, this rank */

static const hvd_dtype_t dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};
static const hvd_op_t ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                               HVD_PRODUCT};

/* Rank r's element i of tensor t in round k: within -8..8 (0..10 for
 * uint8), products of -2..2 (1..3 for uint8), float averages summing to a
 * multiple of the world size. */
static double input(hvd_op_t op, hvd_dtype_t dt, int t, int k, int r,
                    int64_t i) {
  int64_t h = i + 3 * t + 5 * k;
  int s = dt != HVD_UINT8;
  if (op == HVD_PRODUCT)
    return s ? (double)((h + r) % 5 - 2 ? (h + r) % 5 - 2 : 1)
             : (double)((h + 2 * r) % 3 + 1);
  if (op == HVD_AVERAGE && hvdt_is_float(dt)) /* offsets 0, 1, 2, -3: sum 0 */
    return (double)(h % 9 - 4 + (r < P - 1 ? r : -(P - 1) * (P - 2) / 2));
  return (double)((h * 7 + r * 3) % 11 - (s ? 5 : 0));
}

static double expected(hvd_op_t op, hvd_dtype_t dt, int t, int k, int64_t i) {
  double acc = input(op, dt, t, k, 0, i);
  for (int r = 1; r < P; r++)
    acc = hvdt_fold(op, acc, input(op, dt, t, k, r, i));
  return hvdt_finish(op, dt, acc, P, 1.0);
}

struct item {
  char name[32];
  hvd_dtype_t dt;
  hvd_op_t op;
  int inplace;
  int64_t n;
  void *send, *recv;
  hvd_tensor_t st, rt;
  hvd_request_t *req;
  hvd_result_t rc; /* of hvd_wait */
};

/* Tensor t: every dtype and op, sizes up to 20000, one of 0 elements. */
static void setup(struct item *it, int t, int k) {
  int64_t shape[2];
  int ndim = 1;
  it->dt = dtypes[t % 8];
  it->op = ops[t % 5];
  it->inplace = t % 3 == 1;
  it->n = t % 10 == 9 ? 20000 : (t * 37) % 200 + 1;
  shape[0] = it->n;
  if (t == 22) { /* a [0, 4] tensor */
    it->n = 0;
    shape[0] = 0;
    shape[1] = 4;
    ndim = 2;
  } else if (t % 4 == 2 && it->n % 2 == 0) {
    shape[0] = it->n / 2;
    shape[1] = 2;
    ndim = 2;
  }
  snprintf(it->name, sizeof it->name, "order.%02d", t);
  it->send = hvdt_calloc((size_t)it->n, hvdt_size(it->dt));
  it->recv =
      it->inplace ? it->send : hvdt_calloc((size_t)it->n, hvdt_size(it->dt));
  for (int64_t i = 0; i < it->n; i++) {
    hvdt_put(it->dt, it->send, i, input(it->op, it->dt, t, k, R, i));
    if (!it->inplace)
      hvdt_put(it->dt, it->recv, i, 99);
  }
  it->st = hvd_tensor_make(it->send, it->dt, ndim, shape);
  it->rt = hvd_tensor_make(it->recv, it->dt, ndim, shape);
  it->req = NULL;
}

/* Element i of tensor t's result in round k (ctx: a struct want). */
struct want {
  const struct item *it;
  int t, k;
};
static double want_of(const void *ctx, int64_t i) {
  const struct want *w = ctx;
  return expected(w->it->op, w->it->dt, w->t, w->k, i);
}

static void check(struct item *it, int t, int k, hvd_result_t rc) {
  struct want ctx = {it, t, k};
  struct hvdt_wrong w;
  int good = rc == HVD_SUCCESS;
  if (!good)
    tap_note("result %d: %s", rc, hvd_last_error());
  if (good &&
      !hvdt_compare(it->dt, it->recv, it->n, want_of, &ctx, HVDT_EXACT, &w)) {
    tap_note("element %lld: expected %g, got %g", (long long)w.at, w.want,
             w.got);
    good = 0;
  }
  ok(good, "round %d: %s %s %s, %lld elements%s", k, it->name,
     hvd_dtype_name(it->dt), hvd_op_name(it->op), (long long)it->n,
     it->inplace ? ", in place" : "");
  free(it->send);
  if (!it->inplace)
    free(it->recv);
}

int main(int argc, char **argv) {
  static struct item items[NTENSORS];
  int submit_order[NTENSORS], wait_order[NTENSORS];

  tap_mpi_init(&argc, &argv);
  P = tap_size();
  R = tap_rank();
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init failed: %s", hvd_last_error());

  for (int k = 0; k < ROUNDS; k++) {
    int submitted = 1;
    hvdt_shuffle(submit_order, NTENSORS, (unsigned)R + 1000u * (unsigned)k);
    hvdt_shuffle(wait_order, NTENSORS,
                 (unsigned)R + 1000u * (unsigned)k + 500u);
    for (int t = 0; t < NTENSORS; t++)
      setup(&items[t], t, k);
    for (int s = 0; s < NTENSORS; s++) {
      struct item *it = &items[submit_order[s]];
      hvd_result_t rc = hvd_allreduce_async(it->name, &it->st,
                                            it->inplace ? &it->st : &it->rt,
                                            it->op, 1.0, 1.0, &it->req);
      if (rc != HVD_SUCCESS || !it->req) {
        diag_all("%s: %s", it->name, hvd_last_error());
        submitted = 0;
      }
    }
    ok(submitted, "round %d: rank order submitted %d allreduces", k, NTENSORS);
    diag("round %d: rank 0 submits order.%02d first, order.%02d last", k,
         submit_order[0], submit_order[NTENSORS - 1]);
    /* Wait in this rank's own order; check in one order on every rank,
     * since checks are collective. */
    for (int w = 0; w < NTENSORS; w++) {
      struct item *it = &items[wait_order[w]];
      it->rc = it->req ? hvd_wait(it->req) : HVD_ERR_INTERNAL;
    }
    for (int t = 0; t < NTENSORS; t++)
      check(&items[t], t, k, items[t].rc);
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
