/*
 * kernel_math.h - what every device kernel (lib/ops/cuda_kernels.cu,
 * lib/optim/optim_kernels.cu) checks and converts, in one place: the
 * arguments every launch checks (with their messages) and the f16/bf16
 * element conversions. The one definition for the device kernels (nvcc
 * compiles the element functions __host__ __device__) and for the host
 * stand-in of the kernels (t/standin/kernels.c), so that the stand-in runs
 * the kernels' own checks, as half.h does for the conversions. The
 * optimizers' element formulas are lib/optim/optim_math.h.
 *
 * Compiled with no contraction into fused multiply-adds (nvcc -fmad=false;
 * fp-contract off on the host) so that every side rounds the same way.
 */
#ifndef HVD_BASE_KERNEL_MATH_H
#define HVD_BASE_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>

#include "base/half.h"
#include "hvd.h"

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

#endif /* HVD_BASE_KERNEL_MATH_H */
