/* executor.c - the table of backends. */
#include <config.h>

#include "ops/executor.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/fault.h"
#include "base/tensor.h"
#include "ops/mpi_ops.h"
#ifdef HVD_HAVE_CUDA
#include "ops/staged_ops.h"
#endif
#ifdef HVD_HAVE_NCCL
#include "ops/nccl_ops.h"
#endif

/* Indices below follow this order. */
const hvd__executor_t *const hvd__executors[] = {&hvd__mpi_executor,
#ifdef HVD_HAVE_CUDA
                                                 &hvd__staged_executor,
#endif
#ifdef HVD_HAVE_NCCL
                                                 &hvd__nccl_executor,
#endif
                                                 NULL};

int hvd__executor_for(const hvd__exec_env_t *env, const hvd__desc_t *d) {
  if (d->device == HVD_CPU)
    return 0;
#if defined(HVD_HAVE_NCCL)
  if (d->coll == HVD__ALLREDUCE && d->op == HVD_ADASUM)
    return 1; /* adasum.c's tree on host copies */
  return env->gpu_ops == HVD__GPU_OPS_NCCL ? 2 : 1;
#elif defined(HVD_HAVE_CUDA)
  (void)env;
  return 1; /* host-staged MPI: the only device executor without NCCL */
#else
  (void)env;
  return -1;
#endif
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "",
                           (long long)shape[i]);
  if (at < len)
    snprintf(buf + at, len - at, "]");
}

hvd_result_t hvd__given_output(const hvd_request_t *r, int ndim,
                               const int64_t *shape) {
  const hvd_tensor_t *t = &r->recv;
  int same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++)
    same = t->shape[i] == shape[i];
  if (same)
    return HVD_SUCCESS;
  char got[200], want[200];
  shape_str(got, sizeof got, t->ndim, t->shape);
  shape_str(want, sizeof want, ndim, shape);
  return hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s '%s': the output given has shape %s but the "
                        "result has %s",
                        hvd__coll_name(r->desc.coll), r->name, got, want);
}

hvd_result_t hvd__alloc_output(hvd_request_t *r, int ndim,
                               const int64_t *shape) {
  if (r->recv_given)
    return hvd__given_output(r, ndim, shape);
  hvd_tensor_t *t = &r->recv;
  memset(t, 0, sizeof *t);
  t->dtype = r->desc.dtype;
  t->device = HVD_CPU;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  size_t bytes = hvd__tensor_bytes(t);
  t->data = malloc(bytes ? bytes : 1);
  if (t->data == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "output of %zu bytes", bytes);
  return HVD_SUCCESS;
}

int64_t hvd__row_bytes(const hvd__desc_t *d) {
  int64_t n = (int64_t)hvd_dtype_size(d->dtype);
  for (int i = 1; i < d->ndim; i++)
    n *= d->shape[i];
  return n;
}

/* r->recv_splits, n entries of zero; NULL with the error set. */
static int64_t *new_recv_splits(hvd_request_t *r, size_t n) {
  r->recv_splits =
      hvd__fault("splits") ? NULL : calloc(n, sizeof *r->recv_splits);
  if (r->recv_splits == NULL)
    hvd__set_error(HVD_ERR_NO_MEMORY, "alltoall splits: out of memory");
  return r->recv_splits;
}

hvd_result_t hvd__exchange_splits(hvd_request_t *r, const hvd__exec_env_t *env,
                                  int64_t *into, int64_t *total) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t n = (size_t)env->size;
  int64_t *got = into != NULL ? into : new_recv_splits(r, n);
  if (got == NULL)
    return HVD_ERR_NO_MEMORY;
  HVD__MPI_CHECK(
      MPI_Alltoall(r->splits, 1, MPI_INT64_T, got, 1, MPI_INT64_T, env->comm));
  /* the lowest rank whose rows would wrap, agreed: a rank that failed
   * alone would leave its peers in the alltoall's MPI call */
  const hvd__desc_t *d = &r->desc;
  int bad = hvd__rows_total(got, env->size, d->dtype, d->ndim, d->shape, total)
                ? INT_MAX
                : env->rank;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MIN, env->comm));
  if (bad != INT_MAX)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "rank %d would receive more rows than a tensor holds "
                          "(the splits sent to it sum past INT64_MAX rows or "
                          "PTRDIFF_MAX bytes)",
                          env->world_ranks != NULL ? env->world_ranks[bad]
                                                   : bad);
  if (into != NULL) { /* after the exchange: a failure here is carried */
    if (new_recv_splits(r, n) == NULL)
      return HVD_ERR_NO_MEMORY;
    memcpy(r->recv_splits, into, n * sizeof *into);
  }
fail:
  return rc;
}

hvd_result_t hvd__allgather_rows(const hvd_request_t *r, int fused,
                                 const int64_t *rows, int P, int64_t *total) {
  const hvd__desc_t *d = &r->desc;
  if (hvd__rows_total(rows, P, d->dtype, d->ndim, d->shape, total))
    return HVD_SUCCESS;
  char group[300] = "";
  if (fused)
    snprintf(group, sizeof group,
             "tensor '%.200s' of its fused group: ", r->name);
  return hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%sthe first dimensions of the %d ranks sum past the "
                        "largest tensor (INT64_MAX rows, PTRDIFF_MAX bytes)",
                        group, P);
}
