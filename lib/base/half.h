/*
 * half.h - float16 and bfloat16 <-> float32, rounding to nearest even. The
 * one definition for the host (lib/ops/reduce.c) and the device
 * (lib/ops/cuda_kernels.cu, where nvcc compiles them __host__ __device__),
 * so that both convert the same way by construction.
 */
#ifndef HVD_BASE_HALF_H
#define HVD_BASE_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HVD__HALF_FN static __host__ __device__ __forceinline__
#else
#define HVD__HALF_FN static inline
#endif

HVD__HALF_FN float hvd__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
  if (exp == 0 && mant == 0) {
    x = sign;
  } else if (exp == 0) { /* subnormal: normalise */
    int k = 0;
    while (!(mant & 0x400)) {
      mant <<= 1;
      k++;
    }
    x = sign | ((uint32_t)(113 - k) << 23) | ((mant & 0x3ff) << 13);
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

HVD__HALF_FN uint16_t hvd__f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) /* inf or nan (kept quiet) */
    return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31)
    return (uint16_t)(sign | 0x7c00);
  if (e <= 0) { /* subnormal in f16, or zero */
    if (e < -10)
      return (uint16_t)sign;
    uint32_t full = mant | 0x800000;
    int shift = 14 - e;
    uint32_t m = full >> shift, rem = full & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1)))
      m++;
    return (uint16_t)(sign | m);
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++; /* a carry into the exponent is still right, up to inf */
  return (uint16_t)h;
}

HVD__HALF_FN float hvd__bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

HVD__HALF_FN uint16_t hvd__f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffff) > 0x7f800000) /* nan: keep it quiet */
    return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#endif /* HVD_BASE_HALF_H */
