/*
 * kernel_math.h - what lib/ops/cuda_kernels.cu computes and checks, in one
 * place: the arguments every launch checks (with their messages), the
 * f16/bf16 element conversions, and the SGD and Adam/AdamW updates (their
 * scalar factors, computed on the host, and the update of one element).
 * The one definition for the device kernels (nvcc compiles the element
 * functions __host__ __device__) and for the host stand-in of the kernels
 * (t/standin/kernels.c), so that the stand-in runs the kernels' own
 * formulas, as half.h does for the conversions.
 *
 * Element math is float, operation for operation as lib/optim/optimizer.c;
 * compiled with no contraction into fused multiply-adds (nvcc -fmad=false;
 * fp-contract off on the host) so that every side rounds the same way.
 */
#ifndef HVD_OPS_KERNEL_MATH_H
#define HVD_OPS_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>

#include "hvd.h"
#include "base/half.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "base/errors.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define HVD__KM_FN static __host__ __device__ __forceinline__
#else
#define HVD__KM_FN static inline
#endif

/* ---- checks (host) ------------------------------------------------------ */

static inline int hvd__km_is_dtype(hvd_dtype_t d) {
  return (int)d >= 0 && d < HVD_DTYPE_COUNT;
}

static inline int hvd__km_is_half(hvd_dtype_t d) {
  return d == HVD_FLOAT16 || d == HVD_BFLOAT16;
}

/* The arguments every batched call checks; *go is 0 when there is nothing
 * to launch. */
static inline hvd_result_t hvd__km_check_batch(const char *who,
                                               const void *spans, int n,
                                               int64_t max_count, int *go) {
  *go = 0;
  if (n < 0 || max_count < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: n %d or max_count %lld is negative", who, n,
                          (long long)max_count);
  if (spans == NULL && n > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: spans is NULL (n %d)", who,
                          n);
  *go = n > 0 && max_count > 0;
  return HVD_SUCCESS;
}

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

/* One tensor's arguments (scale, reduce_finish). */
static inline hvd_result_t hvd__km_check_one(const char *who, int64_t n,
                                             hvd_dtype_t dtype) {
  if (n < 0 || !hvd__km_is_dtype(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  return HVD_SUCCESS;
}

static inline hvd_result_t hvd__km_bad_pair(const char *who, hvd_dtype_t from,
                                            hvd_dtype_t to) {
  return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: no conversion from %s to %s",
                        who, hvd_dtype_name(from), hvd_dtype_name(to));
}

/* ---- f16 and bf16 elements ---------------------------------------------- */

HVD__KM_FN float hvd__km_half_get(uint16_t h, int bf16) {
  return bf16 ? hvd__bf16_to_f32(h) : hvd__f16_to_f32(h);
}

HVD__KM_FN uint16_t hvd__km_half_make(float f, int bf16) {
  return bf16 ? hvd__f32_to_bf16(f) : hvd__f32_to_f16(f);
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

#endif /* HVD_OPS_KERNEL_MATH_H */
