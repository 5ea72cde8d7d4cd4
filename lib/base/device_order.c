/*
 * device_order.c - device collectives ordered after the caller's work on
 * the device, not by the host (hvd.h, "Device ordering"): at submission
 * an event is recorded on the submitting thread's stream (hvd_cuda_set_
 * stream; the legacy default stream unless set), and the executor's stream
 * waits for it (cudaStreamWaitEvent) before it reads the tensor. Horovod
 * records such a ready event per tensor; DDP records one on the current
 * stream. Events come from a pool per device: creating one per request
 * would cost more than recording it.
 */
#include <config.h>

#include <pthread.h>
#include <stdlib.h>

#include "base/device.h"
#include "hvd.h"

/* The submitting thread's stream; NULL: the legacy default stream. */
static _Thread_local void *order_stream;

hvd_result_t hvd_cuda_set_stream(void *stream) {
#ifdef HVD_HAVE_CUDA
  order_stream = stream;
  return HVD_SUCCESS;
#else
  (void)stream;
  return hvd__set_error(HVD_ERR_UNSUPPORTED,
                        "hvd_cuda_set_stream: this build has no CUDA");
#endif
}

void *hvd_cuda_stream(void) { return order_stream; }

#ifdef HVD_HAVE_CUDA

#define POOL_DEVICES 64

/* Free events of each device, a stack under mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int closed; /* drained (hvd_shutdown): events coming back are freed */
static int timing; /* HVD_GPU_TIMING: events made with timing */
static struct {
  cudaEvent_t *ev;
  size_t n, cap;
} pool[POOL_DEVICES];

void hvd__cuda_ready_timing(int on) {
  pthread_mutex_lock(&mu);
  timing = on;
  pthread_mutex_unlock(&mu);
}

static int ready_timing(void) {
  pthread_mutex_lock(&mu);
  int on = timing;
  pthread_mutex_unlock(&mu);
  return on;
}

static cudaEvent_t pool_take(int dev) {
  cudaEvent_t e = NULL;
  pthread_mutex_lock(&mu);
  closed = 0;
  if (pool[dev].n > 0)
    e = pool[dev].ev[--pool[dev].n];
  pthread_mutex_unlock(&mu);
  return e;
}

/* On the event's device only; the pool keeps at most 4096 of each. */
static void pool_put(int dev, cudaEvent_t e) {
  pthread_mutex_lock(&mu);
  if (!closed && pool[dev].n == pool[dev].cap && pool[dev].cap < 4096) {
    size_t cap = pool[dev].cap ? 2 * pool[dev].cap : 64;
    cudaEvent_t *p = realloc(pool[dev].ev, cap * sizeof *p);
    if (p != NULL) {
      pool[dev].ev = p;
      pool[dev].cap = cap;
    }
  }
  if (!closed && pool[dev].n < pool[dev].cap) {
    pool[dev].ev[pool[dev].n++] = e;
    e = NULL;
  }
  pthread_mutex_unlock(&mu);
  if (e != NULL)
    cudaEventDestroy(e);
}

hvd_result_t hvd__cuda_ready_event(int dev, void **out) {
  hvd_result_t rc = HVD_SUCCESS;
  int cur = -1;
  cudaEvent_t e = NULL;
  *out = NULL;
  if (dev < 0 || dev >= POOL_DEVICES)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "device %d", dev);
  HVD__CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != dev) /* the legacy stream is the current device's */
    HVD__CUDA_CHECK(cudaSetDevice(dev));
  e = pool_take(dev);
  if (e == NULL)
    HVD__CUDA_CHECK(cudaEventCreateWithFlags(
        &e, ready_timing() ? cudaEventDefault : cudaEventDisableTiming));
  HVD__CUDA_CHECK(cudaEventRecord(e, (cudaStream_t)order_stream));
  *out = e;
  e = NULL;
fail:
  if (e != NULL)
    pool_put(dev, e);
  if (cur >= 0 && cur != dev)
    cudaSetDevice(cur);
  return rc;
}

hvd_result_t hvd__cuda_stream_wait_event(int dev, void *stream, void *event) {
  hvd_result_t rc = HVD_SUCCESS;
  int cur = -1;
  HVD__CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != dev) /* the legacy stream is the current device's */
    HVD__CUDA_CHECK(cudaSetDevice(dev));
  HVD__CUDA_CHECK(
      cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
fail:
  if (cur >= 0 && cur != dev)
    cudaSetDevice(cur);
  return rc;
}

void hvd__cuda_ready_put(int dev, void *event) {
  if (event != NULL && dev >= 0 && dev < POOL_DEVICES)
    pool_put(dev, (cudaEvent_t)event);
}

void hvd__cuda_ready_drain(void) {
  pthread_mutex_lock(&mu);
  closed = 1;
  for (int d = 0; d < POOL_DEVICES; d++) {
    for (size_t i = 0; i < pool[d].n; i++)
      cudaEventDestroy(pool[d].ev[i]);
    free(pool[d].ev);
    pool[d].ev = NULL;
    pool[d].n = pool[d].cap = 0;
  }
  pthread_mutex_unlock(&mu);
}

#else /* !HVD_HAVE_CUDA */

hvd_result_t hvd__cuda_ready_event(int dev, void **out) {
  (void)dev;
  *out = NULL;
  return HVD_SUCCESS;
}

void hvd__cuda_ready_put(int dev, void *event) {
  (void)dev;
  (void)event;
}

hvd_result_t hvd__cuda_stream_wait_event(int dev, void *stream, void *event) {
  (void)dev;
  (void)stream;
  (void)event;
  return hvd__set_error(HVD_ERR_UNSUPPORTED, "this build has no CUDA");
}

void hvd__cuda_ready_drain(void) {}

void hvd__cuda_ready_timing(int on) { (void)on; }

#endif /* HVD_HAVE_CUDA */
