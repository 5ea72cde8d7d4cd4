/*
 * cuda_kernels.cu - device element kernels: batched pack/unpack of fusion
 * buffers with scaling and f16/bf16 casts fused, scale/average of one
 * tensor, and the SGD and Adam/AdamW updates. Interface and contract in
 * cuda_kernels.h.
 *
 * Every formula is the host one (lib/ops/reduce.c, lib/optim/optimizer.c)
 * written again, operation for operation: the element math in float (or
 * double where the host uses double), the scalar factors computed on the
 * host by the same expressions, and the conversions to f16/bf16 by the
 * same functions (ops/half.h). Built with -fmad=false (Makefile.am), so that no
 * a * b + c becomes one fused multiply-add, and with IEEE division and
 * square root (nvcc's defaults), so that device and host agree bit for bit.
 *
 * One launch covers many tensors: grid.y walks the spans, grid.x the
 * elements of a span (both with a stride, so any grid covers any batch).
 */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/cuda_kernels.h"
#include "ops/half.h"
#include "ops/cuda_rt.h"

namespace {

#define HD __host__ __device__ __forceinline__

const int kThreads = 256;           /* per block */
const int64_t kMaxBlocks = 1 << 18; /* per launch, over all spans */

/* ---- f16 and bf16: lib/ops/half.h, shared with the host --------------- */

HD float half_get(uint16_t h, bool bf16) {
  return bf16 ? hvd__bf16_to_f32(h) : hvd__f16_to_f32(h);
}

HD uint16_t half_make(float f, bool bf16) {
  return bf16 ? hvd__f32_to_bf16(f) : hvd__f32_to_f16(f);
}

/* ---- element operations: dst = op(src) --------------------------------- */

/* Copy: nothing to do for an in-place span. */
template <typename T> struct Copy {
  static const bool skip_in_place = true;
  HD T operator()(T s) const { return s; }
};

struct ScaleF32 { /* hvd__scale, float32: multiplied in float */
  static const bool skip_in_place = false;
  float f;
  HD float operator()(float s) const { return s * f; }
};

struct ScaleF64 {
  static const bool skip_in_place = false;
  double f;
  HD double operator()(double s) const { return s * f; }
};

struct ScaleHalf { /* hvd__scale, f16/bf16: in double, rounded once */
  static const bool skip_in_place = false;
  double f;
  bool bf16;
  HD uint16_t operator()(uint16_t s) const {
    return half_make((float)((double)half_get(s, bf16) * f), bf16);
  }
};

struct ToWire { /* hvd__cast_to_wire */
  static const bool skip_in_place = false;
  float f;
  bool bf16;
  HD uint16_t operator()(float s) const { return half_make(s * f, bf16); }
};

struct FromWire { /* hvd__cast_from_wire */
  static const bool skip_in_place = false;
  float f;
  bool bf16;
  HD float operator()(uint16_t s) const { return half_get(s, bf16) * f; }
};

template <typename T> struct DivideInt { /* hvd__reduce_finish, integers */
  static const bool skip_in_place = false;
  int size;
  HD T operator()(T s) const { return (T)((long long)s / (long long)size); }
};

struct AverageF64 { /* hvd__reduce_finish, float64 */
  static const bool skip_in_place = false;
  int size;
  double postscale;
  HD double operator()(double s) const { return s / size * postscale; }
};

/* ---- launching ---------------------------------------------------------- */

/* spans in device memory, or (spans NULL) the one span `one`. */
template <typename S, typename D, typename Op>
__global__ void span_kernel(const hvd__cuda_span_t *spans, hvd__cuda_span_t one,
                            int n, Op op) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_span_t sp = spans ? spans[t] : one;
    if (Op::skip_in_place && sp.src == sp.dst)
      continue;
    const S *src = static_cast<const S *>(sp.src);
    D *dst = static_cast<D *>(sp.dst);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         i < sp.count; i += stride)
      dst[i] = op(src[i]);
  }
}

/* Enough blocks along x for the longest span, but at most kMaxBlocks in
 * all; grid.y at most CUDA's 65535. */
dim3 grid_for(int64_t max_count, int n) {
  int64_t y = n < 65535 ? n : 65535;
  int64_t x = (max_count + kThreads - 1) / kThreads;
  if (x > kMaxBlocks / y)
    x = kMaxBlocks / y;
  if (x < 1)
    x = 1;
  return dim3((unsigned)x, (unsigned)y);
}

hvd_result_t launch_error(const char *who) {
  char what[128];
  snprintf(what, sizeof what, "%s: kernel launch", who);
  return hvd__cuda_error(cudaGetLastError(), what);
}

/* Where a batched or single-tensor call comes in. */
struct Batch {
  const char *who;
  const hvd__cuda_span_t *spans; /* NULL: `one` */
  hvd__cuda_span_t one;
  int n;
  int64_t max_count;
  cudaStream_t stream;
};

template <typename S, typename D, typename Op>
hvd_result_t launch(const Batch &b, Op op) {
  span_kernel<S, D, Op><<<grid_for(b.max_count, b.n), kThreads, 0, b.stream>>>(
      b.spans, b.one, b.n, op);
  if (cudaPeekAtLastError() != cudaSuccess)
    return launch_error(b.who);
  return HVD_SUCCESS;
}

hvd_result_t copy(const Batch &b, hvd_dtype_t dtype) {
  switch (hvd_dtype_size(dtype)) {
  case 1:
    return launch<uint8_t, uint8_t>(b, Copy<uint8_t>());
  case 2:
    return launch<uint16_t, uint16_t>(b, Copy<uint16_t>());
  case 4:
    return launch<uint32_t, uint32_t>(b, Copy<uint32_t>());
  default:
    return launch<uint64_t, uint64_t>(b, Copy<uint64_t>());
  }
}

/* hvd__scale */
hvd_result_t scale(const Batch &b, hvd_dtype_t dtype, double factor) {
  if (factor == 1.0)
    return copy(b, dtype);
  switch (dtype) {
  case HVD_FLOAT32:
    return launch<float, float>(b, ScaleF32{(float)factor});
  case HVD_FLOAT64:
    return launch<double, double>(b, ScaleF64{factor});
  case HVD_FLOAT16:
  case HVD_BFLOAT16:
    return launch<uint16_t, uint16_t>(b,
                                      ScaleHalf{factor, dtype == HVD_BFLOAT16});
  default: /* integer scale factors are rejected at submission */
    return copy(b, dtype);
  }
}

/* hvd__reduce_finish */
hvd_result_t finish(const Batch &b, hvd_dtype_t dtype, hvd_op_t op,
                    double postscale, int size) {
  if (op == HVD_AVERAGE && size > 1) {
    switch (dtype) {
    case HVD_UINT8:
      return launch<uint8_t, uint8_t>(b, DivideInt<uint8_t>{size});
    case HVD_INT8:
      return launch<int8_t, int8_t>(b, DivideInt<int8_t>{size});
    case HVD_INT32:
      return launch<int32_t, int32_t>(b, DivideInt<int32_t>{size});
    case HVD_INT64:
      return launch<int64_t, int64_t>(b, DivideInt<int64_t>{size});
    case HVD_FLOAT64:
      return launch<double, double>(b, AverageF64{size, postscale});
    default: /* f32, f16, bf16: divide in double, round once */
      return scale(b, dtype, postscale / size);
    }
  }
  return scale(b, dtype, postscale);
}

int is_dtype(hvd_dtype_t d) { return (int)d >= 0 && d < HVD_DTYPE_COUNT; }
int is_half(hvd_dtype_t d) { return d == HVD_FLOAT16 || d == HVD_BFLOAT16; }

/* The arguments every batched call checks; *go is 0 when there is nothing
 * to launch. */
hvd_result_t check_batch(const char *who, const void *spans, int n,
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

hvd_result_t bad_pair(const char *who, hvd_dtype_t from, hvd_dtype_t to) {
  return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: no conversion from %s to %s",
                        who, hvd_dtype_name(from), hvd_dtype_name(to));
}

/* ---- optimizers, as lib/optim/optimizer.c ------------------------------ */

struct SgdArgs {
  float wd, mom, keep, neg_lr;
  bool decay, momentum, nesterov, first;
};

/* torch.optim.SGD: d = g + wd * v; buf = first ? d : mom * buf + keep * d;
 * d = nesterov ? d + mom * buf : buf; v -= lr * d. */
__global__ void sgd_kernel(const hvd__cuda_param_span_t *spans, int n,
                           SgdArgs a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    float *v = sp.value, *buf = a.momentum ? sp.state[0] : NULL;
    const float *g = sp.grad;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride) {
      float d = a.decay ? g[j] + a.wd * v[j] : g[j];
      if (buf != NULL) {
        buf[j] = a.first ? d : a.mom * buf[j] + a.keep * d;
        d = a.nesterov ? d + a.mom * buf[j] : buf[j];
      }
      v[j] += a.neg_lr * d;
    }
  }
}

struct AdamArgs {
  float wd, decay, b1c, b2, b2c, eps, step_size, bc2_sqrt;
  bool l2;
};

/* torch.optim.Adam/AdamW: AdamW v *= 1 - lr * wd; Adam g += wd * v;
 * m = lerp(m, g, 1 - beta1); s = beta2 * s + (1 - beta2) * g * g;
 * v -= lr / (1 - beta1^t) * m / (sqrt(s) / sqrt(1 - beta2^t) + eps).
 * As the host's adam_loop: g as it is without L2 decay (never g + 0 * v,
 * NaN for an infinite v), and v *= decay always (decay 1 for Adam). */
__global__ void adam_kernel(const hvd__cuda_param_span_t *spans, int n,
                            AdamArgs a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    float *v = sp.value, *m = sp.state[0], *s = sp.state[1];
    const float *g = sp.grad;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride) {
      float gj = a.l2 ? g[j] + a.wd * v[j] : g[j];
      v[j] *= a.decay;
      m[j] += a.b1c * (gj - m[j]);
      s[j] = a.b2 * s[j] + a.b2c * gj * gj;
      float denom = sqrtf(s[j]) / a.bc2_sqrt + a.eps;
      v[j] -= a.step_size * (m[j] / denom);
    }
  }
}

} // namespace

/* ---- the C interface ---------------------------------------------------- */

extern "C" hvd_result_t hvd__cuda_pack(const hvd__cuda_span_t *spans, int n,
                                       int64_t max_count, hvd_dtype_t dtype,
                                       hvd_dtype_t wire, double prescale,
                                       cudaStream_t stream) {
  static const char who[] = "hvd__cuda_pack";
  int go;
  hvd_result_t rc = check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  Batch b = {who, spans, {NULL, NULL, 0}, n, max_count, stream};
  if (is_dtype(dtype) && wire == dtype)
    return go ? scale(b, dtype, prescale) : HVD_SUCCESS;
  if (dtype == HVD_FLOAT32 && is_half(wire))
    return go ? launch<float, uint16_t>(
                    b, ToWire{(float)prescale, wire == HVD_BFLOAT16})
              : HVD_SUCCESS;
  return bad_pair(who, dtype, wire);
}

extern "C" hvd_result_t hvd__cuda_unpack(const hvd__cuda_span_t *spans, int n,
                                         int64_t max_count, hvd_dtype_t wire,
                                         hvd_dtype_t dtype, hvd_op_t op,
                                         double postscale, int size,
                                         cudaStream_t stream) {
  static const char who[] = "hvd__cuda_unpack";
  int go;
  hvd_result_t rc = check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  Batch b = {who, spans, {NULL, NULL, 0}, n, max_count, stream};
  if (is_dtype(dtype) && wire == dtype)
    return go ? finish(b, dtype, op, postscale, size) : HVD_SUCCESS;
  if (dtype == HVD_FLOAT32 && is_half(wire)) {
    float f = (float)(op == HVD_AVERAGE ? postscale / size : postscale);
    return go ? launch<uint16_t, float>(b, FromWire{f, wire == HVD_BFLOAT16})
              : HVD_SUCCESS;
  }
  return bad_pair(who, wire, dtype);
}

extern "C" hvd_result_t hvd__cuda_scale(void *dst, const void *src, int64_t n,
                                        hvd_dtype_t dtype, double factor,
                                        cudaStream_t stream) {
  static const char who[] = "hvd__cuda_scale";
  if (n < 0 || !is_dtype(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  Batch b = {who, NULL, {src, dst, n}, 1, n, stream};
  return scale(b, dtype, factor);
}

extern "C" hvd_result_t hvd__cuda_reduce_finish(void *dst, const void *src,
                                                int64_t n, hvd_dtype_t dtype,
                                                hvd_op_t op, double postscale,
                                                int size, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_reduce_finish";
  if (n < 0 || !is_dtype(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  Batch b = {who, NULL, {src, dst, n}, 1, n, stream};
  return finish(b, dtype, op, postscale, size);
}

extern "C" hvd_result_t hvd__cuda_sgd_step(const hvd__cuda_param_span_t *spans,
                                           int n, int64_t max_count,
                                           const hvd_sgd_options_t *o,
                                           int64_t step, double lr,
                                           cudaStream_t stream) {
  static const char who[] = "hvd__cuda_sgd_step";
  int go;
  hvd_result_t rc = check_batch(who, spans, n, max_count, &go);
  if (rc == HVD_SUCCESS && o == NULL)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  SgdArgs a;
  a.wd = (float)o->weight_decay;
  a.mom = (float)o->momentum;
  a.keep = (float)(1.0 - o->dampening);
  a.neg_lr = (float)-lr;
  a.decay = o->weight_decay != 0;
  a.momentum = o->momentum != 0;
  a.nesterov = o->nesterov != 0;
  a.first = step == 1;
  sgd_kernel<<<grid_for(max_count, n), kThreads, 0, stream>>>(spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_adam_step(const hvd__cuda_param_span_t *spans,
                                            int n, int64_t max_count,
                                            const hvd_adam_options_t *o,
                                            int64_t step, double lr,
                                            cudaStream_t stream) {
  static const char who[] = "hvd__cuda_adam_step";
  int go;
  hvd_result_t rc = check_batch(who, spans, n, max_count, &go);
  if (rc == HVD_SUCCESS && o == NULL)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  if (rc == HVD_SUCCESS && step < 1)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: step %lld is not >= 1", who,
                        (long long)step);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  AdamArgs a;
  a.l2 = !o->decoupled && o->weight_decay != 0;
  a.wd = (float)o->weight_decay;
  a.decay = o->decoupled ? (float)(1.0 - lr * o->weight_decay) : 1.0f;
  a.b1c = (float)(1.0 - o->beta1);
  a.b2 = (float)o->beta2;
  a.b2c = (float)(1.0 - o->beta2);
  a.eps = (float)o->eps;
  a.step_size = (float)(lr / (1.0 - pow(o->beta1, (double)step)));
  a.bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, (double)step));
  adam_kernel<<<grid_for(max_count, n), kThreads, 0, stream>>>(spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return launch_error(who);
  return HVD_SUCCESS;
}
