/*
 * ordered.h - reductions over MPI in which every element is folded over
 * the ranks in rank order, 0 to P-1, one rounding per step: the bits a
 * loop over the ranks' values gives on one process, whatever the count,
 * the fusion around it or MPI's choice of algorithm. MPI_Allreduce and
 * MPI_Reduce_scatter promise no order (Open MPI's change with the count),
 * so the host executor reduces only through these.
 *
 * A reduce-scatter is one exchange (MPI_Ialltoallv: block k of every rank
 * to rank k, the bytes a ring moves) and a fold of the P blocks received,
 * in rank order, by their owner; an allreduce adds an allgather of the
 * owners' blocks, or is one allgather and a fold everywhere when the data
 * is small. Each MPI call is nonblocking and waited for by hvd__mpi_wait,
 * so a rank waiting for its peers gives its core back.
 */
#ifndef HVD_OPS_ORDERED_H
#define HVD_OPS_ORDERED_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* Scratch kept across calls: the received blocks and the count vectors.
 * Starts zeroed; hvd__ordered_free releases it. */
typedef struct hvd__ordered {
  char *buf;
  size_t cap;
  int *ints; /* four vectors of `nints` */
  int nints;
  const void **srcs;
  /* the room every rank of the caller's communicator has made alike
   * (hvd__ordered_reserve, agreed by the caller: mpi_ops.c); cap, which a
   * reduce-scatter grows by this rank's own block, may be more */
  size_t agreed;
} hvd__ordered_t;

void hvd__ordered_free(hvd__ordered_t *o);

/* The MPI datatype that moves one element of dtype (float16 and bfloat16
 * as 16-bit words: nothing reduces them inside MPI). */
MPI_Datatype hvd__mpi_dtype(hvd_dtype_t dtype);

/* recv = op over comm's ranks, in rank order, of each rank's n elements
 * at send (MPI_IN_PLACE: at recv). No scaling: the caller's. */
hvd_result_t hvd__ordered_allreduce(hvd__ordered_t *o, MPI_Comm comm,
                                    const void *send, void *recv, int64_t n,
                                    hvd_dtype_t dtype, hvd_op_t op);

/* The scratch bytes enough for any hvd__ordered_allreduce of at most n
 * elements of dtype over at most p ranks (the same for the same arguments
 * on every rank), growing with n. */
size_t hvd__ordered_allreduce_room(int64_t n, int p, hvd_dtype_t dtype);

/* That room (`bytes` and the count vectors of p ranks) made now: an
 * hvd__ordered_allreduce within it allocates nothing, so it cannot fail
 * for memory on one rank alone. HVD_ERR_NO_MEMORY "could not allocate N
 * bytes for the reduction buffer" (or "... reduction counts"). */
hvd_result_t hvd__ordered_reserve(hvd__ordered_t *o, size_t bytes, int p);

/* send holds P blocks end to end, counts[k] elements for rank k (the same
 * counts on every rank); recv (counts[rank] elements, not overlapping
 * send) = op over the ranks, in rank order, of their block `rank`. */
/* The room hvd__ordered_reduce_scatter needs on comm rank `me` of p
 * (counts as there), made now: a caller agrees on it with its other
 * memory before any MPI step. HVD_ERR_UNSUPPORTED when the counts pass
 * MPI's int (the received blocks: this rank's own), HVD_ERR_NO_MEMORY. */
hvd_result_t hvd__ordered_scatter_room(hvd__ordered_t *o, int p, int me,
                                       const int *counts, hvd_dtype_t dtype);

hvd_result_t hvd__ordered_reduce_scatter(hvd__ordered_t *o, MPI_Comm comm,
                                         const void *send, const int *counts,
                                         void *recv, hvd_dtype_t dtype,
                                         hvd_op_t op);

#endif /* HVD_OPS_ORDERED_H */
