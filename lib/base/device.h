/*
 * device.h - what hvd needs to know about CUDA outside the kernels: the
 * build facts (hvd_cuda_built, hvd_nccl_built in hvd.h), the device count,
 * which device this rank is bound to, the binding itself at hvd_init, and
 * CUDA runtime errors as hvd results. Included from C and from the CUDA
 * sources (nvcc, C++); needs config.h first. The CUDA error part exists
 * only in a build with CUDA.
 */
#ifndef HVD_BASE_DEVICE_H
#define HVD_BASE_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "base/errors.h"

/* Number of CUDA devices this process sees (0 without CUDA, a driver or a
 * GPU). */
int hvd__cuda_device_count(void);

/* hvd_init's GPU binding (collective over comm). With CUDA built and a GPU
 * visible, and unless no_bind (HVD_NO_BIND=1): makes device local_rank % count
 * the calling thread's current device, then fails (HVD_ERR_CUDA, on every rank)
 * when two ranks of local_comm are on the same GPU or a rank could not bind.
 * With share (HVD_GPU_SHARE=1) ranks may share a GPU, and NCCL is told they
 * are on separate hosts (NCCL_HOSTID per rank, NCCL_IB_DISABLE=1, each only
 * when unset), which makes it connect them over sockets: slow, but real
 * NCCL between ranks on one GPU. Without CUDA or a GPU: nothing. */
#ifndef __CUDACC__ /* nvcc's include path has no mpi.h */
#include <mpi.h>
hvd_result_t hvd__cuda_bind(MPI_Comm comm, MPI_Comm local_comm, int no_bind,
                            int share);
#endif

/* The device hvd__cuda_bind bound this process to, or -1. */
int hvd__cuda_device(void);

/* The device of this rank's device tensors: the bound one; without one
 * (HVD_NO_BIND=1) the calling thread's current device; -1 without CUDA or
 * a GPU. */
int hvd__cuda_rank_device(void);

/* The device whose memory p points into, by the CUDA runtime, or -1: host
 * memory (pageable or pinned), managed memory, no answer, no CUDA. Asks only
 * in a process bound to a GPU (hvd__cuda_device() >= 0), which has a CUDA
 * context already: never makes one. */
int hvd__cuda_device_memory(const void *p);

/* 1 when p is pageable host memory (not pinned, not managed, unknown to
 * CUDA) and `device` cannot reach such memory (no HMM or ATS: the
 * device attribute cudaDevAttrPageableMemoryAccess, asked once): a device
 * tensor's data there would fault on the GPU. 0 otherwise, and without
 * CUDA. For device tensors, whose caller uses CUDA already. */
int hvd__cuda_unreachable_host(const void *p, int device);

/* Where hvd's own device resources go before any tensor says (a joined
 * rank's stubs in its first device collective): the bound device; without
 * one (HVD_NO_BIND=1) the device that was current on the thread that called
 * hvd_init; -1 without CUDA or a GPU. The engine thread cannot ask for its
 * own current device: it is not the caller's. */
int hvd__cuda_home_device(void);

/* Device ordering (device_order.c): an event recorded now on the calling
 * thread's stream (hvd_cuda_set_stream; the legacy default stream of
 * device dev unless set), taken from a pool; NULL without CUDA. The
 * executor's stream waits for it before reading the tensor. _put gives it
 * back (NULL: nothing). */
hvd_result_t hvd__cuda_ready_event(int dev, void **out);
void hvd__cuda_ready_put(int dev, void *event);
/* cudaStreamWaitEvent(stream, event) with device dev current (stream NULL:
 * dev's legacy default stream). */
hvd_result_t hvd__cuda_stream_wait_event(int dev, void *stream, void *event);
/* hvd_shutdown: the pooled events are destroyed, and those of requests
 * freed later too (until the next ready event). */
void hvd__cuda_ready_drain(void);
/* hvd_init, before any ready event: on (HVD_GPU_TIMING=1) makes the
 * ready events with timing (cudaEventElapsedTime can read them), off
 * without (cudaEventDisableTiming: cheaper to record and wait for). The
 * pool was drained at the last hvd_shutdown, so its events are made
 * under one setting. */
void hvd__cuda_ready_timing(int on);

/* Frees device memory hvd allocated (cudaFree; nothing for NULL). In a
 * build without CUDA there is none: free(), as for host memory. */
void hvd__cuda_free(void *p);

#ifdef __cplusplus
}
#endif

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* HVD_ERR_CUDA with "<what>: <cudaGetErrorString> (<cudaGetErrorName>)",
 * what cut at its first '(' as for hvd__mpi_error; also clears CUDA's
 * last error, so that the next check does not see it again. */
hvd_result_t hvd__cuda_error(cudaError_t err, const char *what);

/* Grows a pair of arrays of `size`-byte entries, *host (pinned when
 * `pinned`, else malloc'd) and its device twin *dev, to hold at least n
 * entries (*cap from `first`, doubling); the old contents are dropped.
 * Only while no stream reads the arrays. On failure both are NULL and
 * *cap 0; release them with hvd__cuda_twin_free. */
hvd_result_t hvd__cuda_twin_grow(void **host, void **dev, int *cap, int n,
                                 size_t size, int first, int pinned);
void hvd__cuda_twin_free(void **host, void **dev, int *cap, int pinned);

#ifdef __cplusplus
}
#endif

/* Jump to the function's `fail:` label when a CUDA runtime call fails.
 * Needs a local `hvd_result_t rc`. */
#define HVD__CUDA_CHECK(call)                                                  \
  do {                                                                         \
    cudaError_t hvd__cuda_rc_ = (call);                                        \
    if (hvd__cuda_rc_ != cudaSuccess) {                                        \
      rc = hvd__cuda_error(hvd__cuda_rc_, #call);                              \
      goto fail;                                                               \
    }                                                                          \
  } while (0)

#endif /* HVD_HAVE_CUDA */

#endif /* HVD_BASE_DEVICE_H */
