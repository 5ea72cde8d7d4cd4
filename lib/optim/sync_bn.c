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
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

#define BN_PREFIX "hvd.sync_bn."

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "base/device.h"
#include "optim/optim_kernels.h"
#endif

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

/* Sums stats [3][C] over the ranks as "hvd.sync_bn.<name><suffix>", its
 * first row set to this rank's count of values per channel; a mismatch
 * (ranks with different channel counts) says so first. */
static hvd_result_t sum_stats(const char *fn, const char *name,
                              const char *suffix, double *stats, int64_t c,
                              int64_t count) {
  for (int64_t k = 0; k < c; k++) /* the first row: this rank's count */
    stats[k] = (double)count;
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

/* The forward's sums over the ranks, and batch norm's need of more than
 * one value per channel in all. */
static hvd_result_t sum_batch(const char *fn, const char *name, double *st,
                              int64_t c, int64_t count) {
  hvd_result_t rc = sum_stats(fn, name, ".stats", st, c, count);
  if (rc == HVD_SUCCESS && st[0] <= 1)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s '%s': %.0f value%s per channel over all ranks; "
                        "batch norm needs more than 1",
                        fn, name, st[0], st[0] == 1 ? "" : "s");
  return rc;
}

/* Channel c of the summed statistics: the batch mean, the biased variance
 * (it normalizes) and 1 / sqrt(var + eps). */
typedef struct bn_chan {
  double mean, var, invstd;
} bn_chan_t;

static bn_chan_t channel(const double *st, int64_t C, int64_t c, double eps) {
  bn_chan_t k;
  k.mean = st[C + c] / st[0];
  k.var = fmax(st[2 * C + c] / st[0] - k.mean * k.mean, 0.0);
  k.invstd = 1.0 / sqrt(k.var + eps);
  return k;
}

/* The running statistics of channel c (rm, rv may be NULL: none), as
 * torch: the variance unbiased over the cnt values. */
static void update_running(float *rm, float *rv, int64_t c, double momentum,
                           bn_chan_t k, double cnt) {
  if (rm == NULL)
    return;
  rm[c] = (float)((1 - momentum) * rm[c] + momentum * k.mean);
  rv[c] = (float)((1 - momentum) * rv[c] + momentum * k.var * cnt / (cnt - 1));
}

/* ---- device tensors: the sums by kernels, the rest on the host --------- */

#ifdef HVD_HAVE_CUDA
/* One call's device work. It runs on the calling thread's stream
 * (hvd_cuda_set_stream; the legacy default stream when none is set), so
 * it follows what the caller enqueued there (x and dy written by kernels
 * still queued: the collectives' "Device ordering"), and the call
 * synchronises that stream before it returns, so the results are
 * complete for every stream. Its scratch, per-channel sums (double
 * [2][C]) and coefficients (float [4][C]), comes from a pool kept for the
 * process (scratch_take): no cudaMalloc or cudaFree per call, each of
 * which would wait for the whole device (an in-flight NCCL reduction of
 * the gradients included) in the middle of the backward. The caller's
 * [C] arrays (weight, running statistics, ...) are device memory, read
 * and written through host copies on the same stream. */
typedef struct dev {
  int prev; /* the caller's current device, put back at the end */
  cudaStream_t s;
  int slot; /* the pool's, or -1: cudaMalloc'd for this call */
  void *mem;
  double *sums;
  float *coef;
} bn_dev_t;

/* The scratch pool: a slot per concurrent call (sync batch norm is called
 * from one thread at a time in practice), grown to a power of two of at
 * least 4 KiB when a call needs more, freed at exit. */
#define SCRATCH_SLOTS 8
static struct {
  int dev, busy;
  size_t bytes;
  void *p;
} pool[SCRATCH_SLOTS];
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static int pool_hooked;

static void pool_free(void) {
  for (int k = 0; k < SCRATCH_SLOTS; k++)
    if (pool[k].p != NULL) { /* at exit: nothing else runs any more */
      int prev = -1;
      if (cudaGetDevice(&prev) == cudaSuccess && prev != pool[k].dev)
        (void)cudaSetDevice(pool[k].dev);
      (void)cudaFree(pool[k].p);
      pool[k].p = NULL;
    }
}

/* *mem: at least `bytes` of device memory on the current device dev, from
 * slot *slot (busy until scratch_give), or cudaMalloc'd (*slot -1) when
 * every slot is busy. A slot grows (cudaFree, cudaMalloc) only when a
 * call needs more than it has: the first calls of a model. */
static cudaError_t scratch_take(int dev, size_t bytes, int *slot, void **mem) {
  int pick = -1;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&pool_mu);
  if (!pool_hooked && atexit(pool_free) == 0)
    pool_hooked = 1;
  for (int k = 0; k < SCRATCH_SLOTS; k++) {
    if (pool[k].busy || (pool[k].p != NULL && pool[k].dev != dev))
      continue;
    if (pick < 0 || (pool[k].bytes >= bytes && pool[pick].bytes < bytes))
      pick = k;
  }
  if (pick >= 0)
    pool[pick].busy = 1;
  pthread_mutex_unlock(&pool_mu);
  *slot = pick;
  if (pick < 0)
    return cudaMalloc(mem, bytes);
  if (pool[pick].bytes < bytes) { /* the slot is ours: grow it */
    size_t want = 4096;
    while (want < bytes)
      want *= 2;
    (void)cudaFree(pool[pick].p);
    pool[pick].p = NULL;
    pool[pick].bytes = 0;
    if ((e = cudaMalloc(&pool[pick].p, want)) == cudaSuccess) {
      pool[pick].bytes = want;
      pool[pick].dev = dev;
    }
  }
  *mem = pool[pick].p;
  return e;
}

static void scratch_give(int slot, void *mem) {
  if (slot < 0) {
    (void)cudaFree(mem);
    return;
  }
  pthread_mutex_lock(&pool_mu);
  pool[slot].busy = 0;
  pthread_mutex_unlock(&pool_mu);
}

static hvd_result_t dev_cuda(const char *fn, const char *name, cudaError_t e,
                             const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s '%s': %s", fn, name, what);
  return hvd__cuda_error(e, msg);
}

static hvd_result_t dev_open(const char *fn, const char *name, int device,
                             int64_t c, bn_dev_t *d) {
  size_t sums = 2 * (size_t)c * sizeof(double);
  *d = (bn_dev_t){.prev = -1, .s = (cudaStream_t)hvd_cuda_stream(), .slot = -1};
  cudaError_t e = cudaGetDevice(&d->prev);
  if (e == cudaSuccess && d->prev != device)
    e = cudaSetDevice(device);
  if (e == cudaSuccess)
    e = scratch_take(device, sums + 4 * (size_t)c * sizeof(float), &d->slot,
                     &d->mem);
  if (e != cudaSuccess) {
    if (d->slot >= 0)
      scratch_give(d->slot, NULL);
    d->slot = -1;
    d->mem = NULL;
    return dev_cuda(fn, name, e, "device scratch");
  }
  d->sums = d->mem;
  d->coef = (float *)((char *)d->mem + sums);
  return HVD_SUCCESS;
}

/* The stream done (the host copies read and written: the call's results
 * complete for every stream), the scratch back; rc, or the
 * synchronisation's failure when rc is HVD_SUCCESS. */
static hvd_result_t dev_close(const char *fn, const char *name, bn_dev_t *d,
                              int device, hvd_result_t rc) {
  cudaError_t e = cudaStreamSynchronize(d->s);
  if (d->mem != NULL)
    scratch_give(d->slot, d->mem);
  if (d->prev >= 0 && d->prev != device)
    (void)cudaSetDevice(d->prev);
  return rc == HVD_SUCCESS && e != cudaSuccess
             ? dev_cuda(fn, name, e, "synchronize")
             : rc;
}

/* n floats from or to the device on the call's stream; NULL device
 * pointers are skipped. A get is on the host at the next sync. */
static cudaError_t dev_get(bn_dev_t *d, float *h, const float *p, int64_t n) {
  return p == NULL ? cudaSuccess
                   : cudaMemcpyAsync(h, p, (size_t)n * sizeof(float),
                                     cudaMemcpyDeviceToHost, d->s);
}

static cudaError_t dev_put(bn_dev_t *d, float *p, const float *h, int64_t n) {
  return p == NULL ? cudaSuccess
                   : cudaMemcpyAsync(p, h, (size_t)n * sizeof(float),
                                     cudaMemcpyHostToDevice, d->s);
}

#define DEV_CUDA(call, what)                                                   \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      rc = dev_cuda(fn, name, e_, what);                                       \
      goto done;                                                               \
    }                                                                          \
  } while (0)

static hvd_result_t dev_forward(const char *fn, const char *name,
                                const hvd_tensor_t *x, const float *weight,
                                const float *bias, float *rm, float *rv,
                                double momentum, double eps, hvd_tensor_t *y,
                                float *save_mean, float *save_invstd,
                                bn_shape_t sh) {
  const int64_t N = sh.n, C = sh.c, S = sh.s;
  bn_dev_t d;
  hvd_result_t rc = dev_open(fn, name, x->device, C, &d);
  double *st = calloc(3 * (size_t)C, sizeof *st);
  float *h = calloc(10 * (size_t)C, sizeof *h); /* w b rm rv sm si coef[4] */
  float *hw = h, *hb = h + C, *hrm = h + 2 * C, *hrv = h + 3 * C,
        *sm = h + 4 * C, *si = h + 5 * C, *coef = h + 6 * C;
  if (rc != HVD_SUCCESS)
    goto done;
  if (st == NULL || h == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn, name);
    goto done;
  }
  if ((rc = hvd__cuda_bn_stats(x->data, x->dtype, N, C, S, d.sums, d.s)) !=
      HVD_SUCCESS)
    goto done;
  DEV_CUDA(cudaMemcpyAsync(st + C, d.sums, 2 * (size_t)C * sizeof(double),
                           cudaMemcpyDeviceToHost, d.s),
           "the sums");
  DEV_CUDA(dev_get(&d, hw, weight, C), "weight");
  DEV_CUDA(dev_get(&d, hb, bias, C), "bias");
  DEV_CUDA(dev_get(&d, hrm, rm, C), "running_mean");
  DEV_CUDA(dev_get(&d, hrv, rv, C), "running_var");
  DEV_CUDA(cudaStreamSynchronize(d.s), "synchronize");
  if ((rc = sum_batch(fn, name, st, C, N * S)) != HVD_SUCCESS)
    goto done;
  for (int64_t c = 0; c < C; c++) {
    bn_chan_t k = channel(st, C, c, eps);
    coef[c] = (float)k.mean;
    coef[C + c] = (float)(k.invstd * (weight != NULL ? hw[c] : 1.0));
    coef[2 * C + c] = bias != NULL ? hb[c] : 0.0f;
    update_running(rm != NULL ? hrm : NULL, hrv, c, momentum, k, st[0]);
    sm[c] = (float)k.mean;
    si[c] = (float)k.invstd;
  }
  DEV_CUDA(dev_put(&d, d.coef, coef, 3 * C), "coefficients");
  if ((rc = hvd__cuda_bn_apply(x->data, y->data, x->dtype, N, C, S, d.coef,
                               d.s)) != HVD_SUCCESS)
    goto done;
  DEV_CUDA(dev_put(&d, rm, hrm, C), "running_mean");
  DEV_CUDA(dev_put(&d, rv, hrv, C), "running_var");
  DEV_CUDA(dev_put(&d, save_mean, sm, C), "save_mean");
  DEV_CUDA(dev_put(&d, save_invstd, si, C), "save_invstd");
done:
  rc = dev_close(fn, name, &d, x->device, rc); /* st and h copied */
  free(st);
  free(h);
  return rc;
}

static hvd_result_t dev_backward(const char *fn, const char *name,
                                 const hvd_tensor_t *x, const hvd_tensor_t *dy,
                                 const float *weight, const float *save_mean,
                                 const float *save_invstd, hvd_tensor_t *dx,
                                 float *dweight, float *dbias, bn_shape_t sh) {
  const int64_t N = sh.n, C = sh.c, S = sh.s;
  bn_dev_t d;
  hvd_result_t rc = dev_open(fn, name, x->device, C, &d);
  double *st = calloc(5 * (size_t)C, sizeof *st); /* [3][C] + own [2][C] */
  float *h = calloc(9 * (size_t)C, sizeof *h);    /* sm si w dw db coef[4] */
  float *sm = h, *si = h + C, *hw = h + 2 * C, *hdw = h + 3 * C,
        *hdb = h + 4 * C, *coef = h + 5 * C;
  if (rc != HVD_SUCCESS)
    goto done;
  if (st == NULL || h == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn, name);
    goto done;
  }
  double *own = st + 3 * C;
  DEV_CUDA(dev_get(&d, sm, save_mean, C), "save_mean");
  DEV_CUDA(dev_get(&d, si, save_invstd, C), "save_invstd");
  DEV_CUDA(dev_get(&d, hw, weight, C), "weight");
  DEV_CUDA(cudaMemcpyAsync(d.coef, save_mean, (size_t)C * sizeof(float),
                           cudaMemcpyDeviceToDevice, d.s),
           "coefficients");
  if ((rc = hvd__cuda_bn_grad_stats(x->data, dy->data, x->dtype, N, C, S,
                                    d.coef, d.sums, d.s)) != HVD_SUCCESS)
    goto done;
  DEV_CUDA(cudaMemcpyAsync(st + C, d.sums, 2 * (size_t)C * sizeof(double),
                           cudaMemcpyDeviceToHost, d.s),
           "the sums");
  DEV_CUDA(dev_get(&d, hdw, dweight, C), "dweight");
  DEV_CUDA(dev_get(&d, hdb, dbias, C), "dbias");
  DEV_CUDA(cudaStreamSynchronize(d.s), "synchronize");
  memcpy(own, st + C, 2 * (size_t)C * sizeof *own);
  if ((rc = sum_stats(fn, name, ".grad", st, C, N * S)) != HVD_SUCCESS)
    goto done;
  const double cnt = st[0];
  for (int64_t c = 0; c < C; c++) {
    hdw[c] += (float)(own[C + c] * si[c]);
    hdb[c] += (float)own[c];
    double w = weight != NULL ? hw[c] : 1.0;
    coef[c] = sm[c];
    coef[C + c] = (float)(w * si[c]);
    coef[2 * C + c] = (float)(st[C + c] / cnt);
    coef[3 * C + c] = (float)((double)si[c] * si[c] * st[2 * C + c] / cnt);
  }
  DEV_CUDA(dev_put(&d, dweight, hdw, C), "dweight");
  DEV_CUDA(dev_put(&d, dbias, hdb, C), "dbias");
  if (dx != NULL) {
    DEV_CUDA(dev_put(&d, d.coef, coef, 4 * C), "coefficients");
    if ((rc = hvd__cuda_bn_dx(x->data, dy->data, dx->data, x->dtype, N, C, S,
                              d.coef, d.s)) != HVD_SUCCESS)
      goto done;
  }
done:
  rc = dev_close(fn, name, &d, x->device, rc); /* st and h copied */
  free(st);
  free(h);
  return rc;
}
#endif

/* The forward, named fn, over the collectives' current set (the world's,
 * or hvd_ps_sync_batch_norm_forward's). */
static hvd_result_t forward(const char *fn, const char *name,
                            const hvd_tensor_t *x, const float *weight,
                            const float *bias, float *running_mean,
                            float *running_var, double momentum, double eps,
                            hvd_tensor_t *y, float *save_mean,
                            float *save_invstd) {
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
#ifdef HVD_HAVE_CUDA
  if (x->device != HVD_CPU)
    return dev_forward(fn, name, x, weight, bias, running_mean, running_var,
                       momentum, eps, y, save_mean, save_invstd, sh);
#endif

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
    st[C + c] = sum;
    st[2 * C + c] = sq;
  }
  rc = sum_batch(fn, name, st, C, N * S);
  if (rc != HVD_SUCCESS) {
    free(st);
    return rc;
  }
  for (int64_t c = 0; c < C; c++) {
    bn_chan_t k = channel(st, C, c, eps);
    double mean = k.mean, invstd = k.invstd;
    double w = weight != NULL ? weight[c] : 1.0;
    double b = bias != NULL ? bias[c] : 0.0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        put(y->data, y->dtype, i,
            (get(x->data, x->dtype, i) - mean) * invstd * w + b);
      }
    update_running(running_mean, running_var, c, momentum, k, st[0]);
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

/* The backward, as forward(). */
static hvd_result_t backward(const char *fn, const char *name,
                             const hvd_tensor_t *x, const hvd_tensor_t *dy,
                             const float *weight, const float *save_mean,
                             const float *save_invstd, hvd_tensor_t *dx,
                             float *dweight, float *dbias) {
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
#ifdef HVD_HAVE_CUDA
  if (x->device != HVD_CPU)
    return dev_backward(fn, name, x, dy, weight, save_mean, save_invstd, dx,
                        dweight, dbias, sh);
#endif

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
    st[C + c] = own[c] = sdy;
    st[2 * C + c] = own[C + c] = sdyx;
  }
  rc = sum_stats(fn, name, ".grad", st, C, N * S);
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

hvd_result_t hvd_sync_batch_norm_forward(
    const char *name, const hvd_tensor_t *x, const float *weight,
    const float *bias, float *running_mean, float *running_var, double momentum,
    double eps, hvd_tensor_t *y, float *save_mean, float *save_invstd) {
  return forward(__func__, name, x, weight, bias, running_mean, running_var,
                 momentum, eps, y, save_mean, save_invstd);
}

hvd_result_t
hvd_sync_batch_norm_backward(const char *name, const hvd_tensor_t *x,
                             const hvd_tensor_t *dy, const float *weight,
                             const float *save_mean, const float *save_invstd,
                             hvd_tensor_t *dx, float *dweight, float *dbias) {
  return backward(__func__, name, x, dy, weight, save_mean, save_invstd, dx,
                  dweight, dbias);
}

hvd_result_t hvd_ps_sync_batch_norm_forward(
    const hvd_process_set_t *ps, const char *name, const hvd_tensor_t *x,
    const float *weight, const float *bias, float *running_mean,
    float *running_var, double momentum, double eps, hvd_tensor_t *y,
    float *save_mean, float *save_invstd) {
  hvd_result_t rc = hvd__optim_check_set(__func__, ps);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(ps, rc,
                forward(__func__, name, x, weight, bias, running_mean,
                        running_var, momentum, eps, y, save_mean, save_invstd));
  return rc;
}

hvd_result_t hvd_ps_sync_batch_norm_backward(
    const hvd_process_set_t *ps, const char *name, const hvd_tensor_t *x,
    const hvd_tensor_t *dy, const float *weight, const float *save_mean,
    const float *save_invstd, hvd_tensor_t *dx, float *dweight, float *dbias) {
  hvd_result_t rc = hvd__optim_check_set(__func__, ps);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(ps, rc,
                backward(__func__, name, x, dy, weight, save_mean, save_invstd,
                         dx, dweight, dbias));
  return rc;
}
