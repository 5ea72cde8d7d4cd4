/*
 * sync_bn.c - synchronized batch normalization (Horovod's SyncBatchNorm,
 * torch.nn.SyncBatchNorm): the batch statistics of every rank's batch
 * together, so that small per-rank batches normalize as one big batch.
 *
 * Forward: each rank sums, per channel, its count, sum and sum of squares
 * (in double); one allreduce of [3][C] doubles gives the global ones, from
 * which mean and variance follow:
 *
 *   mean = S / n,  var = SS / n - mean^2 (biased: it normalizes),
 *   running_mean = (1 - m) running_mean + m mean,
 *   running_var  = (1 - m) running_var  + m var n / (n - 1) (unbiased).
 *
 * Backward: per channel the local sum of dy and of dy (x - mean); one
 * allreduce gives the global ones, and
 *
 *   dx = w invstd (dy - sum_dy / n - (x - mean) invstd^2 sum_dy_xmu / n),
 *
 * while dweight += sum_dy_xmu invstd and dbias += sum_dy take the rank's
 * own sums, like every other parameter's gradient (the distributed
 * optimizer reduces them). Ranks may hold different batch sizes, zero
 * included: they still take part in both allreduces.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "base/tensor.h"
#include "core/api.h"

#define BN_PREFIX "hvd.sync_bn."

/* Element i of a float32/float16/bfloat16 tensor's data. */
static double get(const void *p, hvd_dtype_t t, int64_t i) {
  switch (t) {
  case HVD_FLOAT16:
    return hvd__f16_to_f32(((const uint16_t *)p)[i]);
  case HVD_BFLOAT16:
    return hvd__bf16_to_f32(((const uint16_t *)p)[i]);
  default:
    return ((const float *)p)[i];
  }
}

static void put(void *p, hvd_dtype_t t, int64_t i, double v) {
  switch (t) {
  case HVD_FLOAT16:
    ((uint16_t *)p)[i] = hvd__f32_to_f16((float)v);
    break;
  case HVD_BFLOAT16:
    ((uint16_t *)p)[i] = hvd__f32_to_bf16((float)v);
    break;
  default:
    ((float *)p)[i] = (float)v;
  }
}

/* The shape of x: N samples, C channels, S positions per channel. */
typedef struct bn_shape {
  int64_t n, c, s;
} bn_shape_t;

/* x's checks: a host float tensor [N, C, ...]; `other` (y, dy, dx: may be
 * NULL) of its shape and dtype. */
static hvd_result_t check_x(const char *fn, const char *name,
                            const hvd_tensor_t *x, const char *oname,
                            const hvd_tensor_t *other, bn_shape_t *sh) {
  hvd_result_t rc;
  HVD__CHECK(hvd__check_tensor(fn, name, "x", x));
  if (x->device != HVD_CPU)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s '%s': x is on cuda:%d; sync batch norm takes "
                          "host tensors",
                          fn, name, x->device);
  if (x->dtype != HVD_FLOAT32 && x->dtype != HVD_FLOAT16 &&
      x->dtype != HVD_BFLOAT16)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': x is %s; float32, float16 or bfloat16", fn,
                          name, hvd_dtype_name(x->dtype));
  if (x->ndim < 2)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': x has %d dimensions; [N, C] or [N, C, "
                          "...] (NCHW)",
                          fn, name, x->ndim);
  if (x->shape[1] < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': x has no channels", fn,
                          name);
  if (other != NULL) {
    HVD__CHECK(hvd__check_tensor(fn, name, oname, other));
    int same = other->dtype == x->dtype && other->ndim == x->ndim &&
               other->device == x->device;
    for (int i = 0; same && i < x->ndim; i++)
      same = other->shape[i] == x->shape[i];
    if (!same) {
      char a[HVD__SHAPE_STR_MAX], b[HVD__SHAPE_STR_MAX];
      hvd__shape_str(x->ndim, x->shape, a, sizeof a);
      hvd__shape_str(other->ndim, other->shape, b, sizeof b);
      return hvd__set_error(
          HVD_ERR_INVALID_ARG, "%s '%s': %s is %s %s but x is %s %s", fn, name,
          oname, hvd_dtype_name(other->dtype), b, hvd_dtype_name(x->dtype), a);
    }
  }
  sh->n = x->shape[0];
  sh->c = x->shape[1];
  sh->s = 1;
  for (int i = 2; i < x->ndim; i++)
    sh->s *= x->shape[i];
  return HVD_SUCCESS;
fail:
  return rc;
}

static hvd_result_t check_name(const char *fn, const char *name) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  if (name == NULL || name[0] == '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: the name is %s", fn,
                          name == NULL ? "NULL" : "empty");
  return HVD_SUCCESS;
}

/* Sums stats [3][C] over the ranks as "hvd.sync_bn.<name><suffix>"; a
 * mismatch (ranks with different channel counts) says so first. */
static hvd_result_t sum_stats(const char *fn, const char *name,
                              const char *suffix, double *stats, int64_t c) {
  size_t len = sizeof BN_PREFIX + strlen(name) + strlen(suffix);
  char *full = malloc(len);
  if (full == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn,
                          name);
  snprintf(full, len, "%s%s%s", BN_PREFIX, name, suffix);
  int64_t shape[2] = {3, c};
  hvd_tensor_t t = hvd_tensor_make(stats, HVD_FLOAT64, 2, shape);
  hvd_result_t rc = hvd_allreduce(full, &t, &t, HVD_SUM, 1.0, 1.0);
  free(full);
  if (rc == HVD_ERR_MISMATCH) {
    char msg[HVD__ERRMSG_MAX];
    snprintf(msg, sizeof msg,
             "%s '%s': ranks disagree (the shape is [3, channels]): %s", fn,
             name, hvd_last_error());
    return hvd__set_error_msg(rc, msg);
  }
  return rc;
}

hvd_result_t hvd_sync_batch_norm_forward(
    const char *name, const hvd_tensor_t *x, const float *weight,
    const float *bias, float *running_mean, float *running_var, double momentum,
    double eps, hvd_tensor_t *y, float *save_mean, float *save_invstd) {
  static const char fn[] = "hvd_sync_batch_norm_forward";
  hvd_result_t rc;
  bn_shape_t sh;
  HVD__CHECK(check_name(fn, name));
  if (y == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': y is NULL", fn, name);
  HVD__CHECK(check_x(fn, name, x, "y", y, &sh));
  if (!(momentum >= 0 && momentum <= 1))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': momentum %g is outside [0, 1]", fn, name,
                          momentum);
  if (!(eps > 0) || !isfinite(eps))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': eps %g is not a positive number", fn, name,
                          eps);
  if ((running_mean == NULL) != (running_var == NULL))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': running_mean and running_var go together "
                          "(one is NULL)",
                          fn, name);

  const int64_t N = sh.n, C = sh.c, S = sh.s;
  double *st = calloc(3 * (size_t)C, sizeof *st);
  if (st == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn,
                          name);
  for (int64_t c = 0; c < C; c++) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        double v = get(x->data, x->dtype, (n * C + c) * S + s);
        sum += v;
        sq += v * v;
      }
    st[c] = (double)(N * S);
    st[C + c] = sum;
    st[2 * C + c] = sq;
  }
  rc = sum_stats(fn, name, ".stats", st, C);
  if (rc == HVD_SUCCESS && st[0] <= 1) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s '%s': %.0f value%s per channel over all ranks; "
                        "batch norm needs more than 1",
                        fn, name, st[0], st[0] == 1 ? "" : "s");
  }
  if (rc != HVD_SUCCESS) {
    free(st);
    return rc;
  }
  const double cnt = st[0];
  for (int64_t c = 0; c < C; c++) {
    double mean = st[C + c] / cnt;
    double var = fmax(st[2 * C + c] / cnt - mean * mean, 0.0);
    double invstd = 1.0 / sqrt(var + eps);
    double w = weight != NULL ? weight[c] : 1.0;
    double b = bias != NULL ? bias[c] : 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        put(y->data, y->dtype, i,
            (get(x->data, x->dtype, i) - mean) * invstd * w + b);
      }
    if (running_mean != NULL) {
      running_mean[c] =
          (float)((1 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = (float)((1 - momentum) * running_var[c] +
                               momentum * var * cnt / (cnt - 1));
    }
    if (save_mean != NULL)
      save_mean[c] = (float)mean;
    if (save_invstd != NULL)
      save_invstd[c] = (float)invstd;
  }
  free(st);
  return HVD_SUCCESS;
fail:
  return rc;
}

hvd_result_t
hvd_sync_batch_norm_backward(const char *name, const hvd_tensor_t *x,
                             const hvd_tensor_t *dy, const float *weight,
                             const float *save_mean, const float *save_invstd,
                             hvd_tensor_t *dx, float *dweight, float *dbias) {
  static const char fn[] = "hvd_sync_batch_norm_backward";
  hvd_result_t rc;
  bn_shape_t sh;
  HVD__CHECK(check_name(fn, name));
  if (dy == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': dy is NULL", fn, name);
  HVD__CHECK(check_x(fn, name, x, "dy", dy, &sh));
  if (dx != NULL)
    HVD__CHECK(check_x(fn, name, x, "dx", dx, &sh));
  if (save_mean == NULL || save_invstd == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': save_mean and save_invstd (from the "
                          "forward) are needed",
                          fn, name);

  const int64_t N = sh.n, C = sh.c, S = sh.s;
  double *st = calloc(5 * (size_t)C, sizeof *st); /* [3][C] + own [2][C] */
  if (st == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn,
                          name);
  double *own = st + 3 * C;
  for (int64_t c = 0; c < C; c++) {
    double sdy = 0, sdyx = 0, mean = save_mean[c];
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        double g = get(dy->data, dy->dtype, i);
        sdy += g;
        sdyx += g * (get(x->data, x->dtype, i) - mean);
      }
    st[c] = (double)(N * S);
    st[C + c] = own[c] = sdy;
    st[2 * C + c] = own[C + c] = sdyx;
  }
  rc = sum_stats(fn, name, ".grad", st, C);
  if (rc != HVD_SUCCESS) {
    free(st);
    return rc;
  }
  for (int64_t c = 0; c < C; c++) { /* this rank's share */
    if (dweight != NULL)
      dweight[c] += (float)(own[C + c] * save_invstd[c]);
    if (dbias != NULL)
      dbias[c] += (float)own[c];
  }
  const double cnt = st[0];
  for (int64_t c = 0; c < C && dx != NULL; c++) {
    double invstd = save_invstd[c], mean = save_mean[c];
    double w = weight != NULL ? weight[c] : 1.0;
    double mdy = st[C + c] / cnt, mdyx = st[2 * C + c] / cnt;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        double xm = get(x->data, x->dtype, i) - mean;
        put(dx->data, dx->dtype, i,
            w * invstd *
                (get(dy->data, dy->dtype, i) - mdy -
                 xm * invstd * invstd * mdyx));
      }
  }
  free(st);
  return HVD_SUCCESS;
fail:
  return rc;
}
