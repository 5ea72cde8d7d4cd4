/* reduce.c - host element kernels. */
#include "ops/reduce.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static float half_get(const uint16_t *p, int64_t i, hvd_dtype_t dtype) {
  return dtype == HVD_FLOAT16 ? hvd__f16_to_f32(p[i]) : hvd__bf16_to_f32(p[i]);
}

static uint16_t half_make(float f, hvd_dtype_t dtype) {
  return dtype == HVD_FLOAT16 ? hvd__f32_to_f16(f) : hvd__f32_to_bf16(f);
}

/* f32 and f64 loops are written so the compiler vectorizes them: one loop
 * in place, one between distinct buffers (restrict). */
static void scale_f32(float *restrict d, const float *restrict s, int64_t n,
                      float f) {
  for (int64_t i = 0; i < n; i++)
    d[i] = s[i] * f;
}

static void scale_f32_inplace(float *d, int64_t n, float f) {
  for (int64_t i = 0; i < n; i++)
    d[i] *= f;
}

static void scale_f64(double *restrict d, const double *restrict s, int64_t n,
                      double f) {
  for (int64_t i = 0; i < n; i++)
    d[i] = s[i] * f;
}

static void scale_f64_inplace(double *d, int64_t n, double f) {
  for (int64_t i = 0; i < n; i++)
    d[i] *= f;
}

void hvd__scale(void *dst, const void *src, int64_t n, hvd_dtype_t dtype,
                double factor) {
  if (factor == 1.0) {
    if (dst != src)
      memmove(dst, src, (size_t)n * hvd_dtype_size(dtype));
    return;
  }
  switch (dtype) {
  case HVD_FLOAT32: /* multiplied in float, like every framework's average */
    if (dst == src)
      scale_f32_inplace(dst, n, (float)factor);
    else
      scale_f32(dst, src, n, (float)factor);
    break;
  case HVD_FLOAT64:
    if (dst == src)
      scale_f64_inplace(dst, n, factor);
    else
      scale_f64(dst, src, n, factor);
    break;
  case HVD_FLOAT16: /* in double, rounded to float, then to the type */
  case HVD_BFLOAT16: {
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = half_make((float)((double)half_get(s, i, dtype) * factor), dtype);
    break;
  }
  default: /* integer scale factors are rejected at submission */
    if (dst != src)
      memmove(dst, src, (size_t)n * hvd_dtype_size(dtype));
    break;
  }
}

#define DIVIDE_INTS(type)                                                      \
  do {                                                                         \
    const type *s = src;                                                       \
    type *d = dst;                                                             \
    for (int64_t i = 0; i < n; i++)                                            \
      d[i] = (type)((int64_t)s[i] / (int64_t)size); /* size may exceed type */ \
  } while (0)

void hvd__reduce_finish(void *dst, const void *src, int64_t n,
                        hvd_dtype_t dtype, hvd_op_t op, double postscale,
                        int size) {
  if (op == HVD_AVERAGE && size > 1) {
    switch (dtype) {
    case HVD_UINT8:
      DIVIDE_INTS(uint8_t);
      break;
    case HVD_INT8:
      DIVIDE_INTS(int8_t);
      break;
    case HVD_INT32:
      DIVIDE_INTS(int32_t);
      break;
    case HVD_INT64:
      DIVIDE_INTS(int64_t);
      break;
    case HVD_FLOAT64: {
      const double *s = src;
      double *d = dst;
      for (int64_t i = 0; i < n; i++)
        d[i] = s[i] / size * postscale;
      return;
    }
    default: /* f32, f16, bf16: times postscale / size (hvd__scale) */
      hvd__scale(dst, src, n, dtype, postscale / size);
      return;
    }
    return;
  }
  hvd__scale(dst, src, n, dtype, postscale);
}

#define FILL(type, value)                                                      \
  do {                                                                         \
    type *p = buf, v = (value);                                                \
    for (int64_t i = 0; i < n; i++)                                            \
      p[i] = v;                                                                \
  } while (0)

void hvd__fill_identity(void *buf, int64_t n, hvd_dtype_t dtype, hvd_op_t op) {
  int kind = op == HVD_PRODUCT ? 1 : op == HVD_MIN ? 2 : op == HVD_MAX ? 3 : 0;
  if (kind == 0) {
    memset(buf, 0, (size_t)n * hvd_dtype_size(dtype));
    return;
  }
  switch (dtype) {
  case HVD_UINT8:
    FILL(uint8_t, kind == 1 ? 1 : kind == 2 ? UINT8_MAX : 0);
    break;
  case HVD_INT8:
    FILL(int8_t, kind == 1 ? 1 : kind == 2 ? INT8_MAX : INT8_MIN);
    break;
  case HVD_INT32:
    FILL(int32_t, kind == 1 ? 1 : kind == 2 ? INT32_MAX : INT32_MIN);
    break;
  case HVD_INT64:
    FILL(int64_t, kind == 1 ? 1 : kind == 2 ? INT64_MAX : INT64_MIN);
    break;
  case HVD_FLOAT32:
    FILL(float, kind == 1 ? 1.0f : kind == 2 ? INFINITY : -INFINITY);
    break;
  case HVD_FLOAT64:
    FILL(double, kind == 1 ? 1.0 : kind == 2 ? INFINITY : -INFINITY);
    break;
  case HVD_FLOAT16:
  case HVD_BFLOAT16:
    FILL(uint16_t, half_make(kind == 1   ? 1.0f
                             : kind == 2 ? INFINITY
                                         : -INFINITY,
                             dtype));
    break;
  default:
    break;
  }
}

void hvd__reduce_half(const uint16_t *in, uint16_t *inout, int64_t n,
                      hvd_dtype_t dtype, hvd_op_t op) {
  for (int64_t i = 0; i < n; i++) {
    float a = half_get(in, i, dtype), b = half_get(inout, i, dtype), r;
    switch (op) {
    case HVD_MIN: /* fmin, fmax: a NaN loses (hvd.h) */
      r = a < b || b != b ? a : b;
      break;
    case HVD_MAX:
      r = a > b || b != b ? a : b;
      break;
    case HVD_PRODUCT:
      r = a * b;
      break;
    default:
      r = a + b;
      break;
    }
    inout[i] = half_make(r, dtype);
  }
}

/* One vectorizable loop per dtype and op. */
#define INTO_LOOP(type, expr)                                                  \
  do {                                                                         \
    type *restrict d = dst;                                                    \
    const type *restrict s = src;                                              \
    for (int64_t i = 0; i < n; i++) {                                          \
      type a = d[i], b = s[i];                                                 \
      d[i] = (type)(expr);                                                     \
    }                                                                          \
  } while (0)

/* Integer sums and products wrap, as MPI's do: computed in `wide`, an
 * unsigned type, so overflow is defined. MIN and MAX are fmin and fmax
 * (a NaN loses to a number, whichever rank holds it: hvd.h, NCCL's), the
 * a != a test false for integers. */
#define INTO_TYPE(type, wide)                                                  \
  do {                                                                         \
    switch (op) {                                                              \
    case HVD_MIN:                                                              \
      INTO_LOOP(type, b < a || a != a ? b : a);                                \
      break;                                                                   \
    case HVD_MAX:                                                              \
      INTO_LOOP(type, b > a || a != a ? b : a);                                \
      break;                                                                   \
    case HVD_PRODUCT:                                                          \
      INTO_LOOP(type, (wide)a *(wide)b);                                       \
      break;                                                                   \
    default:                                                                   \
      INTO_LOOP(type, (wide)a + (wide)b);                                      \
      break;                                                                   \
    }                                                                          \
  } while (0)

/* The same loops with the first operand read from `first` instead of
 * dst: one pass where a copy and a reduce_into would make two. */
#define PAIR_LOOP(type, expr)                                                  \
  do {                                                                         \
    type *restrict d = dst;                                                    \
    const type *restrict f = first;                                            \
    const type *restrict s = src;                                              \
    for (int64_t i = 0; i < n; i++) {                                          \
      type a = f[i], b = s[i];                                                 \
      d[i] = (type)(expr);                                                     \
    }                                                                          \
  } while (0)

void hvd__reduce_pair(void *dst, const void *first, const void *src, int64_t n,
                      hvd_dtype_t dtype, hvd_op_t op) {
  if (dtype == HVD_FLOAT32 && (op == HVD_SUM || op == HVD_AVERAGE)) {
    PAIR_LOOP(float, a + b); /* gradients: the case that matters */
    return;
  }
  if (dtype == HVD_FLOAT64 && (op == HVD_SUM || op == HVD_AVERAGE)) {
    PAIR_LOOP(double, a + b);
    return;
  }
  memcpy(dst, first, (size_t)n * hvd_dtype_size(dtype));
  hvd__reduce_into(dst, src, n, dtype, op);
}

void hvd__reduce_into(void *dst, const void *src, int64_t n, hvd_dtype_t dtype,
                      hvd_op_t op) {
  switch (dtype) {
  case HVD_UINT8:
    INTO_TYPE(uint8_t, unsigned);
    break;
  case HVD_INT8:
    INTO_TYPE(int8_t, unsigned);
    break;
  case HVD_INT32:
    INTO_TYPE(int32_t, uint32_t);
    break;
  case HVD_INT64:
    INTO_TYPE(int64_t, uint64_t);
    break;
  case HVD_FLOAT32:
    INTO_TYPE(float, float);
    break;
  case HVD_FLOAT64:
    INTO_TYPE(double, double);
    break;
  case HVD_FLOAT16:
  case HVD_BFLOAT16:
    hvd__reduce_half(src, dst, n, dtype, op);
    break;
  default:
    break;
  }
}

/* Bytes per block of hvd__reduce_ordered: 16 KiB, in L1 beside a block of
 * each source while the sources are folded into it. */
#define ORDERED_BLOCK_BYTES 16384

void hvd__reduce_ordered(void *dst, const void *const *src, int nsrc, int64_t n,
                         hvd_dtype_t dtype, hvd_op_t op) {
  size_t esize = hvd_dtype_size(dtype);
  int alias = -1; /* the source that is dst */
  for (int q = 0; q < nsrc; q++)
    if (src[q] == dst)
      alias = q;
  if (nsrc == 1) {
    if (alias < 0)
      memmove(dst, src[0], (size_t)n * esize);
    return;
  }
  _Alignas(64) char tmp[ORDERED_BLOCK_BYTES];
  int64_t block = (int64_t)(sizeof tmp / esize);
  for (int64_t at = 0; at < n; at += block) {
    int64_t k = n - at < block ? n - at : block;
    size_t off = (size_t)at * esize;
    /* the fold goes into dst's block, or into tmp when dst is a source
     * still to be read (not the first) */
    char *acc = alias > 0 ? tmp : (char *)dst + off;
    if (alias == 0)
      hvd__reduce_into(acc, (const char *)src[1] + off, k, dtype, op);
    else
      hvd__reduce_pair(acc, (const char *)src[0] + off,
                       (const char *)src[1] + off, k, dtype, op);
    for (int q = 2; q < nsrc; q++)
      hvd__reduce_into(acc, (const char *)src[q] + off, k, dtype, op);
    if (acc == tmp)
      memcpy((char *)dst + off, tmp, (size_t)k * esize);
  }
}

void hvd__cast_to_wire(uint16_t *dst, const float *src, int64_t n,
                       hvd_dtype_t wire, double factor) {
  float f = (float)factor;
  for (int64_t i = 0; i < n; i++)
    dst[i] = half_make(src[i] * f, wire);
}

void hvd__cast_from_wire(float *dst, const uint16_t *src, int64_t n,
                         hvd_dtype_t wire, hvd_op_t op, double postscale,
                         int size) {
  float f = (float)(op == HVD_AVERAGE ? postscale / size : postscale);
  for (int64_t i = 0; i < n; i++)
    dst[i] = half_get(src, i, wire) * f;
}
