/*
 * mpi_ops.h - the MPI executor (host memory) and how hvd's thread waits on
 * MPI without holding the core.
 */
#ifndef HVD_OPS_MPI_OPS_H
#define HVD_OPS_MPI_OPS_H

#include <mpi.h>

#include "ops/executor.h"

extern const hvd__executor_t hvd__mpi_executor;

/* Completes *req: polls MPI_Test briefly, then yields, then sleeps in
 * short steps, so a rank waiting for slower peers gives its core back. */
hvd_result_t hvd__mpi_wait(MPI_Request *req, const char *what);

#endif /* HVD_OPS_MPI_OPS_H */
