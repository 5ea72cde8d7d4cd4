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
 * same functions (ops/half.h). The optimizers' updates, their factors and
 * the launch checks are in ops/kernel_math.h, which the host stand-in
 * (t/standin/kernels.c) runs too. Built with -fmad=false (Makefile.am), so that
 * no a * b + c becomes one fused multiply-add, and with IEEE division and
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
#include "base/device.h"
#include "base/half.h"
#include "ops/kernel_math.h"

namespace {

#define HD __host__ __device__ __forceinline__

const int kThreads = 256;           /* per block */
const int64_t kMaxBlocks = 1 << 18; /* per launch, over all spans */

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
    return hvd__km_half_make((float)((double)hvd__km_half_get(s, bf16) * f),
                             bf16);
  }
};

struct ToWire { /* hvd__cast_to_wire */
  static const bool skip_in_place = false;
  float f;
  bool bf16;
  HD uint16_t operator()(float s) const {
    return hvd__km_half_make(s * f, bf16);
  }
};

struct FromWire { /* hvd__cast_from_wire */
  static const bool skip_in_place = false;
  float f;
  bool bf16;
  HD float operator()(uint16_t s) const {
    return hvd__km_half_get(s, bf16) * f;
  }
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

/* ---- optimizers, as lib/optim/optimizer.c (ops/kernel_math.h) --------- */

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

} // namespace

/* ---- the C interface ---------------------------------------------------- */

extern "C" hvd_result_t hvd__cuda_pack(const hvd__cuda_span_t *spans, int n,
                                       int64_t max_count, hvd_dtype_t dtype,
                                       hvd_dtype_t wire, double prescale,
                                       cudaStream_t stream) {
  static const char who[] = "hvd__cuda_pack";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  Batch b = {who, spans, {NULL, NULL, 0}, n, max_count, stream};
  if (hvd__km_is_dtype(dtype) && wire == dtype)
    return go ? scale(b, dtype, prescale) : HVD_SUCCESS;
  if (dtype == HVD_FLOAT32 && hvd__km_is_half(wire))
    return go ? launch<float, uint16_t>(
                    b, ToWire{(float)prescale, wire == HVD_BFLOAT16})
              : HVD_SUCCESS;
  return hvd__km_bad_pair(who, dtype, wire);
}

extern "C" hvd_result_t hvd__cuda_unpack(const hvd__cuda_span_t *spans, int n,
                                         int64_t max_count, hvd_dtype_t wire,
                                         hvd_dtype_t dtype, hvd_op_t op,
                                         double postscale, int size,
                                         cudaStream_t stream) {
  static const char who[] = "hvd__cuda_unpack";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  Batch b = {who, spans, {NULL, NULL, 0}, n, max_count, stream};
  if (hvd__km_is_dtype(dtype) && wire == dtype)
    return go ? finish(b, dtype, op, postscale, size) : HVD_SUCCESS;
  if (dtype == HVD_FLOAT32 && hvd__km_is_half(wire)) {
    float f = (float)(op == HVD_AVERAGE ? postscale / size : postscale);
    return go ? launch<uint16_t, float>(b, FromWire{f, wire == HVD_BFLOAT16})
              : HVD_SUCCESS;
  }
  return hvd__km_bad_pair(who, wire, dtype);
}

extern "C" hvd_result_t hvd__cuda_scale(void *dst, const void *src, int64_t n,
                                        hvd_dtype_t dtype, double factor,
                                        cudaStream_t stream) {
  static const char who[] = "hvd__cuda_scale";
  hvd_result_t rc = hvd__km_check_one(who, n, dtype);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  Batch b = {who, NULL, {src, dst, n}, 1, n, stream};
  return scale(b, dtype, factor);
}

extern "C" hvd_result_t hvd__cuda_reduce_finish(void *dst, const void *src,
                                                int64_t n, hvd_dtype_t dtype,
                                                hvd_op_t op, double postscale,
                                                int size, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_reduce_finish";
  hvd_result_t rc = hvd__km_check_one(who, n, dtype);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
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
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, INT64_MIN, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_sgd_t a = hvd__km_sgd_args(o, step, lr);
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
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_adam_t a = hvd__km_adam_args(o, step, lr);
  adam_kernel<<<grid_for(max_count, n), kThreads, 0, stream>>>(spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return launch_error(who);
  return HVD_SUCCESS;
}
