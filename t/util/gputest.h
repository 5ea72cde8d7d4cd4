/*
 * gputest.h - what every GPU test (t/gpu) does first: make sure a CUDA
 * device is there, or skip the whole test with the reason; and the CUDA
 * calls the GPU tests (and t/standin's) make themselves, checked. Header-only:
 * the CUDA part needs the CUDA headers, which only the GPU tests are
 * compiled with. Include it after <config.h>.
 */
#ifndef HVD_T_GPUTEST_H
#define HVD_T_GPUTEST_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tap.h"

/* Seconds on the monotonic clock: how long a failure took to come. */
static inline double gpu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The skip reason of every GPU test in a build without CUDA. */
#define GPU_TEST_NO_CUDA                                                       \
  "no CUDA device: this build has no CUDA (configure found no toolkit, or "    \
  "--without-cuda)"

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "hvd.h" /* hvd_cuda_unavailable */

/* e and count are cudaGetDeviceCount's answer (asked wherever the test
 * needs it, e.g. before MPI starts). Returns count when it is at least 1;
 * otherwise "1..0 # SKIP no CUDA device: ..." and exit. */
static inline int gpu_devices_or_skip(cudaError_t e, int count) {
  if (e != cudaSuccess)
    skip_all("no CUDA device: %s", hvd_cuda_unavailable());
  if (count == 0)
    skip_all("no CUDA device: cudaGetDeviceCount found none");
  return count;
}

/* A CUDA call the test itself makes: bail out (naming it) when it fails. */
static inline void cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    bail("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The start of a GPU test on MPI ranks: asks CUDA for its devices before
 * MPI starts, then the TAP harness; skips the whole test without a device
 * (as gpu_devices_or_skip); *rank, *size, *count set; the rank's device
 * (its own when there are enough, else the first), made current. */
static inline int gpu_mpi_begin(int *argc, char ***argv, int *rank, int *size,
                                int *count) {
  cudaError_t e = cudaGetDeviceCount(count);
  tap_mpi_init(argc, argv);
  *rank = tap_rank();
  *size = tap_size();
  gpu_devices_or_skip(e, *count);
  int dev = *count >= *size ? *rank % *count : 0;
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  return dev;
}

/* The start of a stand-in test on MPI ranks: the TAP harness, *rank and
 * *size set, and a stand-in GPU of its own for each rank (NCCL refuses two
 * ranks on one), made current; bails out when there are too few
 * (HVD_STANDIN_DEVICES). Returns the rank's device. */
static inline int standin_gpu_each(int *argc, char ***argv, int *rank,
                                   int *size) {
  int count = 0;
  tap_mpi_init(argc, argv);
  *rank = tap_rank();
  *size = tap_size();
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < *size)
    bail("the stand-in has %d GPUs for %d ranks (HVD_STANDIN_DEVICES)", count,
         *size);
  cuda_ok(cudaSetDevice(*rank), "cudaSetDevice");
  return *rank;
}

/* Whether NCCL can join size ranks over count GPUs: a GPU each, or all
 * sharing with HVD_GPU_SHARE=1 (each rank a host of its own to NCCL). */
static inline int gpu_nccl_fits(int size, int count) {
  const char *share = getenv("HVD_GPU_SHARE");
  return size <= 1 || count >= size || (share != NULL && strcmp(share, "1") == 0);
}

/* `PROG kill R` (t/standin/kill.sh, t/gpu/share.sh, under hvdrun): device
 * allreduces over hvd's NCCL executor on `device`; world rank R SIGKILLs
 * itself right after submitting the fourth, while its peers are in it.
 * Prints "kill: done" only if the job goes on to its end, which it must
 * not. */
static inline int gpu_kill_main(int victim, int device) {
  const char *env = getenv("OMPI_COMM_WORLD_RANK");
  int me = env != NULL ? atoi(env) : 0;
  enum { N = 4096 };
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "kill: hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  float *d = NULL;
  int64_t n = N;
  cuda_ok(cudaMalloc((void **)&d, N * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMemset(d, 0, N * sizeof *d), "cudaMemset");
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &n);
  t.device = device;
  for (int i = 0; i < 6; i++) {
    char name[32];
    hvd_request_t *req = NULL;
    snprintf(name, sizeof name, "kill.%d", i);
    hvd_result_t rc = hvd_allreduce_async(name, &t, &t, HVD_SUM, 1, 1, &req);
    if (rc == HVD_SUCCESS && i == 3 && me == victim)
      raise(SIGKILL);
    if (rc == HVD_SUCCESS)
      rc = hvd_wait(req);
    if (rc != HVD_SUCCESS) {
      printf("kill: rank %d: %s\n", me, hvd_last_error());
      return 1;
    }
  }
  printf("kill: done\n");
  cudaFree(d);
  hvd_shutdown();
  return 0;
}

/* Whether `device` reaches pageable host memory (HMM or ATS), where hvd
 * takes a device tensor on it; or bail. */
static inline int gpu_reaches_pageable(int device) {
  int v = 0;
  cuda_ok(cudaDeviceGetAttribute(&v, cudaDevAttrPageableMemoryAccess, device),
          "cudaDeviceGetAttribute");
  return v;
}

/* bytes of device memory (at least one) on the current device, or bail. */
static inline void *dalloc(size_t bytes) {
  void *p = NULL;
  cuda_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
#endif

#endif /* HVD_T_GPUTEST_H */
