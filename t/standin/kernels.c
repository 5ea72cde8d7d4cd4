/*
 * kernels.c - host versions of every function of lib/ops/cuda_kernels.h
 * and lib/optim/optim_kernels.h,
 * for the stand-in (standin.h), run at the call instead of on the stream.
 * The optimizers' updates and factors, the f16/bf16 element conversions
 * and the launch checks are the .cu's own (lib/base/kernel_math.h,
 * lib/optim/optim_math.h); the
 * pack/unpack/scale element operations, one-liners in the .cu's functors,
 * are written again here, operation for operation (the factors computed
 * by the same expressions, no contraction into fused multiply-adds, as
 * nvcc's -fmad=false). So t/gpu's parity checks compare the kernels'
 * formulas with the host's (lib/ops/reduce.c, lib/optim) rather than with
 * themselves.
 *
 * Arguments are checked as the .cu checks them (the same results and
 * messages), and then, where a GPU would fault or silently read the wrong
 * bytes, loudly: the span array must be device memory on the current
 * device, every span's count at most max_count, its source and
 * destination device memory on the current device holding count elements,
 * and not overlapping unless they are the same; the stream must be on the
 * current device.
 */
#include <config.h>

/* before the includes: kernel_math.h's functions are compiled here too */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "base/kernel_math.h"
#include "ops/cuda_kernels.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"
#include "standin.h"

/* ---- checks -------------------------------------------------------- */

/* A buffer a kernel reads or writes (write) on stream: device memory,
 * seen by the stream checker. */
static void kernel_buffer(const char *who, cudaStream_t stream, const void *p,
                          size_t bytes, int write, const char *what) {
  standin_need_device(p, bytes, who, what);
  standin_access(stream, p, bytes, write, who, what);
}

/* What a GPU would need of one span: count elements of src_size bytes at
 * src and of dst_size at dst, on the current device, at most max_count,
 * no partial overlap. */
static void check_span(const char *who, int t, const void *src, void *dst,
                       int64_t count, int64_t max_count, size_t src_size,
                       size_t dst_size) {
  char what[64];
  if (count < 0 || count > max_count)
    standin_die("%s: span %d has %lld elements, outside [0, max_count %lld]",
                who, t, (long long)count, (long long)max_count);
  snprintf(what, sizeof what, "span %d's src", t);
  standin_need_device(src, (size_t)count * src_size, who, what);
  snprintf(what, sizeof what, "span %d's dst", t);
  standin_need_device(dst, (size_t)count * dst_size, who, what);
  uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
  size_t sb = (size_t)count * src_size, db = (size_t)count * dst_size;
  if (count > 0 && s != d && s < d + db && d < s + sb)
    standin_die("%s: span %d's src and dst overlap without being the same", who,
                t);
}

/* One span's memory for check_disjoint: [lo, hi), written or only read. */
typedef struct iv {
  uintptr_t lo, hi;
  int span, written;
} iv_t;

static int iv_cmp(const void *a, const void *b) {
  const iv_t *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The spans of one launch run in parallel on a GPU: memory that one span
 * writes must not be touched by another (sorts iv). */
static void check_disjoint(const char *who, iv_t *iv, size_t n) {
  uintptr_t hi_all = 0, hi_w = 0;
  int by_all = -1, by_w = -1;
  qsort(iv, n, sizeof *iv, iv_cmp);
  for (size_t i = 0; i < n; i++) {
    if (iv[i].lo == iv[i].hi)
      continue;
    int other = iv[i].written && iv[i].lo < hi_all ? by_all
                : iv[i].lo < hi_w                  ? by_w
                                                   : -1;
    if (other >= 0)
      standin_die("%s: span %d and span %d touch the same memory, and one "
                  "of them writes it",
                  who, other, iv[i].span);
    if (iv[i].hi > hi_all) {
      hi_all = iv[i].hi;
      by_all = iv[i].span;
    }
    if (iv[i].written && iv[i].hi > hi_w) {
      hi_w = iv[i].hi;
      by_w = iv[i].span;
    }
  }
}

static iv_t *iv_alloc(size_t n) {
  iv_t *iv = malloc((n ? n : 1) * sizeof *iv);
  if (iv == NULL)
    standin_die("out of memory");
  return iv;
}

/* The launch itself: the stream, and the span array in device memory. */
static void check_launch(const char *who, const void *spans, size_t bytes,
                         cudaStream_t stream) {
  (void)standin_stream_device(stream, who);
  standin_need_device(spans, bytes, who, "the span array");
}

/* ---- element operations, as the .cu's functors ---------------------- */

typedef enum {
  K_COPY,
  K_SCALE_F32,
  K_SCALE_F64,
  K_SCALE_HALF,
  K_TO_WIRE,
  K_FROM_WIRE,
  K_DIVIDE_INT,
  K_AVERAGE_F64
} kind_t;

typedef struct op {
  kind_t kind;
  hvd_dtype_t dtype; /* of the elements (K_COPY: its size; halves: which) */
  double f;          /* the factor (K_AVERAGE_F64: the postscale) */
  int size;          /* K_DIVIDE_INT, K_AVERAGE_F64 */
} op_t;

#define DIVIDE(type)                                                           \
  do {                                                                         \
    const type *s = src;                                                       \
    type *d = dst;                                                             \
    for (int64_t i = 0; i < n; i++)                                            \
      d[i] = (type)((long long)s[i] / (long long)o->size);                     \
  } while (0)

/* dst[i] = op(src[i]) for i < n; src == dst in place. */
static void apply(const op_t *o, const void *src, void *dst, int64_t n) {
  int bf16 = o->dtype == HVD_BFLOAT16;
  switch (o->kind) {
  case K_COPY: /* skip_in_place */
    if (src != dst)
      memmove(dst, src, (size_t)n * hvd_dtype_size(o->dtype));
    break;
  case K_SCALE_F32: {
    const float *s = src;
    float *d = dst, f = (float)o->f;
    for (int64_t i = 0; i < n; i++)
      d[i] = s[i] * f;
    break;
  }
  case K_SCALE_F64: {
    const double *s = src;
    double *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = s[i] * o->f;
    break;
  }
  case K_SCALE_HALF: {
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = hvd__km_half_make(
          (float)((double)hvd__km_half_get(s[i], bf16) * o->f), bf16);
    break;
  }
  case K_TO_WIRE: {
    const float *s = src;
    uint16_t *d = dst;
    float f = (float)o->f;
    for (int64_t i = 0; i < n; i++)
      d[i] = hvd__km_half_make(s[i] * f, bf16);
    break;
  }
  case K_FROM_WIRE: {
    const uint16_t *s = src;
    float *d = dst, f = (float)o->f;
    for (int64_t i = 0; i < n; i++)
      d[i] = hvd__km_half_get(s[i], bf16) * f;
    break;
  }
  case K_DIVIDE_INT:
    switch (o->dtype) {
    case HVD_UINT8:
      DIVIDE(uint8_t);
      break;
    case HVD_INT8:
      DIVIDE(int8_t);
      break;
    case HVD_INT32:
      DIVIDE(int32_t);
      break;
    default:
      DIVIDE(int64_t);
      break;
    }
    break;
  case K_AVERAGE_F64: {
    const double *s = src;
    double *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = s[i] / o->size * o->f;
    break;
  }
  }
}

/* The .cu's scale(): the functor for dtype and factor. */
static op_t scale_op(hvd_dtype_t dtype, double factor) {
  if (factor == 1.0)
    return (op_t){K_COPY, dtype, 1.0, 0};
  switch (dtype) {
  case HVD_FLOAT32:
    return (op_t){K_SCALE_F32, dtype, factor, 0};
  case HVD_FLOAT64:
    return (op_t){K_SCALE_F64, dtype, factor, 0};
  case HVD_FLOAT16:
  case HVD_BFLOAT16:
    return (op_t){K_SCALE_HALF, dtype, factor, 0};
  default: /* integer scale factors are rejected at submission */
    return (op_t){K_COPY, dtype, 1.0, 0};
  }
}

/* The .cu's finish(). */
static op_t finish_op(hvd_dtype_t dtype, hvd_op_t op, double postscale,
                      int size) {
  if (op == HVD_AVERAGE && size > 1) {
    switch (dtype) {
    case HVD_UINT8:
    case HVD_INT8:
    case HVD_INT32:
    case HVD_INT64:
      return (op_t){K_DIVIDE_INT, dtype, 1.0, size};
    case HVD_FLOAT64:
      return (op_t){K_AVERAGE_F64, dtype, postscale, size};
    default: /* f32, f16, bf16: divide in double, round once */
      return scale_op(dtype, postscale / size);
    }
  }
  return scale_op(dtype, postscale);
}

/* One batched launch: every span checked, then applied in order. */
static hvd_result_t run_spans(const char *who, const hvd__cuda_span_t *spans,
                              int n, int64_t max_count, const op_t *o,
                              size_t src_size, size_t dst_size,
                              cudaStream_t stream) {
  check_launch(who, spans, (size_t)n * sizeof *spans, stream);
  iv_t *iv = iv_alloc(2 * (size_t)n);
  size_t m = 0;
  for (int t = 0; t < n; t++) {
    const hvd__cuda_span_t *sp = &spans[t];
    check_span(who, t, sp->src, sp->dst, sp->count, max_count, src_size,
               dst_size);
    uintptr_t s = (uintptr_t)sp->src, d = (uintptr_t)sp->dst;
    iv[m++] = (iv_t){d, d + (size_t)sp->count * dst_size, t, 1};
    if (s != d) /* in place: one span's own read of what it writes */
      iv[m++] = (iv_t){s, s + (size_t)sp->count * src_size, t, 0};
  }
  check_disjoint(who, iv, m);
  free(iv);
  standin_access(stream, spans, (size_t)n * sizeof *spans, 0, who,
                 "the span array");
  for (int t = 0; t < n; t++) {
    standin_access(stream, spans[t].src, (size_t)spans[t].count * src_size, 0,
                   who, "a span's src");
    standin_access(stream, spans[t].dst, (size_t)spans[t].count * dst_size, 1,
                   who, "a span's dst");
  }
  for (int t = 0; t < n; t++)
    apply(o, spans[t].src, spans[t].dst, spans[t].count);
  return HVD_SUCCESS;
}

/* ---- the interface ----------------------------------------------------- */

hvd_result_t hvd__cuda_pack(const hvd__cuda_span_t *spans, int n,
                            int64_t max_count, hvd_dtype_t dtype,
                            hvd_dtype_t wire, double prescale,
                            cudaStream_t stream) {
  static const char who[] = "hvd__cuda_pack";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  if (hvd__km_is_dtype(dtype) && wire == dtype) {
    op_t o = scale_op(dtype, prescale);
    size_t es = hvd_dtype_size(dtype);
    return go ? run_spans(who, spans, n, max_count, &o, es, es, stream)
              : HVD_SUCCESS;
  }
  if (dtype == HVD_FLOAT32 && hvd__km_is_half(wire)) {
    op_t o = {K_TO_WIRE, wire, (float)prescale, 0};
    return go ? run_spans(who, spans, n, max_count, &o, 4, 2, stream)
              : HVD_SUCCESS;
  }
  return hvd__km_bad_pair(who, dtype, wire);
}

hvd_result_t hvd__cuda_unpack(const hvd__cuda_span_t *spans, int n,
                              int64_t max_count, hvd_dtype_t wire,
                              hvd_dtype_t dtype, hvd_op_t op, double postscale,
                              int size, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_unpack";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS)
    return rc;
  if (hvd__km_is_dtype(dtype) && wire == dtype) {
    op_t o = finish_op(dtype, op, postscale, size);
    size_t es = hvd_dtype_size(dtype);
    return go ? run_spans(who, spans, n, max_count, &o, es, es, stream)
              : HVD_SUCCESS;
  }
  if (dtype == HVD_FLOAT32 && hvd__km_is_half(wire)) {
    float f = (float)(op == HVD_AVERAGE ? postscale / size : postscale);
    op_t o = {K_FROM_WIRE, wire, f, 0};
    return go ? run_spans(who, spans, n, max_count, &o, 2, 4, stream)
              : HVD_SUCCESS;
  }
  return hvd__km_bad_pair(who, wire, dtype);
}

/* One tensor: the .cu's Batch with the span `one`. */
static hvd_result_t run_one(const char *who, void *dst, const void *src,
                            int64_t n, hvd_dtype_t dtype, const op_t *o,
                            cudaStream_t stream) {
  size_t es = hvd_dtype_size(dtype);
  (void)standin_stream_device(stream, who);
  check_span(who, 0, src, dst, n, n, es, es);
  standin_access(stream, src, (size_t)n * es, 0, who, "src");
  standin_access(stream, dst, (size_t)n * es, 1, who, "dst");
  apply(o, src, dst, n);
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_scale(void *dst, const void *src, int64_t n,
                             hvd_dtype_t dtype, double factor,
                             cudaStream_t stream) {
  static const char who[] = "hvd__cuda_scale";
  hvd_result_t rc = hvd__km_check_one(who, n, dtype);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  op_t o = scale_op(dtype, factor);
  return run_one(who, dst, src, n, dtype, &o, stream);
}

hvd_result_t hvd__cuda_grad_scale(float *x, int64_t n, double factor,
                                  cudaStream_t stream) {
  static const char who[] = "hvd__cuda_grad_scale";
  hvd_result_t rc = hvd__km_check_one(who, n, HVD_FLOAT32);
  if (rc != HVD_SUCCESS || n == 0 || factor == 1.0)
    return rc;
  op_t o = scale_op(HVD_FLOAT32, factor);
  return run_one(who, x, x, n, HVD_FLOAT32, &o, stream);
}

hvd_result_t hvd__cuda_reduce_finish(void *dst, const void *src, int64_t n,
                                     hvd_dtype_t dtype, hvd_op_t op,
                                     double postscale, int size,
                                     cudaStream_t stream) {
  static const char who[] = "hvd__cuda_reduce_finish";
  hvd_result_t rc = hvd__km_check_one(who, n, dtype);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  op_t o = finish_op(dtype, op, postscale, size);
  return run_one(who, dst, src, n, dtype, &o, stream);
}

/* ---- optimizers, as the .cu's sgd_kernel and adam_kernel ------------- */

/* The span array and each parameter's value, grad and the states used. */
static void check_params(const char *who, const hvd__cuda_param_span_t *spans,
                         int n, int64_t max_count, int nstate,
                         cudaStream_t stream) {
  check_launch(who, spans, (size_t)n * sizeof *spans, stream);
  iv_t *iv = iv_alloc(4 * (size_t)n);
  size_t m = 0;
  for (int t = 0; t < n; t++) {
    const hvd__cuda_param_span_t *sp = &spans[t];
    char what[64];
    if (sp->count < 0 || sp->count > max_count)
      standin_die("%s: span %d has %lld elements, outside [0, max_count "
                  "%lld]",
                  who, t, (long long)sp->count, (long long)max_count);
    size_t bytes = (size_t)sp->count * sizeof(float);
    snprintf(what, sizeof what, "span %d's value", t);
    kernel_buffer(who, stream, sp->value, bytes, 1, what);
    snprintf(what, sizeof what, "span %d's grad", t);
    kernel_buffer(who, stream, sp->grad, bytes, 0, what);
    uintptr_t v = (uintptr_t)sp->value, g = (uintptr_t)sp->grad;
    iv[m++] = (iv_t){v, v + bytes, t, 1};
    iv[m++] = (iv_t){g, g + bytes, t, 0};
    for (int k = 0; k < nstate; k++) {
      snprintf(what, sizeof what, "span %d's state[%d]", t, k);
      kernel_buffer(who, stream, sp->state[k], bytes, 1, what);
      uintptr_t st = (uintptr_t)sp->state[k];
      iv[m++] = (iv_t){st, st + bytes, t, 1};
    }
  }
  check_disjoint(who, iv, m); /* value, grad and states of one span too */
  free(iv);
}

hvd_result_t hvd__cuda_sgd_step(const hvd__cuda_param_span_t *spans, int n,
                                int64_t max_count, const hvd_sgd_options_t *o,
                                int64_t step, double lr, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_sgd_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, INT64_MIN, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_sgd_t a = hvd__km_sgd_args(o, step, lr);
  check_params(who, spans, n, max_count, a.momentum, stream);
  for (int t = 0; t < n; t++) {
    hvd__cuda_param_span_t sp = spans[t];
    float *buf = a.momentum ? sp.state[0] : NULL;
    for (int64_t j = 0; j < sp.count; j++)
      hvd__km_sgd_elem(a, sp.value, sp.grad, buf, j);
  }
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_adam_step(const hvd__cuda_param_span_t *spans, int n,
                                 int64_t max_count, const hvd_adam_options_t *o,
                                 int64_t step, double lr, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_adam_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_adam_t a = hvd__km_adam_args(o, step, lr);
  check_params(who, spans, n, max_count, 2, stream);
  for (int t = 0; t < n; t++) {
    hvd__cuda_param_span_t sp = spans[t];
    for (int64_t j = 0; j < sp.count; j++)
      hvd__km_adam_elem(a, sp.value, sp.grad, sp.state[0], sp.state[1], j);
  }
  return HVD_SUCCESS;
}

/* ---- mixed precision, as the .cu's to/from_master kernels ------------- */

hvd_result_t hvd__cuda_to_master(const void *src, hvd_dtype_t dtype, float *dst,
                                 int64_t n, double factor, int *nonfinite,
                                 cudaStream_t stream) {
  static const char who[] = "hvd__cuda_to_master";
  if (n < 0 ||
      (dtype != HVD_FLOAT32 && dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  size_t es = hvd_dtype_size(dtype);
  (void)standin_stream_device(stream, who);
  standin_need_device(src, (size_t)n * es, who, "src");
  standin_need_device(dst, (size_t)n * sizeof *dst, who, "dst");
  standin_need_device(nonfinite, sizeof *nonfinite, who, "nonfinite");
  standin_access(stream, src, (size_t)n * es, 0, who, "src");
  standin_access(stream, dst, (size_t)n * sizeof *dst, 1, who, "dst");
  standin_access(stream, nonfinite, sizeof *nonfinite, 1, who, "nonfinite");
  float f = (float)factor;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = hvd__km_to_master_elem(src, dtype, i, f);
    dst[i] = v;
    bad |= !isfinite(v);
  }
  if (bad)
    *nonfinite = 1;
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_from_master(const float *src, void *dst,
                                   hvd_dtype_t dtype, int64_t n,
                                   cudaStream_t stream) {
  static const char who[] = "hvd__cuda_from_master";
  if (n < 0 || (dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  (void)standin_stream_device(stream, who);
  standin_need_device(src, (size_t)n * sizeof *src, who, "src");
  standin_need_device(dst, (size_t)n * 2, who, "dst");
  standin_access(stream, src, (size_t)n * sizeof *src, 0, who, "src");
  standin_access(stream, dst, (size_t)n * 2, 1, who, "dst");
  uint16_t *d = dst;
  for (int64_t i = 0; i < n; i++)
    d[i] = hvd__km_from_master_elem(src[i], dtype);
  return HVD_SUCCESS;
}

/* A batched conversion's launch, as the .cu needs it: the stream, the
 * span array in device memory, and each span's count and dtype
 * (hvd__km_check_convert: the .cu cannot read the spans to refuse a bad
 * one, so it is fatal here), src and dst as check_span (float32 on the
 * master's side), in place only between float32s, no span writing what
 * another touches; then the stream accesses of them all. */
static void check_convert(const char *who,
                          const hvd__cuda_convert_span_t *spans, int n,
                          int64_t max_count, int to_master,
                          cudaStream_t stream) {
  size_t bytes = (size_t)n * sizeof *spans, m = 0;
  check_launch(who, spans, bytes, stream);
  iv_t *iv = iv_alloc(2 * (size_t)n);
  for (int t = 0; t < n; t++) {
    const hvd__cuda_convert_span_t *sp = &spans[t];
    if (hvd__km_check_convert(who, t, sp->count, sp->dtype, to_master) !=
        HVD_SUCCESS)
      standin_die("%s", hvd_last_error());
    size_t es = hvd_dtype_size(sp->dtype);
    size_t ss = to_master ? es : sizeof(float);
    size_t ds = to_master ? sizeof(float) : es;
    check_span(who, t, sp->src, sp->dst, sp->count, max_count, ss, ds);
    uintptr_t s = (uintptr_t)sp->src, d = (uintptr_t)sp->dst;
    if (sp->count > 0 && s == d && ss != ds)
      standin_die("%s: span %d converts in place between %zu- and %zu-byte "
                  "elements",
                  who, t, ss, ds);
    iv[m++] = (iv_t){d, d + (size_t)sp->count * ds, t, 1};
    if (s != d)
      iv[m++] = (iv_t){s, s + (size_t)sp->count * ss, t, 0};
  }
  check_disjoint(who, iv, m);
  free(iv);
  standin_access(stream, spans, bytes, 0, who, "the span array");
  for (int t = 0; t < n; t++) {
    size_t es = hvd_dtype_size(spans[t].dtype), cnt = (size_t)spans[t].count;
    standin_access(stream, spans[t].src, cnt * (to_master ? es : 4), 0, who,
                   "a span's src");
    standin_access(stream, spans[t].dst, cnt * (to_master ? 4 : es), 1, who,
                   "a span's dst");
  }
}

hvd_result_t hvd__cuda_to_master_batch(const hvd__cuda_convert_span_t *spans,
                                       int n, int64_t max_count, double factor,
                                       int *nonfinite, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_to_master_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  check_convert(who, spans, n, max_count, 1, stream);
  standin_need_device(nonfinite, sizeof *nonfinite, who, "nonfinite");
  standin_access(stream, nonfinite, sizeof *nonfinite, 1, who, "nonfinite");
  float f = (float)factor;
  int bad = 0;
  for (int t = 0; t < n; t++) {
    hvd__cuda_convert_span_t sp = spans[t];
    float *dst = sp.dst;
    for (int64_t i = 0; i < sp.count; i++) {
      float v = hvd__km_to_master_elem(sp.src, sp.dtype, i, f);
      dst[i] = v;
      bad |= !isfinite(v);
    }
  }
  if (bad)
    *nonfinite = 1;
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_from_master_batch(const hvd__cuda_convert_span_t *spans,
                                         int n, int64_t max_count,
                                         cudaStream_t stream) {
  static const char who[] = "hvd__cuda_from_master_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, max_count, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  check_convert(who, spans, n, max_count, 0, stream);
  for (int t = 0; t < n; t++) {
    hvd__cuda_convert_span_t sp = spans[t];
    const float *src = sp.src;
    uint16_t *dst = sp.dst;
    for (int64_t i = 0; i < sp.count; i++)
      dst[i] = hvd__km_from_master_elem(src[i], sp.dtype);
  }
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_refresh_master(const void *value, hvd_dtype_t dtype,
                                      float *master, int64_t n,
                                      cudaStream_t stream) {
  static const char who[] = "hvd__cuda_refresh_master";
  if (n < 0 || (dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n %lld or dtype %d", who,
                          (long long)n, (int)dtype);
  if (n == 0)
    return HVD_SUCCESS;
  (void)standin_stream_device(stream, who);
  standin_need_device(value, (size_t)n * 2, who, "value");
  standin_need_device(master, (size_t)n * sizeof *master, who, "master");
  standin_access(stream, value, (size_t)n * 2, 0, who, "value");
  standin_access(stream, master, (size_t)n * sizeof *master, 1, who, "master");
  const uint16_t *v = value;
  for (int64_t i = 0; i < n; i++) {
    uint16_t r = dtype == HVD_FLOAT16 ? hvd__f32_to_f16(master[i])
                                      : hvd__f32_to_bf16(master[i]);
    if (r != v[i])
      master[i] =
          dtype == HVD_FLOAT16 ? hvd__f16_to_f32(v[i]) : hvd__bf16_to_f32(v[i]);
  }
  return HVD_SUCCESS;
}

/* ---- synchronized batch norm, as the .cu's bn_*_kernel ----------------- */

/* The .cu's checks, then the stream's device, loudly. */
static hvd_result_t bn_check(const char *who, hvd_dtype_t dtype, int64_t n,
                             int64_t c, int64_t s, cudaStream_t stream) {
  hvd_result_t rc = hvd__km_bn_check(who, dtype, n, c, s);
  if (rc == HVD_SUCCESS)
    (void)standin_stream_device(stream, who);
  return rc;
}

/* ---- gradient clipping -------------------------------------------------- */

hvd_result_t hvd__cuda_norm_batch(const hvd__cuda_norm_span_t *spans, int n,
                                  int64_t chunks, double *parts, double *out,
                                  cudaStream_t stream) {
  static const char who[] = "hvd__cuda_norm_batch";
  int go;
  hvd_result_t rc = hvd__km_check_batch(who, spans, n, chunks, &go);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  check_launch(who, spans, (size_t)n * sizeof *spans, stream);
  int64_t next = 0; /* the spans' chunks follow one another */
  for (int t = 0; t < n; t++) {
    const hvd__cuda_norm_span_t *sp = &spans[t];
    if (sp->count < 0 || sp->first != next)
      standin_die("%s: span %d has count %lld and first %lld (expected %lld)",
                  who, t, (long long)sp->count, (long long)sp->first,
                  (long long)next);
    next += hvd__km_norm_chunks(sp->count);
    standin_need_device(sp->x, (size_t)sp->count * sizeof(float), who,
                        "a span's x");
    standin_access(stream, sp->x, (size_t)sp->count * sizeof(float), 0, who,
                   "a span's x");
  }
  if (next != chunks)
    standin_die("%s: the spans have %lld chunks, not %lld", who,
                (long long)next, (long long)chunks);
  standin_need_device(parts, 2 * (size_t)chunks * sizeof *parts, who, "parts");
  standin_need_device(out, 2 * (size_t)n * sizeof *out, who, "out");
  standin_access(stream, parts, 2 * (size_t)chunks * sizeof *parts, 1, who,
                 "parts");
  standin_access(stream, out, 2 * (size_t)n * sizeof *out, 1, who, "out");
  for (int t = 0; t < n; t++) {
    const hvd__cuda_norm_span_t *sp = &spans[t];
    for (int64_t c = 0; c < hvd__km_norm_chunks(sp->count); c++) {
      const int64_t at = c * HVD__KM_NORM_CHUNK, left = sp->count - at;
      hvd__km_norm_chunk(sp->x + at,
                         left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK,
                         parts + 2 * (sp->first + c));
    }
    hvd__km_norm_fold(parts + 2 * sp->first, hvd__km_norm_chunks(sp->count),
                      out + 2 * t);
  }
  return HVD_SUCCESS;
}

/* ---- LAMB, as the .cu's lamb_*_kernel ----------------------------------- */

/* The spans of a LAMB launch: counts within max_count (< 0: unchecked),
 * chunks that follow one another from 0 (*chunks: the total), each
 * array on the device and accessed on stream (value, m, s written when
 * write), the arrays of all spans disjoint. */
static void check_lamb(const char *who, const hvd__cuda_lamb_span_t *spans,
                       int n, int64_t max_count, int write, int64_t *chunks,
                       cudaStream_t stream) {
  check_launch(who, spans, (size_t)n * sizeof *spans, stream);
  iv_t *iv = iv_alloc(4 * (size_t)n);
  size_t k = 0;
  int64_t next = 0;
  for (int t = 0; t < n; t++) {
    const hvd__cuda_lamb_span_t *sp = &spans[t];
    if (sp->count < 0 || (max_count >= 0 && sp->count > max_count) ||
        sp->first != next)
      standin_die("%s: span %d has count %lld and first %lld (expected "
                  "first %lld, count <= %lld)",
                  who, t, (long long)sp->count, (long long)sp->first,
                  (long long)next, (long long)max_count);
    next += hvd__km_norm_chunks(sp->count);
    const size_t bytes = (size_t)sp->count * sizeof(float);
    const void *arr[4] = {sp->value, sp->grad, sp->m, sp->s};
    static const char *const names[4] = {"value", "grad", "m", "s"};
    for (int a = 0; a < 4; a++) {
      char what[64];
      snprintf(what, sizeof what, "span %d's %s", t, names[a]);
      kernel_buffer(who, stream, arr[a], bytes, write && a != 1, what);
      iv[k++] = (iv_t){(uintptr_t)arr[a], (uintptr_t)arr[a] + bytes, t,
                       write && a != 1};
    }
  }
  check_disjoint(who, iv, k);
  free(iv);
  *chunks = next;
}

hvd_result_t hvd__cuda_lamb_norms(const hvd__cuda_lamb_span_t *spans, int n,
                                  int64_t chunks, const hvd_lamb_options_t *o,
                                  int64_t step, double *parts, double *out,
                                  cudaStream_t stream) {
  static const char who[] = "hvd__cuda_lamb_norms";
  int go;
  hvd_result_t rc = hvd__km_check_step(who, spans, n, chunks, o, step, 1, &go);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  int64_t have;
  check_lamb(who, spans, n, -1, 0, &have, stream);
  if (have != chunks)
    standin_die("%s: the spans have %lld chunks, not %lld", who,
                (long long)have, (long long)chunks);
  standin_need_device(parts, 2 * (size_t)chunks * sizeof *parts, who, "parts");
  standin_need_device(out, 2 * (size_t)n * sizeof *out, who, "out");
  standin_access(stream, parts, 2 * (size_t)chunks * sizeof *parts, 1, who,
                 "parts");
  standin_access(stream, out, 2 * (size_t)n * sizeof *out, 1, who, "out");
  const hvd__km_lamb_t a = hvd__km_lamb_args(o, step);
  for (int t = 0; t < n; t++) {
    const hvd__cuda_lamb_span_t *sp = &spans[t];
    for (int64_t c = 0; c < hvd__km_norm_chunks(sp->count); c++) {
      const int64_t at = c * HVD__KM_NORM_CHUNK, left = sp->count - at;
      hvd__km_lamb_chunk(a, sp->wd, sp->value + at, sp->grad + at, sp->m + at,
                         sp->s + at,
                         left < HVD__KM_NORM_CHUNK ? left : HVD__KM_NORM_CHUNK,
                         parts + 2 * (sp->first + c));
    }
    hvd__km_sum2_fold(parts + 2 * sp->first, hvd__km_norm_chunks(sp->count),
                      out + 2 * t);
  }
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_lamb_apply(const hvd__cuda_lamb_span_t *spans, int n,
                                  int64_t max_count,
                                  const hvd_lamb_options_t *o, int64_t step,
                                  cudaStream_t stream) {
  static const char who[] = "hvd__cuda_lamb_apply";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  int64_t chunks;
  check_lamb(who, spans, n, max_count, 1, &chunks, stream);
  const hvd__km_lamb_t a = hvd__km_lamb_args(o, step);
  for (int t = 0; t < n; t++) {
    const hvd__cuda_lamb_span_t sp = spans[t];
    for (int64_t j = 0; j < sp.count; j++)
      hvd__km_lamb_apply_elem(a, sp.wd, sp.ratio, sp.value, sp.grad, sp.m, sp.s,
                              j);
  }
  return HVD_SUCCESS;
}

/* The two per-channel sums (dy NULL: of x and x^2; else of dy and
 * dy (x - mean)), in element order per channel. */
static void bn_sums(const char *who, cudaStream_t stream, const void *x,
                    const void *dy, hvd_dtype_t t, int64_t n, int64_t c,
                    int64_t s, const float *coef, double *out) {
  size_t es = hvd_dtype_size(t), all = (size_t)(n * c * s) * es;
  kernel_buffer(who, stream, x, all, 0, "x");
  if (dy != NULL) {
    kernel_buffer(who, stream, dy, all, 0, "dy");
    kernel_buffer(who, stream, coef, (size_t)c * sizeof(float), 0, "coef");
  }
  kernel_buffer(who, stream, out, 2 * (size_t)c * sizeof(double), 1, "out");
  for (int64_t ch = 0; ch < c; ch++) {
    double a = 0, b = 0;
    float mean = dy != NULL ? coef[ch] : 0.0f;
    for (int64_t j = 0; j < n * s; j++) {
      int64_t i = ((j / s) * c + ch) * s + j % s;
      float v = hvd__km_bn_load(x, t, i);
      if (dy == NULL) {
        a += v;
        b += (double)v * v;
      } else {
        float g = hvd__km_bn_load(dy, t, i);
        a += g;
        b += (double)g * (v - mean);
      }
    }
    out[ch] = a;
    out[c + ch] = b;
  }
}

hvd_result_t hvd__cuda_bn_stats(const void *x, hvd_dtype_t dtype, int64_t n,
                                int64_t c, int64_t s, double *out,
                                cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_stats";
  hvd_result_t rc = bn_check(who, dtype, n, c, s, stream);
  if (rc == HVD_SUCCESS)
    bn_sums(who, stream, x, NULL, dtype, n, c, s, NULL, out);
  return rc;
}

hvd_result_t hvd__cuda_bn_grad_stats(const void *x, const void *dy,
                                     hvd_dtype_t dtype, int64_t n, int64_t c,
                                     int64_t s, const float *coef, double *out,
                                     cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_grad_stats";
  hvd_result_t rc = bn_check(who, dtype, n, c, s, stream);
  if (rc == HVD_SUCCESS)
    bn_sums(who, stream, x, dy, dtype, n, c, s, coef, out);
  return rc;
}

hvd_result_t hvd__cuda_bn_apply(const void *x, void *y, hvd_dtype_t dtype,
                                int64_t n, int64_t c, int64_t s,
                                const float *coef, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_apply";
  hvd_result_t rc = bn_check(who, dtype, n, c, s, stream);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  size_t all = (size_t)(n * c * s) * hvd_dtype_size(dtype);
  kernel_buffer(who, stream, x, all, 0, "x");
  kernel_buffer(who, stream, coef, 3 * (size_t)c * sizeof(float), 0, "coef");
  kernel_buffer(who, stream, y, all, 1, "y");
  for (int64_t i = 0; i < n * c * s; i++) {
    int64_t ch = (i / s) % c;
    hvd__km_bn_store(
        y, dtype, i,
        hvd__km_bn_apply_elem(hvd__km_bn_load(x, dtype, i), coef, c, ch));
  }
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_bn_dx(const void *x, const void *dy, void *dx,
                             hvd_dtype_t dtype, int64_t n, int64_t c, int64_t s,
                             const float *coef, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_bn_dx";
  hvd_result_t rc = bn_check(who, dtype, n, c, s, stream);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  size_t all = (size_t)(n * c * s) * hvd_dtype_size(dtype);
  kernel_buffer(who, stream, x, all, 0, "x");
  kernel_buffer(who, stream, dy, all, 0, "dy");
  kernel_buffer(who, stream, coef, 4 * (size_t)c * sizeof(float), 0, "coef");
  kernel_buffer(who, stream, dx, all, 1, "dx");
  for (int64_t i = 0; i < n * c * s; i++) {
    int64_t ch = (i / s) % c;
    float v = hvd__km_bn_load(x, dtype, i), g = hvd__km_bn_load(dy, dtype, i);
    hvd__km_bn_store(dx, dtype, i, hvd__km_bn_dx_elem(v, g, coef, c, ch));
  }
  return HVD_SUCCESS;
}

/* ---- PowerSGD, as the .cu's psgd_*_kernel -------------------------------- */

/* The stream and one float32 buffer the kernel reads or writes. */
static void psgd_buffer(const char *who, cudaStream_t stream, const float *p,
                        int64_t count, int write, const char *what) {
  kernel_buffer(who, stream, p, (size_t)count * sizeof(float), write, what);
}

hvd_result_t hvd__cuda_psgd_prepare(float *M, const float *e, int64_t len,
                                    double pre, cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_prepare";
  hvd_result_t rc = hvd__km_check_one(who, len, HVD_FLOAT32);
  if (rc != HVD_SUCCESS || len == 0 || ((float)pre == 1.0f && e == NULL))
    return rc;
  (void)standin_stream_device(stream, who);
  if (e != NULL)
    psgd_buffer(who, stream, e, len, 0, "e");
  psgd_buffer(who, stream, M, len, 1, "M");
  for (int64_t k = 0; k < len; k++)
    hvd__km_psgd_prepare(M, e, (float)pre, k);
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_psgd_mq(const float *M, const float *Qt, float *P,
                               int64_t n, int64_t m, int r,
                               cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_mq";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  if (rc != HVD_SUCCESS || n == 0)
    return rc;
  (void)standin_stream_device(stream, who);
  psgd_buffer(who, stream, M, n * m, 0, "M");
  psgd_buffer(who, stream, Qt, (int64_t)r * m, 0, "Qt");
  psgd_buffer(who, stream, P, n * r, 1, "P");
  for (int64_t a = 0; a < n; a++)
    for (int j = 0; j < r; j++)
      P[a * r + j] = hvd__km_psgd_dot(M + a * m, Qt + (int64_t)j * m, m);
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_psgd_mtp(const float *M, const float *P, float *Qt,
                                float *parts, int64_t n, int64_t m, int r,
                                cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_mtp";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  const int64_t chunks = hvd__km_psgd_chunks(n), rm = (int64_t)r * m;
  if (rc != HVD_SUCCESS || m == 0)
    return rc;
  if (chunks > 1 && parts == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: parts is NULL for %lld chunks", who,
                          (long long)chunks);
  (void)standin_stream_device(stream, who);
  psgd_buffer(who, stream, M, n * m, 0, "M");
  psgd_buffer(who, stream, P, n * r, 0, "P");
  if (chunks > 1) /* written by the part kernel, read by the fold */
    psgd_buffer(who, stream, parts, chunks * rm, 1, "parts");
  psgd_buffer(who, stream, Qt, rm, 1, "Qt");
  for (int64_t k = 0; k < rm; k++)
    Qt[k] = hvd__km_psgd_mtp(M, P, n, m, r, (int)(k / m), k % m);
  return HVD_SUCCESS;
}

hvd_result_t hvd__cuda_psgd_finish(float *M, float *e, const float *P,
                                   const float *Qt, int64_t n, int64_t m, int r,
                                   double post, float inv, int keep,
                                   cudaStream_t stream) {
  static const char who[] = "hvd__cuda_psgd_finish";
  hvd_result_t rc = hvd__km_psgd_check(who, n, m, r);
  if (rc != HVD_SUCCESS || n * m == 0)
    return rc;
  (void)standin_stream_device(stream, who);
  psgd_buffer(who, stream, P, n * r, 0, "P");
  psgd_buffer(who, stream, Qt, (int64_t)r * m, 0, "Qt");
  if (e != NULL)
    psgd_buffer(who, stream, e, n * m, 1, "e");
  psgd_buffer(who, stream, M, n * m, 1, "M");
  for (int64_t k = 0; k < n * m; k++)
    hvd__km_psgd_finish(M, e, P, Qt, m, r, (float)post, inv, keep, k);
  return HVD_SUCCESS;
}
