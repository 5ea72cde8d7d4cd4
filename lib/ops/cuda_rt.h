/*
 * cuda_rt.h - CUDA runtime errors as hvd results. Included from C and from
 * the CUDA sources (nvcc, C++); needs config.h first. Without CUDA in the
 * build it declares nothing.
 */
#ifndef HVD_OPS_CUDA_RT_H
#define HVD_OPS_CUDA_RT_H

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/errors.h"

/* HVD_ERR_CUDA with "<what>: <cudaGetErrorString> (<cudaGetErrorName>)",
 * what cut at its first '(' as for hvd__mpi_error; also clears CUDA's
 * last error, so that the next check does not see it again. */
hvd_result_t hvd__cuda_error(cudaError_t err, const char *what);

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

#endif /* HVD_OPS_CUDA_RT_H */
