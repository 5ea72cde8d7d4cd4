/*
 * device.c - lib/optim's device side (device.h): an optimizer's stream and
 * span arrays, its state in device memory, the batched update kernels of
 * optim_kernels.cu, and synchronous copies for checksums and
 * checkpoints. Stubs in a build without CUDA.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/device.h"

#ifdef HVD_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "base/device.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

/* the span's layout as optim_kernels.cu reads it, dtype an int */
_Static_assert(sizeof(hvd__cuda_convert_span_t) == 32 &&
                   sizeof(hvd_dtype_t) == sizeof(int),
               "hvd__cuda_convert_span_t differs from the CUDA side's");

struct hvd__odev {
  int dev;
  cudaStream_t stream;            /* cudaStreamNonBlocking, on dev */
  hvd__cuda_param_span_t *spans;  /* the batch, built here (host) */
  hvd__cuda_param_span_t *dspans; /* and uploaded here (device) */
  int cap;                        /* entries of both */
  int *flag;                      /* mixed precision's found-inf (device) */
  /* mixed precision's batched conversions: their own span arrays */
  hvd__cuda_convert_span_t *cspans, *dcspans; /* host, device */
  int ccap;                                   /* entries of both */
  /* gradient clipping's norms: spans (host, device), the chunks'
     partial results and the spans' (device) */
  hvd__cuda_norm_span_t *nspans, *dnspans;
  int ncap;
  double *parts, *nout;
  int64_t parts_cap, nout_cap; /* doubles */
  /* LAMB's spans (host, device); its norms use parts and nout */
  hvd__cuda_lamb_span_t *lspans, *dlspans;
  int lcap;
  cudaEvent_t caller; /* hvd__odev_after_caller's (made at first use) */
};

/* HVD_ERR_CUDA "<who>: <call up to its '('>: <string> (<name>)", as
 * hvd__cuda_error (which clears CUDA's last error). */
static hvd_result_t cuda_fail(const char *who, cudaError_t err,
                              const char *call) {
  char what[HVD__ERRMSG_MAX];
  snprintf(what, sizeof what, "%s: %s", who, call);
  return hvd__cuda_error(err, what);
}

#define ODEV_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t odev_rc_ = (call);                                             \
    if (odev_rc_ != cudaSuccess) {                                             \
      rc = cuda_fail(who, odev_rc_, #call);                                    \
      goto fail;                                                               \
    }                                                                          \
  } while (0)

/* A kernel wrapper's failure (its message names the wrapper): prefixed
 * with who. */
static hvd_result_t kernel_fail(const char *who, hvd_result_t rc) {
  char msg[HVD__ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", hvd_last_error());
  return hvd__set_error(rc, "%s: %s", who, msg);
}

/* Makes dev current; *prev is the caller's device to put back (-1: none
 * known). */
static hvd_result_t enter(const char *who, int dev, int *prev) {
  hvd_result_t rc = HVD_SUCCESS;
  if (cudaGetDevice(prev) != cudaSuccess) {
    (void)cudaGetLastError();
    *prev = -1;
  }
  if (*prev != dev)
    ODEV_CHECK(cudaSetDevice(dev));
fail:
  return rc;
}

static void leave(int dev, int prev) {
  if (prev >= 0 && prev != dev && cudaSetDevice(prev) != cudaSuccess)
    (void)cudaGetLastError();
}

hvd_result_t hvd__odev_open(const char *who, int dev, hvd__odev_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  *out = NULL;
  hvd__odev_t *d = calloc(1, sizeof *d);
  if (d == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  d->dev = dev;
  HVD__CHECK(enter(who, dev, &prev));
  ODEV_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
  leave(dev, prev);
  *out = d;
  return HVD_SUCCESS;
fail:
  leave(dev, prev);
  free(d);
  return rc;
}

void hvd__odev_close(hvd__odev_t *d) {
  int prev = -1;
  if (d == NULL)
    return;
  if (cudaGetDevice(&prev) != cudaSuccess)
    prev = -1;
  if (cudaSetDevice(d->dev) == cudaSuccess) {
    if (d->stream != NULL) {
      cudaStreamSynchronize(d->stream);
      cudaStreamDestroy(d->stream);
    }
    if (d->caller != NULL)
      cudaEventDestroy(d->caller);
    cudaFree(d->dspans);
    cudaFree(d->dcspans);
    cudaFree(d->flag);
    cudaFree(d->dnspans);
    cudaFree(d->parts);
    cudaFree(d->nout);
    cudaFree(d->dlspans);
  }
  leave(d->dev, prev);
  (void)cudaGetLastError(); /* nothing to report from a teardown */
  free(d->spans);
  free(d->cspans);
  free(d->nspans);
  free(d->lspans);
  free(d);
}

hvd_result_t hvd__odev_calloc(const char *who, hvd__odev_t *d, size_t bytes,
                              void **out) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  void *p = NULL;
  *out = NULL;
  if (bytes == 0)
    bytes = 1;
  HVD__CHECK(enter(who, d->dev, &prev));
  ODEV_CHECK(cudaMalloc(&p, bytes));
  ODEV_CHECK(cudaMemsetAsync(p, 0, bytes, d->stream));
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
  *out = p;
  p = NULL;
fail:
  if (p != NULL)
    cudaFree(p);
  leave(d->dev, prev);
  return rc;
}

void hvd__odev_free(int dev, void *p) {
  int prev = -1;
  if (p == NULL)
    return;
  /* on dev: cudaFree on a thread whose current device has no context yet
   * would create one (hundreds of MB) on that GPU, GPU 0 by default */
  if (cudaGetDevice(&prev) != cudaSuccess)
    prev = -1;
  if (prev == dev || cudaSetDevice(dev) == cudaSuccess)
    (void)cudaFree(p);
  leave(dev, prev);
  (void)cudaGetLastError(); /* nothing to report from a teardown */
}

hvd_result_t hvd__odev_zero(const char *who, hvd__odev_t *d, void *p,
                            size_t bytes) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  if (bytes == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  ODEV_CHECK(cudaMemsetAsync(p, 0, bytes, d->stream));
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_scale(const char *who, hvd__odev_t *d, float *x,
                             int64_t n, double factor) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  rc = hvd__cuda_grad_scale(x, n, factor, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_flag_reset(const char *who, hvd__odev_t *d) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  if (d->flag == NULL)
    ODEV_CHECK(cudaMalloc((void **)&d->flag, sizeof *d->flag));
  ODEV_CHECK(cudaMemsetAsync(d->flag, 0, sizeof *d->flag, d->stream));
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_flag_read(const char *who, hvd__odev_t *d, int *out) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  *out = 0;
  HVD__CHECK(enter(who, d->dev, &prev));
  ODEV_CHECK(cudaMemcpyAsync(out, d->flag, sizeof *out, cudaMemcpyDeviceToHost,
                             d->stream));
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_to_master(const char *who, hvd__odev_t *d,
                                 const void *src, hvd_dtype_t dtype, float *dst,
                                 int64_t n, double factor) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  rc = hvd__cuda_to_master(src, dtype, dst, n, factor, d->flag, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_refresh_master(const char *who, hvd__odev_t *d,
                                      const void *value, hvd_dtype_t dtype,
                                      float *master, int64_t n) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  rc = hvd__cuda_refresh_master(value, dtype, master, n, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  leave(d->dev, prev);
  return rc;
}

/* A span array's host and device twins (*host, *dev: *cap entries of
 * size bytes) hold at least n entries. Growing frees the device array,
 * which a launch enqueued earlier on d's stream may still be reading (the
 * last batch, or a step's earlier weight-decay group): the stream is
 * waited for first (growth is rare: the arrays only grow), so that no
 * launch in flight sees it go. */
static hvd_result_t grow_twin(const char *who, hvd__odev_t *d, void **host,
                              void **dev, int *cap, int n, size_t size) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= *cap)
    return HVD_SUCCESS;
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
  rc = hvd__cuda_twin_grow(host, dev, cap, n, size, 16, 0);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  return rc;
}

/* c[0..n) checked as the launch `kname` needs them (to_master: which
 * one), written into d->cspans and copied to d->dcspans on d's stream;
 * *max_count: the largest count. d's device is current. */
static hvd_result_t upload_convert(const char *who, const char *kname,
                                   hvd__odev_t *d, const hvd__odev_convert_t *c,
                                   int n, int to_master, int64_t *max_count) {
  hvd_result_t rc = HVD_SUCCESS;
  *max_count = 0;
  for (int t = 0; t < n; t++)
    if (hvd__km_check_convert(kname, t, c[t].n, c[t].dtype, to_master) !=
        HVD_SUCCESS)
      return kernel_fail(who, HVD_ERR_INVALID_ARG);
  HVD__CHECK(grow_twin(who, d, (void **)&d->cspans, (void **)&d->dcspans,
                       &d->ccap, n, sizeof *d->cspans));
  for (int t = 0; t < n; t++) {
    hvd__cuda_convert_span_t *sp = &d->cspans[t];
    sp->src = c[t].src;
    sp->dst = c[t].dst;
    sp->count = c[t].n;
    sp->dtype = c[t].dtype;
    if (sp->count > *max_count)
      *max_count = sp->count;
  }
  /* Both arrays are refilled by every batch, while the previous batch's
   * kernel may still be queued or running; neither write can reach what
   * that kernel reads. The host array is malloc'd (pageable), so
   * cudaMemcpyAsync has staged it before it returns: refilling it later
   * changes nothing already copied. The copy into the device array is
   * enqueued on d's stream, behind every earlier launch on that stream
   * that reads the array: the stream runs them in order, so the copy
   * lands only after they are done (no event needed), and no other
   * stream reads it. Only growth frees it (grow_twin waits first). */
  ODEV_CHECK(cudaMemcpyAsync(d->dcspans, d->cspans,
                             (size_t)n * sizeof *d->cspans,
                             cudaMemcpyHostToDevice, d->stream));
fail:
  return rc;
}

/* The end of a batched call: after a failure, the stream waited for (the
 * spans' copy may be queued) and CUDA's last error cleared. */
static void convert_end(hvd__odev_t *d, hvd_result_t rc, int prev) {
  if (rc != HVD_SUCCESS && d->stream != NULL) {
    (void)cudaStreamSynchronize(d->stream);
    (void)cudaGetLastError();
  }
  leave(d->dev, prev);
}

hvd_result_t hvd__odev_to_master_batch(const char *who, hvd__odev_t *d,
                                       const hvd__odev_convert_t *c, int n,
                                       double factor) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  int64_t max_count = 0;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(
      upload_convert(who, "hvd__cuda_to_master_batch", d, c, n, 1, &max_count));
  rc = hvd__cuda_to_master_batch(d->dcspans, n, max_count, factor, d->flag,
                                 d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  convert_end(d, rc, prev);
  return rc;
}

hvd_result_t hvd__odev_from_master_batch(const char *who, hvd__odev_t *d,
                                         const hvd__odev_convert_t *c, int n) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  int64_t max_count = 0;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(upload_convert(who, "hvd__cuda_from_master_batch", d, c, n, 0,
                            &max_count));
  rc = hvd__cuda_from_master_batch(d->dcspans, n, max_count, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  convert_end(d, rc, prev);
  return rc;
}

hvd_result_t hvd__odev_update(const char *who, hvd__odev_t *d, int kind,
                              const void *options, const hvd_param_t *params,
                              int n, const hvd_tensor_t *state, int nstate,
                              int64_t step, double lr,
                              const unsigned char *only) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1, m = 0;
  int64_t max_count = 0;
  for (int i = 0; i < n; i++)
    m += params[i].value.device != HVD_CPU && (only == NULL || only[i]);
  if (m == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(grow_twin(who, d, (void **)&d->spans, (void **)&d->dspans, &d->cap,
                       m, sizeof *d->spans));
  m = 0;
  for (int i = 0; i < n; i++) {
    const hvd_param_t *p = &params[i];
    if (p->value.device == HVD_CPU || (only != NULL && !only[i]))
      continue;
    hvd__cuda_param_span_t *sp = &d->spans[m++];
    sp->value = p->value.data;
    sp->grad = p->grad.data;
    sp->state[0] = nstate > 0 ? state[(size_t)i * nstate].data : NULL;
    sp->state[1] = nstate > 1 ? state[(size_t)i * nstate + 1].data : NULL;
    sp->count = hvd_tensor_numel(&p->value);
    if (sp->count > max_count)
      max_count = sp->count;
  }
  ODEV_CHECK(cudaMemcpyAsync(d->dspans, d->spans, (size_t)m * sizeof *d->spans,
                             cudaMemcpyHostToDevice, d->stream));
  rc = kind == 0 ? hvd__cuda_sgd_step(d->dspans, m, max_count, options, step,
                                      lr, d->stream)
                 : hvd__cuda_adam_step(d->dspans, m, max_count, options, step,
                                       lr, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  if (rc != HVD_SUCCESS && d->stream != NULL) { /* the spans' copy */
    (void)cudaStreamSynchronize(d->stream);
    (void)cudaGetLastError();
  }
  leave(d->dev, prev);
  return rc;
}

/* *buf holds at least n doubles of device memory (*cap of them); growing
 * waits for d's stream first, as grow_twin. */
static hvd_result_t grow_doubles(const char *who, hvd__odev_t *d, double **buf,
                                 int64_t *cap, int64_t n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= *cap)
    return HVD_SUCCESS;
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
  cudaFree(*buf);
  *buf = NULL;
  *cap = 0;
  ODEV_CHECK(cudaMalloc((void **)buf, (size_t)n * sizeof **buf));
  *cap = n;
fail:
  return rc;
}

/* Room for a norm launch of n spans and `chunks` chunks: d->parts and
 * d->nout. */
static hvd_result_t norm_room(const char *who, hvd__odev_t *d, int64_t chunks,
                              int n) {
  hvd_result_t rc = grow_doubles(who, d, &d->parts, &d->parts_cap,
                                 2 * (chunks > 0 ? chunks : 1));
  return rc == HVD_SUCCESS
             ? grow_doubles(who, d, &d->nout, &d->nout_cap, 2 * (int64_t)n)
             : rc;
}

/* After a norm launch (launched: its result): its 2 n results copied from
 * d->nout to out (host), the stream waited for. */
static hvd_result_t norm_fetch(const char *who, hvd__odev_t *d,
                               hvd_result_t launched, double *out, int n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (launched != HVD_SUCCESS)
    return kernel_fail(who, launched);
  ODEV_CHECK(cudaMemcpyAsync(out, d->nout, 2 * (size_t)n * sizeof *out,
                             cudaMemcpyDeviceToHost, d->stream));
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
fail:
  return rc;
}

hvd_result_t hvd__odev_norm_batch(const char *who, hvd__odev_t *d,
                                  const float *const *x, const int64_t *count,
                                  int n, double *out) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  int64_t chunks = 0;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(grow_twin(who, d, (void **)&d->nspans, (void **)&d->dnspans,
                       &d->ncap, n, sizeof *d->nspans));
  for (int i = 0; i < n; i++) {
    d->nspans[i] = (hvd__cuda_norm_span_t){x[i], count[i], chunks};
    chunks += hvd__km_norm_chunks(count[i]);
  }
  HVD__CHECK(norm_room(who, d, chunks, n));
  /* the host array is pageable: staged before the call returns, as in
   * upload_convert */
  ODEV_CHECK(cudaMemcpyAsync(d->dnspans, d->nspans,
                             (size_t)n * sizeof *d->nspans,
                             cudaMemcpyHostToDevice, d->stream));
  rc = norm_fetch(
      who, d,
      hvd__cuda_norm_batch(d->dnspans, n, chunks, d->parts, d->nout, d->stream),
      out, n);
fail:
  convert_end(d, rc, prev);
  return rc;
}

/* p[0..n) into d->lspans, copied to d->dlspans on d's stream (staged
 * before the call returns, as in upload_convert); *chunks and *max_count
 * the batch's. d's device is current. */
static hvd_result_t upload_lamb(const char *who, hvd__odev_t *d,
                                const hvd__odev_lamb_t *p, int n,
                                int64_t *chunks, int64_t *max_count) {
  hvd_result_t rc = HVD_SUCCESS;
  *chunks = *max_count = 0;
  HVD__CHECK(grow_twin(who, d, (void **)&d->lspans, (void **)&d->dlspans,
                       &d->lcap, n, sizeof *d->lspans));
  for (int i = 0; i < n; i++) {
    d->lspans[i] =
        (hvd__cuda_lamb_span_t){p[i].value, p[i].grad, p[i].m,  p[i].s,
                                p[i].n,     *chunks,   p[i].wd, p[i].ratio};
    *chunks += hvd__km_norm_chunks(p[i].n);
    if (p[i].n > *max_count)
      *max_count = p[i].n;
  }
  ODEV_CHECK(cudaMemcpyAsync(d->dlspans, d->lspans,
                             (size_t)n * sizeof *d->lspans,
                             cudaMemcpyHostToDevice, d->stream));
fail:
  return rc;
}

hvd_result_t hvd__odev_lamb_norms(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step,
                                  double *out) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  int64_t chunks = 0, max_count = 0;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(upload_lamb(who, d, p, n, &chunks, &max_count));
  HVD__CHECK(norm_room(who, d, chunks, n));
  rc = norm_fetch(who, d,
                  hvd__cuda_lamb_norms(d->dlspans, n, chunks, o, step, d->parts,
                                       d->nout, d->stream),
                  out, n);
fail:
  convert_end(d, rc, prev);
  return rc;
}

hvd_result_t hvd__odev_lamb_apply(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  int64_t chunks = 0, max_count = 0;
  if (n == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  HVD__CHECK(upload_lamb(who, d, p, n, &chunks, &max_count));
  rc = hvd__cuda_lamb_apply(d->dlspans, n, max_count, o, step, d->stream);
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  convert_end(d, rc, prev);
  return rc;
}

hvd_result_t hvd__odev_psgd(const char *who, hvd__odev_t *d,
                            hvd__odev_psgd_op_t op, const hvd__odev_psgd_t *x,
                            double factor, float inv, int keep) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  switch (op) {
  case HVD__PSGD_PREPARE:
    rc = hvd__cuda_psgd_prepare(x->M, x->e, x->n * x->m, factor, d->stream);
    break;
  case HVD__PSGD_MQ:
    rc = hvd__cuda_psgd_mq(x->M, x->Qt, x->P, x->n, x->m, x->r, d->stream);
    break;
  case HVD__PSGD_MTP:
    rc = hvd__cuda_psgd_mtp(x->M, x->P, x->Qt, x->parts, x->n, x->m, x->r,
                            d->stream);
    break;
  case HVD__PSGD_FINISH:
    rc = hvd__cuda_psgd_finish(x->M, x->e, x->P, x->Qt, x->n, x->m, x->r,
                               factor, inv, keep, d->stream);
    break;
  }
  if (rc != HVD_SUCCESS)
    rc = kernel_fail(who, rc);
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_copy_async(const char *who, hvd__odev_t *d, void *dst,
                                  const void *src, size_t bytes,
                                  int to_device) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  if (bytes == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, d->dev, &prev));
  ODEV_CHECK(cudaMemcpyAsync(
      dst, src, bytes,
      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, d->stream));
fail:
  leave(d->dev, prev);
  return rc;
}

void *hvd__odev_stream(const hvd__odev_t *d) { return (void *)d->stream; }

hvd_result_t hvd__odev_after_caller(const char *who, hvd__odev_t *d) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  if (d->caller == NULL)
    ODEV_CHECK(cudaEventCreateWithFlags(&d->caller, cudaEventDisableTiming));
  ODEV_CHECK(cudaEventRecord(d->caller, (cudaStream_t)hvd_cuda_stream()));
  ODEV_CHECK(cudaStreamWaitEvent(d->stream, d->caller, 0));
fail:
  leave(d->dev, prev);
  return rc;
}

hvd_result_t hvd__odev_sync(const char *who, hvd__odev_t *d) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  HVD__CHECK(enter(who, d->dev, &prev));
  ODEV_CHECK(cudaStreamSynchronize(d->stream));
fail:
  leave(d->dev, prev);
  return rc;
}

/* The calling thread's stream (hvd_cuda_set_stream) done with what it
 * has enqueued: a synchronous copy on the legacy stream is ordered after
 * the legacy and the blocking streams' work, not after a non-blocking
 * stream's. */
static cudaError_t after_caller(void) {
  cudaStream_t s = (cudaStream_t)hvd_cuda_stream();
  return s != NULL ? cudaStreamSynchronize(s) : cudaSuccess;
}

hvd_result_t hvd__odev_read(const char *who, void *dst, const hvd_tensor_t *t,
                            size_t offset, size_t bytes) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  if (bytes == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, t->device, &prev));
  ODEV_CHECK(after_caller());
  ODEV_CHECK(cudaMemcpy(dst, (const char *)t->data + offset, bytes,
                        cudaMemcpyDeviceToHost));
fail:
  leave(t->device, prev);
  return rc;
}

/* bytes from src (host memory, or device memory on t's device: kind)
 * into device tensor t at byte offset, complete for every stream on
 * return. */
static hvd_result_t write_into(const char *who, hvd_tensor_t *t, size_t offset,
                               const void *src, size_t bytes,
                               enum cudaMemcpyKind kind) {
  hvd_result_t rc = HVD_SUCCESS;
  int prev = -1;
  if (bytes == 0)
    return HVD_SUCCESS;
  HVD__CHECK(enter(who, t->device, &prev));
  ODEV_CHECK(after_caller()); /* nothing of the caller's still to land */
  ODEV_CHECK(cudaMemcpy((char *)t->data + offset, src, bytes, kind));
  /* From pageable memory cudaMemcpy returns once src is staged, possibly
   * before the DMA lands, and device to device it does not wait at all;
   * the legacy stream it used orders nothing on non-blocking streams (the
   * optimizer's, the engine's): wait for it, so that the data is there
   * for any stream when we return. */
  ODEV_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
fail:
  leave(t->device, prev);
  return rc;
}

hvd_result_t hvd__odev_write(const char *who, hvd_tensor_t *t, size_t offset,
                             const void *src, size_t bytes) {
  return write_into(who, t, offset, src, bytes, cudaMemcpyHostToDevice);
}

hvd_result_t hvd__odev_copy(const char *who, hvd_tensor_t *t, size_t offset,
                            const void *src, size_t bytes) {
  return write_into(who, t, offset, src, bytes, cudaMemcpyDeviceToDevice);
}

#else /* !HVD_HAVE_CUDA */

struct hvd__odev {
  int dev;
};

static hvd_result_t no_cuda(const char *who) {
  return hvd__set_error(HVD_ERR_UNSUPPORTED,
                        "%s: device tensors need a build with CUDA", who);
}

hvd_result_t hvd__odev_open(const char *who, int dev, hvd__odev_t **out) {
  (void)dev;
  *out = NULL;
  return no_cuda(who);
}

hvd_result_t hvd__odev_flag_reset(const char *who, hvd__odev_t *d) {
  (void)d;
  return no_cuda(who);
}

hvd_result_t hvd__odev_flag_read(const char *who, hvd__odev_t *d, int *out) {
  (void)d;
  *out = 0;
  return no_cuda(who);
}

hvd_result_t hvd__odev_to_master(const char *who, hvd__odev_t *d,
                                 const void *src, hvd_dtype_t dtype, float *dst,
                                 int64_t n, double factor) {
  (void)d;
  (void)src;
  (void)dtype;
  (void)dst;
  (void)n;
  (void)factor;
  return no_cuda(who);
}

hvd_result_t hvd__odev_to_master_batch(const char *who, hvd__odev_t *d,
                                       const hvd__odev_convert_t *c, int n,
                                       double factor) {
  (void)d;
  (void)c;
  (void)factor;
  return n == 0 ? HVD_SUCCESS : no_cuda(who);
}

hvd_result_t hvd__odev_from_master_batch(const char *who, hvd__odev_t *d,
                                         const hvd__odev_convert_t *c, int n) {
  (void)d;
  (void)c;
  return n == 0 ? HVD_SUCCESS : no_cuda(who);
}

hvd_result_t hvd__odev_refresh_master(const char *who, hvd__odev_t *d,
                                      const void *value, hvd_dtype_t dtype,
                                      float *master, int64_t n) {
  (void)d;
  (void)value;
  (void)dtype;
  (void)master;
  (void)n;
  return no_cuda(who);
}

void hvd__odev_close(hvd__odev_t *d) { free(d); }

hvd_result_t hvd__odev_calloc(const char *who, hvd__odev_t *d, size_t bytes,
                              void **out) {
  (void)d;
  (void)bytes;
  *out = NULL;
  return no_cuda(who);
}

void hvd__odev_free(int dev, void *p) {
  (void)dev;
  (void)p;
}

hvd_result_t hvd__odev_zero(const char *who, hvd__odev_t *d, void *p,
                            size_t bytes) {
  (void)d;
  (void)p;
  (void)bytes;
  return no_cuda(who);
}

hvd_result_t hvd__odev_scale(const char *who, hvd__odev_t *d, float *x,
                             int64_t n, double factor) {
  (void)d;
  (void)x;
  (void)n;
  (void)factor;
  return no_cuda(who);
}

hvd_result_t hvd__odev_update(const char *who, hvd__odev_t *d, int kind,
                              const void *options, const hvd_param_t *params,
                              int n, const hvd_tensor_t *state, int nstate,
                              int64_t step, double lr,
                              const unsigned char *only) {
  (void)d;
  (void)only;
  (void)kind;
  (void)options;
  (void)state;
  (void)nstate;
  (void)step;
  (void)lr;
  for (int i = 0; i < n; i++)
    if (params[i].value.device != HVD_CPU)
      return no_cuda(who);
  return HVD_SUCCESS;
}

hvd_result_t hvd__odev_norm_batch(const char *who, hvd__odev_t *d,
                                  const float *const *x, const int64_t *count,
                                  int n, double *out) {
  (void)d;
  (void)x;
  (void)count;
  (void)out;
  return n > 0 ? no_cuda(who) : HVD_SUCCESS;
}

hvd_result_t hvd__odev_lamb_norms(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step,
                                  double *out) {
  (void)d;
  (void)p;
  (void)o;
  (void)step;
  (void)out;
  return n > 0 ? no_cuda(who) : HVD_SUCCESS;
}

hvd_result_t hvd__odev_lamb_apply(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step) {
  (void)d;
  (void)p;
  (void)o;
  (void)step;
  return n > 0 ? no_cuda(who) : HVD_SUCCESS;
}

hvd_result_t hvd__odev_psgd(const char *who, hvd__odev_t *d,
                            hvd__odev_psgd_op_t op, const hvd__odev_psgd_t *x,
                            double factor, float inv, int keep) {
  (void)d;
  (void)op;
  (void)x;
  (void)factor;
  (void)inv;
  (void)keep;
  return no_cuda(who);
}

hvd_result_t hvd__odev_copy_async(const char *who, hvd__odev_t *d, void *dst,
                                  const void *src, size_t bytes,
                                  int to_device) {
  (void)d;
  (void)dst;
  (void)src;
  (void)to_device;
  return bytes == 0 ? HVD_SUCCESS : no_cuda(who);
}

void *hvd__odev_stream(const hvd__odev_t *d) {
  (void)d;
  return NULL;
}

hvd_result_t hvd__odev_after_caller(const char *who, hvd__odev_t *d) {
  (void)d;
  return no_cuda(who);
}

hvd_result_t hvd__odev_sync(const char *who, hvd__odev_t *d) {
  (void)who;
  (void)d;
  return HVD_SUCCESS;
}

hvd_result_t hvd__odev_read(const char *who, void *dst, const hvd_tensor_t *t,
                            size_t offset, size_t bytes) {
  (void)dst;
  (void)t;
  (void)offset;
  (void)bytes;
  return no_cuda(who);
}

hvd_result_t hvd__odev_write(const char *who, hvd_tensor_t *t, size_t offset,
                             const void *src, size_t bytes) {
  (void)t;
  (void)offset;
  (void)src;
  (void)bytes;
  return no_cuda(who);
}

hvd_result_t hvd__odev_copy(const char *who, hvd_tensor_t *t, size_t offset,
                            const void *src, size_t bytes) {
  (void)t;
  (void)offset;
  (void)src;
  (void)bytes;
  return no_cuda(who);
}

#endif /* HVD_HAVE_CUDA */

hvd_result_t hvd__odev_allreduce_async(hvd__odev_t *d, const char *name,
                                       hvd_tensor_t *t, hvd_op_t op,
                                       hvd_dtype_t wire, hvd_request_t **req) {
  const int under = t->device != HVD_CPU && d != NULL;
  void *caller = hvd_cuda_stream();
  hvd_result_t rc = HVD_SUCCESS;
  if (under)
    rc = hvd_cuda_set_stream(hvd__odev_stream(d));
  if (rc == HVD_SUCCESS)
    rc = wire == t->dtype
             ? hvd_allreduce_async(name, t, t, op, 1, 1, req)
             : hvd__allreduce_wire_async(name, t, t, op, 1, 1, wire, req);
  if (under)
    (void)hvd_cuda_set_stream(caller);
  return rc;
}
