/*
 * optim_kernels.cu - the built-in optimizers' device updates: SGD and
 * Adam/AdamW over a batch of parameters in one launch, and the scale of a
 * gradient. Interface and contract in optim_kernels.h.
 *
 * The element formulas and their host-computed factors are optim_math.h's,
 * which the host stand-in (t/standin/kernels.c) runs too; built with
 * -fmad=false (Makefile.am) and nvcc's IEEE division and square root, so
 * that device and host agree bit for bit. The grid is base/cuda_launch.h's.
 */
#include <config.h>

#include <math.h>
#include <stdint.h>

#include "base/cuda_launch.h"
#include "base/device.h"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

namespace {

__global__ void sgd_kernel(const hvd__cuda_param_span_t *spans, int n,
                           hvd__km_sgd_t a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    float *buf = a.momentum ? sp.state[0] : NULL;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride)
      hvd__km_sgd_elem(a, sp.value, sp.grad, buf, j);
  }
}

__global__ void adam_kernel(const hvd__cuda_param_span_t *spans, int n,
                            hvd__km_adam_t a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    hvd__cuda_param_span_t sp = spans[t];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         j < sp.count; j += stride)
      hvd__km_adam_elem(a, sp.value, sp.grad, sp.state[0], sp.state[1], j);
  }
}

/* hvd__scale of float32: multiplied in float */
__global__ void scale_kernel(float *x, int64_t n, float f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] = x[i] * f;
}

} // namespace

extern "C" hvd_result_t hvd__cuda_sgd_step(const hvd__cuda_param_span_t *spans,
                                           int n, int64_t max_count,
                                           const hvd_sgd_options_t *o,
                                           int64_t step, double lr,
                                           cudaStream_t stream) {
  static const char who[] = "hvd__cuda_sgd_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, INT64_MIN, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_sgd_t a = hvd__km_sgd_args(o, step, lr);
  sgd_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0, stream>>>(
      spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_adam_step(const hvd__cuda_param_span_t *spans,
                                            int n, int64_t max_count,
                                            const hvd_adam_options_t *o,
                                            int64_t step, double lr,
                                            cudaStream_t stream) {
  static const char who[] = "hvd__cuda_adam_step";
  int go;
  hvd_result_t rc =
      hvd__km_check_step(who, spans, n, max_count, o, step, 1, &go);
  if (rc != HVD_SUCCESS || !go)
    return rc;
  hvd__km_adam_t a = hvd__km_adam_args(o, step, lr);
  adam_kernel<<<hvd__grid_for(max_count, n), hvd__kernel_threads, 0, stream>>>(
      spans, n, a);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}

extern "C" hvd_result_t hvd__cuda_grad_scale(float *x, int64_t n, double factor,
                                             cudaStream_t stream) {
  static const char who[] = "hvd__cuda_grad_scale";
  hvd_result_t rc = hvd__km_check_one(who, n, HVD_FLOAT32);
  if (rc != HVD_SUCCESS || n == 0 || factor == 1.0)
    return rc;
  scale_kernel<<<hvd__grid_for(n, 1), hvd__kernel_threads, 0, stream>>>(
      x, n, (float)factor);
  if (cudaPeekAtLastError() != cudaSuccess)
    return hvd__launch_error(who);
  return HVD_SUCCESS;
}
