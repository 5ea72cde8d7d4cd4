/*
 * staged_ops.h - the host-staged device executor ("mpi-staged"): device
 * tensors copied through pinned host buffers into the MPI executor's
 * collectives and back, so several ranks may share one GPU. Builds with
 * CUDA; HVD_GPU_OPERATIONS=mpi routes device tensors to it (and it is the
 * only device executor of a CUDA build without NCCL).
 */
#ifndef HVD_OPS_STAGED_OPS_H
#define HVD_OPS_STAGED_OPS_H

#include "ops/executor.h"

extern const hvd__executor_t hvd__staged_executor;

#endif /* HVD_OPS_STAGED_OPS_H */
