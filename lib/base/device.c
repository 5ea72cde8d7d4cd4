/*
 * device.c - what hvd needs from the CUDA runtime and NCCL outside the
 * kernels: build facts, the device count, CUDA errors as hvd results, and
 * binding each rank to its GPU at hvd_init. Only the runtime (cudart) is
 * linked, never the driver library, so a CUDA build still runs its CPU
 * paths on a machine without a GPU or driver: cudaGetDeviceCount then
 * fails and we report 0 devices.
 */
#include <config.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/settings.h"

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#ifdef HVD_HAVE_NCCL
#include <nccl.h>
#endif

/* The device hvd_init bound this process to; -1 when it did not. */
static atomic_int bound_device = -1;
static atomic_int home_device = -1; /* hvd__cuda_home_device */

int hvd_cuda_built(void) {
#ifdef HVD_HAVE_CUDA
  return CUDART_VERSION;
#else
  return 0;
#endif
}

int hvd_nccl_built(void) {
#ifdef HVD_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess)
    v = NCCL_VERSION_CODE;
  return v;
#else
  return 0;
#endif
}

int hvd__cuda_device_count(void) {
#ifdef HVD_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); /* clear the sticky "no driver" error */
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

const char *hvd_cuda_unavailable(void) {
#ifdef HVD_HAVE_CUDA
  static _Thread_local char why[256];
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0)
    return NULL;
  (void)cudaGetLastError(); /* clear the sticky "no driver" error */
  if (e == cudaSuccess)
    snprintf(why, sizeof why,
             "no NVIDIA GPU found (cudaGetDeviceCount found none)");
  else if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
    snprintf(why, sizeof why,
             "no NVIDIA driver or GPU found (cudaGetDeviceCount: %s)",
             cudaGetErrorString(e));
  else
    snprintf(why, sizeof why, "cudaGetDeviceCount: %s (%s)",
             cudaGetErrorString(e), cudaGetErrorName(e));
  return why;
#else
  return "this build has no CUDA (configure found no toolkit, or "
         "--without-cuda)";
#endif
}

int hvd__cuda_device(void) { return atomic_load(&bound_device); }

int hvd__cuda_home_device(void) { return atomic_load(&home_device); }

int hvd__cuda_rank_device(void) {
#ifdef HVD_HAVE_CUDA
  int dev = atomic_load(&bound_device);
  if (dev >= 0)
    return dev;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver or no device: not sticky */
    return -1;
  }
  return dev;
#else
  return -1;
#endif
}

#ifdef HVD_HAVE_CUDA
/* What the CUDA runtime says of p (its type and device): 0 when it cannot
 * say (its error cleared, not sticky). */
static int pointer_attributes(const void *p, struct cudaPointerAttributes *a) {
  if (p == NULL)
    return 0;
  if (cudaPointerGetAttributes(a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return 1;
}

/* Whether `device` reaches pageable host memory (HMM or ATS), asked once
 * per device: 1, 0, or -1 not asked yet. */
static _Atomic int pageable_ok[64] = {0};

static int device_reaches_pageable(int device) {
  if (device < 0 || device >= 64)
    return 0;
  int v = atomic_load(&pageable_ok[device]);
  if (v != 0)
    return v > 0;
  int yes = 0;
  if (cudaDeviceGetAttribute(&yes, cudaDevAttrPageableMemoryAccess, device) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    yes = 0;
  }
  atomic_store(&pageable_ok[device], yes ? 1 : -1);
  return yes != 0;
}
#endif

int hvd__cuda_device_memory(const void *p) {
#ifdef HVD_HAVE_CUDA
  struct cudaPointerAttributes a;
  if (atomic_load(&bound_device) < 0 || !pointer_attributes(p, &a))
    return -1;
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
#else
  (void)p;
  return -1;
#endif
}

int hvd__cuda_unreachable_host(const void *p, int device) {
#ifdef HVD_HAVE_CUDA
  struct cudaPointerAttributes a;
  return pointer_attributes(p, &a) && a.type == cudaMemoryTypeUnregistered &&
         !device_reaches_pageable(device);
#else
  (void)p, (void)device;
  return 0;
#endif
}

void hvd__cuda_free(void *p) {
  if (p == NULL)
    return;
#ifdef HVD_HAVE_CUDA
  if (cudaFree(p) != cudaSuccess)
    (void)cudaGetLastError();
#else
  free(p);
#endif
}

#ifdef HVD_HAVE_CUDA

hvd_result_t hvd__cuda_error(cudaError_t err, const char *what) {
  (void)cudaGetLastError();
  int fn = (int)strcspn(what, "("); /* "cudaSetDevice(dev)" -> the name */
  return hvd__set_error(HVD_ERR_CUDA, "%.*s: %s (%s)", fn, what,
                        cudaGetErrorString(err), cudaGetErrorName(err));
}

void hvd__cuda_twin_free(void **host, void **dev, int *cap, int pinned) {
  if (pinned)
    cudaFreeHost(*host);
  else
    free(*host);
  cudaFree(*dev);
  *host = *dev = NULL;
  *cap = 0;
}

hvd_result_t hvd__cuda_twin_grow(void **host, void **dev, int *cap, int n,
                                 size_t size, int first, int pinned) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= *cap)
    return HVD_SUCCESS;
  int want = *cap ? *cap : first;
  while (want < n)
    want *= 2;
  hvd__cuda_twin_free(host, dev, cap, pinned);
  if (pinned)
    HVD__CUDA_CHECK(
        cudaHostAlloc(host, (size_t)want * size, cudaHostAllocDefault));
  else if ((*host = malloc((size_t)want * size)) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "out of memory");
  HVD__CUDA_CHECK(cudaMalloc(dev, (size_t)want * size));
  *cap = want;
  return HVD_SUCCESS;
fail:
  hvd__cuda_twin_free(host, dev, cap, pinned);
  return rc;
}

/* What each local rank contributes: its GPU's PCI bus id ("0000:3b:00.0")
 * and, after a ' ', its UUID in hex ("" for no GPU: none visible, or
 * HVD_NO_BIND=1), or "!" and the message of the CUDA call that failed.
 * MIG instances of one GPU share its bus id but not its UUID, so ranks on
 * different instances are not taken for ranks sharing a GPU; messages
 * show the bus id. */
#define BUSID_MAX 160

/* Binds this rank to device local_rank % count unless no_bind; fills
 * `mine` as above. */
static hvd_result_t bind_mine(int local_rank, int no_bind, char *mine,
                              int *dev) {
  hvd_result_t rc = HVD_SUCCESS;
  int count = hvd__cuda_device_count();
  *dev = -1;
  mine[0] = '\0';
  if (count == 0 || no_bind)
    return HVD_SUCCESS;
  *dev = local_rank % count;
  HVD__CUDA_CHECK(cudaSetDevice(*dev));
  HVD__CUDA_CHECK(cudaDeviceGetPCIBusId(mine, BUSID_MAX - 40, *dev));
  for (char *p = mine; *p; p++) /* lower case, as lspci prints it */
    if (*p >= 'A' && *p <= 'F')
      *p = (char)(*p - 'A' + 'a');
  struct cudaDeviceProp prop;
  HVD__CUDA_CHECK(cudaGetDeviceProperties(&prop, *dev));
  char *at = mine + strlen(mine);
  *at++ = ' ';
  for (int i = 0; i < 16; i++, at += 2)
    snprintf(at, 3, "%02x", (unsigned char)prop.uuid.bytes[i]);
  return HVD_SUCCESS;
fail:
  snprintf(mine, BUSID_MAX, "!%s", hvd_last_error());
  return rc;
}

/* Every local rank's bus id is gathered, so that all local ranks see the
 * same problem and fail with the same message; then all ranks agree on
 * whether some node failed, so that no rank goes on alone. */
/* HVD_GPU_SHARE: each rank a host of its own in NCCL's eyes (its host hash
 * comes from NCCL_HOSTID), so that NCCL does not refuse two ranks on one
 * GPU ("Duplicate GPU detected") and connects them over its network
 * transport; InfiniBand off, as a loopback through one HCA to one GPU is
 * not what this mode tests. Set before any NCCL call (hvd_init binds
 * before the executors open), and only what the user left unset. */
static void share_gpu(int rank) {
  char host[HVD__HOSTNAME_MAX] = "localhost", id[HVD__HOSTNAME_MAX + 32];
  gethostname(host, sizeof host - 1);
  snprintf(id, sizeof id, "%s-hvd-rank%d", host, rank);
  setenv("NCCL_HOSTID", id, 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
}

hvd_result_t hvd__cuda_bind(MPI_Comm comm, MPI_Comm local_comm, int no_bind,
                            int share) {
  hvd_result_t rc = HVD_SUCCESS;
  char mine[BUSID_MAX] = "", *all = NULL;
  int rank, local_rank, local_size, dev, failed;
  atomic_store(&bound_device, -1);
  atomic_store(&home_device, -1);
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &rank));
  HVD__MPI_CHECK(MPI_Comm_rank(local_comm, &local_rank));
  HVD__MPI_CHECK(MPI_Comm_size(local_comm, &local_size));
  all = calloc((size_t)local_size, BUSID_MAX);
  if (all == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_init: GPU bus ids");
    goto fail;
  }
  (void)bind_mine(local_rank, no_bind, mine, &dev); /* reported below */
  HVD__MPI_CHECK(MPI_Allgather(mine, BUSID_MAX, MPI_CHAR, all, BUSID_MAX,
                               MPI_CHAR, local_comm));
  for (int i = 0; rc == HVD_SUCCESS && i < local_size; i++) {
    const char *id = all + (size_t)i * BUSID_MAX;
    if (id[0] == '!') {
      rc = hvd__set_error(HVD_ERR_CUDA,
                          "hvd_init: local rank %d could not bind its GPU: %s",
                          i, id + 1);
      break;
    }
    for (int j = 0; id[0] != '\0' && !share && j < i; j++)
      if (strcmp(all + (size_t)j * BUSID_MAX, id) == 0) {
        rc = hvd__set_error(HVD_ERR_CUDA,
                            "hvd_init: local ranks %d and %d are both bound "
                            "to GPU %.*s; give each rank its own GPU "
                            "(HVD_NO_BIND=1 leaves binding to you; "
                            "HVD_GPU_SHARE=1 allows it, for tests)",
                            j, i, (int)strcspn(id, " "), id);
        break;
      }
  }
  failed = rc != HVD_SUCCESS ? rank + 1 : 0;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm));
  if (failed && rc == HVD_SUCCESS)
    rc = hvd__set_error(HVD_ERR_CUDA,
                        "hvd_init: binding ranks to GPUs failed on rank %d "
                        "(its hvd_last_error says why)",
                        failed - 1);
  if (rc == HVD_SUCCESS && share)
    share_gpu(rank);
  if (rc == HVD_SUCCESS) {
    atomic_store(&bound_device, dev);
    /* HVD_NO_BIND=1: the device the caller made current before hvd_init */
    if (dev < 0 && no_bind && hvd__cuda_device_count() > 0 &&
        cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      dev = -1;
    }
    atomic_store(&home_device, dev);
  }
fail:
  free(all);
  return rc;
}

#else /* !HVD_HAVE_CUDA */

hvd_result_t hvd__cuda_bind(MPI_Comm comm, MPI_Comm local_comm, int no_bind,
                            int share) {
  (void)comm;
  (void)local_comm;
  (void)no_bind;
  (void)share;
  atomic_store(&bound_device, -1);
  atomic_store(&home_device, -1);
  return HVD_SUCCESS;
}

#endif /* HVD_HAVE_CUDA */
