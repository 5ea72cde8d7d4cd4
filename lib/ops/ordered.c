/* ordered.c - reductions in rank order over MPI (see ordered.h). */
#include "ops/ordered.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/wait.h"
#include "ops/reduce.h"

/* At most this many bytes gathered from all ranks together, an allreduce
 * is one allgather and a fold on every rank: one round instead of two. */
#define GATHER_BYTES ((int64_t)64 << 10)

void hvd__ordered_free(hvd__ordered_t *o) {
  free(o->buf);
  free(o->ints);
  free(o->srcs);
  memset(o, 0, sizeof *o);
}

MPI_Datatype hvd__mpi_dtype(hvd_dtype_t dtype) {
  switch (dtype) {
  case HVD_UINT8:
    return MPI_UINT8_T;
  case HVD_INT8:
    return MPI_INT8_T;
  case HVD_INT32:
    return MPI_INT32_T;
  case HVD_INT64:
    return MPI_INT64_T;
  case HVD_FLOAT32:
    return MPI_FLOAT;
  case HVD_FLOAT64:
    return MPI_DOUBLE;
  default:
    return MPI_UINT16_T; /* f16, bf16: bits */
  }
}

/* Room for `bytes` received and four count vectors of p. */
static hvd_result_t room(hvd__ordered_t *o, size_t bytes, int p) {
  hvd_result_t rc =
      hvd__grow((void **)&o->buf, &o->cap, bytes, "reduction buffer");
  if (rc != HVD_SUCCESS)
    return rc;
  if (p > o->nints) {
    int *v = realloc(o->ints, 4 * (size_t)p * sizeof *v);
    const void **s = realloc(o->srcs, (size_t)p * sizeof *s);
    if (v != NULL)
      o->ints = v;
    if (s != NULL)
      o->srcs = s;
    if (v == NULL || s == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY,
                            "could not allocate %zu bytes for the reduction "
                            "counts",
                            (size_t)p * (4 * sizeof *v + sizeof *s));
    o->nints = p;
  }
  return HVD_SUCCESS;
}

size_t hvd__ordered_allreduce_room(int64_t n, int p, hvd_dtype_t dtype) {
  /* gather_fold: n * p elements, only while within GATHER_BYTES; else the
   * received blocks, p of ceil(n / p) <= n + p - 1 */
  size_t es = hvd_dtype_size(dtype);
  size_t small = (size_t)n * (size_t)p * es, blocks = (size_t)(n + p - 1) * es;
  small = small < (size_t)GATHER_BYTES ? small : (size_t)GATHER_BYTES;
  return small > blocks ? small : blocks;
}

hvd_result_t hvd__ordered_reserve(hvd__ordered_t *o, size_t bytes, int p) {
  return room(o, bytes, p);
}

/* Folds the p blocks of m elements at o->buf, in rank order, into dst. */
static void fold(hvd__ordered_t *o, void *dst, int p, int64_t m,
                 hvd_dtype_t dtype, hvd_op_t op) {
  size_t bytes = (size_t)m * hvd_dtype_size(dtype);
  for (int q = 0; q < p; q++)
    o->srcs[q] = o->buf + (size_t)q * bytes;
  if (m > 0)
    hvd__reduce_ordered(dst, o->srcs, p, m, dtype, op);
}

/* Block k of every rank to rank k (counts, displs over send); this rank's
 * p blocks of `mine` elements into o->buf, in rank order. */
static hvd_result_t exchange(hvd__ordered_t *o, MPI_Comm comm, int p,
                             const void *send, const int *counts,
                             const int *displs, int mine, MPI_Datatype dt) {
  hvd_result_t rc = HVD_SUCCESS;
  int *rcounts = o->ints + 2 * p, *rdispls = o->ints + 3 * p;
  MPI_Request req;
  for (int q = 0; q < p; q++) {
    rcounts[q] = mine;
    rdispls[q] = q * mine; /* p * mine <= INT_MAX: checked by callers */
  }
  HVD__MPI_CHECK(MPI_Ialltoallv(send, counts, displs, dt, o->buf, rcounts,
                                rdispls, dt, comm, &req));
  rc = hvd__mpi_wait(&req, "MPI_Ialltoallv");
fail:
  return rc;
}

hvd_result_t hvd__ordered_scatter_room(hvd__ordered_t *o, int p, int me,
                                       const int *counts, hvd_dtype_t dtype) {
  int64_t total = 0, mine = counts[me];
  for (int q = 0; q < p; q++)
    total += counts[q];
  if (total > INT_MAX || mine * p > INT_MAX)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "a reducescatter of %lld elements exceeds MPI's "
                          "int counts",
                          (long long)total);
  return room(o, (size_t)(mine * p) * hvd_dtype_size(dtype) + 1, p);
}

hvd_result_t hvd__ordered_reduce_scatter(hvd__ordered_t *o, MPI_Comm comm,
                                         const void *send, const int *counts,
                                         void *recv, hvd_dtype_t dtype,
                                         hvd_op_t op) {
  hvd_result_t rc = HVD_SUCCESS;
  int p, me;
  HVD__MPI_CHECK(MPI_Comm_size(comm, &p));
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &me));
  int64_t mine = counts[me];
  HVD__CHECK(hvd__ordered_scatter_room(o, p, me, counts, dtype));
  int *displs = o->ints + p;
  for (int q = 0, at = 0; q < p; at += counts[q], q++)
    displs[q] = at;
  HVD__CHECK(exchange(o, comm, p, send, counts, displs, (int)mine,
                      hvd__mpi_dtype(dtype)));
  fold(o, recv, p, mine, dtype, op);
fail:
  return rc;
}

/* A small allreduce: every rank gathers all and folds. */
static hvd_result_t gather_fold(hvd__ordered_t *o, MPI_Comm comm, int p,
                                const void *send, void *recv, int64_t n,
                                hvd_dtype_t dtype, hvd_op_t op) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Datatype dt = hvd__mpi_dtype(dtype);
  MPI_Request req;
  HVD__MPI_CHECK(
      MPI_Iallgather(send, (int)n, dt, o->buf, (int)n, dt, comm, &req));
  HVD__CHECK(hvd__mpi_wait(&req, "MPI_Iallgather"));
  fold(o, recv, p, n, dtype, op);
fail:
  return rc;
}

hvd_result_t hvd__ordered_allreduce(hvd__ordered_t *o, MPI_Comm comm,
                                    const void *send, void *recv, int64_t n,
                                    hvd_dtype_t dtype, hvd_op_t op) {
  hvd_result_t rc = HVD_SUCCESS;
  int p, me;
  size_t esize = hvd_dtype_size(dtype);
  MPI_Request req;
  if (send == MPI_IN_PLACE)
    send = recv;
  HVD__MPI_CHECK(MPI_Comm_size(comm, &p));
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &me));
  if (p == 1 || n == 0) {
    if (send != recv && n > 0)
      memmove(recv, send, (size_t)n * esize);
    return HVD_SUCCESS;
  }
  int64_t per = (n + p - 1) / p; /* even blocks, the last ones shorter */
  if (n > INT_MAX || per * p > INT_MAX)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "an allreduce of %lld elements exceeds MPI's int "
                          "counts",
                          (long long)n);
  if (n * (int64_t)esize * p <= GATHER_BYTES) {
    HVD__CHECK(room(o, (size_t)(n * p) * esize, p));
    return gather_fold(o, comm, p, send, recv, n, dtype, op);
  }
  HVD__CHECK(room(o, (size_t)(per * p) * esize, p));
  int *counts = o->ints, *displs = o->ints + p;
  for (int q = 0; q < p; q++) {
    int64_t lo = q * per < n ? q * per : n;
    int64_t hi = lo + per < n ? lo + per : n;
    counts[q] = (int)(hi - lo);
    displs[q] = (int)lo;
  }
  MPI_Datatype dt = hvd__mpi_dtype(dtype);
  HVD__CHECK(exchange(o, comm, p, send, counts, displs, counts[me], dt));
  fold(o, (char *)recv + (size_t)displs[me] * esize, p, counts[me], dtype, op);
  HVD__MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, dt, recv, counts, displs, dt,
                                 comm, &req));
  rc = hvd__mpi_wait(&req, "MPI_Iallgatherv");
fail:
  return rc;
}
