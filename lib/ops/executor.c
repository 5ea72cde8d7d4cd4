/* executor.c - the table of backends. */
#include <config.h>

#include "ops/executor.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/fault.h"
#include "base/log.h"
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
  t->data = hvd__fault("output") ? NULL : malloc(bytes ? bytes : 1);
  if (t->data == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "could not allocate %zu bytes for the output of %s "
                          "'%s'",
                          bytes, hvd__coll_name(r->desc.coll), r->name);
  return HVD_SUCCESS;
}

int64_t hvd__row_bytes(const hvd__desc_t *d) {
  int64_t n = -1;
  return hvd__row_size(d->dtype, d->ndim, d->shape, &n) ? n : -1;
}

/* What the rank an agreement names sends every rank: its code and words. */
struct ready_msg {
  int rc;
  char why[HVD__ERRMSG_MAX - 128];
};

/* Every rank fails alike with the words of rank `first` (comm rank),
 * which it sends them: "rank R <why>; nothing was exchanged" after an
 * allocation ("could not allocate ..."), else "rank R: <why>; ...". */
static hvd_result_t agreed_failure(const hvd__exec_env_t *env, int first,
                                   hvd_result_t mine) {
  hvd_result_t rc = HVD_SUCCESS;
  struct ready_msg msg;
  memset(&msg, 0, sizeof msg);
  msg.rc = (int)mine;
  if (env->rank == first)
    snprintf(msg.why, sizeof msg.why, "%.*s", (int)sizeof msg.why - 1,
             hvd_last_error());
  HVD__MPI_CHECK(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, first, env->comm));
  int who = hvd__env_world_rank(env, first);
  HVD__LOG(HVD__LOG_ERROR, "rank %d could not prepare a collective: %s", who,
           msg.why);
  return hvd__set_error((hvd_result_t)msg.rc,
                        "rank %d%s %s; nothing was exchanged", who,
                        msg.rc == HVD_ERR_NO_MEMORY ? "" : ":", msg.why);
fail:
  return rc;
}

hvd_result_t hvd__agree_ready(const hvd__exec_env_t *env, hvd_result_t mine) {
  hvd_result_t rc = HVD_SUCCESS;
  int v = mine == HVD_SUCCESS ? env->size : env->rank, first = env->size;
  HVD__MPI_CHECK(MPI_Allreduce(&v, &first, 1, MPI_INT, MPI_MIN, env->comm));
  if (first == env->size)
    return HVD_SUCCESS;
  return agreed_failure(env, first, mine);
fail:
  return rc;
}

hvd_result_t hvd__grow_agreed(const hvd__exec_env_t *env, const char *site,
                              void **buf, size_t *cap, size_t n,
                              const char *what) {
  (void)site; /* a fault site in the test builds only */
  if (n <= *cap)
    return HVD_SUCCESS;
  hvd_result_t rc =
      hvd__fault(site)
          ? hvd__set_error(HVD_ERR_NO_MEMORY,
                           "could not allocate %zu bytes for the %s", n, what)
          : hvd__grow(buf, cap, n, what);
  rc = hvd__agree_ready(env, rc);
  if (rc != HVD_SUCCESS) { /* every rank grows from nothing again */
    free(*buf);
    *buf = NULL;
    *cap = 0;
  }
  return rc;
}

/* r->recv_splits, a copy of the n answers; the error set when it cannot
 * be had. */
static hvd_result_t keep_recv_splits(hvd_request_t *r, const int64_t *got,
                                     size_t n) {
  r->recv_splits =
      hvd__fault("splits") ? NULL : calloc(n, sizeof *r->recv_splits);
  if (r->recv_splits == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "could not allocate %zu bytes for the received "
                          "splits of alltoall '%s'",
                          n * sizeof *r->recv_splits, r->name);
  memcpy(r->recv_splits, got, n * sizeof *got);
  return HVD_SUCCESS;
}

/* What a rank brings to the splits' agreement, the most telling first:
 * rows that would wrap; rows past MPI's int counts; a memory it could not
 * get; ready. MPI_MIN over the ranks of class * size + rank names the
 * rank every rank names. */
enum { SPLITS_WRAP, SPLITS_INTS, SPLITS_UNPREPARED, SPLITS_READY };

/* 1 when this rank's rows of an alltoall (sent, received: total) or its
 * row bytes pass MPI's int counts (rows of 0 bytes: nothing is sent). */
static int past_ints(const hvd_request_t *r, int n, int64_t total) {
  int64_t sent = 0, rb = hvd__row_bytes(&r->desc);
  for (int k = 0; k < n; k++)
    sent += r->splits[k];
  return rb != 0 && (rb > INT_MAX || total > INT_MAX || sent > INT_MAX);
}

hvd_result_t hvd__exchange_splits(hvd_request_t *r, const hvd__exec_env_t *env,
                                  int64_t *into, int output, int64_t *total) {
  hvd_result_t rc = HVD_SUCCESS, mine = HVD_SUCCESS;
  size_t n = (size_t)env->size;
  const hvd__desc_t *d = &r->desc;
  HVD__MPI_CHECK(
      MPI_Alltoall(r->splits, 1, MPI_INT64_T, into, 1, MPI_INT64_T, env->comm));
  int cls = SPLITS_WRAP, fits = hvd__rows_total(into, env->size, d->dtype,
                                                d->ndim, d->shape, total);
  if (fits && output && past_ints(r, env->size, *total)) {
    cls = SPLITS_INTS;
  } else if (fits) {
    mine = keep_recv_splits(r, into, n);
    int64_t shape[HVD_MAX_DIMS];
    memcpy(shape, d->shape, sizeof shape);
    shape[0] = *total;
    if (mine == HVD_SUCCESS && output)
      mine = hvd__alloc_output(r, d->ndim, shape);
    cls = mine == HVD_SUCCESS || !output ? SPLITS_READY : SPLITS_UNPREPARED;
  }
  /* one MPI_Allreduce of an int: a rank that failed alone would leave its
   * peers in the alltoall's MPI call */
  int v = cls * env->size + env->rank, least = 0;
  HVD__MPI_CHECK(MPI_Allreduce(&v, &least, 1, MPI_INT, MPI_MIN, env->comm));
  int first = least % env->size;
  if (least / env->size == SPLITS_WRAP)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "rank %d would receive more rows than a tensor holds "
                          "(the splits sent to it sum past INT64_MAX rows or "
                          "PTRDIFF_MAX bytes)",
                          hvd__env_world_rank(env, first));
  if (least / env->size == SPLITS_INTS)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "rank %d would send or receive more rows, or longer "
                          "rows, than MPI's int counts",
                          hvd__env_world_rank(env, first));
  if (least / env->size == SPLITS_UNPREPARED)
    return agreed_failure(env, first, mine);
  return mine; /* without `output`: carried by the caller */
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
