/*
 * collectives.c - every collective x every dtype x several shapes, checked
 * element by element against results computed here. Runs at 1..4 ranks.
 *
 * Each check is a "job": job_prepare() builds rank-dependent inputs and the
 * exact expected output, the collective runs (blocking, or async and
 * waited for or polled), and job_verify() compares everything: result,
 * output dtype and shape, recv_splits, every element, and that the send
 * buffer was left alone. Blocking jobs are reported in groups, one TAP
 * line per collective x dtype x shape (all ops, roots and variants), async
 * jobs one line each; a failure notes the job and its first wrong element.
 *
 * Inputs are small integers chosen so that every result is exact in every
 * dtype at up to 4 ranks: sums stay within -20..40 (int8, uint8), products
 * within 81, scaled values within the 8-bit significand of bfloat16, scale
 * factors are powers of two, and float averages use inputs whose sum
 * divides by the world size. Integer averages truncate toward zero.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int P, R; /* world size, this rank */

enum kind { ALLREDUCE, BROADCAST, ALLGATHER, ALLTOALL, REDUCESCATTER, BARRIER };
static const char *const kind_names[] = {"allreduce",     "broadcast",
                                         "allgather",     "alltoall",
                                         "reducescatter", "barrier"};
static const hvd_dtype_t dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};
static const hvd_op_t ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                               HVD_PRODUCT};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define PRESCALE 2.0
#define POSTSCALE 0.25

struct shape {
  int ndim;
  int64_t dims[3];
};
/* Shapes of allreduce and broadcast tensors. */
static const struct shape shapes[] = {
    {0, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}};
/* Dimensions after the first of allgather, alltoall, reducescatter. */
static const struct shape rests[] = {{0, {0}}, {1, {3}}, {2, {2, 3}}};

/* ---- Inputs and expected values ---- */

/* Rank r's element i of an allreduce or reducescatter input. */
static double input(hvd_op_t op, hvd_dtype_t dt, int r, int64_t i) {
  static const int prod_signed[8] = {1, -1, 2, 1, -2, -1, 0, 1};
  static const int prod_unsigned[6] = {1, 2, 1, 3, 0, 1};
  int s = hvdt_is_signed(dt);
  if (op == HVD_AVERAGE && hvdt_is_float(dt)) /* offsets 0, 1, 2, -3: sum 0 */
    return (double)((i * 5) % 9 - 4 + (r < P - 1 ? r : -(P - 1) * (P - 2) / 2));
  switch (op) {
  case HVD_AVERAGE: /* integer averages truncate the sum's */
  case HVD_SUM:
    return (double)((i * 7 + r * 3) % 11 - (s ? 5 : 0));
  case HVD_MIN:
  case HVD_MAX:
    return (double)((i * 13 + r * 5) % 17 - (s ? 8 : 0));
  default:
    return s ? prod_signed[(i + 2 * r) % 8] : prod_unsigned[(i + 2 * r) % 6];
  }
}

/* Element i of the reduction over all ranks, as the contract defines. */
static double reduced(hvd_op_t op, hvd_dtype_t dt, int64_t i, double pre,
                      double post) {
  double acc = pre * input(op, dt, 0, i);
  for (int r = 1; r < P; r++)
    acc = hvdt_fold(op, acc, pre * input(op, dt, r, i));
  return hvdt_finish(op, dt, acc, P, post);
}

/* Broadcast data of root; allgather data of rank r; alltoall row k that
 * rank r sends to rank j. */
static double bvalue(hvd_dtype_t dt, int root, int64_t i) {
  return (double)((i * 3 + root * 7) % 23 - (hvdt_is_signed(dt) ? 11 : 0));
}
static double gvalue(hvd_dtype_t dt, int r, int64_t k) {
  return (double)((r * 11 + k * 3) % 29 - (hvdt_is_signed(dt) ? 14 : 0));
}
static double avalue(hvd_dtype_t dt, int r, int j, int64_t k, int64_t e) {
  return (double)((r * 31 + j * 7 + k * 5 + e) % 41 -
                  (hvdt_is_signed(dt) ? 20 : 0));
}

/* Rows rank r sends rank j in an alltoall: uneven (with zeros), or 2. */
static int64_t split(int r, int j, int even) {
  return even ? 2 : (r + 2 * j + 1) % 3;
}

/* ---- Jobs ---- */

struct job {
  enum kind kind;
  hvd_op_t op;
  hvd_dtype_t dt;
  const struct shape *shape; /* whole shape, or dimensions 1.. */
  int variant; /* allreduce: bit 0 in place, bit 1 scaled; broadcast: root;
                  allgather: 1 = rank r sends r rows (else r + 1);
                  alltoall: 0 uneven, 1 NULL splits, 2 no recv_splits */
  char name[96];
  void *in, *out; /* send data; allreduce's out-of-place recv data */
  double *sent;   /* what in held, to see that it is left alone */
  int64_t nin;
  hvd_tensor_t send, recv;
  int64_t splits[4], recv_splits[4];
  double *want; /* the expected output */
  int64_t nwant;
  int want_ndim;
  int64_t want_dims[4];
  hvd_request_t *req;
  int done;        /* test_poll: hvd_test said done */
  hvd_result_t rc; /* ... and this */
};

static int64_t rest_numel(const struct shape *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++)
    n *= s->dims[d];
  return n;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *dims) {
  int len = snprintf(buf, n, "[");
  for (int d = 0; d < ndim; d++)
    len += snprintf(buf + len, n - (size_t)len, "%s%lld", d ? ", " : "",
                    (long long)dims[d]);
  snprintf(buf + len, n - (size_t)len, "]");
}

/* Allocates j->in with nin elements of shape [dim0] + rest (or j->shape
 * itself when dim0 < 0) and makes j->send over it. */
static void make_send(struct job *j, int64_t dim0) {
  int64_t dims[4];
  int ndim = 0;
  if (dim0 >= 0)
    dims[ndim++] = dim0;
  for (int d = 0; d < j->shape->ndim; d++)
    dims[ndim++] = j->shape->dims[d];
  j->nin = (dim0 >= 0 ? dim0 : 1) * rest_numel(j->shape);
  j->in = hvdt_calloc((size_t)j->nin, hvdt_size(j->dt));
  j->sent = hvdt_calloc((size_t)j->nin, sizeof(double));
  j->send = hvd_tensor_make(j->in, j->dt, ndim, dims);
}

static void set_in(struct job *j, int64_t i, double v) {
  hvdt_put(j->dt, j->in, i, v);
  j->sent[i] = v;
}

/* Expected output of nwant elements, shape [dim0] + rest. */
static void make_want(struct job *j, int64_t dim0) {
  j->want_ndim = 0;
  j->want_dims[j->want_ndim++] = dim0;
  for (int d = 0; d < j->shape->ndim; d++)
    j->want_dims[j->want_ndim++] = j->shape->dims[d];
  j->nwant = dim0 * rest_numel(j->shape);
  j->want = hvdt_calloc((size_t)j->nwant, sizeof(double));
}

static void job_prepare(struct job *j, enum kind kind, hvd_op_t op,
                        hvd_dtype_t dt, const struct shape *shape,
                        int variant) {
  char sh[64];
  memset(j, 0, sizeof *j);
  j->kind = kind;
  j->op = op;
  j->dt = dt;
  j->shape = shape;
  j->variant = variant;
  j->recv = hvd_tensor_make(NULL, dt, 0, NULL);
  shape_str(sh, sizeof sh, shape->ndim, shape->dims);
  snprintf(j->name, sizeof j->name, "%s %s %s%s", kind_names[kind],
           hvd_dtype_name(dt),
           kind == ALLREDUCE || kind == BROADCAST ? "" : "[n]+", sh);
  int64_t rows = rest_numel(shape);

  switch (kind) {
  case ALLREDUCE: {
    double pre = (variant & 2) ? PRESCALE : 1.0;
    double post = (variant & 2) ? POSTSCALE : 1.0;
    make_send(j, -1);
    j->nwant = j->nin;
    j->want = hvdt_calloc((size_t)j->nwant, sizeof(double));
    for (int64_t i = 0; i < j->nin; i++) {
      set_in(j, i, input(op, dt, R, i));
      j->want[i] = reduced(op, dt, i, pre, post);
    }
    if (!(variant & 1)) {
      j->out = hvdt_calloc((size_t)j->nin, hvdt_size(dt));
      for (int64_t i = 0; i < j->nin; i++)
        hvdt_put(dt, j->out, i, 99);
      j->recv = hvd_tensor_make(j->out, dt, shape->ndim, shape->dims);
    }
    snprintf(j->name + strlen(j->name), sizeof j->name - strlen(j->name),
             " %s%s%s", hvd_op_name(op), (variant & 1) ? " in place" : "",
             (variant & 2) ? " scaled" : "");
    break;
  }
  case BROADCAST:
    make_send(j, -1);
    j->nwant = j->nin;
    j->want = hvdt_calloc((size_t)j->nwant, sizeof(double));
    for (int64_t i = 0; i < j->nin; i++) {
      set_in(j, i, R == variant ? bvalue(dt, variant, i) : 100 + i % 5);
      j->want[i] = bvalue(dt, variant, i);
    }
    snprintf(j->name + strlen(j->name), sizeof j->name - strlen(j->name),
             " root %d", variant);
    break;
  case ALLGATHER: {
    int64_t total = 0;
    make_send(j, variant ? R : R + 1);
    for (int64_t k = 0; k < j->nin; k++)
      set_in(j, k, gvalue(dt, R, k));
    for (int r = 0; r < P; r++)
      total += variant ? r : r + 1;
    make_want(j, total);
    int64_t at = 0;
    for (int r = 0; r < P; r++)
      for (int64_t k = 0; k < (variant ? r : r + 1) * rows; k++)
        j->want[at++] = gvalue(dt, r, k);
    if (variant)
      strcat(j->name, " rank r sends r rows");
    break;
  }
  case ALLTOALL: {
    int even = variant == 1;
    int64_t n0 = 0, total = 0, at = 0;
    for (int d = 0; d < P; d++) {
      j->splits[d] = split(R, d, even);
      j->recv_splits[d] = -7;
      n0 += j->splits[d];
      total += split(d, R, even);
    }
    make_send(j, n0);
    for (int d = 0; d < P; d++)
      for (int64_t k = 0; k < j->splits[d]; k++)
        for (int64_t e = 0; e < rows; e++, at++)
          set_in(j, at, avalue(dt, R, d, k, e));
    make_want(j, total);
    at = 0;
    for (int r = 0; r < P; r++)
      for (int64_t k = 0; k < split(r, R, even); k++)
        for (int64_t e = 0; e < rows; e++)
          j->want[at++] = avalue(dt, r, R, k, e);
    strcat(j->name, variant == 0   ? " uneven splits"
                    : variant == 1 ? " NULL splits"
                                   : " uneven, NULL recv_splits");
    break;
  }
  case REDUCESCATTER: {
    double pre = (variant & 2) ? PRESCALE : 1.0;
    double post = (variant & 2) ? POSTSCALE : 1.0;
    int64_t n = 2 * P + 1, mine = n / P + (R < n % P);
    int64_t first = R * (n / P) + (R < n % P ? R : n % P);
    make_send(j, n);
    for (int64_t i = 0; i < j->nin; i++)
      set_in(j, i, input(op, dt, R, i));
    make_want(j, mine);
    for (int64_t k = 0; k < j->nwant; k++)
      j->want[k] = reduced(op, dt, first * rows + k, pre, post);
    snprintf(j->name + strlen(j->name), sizeof j->name - strlen(j->name),
             " %s%s", hvd_op_name(op), (variant & 2) ? " scaled" : "");
    break;
  }
  case BARRIER:
    snprintf(j->name, sizeof j->name, "barrier");
    break;
  }
}

static hvd_result_t job_submit(struct job *j) {
  double pre = (j->variant & 2) ? PRESCALE : 1.0;
  double post = (j->variant & 2) ? POSTSCALE : 1.0;
  switch (j->kind) {
  case ALLREDUCE:
    return hvd_allreduce_async(j->name, &j->send,
                               (j->variant & 1) ? &j->send : &j->recv, j->op,
                               pre, post, &j->req);
  case BROADCAST:
    return hvd_broadcast_async(j->name, &j->send, j->variant, &j->req);
  case ALLGATHER:
    return hvd_allgather_async(j->name, &j->send, &j->recv, &j->req);
  case ALLTOALL:
    return hvd_alltoall_async(j->name, &j->send,
                              j->variant == 1 ? NULL : j->splits, &j->recv,
                              j->variant == 2 ? NULL : j->recv_splits, &j->req);
  case REDUCESCATTER:
    return hvd_reducescatter_async(j->name, &j->send, &j->recv, j->op, pre,
                                   post, &j->req);
  default:
    return hvd_barrier_async(&j->req);
  }
}

/* The blocking form of j's collective. */
static hvd_result_t job_run(struct job *j) {
  double pre = (j->variant & 2) ? PRESCALE : 1.0;
  double post = (j->variant & 2) ? POSTSCALE : 1.0;
  switch (j->kind) {
  case ALLREDUCE:
    return hvd_allreduce(j->name, &j->send,
                         (j->variant & 1) ? &j->send : &j->recv, j->op, pre,
                         post);
  case BROADCAST:
    return hvd_broadcast(j->name, &j->send, j->variant);
  case ALLGATHER:
    return hvd_allgather(j->name, &j->send, &j->recv);
  case ALLTOALL:
    return hvd_alltoall(j->name, &j->send, j->variant == 1 ? NULL : j->splits,
                        &j->recv, j->variant == 2 ? NULL : j->recv_splits);
  case REDUCESCATTER:
    return hvd_reducescatter(j->name, &j->send, &j->recv, j->op, pre, post);
  default:
    return hvd_barrier();
  }
}

/* ---- Checking ---- */

static char why[400]; /* why the last job_verify failed */

static void fail(const char *fmt, ...) TAP_PRINTF(1, 2);
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
}

static int succeeded(hvd_result_t rc) {
  if (rc == HVD_SUCCESS)
    return 1;
  fail("result %d (%s): %s", rc, hvd_strerror(rc), hvd_last_error());
  return 0;
}

/* 1 if buf's n elements are want's (floats within rel, relatively). */
static int same(const char *what, hvd_dtype_t dt, const void *buf,
                const double *want, int64_t n, double rel) {
  struct hvdt_wrong w;
  if (n > 0 && !buf) {
    fail("%s data is NULL", what);
    return 0;
  }
  if (hvdt_compare(dt, buf, n, hvdt_want_array, want, (struct hvdt_tol){rel, 0},
                   &w))
    return 1;
  fail("%s element %lld: expected %.17g, got %.17g", what, (long long)w.at,
       w.want, w.got);
  return 0;
}

/* 1 if t, which hvd allocated, has j's dtype and expected shape. */
static int has_shape(const struct job *j, const hvd_tensor_t *t) {
  char want[64], got[64];
  int good =
      t->dtype == j->dt && t->device == HVD_CPU && t->ndim == j->want_ndim;
  for (int d = 0; good && d < t->ndim; d++)
    good = t->shape[d] == j->want_dims[d];
  if (!good) {
    shape_str(want, sizeof want, j->want_ndim, j->want_dims);
    shape_str(got, sizeof got, t->ndim >= 0 && t->ndim <= 8 ? t->ndim : 0,
              t->shape);
    fail("recv: expected %s %s on cpu, got dtype %d shape %s device %d",
         hvd_dtype_name(j->dt), want, t->dtype, got, t->device);
  }
  return good;
}

/* 1 if j, whose collective returned rc, did everything right; else sets
 * why. */
static int job_verify(const struct job *j, hvd_result_t rc) {
  /* Averages at 3 ranks may be computed as sum * (1/3): allow 2 ulps in
   * float32 and float64. float16/bfloat16 accumulate in float and round,
   * so they are exact. */
  double rel = j->op == HVD_AVERAGE && j->dt == HVD_FLOAT32   ? 2 * 0x1p-23
               : j->op == HVD_AVERAGE && j->dt == HVD_FLOAT64 ? 2 * 0x1p-52
                                                              : 0;
  int good = succeeded(rc);
  switch (j->kind) {
  case ALLREDUCE:
    good = good && same("recv", j->dt, (j->variant & 1) ? j->in : j->out,
                        j->want, j->nwant, rel);
    if (!(j->variant & 1))
      good = good && same("send", j->dt, j->in, j->sent, j->nin, 0);
    break;
  case BROADCAST:
    good = good && same("tensor", j->dt, j->in, j->want, j->nwant, 0);
    break;
  case ALLTOALL:
    for (int r = 0; good && j->variant != 2 && r < P; r++)
      if (j->recv_splits[r] != split(r, R, j->variant == 1)) {
        fail("recv_splits[%d]: expected %lld, got %lld", r,
             (long long)split(r, R, j->variant == 1),
             (long long)j->recv_splits[r]);
        good = 0;
      }
    /* fall through */
  case ALLGATHER:
  case REDUCESCATTER:
    good = good && has_shape(j, &j->recv) &&
           same("recv", j->dt, j->recv.data, j->want, j->nwant, rel) &&
           same("send", j->dt, j->in, j->sent, j->nin, 0);
    break;
  case BARRIER:
    break;
  }
  return good;
}

/* One TAP line for one job. */
static int job_check(const struct job *j, hvd_result_t rc) {
  int good = job_verify(j, rc);
  if (!good)
    tap_note("%s", why);
  return ok(good, "%s", j->name);
}

static void job_free(struct job *j) {
  if (j->kind == ALLGATHER || j->kind == ALLTOALL || j->kind == REDUCESCATTER)
    hvd_tensor_free(&j->recv); /* hvd allocated it */
  free(j->in);
  free(j->out);
  free(j->sent);
  free(j->want);
}

/* One TAP line for a group of blocking jobs; the note names the first job
 * that failed on this rank. */
static int group_good;
static char group_why[sizeof why + 100];

static void group_begin(void) {
  group_good = 1;
  group_why[0] = '\0';
}

static void group_run(enum kind kind, hvd_op_t op, hvd_dtype_t dt,
                      const struct shape *shape, int variant) {
  struct job j;
  job_prepare(&j, kind, op, dt, shape, variant);
  if (!job_verify(&j, job_run(&j)) && group_good) {
    group_good = 0;
    snprintf(group_why, sizeof group_why, "%s: %s", j.name, why);
  }
  job_free(&j);
}

static void group_end(const char *fmt, ...) TAP_PRINTF(1, 2);
static void group_end(const char *fmt, ...) {
  char desc[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(desc, sizeof desc, fmt, ap);
  va_end(ap);
  if (!group_good)
    tap_note("%s", group_why);
  ok(group_good, "%s", desc);
}

/* ---- Tests ---- */

static void test_helpers(void) {
  static const struct {
    float f;
    uint16_t h, b;
  } t[] = {{1.0f, 0x3c00, 0x3f80},          {-2.0f, 0xc000, 0xc000},
           {0.5f, 0x3800, 0x3f00},          {65504.0f, 0x7bff, 0x4780},
           {3.0f, 0x4200, 0x4040},          {0x1p-24f, 0x0001, 0x3380},
           {1.0009765625f, 0x3c01, 0x3f80}, {257.0f, 0x5c04, 0x4380}};
  int good = 1;
  for (int i = 0; i < COUNT(t); i++) {
    float back = hvdt_f16_to_f32(t[i].h);
    if (hvdt_f32_to_f16(t[i].f) != t[i].h ||
        hvdt_f32_to_bf16(t[i].f) != t[i].b || back != t[i].f) {
      tap_note("%g: f16 0x%04x bf16 0x%04x back %g", t[i].f,
               hvdt_f32_to_f16(t[i].f), hvdt_f32_to_bf16(t[i].f), back);
      good = 0;
    }
  }
  ok(good, "the test's float16/bfloat16 conversions");
}

static void test_blocking(void) {
  char sh[64];
  for (int d = 0; d < COUNT(dtypes); d++) {
    hvd_dtype_t dt = dtypes[d];
    const char *dn = hvd_dtype_name(dt);
    for (int s = 0; s < COUNT(shapes); s++) {
      shape_str(sh, sizeof sh, shapes[s].ndim, shapes[s].dims);
      group_begin();
      for (int o = 0; o < COUNT(ops); o++)
        for (int v = 0; v < (hvdt_is_float(dt) ? 4 : 2); v++)
          group_run(ALLREDUCE, ops[o], dt, &shapes[s], v);
      group_end("allreduce %s %s: every op, in place or not%s", dn, sh,
                hvdt_is_float(dt) ? ", scaled or not" : "");
    }
    for (int s = 0; s < COUNT(shapes); s++) {
      shape_str(sh, sizeof sh, shapes[s].ndim, shapes[s].dims);
      group_begin();
      for (int root = 0; root < P; root++)
        group_run(BROADCAST, HVD_SUM, dt, &shapes[s], root);
      group_end("broadcast %s %s: from every root", dn, sh);
    }
    for (int s = 0; s < COUNT(rests); s++) {
      shape_str(sh, sizeof sh, rests[s].ndim, rests[s].dims);
      group_begin();
      group_run(ALLGATHER, HVD_SUM, dt, &rests[s], 0);
      group_run(ALLGATHER, HVD_SUM, dt, &rests[s], 1);
      group_end("allgather %s [n]+%s: rank r sends r + 1 rows, then r", dn, sh);
    }
    for (int s = 0; s < COUNT(rests); s++) {
      shape_str(sh, sizeof sh, rests[s].ndim, rests[s].dims);
      group_begin();
      for (int v = 0; v < 3; v++)
        group_run(ALLTOALL, HVD_SUM, dt, &rests[s], v);
      group_end("alltoall %s [n]+%s: uneven splits, NULL splits, NULL "
                "recv_splits",
                dn, sh);
    }
    for (int s = 0; s < COUNT(rests); s++) {
      shape_str(sh, sizeof sh, rests[s].ndim, rests[s].dims);
      group_begin();
      for (int o = 0; o < COUNT(ops); o++)
        for (int v = 0; v < (hvdt_is_float(dt) ? 4 : 1); v += 2)
          group_run(REDUCESCATTER, ops[o], dt, &rests[s], v);
      group_end("reducescatter %s [n]+%s, n = 2 * size + 1: every op%s", dn, sh,
                hvdt_is_float(dt) ? ", scaled or not" : "");
    }
  }
}

static void test_int_scale_rejected(void) {
  int32_t a[3] = {1, 2, 3}, b[3];
  const int64_t shape[] = {3};
  hvd_tensor_t send = hvd_tensor_make(a, HVD_INT32, 1, shape);
  hvd_tensor_t recv = hvd_tensor_make(b, HVD_INT32, 1, shape);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_allreduce("int pre", &send, &recv, HVD_SUM, 2.0, 1.0),
         "int32 allreduce with prescale 2 is rejected");
  is_string("allreduce 'int pre': prescale 2 needs a floating-point dtype, "
            "not int32",
            hvd_last_error(), "... with its message");
  is_int(HVD_ERR_INVALID_ARG,
         hvd_allreduce("int post", &send, &recv, HVD_AVERAGE, 1.0, 0.5),
         "int32 allreduce with postscale 0.5 is rejected");
  is_string("allreduce 'int post': postscale 0.5 needs a floating-point "
            "dtype, not int32",
            hvd_last_error(), "... with its message");
}

/* Every kind of job for dtype dt, for the async tests. */
static int async_jobs(struct job *jobs, hvd_dtype_t dt) {
  int n = 0;
  job_prepare(&jobs[n++], ALLREDUCE, HVD_SUM, dt, &shapes[2], 0);
  job_prepare(&jobs[n++], ALLREDUCE, HVD_MAX, dt, &shapes[3], 1);
  job_prepare(&jobs[n++], BROADCAST, HVD_SUM, dt, &shapes[2], P - 1);
  job_prepare(&jobs[n++], ALLGATHER, HVD_SUM, dt, &rests[1], 0);
  job_prepare(&jobs[n++], ALLTOALL, HVD_SUM, dt, &rests[2], 0);
  job_prepare(&jobs[n++], REDUCESCATTER, HVD_PRODUCT, dt, &rests[1], 0);
  for (int i = 0; i < n; i++)
    strcat(jobs[i].name, " async");
  return n;
}

/* Submits a job for every kind x dtype (each rank in its own rotation),
 * then waits for them in reverse. */
static void test_async_wait(void) {
  struct job jobs[8 * 6 + 1];
  int n = 0, submitted = 1;
  for (int d = 0; d < COUNT(dtypes); d++)
    n += async_jobs(jobs + n, dtypes[d]);
  job_prepare(&jobs[n++], BARRIER, HVD_SUM, HVD_UINT8, &shapes[0], 0);
  strcat(jobs[n - 1].name, " async");
  for (int k = 0; k < n; k++) {
    struct job *j = &jobs[(k + R * 7) % n];
    hvd_result_t rc = job_submit(j);
    if (rc != HVD_SUCCESS || !j->req) {
      diag_all("%s: submit: %s", j->name, hvd_last_error());
      submitted = 0;
    }
  }
  ok(submitted, "submitted %d async collectives", n);
  for (int k = n - 1; k >= 0; k--) {
    job_check(&jobs[k], jobs[k].req ? hvd_wait(jobs[k].req) : HVD_ERR_INTERNAL);
    job_free(&jobs[k]);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Polls a job per kind of one dtype with hvd_test until all are done. */
static void test_poll(void) {
  struct job jobs[6];
  int n = async_jobs(jobs, HVD_FLOAT32), left = n, pending_ok = 1;
  double deadline = now() + 60;
  for (int k = 0; k < n; k++) {
    strcat(jobs[k].name, " polled");
    if (job_submit(&jobs[k]) != HVD_SUCCESS || !jobs[k].req)
      bail("%s: submit failed: %s", jobs[k].name, hvd_last_error());
  }
  while (left > 0) {
    for (int k = 0; k < n; k++) {
      int done = -1;
      hvd_result_t rc;
      if (jobs[k].done)
        continue;
      rc = hvd_test(jobs[k].req, &done);
      if (done == 1) {
        jobs[k].done = 1;
        jobs[k].rc = rc;
        left--;
      } else if (done != 0 || rc != HVD_SUCCESS) {
        pending_ok = 0;
        diag_all("hvd_test: done %d, result %d", done, rc);
      }
    }
    if (now() > deadline) {
      char pending[512] = "";
      for (int k = 0; k < n; k++)
        if (!jobs[k].done)
          snprintf(pending + strlen(pending), sizeof pending - strlen(pending),
                   "%s'%s'", pending[0] ? ", " : "", jobs[k].name);
      bail("hvd_test never reported %d of %d requests done: %s", left, n,
           pending);
    }
    nanosleep(&(struct timespec){0, 100000}, NULL); /* poll every 0.1 ms */
  }
  ok(pending_ok, "hvd_test sets done 0 and returns success while pending");
  for (int k = 0; k < n; k++) {
    job_check(&jobs[k], jobs[k].rc);
    job_free(&jobs[k]);
  }
}

/* MIN and MAX on floats are fmin and fmax (hvd.h, NCCL's): a NaN on rank
 * h loses to the others' numbers, wherever h is (it once won only on
 * rank 0), and stays only where every rank's is a NaN. Every float
 * dtype, each rank holding the NaN in turn, all in flight at once (they
 * fuse). Elements: [NaN on h, else r + 1; NaN everywhere; r + 1]. */
static void test_nan_minmax(void) {
  static const hvd_dtype_t fdt[] = {HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32,
                                    HVD_FLOAT64};
  enum { N = 3, MAXJ = 4 * 2 * 4 };
  double buf[MAXJ][N]; /* room for any dtype's 3 elements */
  hvd_request_t *req[MAXJ];
  hvd_tensor_t t[MAXJ];
  int j = 0, good = 1;
  int64_t n = N;
  for (int d = 0; d < COUNT(fdt); d++)
    for (int o = 0; o < 2; o++)
      for (int h = 0; h < P; h++, j++) {
        char name[64];
        hvdt_put(fdt[d], buf[j], 0, R == h ? NAN : R + 1);
        hvdt_put(fdt[d], buf[j], 1, NAN);
        hvdt_put(fdt[d], buf[j], 2, R + 1);
        t[j] = hvd_tensor_make(buf[j], fdt[d], 1, &n);
        snprintf(name, sizeof name, "nan.%d.%d.%d", d, o, h);
        if (hvd_allreduce_async(name, &t[j], &t[j], o ? HVD_MAX : HVD_MIN, 1,
                                1, &req[j]) != HVD_SUCCESS)
          bail("%s: %s", name, hvd_last_error());
      }
  j = 0;
  for (int d = 0; d < COUNT(fdt); d++)
    for (int o = 0; o < 2; o++)
      for (int h = 0; h < P; h++, j++) {
        double lone = P == 1 ? NAN
                      : o    ? (h == P - 1 ? P - 1 : P)
                             : (h == 0 ? 2 : 1),
               want[N] = {lone, NAN, o ? P : 1};
        int rc = hvd_wait(req[j]);
        for (int i = 0; i < N; i++) {
          double got = hvdt_get(fdt[d], buf[j], i);
          if (rc != HVD_SUCCESS ||
              (isnan(want[i]) ? !isnan(got) : got != want[i])) {
            diag("dtype %d %s, NaN on rank %d: element %d is %g, not %g (rc "
                 "%d)",
                 (int)fdt[d], o ? "max" : "min", h, i, got, want[i], rc);
            good = 0;
            break;
          }
        }
      }
  ok(good, "min and max: a NaN loses to a number on whichever rank it is");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  P = tap_size();
  R = tap_rank();
  if (P > 4)
    bail("collectives runs on at most 4 ranks, not %d", P);
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init failed: %s", hvd_last_error());
  is_int(P, hvd_size(), "hvd_size");
  is_int(R, hvd_rank(), "hvd_rank");
  test_helpers();
  test_blocking();
  test_int_scale_rejected();
  test_async_wait();
  test_poll();
  test_nan_minmax();
  for (int i = 0; i < 3; i++)
    is_int(HVD_SUCCESS, hvd_barrier(), "barrier %d", i);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  is_int(0, hvd_is_initialized(), "not initialised after shutdown");
  return tap_mpi_finish();
}
