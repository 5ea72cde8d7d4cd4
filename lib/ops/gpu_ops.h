/*
 * gpu_ops.h - what the two device executors (nccl_ops.c, staged_ops.c)
 * share: the rank's GPU and hvd's own stream on it, waiting for that
 * stream without holding a core, device scratch and span arrays for the
 * batched kernels, outputs and joined-rank stubs in device memory.
 *
 * Only in builds with CUDA (HVD_HAVE_CUDA); needs config.h first. Engine
 * thread only (an executor's state belongs to it), except hvd__gpu_close.
 *
 * Ordering with the caller's work: hvd's stream is cudaStreamNonBlocking
 * and, in hvd__gpu_enter, waits (cudaStreamWaitEvent) for each request's
 * ready event, recorded at submission on the submitting thread's stream
 * (base/device_order.c). Every collective ends by recording an event on
 * hvd's stream and waiting for it, so when hvd_wait returns the results
 * are complete and visible to every stream of the device.
 */
#ifndef HVD_OPS_GPU_OPS_H
#define HVD_OPS_GPU_OPS_H

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "base/device.h"
#include "ops/cuda_kernels.h"
#include "ops/executor.h"

typedef struct hvd__gpu {
  int dev;                  /* where everything below lives; -1: not yet */
  cudaStream_t stream;      /* hvd's stream (cudaStreamNonBlocking) */
  cudaEvent_t done;         /* recorded after each collective's work */
  hvd__cuda_span_t *spans;  /* span arrays, built here (pinned host) */
  hvd__cuda_span_t *dspans; /* and uploaded here (device) */
  int span_cap;
  void *buf; /* device scratch: the fusion buffer, padded blocks */
  size_t buf_cap;
} hvd__gpu_t;

/* A zeroed hvd__gpu_t with dev -1. */
void hvd__gpu_init(hvd__gpu_t *g);

/* Before a collective: makes the work's device current on this thread
 * (the device of its first real tensor; a stub-only group uses the device
 * already in use, else hvd__cuda_home_device()) and creates the stream and
 * event the first time. Every tensor of a rank must be on one device for
 * the life of hvd: another one fails with HVD_ERR_INVALID_ARG ("<who>:
 * tensor 'n' is on cuda:1 but hvd's GPU resources are on cuda:0"), which
 * with HVD_NO_BIND=1 means the caller changed its current device. */
hvd_result_t hvd__gpu_enter(hvd__gpu_t *g, const hvd__work_t *w,
                            const char *who);

/* Called between polls of hvd__gpu_wait with the seconds waited so far;
 * a failure ends the wait with it. */
typedef hvd_result_t (*hvd__gpu_poll_fn)(void *ctx, double waited_s);

/* Records g->done on hvd's stream and waits for it: cudaEventQuery polled
 * with hvd__mpi_wait's policy (hvd__wait_backoff), poll (may be NULL)
 * called after each unsuccessful query. A CUDA error is HVD_ERR_CUDA
 * "<what>: ...". */
hvd_result_t hvd__gpu_wait(hvd__gpu_t *g, const char *what,
                           hvd__gpu_poll_fn poll, void *ctx);

/* g->spans and g->dspans hold at least n spans. */
hvd_result_t hvd__gpu_spans(hvd__gpu_t *g, int n);
/* Copies g->spans[0..n) to g->dspans on hvd's stream. */
hvd_result_t hvd__gpu_upload_spans(hvd__gpu_t *g, int n);
/* g->buf holds at least n bytes. Only between collectives (hvd's stream
 * idle): the old buffer is freed. */
hvd_result_t hvd__gpu_buffer(hvd__gpu_t *g, size_t n);

/* 1 when hvd__gpu_buffer(buf_bytes) or hvd__gpu_spans(spans) would
 * allocate: the same answer on every rank that ran the same collectives
 * (both grow only, from the same sizes). */
int hvd__gpu_grows(const hvd__gpu_t *g, size_t buf_bytes, int spans);
/* Drops the buffer and the span arrays (hvd's stream idle), so that after
 * a failed allocation every rank's grow the same way again. */
void hvd__gpu_release(hvd__gpu_t *g);

/* r's output (as hvd__alloc_output): dtype from r->desc, this shape, in
 * device memory on g->dev; hvd_tensor_free releases it. */
hvd_result_t hvd__gpu_alloc_output(hvd__gpu_t *g, hvd_request_t *r, int ndim,
                                   const int64_t *shape);

/* Both device executors' stub_alloc / stub_free (see executor.h): n
 * elements of the op's identity in device memory on the rank's GPU. Their
 * state must begin with its hvd__gpu_t. */
hvd_result_t hvd__gpu_stub_alloc(void *state, const hvd__exec_env_t *env,
                                 hvd_request_t *r);
void hvd__gpu_stub_free(void *state, hvd_request_t *r);

/* The timeline's span of one request (not for stubs). */
void hvd__gpu_trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                    const char *phase, double t0, double t1);

/* Releases everything (any thread): waits for hvd's stream first. */
void hvd__gpu_close(hvd__gpu_t *g);

#endif /* HVD_HAVE_CUDA */

#endif /* HVD_OPS_GPU_OPS_H */
