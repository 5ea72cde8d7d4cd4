/*
 * cuda_launch.h - how every .cu of lib/ launches its kernels: threads per
 * block, the grid for a batch of spans, and the error of a failed launch.
 * One grid rule for lib/ops/cuda_kernels.cu and lib/optim/optim_kernels.cu:
 * grid.y walks the spans, grid.x the elements of a span, both with a
 * stride, so any grid covers any batch. Only for nvcc (CUDA C++).
 */
#ifndef HVD_BASE_CUDA_LAUNCH_H
#define HVD_BASE_CUDA_LAUNCH_H

#ifdef __CUDACC__

#include <stdint.h>
#include <stdio.h>

#include "base/device.h"

static const int hvd__kernel_threads = 256;            /* per block */
static const int64_t hvd__kernel_max_blocks = 1 << 18; /* per launch */

/* Enough blocks along x for the longest span (max_count elements), but at
 * most hvd__kernel_max_blocks in all; grid.y at most CUDA's 65535. */
static inline dim3 hvd__grid_for(int64_t max_count, int n) {
  int64_t y = n < 65535 ? n : 65535;
  int64_t x = (max_count + hvd__kernel_threads - 1) / hvd__kernel_threads;
  if (x > hvd__kernel_max_blocks / y)
    x = hvd__kernel_max_blocks / y;
  if (x < 1)
    x = 1;
  return dim3((unsigned)x, (unsigned)y);
}

/* HVD_ERR_CUDA "<who>: kernel launch: ..." for the launch that just
 * failed (it clears CUDA's last error). */
static inline hvd_result_t hvd__launch_error(const char *who) {
  char what[128];
  snprintf(what, sizeof what, "%s: kernel launch", who);
  return hvd__cuda_error(cudaGetLastError(), what);
}

#endif /* __CUDACC__ */

#endif /* HVD_BASE_CUDA_LAUNCH_H */
