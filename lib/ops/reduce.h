/*
 * reduce.h - element-wise host kernels shared by the executors: f16/bf16
 * conversion, scaling, the finishing step of a reduction (average,
 * postscale) and the identity element of each op.
 */
#ifndef HVD_OPS_REDUCE_H
#define HVD_OPS_REDUCE_H

#include <stdint.h>

#include "internal.h"

/* hvd__f16_to_f32, hvd__f32_to_f16, hvd__bf16_to_f32, hvd__f32_to_bf16 */
#include "base/half.h"

/* dst[i] = src[i] * factor for a floating-point dtype (dst may be src).
 * With factor 1 it is a copy (nothing when dst == src). */
void hvd__scale(void *dst, const void *src, int64_t n, hvd_dtype_t dtype,
                double factor);

/* After a reduction over `size` ranks: dst[i] = src[i] / size for
 * HVD_AVERAGE (integer division for integer dtypes), times postscale.
 * dst may be src. This is also the unpack of a fused chunk. */
void hvd__reduce_finish(void *dst, const void *src, int64_t n,
                        hvd_dtype_t dtype, hvd_op_t op, double postscale,
                        int size);

/* Fills buf with the identity of op: what a rank that joined contributes. */
void hvd__fill_identity(void *buf, int64_t n, hvd_dtype_t dtype, hvd_op_t op);

/* Compression casts (float32 <-> float16/bfloat16 `wire`): into the wire
 * with a factor (the prescale), and back with the finish of a reduction
 * (average, postscale). */
void hvd__cast_to_wire(uint16_t *dst, const float *src, int64_t n,
                       hvd_dtype_t wire, double factor);
void hvd__cast_from_wire(float *dst, const uint16_t *src, int64_t n,
                         hvd_dtype_t wire, hvd_op_t op, double postscale,
                         int size);

/* dst[i] = op(dst[i], src[i]) for any dtype (sum for average); dst and
 * src do not overlap. The shared-memory allreduce's inner loop. */
void hvd__reduce_into(void *dst, const void *src, int64_t n, hvd_dtype_t dtype,
                      hvd_op_t op);

/* dst[i] = op(first[i], src[i]), the same values as copying first to dst
 * and then hvd__reduce_into(dst, src); one pass for float32 and float64
 * sums. No two of the buffers overlap. */
void hvd__reduce_pair(void *dst, const void *first, const void *src, int64_t n,
                      hvd_dtype_t dtype, hvd_op_t op);

/* dst[i] = op(...op(op(src[0][i], src[1][i]), src[2][i])..., src[n-1][i]):
 * the sources folded in their order, one rounding per step, the same bits
 * as a loop over them on one process whatever n or the block a caller
 * cuts. dst may be one of the sources (the same pointer, not a partial
 * overlap): each block is read before it is written. nsrc >= 1. The
 * deterministic reductions' kernel (ordered.c, mpi_ops.c). */
void hvd__reduce_ordered(void *dst, const void *const *src, int nsrc, int64_t n,
                         hvd_dtype_t dtype, hvd_op_t op);

/* inout[i] = op(in[i], inout[i]) for f16/bf16, accumulating in float. */
void hvd__reduce_half(const uint16_t *in, uint16_t *inout, int64_t n,
                      hvd_dtype_t dtype, hvd_op_t op);

#endif /* HVD_OPS_REDUCE_H */
