/*
 * gather_scatter.c - the MPI executor's fused allgathers and
 * reducescatters (mpi_int.h): consecutive host allgathers agreed in one
 * cycle run as one MPI_Allgatherv of every rank's packed rows, and
 * reducescatters of one dtype, op and scaling as one ordered
 * reduce-scatter of every member's blocks packed per rank (rank order, as
 * one tensor's alone: ordered.c).
 */
#include "ops/mpi_int.h"

#include <limits.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "ops/ordered.h"
#include "ops/reduce.h"

/* Every member's rows per rank into s->gdims ([i * P + q]): from
 * dims0s[i], or learnt in one MPI_Allgather for the members agreed
 * through the cache (dims0s[i] NULL). The array's size is every rank's
 * alike: its growth is agreed. */
static hvd_result_t group_dims(hvd__mpi_state_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  int m = w->n, P = env->size, nc = 0;
  HVD__CHECK(
      hvd__grow_agreed(env, "grow", (void **)&s->gdims, &s->gdims_cap,
                       (size_t)(2 * m + 1) * (size_t)P * sizeof *s->gdims,
                       "first dimensions of a fused allgather"));
  int64_t *dims = s->gdims;               /* [i * P + q]: rows */
  int64_t *learnt = dims + (size_t)m * P; /* [q * m + j] */
  memset(learnt + (size_t)env->rank * (size_t)m, 0, (size_t)m * sizeof *learnt);
  for (int i = 0; i < m; i++)
    if (w->dims0s[i] == NULL)
      learnt[(size_t)env->rank * (size_t)m + (size_t)nc++] =
          w->reqs[i]->send.shape[0];
  if (nc > 0) { /* rank q's entries at q * m (stride m >= nc) */
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, m, MPI_INT64_T, learnt, m,
                                 MPI_INT64_T, env->comm));
  }
  for (int i = 0, j = 0; i < m; i++) {
    for (int q = 0; q < P; q++)
      dims[(size_t)i * P + (size_t)q] =
          w->dims0s[i] != NULL ? w->dims0s[i][q]
                               : learnt[(size_t)q * (size_t)m + (size_t)j];
    j += w->dims0s[i] == NULL;
  }
fail:
  return rc;
}

/* A fused group of allgathers (w->n > 1, host tensors, any dtypes and
 * rows) in one MPI_Allgatherv of bytes. Rank q's segment holds q's rows of
 * each tensor in the group's order; each result is then copied out of the
 * segments. The first dimensions of members agreed through the cache
 * (dims0s[i] NULL) are learnt in one MPI_Allgather for all of them. */
hvd_result_t hvd__mpi_allgather_fused(hvd__mpi_state_t *s,
                                      const hvd__exec_env_t *env,
                                      const hvd__work_t *w, int *alone) {
  hvd_result_t rc = HVD_SUCCESS;
  *alone = 0;
  int m = w->n, P = env->size;
  HVD__CHECK(group_dims(s, env, w));
  const int64_t *dims = s->gdims;
  int64_t total = 0, rows;
  for (int i = 0; i < m; i++) /* every output fits (alike on every rank) */
    HVD__CHECK(
        hvd__allgather_rows(w->reqs[i], 1, dims + (size_t)i * P, P, &rows));
  for (int q = 0; q < P; q++) {
    int64_t seg = 0;
    for (int i = 0; i < m && seg <= INT_MAX; i++) { /* to INT_MAX + 1 */
      int64_t b = /* at most its output's bytes: no wrap */
          dims[(size_t)i * P + (size_t)q] * hvd__row_bytes(&w->reqs[i]->desc);
      seg = b > INT_MAX - seg ? (int64_t)INT_MAX + 1 : seg + b;
    }
    if (seg > INT_MAX || total + seg > INT_MAX) { /* each by rows */
      *alone = 1;
      return HVD_SUCCESS;
    }
    s->counts[q] = (int)seg;
    s->displs[q] = (int)total;
    total += seg;
  }
  hvd_result_t ready = HVD_SUCCESS; /* the results and the buffer */
  for (int i = 0; i < m && ready == HVD_SUCCESS; i++) {
    HVD__CHECK(
        hvd__allgather_rows(w->reqs[i], 1, dims + (size_t)i * P, P, &rows));
    ready = hvd__mpi_alloc_rows(w->reqs[i], &w->reqs[i]->desc, rows);
  }
  if (ready == HVD_SUCCESS && total > 0)
    ready = hvd__grow((void **)&s->gather, &s->gather_cap, (size_t)total,
                      "fused allgather buffer");
  HVD__CHECK(hvd__agree_ready(env, ready)); /* before any MPI step */
  if (total == 0)
    return HVD_SUCCESS;
  char *mine = s->gather + s->displs[env->rank];
  for (int i = 0; i < m; i++) {
    size_t b =
        (size_t)(w->reqs[i]->send.shape[0] * hvd__row_bytes(&w->reqs[i]->desc));
    if (b > 0)
      memcpy(mine, w->reqs[i]->send.data, b);
    mine += b;
  }
  HVD__MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, s->gather, s->counts,
                                s->displs, MPI_BYTE, env->comm));
  for (int q = 0; q < P; q++) {
    const char *from = s->gather + s->displs[q];
    for (int i = 0; i < m; i++) {
      int64_t rb = hvd__row_bytes(&w->reqs[i]->desc), before = 0;
      for (int k = 0; k < q; k++)
        before += dims[(size_t)i * P + (size_t)k];
      size_t b = (size_t)(dims[(size_t)i * P + (size_t)q] * rb);
      if (b > 0)
        memcpy((char *)w->reqs[i]->recv.data + before * rb, from, b);
      from += b;
    }
  }
fail:
  return rc;
}

/* A fused group of reducescatters (w->n > 1, host tensors of one dtype,
 * op and scaling; any shapes) in one ordered reduce-scatter (rank order,
 * as one tensor's alone). The send buffer
 * holds block k of every member, in the group's order, for k = 0..P-1
 * (prescaled as they are packed); this rank's reduced blocks come back
 * after them, are finished (average, postscale) at once and copied out
 * to each member's result. */
hvd_result_t hvd__mpi_reducescatter_fused(hvd__mpi_state_t *s,
                                          const hvd__exec_env_t *env,
                                          const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t dtype = d->dtype;
  size_t es = hvd_dtype_size(dtype);
  int64_t P = env->size, total = 0;
  for (int64_t k = 0; k < P; k++) {
    int64_t cnt = 0; /* elements of block k over the group */
    for (int i = 0; i < w->n; i++) {
      const hvd__desc_t *di = &w->reqs[i]->desc;
      cnt += hvd__block_rows(di->shape[0], P, k) *
             (hvd__row_bytes(di) / (int64_t)es);
    }
    if (cnt > INT_MAX)
      return hvd__set_error(HVD_ERR_UNSUPPORTED,
                            "a fused reducescatter block of %lld elements "
                            "exceeds MPI's int counts (lower "
                            "HVD_FUSION_THRESHOLD)",
                            (long long)cnt);
    s->counts[k] = (int)cnt;
    total += cnt;
  }
  if (total > INT_MAX) /* alike on every rank: no rank to name */
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "a fused reducescatter of %lld elements exceeds "
                          "MPI's int counts (lower HVD_FUSION_THRESHOLD)",
                          (long long)total);
  int64_t mine = s->counts[env->rank];
  hvd_result_t ready = HVD_SUCCESS; /* the results, buffer and room */
  for (int i = 0; i < w->n && ready == HVD_SUCCESS; i++) {
    const hvd__desc_t *di = &w->reqs[i]->desc;
    ready = hvd__mpi_alloc_rows(w->reqs[i], di,
                                hvd__block_rows(di->shape[0], P, env->rank));
  }
  if (ready == HVD_SUCCESS && total > 0)
    ready =
        hvd__grow((void **)&s->gather, &s->gather_cap,
                  (size_t)(total + mine) * es, "fused reducescatter buffer");
  if (ready == HVD_SUCCESS && total > 0)
    ready = hvd__ordered_scatter_room(&s->ord, env->size, env->rank, s->counts,
                                      dtype);
  HVD__CHECK(hvd__agree_ready(env, ready)); /* before any MPI step */
  if (total == 0)
    return HVD_SUCCESS;
  char *at = s->gather, *got = s->gather + (size_t)total * es;
  for (int64_t k = 0; k < P; k++)
    for (int i = 0; i < w->n; i++) {
      const hvd_request_t *r = w->reqs[i];
      int64_t rows = r->desc.shape[0], rb = hvd__row_bytes(&r->desc);
      int64_t n = hvd__block_rows(rows, P, k) * rb / (int64_t)es;
      if (n == 0) /* (an empty tensor's data may be NULL) */
        continue;
      const char *from =
          (const char *)r->send.data + hvd__block_first(rows, P, k) * rb;
      hvd__scale(at, from, n, dtype, d->prescale); /* a copy at 1.0 */
      at += (size_t)n * es;
    }
  HVD__CHECK(hvd__ordered_reduce_scatter(&s->ord, env->comm, s->gather,
                                         s->counts, got, dtype, d->op));
  hvd__reduce_finish(got, got, mine, dtype, d->op, d->postscale, env->size);
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    size_t b = (size_t)(hvd__block_rows(r->desc.shape[0], P, env->rank) *
                        hvd__row_bytes(&r->desc));
    if (b > 0)
      memcpy(r->recv.data, got, b);
    got += b;
  }
fail:
  return rc;
}
