/*
 * mpi_ops.c - the MPI executor: collectives on host memory over hvd's
 * communicator (its parts: mpi_int.h). Every reduction folds each element
 * over the ranks in rank order (within a node, then across nodes),
 * whatever the fusion: through the node's shared memory
 * (shm_allreduce.c), or ordered.c's reductions over MPI, never
 * MPI_Allreduce, whose order changes with the count. Fused allgathers and
 * reducescatters are gather_scatter.c's. Scale factors are applied in the
 * copies around the reduction; counts beyond INT_MAX go in chunks.
 */
#include "ops/mpi_ops.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/fault.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "ops/mpi_int.h"
#include "ops/ordered.h"
#include "ops/reduce.h"

static void mpi_close(void *state, int collective) {
  hvd__mpi_state_t *s = state;
  if (s == NULL)
    return;
  hvd__ordered_free(&s->ord);
  hvd__shm_close(&s->shm, collective);
  free(s->counts);
  free(s->displs);
  free(s->counts2);
  free(s->displs2);
  free(s->splits);
  free(s->stage);
  free(s->gather);
  free(s->gdims);
  free(s->ada_peer);
  free(s);
}

/* Every rank's host memory first, agreed (hvd__agree_ready): a rank
 * without it fails every rank's open alike, before the shared-memory
 * path's collective steps. */
static hvd_result_t mpi_open(const hvd__exec_env_t *env, void **state) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t n = (size_t)env->size;
  hvd__mpi_state_t *s = hvd__fault("executor") ? NULL : calloc(1, sizeof *s);
  int had = s != NULL;
  if (had) {
    s->counts = calloc(n, sizeof(int));
    s->displs = calloc(n, sizeof(int));
    s->counts2 = calloc(n, sizeof(int));
    s->displs2 = calloc(n, sizeof(int));
    s->splits = calloc(n, sizeof(int64_t));
    had = hvd__shm_alloc(&s->shm, env) && s->counts && s->displs &&
          s->counts2 && s->displs2 && s->splits;
  }
  if (!had)
    rc = hvd__set_error(HVD_ERR_NO_MEMORY,
                        "could not allocate the MPI executor's state");
  HVD__CHECK(hvd__agree_ready(env, rc));
  HVD__CHECK(hvd__shm_open(&s->shm, env));
  *state = s;
  return HVD_SUCCESS;
fail:
  mpi_close(s, 0);
  return rc;
}

/* ---- helpers ------------------------------------------------------------ */

hvd_result_t hvd__mpi_alloc_rows(hvd_request_t *r, const hvd__desc_t *d,
                                 int64_t rows) {
  int64_t shape[HVD_MAX_DIMS];
  memcpy(shape, d->shape, sizeof shape);
  shape[0] = rows;
  return hvd__alloc_output(r, d->ndim, shape);
}

static int64_t desc_numel(const hvd__desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->ndim; i++)
    n *= d->shape[i];
  return n;
}

/* A contiguous datatype of one row; fails if a row or a count cannot be
 * expressed in MPI's int. */
static hvd_result_t row_type(int64_t bytes, int64_t rows, MPI_Datatype *t) {
  hvd_result_t rc = HVD_SUCCESS;
  if (bytes > INT_MAX || rows > INT_MAX)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "rows of %lld bytes x %lld rows exceed MPI's int "
                          "counts",
                          (long long)bytes, (long long)rows);
  HVD__MPI_CHECK(MPI_Type_contiguous((int)bytes, MPI_BYTE, t));
  HVD__MPI_CHECK(MPI_Type_commit(t));
fail:
  return rc;
}

/* Allreduce of n elements (src may be MPI_IN_PLACE) with d's dtype and op;
 * with `finish`, average and postscale are applied to dst too. Within a
 * node through shared memory when available; else ordered reductions over
 * MPI in pieces its int can count: over all ranks, or hierarchical (within
 * the node, then among the nodes' local roots, then a broadcast within the
 * node) when asked. Either way each element is folded in one fixed order:
 * rank order, or with hierarchical each node's in local-rank order and
 * then the nodes' in node order. */
static hvd_result_t reduce_span(hvd__mpi_state_t *s, const hvd__exec_env_t *env,
                                const void *src, void *dst, int64_t n,
                                const hvd__desc_t *d, int finish) {
  if (s->shm.on)
    return hvd__shm_span(&s->shm, env, src, dst, n, d, finish);
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = d->dtype;
  hvd_op_t op = d->op;
  size_t esize = hvd_dtype_size(dtype);
  int hier = env->hierarchical; /* decided for every rank alike at start */
  for (int64_t off = 0; off < n; off += HVD__MPI_MAX_ELEMS) {
    int64_t count = n - off < HVD__MPI_MAX_ELEMS ? n - off : HVD__MPI_MAX_ELEMS;
    const void *sp =
        src == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)src + off * esize;
    char *dp = (char *)dst + off * esize;
    if (!hier) {
      HVD__CHECK(
          hvd__ordered_allreduce(&s->ord, env->comm, sp, dp, count, dtype, op));
    } else {
      HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->local_comm, sp, dp, count,
                                        dtype, op));
      if (env->local_rank == 0)
        HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm,
                                          MPI_IN_PLACE, dp, count, dtype, op));
      HVD__MPI_CHECK(
          MPI_Bcast(dp, (int)count, hvd__mpi_dtype(dtype), 0, env->local_comm));
    }
    if (finish)
      hvd__reduce_finish(dp, dp, count, dtype, op, d->postscale, env->size);
  }
fail:
  return rc;
}

void hvd__mpi_trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                    const char *phase, double t0, double t1) {
  if (env->trace != NULL && !r->is_stub)
    env->trace(env->trace_ctx, r, phase, t0, t1);
}

/* The timeline's spans of an allreduce's phases: each mark ends, for
 * requests [a, b), the phase that began at the mark before. Nothing is
 * timed with the timeline off. */
typedef struct span {
  const hvd__exec_env_t *env;
  double t;
} span_t;

static span_t span_begin(const hvd__exec_env_t *env) {
  return (span_t){env, env->trace != NULL ? hvd__now() : 0};
}

static void span_mark(span_t *sp, hvd_request_t *const *rs, int a, int b,
                      const char *phase) {
  if (sp->env->trace == NULL)
    return;
  double t = hvd__now();
  for (int k = a; k < b; k++)
    hvd__mpi_trace(sp->env, rs[k], phase, sp->t, t);
  sp->t = t;
}

/* A tensor of at least one chunk (or alone): reduced in the caller's
 * memory, chunk by chunk, each chunk scaled before and finished after
 * while it is in cache. Out of place without prescale, MPI reads send. */
static hvd_result_t reduce_direct(hvd__mpi_state_t *s,
                                  const hvd__exec_env_t *env,
                                  const hvd__desc_t *d, hvd_request_t *r,
                                  int64_t chunk_elems) {
  hvd_dtype_t dtype = d->dtype;
  size_t esize = hvd_dtype_size(dtype);
  int64_t n = hvd_tensor_numel(&r->send);
  span_t sp = span_begin(env);
  for (int64_t off = 0; off < n; off += chunk_elems) {
    int64_t cnt = n - off < chunk_elems ? n - off : chunk_elems;
    const char *src = (const char *)r->send.data + off * esize;
    char *dst = (char *)r->recv.data + off * esize;
    if (!r->is_stub && d->prescale != 1.0) {
      hvd__scale(dst, src, cnt, dtype, d->prescale);
      src = dst;
    }
    hvd_result_t rc = reduce_span(s, env, src == dst ? MPI_IN_PLACE : src, dst,
                                  cnt, d, !r->is_stub);
    if (rc != HVD_SUCCESS)
      return rc;
  }
  span_mark(&sp, &r, 0, 1, "ALLREDUCE");
  return HVD_SUCCESS;
}

/* The size a buffer kept across allreduces grows to from `need` bytes:
 * the next power of two, at most `most` (>= need), so that the ranks
 * agree on its growth a few times at most, not at each larger group. */
static size_t grown(size_t need, size_t most) {
  size_t n = 1;
  while (n < need)
    n <<= 1;
  return n < most ? n : most;
}

/* Room for a group's ordered reductions over MPI (total elements of dtype,
 * at most `chunk` in one call): over every rank without the shared-memory
 * path, across the nodes with it (MPI calls of a shared piece at most).
 * After it they allocate nothing. Its size, from agreed sizes and
 * settings, is every rank's alike; it grows past what the ranks agreed
 * (rarely: towards a chunk, in powers of two) with their agreement, so
 * that a rank without the memory fails it everywhere before any MPI step
 * and the common allreduce adds none. */
static hvd_result_t reserve_reduction(hvd__mpi_state_t *s,
                                      const hvd__exec_env_t *env, int64_t total,
                                      int64_t chunk, hvd_dtype_t dtype) {
  if (s->shm.on && !s->shm.cross)
    return HVD_SUCCESS; /* no reduction over MPI */
  hvd__ordered_t *o = s->shm.on ? &s->shm.ord : &s->ord;
  /* at most these ranks in a call: the nodes (as many ranks on each, with
   * the shared-memory path), or all (hierarchical: the node's or the
   * local roots', which differ between ranks) */
  int p = s->shm.on ? env->size / env->local_size : env->size;
  int64_t most =
      s->shm.on ? hvd__shm_piece_bytes(env) / (int64_t)hvd_dtype_size(dtype)
                : chunk;
  most = most < HVD__MPI_MAX_ELEMS ? most : HVD__MPI_MAX_ELEMS;
  most = most > 1 ? most : 1;
  size_t need =
      hvd__ordered_allreduce_room(total < most ? total : most, p, dtype);
  if (need <= o->agreed) /* the common case: no MPI step */
    return HVD_SUCCESS;
  size_t bytes = grown(need, hvd__ordered_allreduce_room(most, p, dtype));
  hvd_result_t rc =
      hvd__fault("reduction")
          ? hvd__set_error(HVD_ERR_NO_MEMORY,
                           "could not allocate %zu bytes for the reduction "
                           "buffer",
                           bytes)
          : hvd__ordered_reserve(o, bytes, p);
  rc = hvd__agree_ready(env, rc);
  if (rc == HVD_SUCCESS)
    o->agreed = bytes;
  return rc;
}

/* The fusion buffer (s->stage) holds `need` bytes (at most `most`, a
 * chunk): its growth agreed (hvd__grow_agreed), its size every rank's
 * alike (from the group's agreed sizes and the chunk setting). */
static hvd_result_t reserve_stage(hvd__mpi_state_t *s,
                                  const hvd__exec_env_t *env, size_t need,
                                  size_t most) {
  if (need <= s->stage_cap)
    return HVD_SUCCESS;
  return hvd__grow_agreed(env, "fusion", (void **)&s->stage, &s->stage_cap,
                          grown(need, most), "fusion buffer");
}

/* Unpacks a compressed chunk of `used` elements from the stage, packed
 * from request i's element off on: the pack's walk again. */
static void unpack_wire(const hvd__exec_env_t *env, const hvd__work_t *w,
                        const uint16_t *stage, int i, int64_t off,
                        int64_t used) {
  const hvd__desc_t *d = w->desc;
  for (int64_t at = 0; at < used;) {
    hvd_request_t *r = w->reqs[i];
    int64_t n = hvd_tensor_numel(&r->send);
    int64_t take = n - off < used - at ? n - off : used - at;
    if (!r->is_stub && take > 0)
      hvd__cast_from_wire((float *)r->recv.data + off, stage + at, take,
                          d->wire, d->op, d->postscale, env->size);
    at += take;
    off += take;
    if (off == n) {
      i++;
      off = 0;
    }
  }
}

/* A compressed group (float32 tensors, float16/bfloat16 on the wire):
 * every tensor goes through the staging chunk, cast to the wire with the
 * prescale on the way in and back with average/postscale on the way out;
 * a tensor larger than a chunk is cut into pieces. Stubs (a joined rank)
 * carry the identity, which the casts keep. */
static hvd_result_t allreduce_wire(hvd__mpi_state_t *s,
                                   const hvd__exec_env_t *env,
                                   const hvd__work_t *w, int64_t chunk_elems) {
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t wire = d->wire;
  hvd__desc_t dw = *d; /* what the chunk reduction sees */
  dw.dtype = d->wire;
  int64_t total = 0; /* the stage holds a chunk, or all of them if less */
  for (int k = 0; k < w->n; k++)
    total += hvd_tensor_numel(&w->reqs[k]->send);
  size_t es = sizeof(uint16_t);
  int64_t staged = total < chunk_elems ? (total > 0 ? total : 1) : chunk_elems;
  hvd_result_t rc = reserve_reduction(s, env, total, chunk_elems, wire);
  if (rc == HVD_SUCCESS)
    rc = reserve_stage(s, env, (size_t)staged * es, (size_t)chunk_elems * es);
  uint16_t *stage = (uint16_t *)s->stage;
  int i = 0;
  int64_t off = 0;
  while (rc == HVD_SUCCESS && i < w->n) {
    int i0 = i;
    int64_t off0 = off, used = 0;
    while (i < w->n && used < chunk_elems) { /* pack */
      hvd_request_t *r = w->reqs[i];
      int64_t left = hvd_tensor_numel(&r->send) - off;
      int64_t take = left < chunk_elems - used ? left : chunk_elems - used;
      hvd__cast_to_wire(stage + used, (const float *)r->send.data + off, take,
                        wire, r->is_stub ? 1.0 : d->prescale);
      used += take;
      off += take;
      if (off == hvd_tensor_numel(&r->send)) {
        i++;
        off = 0;
      }
    }
    rc = reduce_span(s, env, MPI_IN_PLACE, stage, used, &dw, 0);
    if (rc == HVD_SUCCESS)
      unpack_wire(env, w, stage, i0, off0, used);
  }
  return rc;
}

/* A fused group: tensors of a chunk or more go in place (no copy); runs of
 * smaller tensors are packed into one chunk (prescale fused into the copy),
 * reduced, and unpacked (average and postscale fused into the copy back).
 * With the shared-memory allreduce the chunk is this rank's slot and the
 * unpack reads the slots, so the copies are the only passes over the bytes;
 * otherwise it is a staging buffer. Each chunk is packed, reduced and
 * unpacked while it is hot in cache. */
static hvd_result_t mpi_allreduce(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  hvd__mpi_state_t *s = state;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t dtype = d->dtype;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  int64_t chunk = env->chunk_bytes > 0 ? env->chunk_bytes : HVD__MPI_CHUNK;
  int64_t chunk_elems = chunk / esize > 0 ? chunk / esize : 1;
  if (d->op == HVD_ADASUM) /* not elementwise: its own tree */
    return hvd__adasum_allreduce(s, env, w);
  if (d->wire != d->dtype)
    return allreduce_wire(s, env, w, chunk_elems);
  /* the same choice on every rank: shm is agreed, the chunk is a setting */
  const int direct =
      s->shm.on && chunk_elems * esize <= hvd__shm_piece_bytes(env);
  int64_t packed = 0, total = 0; /* packed: the tensors below a chunk */
  for (int k = 0; k < w->n; k++) {
    int64_t m = hvd_tensor_numel(&w->reqs[k]->send);
    packed += m < chunk_elems ? m : 0;
    total += m;
  }
  /* this rank's memory before any MPI step: agreed only when it grows;
   * the fusion buffer a chunk at most, never more */
  int64_t staged = packed < chunk_elems ? packed : chunk_elems;
  hvd_result_t rc = reserve_reduction(s, env, total, chunk_elems, dtype);
  if (rc == HVD_SUCCESS && w->n > 1 && !direct && packed > 0)
    rc = reserve_stage(s, env, (size_t)(staged * esize),
                       (size_t)(chunk_elems * esize));
  int zc_done = 0;
  if (rc == HVD_SUCCESS)
    rc = hvd__zc_allreduce(&s->shm, env, w, &zc_done);
  if (rc != HVD_SUCCESS || zc_done)
    return rc;
  /* Packing decisions depend on sizes only, which every rank agrees on; a
   * joined rank's stubs take the same path with identity data. */
  for (int i = 0; i < w->n && rc == HVD_SUCCESS;) {
    hvd_request_t *r = w->reqs[i];
    int64_t n = hvd_tensor_numel(&r->send);
    if (n >= chunk_elems || w->n == 1) {
      rc = reduce_direct(s, env, d, r, chunk_elems);
      i++;
      continue;
    }
    int j = i;
    int64_t used = 0;
    char *buf = direct ? hvd__shm_chunk(&s->shm, env) : s->stage;
    span_t sp = span_begin(env);
    for (; j < w->n; j++) { /* pack */
      hvd_request_t *q = w->reqs[j];
      int64_t m = hvd_tensor_numel(&q->send);
      if (m >= chunk_elems || used + m > chunk_elems)
        break;
      hvd__scale(buf + used * esize, q->send.data, m, dtype,
                 q->is_stub ? 1.0 : d->prescale);
      used += m;
      span_mark(&sp, w->reqs, j, j + 1, "MEMCPY_IN_FUSION_BUFFER");
    }
    rc = direct ? hvd__shm_reduce_chunk(&s->shm, env, used, d)
                : reduce_span(s, env, MPI_IN_PLACE, buf, used, d, 0);
    span_mark(&sp, w->reqs, i, j, "ALLREDUCE");
    for (int64_t at = 0; i < j; i++) { /* unpack */
      hvd_request_t *q = w->reqs[i];
      int64_t m = hvd_tensor_numel(&q->send);
      if (rc == HVD_SUCCESS && !q->is_stub) {
        if (direct)
          hvd__shm_unpack(&s->shm, env, used, at, m, q->recv.data, d);
        else
          hvd__reduce_finish(q->recv.data, buf + at * esize, m, dtype, d->op,
                             d->postscale, env->size);
      }
      at += m;
      span_mark(&sp, w->reqs, i, i + 1, "MEMCPY_OUT_FUSION_BUFFER");
    }
    if (direct)
      hvd__shm_next(&s->shm); /* the next piece flips, as in a span's */
  }
  return rc;
}

static hvd_result_t mpi_broadcast(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  (void)state;
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    int64_t bytes = (int64_t)hvd__tensor_bytes(&r->send);
    for (int64_t off = 0; off < bytes; off += HVD__MPI_MAX_ELEMS) {
      int count = (int)(bytes - off < HVD__MPI_MAX_ELEMS ? bytes - off
                                                         : HVD__MPI_MAX_ELEMS);
      HVD__MPI_CHECK(MPI_Bcast((char *)r->send.data + off, count, MPI_BYTE,
                               w->desc->root, env->comm));
    }
  }
fail:
  return rc;
}

/* One allgather (d: its descriptor), in rows (any size): dims0 each
 * rank's rows, or NULL (agreed through the cache: learnt here). */
static hvd_result_t allgather_one(hvd__mpi_state_t *s,
                                  const hvd__exec_env_t *env, hvd_request_t *r,
                                  const hvd__desc_t *d, const int64_t *dims0) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Datatype row = MPI_DATATYPE_NULL;
  if (dims0 == NULL) { /* agreed through the cache: learn them now */
    s->splits[env->rank] = r->send.shape[0];
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 1, MPI_INT64_T, s->splits, 1,
                                 MPI_INT64_T, env->comm));
    dims0 = s->splits;
  }
  int64_t total = 0; /* (a fused group's members: checked already) */
  HVD__CHECK(hvd__allgather_rows(r, 0, dims0, env->size, &total));
  HVD__CHECK(hvd__agree_ready(env, hvd__mpi_alloc_rows(r, d, total)));
  int64_t rb = hvd__row_bytes(d);
  if (rb == 0 || total == 0)
    return HVD_SUCCESS;
  HVD__CHECK(row_type(rb, total, &row));
  for (int k = 0, at = 0; k < env->size; k++) {
    s->counts[k] = (int)dims0[k];
    s->displs[k] = at;
    at += s->counts[k];
  }
  /* in place when the caller's rows are already where they go (a given
   * output: ZeRO's blocks inside their parameter) */
  const void *in =
      (const char *)r->recv.data + (size_t)s->displs[env->rank] * (size_t)rb;
  HVD__MPI_CHECK(MPI_Allgatherv(
      r->send.data == in ? MPI_IN_PLACE : r->send.data, s->counts[env->rank],
      row, r->recv.data, s->counts, s->displs, row, env->comm));
fail:
  if (row != MPI_DATATYPE_NULL)
    MPI_Type_free(&row);
  return rc;
}

static hvd_result_t mpi_allgather(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  hvd__mpi_state_t *s = state;
  if (w->n == 1)
    return allgather_one(s, env, w->reqs[0], w->desc, w->dims0s[0]);
  int alone = 0; /* too big to fuse: each member, its rows gathered */
  hvd_result_t rc = hvd__mpi_allgather_fused(s, env, w, &alone);
  for (int i = 0; i < w->n && alone && rc == HVD_SUCCESS; i++)
    rc = allgather_one(s, env, w->reqs[i], &w->reqs[i]->desc,
                       s->gdims + (size_t)i * (size_t)env->size);
  return rc;
}

static hvd_result_t mpi_alltoall(void *state, const hvd__exec_env_t *env,
                                 const hvd__work_t *w) {
  hvd__mpi_state_t *s = state;
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  MPI_Datatype row = MPI_DATATYPE_NULL;
  hvd_request_t *r = w->reqs[0];
  size_t n = (size_t)env->size;
  int64_t total, sent = 0;
  /* the answers land in s->splits; the output is allocated before the
   * splits' agreement, which carries any rank's failure */
  HVD__CHECK(hvd__exchange_splits(r, env, s->splits, 1, &total));
  for (size_t k = 0; k < n; k++)
    sent += r->splits[k];
  int64_t rb = hvd__row_bytes(d);
  if (rb == 0)
    return HVD_SUCCESS;
  HVD__CHECK(row_type(rb, total > sent ? total : sent, &row));
  for (size_t k = 0, sat = 0, rat = 0; k < n; k++) {
    s->counts[k] = (int)r->splits[k];
    s->displs[k] = (int)sat;
    s->counts2[k] = (int)r->recv_splits[k];
    s->displs2[k] = (int)rat;
    sat += (size_t)r->splits[k];
    rat += (size_t)r->recv_splits[k];
  }
  HVD__MPI_CHECK(MPI_Alltoallv(r->send.data, s->counts, s->displs, row,
                               r->recv.data, s->counts2, s->displs2, row,
                               env->comm));
fail:
  if (row != MPI_DATATYPE_NULL)
    MPI_Type_free(&row);
  return rc;
}

static hvd_result_t mpi_reducescatter(void *state, const hvd__exec_env_t *env,
                                      const hvd__work_t *w) {
  hvd__mpi_state_t *s = state;
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  if (w->n > 1)
    return hvd__mpi_reducescatter_fused(s, env, w);
  hvd_request_t *r = w->reqs[0];
  hvd_dtype_t dtype = d->dtype;
  void *scaled = NULL;
  int64_t rows = d->shape[0], p = env->size;
  int64_t row_elems = hvd__row_bytes(d) / (int64_t)hvd_dtype_size(dtype);
  int64_t mine = hvd__block_rows(rows, p, env->rank), n = desc_numel(d);
  if (rows / p * row_elems + row_elems > INT_MAX) /* alike on every rank */
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "a reducescatter block exceeds MPI's int counts");
  for (int k = 0; k < env->size; k++)
    s->counts[k] = (int)(hvd__block_rows(rows, p, k) * row_elems);
  if (n > INT_MAX) /* alike on every rank: no rank to name */
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "a reducescatter of %lld elements exceeds MPI's "
                          "int counts",
                          (long long)n);
  /* this rank's memory (output, prescaled copy, the reduction's room),
   * agreed before any MPI step */
  hvd_result_t ready = hvd__mpi_alloc_rows(r, d, mine);
  size_t sb = (size_t)n * hvd_dtype_size(dtype) + 1;
  if (ready == HVD_SUCCESS && d->prescale != 1.0 &&
      (scaled = malloc(sb)) == NULL)
    ready = hvd__set_error(HVD_ERR_NO_MEMORY,
                           "could not allocate %zu bytes for the prescaled "
                           "copy of reducescatter '%s'",
                           sb, r->name);
  if (ready == HVD_SUCCESS)
    ready = hvd__ordered_scatter_room(&s->ord, env->size, env->rank, s->counts,
                                      dtype);
  HVD__CHECK(hvd__agree_ready(env, ready));
  const void *src = r->send.data;
  if (scaled != NULL) {
    hvd__scale(scaled, src, n, dtype, d->prescale);
    src = scaled;
  }
  HVD__CHECK(hvd__ordered_reduce_scatter(&s->ord, env->comm, src, s->counts,
                                         r->recv.data, dtype, d->op));
  hvd__reduce_finish(r->recv.data, r->recv.data, mine * row_elems, dtype, d->op,
                     d->postscale, env->size);
fail:
  free(scaled);
  return rc;
}

hvd_result_t hvd__mpi_barrier(void *state, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  (void)state;
  (void)w;
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request mr;
  HVD__MPI_CHECK(MPI_Ibarrier(env->comm, &mr));
  rc = hvd__mpi_wait(&mr, "MPI_Ibarrier");
fail:
  return rc;
}

/* A joined rank's contribution on the host: the identity of the op. */
static hvd_result_t mpi_stub_alloc(void *state, const hvd__exec_env_t *env,
                                   hvd_request_t *r) {
  (void)state;
  (void)env;
  int64_t n = hvd_tensor_numel(&r->send);
  r->send.device = HVD_CPU;
  r->send.data = malloc((size_t)n * hvd_dtype_size(r->send.dtype) + 1);
  if (r->send.data == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "stub for '%s'", r->name);
  hvd__fill_identity(r->send.data, n, r->send.dtype, r->desc.op);
  r->recv = r->send;
  return HVD_SUCCESS;
}

static void mpi_stub_free(void *state, hvd_request_t *r) {
  (void)state;
  free(r->send.data);
  r->send.data = r->recv.data = NULL;
}

const hvd__executor_t hvd__mpi_executor = {
    .name = "mpi",
    .open = mpi_open,
    .close = mpi_close,
    .run =
        {
            [HVD__ALLREDUCE] = mpi_allreduce,
            [HVD__BROADCAST] = mpi_broadcast,
            [HVD__ALLGATHER] = mpi_allgather,
            [HVD__ALLTOALL] = mpi_alltoall,
            [HVD__REDUCESCATTER] = mpi_reducescatter,
            [HVD__BARRIER] = hvd__mpi_barrier,
        },
    .stub_alloc = mpi_stub_alloc,
    .stub_free = mpi_stub_free,
    .default_chunk = HVD__MPI_CHUNK,
    .fuses = 1u << HVD__ALLGATHER | 1u << HVD__REDUCESCATTER,
};
