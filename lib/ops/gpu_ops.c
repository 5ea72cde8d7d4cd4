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

void hvd__gpu_init(hvd__gpu_t *g, const hvd__exec_env_t *env) {
  memset(g, 0, sizeof *g);
  g->dev = -1;
  g->cur = &g->slot[0];
  if (env != NULL) {
    g->quiesce = env->quiesce;
    g->quiesce_ctx = env->quiesce_ctx;
    g->timing = env->gpu_timing;
  }
}

void hvd__gpu_quiesce(hvd__gpu_t *g) {
  if (g->quiesce != NULL)
    g->quiesce(g->quiesce_ctx);
}

/* hvd's stream, at the device's greatest priority: the collectives that
 * the backward pass waits for go before the compute queued beside them;
 * the slots' events, and the timing events when HVD_GPU_TIMING=1. */
static hvd_result_t create_stream(hvd__gpu_t *g) {
  hvd_result_t rc = HVD_SUCCESS;
  int least = 0, greatest = 0, made = 0;
  HVD__CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  HVD__CUDA_CHECK(cudaStreamCreateWithPriority(
      &g->stream, cudaStreamNonBlocking, greatest));
  for (; made < HVD__GPU_SLOTS; made++) {
    cudaError_t err =
        cudaEventCreateWithFlags(&g->slot[made].done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      rc = hvd__cuda_error(err, "cudaEventCreateWithFlags");
      break;
    }
  }
  if (rc == HVD_SUCCESS)
    rc = hvd__gpu_timing_open(g);
  if (rc != HVD_SUCCESS) {
    while (made-- > 0)
      cudaEventDestroy(g->slot[made].done);
    cudaStreamDestroy(g->stream);
  }
fail:
  return rc;
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
    HVD__CHECK(create_stream(g));
    g->dev = dev;
  }
  /* after the work the callers enqueued before submitting (hvd.h, "Device
   * ordering"), on the device: the host does not wait */
  for (int i = 0; w != NULL && i < w->n; i++)
    if (!w->reqs[i]->is_stub && w->reqs[i]->ready != NULL)
      HVD__CUDA_CHECK(
          cudaStreamWaitEvent(g->stream, (cudaEvent_t)w->reqs[i]->ready, 0));
  HVD__CHECK(hvd__gpu_timing_start(g, w)); /* the group starts here */
fail:
  return rc;
}

/* Polls slot's event until it has fired (or, without wait, once). */
static hvd_result_t query(hvd__gpu_slot_t *slot, int wait, const char *what,
                          hvd__gpu_poll_fn poll, void *ctx, int *ran) {
  for (unsigned spin = 0;; spin++) {
    cudaError_t err = cudaEventQuery(slot->done);
    *ran = err == cudaSuccess;
    if (*ran)
      return HVD_SUCCESS;
    if (err != cudaErrorNotReady)
      return hvd__cuda_error(err, what);
    if (poll != NULL) {
      hvd_result_t rc = poll(ctx, hvd__now() - slot->launched);
      if (rc != HVD_SUCCESS)
        return rc;
    }
    if (!wait)
      return HVD_SUCCESS;
    hvd__wait_backoff(spin);
  }
}

/* g->cur's event recorded after the work enqueued so far, now; with
 * `end` the group ends there (its timing). */
static hvd_result_t record_cur(hvd__gpu_t *g, int end) {
  hvd_result_t rc = HVD_SUCCESS;
  g->cur->timed = -1;
  if (end)
    rc = hvd__gpu_timing_end(g, &g->cur->timed);
  cudaError_t err = rc == HVD_SUCCESS ? cudaEventRecord(g->cur->done, g->stream)
                                      : cudaSuccess;
  if (err != cudaSuccess)
    rc = hvd__cuda_error(err, "cudaEventRecord");
  if (rc != HVD_SUCCESS) {
    hvd__gpu_timing_over(g, g->cur->timed, 0);
    return rc;
  }
  g->cur->launched = hvd__now();
  return HVD_SUCCESS;
}

/* Records g->cur's event and waits for it; `end`: as record_cur. */
static hvd_result_t wait_cur(hvd__gpu_t *g, int end, const char *what,
                             hvd__gpu_poll_fn poll, void *ctx) {
  int ran = 0;
  hvd_result_t rc = record_cur(g, end);
  if (rc != HVD_SUCCESS)
    return rc;
  rc = query(g->cur, 1, what, poll, ctx, &ran);
  hvd__gpu_timing_over(g, g->cur->timed, rc == HVD_SUCCESS && ran);
  return rc;
}

hvd_result_t hvd__gpu_wait(hvd__gpu_t *g, const char *what,
                           hvd__gpu_poll_fn poll, void *ctx) {
  return wait_cur(g, 1, what, poll, ctx);
}

hvd_result_t hvd__gpu_sync(hvd__gpu_t *g, const char *what) {
  return wait_cur(g, 0, what, NULL, NULL);
}

hvd_result_t hvd__gpu_launch(hvd__gpu_t *g) {
  hvd_result_t rc = record_cur(g, 1);
  if (rc != HVD_SUCCESS)
    return rc;
  g->cur->failed = 0;
  g->flying++;
  g->cur = &g->slot[(g->head + g->flying) % HVD__GPU_SLOTS];
  return HVD_SUCCESS;
}

hvd__gpu_slot_t *hvd__gpu_oldest(hvd__gpu_t *g) {
  return g->flying > 0 ? &g->slot[g->head] : NULL;
}

hvd_result_t hvd__gpu_query(hvd__gpu_t *g, int wait, const char *what,
                            hvd__gpu_poll_fn poll, void *ctx, int *ran) {
  return query(&g->slot[g->head], wait, what, poll, ctx, ran);
}

void hvd__gpu_retire(hvd__gpu_t *g) {
  hvd__gpu_slot_t *slot = &g->slot[g->head];
  hvd__gpu_timing_over(g, slot->timed, !slot->failed);
  g->head = (g->head + 1) % HVD__GPU_SLOTS;
  g->flying--; /* cur stays: (head + flying) is unchanged */
}

void hvd__gpu_mark_failed(hvd__gpu_t *g) {
  for (int k = 0; k < g->flying; k++) {
    hvd__gpu_slot_t *slot = &g->slot[(g->head + k) % HVD__GPU_SLOTS];
    if (cudaEventQuery(slot->done) != cudaSuccess)
      slot->failed = 1;
  }
  (void)cudaGetLastError();
}

hvd_result_t hvd__gpu_spans(hvd__gpu_t *g, int n) {
  hvd__gpu_slot_t *c = g->cur;
  if (n <= c->span_cap)
    return HVD_SUCCESS;
  hvd__gpu_quiesce(g); /* frees pinned and device memory */
  return hvd__cuda_twin_grow((void **)&c->spans, (void **)&c->dspans,
                             &c->span_cap, n, sizeof *c->spans, 64, 1);
}

hvd_result_t hvd__gpu_upload_spans(hvd__gpu_t *g, int n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n > 0)
    HVD__CUDA_CHECK(cudaMemcpyAsync(g->cur->dspans, g->cur->spans,
                                    (size_t)n * sizeof *g->cur->spans,
                                    cudaMemcpyHostToDevice, g->stream));
fail:
  return rc;
}

hvd_result_t hvd__gpu_buffer(hvd__gpu_t *g, size_t n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= g->buf_cap)
    return HVD_SUCCESS;
  size_t cap = n < ((size_t)1 << 20) ? (size_t)1 << 20 : n;
  hvd__gpu_quiesce(g);
  cudaFree(g->buf);
  g->buf = NULL;
  g->buf_cap = 0;
  HVD__CUDA_CHECK(cudaMalloc(&g->buf, cap));
  g->buf_cap = cap;
fail:
  return rc;
}

int hvd__gpu_grows(const hvd__gpu_t *g, size_t buf_bytes, int spans) {
  return buf_bytes > g->buf_cap || spans > g->cur->span_cap;
}

static void free_spans(hvd__gpu_t *g) {
  for (int i = 0; i < HVD__GPU_SLOTS; i++) {
    hvd__gpu_slot_t *c = &g->slot[i];
    hvd__cuda_twin_free((void **)&c->spans, (void **)&c->dspans, &c->span_cap,
                        1);
  }
}

void hvd__gpu_release(hvd__gpu_t *g) {
  hvd__gpu_quiesce(g);
  cudaFree(g->buf);
  g->buf = NULL;
  g->buf_cap = 0;
  free_spans(g);
}

hvd_result_t hvd__gpu_alloc_output(hvd__gpu_t *g, hvd_request_t *r, int ndim,
                                   const int64_t *shape) {
  hvd_result_t rc = HVD_SUCCESS;
  if (r->recv_given) /* the caller's memory: nothing to allocate */
    return hvd__given_output(r, ndim, shape);
  hvd_tensor_t *t = &r->recv;
  memset(t, 0, sizeof *t);
  t->dtype = r->desc.dtype;
  t->device = g->dev;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  size_t bytes = hvd__tensor_bytes(t);
  hvd__gpu_quiesce(g);
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
  hvd__gpu_quiesce(g);
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
  hvd__gpu_quiesce(state);
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
  if (g->dev < 0 && g->buf == NULL && g->slot[0].spans == NULL)
    return;
  /* maybe the caller's thread (hvd_shutdown after a failure): its current
   * device is put back */
  if (cudaGetDevice(&caller) != cudaSuccess)
    caller = -1;
  if (g->dev >= 0 && cudaSetDevice(g->dev) == cudaSuccess) {
    cudaStreamSynchronize(g->stream);
    for (int i = 0; i < HVD__GPU_SLOTS; i++)
      cudaEventDestroy(g->slot[i].done);
    hvd__gpu_timing_close(g);
    cudaStreamDestroy(g->stream);
  }
  hvd__gpu_timing_close(g); /* the ready lists, whatever the device */
  free_spans(g);
  cudaFree(g->buf);
  if (caller >= 0)
    cudaSetDevice(caller);
  (void)cudaGetLastError(); /* nothing to report from a teardown */
  void (*q)(void *) = g->quiesce;
  void *qctx = g->quiesce_ctx;
  int timing = g->timing;
  hvd__gpu_init(g, NULL);
  g->quiesce = q;
  g->quiesce_ctx = qctx;
  g->timing = timing;
}
