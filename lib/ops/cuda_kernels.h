/*
 * cuda_kernels.h - device element kernels (lib/ops/cuda_kernels.cu), the
 * device twins of lib/ops/reduce.c, with the same results bit for bit: same
 * operation order, no contraction into fused multiply-adds, the same f16/bf16
 * rounding (to nearest even).
 *
 * Only in builds with CUDA (HVD_HAVE_CUDA). Every function launches on
 * `stream` and returns without waiting; the result says whether the launch
 * succeeded (HVD_ERR_CUDA with the runtime's message otherwise; a bad
 * argument is HVD_ERR_INVALID_ARG). Pointers are device memory unless said
 * otherwise; a span array and the memory it points to must stay valid
 * until the stream reaches the kernel. Thread-safe.
 *
 * The batched kernels take an array of spans in device memory and treat
 * many tensors in one launch; max_count is the largest span's count (it
 * sizes the grid; a span may be shorter, never longer). src == dst is an
 * in-place span; otherwise the two must not overlap.
 */
#ifndef HVD_OPS_CUDA_KERNELS_H
#define HVD_OPS_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "hvd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor's part of a batched copy: count elements from src to dst. */
typedef struct hvd__cuda_span {
  const void *src;
  void *dst;
  int64_t count;
} hvd__cuda_span_t;

/* Pack into a fusion buffer (src: tensors of `dtype`, dst: buffer slices
 * of `wire`), prescale fused:
 *  - wire == dtype: dst = src * prescale as hvd__scale (any dtype; a copy
 *    for integers and for prescale 1);
 *  - dtype float32, wire float16/bfloat16: as hvd__cast_to_wire.
 * Other pairs: HVD_ERR_INVALID_ARG. */
hvd_result_t hvd__cuda_pack(const hvd__cuda_span_t *spans, int n,
                            int64_t max_count, hvd_dtype_t dtype,
                            hvd_dtype_t wire, double prescale,
                            cudaStream_t stream);

/* Unpack a reduced fusion buffer (src: slices of `wire`, dst: tensors of
 * `dtype`), the finish of the reduction over `size` ranks fused:
 *  - wire == dtype: as hvd__reduce_finish (average, then postscale);
 *  - wire float16/bfloat16, dtype float32: as hvd__cast_from_wire.
 * Other pairs: HVD_ERR_INVALID_ARG. */
hvd_result_t hvd__cuda_unpack(const hvd__cuda_span_t *spans, int n,
                              int64_t max_count, hvd_dtype_t wire,
                              hvd_dtype_t dtype, hvd_op_t op, double postscale,
                              int size, cudaStream_t stream);

/* One tensor: dst[i] = src[i] * factor, as hvd__scale. */
hvd_result_t hvd__cuda_scale(void *dst, const void *src, int64_t n,
                             hvd_dtype_t dtype, double factor,
                             cudaStream_t stream);

/* One tensor: average and postscale, as hvd__reduce_finish. */
hvd_result_t hvd__cuda_reduce_finish(void *dst, const void *src, int64_t n,
                                     hvd_dtype_t dtype, hvd_op_t op,
                                     double postscale, int size,
                                     cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* HVD_OPS_CUDA_KERNELS_H */
