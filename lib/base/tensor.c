/* tensor.c - dtype table, tensor helpers and argument checks. */
#include "base/tensor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "base/errors.h"

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtypes[HVD_DTYPE_COUNT] = {
    [HVD_UINT8] = {"uint8", 1, 0},     [HVD_INT8] = {"int8", 1, 0},
    [HVD_INT32] = {"int32", 4, 0},     [HVD_INT64] = {"int64", 8, 0},
    [HVD_FLOAT16] = {"float16", 2, 1}, [HVD_BFLOAT16] = {"bfloat16", 2, 1},
    [HVD_FLOAT32] = {"float32", 4, 1}, [HVD_FLOAT64] = {"float64", 8, 1},
};

static const char *const op_names[HVD_OP_COUNT] = {
    [HVD_SUM] = "sum", [HVD_AVERAGE] = "average", [HVD_MIN] = "min",
    [HVD_MAX] = "max", [HVD_PRODUCT] = "product", [HVD_ADASUM] = "adasum"};

int hvd__dtype_valid(int dtype) {
  return dtype >= 0 && dtype < HVD_DTYPE_COUNT;
}

int hvd__dtype_is_float(hvd_dtype_t dtype) {
  return hvd__dtype_valid(dtype) && dtypes[dtype].is_float;
}

size_t hvd_dtype_size(hvd_dtype_t dtype) {
  return hvd__dtype_valid(dtype) ? dtypes[dtype].size : 0;
}

const char *hvd_dtype_name(hvd_dtype_t dtype) {
  return hvd__dtype_valid(dtype) ? dtypes[dtype].name : "unknown";
}

const char *hvd_op_name(hvd_op_t op) {
  return ((int)op >= 0 && op < HVD_OP_COUNT) ? op_names[op] : "unknown";
}

hvd_tensor_t hvd_tensor_make(void *data, hvd_dtype_t dtype, int ndim,
                             const int64_t *shape) {
  hvd_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.device = HVD_CPU;
  t.ndim = ndim < 0 ? 0 : ndim > HVD_MAX_DIMS ? HVD_MAX_DIMS : ndim;
  for (int i = 0; i < t.ndim && shape != NULL; i++)
    t.shape[i] = shape[i];
  return t;
}

/* The elements of a shape, -1 when a dimension is negative or the product
 * exceeds INT64_MAX (it used to wrap: [2^32, 2^32] was 0 elements). A zero
 * dimension makes 0 whatever the others. */
static int64_t shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return -1;
    if (shape[i] == 0)
      return 0;
  }
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(n, shape[i], &n))
      return -1;
  return n;
}

int64_t hvd_tensor_numel(const hvd_tensor_t *t) {
  if (t == NULL)
    return 0;
  return shape_numel(t->ndim < HVD_MAX_DIMS ? t->ndim : HVD_MAX_DIMS, t->shape);
}

void hvd_tensor_free(hvd_tensor_t *t) {
  if (t == NULL)
    return;
  if (t->device != HVD_CPU)
    hvd__cuda_free(t->data); /* an output a device executor allocated */
  else
    free(t->data);
  t->data = NULL;
}

int hvd__device_kind_equal(int a, int b) {
  return (a == HVD_CPU) == (b == HVD_CPU);
}

int hvd__tensor_size(const hvd_tensor_t *t, size_t *bytes) {
  int64_t n = hvd_tensor_numel(t), b = 0;
  if (n < 0 ||
      __builtin_mul_overflow(n, (int64_t)hvd_dtype_size(t->dtype), &b) ||
      (uint64_t)b > (uint64_t)PTRDIFF_MAX)
    return 0;
  if (bytes != NULL)
    *bytes = (size_t)b;
  return 1;
}

int hvd__row_size(hvd_dtype_t dtype, int ndim, const int64_t *shape,
                  int64_t *bytes) {
  int64_t b = (int64_t)hvd_dtype_size(dtype);
  for (int i = 1; i < ndim && i < HVD_MAX_DIMS; i++)
    if (shape[i] < 0 || __builtin_mul_overflow(b, shape[i], &b) ||
        (uint64_t)b > (uint64_t)PTRDIFF_MAX)
      return 0;
  if (bytes != NULL)
    *bytes = b;
  return 1;
}

int hvd__rows_total(const int64_t *rows, int n, hvd_dtype_t dtype, int ndim,
                    const int64_t *shape, int64_t *total) {
  int64_t sum = 0;
  for (int k = 0; k < n; k++)
    if (rows[k] < 0 || __builtin_add_overflow(sum, rows[k], &sum))
      return 0;
  if (ndim < 1 || ndim > HVD_MAX_DIMS)
    return 0;
  hvd_tensor_t out = hvd_tensor_make(NULL, dtype, ndim, shape);
  out.shape[0] = sum;
  if (!hvd__tensor_size(&out, NULL) || !hvd__row_size(dtype, ndim, shape, NULL))
    return 0;
  *total = sum;
  return 1;
}

size_t hvd__tensor_bytes(const hvd_tensor_t *t) {
  size_t b = SIZE_MAX;
  return hvd__tensor_size(t, &b) ? b : SIZE_MAX;
}

void hvd__shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t at = 0;
  at += (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "",
                           (long long)shape[i]);
  if (at < n)
    snprintf(buf + at, n - at, "]");
}

void hvd__device_str(int device, char *buf, size_t n) {
  if (device == HVD_CPU)
    snprintf(buf, n, "cpu");
  else
    snprintf(buf, n, "cuda:%d", device);
}

/* Whether t's bytes lie within home's, on the same device. */
static int bytes_within(const hvd_tensor_t *t, const hvd_tensor_t *home) {
  if (home == NULL || home->device != t->device || home->data == NULL)
    return 0;
  uintptr_t a = (uintptr_t)t->data, h = (uintptr_t)home->data;
  size_t n = hvd__tensor_bytes(t), hn = hvd__tensor_bytes(home);
  return a >= h && a - h <= hn && n <= hn - (a - h);
}

hvd_result_t hvd__check_tensor(const char *kind, const char *name,
                               const char *which, const hvd_tensor_t *t) {
  return hvd__check_tensor_in(kind, name, which, t, NULL);
}

hvd_result_t hvd__check_tensor_in(const char *kind, const char *name,
                                  const char *which, const hvd_tensor_t *t,
                                  const hvd_tensor_t *home) {
  const char *sp = which[0] ? " " : "";
  if (t == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': %s%stensor is NULL",
                          kind, name, which, sp);
  if (t->ndim < 0 || t->ndim > HVD_MAX_DIMS)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': ndim %d is out of range 0..%d", kind, name,
                          t->ndim, HVD_MAX_DIMS);
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': shape[%d] is %lld",
                            kind, name, i, (long long)t->shape[i]);
  if (!hvd__dtype_valid((int)t->dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': unknown dtype %d",
                          kind, name, (int)t->dtype);
  if (t->device < HVD_CPU)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': device %d is neither HVD_CPU nor a CUDA "
                          "ordinal",
                          kind, name, t->device);
  if (t->device != HVD_CPU && !hvd_cuda_built())
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s '%s': device %d tensors are not supported by "
                          "this build",
                          kind, name, t->device);
  if (t->device != HVD_CPU) { /* only ever the rank's own GPU: no copies */
    int mine = hvd__cuda_rank_device();
    if (mine < 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s '%s': tensor is on cuda:%d but this rank has "
                            "no CUDA device",
                            kind, name, t->device);
    if (t->device != mine)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s '%s': tensor is on cuda:%d but this rank uses "
                            "cuda:%d",
                            kind, name, t->device, mine);
  }
  if (!hvd__tensor_size(t, NULL)) {
    char shape[HVD__SHAPE_STR_MAX];
    hvd__shape_str(t->ndim, t->shape, shape, sizeof shape);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': %s%sshape %s of %s is more than "
                          "PTRDIFF_MAX bytes",
                          kind, name, which, sp, shape,
                          hvd_dtype_name(t->dtype));
  }
  if (t->data == NULL && hvd_tensor_numel(t) > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': %s%sdata is NULL",
                          kind, name, which, sp);
  char why[160];
  if (!bytes_within(t, home) && hvd__tensor_misplaced(t, why, sizeof why))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': %s%stensor %s", kind,
                          name, which, sp, why);
  return HVD_SUCCESS;
}

int hvd__tensor_misplaced(const hvd_tensor_t *t, char *why, size_t n) {
  if (hvd_tensor_numel(t) == 0)
    return 0;
  int in = t->device == HVD_CPU ? hvd__cuda_device_memory(t->data) : -1;
  if (in >= 0) /* host code would read it: a segmentation fault */
    snprintf(why, n,
             "is on cpu but its data is device memory of cuda:%d (set its "
             "device)",
             in);
  else if (t->device != HVD_CPU &&
           hvd__cuda_unreachable_host(t->data, t->device))
    snprintf(why, n,
             "is on cuda:%d but its data is pageable host memory, which this "
             "GPU cannot reach (cudaMalloc it, or pin it)",
             t->device);
  else
    return 0;
  return 1;
}
