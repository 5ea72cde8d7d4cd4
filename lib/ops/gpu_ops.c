/*
 * gpu_ops.c - the device executors' shared parts (gpu_ops.h): the rank's
 * GPU, hvd's stream, waiting, scratch and span arrays, device outputs and
 * joined-rank stubs. Built only with CUDA.
 */
#include <config.h>

#include "ops/gpu_ops.h"

#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "ops/mpi_ops.h"
#include "ops/reduce.h"

void hvd__gpu_init(hvd__gpu_t *g) {
  memset(g, 0, sizeof *g);
  g->dev = -1;
}

/* The device of w's first real tensor, or -1 (stubs only, or no work). */
static int work_device(const hvd__work_t *w, const char **name) {
  for (int i = 0; w != NULL && i < w->n; i++)
    if (!w->reqs[i]->is_stub) {
      *name = w->reqs[i]->name;
      return w->reqs[i]->send.device;
    }
  return -1;
}

hvd_result_t hvd__gpu_enter(hvd__gpu_t *g, const hvd__work_t *w,
                            const char *who) {
  hvd_result_t rc = HVD_SUCCESS;
  const char *name = "";
  int dev = work_device(w, &name);
  if (dev < 0)
    dev = g->dev >= 0 ? g->dev : hvd__cuda_home_device();
  if (dev < 0)
    return hvd__set_error(HVD_ERR_CUDA, "%s: this rank has no CUDA device",
                          who);
  if (g->dev >= 0 && dev != g->dev)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: tensor '%s' is on cuda:%d but hvd's GPU "
                          "resources are on cuda:%d (one device per rank; "
                          "with HVD_NO_BIND=1 keep the current device)",
                          who, name, dev, g->dev);
  HVD__CUDA_CHECK(cudaSetDevice(dev));
  if (g->dev < 0) {
    HVD__CUDA_CHECK(
        cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    cudaError_t err =
        cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaStreamDestroy(g->stream);
      rc = hvd__cuda_error(err, "cudaEventCreateWithFlags");
      goto fail;
    }
    g->dev = dev;
  }
  /* after the work the callers enqueued before submitting (hvd.h, "Device
   * ordering"), on the device: the host does not wait */
  for (int i = 0; w != NULL && i < w->n; i++)
    if (!w->reqs[i]->is_stub && w->reqs[i]->ready != NULL)
      HVD__CUDA_CHECK(
          cudaStreamWaitEvent(g->stream, (cudaEvent_t)w->reqs[i]->ready, 0));
fail:
  return rc;
}

hvd_result_t hvd__gpu_wait(hvd__gpu_t *g, const char *what,
                           hvd__gpu_poll_fn poll, void *ctx) {
  cudaError_t err = cudaEventRecord(g->done, g->stream);
  if (err != cudaSuccess)
    return hvd__cuda_error(err, "cudaEventRecord");
  double t0 = hvd__now();
  for (unsigned spin = 0;; spin++) {
    err = cudaEventQuery(g->done);
    if (err == cudaSuccess)
      return HVD_SUCCESS;
    if (err != cudaErrorNotReady)
      return hvd__cuda_error(err, what);
    if (poll != NULL) {
      hvd_result_t rc = poll(ctx, hvd__now() - t0);
      if (rc != HVD_SUCCESS)
        return rc;
    }
    hvd__wait_backoff(spin);
  }
}

hvd_result_t hvd__gpu_spans(hvd__gpu_t *g, int n) {
  /* between collectives: the stream no longer reads the old arrays */
  return hvd__cuda_twin_grow((void **)&g->spans, (void **)&g->dspans,
                             &g->span_cap, n, sizeof *g->spans, 64, 1);
}

hvd_result_t hvd__gpu_upload_spans(hvd__gpu_t *g, int n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n > 0)
    HVD__CUDA_CHECK(cudaMemcpyAsync(g->dspans, g->spans,
                                    (size_t)n * sizeof *g->spans,
                                    cudaMemcpyHostToDevice, g->stream));
fail:
  return rc;
}

hvd_result_t hvd__gpu_buffer(hvd__gpu_t *g, size_t n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= g->buf_cap)
    return HVD_SUCCESS;
  size_t cap = n < ((size_t)1 << 20) ? (size_t)1 << 20 : n;
  cudaFree(g->buf);
  g->buf = NULL;
  g->buf_cap = 0;
  HVD__CUDA_CHECK(cudaMalloc(&g->buf, cap));
  g->buf_cap = cap;
fail:
  return rc;
}

int hvd__gpu_grows(const hvd__gpu_t *g, size_t buf_bytes, int spans) {
  return buf_bytes > g->buf_cap || spans > g->span_cap;
}

void hvd__gpu_release(hvd__gpu_t *g) {
  cudaFree(g->buf);
  g->buf = NULL;
  g->buf_cap = 0;
  hvd__cuda_twin_free((void **)&g->spans, (void **)&g->dspans, &g->span_cap, 1);
}

hvd_result_t hvd__gpu_alloc_output(hvd__gpu_t *g, hvd_request_t *r, int ndim,
                                   const int64_t *shape) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_tensor_t *t = &r->recv;
  memset(t, 0, sizeof *t);
  t->dtype = r->desc.dtype;
  t->device = g->dev;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  size_t bytes = hvd__tensor_bytes(t);
  cudaError_t err = cudaMalloc(&t->data, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    t->data = NULL;
    rc = hvd__cuda_error(err, "cudaMalloc");
  }
  return rc;
}

hvd_result_t hvd__gpu_stub_alloc(void *state, const hvd__exec_env_t *env,
                                 hvd_request_t *r) {
  (void)env;
  hvd__gpu_t *g = state; /* the executor state's first member */
  hvd_result_t rc = HVD_SUCCESS;
  void *host = NULL;
  int64_t n = hvd_tensor_numel(&r->send);
  size_t bytes = (size_t)n * hvd_dtype_size(r->send.dtype);
  r->send.data = NULL;
  HVD__CHECK(hvd__gpu_enter(g, NULL, "joined rank's stub"));
  host = malloc(bytes + 1);
  if (host == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "stub of %zu bytes", bytes);
    goto fail;
  }
  hvd__fill_identity(host, n, r->send.dtype, r->desc.op);
  HVD__CUDA_CHECK(cudaMalloc(&r->send.data, bytes + 1));
  HVD__CUDA_CHECK(cudaMemcpyAsync(r->send.data, host, bytes,
                                  cudaMemcpyHostToDevice, g->stream));
  HVD__CHECK(hvd__gpu_wait(g, "joined rank's stub", NULL, NULL));
  r->send.device = g->dev;
  r->recv = r->send;
  free(host);
  return HVD_SUCCESS;
fail:
  free(host);
  hvd__cuda_free(r->send.data);
  r->send.data = NULL;
  return rc;
}

void hvd__gpu_stub_free(void *state, hvd_request_t *r) {
  (void)state;
  hvd__cuda_free(r->send.data);
  r->send.data = r->recv.data = NULL;
}

void hvd__gpu_trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                    const char *phase, double t0, double t1) {
  if (env->trace != NULL && !r->is_stub)
    env->trace(env->trace_ctx, r, phase, t0, t1);
}

void hvd__gpu_close(hvd__gpu_t *g) {
  int caller = -1;
  if (g->dev < 0 && g->spans == NULL)
    return;
  /* maybe the caller's thread (hvd_shutdown after a failure): its current
   * device is put back */
  if (cudaGetDevice(&caller) != cudaSuccess)
    caller = -1;
  if (g->dev >= 0 && cudaSetDevice(g->dev) == cudaSuccess) {
    cudaStreamSynchronize(g->stream);
    cudaEventDestroy(g->done);
    cudaStreamDestroy(g->stream);
  }
  cudaFreeHost(g->spans);
  cudaFree(g->dspans);
  cudaFree(g->buf);
  if (caller >= 0)
    cudaSetDevice(caller);
  (void)cudaGetLastError(); /* nothing to report from a teardown */
  hvd__gpu_init(g);
}
