/*
 * cuda_rt.c - what hvd needs from the CUDA runtime and NCCL at this stage:
 * build facts and the device count. Only the runtime (cudart) is linked,
 * never the driver library, so a CUDA build still runs its CPU paths on a
 * machine without a GPU or driver: cudaGetDeviceCount then fails and we
 * report 0 devices.
 */
#include <config.h>

#include "core/runtime.h"

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#ifdef HVD_HAVE_NCCL
#include <nccl.h>
#endif

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
