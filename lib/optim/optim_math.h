/*
 * optim_math.h - the SGD and Adam/AdamW updates of the device kernels
 * (lib/optim/optim_kernels.cu) and of their host stand-in
 * (t/standin/kernels.c): the arguments a step checks, the scalar factors
 * (computed on the host) and the update of one element; and mixed
 * precision's element conversions to and from float32 masters. Element
 * math is float, operation for operation as lib/optim/sgd.c, adam.c and
 * mixed.c, so that device and host agree bit for bit (no fused
 * multiply-adds on either side: see base/kernel_math.h).
 */
#ifndef HVD_OPTIM_OPTIM_MATH_H
#define HVD_OPTIM_OPTIM_MATH_H

#include "base/kernel_math.h"

/* An optimizer step's arguments: the batch, options, and step >= min_step
 * (INT64_MIN: any); *go as for hvd__km_check_batch. */
static inline hvd_result_t hvd__km_check_step(const char *who,
                                              const void *spans, int n,
                                              int64_t max_count,
                                              const void *options, int64_t step,
                                              int64_t min_step, int *go) {
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, go);
  if (rc == HVD_SUCCESS && options == NULL)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  if (rc == HVD_SUCCESS && step < min_step)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: step %lld is not >= %lld",
                        who, (long long)step, (long long)min_step);
  if (rc != HVD_SUCCESS)
    *go = 0;
  return rc;
}

/* ---- SGD: torch.optim.SGD ----------------------------------------------- */

typedef struct hvd__km_sgd {
  float wd, mom, keep, neg_lr;
  int decay, momentum, nesterov, first;
} hvd__km_sgd_t;

/* The factors, on the host. */
static inline hvd__km_sgd_t hvd__km_sgd_args(const hvd_sgd_options_t *o,
                                             int64_t step, double lr) {
  hvd__km_sgd_t a;
  a.wd = (float)o->weight_decay;
  a.mom = (float)o->momentum;
  a.keep = (float)(1.0 - o->dampening);
  a.neg_lr = (float)-lr;
  a.decay = o->weight_decay != 0;
  a.momentum = o->momentum != 0;
  a.nesterov = o->nesterov != 0;
  a.first = step == 1;
  return a;
}

/* Element j: d = g + wd * v; buf = first ? d : mom * buf + keep * d;
 * d = nesterov ? d + mom * buf : buf; v -= lr * d. buf is NULL without
 * momentum. */
HVD__KM_FN void hvd__km_sgd_elem(hvd__km_sgd_t a, float *v, const float *g,
                                 float *buf, int64_t j) {
  float d = a.decay ? g[j] + a.wd * v[j] : g[j];
  if (buf != NULL) {
    buf[j] = a.first ? d : a.mom * buf[j] + a.keep * d;
    d = a.nesterov ? d + a.mom * buf[j] : buf[j];
  }
  v[j] += a.neg_lr * d;
}

/* ---- Adam / AdamW: torch.optim.Adam, AdamW ------------------------------ */

typedef struct hvd__km_adam {
  float wd, decay, b1c, b2, b2c, eps, step_size, bc2_sqrt;
  int l2;
} hvd__km_adam_t;

/* The factors, on the host (step >= 1). */
static inline hvd__km_adam_t hvd__km_adam_args(const hvd_adam_options_t *o,
                                               int64_t step, double lr) {
  hvd__km_adam_t a;
  a.l2 = !o->decoupled && o->weight_decay != 0;
  a.wd = (float)o->weight_decay;
  a.decay = o->decoupled ? (float)(1.0 - lr * o->weight_decay) : 1.0f;
  a.b1c = (float)(1.0 - o->beta1);
  a.b2 = (float)o->beta2;
  a.b2c = (float)(1.0 - o->beta2);
  a.eps = (float)o->eps;
  a.step_size = (float)(lr / (1.0 - pow(o->beta1, (double)step)));
  a.bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, (double)step));
  return a;
}

/* Element j: AdamW v *= 1 - lr * wd; Adam g += wd * v; m = lerp(m, g,
 * 1 - beta1); s = beta2 * s + (1 - beta2) * g * g; v -= lr / (1 - beta1^t)
 * * m / (sqrt(s) / sqrt(1 - beta2^t) + eps). As the host's adam_loop: g as
 * it is without L2 decay (never g + 0 * v, NaN for an infinite v), and
 * v *= decay always (decay 1 for Adam). */
HVD__KM_FN void hvd__km_adam_elem(hvd__km_adam_t a, float *v, const float *g,
                                  float *m, float *s, int64_t j) {
  float gj = a.l2 ? g[j] + a.wd * v[j] : g[j];
  v[j] *= a.decay;
  m[j] += a.b1c * (gj - m[j]);
  s[j] = a.b2 * s[j] + a.b2c * gj * gj;
  float denom = sqrtf(s[j]) / a.bc2_sqrt + a.eps;
  v[j] -= a.step_size * (m[j] / denom);
}

/* ---- mixed precision ---------------------------------------------------- */

/* Element i of src (float32, float16 or bfloat16) times f, in float: a
 * float32 master value or gradient (hvd__cuda_to_master and its batch). */
HVD__KM_FN float hvd__km_to_master_elem(const void *src, int dtype, int64_t i,
                                        float f) {
  float v = dtype == HVD_FLOAT16 ? hvd__f16_to_f32(((const uint16_t *)src)[i])
            : dtype == HVD_BFLOAT16
                ? hvd__bf16_to_f32(((const uint16_t *)src)[i])
                : ((const float *)src)[i];
  return v * f;
}

/* One span of a batched conversion, checked by whoever fills the span
 * array (the launch cannot read it: it is device memory): count >= 0 and
 * a dtype of float32, float16 or bfloat16 (to_master: the source's), or
 * of float16 or bfloat16 (from_master: the destination's). Else
 * HVD_ERR_INVALID_ARG "<who>: span T: n N or dtype D", as the
 * single-tensor calls say it. */
static inline hvd_result_t hvd__km_check_convert(const char *who, int t,
                                                 int64_t count,
                                                 hvd_dtype_t dtype,
                                                 int to_master) {
  int ok = hvd__km_is_half(dtype) || (to_master && dtype == HVD_FLOAT32);
  if (count < 0 || !ok)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: span %d: n %lld or dtype %d", who, t,
                          (long long)count, (int)dtype);
  return HVD_SUCCESS;
}

/* A float32 master rounded to float16 (dtype HVD_FLOAT16), else to
 * bfloat16, to nearest even (hvd__cuda_from_master and its batch). */
HVD__KM_FN uint16_t hvd__km_from_master_elem(float v, int dtype) {
  return dtype == HVD_FLOAT16 ? hvd__f32_to_f16(v) : hvd__f32_to_bf16(v);
}

/* ---- synchronized batch norm ------------------------------------------ */

/* The arguments of every bn kernel: a float dtype, x as [n, c, s]. */
static inline hvd_result_t hvd__km_bn_check(const char *who, hvd_dtype_t dtype,
                                            int64_t n, int64_t c, int64_t s) {
  if (dtype != HVD_FLOAT32 && !hvd__km_is_half(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: dtype %s", who,
                          hvd_dtype_name(dtype));
  if (n < 0 || c < 1 || s < 1 || c > INT32_MAX)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: shape [%lld, %lld, %lld]",
                          who, (long long)n, (long long)c, (long long)s);
  return HVD_SUCCESS;
}

/* Element i of a float32, float16 or bfloat16 array, as float. */
HVD__KM_FN float hvd__km_bn_load(const void *p, int dtype, int64_t i) {
  if (dtype == HVD_FLOAT32)
    return ((const float *)p)[i];
  return hvd__km_half_get(((const uint16_t *)p)[i], dtype == HVD_BFLOAT16);
}

HVD__KM_FN void hvd__km_bn_store(void *p, int dtype, int64_t i, float v) {
  if (dtype == HVD_FLOAT32)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = hvd__km_half_make(v, dtype == HVD_BFLOAT16);
}

/* The normalization of element i of channel ch: (x - mean) * k + b with
 * coef [3][c] = mean, weight * invstd, bias. */
HVD__KM_FN float hvd__km_bn_apply_elem(float x, const float *coef, int64_t c,
                                       int64_t ch) {
  return (x - coef[ch]) * coef[c + ch] + coef[2 * c + ch];
}

/* dx of element i of channel ch: k (dy - mean_dy - (x - mean) q) with
 * coef [4][c] = mean, weight * invstd, mean of dy, invstd^2 * mean of
 * dy (x - mean). */
HVD__KM_FN float hvd__km_bn_dx_elem(float x, float dy, const float *coef,
                                    int64_t c, int64_t ch) {
  return coef[c + ch] *
         (dy - coef[2 * c + ch] - (x - coef[ch]) * coef[3 * c + ch]);
}

/* ---- gradient clipping's norms (lib/optim/clip.c) ------------------------
 * A float32 span's sum of squares (in double: each square exact) and
 * largest magnitude, in chunks of HVD__KM_NORM_CHUNK elements, each
 * summed as a block of HVD__KM_NORM_THREADS threads sums it on the device
 * (norm_chunk_kernel): thread t its elements t, t + T, t + 2T ... in
 * order, then the threads' sums pairwise (thread t adds t + h, for h =
 * T/2, T/4 ... 1); then the span's chunks in order. So the host's loop
 * and the device give the same bits, run after run. The largest
 * magnitude skips NaNs (hvd__km_max); an inf or a NaN shows in the sum
 * of squares, which is then not finite. */
#define HVD__KM_NORM_THREADS 256
#define HVD__KM_NORM_CHUNK (HVD__KM_NORM_THREADS * 64)

/* a if it is greater than b, else b: a NaN a (a new value) is skipped;
 * one max instruction, which the host's loop vectorizes. */
HVD__KM_FN double hvd__km_max(double a, double b) { return a > b ? a : b; }

/* The chunks of a span of n elements. */
HVD__KM_FN int64_t hvd__km_norm_chunks(int64_t n) {
  return (n + HVD__KM_NORM_CHUNK - 1) / HVD__KM_NORM_CHUNK;
}

/* Thread t's share of a chunk of n elements at x: out[0] += squares,
 * out[1] the greatest magnitude. */
HVD__KM_FN void hvd__km_norm_thread(const float *x, int64_t n, int t,
                                    double out[2]) {
  for (int64_t j = t; j < n; j += HVD__KM_NORM_THREADS) {
    const double v = x[j];
    out[0] += v * v;
    out[1] = hvd__km_max(fabs(v), out[1]);
  }
}

/* The host's chunk: the threads' shares, then the pairwise sums. Row by
 * row of T elements, every thread's sum one element further (each its
 * elements in the same order as hvd__km_norm_thread, so the same bits):
 * contiguous, so the compiler vectorizes it. */
static inline void hvd__km_norm_chunk(const float *x, int64_t n,
                                      double out[2]) {
  double s[HVD__KM_NORM_THREADS], m[HVD__KM_NORM_THREADS];
  for (int t = 0; t < HVD__KM_NORM_THREADS; t++)
    s[t] = m[t] = 0;
  for (int64_t r = 0; r < n; r += HVD__KM_NORM_THREADS) {
    const float *row = x + r;
    const int w =
        n - r < HVD__KM_NORM_THREADS ? (int)(n - r) : HVD__KM_NORM_THREADS;
    for (int t = 0; t < w; t++) {
      const double v = row[t];
      s[t] += v * v;
      m[t] = hvd__km_max(fabs(v), m[t]);
    }
  }
  for (int h = HVD__KM_NORM_THREADS / 2; h > 0; h /= 2)
    for (int t = 0; t < h; t++) {
      s[t] += s[t + h];
      m[t] = hvd__km_max(m[t + h], m[t]);
    }
  out[0] = s[0];
  out[1] = m[0];
}

/* The span's chunks (parts[c][2]) folded in order into out[2]. */
HVD__KM_FN void hvd__km_norm_fold(const double *parts, int64_t chunks,
                                  double out[2]) {
  out[0] = out[1] = 0;
  for (int64_t c = 0; c < chunks; c++) {
    out[0] += parts[2 * c];
    out[1] = hvd__km_max(parts[2 * c + 1], out[1]);
  }
}

/* The host's span: its chunks, then the fold. */
static inline void hvd__km_norm_span(const float *x, int64_t n, double out[2]) {
  out[0] = out[1] = 0;
  for (int64_t c = 0; c < hvd__km_norm_chunks(n); c++) {
    double part[2];
    const int64_t at = c * HVD__KM_NORM_CHUNK, left = n - at;
    hvd__km_norm_chunk(
        x + at, left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK, part);
    out[0] += part[0];
    out[1] = hvd__km_max(part[1], out[1]);
  }
}

/* ---- LAMB (lib/optim/lamb.c): apex's FusedLAMB, adam_w_mode ------------
 * u = (m' / bc1) / (sqrt(s' / bc2) + eps) + wd * w, with m' = b1 m +
 * (1 - b1) g and s' = b2 s + (1 - b2) g g (bc1 = 1 - b1^t, bc2 = 1 - b2^t
 * with bias correction, else 1); then w -= ratio * u, ratio = lr * |w| /
 * |u| per parameter (lr where a norm is 0, or without adaptation). Two
 * passes: the first only reads (each parameter's sums of w^2 and u^2 in
 * double, by the norm chunks above), the second recomputes u, the same
 * bits, and writes m, s and w; so a failed step between them leaves
 * everything as it was. */
typedef struct hvd__km_lamb {
  float b1, b1c, b2, b2c, eps, bc1, bc2;
} hvd__km_lamb_t;

/* The factors, on the host (step >= 1). */
static inline hvd__km_lamb_t hvd__km_lamb_args(const hvd_lamb_options_t *o,
                                               int64_t step) {
  hvd__km_lamb_t a;
  a.b1 = (float)o->beta1;
  a.b1c = (float)(1.0 - o->beta1);
  a.b2 = (float)o->beta2;
  a.b2c = (float)(1.0 - o->beta2);
  a.eps = (float)o->eps;
  a.bc1 = o->bias_correction ? (float)(1.0 - pow(o->beta1, (double)step)) : 1;
  a.bc2 = o->bias_correction ? (float)(1.0 - pow(o->beta2, (double)step)) : 1;
  return a;
}

/* Element j's update u; *m and *s become its new moments (the caller
 * stores them or not). */
HVD__KM_FN float hvd__km_lamb_elem(hvd__km_lamb_t a, float wd, float w, float g,
                                   float *m, float *s) {
  *m = a.b1 * *m + a.b1c * g;
  *s = a.b2 * *s + a.b2c * g * g;
  return (*m / a.bc1) / (sqrtf(*s / a.bc2) + a.eps) + wd * w;
}

/* Thread t's share of a chunk of n elements (first pass): out[0] += w^2,
 * out[1] += u^2, as hvd__km_norm_thread walks a chunk. */
HVD__KM_FN void hvd__km_lamb_thread(hvd__km_lamb_t a, float wd, const float *w,
                                    const float *g, const float *m,
                                    const float *s, int64_t n, int t,
                                    double out[2]) {
  for (int64_t j = t; j < n; j += HVD__KM_NORM_THREADS) {
    float mj = m[j], sj = s[j];
    const double u = hvd__km_lamb_elem(a, wd, w[j], g[j], &mj, &sj);
    const double v = w[j];
    out[0] += v * v;
    out[1] += u * u;
  }
}

/* The host's chunk (first pass): the threads' shares row by row, then
 * the pairwise sums, as hvd__km_norm_chunk. */
static inline void hvd__km_lamb_chunk(hvd__km_lamb_t a, float wd,
                                      const float *w, const float *g,
                                      const float *m, const float *s, int64_t n,
                                      double out[2]) {
  double sw[HVD__KM_NORM_THREADS], su[HVD__KM_NORM_THREADS];
  for (int t = 0; t < HVD__KM_NORM_THREADS; t++)
    sw[t] = su[t] = 0;
  for (int64_t r = 0; r < n; r += HVD__KM_NORM_THREADS) {
    const int cols =
        n - r < HVD__KM_NORM_THREADS ? (int)(n - r) : HVD__KM_NORM_THREADS;
    for (int t = 0; t < cols; t++) {
      float mj = m[r + t], sj = s[r + t];
      const double u = hvd__km_lamb_elem(a, wd, w[r + t], g[r + t], &mj, &sj);
      const double v = w[r + t];
      sw[t] += v * v;
      su[t] += u * u;
    }
  }
  for (int h = HVD__KM_NORM_THREADS / 2; h > 0; h /= 2)
    for (int t = 0; t < h; t++) {
      sw[t] += sw[t + h];
      su[t] += su[t + h];
    }
  out[0] = sw[0];
  out[1] = su[0];
}

/* A span's chunks (parts[c][2]) summed in order into out[2]. */
HVD__KM_FN void hvd__km_sum2_fold(const double *parts, int64_t chunks,
                                  double out[2]) {
  out[0] = out[1] = 0;
  for (int64_t c = 0; c < chunks; c++) {
    out[0] += parts[2 * c];
    out[1] += parts[2 * c + 1];
  }
}

/* The host's span (first pass): its chunks, then the fold. */
static inline void hvd__km_lamb_span(hvd__km_lamb_t a, float wd, const float *w,
                                     const float *g, const float *m,
                                     const float *s, int64_t n, double out[2]) {
  out[0] = out[1] = 0;
  for (int64_t c = 0; c < hvd__km_norm_chunks(n); c++) {
    double part[2];
    const int64_t at = c * HVD__KM_NORM_CHUNK, left = n - at;
    hvd__km_lamb_chunk(a, wd, w + at, g + at, m + at, s + at,
                       left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK,
                       part);
    out[0] += part[0];
    out[1] += part[1];
  }
}

/* A parameter's step size from its sums of squares (the ranks' totals
 * when sharded): lr * (|w| / |u|) in double, rounded to float, when
 * adapt and both norms are positive; else lr. */
static inline float hvd__km_lamb_ratio(double w2, double u2, int adapt,
                                       double lr) {
  if (adapt && w2 > 0 && u2 > 0)
    return (float)(lr * (sqrt(w2) / sqrt(u2)));
  return (float)lr;
}

/* Element j (second pass): m, s stored, w -= ratio * u. */
HVD__KM_FN void hvd__km_lamb_apply_elem(hvd__km_lamb_t a, float wd, float ratio,
                                        float *w, const float *g, float *m,
                                        float *s, int64_t j) {
  float mj = m[j], sj = s[j];
  const float u = hvd__km_lamb_elem(a, wd, w[j], g[j], &mj, &sj);
  m[j] = mj;
  s[j] = sj;
  w[j] = w[j] - ratio * u;
}

/* ---- PowerSGD (lib/optim/powersgd.c) -------------------------------------
 * The element arithmetic of its three products, the same on the host, in
 * the device kernels (psgd_*_kernel) and in their stand-in, so that
 * device and host parameters get the same bits. M is n x m, P n x r, Q
 * kept transposed (r x m), all row-major. */

/* The three products' arguments: n x m with r >= 1 (pointers are the
 * caller's). */
static inline hvd_result_t hvd__km_psgd_check(const char *who, int64_t n,
                                              int64_t m, int r) {
  if (n < 0 || m < 0 || r < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld, m %lld or r %d",
                          who, (long long)n, (long long)m, r);
  return HVD_SUCCESS;
}

/* The warp's lanes of P = M Q's dot products. */
#define HVD__KM_PSGD_LANES 32

/* P[a][j]: row a of M dotted with row j of Q^T, in double, in
 * HVD__KM_PSGD_LANES lanes (lane l: the elements l, l + 32, ... in order;
 * each product exact in double), then the lanes pairwise (lane l adds
 * l + h, for h = 16, 8, ... 1), as a warp folds with shuffles. */
static inline float hvd__km_psgd_dot(const float *x, const float *y,
                                     int64_t m) {
  double acc[HVD__KM_PSGD_LANES];
  for (int l = 0; l < HVD__KM_PSGD_LANES; l++)
    acc[l] = 0;
  for (int64_t b = 0; b < m; b += HVD__KM_PSGD_LANES) {
    const int w =
        m - b < HVD__KM_PSGD_LANES ? (int)(m - b) : HVD__KM_PSGD_LANES;
    for (int l = 0; l < w; l++)
      acc[l] += (double)x[b + l] * (double)y[b + l];
  }
  for (int h = HVD__KM_PSGD_LANES / 2; h > 0; h /= 2)
    for (int l = 0; l < h; l++)
      acc[l] += acc[l + h];
  return (float)acc[0];
}

/* Q^T = P^T M sums over the n rows of M: in chunks of
 * HVD__KM_PSGD_CHUNK rows (the device's threads: chunks x r x m), each
 * chunk's rows in order from 0, then the chunks' sums in order from 0. */
#define HVD__KM_PSGD_CHUNK 64

HVD__KM_FN int64_t hvd__km_psgd_chunks(int64_t n) {
  return n > 0 ? (n + HVD__KM_PSGD_CHUNK - 1) / HVD__KM_PSGD_CHUNK : 1;
}

/* Chunk c's part of element (j, b) of Q^T: its rows of M in order, each
 * times P[a][j] in float (a row whose factor is 0 skipped). */
HVD__KM_FN float hvd__km_psgd_mtp_part(const float *M, const float *P,
                                       int64_t n, int64_t m, int r, int j,
                                       int64_t b, int64_t c) {
  const int64_t end =
      (c + 1) * HVD__KM_PSGD_CHUNK < n ? (c + 1) * HVD__KM_PSGD_CHUNK : n;
  float acc = 0;
  for (int64_t a = c * HVD__KM_PSGD_CHUNK; a < end; a++) {
    const float f = P[a * r + j];
    if (f != 0.0f)
      acc += f * M[a * m + b];
  }
  return acc;
}

/* Element (j, b) of Q^T: the chunks' parts in order. */
HVD__KM_FN float hvd__km_psgd_mtp(const float *M, const float *P, int64_t n,
                                  int64_t m, int r, int j, int64_t b) {
  float acc = 0;
  for (int64_t c = 0; c < hvd__km_psgd_chunks(n); c++)
    acc += hvd__km_psgd_mtp_part(M, P, n, m, r, j, b, c);
  return acc;
}

/* Element k = a m + b of the step's end: t = (P Q^T)[a][b] in float, j
 * in order; the error feedback e (when e is not NULL and keep) becomes
 * M - t * inv, and M becomes t * post. */
HVD__KM_FN void hvd__km_psgd_finish(float *M, float *e, const float *P,
                                    const float *Qt, int64_t m, int r,
                                    float post, float inv, int keep,
                                    int64_t k) {
  const int64_t a = k / m, b = k % m;
  float t = 0;
  for (int j = 0; j < r; j++)
    t += P[a * r + j] * Qt[(int64_t)j * m + b];
  if (e != NULL && keep)
    e[k] = M[k] - t * inv;
  M[k] = t * post;
}

/* Element k of the step's start: M = M * pre (pre not 1), then + e. */
HVD__KM_FN void hvd__km_psgd_prepare(float *M, const float *e, float pre,
                                     int64_t k) {
  float x = M[k];
  if (pre != 1.0f)
    x *= pre;
  if (e != NULL)
    x += e[k];
  M[k] = x;
}

#endif /* HVD_OPTIM_OPTIM_MATH_H */
