/*
 * mpi_ops.h - the MPI executor (host memory) and how hvd's thread waits on
 * MPI without holding the core.
 */
#ifndef HVD_OPS_MPI_OPS_H
#define HVD_OPS_MPI_OPS_H

#include <mpi.h>

#include "ops/executor.h"

/* The host executor. Its run functions also serve the host-staged device
 * executor (staged_ops.c), on requests whose tensors it has copied into
 * pinned host memory, with a state of its own from .open. */
extern const hvd__executor_t hvd__mpi_executor;

/* Its barrier (MPI_Ibarrier on env->comm, waited for with hvd__mpi_wait),
 * which needs no state and no tensor: the device executors' barrier too. */
hvd_result_t hvd__mpi_barrier(void *state, const hvd__exec_env_t *env,
                              const hvd__work_t *w);

/* The MPI executor's default chunk (HVD_CHUNK_SIZE=0). Open MPI over shared
 * memory peaks at 256 KiB - 4 MiB messages (8-13 GB/s on 2 ranks) and falls
 * to ~2 GB/s at 64 MiB, where it allocates a scratch buffer per call; the
 * shared-memory path wants pieces that stay in L2 while copied in, reduced
 * and copied out. On the bert lists 256 KiB did best for both. */
#define HVD__MPI_CHUNK ((int64_t)256 << 10)

#endif /* HVD_OPS_MPI_OPS_H */
