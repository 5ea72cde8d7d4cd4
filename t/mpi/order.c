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
#include "tap/tap.h"

#include <math.h>
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
static const char *const dtype_names[] = {"uint8",   "int8",    "int32",
                                          "int64",   "float16", "bfloat16",
                                          "float32", "float64"};
static const size_t dtype_sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
static const hvd_op_t ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                               HVD_PRODUCT};
static const char *const op_names[] = {"sum", "average", "min", "max",
                                       "product"};

static int is_float(hvd_dtype_t dt) {
  return dt >= HVD_FLOAT16;
}

/* float16/bfloat16 for the small integers used here (exact). */
static uint16_t to_f16(float f) {
  uint32_t x, man;
  int e;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) == 0)
    return (uint16_t)((x >> 16) & 0x8000u);
  e = (int)((x >> 23) & 0xff) - 127 + 15;
  man = (x & 0x7fffffu) >> 13;
  return (uint16_t)(((x >> 16) & 0x8000u) | ((uint32_t)e << 10) | man);
}
static float from_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f =
      e == 0 ? ldexpf((float)man, -24) : ldexpf((float)(man | 0x400), e - 25);
  return (h & 0x8000) ? -f : f;
}
static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16); /* exact for these values */
}
static float from_bf16(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static double get(hvd_dtype_t dt, const void *buf, int64_t i) {
  switch (dt) {
  case HVD_UINT8:
    return ((const uint8_t *)buf)[i];
  case HVD_INT8:
    return ((const int8_t *)buf)[i];
  case HVD_INT32:
    return ((const int32_t *)buf)[i];
  case HVD_INT64:
    return (double)((const int64_t *)buf)[i];
  case HVD_FLOAT16:
    return from_f16(((const uint16_t *)buf)[i]);
  case HVD_BFLOAT16:
    return from_bf16(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32:
    return ((const float *)buf)[i];
  default:
    return ((const double *)buf)[i];
  }
}

static void put(hvd_dtype_t dt, void *buf, int64_t i, double v) {
  switch (dt) {
  case HVD_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case HVD_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case HVD_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case HVD_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case HVD_FLOAT16:
    ((uint16_t *)buf)[i] = to_f16((float)v);
    break;
  case HVD_BFLOAT16:
    ((uint16_t *)buf)[i] = to_bf16((float)v);
    break;
  case HVD_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  default:
    ((double *)buf)[i] = v;
    break;
  }
}

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
  if (op == HVD_AVERAGE && is_float(dt)) /* offsets 0, 1, 2, -3: sum 0 */
    return (double)(h % 9 - 4 + (r < P - 1 ? r : -(P - 1) * (P - 2) / 2));
  return (double)((h * 7 + r * 3) % 11 - (s ? 5 : 0));
}

static double expected(hvd_op_t op, hvd_dtype_t dt, int t, int k, int64_t i) {
  double acc = input(op, dt, t, k, 0, i);
  for (int r = 1; r < P; r++) {
    double x = input(op, dt, t, k, r, i);
    acc = op == HVD_MIN       ? fmin(acc, x)
          : op == HVD_MAX     ? fmax(acc, x)
          : op == HVD_PRODUCT ? acc * x
                              : acc + x;
  }
  if (op == HVD_AVERAGE)
    acc = is_float(dt) ? acc / P : (double)((long long)acc / P);
  return acc;
}

/* A small PRNG (a 64-bit LCG), so that the orders depend only on seeds. */
static uint64_t prng;
static uint32_t next_random(void) {
  prng = prng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(prng >> 33);
}
static void shuffle(int *a, int n, uint64_t seed) {
  prng = seed;
  for (int i = 0; i < n; i++)
    a[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(next_random() % (uint32_t)(i + 1));
    int tmp = a[i];
    a[i] = a[j];
    a[j] = tmp;
  }
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
  it->send = calloc((size_t)(it->n ? it->n : 1), dtype_sizes[it->dt]);
  it->recv = it->inplace
                 ? it->send
                 : calloc((size_t)(it->n ? it->n : 1), dtype_sizes[it->dt]);
  if (!it->send || !it->recv)
    bail("out of memory");
  for (int64_t i = 0; i < it->n; i++) {
    put(it->dt, it->send, i, input(it->op, it->dt, t, k, R, i));
    if (!it->inplace)
      put(it->dt, it->recv, i, 99);
  }
  it->st = hvd_tensor_make(it->send, it->dt, ndim, shape);
  it->rt = hvd_tensor_make(it->recv, it->dt, ndim, shape);
  it->req = NULL;
}

static void check(struct item *it, int t, int k, hvd_result_t rc) {
  int good = rc == HVD_SUCCESS;
  if (!good)
    tap_note("result %d: %s", rc, hvd_last_error());
  for (int64_t i = 0; good && i < it->n; i++) {
    double want = expected(it->op, it->dt, t, k, i);
    double got = get(it->dt, it->recv, i);
    if (got != want) {
      tap_note("element %lld: expected %g, got %g", (long long)i, want, got);
      good = 0;
    }
  }
  ok(good, "round %d: %s %s %s, %lld elements%s", k, it->name,
     dtype_names[it->dt], op_names[it->op], (long long)it->n,
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
    shuffle(submit_order, NTENSORS, (uint64_t)R + 1000u * (uint64_t)k);
    shuffle(wait_order, NTENSORS, (uint64_t)R + 1000u * (uint64_t)k + 500u);
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
