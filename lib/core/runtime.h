/*
 * runtime.h - process-wide state: MPI ownership, hvd's communicators,
 * topology, settings and the engine.
 */
#ifndef HVD_CORE_RUNTIME_H
#define HVD_CORE_RUNTIME_H

#include "core/engine.h"

/* The running engine, or NULL before hvd_init / after hvd_shutdown. */
hvd__engine_t *hvd__runtime_engine(void);

/* Hands r to the engine (see hvd__engine_submit) unless hvd is not
 * initialised (then "<fn>: hvd_init() has not been called"). Safe against
 * a concurrent hvd_shutdown. On failure the caller still owns r. */
hvd_result_t hvd__runtime_submit(const char *fn, hvd_request_t *r);

/* HVD_ERR_NOT_INITIALIZED with "<fn>: hvd_init() has not been called". */
hvd_result_t hvd__not_initialized(const char *fn);

/* Number of CUDA devices this process sees (0 without CUDA, a driver or a
 * GPU). Defined in lib/ops/cuda_rt.c. */
int hvd__cuda_device_count(void);

/* hvd_init's GPU binding (collective over comm; lib/ops/cuda_rt.c). With
 * CUDA built and a GPU visible, and unless no_bind (HVD_NO_BIND=1): makes
 * device local_rank % count the calling thread's current device, then
 * fails (HVD_ERR_CUDA, on every rank) when two ranks of local_comm are on
 * the same GPU or a rank could not bind. Without CUDA or a GPU: nothing. */
hvd_result_t hvd__cuda_bind(MPI_Comm comm, MPI_Comm local_comm, int no_bind);

/* The device hvd__cuda_bind bound this process to, or -1. */
int hvd__cuda_device(void);

/* The device of this rank's device tensors: the bound one; without one
 * (HVD_NO_BIND=1) the calling thread's current device; -1 without CUDA or
 * a GPU. */
int hvd__cuda_rank_device(void);

/* Where hvd's own device resources go before any tensor says (a joined
 * rank's stubs in its first device collective): the bound device; without
 * one (HVD_NO_BIND=1) the device that was current on the thread that called
 * hvd_init; -1 without CUDA or a GPU. The engine thread cannot ask for its
 * own current device: it is not the caller's. */
int hvd__cuda_home_device(void);

/* Frees device memory hvd allocated (cudaFree; nothing for NULL). In a
 * build without CUDA there is none: free(), as for host memory. */
void hvd__cuda_free(void *p);

#endif /* HVD_CORE_RUNTIME_H */
