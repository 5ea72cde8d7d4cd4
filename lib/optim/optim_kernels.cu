/*
 * optim_kernels.cu - the built-in optimizers' device updates: SGD,
 * Adam/AdamW and LAMB (two passes) over a batch of parameters, the scale of a
 * gradient, and mixed precision's conversions to and from float32 masters
 * (one tensor, or a batch in one launch). Interface and contract in
 * optim_kernels.h.
 *
 * The element formulas and their host-computed factors are optim_math.h's,
 * which the host stand-in (t/standin/kernels.c) runs too; built with
 * -fmad=false (Makefile.am) and nvcc's IEEE division and square root, so
 * that device and host agree bit for bit. The grid is base/cuda_launch.h's.
 */
#include <config.h>

#include <math.h>
#include <stdint.h>

#include "base/cuda_launch.h"
#include "base/device.h"
#include "base/half.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

/* the span's layout as the C side (device.c) fills it, dtype an int */
static_assert(sizeof(hvd__cuda_convert_span_t) == 32 &&
                  sizeof(hvd_dtype_t) == sizeof(int),
              "hvd__cuda_convert_span_t differs from the C side's");

namespace {

__global__ void sgd_kernel(const hvd__cuda_param_span_t *spans, int n,
                           hvd__km_sgd_t a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    float *buf = a.momentum ? sp.state[0] : NULL;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride)
      hvd__km_sgd_elem(a, sp.value, sp.grad, buf, j);
  }
}

__global__ void adam_kernel(const hvd__cuda_param_span_t *spans, int n,
                            hvd__km_adam_t a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride)
      hvd__km_adam_elem(a, sp.value, sp.grad, sp.state[0], sp.state[1], j);
  }
}

/* float32 master values from float32/float16/bfloat16 ones, scaled */
__global__ void to_master_kernel(const void *src, int dtype, float *dst,
                                 int64_t n, float f, int *nonfinite) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int bad = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = hvd__km_to_master_elem(src, dtype, i, f);
    dst[i] = v;
    bad |= !isfinite(v);
  }
  if (bad)
    *nonfinite = 1;
}

__global__ void from_master_kernel(const float *src, uint16_t *dst, int dtype,
                                   int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = hvd__km_from_master_elem(src[i], dtype);
}

/* The same over a batch, the grid as sgd_kernel's: grid.y walks the
 * spans, grid.x a span's elements. One flag write per block at most. */
__global__ void to_master_batch_kernel(const hvd__cuda_convert_span_t *spans,
                                       int n, float f, int *nonfinite) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int bad = 0;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_convert_span_t sp = spans[t];
    float *dst = (float *)sp.dst;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < sp.count; i += stride) {
      float v = hvd__km_to_master_elem(sp.src, (int)sp.dtype, i, f);
      dst[i] = v;
      bad |= !isfinite(v);
    }
  }
  if (bad)
    *nonfinite = 1;
}

__global__ void from_master_batch_kernel(const hvd__cuda_convert_span_t *spans,
                                         int n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_convert_span_t sp = spans[t];
    const float *src = (const float *)sp.src;
    uint16_t *dst = (uint16_t *)sp.dst;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < sp.count; i += stride)
      dst[i] = hvd__km_from_master_elem(src[i], (int)sp.dtype);
  }
}

/* a master that no longer rounds to its value: the value's, exactly */
__global__ void refresh_master_kernel(const uint16_t *value, int dtype,
                                      float *master, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint16_t r = dtype == HVD_FLOAT16 ? hvd__f32_to_f16(master[i])
                                      : hvd__f32_to_bf16(master[i]);
    if (r != value[i])
      master[i] = dtype == HVD_FLOAT16 ? hvd__f16_to_f32(value[i])
                                       : hvd__bf16_to_f32(value[i]);
  }
}

/* hvd__scale of float32: multiplied in float */
__global__ void scale_kernel(float *x, int64_t n, float f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] = x[i] * f;
}

} // namespace

extern "C" hvd_result_t hvd__cuda_sgd_step(const hvd__cuda_param_span_t *spans,
                                           int n, int64_t max_count,
                                           const hvd_sgd_options_t *o,
                                           int64_t step, double lr,
                                           cudaStream_t stream) {
  static const char who[] = "hvd__cuda_sgd_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, INT64_MIN, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_sgd_t a = hvd__km_sgd_args(o, step, lr);
  sgd_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0, stream>>>(
      spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_adam_step(const hvd__cuda_param_span_t *spans,
                                            int n, int64_t max_count,
                                            const hvd_adam_options_t *o,
                                            int64_t step, double lr,
                                            cudaStream_t stream) {
  static const char who[] = "hvd__cuda_adam_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_adam_t a = hvd__km_adam_args(o, step, lr);
  adam_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0, stream>>>(
      spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_grad_scale(float *x, int64_t n, double factor,
                                             cudaStream_t stream) {
  static const char who[] = "hvd__cuda_grad_scale";
  hvd_result_t rc = hvd__km_check_one(who, n, HVD_FLOAT32);
  if (rc != HVD_SUCCESS || n == 0 || factor == 1.0)
    return rc;
  scale_kernel<<<hvd__grid_for(n, 1), hvd__kernel_threads, 0, stream>>>(
      x, n, (float)factor);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

/* ---- mixed precision ---------------------------------------------------- */

static int master_dtype(hvd_dtype_t t) {
  return t == HVD_FLOAT32 || t == HVD_FLOAT16 || t == HVD_BFLOAT16;
}

extern "C" hvd_result_t hvd__cuda_to_master(const void *src, hvd_dtype_t dtype,
                                            float *dst, int64_t n,
                                            double factor, int *nonfinite,
                                            cudaStream_t stream) {
  static const char who[] = "hvd__cuda_to_master";
  if (n < 0 || !master_dtype(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  to_master_kernel<<<hvd__grid_for(n, 1), hvd__kernel_threads, 0, stream>>>(
      src, (int)dtype, dst, n, (float)factor, nonfinite);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_from_master(const float *src, void *dst,
                                              hvd_dtype_t dtype, int64_t n,
                                              cudaStream_t stream) {
  static const char who[] = "hvd__cuda_from_master";
  if (n < 0 || (dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  from_master_kernel<<<hvd__grid_for(n, 1), hvd__kernel_threads, 0, stream>>>(
      src, (uint16_t *)dst, (int)dtype, n);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t
hvd__cuda_to_master_batch(const hvd__cuda_convert_span_t *spans, int n,
                          int64_t max_count, double factor, int *nonfinite,
                          cudaStream_t stream) {
  static const char who[] = "hvd__cuda_to_master_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  to_master_batch_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0,
                           stream>>>(spans, n, (float)factor, nonfinite);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t
hvd__cuda_from_master_batch(const hvd__cuda_convert_span_t *spans, int n,
                            int64_t max_count, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_from_master_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  from_master_batch_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads,
                             0, stream>>>(spans, n);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_refresh_master(const void *value,
                                                 hvd_dtype_t dtype,
                                                 float *master, int64_t n,
                                                 cudaStream_t stream) {
  static const char who[] = "hvd__cuda_refresh_master";
  if (n < 0 || (dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  refresh_master_kernel<<<hvd__grid_for(n, 1), hvd__kernel_threads, 0,
                          stream>>>((const uint16_t *)value, (int)dtype, master,
                                    n);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

/* ---- gradient clipping -------------------------------------------------- */

/* The span of a batch whose chunks hold chunk b: the last whose first is
 * <= b (bisection; a span of no chunks shares its first with the next). */
template <class Span>
__device__ static int span_of_chunk(const Span *spans, int n, int64_t b) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (spans[mid].first <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* The block's pairwise tree over its threads' shares s[2] (optim_math.h's
 * order: thread t adds t + h, h = T/2 ... 1): the first summed, the
 * second summed too (sum2) or the greater kept; thread 0 writes chunk b's
 * parts[2 b], parts[2 b + 1]. */
template <bool sum2>
__device__ static void chunk_fold(const double s[2], double *parts, int64_t b) {
  __shared__ double x[HVD__KM_NORM_THREADS], y[HVD__KM_NORM_THREADS];
  const int t = (int)threadIdx.x;
  x[t] = s[0];
  y[t] = s[1];
  __syncthreads();
  for (int h = HVD__KM_NORM_THREADS / 2; h > 0; h /= 2) {
    if (t < h) {
      x[t] += x[t + h];
      y[t] = sum2 ? y[t] + y[t + h] : hvd__km_max(y[t + h], y[t]);
    }
    __syncthreads();
  }
  if (t == 0) {
    parts[2 * b] = x[0];
    parts[2 * b + 1] = y[0];
  }
}

/* Block b: chunk b of the batch, as optim_math.h's host chunk: each
 * thread's share, then the pairwise sums. */
__global__ void norm_chunk_kernel(const hvd__cuda_norm_span_t *spans, int n,
                                  double *parts) {
  const int64_t b = blockIdx.x;
  const hvd__cuda_norm_span_t sp = spans[span_of_chunk(spans, n, b)];
  const int64_t at = (b - sp.first) * HVD__KM_NORM_CHUNK, left = sp.count - at;
  double s[2] = {0, 0};
  if (left > 0)
    hvd__km_norm_thread(sp.x + at,
                        left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK,
                        (int)threadIdx.x, s);
  chunk_fold<false>(s, parts, b);
}

/* Thread s: span s's chunks folded in order. */
__global__ void norm_fold_kernel(const hvd__cuda_norm_span_t *spans, int n,
                                 const double *parts, double *out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
    hvd__km_norm_fold(parts + 2 * spans[s].first,
                      hvd__km_norm_chunks(spans[s].count), out + 2 * s);
}

extern "C" hvd_result_t hvd__cuda_norm_batch(const hvd__cuda_norm_span_t *spans,
                                             int n, int64_t chunks,
                                             double *parts, double *out,
                                             cudaStream_t stream) {
  static const char who[] = "hvd__cuda_norm_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, chunks, &go);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  if (chunks > 0)
    norm_chunk_kernel<<<(unsigned)chunks, HVD__KM_NORM_THREADS, 0, stream>>>(
        spans, n, parts);
  norm_fold_kernel<<<(unsigned)((n + hvd__kernel_threads - 1) /
                                hvd__kernel_threads),
                     hvd__kernel_threads, 0, stream>>>(spans, n, parts, out);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

/* ---- LAMB -----------------------------------------------------------------
 */

/* Block b: chunk b of the batch, as optim_math.h's host chunk: each
 * thread's share, then the pairwise sums (norm_chunk_kernel's shape). */
__global__ void lamb_norm_kernel(const hvd__cuda_lamb_span_t *spans, int n,
                                 hvd__km_lamb_t a, double *parts) {
  const int64_t b = blockIdx.x;
  const hvd__cuda_lamb_span_t sp = spans[span_of_chunk(spans, n, b)];
  const int64_t at = (b - sp.first) * HVD__KM_NORM_CHUNK, left = sp.count - at;
  double s[2] = {0, 0};
  if (left > 0)
    hvd__km_lamb_thread(a, sp.wd, sp.value + at, sp.grad + at, sp.m + at,
                        sp.s + at,
                        left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK,
                        (int)threadIdx.x, s);
  chunk_fold<true>(s, parts, b);
}

/* Thread t: span t's chunks summed in order. */
__global__ void lamb_fold_kernel(const hvd__cuda_lamb_span_t *spans, int n,
                                 const double *parts, double *out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n)
    hvd__km_sum2_fold(parts + 2 * spans[t].first,
                      hvd__km_norm_chunks(spans[t].count), out + 2 * t);
}

/* The second pass, the grid as adam_kernel's. */
__global__ void lamb_apply_kernel(const hvd__cuda_lamb_span_t *spans, int n,
                                  hvd__km_lamb_t a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_lamb_span_t sp = spans[t];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride)
      hvd__km_lamb_apply_elem(a, sp.wd, sp.ratio, sp.value, sp.grad, sp.m, sp.s,
                              j);
  }
}

extern "C" hvd_result_t hvd__cuda_lamb_norms(const hvd__cuda_lamb_span_t *spans,
                                             int n, int64_t chunks,
                                             const hvd_lamb_options_t *o,
                                             int64_t step, double *parts,
                                             double *out, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_lamb_norms";
  int go;
  hvd_result_t rc = hvd__km_check_step(who, spans, n, chunks, o, step, 1, &go);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  const hvd__km_lamb_t a = hvd__km_lamb_args(o, step);
  if (chunks > 0)
    lamb_norm_kernel<<<(unsigned)chunks, HVD__KM_NORM_THREADS, 0, stream>>>(
        spans, n, a, parts);
  lamb_fold_kernel<<<(unsigned)((n + hvd__kernel_threads - 1) /
                                hvd__kernel_threads),
                     hvd__kernel_threads, 0, stream>>>(spans, n, parts, out);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_lamb_apply(const hvd__cuda_lamb_span_t *spans,
                                             int n, int64_t max_count,
                                             const hvd_lamb_options_t *o,
                                             int64_t step,
                                             cudaStream_t stream) {
  static const char who[] = "hvd__cuda_lamb_apply";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  lamb_apply_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0,
                      stream>>>(spans, n, hvd__km_lamb_args(o, step));
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

/* ---- synchronized batch norm ------------------------------------------- */

namespace {

/* One block per channel: the two sums over its n * s values, in double,
 * reduced in shared memory. dy NULL: x and x^2; else dy and
 * dy * (x - mean). */
__global__ void bn_sums_kernel(const void *x, const void *dy, int dtype,
                               int64_t n, int64_t c, int64_t s,
                               const float *coef, double *out) {
  __shared__ double a[256], b[256];
  const int64_t ch = blockIdx.x, per = n * s;
  const float mean = dy != NULL ? coef[ch] : 0.0f;
  double sa = 0, sb = 0;
  for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
    int64_t i = ((j / s) * c + ch) * s + j % s;
    float v = hvd__km_bn_load(x, dtype, i);
    if (dy == NULL) {
      sa += v;
      sb += (double)v * v;
    } else {
      float g = hvd__km_bn_load(dy, dtype, i);
      sa += g;
      sb += (double)g * (v - mean);
    }
  }
  a[threadIdx.x] = sa;
  b[threadIdx.x] = sb;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) {
      a[threadIdx.x] += a[threadIdx.x + half];
      b[threadIdx.x] += b[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[ch] = a[0];
    out[c + ch] = b[0];
  }
}

__global__ void bn_apply_kernel(const void *x, void *y, int dtype, int64_t n,
                                int64_t c, int64_t s, const float *coef) {
  const int64_t total = n * c * s, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    int64_t ch = (i / s) % c;
    hvd__km_bn_store(
        y, dtype, i,
        hvd__km_bn_apply_elem(hvd__km_bn_load(x, dtype, i), coef, c, ch));
  }
}

__global__ void bn_dx_kernel(const void *x, const void *dy, void *dx, int dtype,
                             int64_t n, int64_t c, int64_t s,
                             const float *coef) {
  const int64_t total = n * c * s, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    int64_t ch = (i / s) % c;
    float v = hvd__km_bn_load(x, dtype, i), g = hvd__km_bn_load(dy, dtype, i);
    hvd__km_bn_store(dx, dtype, i, hvd__km_bn_dx_elem(v, g, coef, c, ch));
  }
}

} // namespace

extern "C" hvd_result_t hvd__cuda_bn_stats(const void *x, hvd_dtype_t dtype,
                                           int64_t n, int64_t c, int64_t s,
                                           double *out, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_stats";
  hvd_result_t rc = hvd__km_bn_check(who, dtype, n, c, s);
  if (rc != HVD_SUCCESS)
    return rc;
  bn_sums_kernel<<<(unsigned)c, 256, 0, stream>>>(x, NULL, dtype, n, c, s, NULL,
                                                  out);
  return cudaPeekAtLastError() == cudaSuccess ? HVD_SUCCESS
                                              : hvd__launch_error(who);
}

extern "C" hvd_result_t hvd__cuda_bn_apply(const void *x, void *y,
                                           hvd_dtype_t dtype, int64_t n,
                                           int64_t c, int64_t s,
                                           const float *coef,
                                           cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_apply";
  hvd_result_t rc = hvd__km_bn_check(who, dtype, n, c, s);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  bn_apply_kernel<<<hvd__grid_for(n * c * s, 1), hvd__kernel_threads, 0,
                    stream>>>(x, y, dtype, n, c, s, coef);
  return cudaPeekAtLastError() == cudaSuccess ? HVD_SUCCESS
                                              : hvd__launch_error(who);
}

extern "C" hvd_result_t hvd__cuda_bn_grad_stats(const void *x, const void *dy,
                                                hvd_dtype_t dtype, int64_t n,
                                                int64_t c, int64_t s,
                                                const float *coef, double *out,
                                                cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_grad_stats";
  hvd_result_t rc = hvd__km_bn_check(who, dtype, n, c, s);
  if (rc != HVD_SUCCESS)
    return rc;
  bn_sums_kernel<<<(unsigned)c, 256, 0, stream>>>(x, dy, dtype, n, c, s, coef,
                                                  out);
  return cudaPeekAtLastError() == cudaSuccess ? HVD_SUCCESS
                                              : hvd__launch_error(who);
}

extern "C" hvd_result_t hvd__cuda_bn_dx(const void *x, const void *dy, void *dx,
                                        hvd_dtype_t dtype, int64_t n, int64_t c,
                                        int64_t s, const float *coef,
                                        cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_dx";
  hvd_result_t rc = hvd__km_bn_check(who, dtype, n, c, s);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  bn_dx_kernel<<<hvd__grid_for(n * c * s, 1), hvd__kernel_threads, 0, stream>>>(
      x, dy, dx, dtype, n, c, s, coef);
  return cudaPeekAtLastError() == cudaSuccess ? HVD_SUCCESS
                                              : hvd__launch_error(who);
}

/* ---- PowerSGD ----------------------------------------------------------- */

namespace {

__global__ void psgd_prepare_kernel(float *M, const float *e, int64_t len,
                                    float pre) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < len;
       k += stride)
    hvd__km_psgd_prepare(M, e, pre, k);
}

/* One warp per row a of M (rows strided over the grid's warps): lane l
 * sums its elements in double, then the lanes fold pairwise by shuffles,
 * lane l taking l + h: hvd__km_psgd_dot's order. */
__global__ void psgd_mq_kernel(const float *M, const float *Qt, float *P,
                               int64_t n, int64_t m, int r) {
  const int lane = threadIdx.x % HVD__KM_PSGD_LANES;
  const int64_t warp =
      ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / HVD__KM_PSGD_LANES;
  const int64_t warps = (int64_t)gridDim.x * blockDim.x / HVD__KM_PSGD_LANES;
  for (int64_t a = warp; a < n; a += warps)
    for (int j = 0; j < r; j++) {
      const float *x = M + a * m, *y = Qt + (int64_t)j * m;
      double acc = 0;
      for (int64_t b = lane; b < m; b += HVD__KM_PSGD_LANES)
        acc += (double)x[b] * (double)y[b];
      for (int h = HVD__KM_PSGD_LANES / 2; h > 0; h /= 2)
        acc += __shfl_down_sync(0xffffffffu, acc, h);
      if (lane == 0)
        P[a * r + j] = (float)acc;
    }
}

/* Thread k: chunk k / (r m)'s part of Q^T's element k % (r m) (threads
 * side by side read M's columns side by side). */
__global__ void psgd_mtp_part_kernel(const float *M, const float *P,
                                     float *parts, int64_t n, int64_t m, int r,
                                     int64_t len) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, rm = (int64_t)r * m;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < len;
       k += stride) {
    const int64_t c = k / rm, e = k % rm;
    parts[k] = hvd__km_psgd_mtp_part(M, P, n, m, r, (int)(e / m), e % m, c);
  }
}

/* Thread k: Q^T's element k, the chunks' parts in order. */
__global__ void psgd_mtp_fold_kernel(const float *parts, float *Qt,
                                     int64_t chunks, int64_t rm) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < rm;
       k += stride) {
    float acc = 0;
    for (int64_t c = 0; c < chunks; c++)
      acc += parts[c * rm + k];
    Qt[k] = acc;
  }
}

__global__ void psgd_finish_kernel(float *M, float *e, const float *P,
                                   const float *Qt, int64_t len, int64_t m,
                                   int r, float post, float inv, int keep) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < len;
       k += stride)
    hvd__km_psgd_finish(M, e, P, Qt, m, r, post, inv, keep, k);
}

} // namespace

extern "C" hvd_result_t hvd__cuda_psgd_prepare(float *M, const float *e,
                                               int64_t len, double pre,
                                               cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_prepare";
  hvd_result_t rc = hvd__km_check_one(who, len, HVD_FLOAT32);
  if (rc != HVD_SUCCESS || len == 0 || ((float)pre == 1.0f && e == NULL))
    return rc;
  psgd_prepare_kernel<<<hvd__grid_for(len, 1), hvd__kernel_threads, 0,
                        stream>>>(M, e, len, (float)pre);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_psgd_mq(const float *M, const float *Qt,
                                          float *P, int64_t n, int64_t m, int r,
                                          cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_mq";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  psgd_mq_kernel<<<hvd__grid_for(n * HVD__KM_PSGD_LANES, 1),
                   hvd__kernel_threads, 0, stream>>>(M, Qt, P, n, m, r);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_psgd_mtp(const float *M, const float *P,
                                           float *Qt, float *parts, int64_t n,
                                           int64_t m, int r,
                                           cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_mtp";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  const int64_t chunks = hvd__km_psgd_chunks(n), rm = (int64_t)r * m;
  if (rc != HVD_SUCCESS || m == 0)
    return rc;
  if (chunks == 1) { /* the one part is the sum: 0 + part */
    psgd_mtp_part_kernel<<<hvd__grid_for(rm, 1), hvd__kernel_threads, 0,
                           stream>>>(M, P, Qt, n, m, r, rm);
  } else {
    if (parts == NULL)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: parts is NULL for %lld chunks", who,
                            (long long)chunks);
    psgd_mtp_part_kernel<<<hvd__grid_for(chunks * rm, 1), hvd__kernel_threads,
                           0, stream>>>(M, P, parts, n, m, r, chunks * rm);
    psgd_mtp_fold_kernel<<<hvd__grid_for(rm, 1), hvd__kernel_threads, 0,
                           stream>>>(parts, Qt, chunks, rm);
  }
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_psgd_finish(float *M, float *e,
                                              const float *P, const float *Qt,
                                              int64_t n, int64_t m, int r,
                                              double post, float inv, int keep,
                                              cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_finish";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  if (rc != HVD_SUCCESS || n * m == 0)
    return rc;
  psgd_finish_kernel<<<hvd__grid_for(n * m, 1), hvd__kernel_threads, 0,
                       stream>>>(M, e, P, Qt, n * m, m, r, (float)post, inv,
                                 keep);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}
