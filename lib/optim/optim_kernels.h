/*
 * optim_kernels.h - the built-in optimizers' device updates
 * (lib/optim/optim_kernels.cu): SGD, Adam/AdamW and LAMB over a batch of
 * float32
 * parameters in one launch, and the in-place scale of a gradient, with the
 * host's results bit for bit (the formulas are optim_math.h's).
 *
 * Only in builds with CUDA (HVD_HAVE_CUDA). Every function launches on
 * `stream` and returns without waiting; the result says whether the launch
 * succeeded (HVD_ERR_CUDA with the runtime's message otherwise; a bad
 * argument is HVD_ERR_INVALID_ARG). Pointers are device memory unless said
 * otherwise; a span array and the memory it points to must stay valid
 * until the stream reaches the kernel. max_count is the largest span's
 * count. Thread-safe.
 */
#ifndef HVD_OPTIM_OPTIM_KERNELS_H
#define HVD_OPTIM_OPTIM_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "hvd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One float32 parameter of a batched optimizer update. state: SGD's
 * momentum buffer in state[0] (unused without momentum); Adam's exp_avg
 * and exp_avg_sq in state[0] and state[1]. value, grad and states do not
 * overlap. */
typedef struct hvd__cuda_param_span {
  float *value;
  const float *grad;
  float *state[2];
  int64_t count;
} hvd__cuda_param_span_t;

/* One SGD update of every span, as the built-in SGD (hvd_sgd_options_t in
 * hvd.h); step is 1-based (step 1 initialises the momentum buffer). o is
 * host memory, read before returning. */
hvd_result_t hvd__cuda_sgd_step(const hvd__cuda_param_span_t *spans, int n,
                                int64_t max_count, const hvd_sgd_options_t *o,
                                int64_t step, double lr, cudaStream_t stream);

/* One Adam/AdamW update (o->decoupled) with bias correction, as the
 * built-in Adam. */
hvd_result_t hvd__cuda_adam_step(const hvd__cuda_param_span_t *spans, int n,
                                 int64_t max_count, const hvd_adam_options_t *o,
                                 int64_t step, double lr, cudaStream_t stream);

/* x[i] *= (float)factor for n float32 elements, in place: what the host's
 * hvd__scale does to a float32 gradient. */
hvd_result_t hvd__cuda_grad_scale(float *x, int64_t n, double factor,
                                  cudaStream_t stream);

/* ---- mixed precision (lib/optim/mixed.c) --------------------------------
 * Checked like the others: HVD_ERR_INVALID_ARG "<who>: n N or dtype D"
 * for a negative n or a dtype other than float32, float16, bfloat16. */

/* dst[i] = (float)src[i] * (float)factor for n elements of src's dtype
 * (src may be dst when it is float32); *nonfinite (device int) becomes 1
 * when some result is an inf or a NaN, and is never cleared here. */
hvd_result_t hvd__cuda_to_master(const void *src, hvd_dtype_t dtype, float *dst,
                                 int64_t n, double factor, int *nonfinite,
                                 cudaStream_t stream);
/* dst[i] = src[i] rounded to dtype (float16 or bfloat16, to nearest even,
 * as lib/base/half.h). */
hvd_result_t hvd__cuda_from_master(const float *src, void *dst,
                                   hvd_dtype_t dtype, int64_t n,
                                   cudaStream_t stream);
/* master[i] = value[i] (float16 or bfloat16, exactly) where master[i]
 * rounded to dtype is not value[i]'s bits; the others are left alone
 * (a value changed behind the optimizer's back, and only that). */
hvd_result_t hvd__cuda_refresh_master(const void *value, hvd_dtype_t dtype,
                                      float *master, int64_t n,
                                      cudaStream_t stream);

/* One tensor of a batched conversion: count elements from src into dst,
 * dtype the dtype of to_master's source (float32, float16 or bfloat16;
 * src may be dst when float32) or of from_master's destination (float16
 * or bfloat16; src does not overlap dst); the other side is float32. The
 * spans of a launch touch disjoint memory. */
typedef struct hvd__cuda_convert_span {
  const void *src;
  void *dst;
  int64_t count;
  hvd_dtype_t dtype;
} hvd__cuda_convert_span_t;

/* hvd__cuda_to_master (with the same factor and flag) of every span, in
 * one launch; hvd__cuda_from_master of every span, in one launch. The
 * call checks its own arguments as hvd__cuda_adam_step does ("<who>: n N
 * or max_count M is negative", "<who>: spans is NULL (n N)"); the spans'
 * counts and dtypes are the filler's to check (hvd__km_check_convert in
 * optim_math.h), the span array being device memory. */
hvd_result_t hvd__cuda_to_master_batch(const hvd__cuda_convert_span_t *spans,
                                       int n, int64_t max_count, double factor,
                                       int *nonfinite, cudaStream_t stream);
hvd_result_t hvd__cuda_from_master_batch(const hvd__cuda_convert_span_t *spans,
                                         int n, int64_t max_count,
                                         cudaStream_t stream);

/* ---- gradient clipping (lib/optim/clip.c) -------------------------------
 * One float32 span of a norm batch: count elements at x; its chunks'
 * partial results (optim_math.h, HVD__KM_NORM_CHUNK) go to parts at
 * chunk `first` on (the chunks of the spans before it, in order). */
typedef struct hvd__cuda_norm_span {
  const float *x;
  int64_t count;
  int64_t first;
} hvd__cuda_norm_span_t;

/* For every span s: out[2 s] its sum of squares (double), out[2 s + 1]
 * its largest magnitude (NaNs skipped), by optim_math.h's chunks
 * and order (the host's hvd__km_norm_span, bit for bit). parts: device
 * memory for 2 * chunks doubles, chunks the spans' in all (the last
 * span's first plus its chunks); out: 2 n doubles of device memory. */
hvd_result_t hvd__cuda_norm_batch(const hvd__cuda_norm_span_t *spans, int n,
                                  int64_t chunks, double *parts, double *out,
                                  cudaStream_t stream);

/* ---- LAMB (lib/optim/lamb.c) ------------------------------------------
 * One float32 parameter (or block) of a LAMB batch: count elements of
 * value, grad and the moments m and s (disjoint); its chunks
 * (optim_math.h, HVD__KM_NORM_CHUNK) are the batch's from chunk `first`
 * on; wd its weight decay; ratio its step size (the second pass's, set
 * by the host from the first pass's norms). */
typedef struct hvd__cuda_lamb_span {
  float *value;
  const float *grad;
  float *m, *s;
  int64_t count, first;
  float wd, ratio;
} hvd__cuda_lamb_span_t;

/* The first pass, which writes nothing but parts and out: for every span
 * t, out[2 t] its sum of value^2 and out[2 t + 1] its sum of u^2 (double;
 * u optim_math.h's hvd__km_lamb_elem), by optim_math.h's chunks and order
 * (the host's hvd__km_lamb_span, bit for bit). parts: 2 * chunks doubles
 * of device memory, chunks the spans' in all; out: 2 n doubles of device
 * memory. o is host memory, read before returning; step >= 1. */
hvd_result_t hvd__cuda_lamb_norms(const hvd__cuda_lamb_span_t *spans, int n,
                                  int64_t chunks, const hvd_lamb_options_t *o,
                                  int64_t step, double *parts, double *out,
                                  cudaStream_t stream);
/* The second pass: every span's m, s stored and value -= ratio * u
 * (hvd__km_lamb_apply_elem). */
hvd_result_t hvd__cuda_lamb_apply(const hvd__cuda_lamb_span_t *spans, int n,
                                  int64_t max_count,
                                  const hvd_lamb_options_t *o, int64_t step,
                                  cudaStream_t stream);

/* ---- synchronized batch norm (lib/optim/sync_bn.c) --------------------
 * x, dy, y, dx: [n, c, s] (s positions per channel) of dtype float32,
 * float16 or bfloat16; per-channel sums in double, element math in float.
 * coef is device memory [k][c] float (k as said). */

/* out [2][c] (double): per channel the sum of x and of x^2. */
hvd_result_t hvd__cuda_bn_stats(const void *x, hvd_dtype_t dtype, int64_t n,
                                int64_t c, int64_t s, double *out,
                                cudaStream_t stream);
/* y = (x - coef[0][ch]) * coef[1][ch] + coef[2][ch] (mean, w * invstd,
 * bias); y may be x. */
hvd_result_t hvd__cuda_bn_apply(const void *x, void *y, hvd_dtype_t dtype,
                                int64_t n, int64_t c, int64_t s,
                                const float *coef, cudaStream_t stream);
/* out [2][c] (double): per channel the sum of dy and of dy * (x - mean),
 * mean = coef[0][ch]. */
hvd_result_t hvd__cuda_bn_grad_stats(const void *x, const void *dy,
                                     hvd_dtype_t dtype, int64_t n, int64_t c,
                                     int64_t s, const float *coef, double *out,
                                     cudaStream_t stream);
/* dx = coef[1][ch] * (dy - coef[2][ch] - (x - coef[0][ch]) * coef[3][ch])
 * (mean, w * invstd, mean of dy, invstd^2 * mean of dy (x - mean)); dx
 * may be dy. */
hvd_result_t hvd__cuda_bn_dx(const void *x, const void *dy, void *dx,
                             hvd_dtype_t dtype, int64_t n, int64_t c, int64_t s,
                             const float *coef, cudaStream_t stream);

/* ---- PowerSGD (lib/optim/powersgd.c) ------------------------------------
 * M is n x m, P n x r, Qt (Q transposed) r x m, float32, row-major; the
 * element arithmetic is optim_math.h's hvd__km_psgd_*, the host's bits.
 * prepare: M = M * (float)pre + e (e may be NULL) over len elements.
 * mq: P = M Q (one warp per row of M, the lanes folded pairwise).
 * mtp: Qt = P^T M, by chunks of rows (parts: hvd__km_psgd_chunks(n) x r x
 * m floats of device scratch, unused when that is 1), then the chunks
 * folded. finish: t = P Q^T; e = M - t * inv (e not NULL and keep),
 * M = t * (float)post. */
hvd_result_t hvd__cuda_psgd_prepare(float *M, const float *e, int64_t len,
                                    double pre, cudaStream_t stream);
hvd_result_t hvd__cuda_psgd_mq(const float *M, const float *Qt, float *P,
                               int64_t n, int64_t m, int r,
                               cudaStream_t stream);
hvd_result_t hvd__cuda_psgd_mtp(const float *M, const float *P, float *Qt,
                                float *parts, int64_t n, int64_t m, int r,
                                cudaStream_t stream);
hvd_result_t hvd__cuda_psgd_finish(float *M, float *e, const float *P,
                                   const float *Qt, int64_t n, int64_t m, int r,
                                   double post, float inv, int keep,
                                   cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* HVD_OPTIM_OPTIM_KERNELS_H */
