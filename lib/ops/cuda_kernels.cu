/*
 * cuda_kernels.cu - device element kernels: batched pack/unpack of fusion
 * buffers with scaling and f16/bf16 casts fused, and scale/average of one
 * tensor. Interface and contract in cuda_kernels.h. (The optimizers'
 * updates are lib/optim/optim_kernels.cu.)
 *
 * Every formula is the host one (lib/ops/reduce.c) written again,
 * operation for operation: the element math in float (or double where the
 * host uses double), the scalar factors computed on the host by the same
 * expressions, and the conversions to f16/bf16 by the same functions
 * (base/half.h). The launch checks are in base/kernel_math.h, which the
 * host stand-in (t/standin/kernels.c) runs too. Built with -fmad=false
 * (Makefile.am), so that no a * b + c becomes one fused multiply-add, and
 * with IEEE division and square root (nvcc's defaults), so that device and
 * host agree bit for bit.
 *
 * One launch covers many tensors: grid.y walks the spans, grid.x the
 * elements of a span (both with a stride, so any grid covers any batch),
 * 16 bytes per thread and step where a span's pointers are aligned.
 */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/cuda_launch.h"
#include "base/device.h"
#include "base/half.h"
#include "base/kernel_math.h"
#include "ops/cuda_kernels.h"

namespace {

#define HD __host__ __device__ __forceinline__

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

struct ScaleHalf { /* hvd__scale, f16/bf16: in double, to float, to half */
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

/* V elements of T as one aligned unit: a 16-byte access where V * sizeof(T)
 * is 16 (ld/st.global.v4), so that each thread keeps 16 bytes in flight
 * instead of 4. The scalar loop reached 55-60% of cudaMemcpy's bandwidth
 * on an H100 (bench/gpu-session.sh, gpu-pack), too few bytes in flight. */
template <typename T, int V> struct alignas(sizeof(T) * V) Vec { T v[V]; };

/* Elements per vector: 16 bytes of the wider of the two types. */
template <typename S, typename D> struct Lanes {
  static const int v = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
};

/* spans in device memory, or (spans NULL) the one span `one`. A span
 * whose source and destination are both aligned to their vectors runs
 * V elements per step, its last count % V one by one; any other span
 * runs element by element. The same op on the same elements either way. */
template <typename S, typename D, typename Op>
__global__ void span_kernel(const hvd__cuda_span_t *spans, hvd__cuda_span_t one,
                            int n, Op op) {
  const int V = Lanes<S, D>::v;
  typedef Vec<S, V> VS;
  typedef Vec<D, V> VD;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_span_t sp = spans ? spans[t] : one;
    if (Op::skip_in_place && sp.src == sp.dst)
      continue;
    const S *src = static_cast<const S *>(sp.src);
    D *dst = static_cast<D *>(sp.dst);
    int64_t body = 0;
    if ((uintptr_t)src % sizeof(VS) == 0 && (uintptr_t)dst % sizeof(VD) == 0) {
      const int64_t nv = sp.count / V;
      const VS *vs = reinterpret_cast<const VS *>(src);
      VD *vd = reinterpret_cast<VD *>(dst);
      for (int64_t i = first; i < nv; i += stride) {
        VS a = vs[i];
        VD b;
#pragma unroll
        for (int k = 0; k < V; k++)
          b.v[k] = op(a.v[k]);
        vd[i] = b;
      }
      body = nv * V;
    }
    for (int64_t i = body + first; i < sp.count; i += stride)
      dst[i] = op(src[i]);
  }
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
  const int64_t v = Lanes<S, D>::v; /* a thread per vector */
  span_kernel<S, D, Op>
      <<<hvd__grid_for((b.max_count + v - 1) / v, b.n), hvd__kernel_threads, 0,
         b.stream>>>(b.spans, b.one, b.n, op);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(b.who);
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
    default: /* f32, f16, bf16: times postscale / size (hvd__scale) */
      return scale(b, dtype, postscale / size);
    }
  }
  return scale(b, dtype, postscale);
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
