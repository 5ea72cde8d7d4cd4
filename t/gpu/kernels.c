/*
 * kernels.c - every device kernel of lib/ops/cuda_kernels.cu against the
 * host kernel it mirrors, on random data (fixed seed), one process:
 *
 *  - pack (hvd__cuda_pack) of a batch of odd-sized tensors, one of them
 *    empty, into a contiguous buffer: every dtype with prescale 1 (a copy)
 *    and every float dtype scaled, as hvd__scale; float32 cast to float16
 *    and bfloat16, as hvd__cast_to_wire; in place; 70001 spans in one
 *    launch (more than grid.y's 65535);
 *  - unpack (hvd__cuda_unpack): sum and average over 3 or 4 ranks with a
 *    postscale for every dtype, as hvd__reduce_finish (integer averages
 *    truncate); float16/bfloat16 back to float32, as hvd__cast_from_wire;
 *  - one tensor: hvd__cuda_scale, hvd__cuda_reduce_finish;
 *  - mixed precision's batched conversions (hvd__cuda_to_master_batch,
 *    hvd__cuda_from_master_batch): spans of float16, bfloat16 and float32
 *    of odd counts (0, 1, more than a block; one float32 span in place),
 *    scaled, against the single-tensor kernels span by span (bit for bit)
 *    and the host's half.h conversions; the found-inf flag clear on
 *    finite data and set by one planted inf; 70001 spans in one launch;
 *  - SGD (plain, momentum with dampening and weight decay, nesterov) and
 *    Adam, Adam with L2, AdamW: three steps with a changing learning rate
 *    against hvd_sgd_create/hvd_adam_create on host copies, values and
 *    state, some values and gradients infinite, NaN, subnormal or -0;
 *  - PowerSGD's kernels (prepare, P = M Q, Q^T = P^T M, the finish)
 *    against optim_math.h's host loops;
 *  - argument errors and hvd__cuda_error's message.
 *
 * The data mixes ordinary values with random bit patterns (NaN, infinity,
 * subnormals, values that round to f16 subnormals or overflow). Results
 * must be identical bit for bit, except that any NaN equals any NaN (the
 * GPU makes its own NaN payloads) - and, for the optimizers on a host
 * whose compiler contracts a * b + c into fused multiply-adds
 * (__FP_FAST_FMAF), within 1e-6 relative.
 *
 * Skips ("no CUDA device: ...") when the build has no CUDA or
 * cudaGetDeviceCount finds no device or fails.
 */
#include <config.h>

#include "gputest.h"
#include "tap.h"

#ifndef HVD_HAVE_CUDA

int main(void) { skip_all("%s", GPU_TEST_NO_CUDA); }

#else /* HVD_HAVE_CUDA */

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "hvd.h"
#include "ops/cuda_kernels.h"
#include "ops/reduce.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"
#include "optim/optimizer.h"

#define NT 12
static const int64_t counts[NT] = {1,   3,    0,    17,    255, 256,
                                   257, 1000, 4097, 65537, 33,  7};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545f4914f6cdd1dull;
}
static double uniform(double lo, double hi) { /* [lo, hi) */
  return lo + (hi - lo) * (double)(next_u64() >> 11) * 0x1p-53;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL)
    bail("out of memory (%zu bytes)", n);
  return p;
}

static void *dev_alloc(size_t n) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, n ? n : 1);
  if (e != cudaSuccess)
    bail("cudaMalloc(%zu): %s", n, cudaGetErrorString(e));
  return p;
}

static void to_dev(void *d, const void *h, size_t n) {
  cudaError_t e = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
  if (e != cudaSuccess)
    bail("cudaMemcpy to device: %s", cudaGetErrorString(e));
}

static void to_host(void *h, const void *d, size_t n) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess)
    e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess)
    bail("kernel or cudaMemcpy to host: %s", cudaGetErrorString(e));
}

/* n random elements of dtype: ordinary values, and (one in four for the
 * float types) arbitrary bit patterns. */
static void fill(void *buf, int64_t n, hvd_dtype_t dtype) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = next_u64();
    int raw = (r & 3) == 0;
    switch (dtype) {
    case HVD_FLOAT32: {
      float f = raw ? 0 : (float)(uniform(-1, 1) * pow(2, uniform(-30, 20)));
      uint32_t bits = (uint32_t)(r >> 32);
      if (raw)
        memcpy(&f, &bits, sizeof f);
      ((float *)buf)[i] = f;
      break;
    }
    case HVD_FLOAT64: {
      double d = uniform(-1, 1) * pow(2, uniform(-60, 60));
      if (raw)
        memcpy(&d, &r, sizeof d);
      ((double *)buf)[i] = d;
      break;
    }
    case HVD_FLOAT16:
      ((uint16_t *)buf)[i] =
          raw ? (uint16_t)(r >> 48) : hvd__f32_to_f16((float)uniform(-8, 8));
      break;
    case HVD_BFLOAT16:
      ((uint16_t *)buf)[i] =
          raw ? (uint16_t)(r >> 48) : hvd__f32_to_bf16((float)uniform(-8, 8));
      break;
    default:
      memcpy((char *)buf + (size_t)i * hvd_dtype_size(dtype), &r,
             hvd_dtype_size(dtype));
      break;
    }
  }
}

static int is_nan(const void *p, hvd_dtype_t dtype) {
  switch (dtype) {
  case HVD_FLOAT32:
    return isnan(*(const float *)p);
  case HVD_FLOAT64:
    return isnan(*(const double *)p);
  case HVD_FLOAT16:
    return (*(const uint16_t *)p & 0x7fff) > 0x7c00;
  case HVD_BFLOAT16:
    return (*(const uint16_t *)p & 0x7fff) > 0x7f80;
  default:
    return 0;
  }
}

/* Elements of want and got (n of dtype) that differ (any NaN equals any
 * NaN); notes the first. */
static int64_t differ(const void *want, const void *got, int64_t n,
                      hvd_dtype_t dtype, const char *where) {
  size_t es = hvd_dtype_size(dtype);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const char *w = (const char *)want + (size_t)i * es;
    const char *g = (const char *)got + (size_t)i * es;
    if (memcmp(w, g, es) == 0 || (is_nan(w, dtype) && is_nan(g, dtype)))
      continue;
    if (bad++ == 0) {
      uint64_t wb = 0, gb = 0;
      memcpy(&wb, w, es);
      memcpy(&gb, g, es);
      tap_note("%s: element %lld: want 0x%llx, got 0x%llx", where, (long long)i,
               (unsigned long long)wb, (unsigned long long)gb);
    }
  }
  return bad;
}

/* ---- a batch of tensors packed into one buffer ------------------------- */

typedef struct batch {
  int n;
  const int64_t *counts;
  int64_t total, max_count;
  int64_t *off; /* element offset of tensor i, in src and in dst */
  hvd__cuda_span_t *dev_spans;
} batch_t;

static batch_t batch_make(int n, const int64_t *cnt) {
  batch_t b = {n, cnt, 0, 0, xmalloc((size_t)n * sizeof(int64_t)), NULL};
  for (int i = 0; i < n; i++) {
    b.off[i] = b.total;
    b.total += cnt[i];
    if (cnt[i] > b.max_count)
      b.max_count = cnt[i];
  }
  b.dev_spans = dev_alloc((size_t)n * sizeof(hvd__cuda_span_t));
  return b;
}

static void batch_free(batch_t *b) {
  free(b->off);
  cudaFree(b->dev_spans);
}

/* Points the spans at src and dst (device buffers of the two dtypes). */
static void batch_spans(batch_t *b, const void *src, size_t src_es, void *dst,
                        size_t dst_es) {
  hvd__cuda_span_t *h = xmalloc((size_t)b->n * sizeof *h);
  for (int i = 0; i < b->n; i++) {
    h[i].src = (const char *)src + (size_t)b->off[i] * src_es;
    h[i].dst = (char *)dst + (size_t)b->off[i] * dst_es;
    h[i].count = b->counts[i];
  }
  to_dev(b->dev_spans, h, (size_t)b->n * sizeof *h);
  free(h);
}

typedef enum { PACK, UNPACK } dir_t;

typedef struct kcase {
  dir_t dir;
  hvd_dtype_t from, to; /* pack: dtype -> wire; unpack: wire -> dtype */
  hvd_op_t op;          /* unpack */
  double factor;        /* pack: prescale; unpack: postscale */
  int size;             /* unpack: ranks */
  int in_place;
} kcase_t;

/* The host kernel for one tensor. */
static void host_ref(const kcase_t *c, void *dst, const void *src, int64_t n) {
  if (c->dir == PACK) {
    if (c->from == c->to)
      hvd__scale(dst, src, n, c->from, c->factor);
    else
      hvd__cast_to_wire(dst, src, n, c->to, c->factor);
  } else {
    if (c->from == c->to)
      hvd__reduce_finish(dst, src, n, c->to, c->op, c->factor, c->size);
    else
      hvd__cast_from_wire(dst, src, n, c->from, c->op, c->factor, c->size);
  }
}

static void run_case(batch_t *b, const kcase_t *c) {
  size_t fs = hvd_dtype_size(c->from), ts = hvd_dtype_size(c->to);
  void *src = xmalloc((size_t)b->total * fs);
  void *want = xmalloc((size_t)b->total * ts);
  void *got = xmalloc((size_t)b->total * ts);
  void *dsrc = dev_alloc((size_t)b->total * fs);
  void *ddst = c->in_place ? dsrc : dev_alloc((size_t)b->total * ts);
  fill(src, b->total, c->from);
  to_dev(dsrc, src, (size_t)b->total * fs);
  if (!c->in_place) { /* garbage where nothing should be written */
    memset(got, 0xa5, (size_t)b->total * ts);
    to_dev(ddst, got, (size_t)b->total * ts);
  }
  for (int i = 0; i < b->n; i++)
    host_ref(c, (char *)want + (size_t)b->off[i] * ts,
             (const char *)src + (size_t)b->off[i] * fs, b->counts[i]);
  batch_spans(b, dsrc, fs, ddst, ts);
  hvd_result_t rc =
      c->dir == PACK
          ? hvd__cuda_pack(b->dev_spans, b->n, b->max_count, c->from, c->to,
                           c->factor, 0)
          : hvd__cuda_unpack(b->dev_spans, b->n, b->max_count, c->from, c->to,
                             c->op, c->factor, c->size, 0);
  char what[200];
  if (c->dir == PACK)
    snprintf(what, sizeof what, "pack %s -> %s x %g%s, %d tensors",
             hvd_dtype_name(c->from), hvd_dtype_name(c->to), c->factor,
             c->in_place ? " in place" : "", b->n);
  else
    snprintf(what, sizeof what,
             "unpack %s -> %s, %s over %d ranks, postscale %g%s, %d tensors",
             hvd_dtype_name(c->from), hvd_dtype_name(c->to), hvd_op_name(c->op),
             c->size, c->factor, c->in_place ? " in place" : "", b->n);
  tap_note("%s", hvd_last_error());
  if (is_int(HVD_SUCCESS, rc, "%s: launched", what)) {
    to_host(got, ddst, (size_t)b->total * ts);
    is_int(0, differ(want, got, b->total, c->to, what), "%s: as the host",
           what);
  } else {
    skip(1, "not launched");
  }
  if (!c->in_place)
    cudaFree(ddst);
  cudaFree(dsrc);
  free(src);
  free(want);
  free(got);
}

static const hvd_dtype_t all_dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                         HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                         HVD_FLOAT32, HVD_FLOAT64};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

static int is_float(hvd_dtype_t d) {
  return d == HVD_FLOAT16 || d == HVD_BFLOAT16 || d == HVD_FLOAT32 ||
         d == HVD_FLOAT64;
}

static void pack_unpack(void) {
  batch_t b = batch_make(NT, counts);
  for (int k = 0; k < NDTYPES; k++) {
    hvd_dtype_t d = all_dtypes[k];
    run_case(&b, &(kcase_t){PACK, d, d, HVD_SUM, 1.0, 1, 0});
    run_case(&b, &(kcase_t){UNPACK, d, d, HVD_SUM, 1.0, 4, 0});
    run_case(&b, &(kcase_t){UNPACK, d, d, HVD_AVERAGE, 1.0, 3, 0});
    if (!is_float(d))
      continue;
    run_case(&b, &(kcase_t){PACK, d, d, HVD_SUM, 1.0 / 3, 1, 0});
    run_case(&b, &(kcase_t){PACK, d, d, HVD_SUM, 0.5, 1, 1});
    run_case(&b, &(kcase_t){UNPACK, d, d, HVD_AVERAGE, 0.5, 3, 0});
    run_case(&b, &(kcase_t){UNPACK, d, d, HVD_AVERAGE, 1.0, 4, 1});
    run_case(&b, &(kcase_t){UNPACK, d, d, HVD_MAX, 2.5, 4, 0});
  }
  run_case(&b, &(kcase_t){PACK, HVD_INT32, HVD_INT32, HVD_SUM, 1.0, 1, 1});
  run_case(&b,
           &(kcase_t){UNPACK, HVD_INT64, HVD_INT64, HVD_AVERAGE, 1.0, 3, 1});
  for (int w = 0; w < 2; w++) {
    hvd_dtype_t wire = w ? HVD_BFLOAT16 : HVD_FLOAT16;
    run_case(&b, &(kcase_t){PACK, HVD_FLOAT32, wire, HVD_SUM, 1.0, 1, 0});
    run_case(&b, &(kcase_t){PACK, HVD_FLOAT32, wire, HVD_SUM, 1.0 / 3, 1, 0});
    run_case(&b, &(kcase_t){UNPACK, wire, HVD_FLOAT32, HVD_SUM, 1.0, 2, 0});
    run_case(&b, &(kcase_t){UNPACK, wire, HVD_FLOAT32, HVD_AVERAGE, 0.5, 3, 0});
  }
  batch_free(&b);

  /* More spans than grid.y's 65535, of 0 to 2 elements. */
  enum { MANY = 70001 };
  int64_t *many = xmalloc(MANY * sizeof *many);
  for (int i = 0; i < MANY; i++)
    many[i] = i % 3;
  b = batch_make(MANY, many);
  run_case(&b, &(kcase_t){PACK, HVD_FLOAT32, HVD_FLOAT32, HVD_SUM, 0.25, 1, 0});
  run_case(&b, &(kcase_t){UNPACK, HVD_BFLOAT16, HVD_FLOAT32, HVD_AVERAGE, 1.0,
                          2, 0});
  batch_free(&b);
  free(many);
}

/* hvd__cuda_scale and hvd__cuda_reduce_finish on one tensor. */
static void single(hvd_dtype_t dtype, int finish, hvd_op_t op, double factor,
                   int size, int in_place) {
  const int64_t n = 65537;
  size_t es = hvd_dtype_size(dtype), bytes = (size_t)n * es;
  void *src = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes);
  void *dsrc = dev_alloc(bytes), *ddst = in_place ? dsrc : dev_alloc(bytes);
  fill(src, n, dtype);
  to_dev(dsrc, src, bytes);
  hvd_result_t rc;
  char what[160];
  if (finish) {
    hvd__reduce_finish(want, src, n, dtype, op, factor, size);
    rc = hvd__cuda_reduce_finish(ddst, dsrc, n, dtype, op, factor, size, 0);
    snprintf(what, sizeof what, "reduce_finish %s %s over %d, postscale %g%s",
             hvd_dtype_name(dtype), hvd_op_name(op), size, factor,
             in_place ? " in place" : "");
  } else {
    hvd__scale(want, src, n, dtype, factor);
    rc = hvd__cuda_scale(ddst, dsrc, n, dtype, factor, 0);
    snprintf(what, sizeof what, "scale %s x %g%s", hvd_dtype_name(dtype),
             factor, in_place ? " in place" : "");
  }
  tap_note("%s", hvd_last_error());
  if (is_int(HVD_SUCCESS, rc, "%s: launched", what)) {
    to_host(got, ddst, bytes);
    is_int(0, differ(want, got, n, dtype, what), "%s: as the host", what);
  } else {
    skip(1, "not launched");
  }
  if (!in_place)
    cudaFree(ddst);
  cudaFree(dsrc);
  free(src);
  free(want);
  free(got);
}

/* hvd__cuda_grad_scale (lib/optim's in-place float32 scale) against the
 * host's hvd__scale, and its argument check. */
static void grad_scale(double factor) {
  const int64_t n = 65537;
  size_t bytes = (size_t)n * sizeof(float);
  float *src = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes);
  float *dx = dev_alloc(bytes);
  fill(src, n, HVD_FLOAT32);
  to_dev(dx, src, bytes);
  hvd__scale(want, src, n, HVD_FLOAT32, factor);
  hvd_result_t rc = hvd__cuda_grad_scale(dx, n, factor, 0);
  if (is_int(HVD_SUCCESS, rc, "grad_scale x %g: launched", factor)) {
    to_host(got, dx, bytes);
    is_int(0, differ(want, got, n, HVD_FLOAT32, "grad_scale"),
           "grad_scale x %g: as the host's hvd__scale", factor);
  } else {
    skip(1, "not launched");
  }
  cudaFree(dx);
  free(src);
  free(want);
  free(got);
}

/* ---- PowerSGD ------------------------------------------------------------ */

/* hvd__cuda_psgd_* against optim_math.h's host loops (lib/optim/powersgd.c's
 * arithmetic), bit for bit: M 37 x 70 (two full warps of lanes and a
 * partial one), r 3; prepare (x 0.5 plus e), P = M Q, Q^T = P^T M (one
 * row of P zero: skipped; and of 150 rows, three chunks folded), the
 * finish with and without keeping e. */
static void psgd_kernels(void) {
  enum { N = 37, M = 70, R = 3 };
  static float m[N * M], e[N * M], p[N * R], q[R * M];
  static float wm[N * M], we[N * M], wp[N * R], wq[R * M], got[N * M];
  for (int k = 0; k < N * M; k++) {
    m[k] = (float)uniform(-2, 2);
    e[k] = (float)uniform(-0.5, 0.5);
  }
  for (int k = 0; k < R * M; k++)
    q[k] = (float)uniform(-1, 1);
  float *dm = dev_alloc(sizeof m), *de = dev_alloc(sizeof e),
        *dp = dev_alloc(sizeof p), *dq = dev_alloc(sizeof q);
  to_dev(dm, m, sizeof m);
  to_dev(de, e, sizeof e);
  to_dev(dq, q, sizeof q);
  /* prepare */
  memcpy(wm, m, sizeof m);
  for (int64_t k = 0; k < N * M; k++)
    hvd__km_psgd_prepare(wm, e, 0.5f, k);
  is_int(HVD_SUCCESS, hvd__cuda_psgd_prepare(dm, de, N * M, 0.5, 0),
         "psgd prepare: launched");
  to_host(got, dm, sizeof m);
  is_int(0, differ(wm, got, N * M, HVD_FLOAT32, "psgd prepare"),
         "psgd prepare: M * 0.5 + e as the host's");
  /* P = M Q */
  for (int a = 0; a < N; a++)
    for (int j = 0; j < R; j++)
      wp[a * R + j] = hvd__km_psgd_dot(wm + a * M, q + j * M, M);
  is_int(HVD_SUCCESS, hvd__cuda_psgd_mq(dm, dq, dp, N, M, R, 0),
         "psgd mq: launched");
  to_host(got, dp, sizeof p);
  is_int(0, differ(wp, got, N * R, HVD_FLOAT32, "psgd mq"),
         "psgd mq: P = M Q as the host's (lanes of double folded pairwise)");
  /* Q^T = P^T M, row 5 of P zero */
  for (int j = 0; j < R; j++)
    wp[5 * R + j] = 0;
  to_dev(dp, wp, sizeof p);
  for (int j = 0; j < R; j++)
    for (int b = 0; b < M; b++)
      wq[j * M + b] = hvd__km_psgd_mtp(wm, wp, N, M, R, j, b);
  is_int(HVD_SUCCESS, hvd__cuda_psgd_mtp(dm, dp, dq, NULL, N, M, R, 0),
         "psgd mtp: launched (one chunk of rows)");
  to_host(got, dq, sizeof q);
  is_int(0, differ(wq, got, R * M, HVD_FLOAT32, "psgd mtp"),
         "psgd mtp: Q^T = P^T M as the host's");
  /* Q^T of 150 rows: three chunks, their parts folded in order */
  {
    enum { N2 = 150 };
    static float m2[N2 * M], p2[N2 * R], w2[R * M], g2[R * M];
    for (int k = 0; k < N2 * M; k++)
      m2[k] = (float)uniform(-2, 2);
    for (int k = 0; k < N2 * R; k++)
      p2[k] = k / R == 70 ? 0.0f : (float)uniform(-1, 1);
    for (int j = 0; j < R; j++)
      for (int b = 0; b < M; b++)
        w2[j * M + b] = hvd__km_psgd_mtp(m2, p2, N2, M, R, j, b);
    float *dm2 = dev_alloc(sizeof m2), *dp2 = dev_alloc(sizeof p2),
          *dq2 = dev_alloc(sizeof g2), *dparts = dev_alloc(3 * sizeof g2);
    to_dev(dm2, m2, sizeof m2);
    to_dev(dp2, p2, sizeof p2);
    is_int(HVD_SUCCESS, hvd__cuda_psgd_mtp(dm2, dp2, dq2, dparts, N2, M, R, 0),
           "psgd mtp: launched (150 rows: three chunks)");
    to_host(g2, dq2, sizeof g2);
    is_int(0, differ(w2, g2, R * M, HVD_FLOAT32, "psgd mtp chunks"),
           "psgd mtp: three chunks folded in order, as the host's");
    is_int(HVD_ERR_INVALID_ARG,
           hvd__cuda_psgd_mtp(dm2, dp2, dq2, NULL, N2, M, R, 0),
           "psgd mtp: no parts for three chunks is rejected");
    cudaFree(dm2);
    cudaFree(dp2);
    cudaFree(dq2);
    cudaFree(dparts);
  }
  /* the finish, keeping e, then not */
  for (int keep = 1; keep >= 0; keep--) {
    memcpy(we, e, sizeof e);
    float *hm = keep ? wm : m; /* the second round starts from m again */
    float want_m[N * M];
    memcpy(want_m, hm, sizeof m);
    to_dev(dm, want_m, sizeof m);
    to_dev(de, e, sizeof e);
    for (int64_t k = 0; k < N * M; k++)
      hvd__km_psgd_finish(want_m, we, wp, wq, M, R, 0.25f, 1.0f / 3, keep, k);
    is_int(
        HVD_SUCCESS,
        hvd__cuda_psgd_finish(dm, de, dp, dq, N, M, R, 0.25, 1.0f / 3, keep, 0),
        "psgd finish (keep %d): launched", keep);
    to_host(got, dm, sizeof m);
    int bad = (int)differ(want_m, got, N * M, HVD_FLOAT32, "psgd finish M");
    to_host(got, de, sizeof e);
    bad += (int)differ(we, got, N * M, HVD_FLOAT32, "psgd finish e");
    is_int(0, bad, "psgd finish (keep %d): M and e as the host's", keep);
  }
  is_int(HVD_ERR_INVALID_ARG, hvd__cuda_psgd_mq(dm, dq, dp, N, M, 0, 0),
         "psgd mq: r 0 is rejected");
  is_string("hvd__cuda_psgd_mq: n 37, m 70 or r 0", hvd_last_error(),
            "psgd mq: the message names the call and the shape");
  cudaFree(dm);
  cudaFree(de);
  cudaFree(dp);
  cudaFree(dq);
}

/* ---- mixed precision: batched conversions ------------------------------ */

/* A batch of conversions laid out in two device buffers: the value side
 * (span t's count elements of dtype[t] at byte lo[t], 4-aligned, padding
 * between) and the float32 master side (at byte mo[t], contiguous).
 * to_master reads the value side into the master side, except span
 * in_place (float32), converted where it is; from_master writes the
 * value side from the master side. */
typedef struct conv {
  int n;
  const int64_t *count;
  const hvd_dtype_t *dtype;
  size_t *lo, *mo, lbytes, mbytes;
  int64_t max_count;
  int in_place; /* -1: none */
  int single;   /* also against the single-tensor kernels (few spans) */
  hvd__cuda_convert_span_t *dev_spans;
} conv_t;

static conv_t conv_make(int n, const int64_t *count, const hvd_dtype_t *dtype,
                        int in_place) {
  conv_t c = {.n = n, .count = count, .dtype = dtype, .in_place = in_place};
  c.lo = xmalloc((size_t)n * sizeof(size_t));
  c.mo = xmalloc((size_t)n * sizeof(size_t));
  c.single = n < 100;
  for (int t = 0; t < n; t++) {
    c.lo[t] = c.lbytes;
    c.lbytes = (c.lbytes + (size_t)count[t] * hvd_dtype_size(dtype[t]) + 3) &
               ~(size_t)3;
    c.mo[t] = c.mbytes;
    c.mbytes += (size_t)count[t] * sizeof(float);
    if (count[t] > c.max_count)
      c.max_count = count[t];
  }
  c.dev_spans = dev_alloc((size_t)n * sizeof *c.dev_spans);
  return c;
}

static void conv_free(conv_t *c) {
  free(c->lo);
  free(c->mo);
  cudaFree(c->dev_spans);
}

/* The spans over device buffers val (value side) and mst (master side). */
static void conv_spans(const conv_t *c, int to_master, char *val, char *mst) {
  hvd__cuda_convert_span_t *h = xmalloc((size_t)c->n * sizeof *h);
  for (int t = 0; t < c->n; t++) {
    void *v = val + c->lo[t], *m = mst + c->mo[t];
    h[t].src = to_master ? v : m;
    h[t].dst = !to_master ? v : t == c->in_place ? v : m;
    h[t].count = c->count[t];
    h[t].dtype = c->dtype[t];
  }
  to_dev(c->dev_spans, h, (size_t)c->n * sizeof *h);
  free(h);
}

/* A device buffer of n bytes holding host bytes h (or 0xa5 garbage). */
static void *dev_with(const void *h, size_t n) {
  void *d = dev_alloc(n);
  void *g = NULL;
  if (h == NULL) {
    g = xmalloc(n);
    memset(g, 0xa5, n);
  }
  to_dev(d, h != NULL ? h : g, n);
  free(g);
  return d;
}

/* n values of a float dtype: fill()'s mix (raw), else ordinary finite
 * ones that stay finite times a factor below 2^80. */
static void fill_values(void *buf, int64_t n, hvd_dtype_t d, int raw) {
  if (raw) {
    fill(buf, n, d);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float f = (float)(uniform(-1, 1) * pow(2, uniform(-30, 20)));
    if (d == HVD_FLOAT32)
      ((float *)buf)[i] = f;
    else
      ((uint16_t *)buf)[i] =
          d == HVD_FLOAT16 ? hvd__f32_to_f16(f / 0x1p12f) : hvd__f32_to_bf16(f);
  }
}

/* The host's conversion (mixed.c's host loop): 1 when a result is not
 * finite. */
static int host_to_master(const void *src, hvd_dtype_t d, float *dst, int64_t n,
                          float f) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint16_t h = d != HVD_FLOAT32 ? ((const uint16_t *)src)[i] : 0;
    float v = d == HVD_FLOAT16    ? hvd__f16_to_f32(h)
              : d == HVD_BFLOAT16 ? hvd__bf16_to_f32(h)
                                  : ((const float *)src)[i];
    dst[i] = v * f;
    bad |= !isfinite(dst[i]);
  }
  return bad;
}

/* Value-side buffers that differ: elements by their span's dtype (any
 * NaN equals any NaN), the padding between spans byte for byte. */
static int64_t val_differ(const conv_t *c, const char *want, const char *got,
                          const char *what) {
  int64_t bad = 0;
  size_t at = 0;
  for (int t = 0; t <= c->n; t++) {
    size_t end = t < c->n ? c->lo[t] : c->lbytes;
    bad += end > at && memcmp(want + at, got + at, end - at) != 0;
    if (t == c->n)
      break;
    bad +=
        differ(want + c->lo[t], got + c->lo[t], c->count[t], c->dtype[t], what);
    at = c->lo[t] + (size_t)c->count[t] * hvd_dtype_size(c->dtype[t]);
  }
  return bad;
}

/* The checks of one conversion batch: launched, as the host, bit for bit
 * as the single-tensor kernels (when c->single), and the flag (to_master:
 * flag holds the host's, the batch's and the single kernels'). */
static void conv_report(const conv_t *c, const char *what, hvd_result_t rc,
                        int64_t host_bad, int single_same, const int *flag) {
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: launched", what)) {
    skip(1 + c->single + (flag != NULL) * (1 + c->single), "not launched");
    return;
  }
  is_int(0, host_bad, "%s: as the host", what);
  if (c->single)
    ok(single_same, "%s: bit for bit as the single-tensor kernel", what);
  if (flag == NULL)
    return;
  is_int(flag[0], flag[1], "%s: the flag %s, as the host's", what,
         flag[0] ? "set" : "clear");
  if (c->single)
    is_int(flag[2], flag[1], "%s: the flag as the single kernels'", what);
}

/* hvd__cuda_to_master_batch times factor over values of c's dtypes
 * (raw: fill()'s mix, else finite), with an inf in span `plant` (-1:
 * none), against the host and against hvd__cuda_to_master span by span
 * (run first: span in_place is overwritten by the batch) when c->single. */
static void to_master_case(const conv_t *c, double factor, int raw, int plant,
                           const char *what) {
  char *val = xmalloc(c->lbytes), *gval = xmalloc(c->lbytes);
  char *want = xmalloc(c->mbytes), *got = xmalloc(c->mbytes);
  char *ref = xmalloc(c->mbytes);
  int flag[3] = {0, 0, 0}; /* host, batch, single */
  memset(val, 0, c->lbytes);
  for (int t = 0; t < c->n; t++)
    fill_values(val + c->lo[t], c->count[t], c->dtype[t], raw);
  if (plant >= 0) {
    int64_t i = c->count[plant] / 2;
    if (c->dtype[plant] == HVD_FLOAT32)
      ((float *)(val + c->lo[plant]))[i] = INFINITY;
    else
      ((uint16_t *)(val + c->lo[plant]))[i] =
          c->dtype[plant] == HVD_FLOAT16 ? 0x7c00 : 0x7f80;
  }
  memset(want, 0xa5, c->mbytes);
  for (int t = 0; t < c->n; t++)
    flag[0] |=
        host_to_master(val + c->lo[t], c->dtype[t], (float *)(want + c->mo[t]),
                       c->count[t], (float)factor);
  char *dval = dev_with(val, c->lbytes), *dm = dev_with(NULL, c->mbytes);
  char *dref = dev_with(NULL, c->mbytes);
  int *dflag = dev_with(flag + 1, 2 * sizeof(int));
  hvd_result_t rc = HVD_SUCCESS;
  for (int t = 0; c->single && t < c->n && rc == HVD_SUCCESS; t++)
    rc = hvd__cuda_to_master(dval + c->lo[t], c->dtype[t],
                             (float *)(dref + c->mo[t]), c->count[t], factor,
                             dflag + 1, 0);
  if (rc != HVD_SUCCESS)
    bail("%s: hvd__cuda_to_master: %s", what, hvd_last_error());
  conv_spans(c, 1, dval, dm);
  rc = hvd__cuda_to_master_batch(c->dev_spans, c->n, c->max_count, factor,
                                 dflag, 0);
  to_host(gval, dval, c->lbytes);
  to_host(got, dm, c->mbytes);
  to_host(ref, dref, c->mbytes);
  to_host(flag + 1, dflag, 2 * sizeof(int));
  int64_t bad = 0;
  if (c->in_place >= 0) { /* its master side untouched; its result */
    size_t at = c->mo[c->in_place], n = (size_t)c->count[c->in_place] * 4;
    for (size_t i = 0; i < n; i++)
      bad += (unsigned char)got[at + i] != 0xa5;
    memcpy(got + at, gval + c->lo[c->in_place], n);
  }
  bad += differ(want, got, (int64_t)(c->mbytes / 4), HVD_FLOAT32, what);
  conv_report(c, what, rc, bad, memcmp(ref, got, c->mbytes) == 0, flag);
  cudaFree(dval);
  cudaFree(dm);
  cudaFree(dref);
  cudaFree(dflag);
  free(val);
  free(gval);
  free(want);
  free(got);
  free(ref);
}

/* hvd__cuda_from_master_batch of fill()'s float32 mix (NaN, infinity,
 * subnormals, overflow) into c's float16/bfloat16 spans, against the
 * host's half.h and (c->single) hvd__cuda_from_master span by span. */
static void from_master_case(const conv_t *c, const char *what) {
  float *mst = xmalloc(c->mbytes);
  char *want = xmalloc(c->lbytes), *got = xmalloc(c->lbytes);
  char *ref = xmalloc(c->lbytes);
  fill(mst, (int64_t)(c->mbytes / 4), HVD_FLOAT32);
  memset(want, 0xa5, c->lbytes);
  for (int t = 0; t < c->n; t++) {
    const float *m = (const float *)((const char *)mst + c->mo[t]);
    uint16_t *v = (uint16_t *)(want + c->lo[t]);
    for (int64_t i = 0; i < c->count[t]; i++)
      v[i] = c->dtype[t] == HVD_FLOAT16 ? hvd__f32_to_f16(m[i])
                                        : hvd__f32_to_bf16(m[i]);
  }
  char *dm = dev_with(mst, c->mbytes), *dval = dev_with(NULL, c->lbytes);
  char *dref = dev_with(NULL, c->lbytes);
  hvd_result_t rc = HVD_SUCCESS;
  for (int t = 0; c->single && t < c->n && rc == HVD_SUCCESS; t++)
    rc = hvd__cuda_from_master((const float *)(dm + c->mo[t]), dref + c->lo[t],
                               c->dtype[t], c->count[t], 0);
  if (rc != HVD_SUCCESS)
    bail("%s: hvd__cuda_from_master: %s", what, hvd_last_error());
  conv_spans(c, 0, dval, dm);
  rc = hvd__cuda_from_master_batch(c->dev_spans, c->n, c->max_count, 0);
  to_host(got, dval, c->lbytes);
  to_host(ref, dref, c->lbytes);
  conv_report(c, what, rc, val_differ(c, want, got, what),
              memcmp(ref, got, c->lbytes) == 0, NULL);
  cudaFree(dm);
  cudaFree(dval);
  cudaFree(dref);
  free(mst);
  free(want);
  free(got);
  free(ref);
}

/* The batched calls' own argument checks, and the spans' check that
 * lib/optim/device.c runs before filling a batch. */
static void conv_errors(void) {
  int *dflag = dev_with(&(int){0}, sizeof(int)), flag = -1;
  hvd__cuda_convert_span_t *dspans = dev_with(NULL, sizeof *dspans);
  hvd_result_t rc = hvd__cuda_to_master_batch(NULL, 2, 1, 1.0, dflag, 0);
  is_int(HVD_ERR_INVALID_ARG, rc, "to_master_batch: NULL spans are refused");
  is_string("hvd__cuda_to_master_batch: spans is NULL (n 2)", hvd_last_error(),
            "to_master_batch: and says so");
  rc = hvd__cuda_from_master_batch(dspans, -1, 0, 0);
  is_string("hvd__cuda_from_master_batch: n -1 or max_count 0 is negative",
            hvd_last_error(), "from_master_batch: a negative n is refused");
  rc = hvd__cuda_to_master_batch(dspans, 0, 0, 2.0, dflag, 0);
  is_int(HVD_SUCCESS, rc, "to_master_batch: an empty batch launches nothing");
  rc = hvd__cuda_from_master_batch(dspans, 1, 0, 0);
  is_int(HVD_SUCCESS, rc,
         "from_master_batch: max_count 0 launches nothing (spans unread)");
  to_host(&flag, dflag, sizeof flag);
  is_int(0, flag, "to_master_batch: and leaves the flag alone");
  rc = hvd__km_check_convert("hvd__cuda_from_master_batch", 3, 4, HVD_FLOAT32,
                             0);
  is_string("hvd__cuda_from_master_batch: span 3: n 4 or dtype 6",
            hvd_last_error(),
            "from_master_batch: a float32 destination is "
            "refused where the spans are filled");
  is_int(HVD_SUCCESS,
         hvd__km_check_convert("x", 0, 0, HVD_FLOAT32, 1) |
             hvd__km_check_convert("x", 0, 5, HVD_BFLOAT16, 0),
         "float32 sources and bfloat16 destinations are accepted");
  rc =
      hvd__km_check_convert("hvd__cuda_to_master_batch", 1, -2, HVD_FLOAT16, 1);
  is_string("hvd__cuda_to_master_batch: span 1: n -2 or dtype 4",
            hvd_last_error(), "to_master_batch: a negative count is refused");
  cudaFree(dspans);
  cudaFree(dflag);
}

#define NC 9
static const int64_t ccounts[NC] = {5, 0, 257, 1, 4099, 300, 256, 1000, 33};
static const hvd_dtype_t cdtypes[NC] = {
    HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_BFLOAT16, HVD_FLOAT16,
    HVD_FLOAT32, HVD_BFLOAT16, HVD_FLOAT16, HVD_FLOAT32};
static const hvd_dtype_t chalves[NC] = {
    HVD_FLOAT16,  HVD_BFLOAT16, HVD_BFLOAT16, HVD_FLOAT16, HVD_FLOAT16,
    HVD_BFLOAT16, HVD_BFLOAT16, HVD_FLOAT16,  HVD_BFLOAT16};

static void mixed_batches(void) {
  conv_t c = conv_make(NC, ccounts, cdtypes, 5);
  to_master_case(&c, 1.0 / 3, 0, -1,
                 "to_master_batch x 1/3, 9 mixed spans, finite");
  to_master_case(&c, 1.0 / 3, 0, 4,
                 "to_master_batch x 1/3, 9 mixed spans, an inf in span 4");
  to_master_case(&c, 0.5, 1, -1, "to_master_batch x 0.5, 9 mixed spans, raw");
  to_master_case(&c, 1.0, 0, 8, "to_master_batch x 1, an inf in span 8");
  conv_free(&c);
  c = conv_make(NC, ccounts, chalves, -1);
  from_master_case(&c, "from_master_batch, 9 float16/bfloat16 spans");
  conv_free(&c);

  /* More spans than grid.y's 65535: every one past 65530 and every 16th
   * before of 1 to 3 elements, the others empty (few writes: the
   * stand-in's stream-order check costs the square of their number). */
  enum { MANY = 70001 };
  int64_t *many = xmalloc(MANY * sizeof *many);
  hvd_dtype_t *types = xmalloc(MANY * sizeof *types);
  for (int i = 0; i < MANY; i++) {
    many[i] = i % 16 == 0 || i >= 65530 ? 1 + i % 3 : 0;
    types[i] = cdtypes[i % NC];
  }
  c = conv_make(MANY, many, types, -1);
  to_master_case(&c, 0.25, 0, MANY - 1,
                 "to_master_batch x 0.25, 70001 spans, an inf in the last");
  conv_free(&c);
  for (int i = 0; i < MANY; i++)
    types[i] = chalves[i % NC];
  c = conv_make(MANY, many, types, -1);
  from_master_case(&c, "from_master_batch, 70001 spans");
  conv_free(&c);
  free(many);
  free(types);
  conv_errors();
}

/* ---- optimizers -------------------------------------------------------- */

#define NP 5
static const int64_t pcounts[NP] = {1, 7, 300, 4099, 65537};

/* Values of want and got (n floats) further apart than allowed; any NaN
 * equals any NaN (the GPU makes its own payloads). */
static int64_t differ_f32(const float *want, const float *got, int64_t n,
                          const char *where) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
#ifdef __FP_FAST_FMAF
    int same = fabsf(want[i] - got[i]) <= 1e-6f * fmaxf(1.0f, fabsf(want[i]));
    same = same || (isinf(want[i]) && want[i] == got[i]);
#else
    int same = memcmp(&want[i], &got[i], sizeof want[i]) == 0;
#endif
    same = same || (isnan(want[i]) && isnan(got[i]));
    if (!same && bad++ == 0)
      tap_note("%s: element %lld: want %.9g, got %.9g", where, (long long)i,
               want[i], got[i]);
  }
  return bad;
}

typedef struct optcase {
  const char *name;
  int adam;
  hvd_sgd_options_t sgd;
  hvd_adam_options_t ad;
} optcase_t;

static void run_optimizer(const optcase_t *c) {
  hvd_param_t params[NP];
  hvd__cuda_param_span_t spans[NP];
  float *dev[NP][4]; /* value, grad, state 0, state 1 */
  int64_t max_count = 0;
  int nstate = c->adam ? 2 : c->sgd.momentum != 0 ? 1 : 0;
  for (int i = 0; i < NP; i++) {
    int64_t n = pcounts[i];
    size_t bytes = (size_t)n * sizeof(float);
    float *v = xmalloc(bytes), *g = xmalloc(bytes);
    for (int64_t j = 0; j < n; j++)
      v[j] = (float)uniform(-1, 1);
    if (i == 2) { /* non-finite and subnormal values (AdamW keeps inf) */
      v[0] = INFINITY;
      v[1] = -INFINITY;
      v[2] = NAN;
      v[3] = 1e-40f;
      v[4] = -0.0f;
    }
    memset(g, 0, bytes);
    char *name = xmalloc(16);
    snprintf(name, 16, "p%d", i);
    params[i].name = name;
    params[i].value = hvd_tensor_make(v, HVD_FLOAT32, 1, &pcounts[i]);
    params[i].grad = hvd_tensor_make(g, HVD_FLOAT32, 1, &pcounts[i]);
    for (int k = 0; k < 4; k++) {
      dev[i][k] = dev_alloc(bytes);
      cudaMemset(dev[i][k], 0, bytes);
    }
    to_dev(dev[i][0], v, bytes);
    spans[i] = (hvd__cuda_param_span_t){
        dev[i][0], dev[i][1], {dev[i][2], dev[i][3]}, n};
    if (n > max_count)
      max_count = n;
  }
  hvd__cuda_param_span_t *dspans = dev_alloc(sizeof spans);
  to_dev(dspans, spans, sizeof spans);

  hvd_optimizer_t *opt = NULL;
  hvd_result_t rc = c->adam ? hvd_adam_create(params, NP, &c->ad, &opt)
                            : hvd_sgd_create(params, NP, &c->sgd, &opt);
  if (rc != HVD_SUCCESS)
    bail("%s: create: %s", c->name, hvd_last_error());
  double lr0 = c->adam ? c->ad.lr : c->sgd.lr;
  int launched = 1;
  for (int step = 1; step <= 3; step++) {
    double lr = lr0 / (1 << (step - 1));
    if (step > 1)
      hvd_optimizer_zero_grad(opt);
    for (int i = 0; i < NP; i++) {
      float *g = params[i].grad.data;
      for (int64_t j = 0; j < pcounts[i]; j++)
        g[j] = (float)uniform(-1, 1);
      if (i == 2) { /* non-finite and subnormal gradients */
        g[5] = step == 2 ? INFINITY : g[5];
        g[6] = step == 3 ? NAN : g[6];
        g[7] = 1e-40f;
        g[8] = -0.0f;
      }
      to_dev(dev[i][1], g, (size_t)pcounts[i] * sizeof(float));
    }
    if (hvd_optimizer_set_lr(opt, lr) != HVD_SUCCESS ||
        hvd_optimizer_step(opt) != HVD_SUCCESS)
      bail("%s: host step %d: %s", c->name, step, hvd_last_error());
    rc = c->adam
             ? hvd__cuda_adam_step(dspans, NP, max_count, &c->ad, step, lr, 0)
             : hvd__cuda_sgd_step(dspans, NP, max_count, &c->sgd, step, lr, 0);
    if (rc != HVD_SUCCESS) {
      tap_note("step %d: %s", step, hvd_last_error());
      launched = 0;
      break;
    }
  }
  if (is_int(1, launched, "%s: three steps launched", c->name)) {
    int64_t bad = 0;
    for (int i = 0; i < NP; i++) {
      size_t bytes = (size_t)pcounts[i] * sizeof(float);
      float *got = xmalloc(bytes);
      char where[64];
      snprintf(where, sizeof where, "%s value", params[i].name);
      to_host(got, dev[i][0], bytes);
      bad += differ_f32(params[i].value.data, got, pcounts[i], where);
      for (int k = 0; k < nstate; k++) {
        snprintf(where, sizeof where, "%s %s", params[i].name,
                 opt->ops.state_names[k]);
        to_host(got, dev[i][2 + k], bytes);
        bad +=
            differ_f32(opt->state[i * nstate + k].data, got, pcounts[i], where);
      }
      free(got);
    }
    is_int(0, bad, "%s: values and state as the host's after 3 steps", c->name);
  } else {
    skip(1, "not launched");
  }
  hvd_optimizer_destroy(opt);
  cudaFree(dspans);
  for (int i = 0; i < NP; i++) {
    free(params[i].value.data);
    free(params[i].grad.data);
    free((char *)params[i].name);
    for (int k = 0; k < 4; k++)
      cudaFree(dev[i][k]);
  }
}

static void optimizers(void) {
  optcase_t c;
  memset(&c, 0, sizeof c);
  hvd_sgd_options_init(&c.sgd);
  c.name = "SGD lr 0.1";
  c.sgd.lr = 0.1;
  run_optimizer(&c);
  c.name = "SGD momentum 0.9, dampening 0.1, weight decay 1e-3";
  c.sgd.lr = 0.05;
  c.sgd.momentum = 0.9;
  c.sgd.dampening = 0.1;
  c.sgd.weight_decay = 1e-3;
  run_optimizer(&c);
  c.name = "SGD nesterov, momentum 0.9, weight decay 1e-2";
  c.sgd.dampening = 0;
  c.sgd.weight_decay = 1e-2;
  c.sgd.nesterov = 1;
  run_optimizer(&c);

  memset(&c, 0, sizeof c);
  c.adam = 1;
  hvd_adam_options_init(&c.ad);
  c.name = "Adam defaults";
  run_optimizer(&c);
  c.name = "Adam lr 1e-2, weight decay 1e-2 (L2)";
  c.ad.lr = 1e-2;
  c.ad.weight_decay = 1e-2;
  run_optimizer(&c);
  c.name = "AdamW lr 1e-2, weight decay 1e-2, betas 0.8/0.99, eps 1e-6";
  c.ad.decoupled = 1;
  c.ad.beta1 = 0.8;
  c.ad.beta2 = 0.99;
  c.ad.eps = 1e-6;
  run_optimizer(&c);
}

/* ---- errors ------------------------------------------------------------ */

static void errors(void) {
  hvd__cuda_span_t *dspans = dev_alloc(sizeof(hvd__cuda_span_t));
  hvd_result_t rc =
      hvd__cuda_pack(dspans, 1, 1, HVD_FLOAT64, HVD_FLOAT16, 1.0, 0);
  is_int(HVD_ERR_INVALID_ARG, rc, "pack float64 -> float16 is refused");
  is_string("hvd__cuda_pack: no conversion from float64 to float16",
            hvd_last_error(), "and says so");
  rc = hvd__cuda_unpack(dspans, 1, 1, HVD_FLOAT32, HVD_FLOAT16, HVD_SUM, 1.0, 1,
                        0);
  is_int(HVD_ERR_INVALID_ARG, rc, "unpack float32 -> float16 is refused");
  is_string("hvd__cuda_unpack: no conversion from float32 to float16",
            hvd_last_error(), "and says so");
  rc = hvd__cuda_pack(NULL, 2, 1, HVD_FLOAT32, HVD_FLOAT32, 1.0, 0);
  is_string("hvd__cuda_pack: spans is NULL (n 2)", hvd_last_error(),
            "NULL spans are refused");
  rc = hvd__cuda_sgd_step(NULL, 0, 0, NULL, 1, 0.1, 0);
  is_string("hvd__cuda_sgd_step: options are NULL", hvd_last_error(),
            "NULL options are refused");
  is_int(HVD_SUCCESS,
         hvd__cuda_pack(dspans, 0, 0, HVD_FLOAT32, HVD_FLOAT32, 2.0, 0),
         "an empty batch launches nothing");
  rc = hvd__cuda_error(cudaErrorInvalidValue, "cudaMemcpy(a, b, n)");
  is_int(HVD_ERR_CUDA, rc, "hvd__cuda_error gives HVD_ERR_CUDA");
  char want[256];
  snprintf(want, sizeof want, "cudaMemcpy: %s (cudaErrorInvalidValue)",
           cudaGetErrorString(cudaErrorInvalidValue));
  is_string(want, hvd_last_error(), "with the call and CUDA's words");
  cudaFree(dspans);
}

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  gpu_devices_or_skip(e, count);
  e = cudaSetDevice(0);
  if (e != cudaSuccess)
    bail("cudaSetDevice(0): %s", cudaGetErrorString(e));
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    diag("device 0: %s, compute capability %d.%d", prop.name, prop.major,
         prop.minor);
#ifdef __FP_FAST_FMAF
  diag("host compiler contracts into FMAs: optimizers compared within 1e-6");
#endif
  pack_unpack();
  single(HVD_FLOAT32, 0, HVD_SUM, 0.25, 1, 0);
  single(HVD_BFLOAT16, 0, HVD_SUM, 1.0 / 3, 1, 1);
  single(HVD_FLOAT16, 0, HVD_SUM, 1.0, 1, 0);
  single(HVD_FLOAT64, 1, HVD_AVERAGE, 2.0, 3, 0);
  single(HVD_FLOAT32, 1, HVD_AVERAGE, 1.0, 4, 1);
  single(HVD_INT32, 1, HVD_AVERAGE, 1.0, 3, 0);
  single(HVD_UINT8, 1, HVD_AVERAGE, 1.0, 3, 1);
  grad_scale(0.125);
  grad_scale(1.0 / 3);
  grad_scale(1.0);
  is_int(HVD_ERR_INVALID_ARG, hvd__cuda_grad_scale(NULL, -1, 2.0, 0),
         "grad_scale: a negative count is rejected");
  is_string("hvd__cuda_grad_scale: n -1 or dtype 6", hvd_last_error(),
            "grad_scale: the message names the call and the count");
  mixed_batches();
  optimizers();
  psgd_kernels();
  errors();
  done_testing();
  return tap_exit_status();
}

#endif /* HVD_HAVE_CUDA */
