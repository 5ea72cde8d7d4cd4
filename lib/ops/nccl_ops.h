/*
 * nccl_ops.h - the NCCL executor: collectives on device memory (tensors on
 * the rank's GPU) over an NCCL communicator made on first use. Only in
 * builds with NCCL (HVD_HAVE_NCCL); HVD_GPU_OPERATIONS=nccl (the default
 * there) routes device tensors to it.
 */
#ifndef HVD_OPS_NCCL_OPS_H
#define HVD_OPS_NCCL_OPS_H

#include "ops/executor.h"

extern const hvd__executor_t hvd__nccl_executor;

#endif /* HVD_OPS_NCCL_OPS_H */
