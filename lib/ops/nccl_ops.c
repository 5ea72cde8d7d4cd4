/*
 * nccl_ops.c - the NCCL executor: collectives on device tensors (each on
 * its rank's GPU) over one NCCL communicator, on hvd's own stream.
 *
 *  - The communicator is made on the first device collective, which every
 *    rank runs at the same point of the agreed order: every rank's GPU set
 *    up (agreed over MPI), rank 0's ncclGetUniqueId broadcast over hvd's
 *    MPI communicator, ncclCommInitRankConfig, and agreement that it
 *    worked. The communicator is non-blocking: whatever NCCL would block
 *    in (its init, the connections it makes on first use, finalize) is
 *    waited for here, within HVD_NCCL_TIMEOUT (nccl_fail.c). When NCCL's
 *    init fails on any rank, every rank fails, and NCCL stays unusable (as
 *    after an abort, below).
 *  - Allreduce: a lone tensor is reduced in the caller's memory (prescale
 *    into recv first, then in place; average and postscale by a kernel
 *    after, when they change anything); so is every tensor of a fused
 *    group at one rank, where the fusion buffer would only add two passes
 *    over the bytes. A fused group, or a compressed tensor (float32 as
 *    float16/bfloat16 on the wire), goes through a persistent fusion buffer
 *    on the device: one batched pack (prescale and the cast fused), one
 *    ncclAllReduce, one batched unpack (average, postscale and the cast
 *    back fused). Sum, min, max and product are NCCL's own; average is a
 *    sum finished by the kernel, as on the host (ncclAvg would divide
 *    before summing, with other roundings).
 *  - Broadcast: ncclBroadcast in place. Allgather, alone or fused (first
 *    dimensions from the negotiation, or one MPI_Allgather for the tensors
 *    agreed through the cache): one NCCL group holding an ncclAllGather
 *    per tensor of at least 64 KiB with as many rows on every rank,
 *    straight into its output (in place when its rows are there already),
 *    and one ncclAllGather for all the others together, packed by rank
 *    into the fusion buffer (each rank's rows padded to the tensor's
 *    largest share) and unpacked after. Alltoall: splits
 *    exchanged with MPI_Alltoall, then ncclSend/ncclRecv to every other
 *    rank in a group and a device copy of our own rows. Reducescatter:
 *    rank r gets N/P rows plus one if r < N%P, as on the host; NCCL wants
 *    equal blocks, so an uneven tensor is padded: block k of ceil(N/P)
 *    rows holds rank k's rows (prescale fused into that copy), the padding
 *    rows are left as they are and their results dropped. A fused group
 *    lays every member's block k end to end in the buffer's region k, and
 *    one ncclReduceScatter (in place) reduces them all. Barrier: MPI.
 *  - One rank: allgathers and reducescatters make no NCCL call (NCCL
 *    would copy each tensor with a launch of its own): one batched copy
 *    kernel (nothing in place), or the prescale and finish kernels.
 *  - Completion: an event recorded after the work and waited for before
 *    returning (hvd__gpu_wait, hvd__mpi_wait's polling policy), checking
 *    ncclCommGetAsyncError meanwhile. An asynchronous error, or no
 *    completion within HVD_NCCL_TIMEOUT seconds (of an enqueue that NCCL
 *    left in progress, or of the work), or any other failure once
 *    the communicator exists, aborts it (ncclCommAbort: kernels still
 *    waiting for peers end) and fails with NCCL's message; later device
 *    collectives then fail at once with that message. A rank that aborts
 *    on a failure of its own sends every peer its reason over MPI (an
 *    abort notice, NOTICE_TAG on the executor's communicator); a peer
 *    learns it before its next launch or while it waits (a collective in
 *    flight gets NOTICE_GRACE_S to finish: the failed rank may have done
 *    its part) and aborts in turn, without waiting for HVD_NCCL_TIMEOUT,
 *    which is left for a peer that hangs or dies without a word.
 *  - Before launching, a group's allocations (outputs, the fusion buffer,
 *    span arrays) are agreed over MPI whenever any may have been made
 *    (hvd__nccl_agree_prepared): a rank that could not allocate fails the group
 * on every rank with its own error, nothing is launched, and the communicator
 * stays usable.
 */
#include <config.h>

#include "ops/nccl_ops.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "ops/gpu_ops.h"
#include "ops/mpi_ops.h"
#include "ops/nccl_int.h"

static ncclDataType_t nccl_dtype(int dtype) {
  switch (dtype) {
  case HVD_UINT8:
    return ncclUint8;
  case HVD_INT8:
    return ncclInt8;
  case HVD_INT32:
    return ncclInt32;
  case HVD_INT64:
    return ncclInt64;
  case HVD_FLOAT16:
    return ncclFloat16;
  case HVD_BFLOAT16:
    return ncclBfloat16;
  case HVD_FLOAT64:
    return ncclFloat64;
  default:
    return ncclFloat32;
  }
}

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
  case HVD_MIN:
    return ncclMin;
  case HVD_MAX:
    return ncclMax;
  case HVD_PRODUCT:
    return ncclProd;
  default:
    return ncclSum; /* sum, and average (finished by a kernel) */
  }
}

/* The first collective: the communicator, made by every rank together. */
static hvd_result_t comm_create(nccl_state_t *s, const hvd__exec_env_t *env,
                                const hvd__work_t *w) {
  struct {
    ncclUniqueId id;
    int ok;
    char why[512];
  } msg;
  int first = 0;
  hvd_result_t mine = hvd__gpu_enter(&s->gpu, w, "NCCL"), rc;
  HVD__CHECK(hvd__nccl_first_failed(env, mine == HVD_SUCCESS, &first));
  if (mine != HVD_SUCCESS)
    return mine;
  if (first < env->size)
    return hvd__set_error(HVD_ERR_CUDA,
                          "NCCL: rank %d could not set up its GPU (its "
                          "hvd_last_error says why)",
                          first);
  memset(&msg, 0, sizeof msg);
  if (env->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess;
    if (!msg.ok) {
      hvd__nccl_error(r, "ncclGetUniqueId");
      snprintf(msg.why, sizeof msg.why, "%s", hvd_last_error());
    }
  }
  HVD__MPI_CHECK(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, env->comm));
  if (!msg.ok)
    return hvd__set_error(HVD_ERR_NCCL, "NCCL: on rank 0: %s", msg.why);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;          /* see hvd__nccl_settle_wait() */
  hvd__gpu_quiesce(&s->gpu); /* NCCL's setup allocates device memory */
  s->comm = NULL;
  ncclResult_t r =
      ncclCommInitRankConfig(&s->comm, env->size, msg.id, env->rank, &cfg);
  if (s->comm == NULL && NCCL_OK(r))
    r = ncclInternalError; /* no communicator to wait for */
  mine = s->comm != NULL ? hvd__nccl_settle(s, r, "ncclCommInitRankConfig")
                         : hvd__nccl_error(r, "ncclCommInitRankConfig");
  rc = hvd__nccl_first_failed(env, mine == HVD_SUCCESS, &first);
  if (rc == HVD_SUCCESS && first < env->size) {
    rc = mine != HVD_SUCCESS
             ? mine
             : hvd__set_error(HVD_ERR_NCCL,
                              "NCCL: ncclCommInitRankConfig failed on rank %d "
                              "(its hvd_last_error says why)",
                              first);
  }
  if (rc != HVD_SUCCESS) { /* on every rank: NCCL stays unusable */
    if (s->comm != NULL)
      ncclCommAbort(s->comm);
    s->comm = NULL;
    snprintf(s->failed, sizeof s->failed, "%s", hvd_last_error());
    return rc;
  }
  HVD__LOG(HVD__LOG_INFO, "NCCL communicator of %d ranks: rank %d on cuda:%d",
           env->size, env->rank, s->gpu.dev);
  return HVD_SUCCESS;
fail:
  return rc;
}

static hvd_result_t nccl_enter(nccl_state_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w) {
  if (s->failed[0] != '\0')
    return hvd__set_error(HVD_ERR_NCCL,
                          "NCCL is unusable after an earlier failure: %.900s",
                          s->failed);
  if (s->comm == NULL)
    return comm_create(s, env, w);
  hvd_result_t peer =
      hvd__nccl_peer_notice(s); /* nothing launched for a peer gone */
  if (peer != HVD_SUCCESS)
    return peer;
  return hvd__gpu_enter(&s->gpu, w, "NCCL");
}

/* ---- the collectives: each enqueues its work on hvd's stream ---------- */

typedef hvd_result_t (*body_fn)(nccl_state_t *s, const hvd__exec_env_t *env,
                                const hvd__work_t *w);

static hvd_result_t reducescatter_local(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w);

/* One tensor reduced in the caller's memory: prescale into recv first,
 * then in place. */
static hvd_result_t allreduce_one(nccl_state_t *s, const hvd__exec_env_t *env,
                                  const hvd__desc_t *d, hvd_request_t *r) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = d->dtype;
  hvd_op_t op = d->op;
  cudaStream_t st = s->gpu.stream;
  int64_t n = hvd_tensor_numel(&r->send);
  const void *src = r->send.data;
  void *dst = r->recv.data;
  if (n == 0)
    return HVD_SUCCESS;
  if (!r->is_stub && d->prescale != 1.0) {
    HVD__CHECK(hvd__cuda_scale(dst, src, n, dtype, d->prescale, st));
    src = dst;
  }
  NCCL_CHECK(ncclAllReduce(src, dst, (size_t)n, nccl_dtype(dtype), nccl_op(op),
                           s->comm, st));
  /* only when it changes something: the kernel with factor 1 is a copy, a
   * whole pass over the bytes even in place (an average over one rank with
   * postscale 1 is the identity, as in hvd__reduce_finish) */
  if (!r->is_stub &&
      ((op == HVD_AVERAGE && env->size > 1) || d->postscale != 1.0))
    HVD__CHECK(hvd__cuda_reduce_finish(dst, dst, n, dtype, op, d->postscale,
                                       env->size, st));
fail:
  return rc;
}

static hvd_result_t allreduce(nccl_state_t *s, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t dtype = d->dtype, wire = d->wire;
  hvd_op_t op = d->op;
  cudaStream_t st = s->gpu.stream;
  /* Alone, or one rank (nothing to exchange, so no fusion buffer: its pack
   * and unpack would be two passes over the bytes for nothing; an in-place
   * group then costs no device pass at all): in the caller's memory. An
   * in-place ncclAllReduce at one rank costs nothing measurable (an H200:
   * 415 groups of bert base in 2 ms), so it stays (and NCCL's faults with
   * it); reducescatter_local is there because a reducescatter's output is
   * seldom its input. */
  if ((w->n == 1 || env->size == 1) && wire == dtype) {
    for (int i = 0; i < w->n; i++)
      HVD__CHECK(allreduce_one(s, env, d, w->reqs[i]));
    return HVD_SUCCESS;
  }
  /* Through the fusion buffer. Spans: [0, real) pack the real tensors
   * (prescaled), [real, n) pack a joined rank's stubs (the identity, not
   * scaled), [n, n + real) unpack the real tensors. */
  size_t wsize = hvd_dtype_size(wire);
  int64_t total = 0, at = 0, max_real = 0, max_stub = 0;
  int real = 0;
  for (int i = 0; i < w->n; i++) {
    total += hvd_tensor_numel(&w->reqs[i]->send);
    real += !w->reqs[i]->is_stub;
  }
  /* 2n spans, not n + real: a joined rank (stubs only) must grow alike */
  int grows = hvd__gpu_grows(&s->gpu, (size_t)total * wsize, 2 * w->n);
  hvd_result_t mine = hvd__gpu_buffer(&s->gpu, (size_t)total * wsize);
  if (mine == HVD_SUCCESS)
    mine = hvd__gpu_spans(&s->gpu, 2 * w->n);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, grows, mine));
  hvd__cuda_span_t *sp = s->gpu.cur->spans, *dsp = s->gpu.cur->dspans;
  char *buf = s->gpu.buf;
  int a = 0, b = real, u = w->n;
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    int64_t m = hvd_tensor_numel(&r->send);
    char *slot = buf + (size_t)at * wsize;
    if (r->is_stub) {
      sp[b++] = (hvd__cuda_span_t){r->send.data, slot, m};
      max_stub = m > max_stub ? m : max_stub;
    } else {
      sp[a++] = (hvd__cuda_span_t){r->send.data, slot, m};
      sp[u++] = (hvd__cuda_span_t){slot, r->recv.data, m};
      max_real = m > max_real ? m : max_real;
    }
    at += m;
  }
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, w->n + real));
  if (real > 0)
    HVD__CHECK(
        hvd__cuda_pack(dsp, real, max_real, dtype, wire, d->prescale, st));
  if (w->n > real)
    HVD__CHECK(hvd__cuda_pack(dsp + real, w->n - real, max_stub, dtype, wire,
                              1.0, st));
  if (total > 0)
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)total, nccl_dtype(wire),
                             nccl_op(op), s->comm, st));
  if (real > 0)
    HVD__CHECK(hvd__cuda_unpack(dsp + w->n, real, max_real, wire, dtype, op,
                                d->postscale, env->size, st));
fail:
  return rc;
}

static hvd_result_t broadcast(nccl_state_t *s, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  (void)env;
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    size_t bytes = hvd__tensor_bytes(&r->send);
    if (bytes > 0)
      NCCL_CHECK(ncclBroadcast(r->send.data, r->send.data, bytes, ncclUint8,
                               w->desc->root, s->comm, s->gpu.stream));
  }
fail:
  return rc;
}

/* r's output on the device: d's shape with `rows` in dimension 0. */
static hvd_result_t alloc_rows(nccl_state_t *s, hvd_request_t *r,
                               const hvd__desc_t *d, int64_t rows) {
  int64_t shape[HVD_MAX_DIMS];
  memcpy(shape, d->shape, sizeof shape);
  shape[0] = rows;
  return hvd__gpu_alloc_output(&s->gpu, r, d->ndim, shape);
}

/* The end of a group of NCCL calls whose first failure is r (ncclSuccess
 * when none failed): the group's work is enqueued (and settled) here. */
static hvd_result_t group_end(nccl_state_t *s, ncclResult_t r,
                              const char *what) {
  ncclResult_t e = ncclGroupEnd(); /* always: the group must be closed */
  if (!NCCL_OK(r))
    return hvd__nccl_error(r, what);
  return hvd__nccl_settle(s, e, what);
}

static hvd_result_t reducescatter_fused(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w);
static hvd_result_t allgather_local(nccl_state_t *s, const hvd__exec_env_t *env,
                                    const hvd__work_t *w);

static hvd_result_t alltoall(nccl_state_t *s, const hvd__exec_env_t *env,
                             const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  size_t n = (size_t)env->size;
  int64_t total;
  HVD__CHECK(hvd__exchange_splits(r, env, &total));
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, alloc_rows(s, r, d, total)));
  size_t rb = (size_t)hvd__row_bytes(d);
  if (rb == 0)
    return HVD_SUCCESS;
  const char *in = r->send.data;
  char *out = r->recv.data;
  size_t sat = 0, rat = 0, self_s = 0, self_r = 0;
  for (size_t k = 0; k < (size_t)env->rank; k++) {
    self_s += (size_t)r->splits[k] * rb;
    self_r += (size_t)r->recv_splits[k] * rb;
  }
  size_t self = (size_t)r->splits[env->rank] * rb;
  if (self > 0) /* our own rows: a device copy */
    HVD__CUDA_CHECK(cudaMemcpyAsync(out + self_r, in + self_s, self,
                                    cudaMemcpyDeviceToDevice, s->gpu.stream));
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t nr = ncclSuccess;
  for (size_t k = 0; k < n; k++) {
    size_t sb = (size_t)r->splits[k] * rb,
           rbytes = (size_t)r->recv_splits[k] * rb;
    if (k != (size_t)env->rank) {
      if (sb > 0 && NCCL_OK(nr))
        nr = ncclSend(in + sat, sb, ncclUint8, (int)k, s->comm, s->gpu.stream);
      if (rbytes > 0 && NCCL_OK(nr))
        nr = ncclRecv(out + rat, rbytes, ncclUint8, (int)k, s->comm,
                      s->gpu.stream);
    }
    sat += sb;
    rat += rbytes;
  }
  rc = group_end(s, nr, "ncclSend/ncclRecv (alltoall)");
fail:
  return rc;
}

static hvd_result_t reducescatter(nccl_state_t *s, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  if (env->size == 1)
    return reducescatter_local(s, env, w);
  if (w->n > 1)
    return reducescatter_fused(s, env, w);
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  hvd_dtype_t dtype = d->dtype;
  hvd_op_t op = d->op;
  cudaStream_t st = s->gpu.stream;
  size_t esize = hvd_dtype_size(dtype);
  int64_t p = env->size, rows = d->shape[0];
  int64_t row_elems = hvd__row_bytes(d) / (int64_t)esize;
  int64_t mine = hvd__block_rows(rows, p, env->rank);
  int64_t blk = (rows + p - 1) / p; /* rows per block, padded */
  size_t blk_elems = (size_t)(blk * row_elems);
  /* the finishing kernel changes something (with factor 1 it is a copy) */
  int finish = (op == HVD_AVERAGE && p > 1) || d->postscale != 1.0;
  /* everything allocated first, agreed, then launched */
  size_t in_bytes = (size_t)p * blk_elems * esize, scratch = 0;
  if (blk_elems > 0)
    scratch = rows % p != 0        ? in_bytes + blk_elems * esize
              : d->prescale != 1.0 ? (size_t)(rows * row_elems) * esize
                                   : 0;
  hvd_result_t prep = alloc_rows(s, r, d, mine);
  if (prep == HVD_SUCCESS && scratch > 0)
    prep = hvd__gpu_buffer(&s->gpu, scratch);
  if (prep == HVD_SUCCESS && rows % p != 0 && blk_elems > 0)
    prep = hvd__gpu_spans(&s->gpu, (int)p);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, prep));
  if (blk_elems == 0)
    return HVD_SUCCESS;
  char *out = r->recv.data;
  if (rows % p == 0) { /* even blocks: straight from the caller's tensor */
    const void *src = r->send.data;
    if (d->prescale != 1.0) {
      size_t n = (size_t)(rows * row_elems);
      HVD__CHECK(
          hvd__cuda_scale(s->gpu.buf, src, (int64_t)n, dtype, d->prescale, st));
      src = s->gpu.buf;
    }
    NCCL_CHECK(ncclReduceScatter(src, out, blk_elems, nccl_dtype(dtype),
                                 nccl_op(op), s->comm, st));
    if (finish)
      HVD__CHECK(hvd__cuda_reduce_finish(out, out, (int64_t)blk_elems, dtype,
                                         op, d->postscale, env->size, st));
    return HVD_SUCCESS;
  }
  /* uneven: block k (blk rows) of the padded input holds rank k's rows */
  char *pad = s->gpu.buf, *pout = pad + in_bytes;
  const char *in = r->send.data;
  int64_t start = 0;
  for (int64_t k = 0; k < p; k++) {
    int64_t rk = hvd__block_rows(rows, p, k);
    s->gpu.cur->spans[k] =
        (hvd__cuda_span_t){in + (size_t)(start * row_elems) * esize,
                           pad + (size_t)k * blk_elems * esize, rk * row_elems};
    start += rk;
  }
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, (int)p));
  HVD__CHECK(hvd__cuda_pack(s->gpu.cur->dspans, (int)p, (int64_t)blk_elems,
                            dtype, dtype, d->prescale, st));
  NCCL_CHECK(ncclReduceScatter(pad, pout, blk_elems, nccl_dtype(dtype),
                               nccl_op(op), s->comm, st));
  if (mine > 0) /* our rows out of the padded block, finished */
    HVD__CHECK(hvd__cuda_reduce_finish(out, pout, mine * row_elems, dtype, op,
                                       finish ? d->postscale : 1.0,
                                       finish ? env->size : 1, st));
fail:
  return rc;
}

/* ---- fused allgathers and reducescatters: one NCCL group each ----------- */

/* Rows of member i on rank q for a fused allgather: [i * P + q]. The
 * members agreed through the cache (dims0s[i] NULL) are learnt in one
 * MPI_Allgather for all of them. */
static hvd_result_t fused_dims(nccl_state_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w, int64_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  int m = w->n, P = env->size, nc = 0;
  size_t need = (size_t)(2 * m) * (size_t)P * sizeof(int64_t);
  if (need > s->fdims_bytes) {
    int64_t *p = realloc(s->fdims, need);
    if (p == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "fused allgather");
    s->fdims = p;
    s->fdims_bytes = need;
  }
  int64_t *dims = s->fdims, *learnt = dims + (size_t)m * P;
  memset(learnt + (size_t)env->rank * m, 0, (size_t)m * sizeof *learnt);
  for (int i = 0; i < m; i++)
    if (w->dims0s[i] == NULL)
      learnt[(size_t)env->rank * m + nc++] = w->reqs[i]->send.shape[0];
  if (nc > 0)
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, m, MPI_INT64_T, learnt, m,
                                 MPI_INT64_T, env->comm));
  for (int i = 0, j = 0; i < m; i++) {
    for (int q = 0; q < P; q++)
      dims[(size_t)i * P + q] =
          w->dims0s[i] != NULL ? w->dims0s[i][q] : learnt[(size_t)q * m + j];
    j += w->dims0s[i] == NULL;
  }
  *out = dims;
fail:
  return rc;
}

/* A member of a fused allgather whose every rank has as many rows, and
 * at least this many bytes of them, gets an ncclAllGather of its own,
 * straight into its output (in place when its rows are already there, as
 * ZeRO's are); the others are packed into one (ag_packed). Below it, a
 * packing copy costs less than one more NCCL call. */
#define AG_DIRECT_BYTES ((size_t)64 << 10)

/* Member i's bytes on rank q. */
static size_t ag_bytes(const hvd__work_t *w, const int64_t *dims, int P, int i,
                       int q) {
  return (size_t)dims[(size_t)i * P + q] *
         (size_t)hvd__row_bytes(&w->reqs[i]->desc);
}

/* Member i goes by its own ncclAllGather (equal and large), else packed;
 * one with no bytes anywhere by neither. */
static int ag_direct(const hvd__work_t *w, const int64_t *dims, int P, int i) {
  int equal = 1;
  for (int q = 1; q < P; q++)
    equal = equal && dims[(size_t)i * P + q] == dims[(size_t)i * P];
  return equal && ag_bytes(w, dims, P, i, 0) >= AG_DIRECT_BYTES;
}

/* A packed member's slot in each rank's region of the buffer: its largest
 * share, rounded up to 16 bytes (the copies' vector width). */
static size_t ag_slot(const hvd__work_t *w, const int64_t *dims, int P, int i) {
  size_t most = 0;
  for (int q = 0; q < P; q++) {
    size_t b = ag_bytes(w, dims, P, i, q);
    most = b > most ? b : most;
  }
  return (most + 15) / 16 * 16;
}

/* The packed members' spans, inside the one ncclAllGather of the buffer
 * laid out by rank (region q, of `region` bytes, holds rank q's rows of
 * every packed member, each at its slot's offset): first our rows into
 * our region (one span a member), then every rank's rows out of the
 * regions into the outputs (ours straight from the input: nothing to do
 * in place). Returns the number of pack spans; *nspans all of them. */
static int ag_spans(nccl_state_t *s, const hvd__exec_env_t *env,
                    const hvd__work_t *w, const int64_t *dims, size_t region,
                    int *nspans, int64_t *max_pack, int64_t *max_unpack) {
  int P = env->size, me = env->rank, npack = 0, nun = 0;
  hvd__cuda_span_t *sp = s->gpu.cur->spans;
  char *buf = s->gpu.buf;
  size_t off = 0;
  *max_pack = *max_unpack = 0;
  for (int i = 0; i < w->n; i++) /* pack spans first, then unpack ones */
    npack += !ag_direct(w, dims, P, i) && ag_bytes(w, dims, P, i, me) > 0;
  nun = npack;
  npack = 0;
  for (int i = 0; i < w->n; i++) {
    if (ag_direct(w, dims, P, i))
      continue;
    const hvd_request_t *r = w->reqs[i];
    size_t mine = ag_bytes(w, dims, P, i, me), at = 0;
    char *out = r->recv.data;
    if (mine > 0)
      sp[npack++] = (hvd__cuda_span_t){r->send.data, buf + me * region + off,
                                       (int64_t)mine};
    *max_pack = (int64_t)mine > *max_pack ? (int64_t)mine : *max_pack;
    for (int q = 0; q < P; q++) {
      size_t b = ag_bytes(w, dims, P, i, q);
      if (b > 0)
        sp[nun++] =
            (hvd__cuda_span_t){q == me ? r->send.data : buf + q * region + off,
                               out + at, (int64_t)b};
      *max_unpack = (int64_t)b > *max_unpack ? (int64_t)b : *max_unpack;
      at += b;
    }
    off += ag_slot(w, dims, P, i);
  }
  *nspans = nun;
  return npack;
}

/* One device allgather, or a fused group of them (any dtypes and rows):
 * every output allocated (or given), the buffer and spans too, and agreed
 * first; then one NCCL group: an ncclAllGather per large member with as
 * many rows on every rank, and one for all the others, packed by rank
 * into the fusion buffer (each rank's rows padded to the member's largest
 * share) and unpacked after (ag_spans). */
static hvd_result_t allgather(nccl_state_t *s, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS, prep = HVD_SUCCESS;
  int64_t *dims = NULL, max_pack = 0, max_unpack = 0;
  int P = env->size, packed = 0, npack = 0, nspans = 0;
  size_t region = 0;
  if (P == 1)
    return allgather_local(s, env, w);
  HVD__CHECK(fused_dims(s, env, w, &dims));
  for (int i = 0; i < w->n && prep == HVD_SUCCESS; i++) {
    int64_t rows = 0;
    for (int q = 0; q < P; q++)
      rows += dims[(size_t)i * P + q];
    prep = alloc_rows(s, w->reqs[i], &w->reqs[i]->desc, rows);
    if (!ag_direct(w, dims, P, i)) {
      region += ag_slot(w, dims, P, i);
      packed++;
    }
  }
  if (prep == HVD_SUCCESS && region > 0)
    prep = hvd__gpu_buffer(&s->gpu, (size_t)P * region);
  if (prep == HVD_SUCCESS && region > 0)
    prep = hvd__gpu_spans(&s->gpu, packed * (P + 1));
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, prep));
  cudaStream_t st = s->gpu.stream;
  if (region > 0) {
    npack = ag_spans(s, env, w, dims, region, &nspans, &max_pack, &max_unpack);
    HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, nspans));
    if (npack > 0)
      HVD__CHECK(hvd__cuda_pack(s->gpu.cur->dspans, npack, max_pack, HVD_UINT8,
                                HVD_UINT8, 1.0, st));
  }
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t nr = ncclSuccess;
  char *buf = s->gpu.buf;
  if (region > 0)
    nr = ncclAllGather(buf + env->rank * region, buf, region, ncclUint8,
                       s->comm, st);
  for (int i = 0; i < w->n && NCCL_OK(nr); i++) {
    hvd_request_t *r = w->reqs[i];
    if (ag_direct(w, dims, P, i))
      nr = ncclAllGather(r->send.data, r->recv.data, ag_bytes(w, dims, P, i, 0),
                         ncclUint8, s->comm, st);
  }
  HVD__CHECK(group_end(s, nr, "ncclAllGather (fused allgather)"));
  if (region > 0 && nspans > npack)
    HVD__CHECK(hvd__cuda_pack(s->gpu.cur->dspans + npack, nspans - npack,
                              max_unpack, HVD_UINT8, HVD_UINT8, 1.0, st));
fail:
  return rc;
}

/* Elements of member r's padded block: ceil(rows / P) rows. */
static int64_t padded_block(const hvd_request_t *r, int64_t P) {
  const hvd__desc_t *d = &r->desc;
  int64_t re = hvd__row_bytes(d) / (int64_t)hvd_dtype_size(d->dtype);
  return (d->shape[0] + P - 1) / P * re;
}

/* The spans of a fused reducescatter in the fusion buffer, laid out by
 * rank: region k, of `total` elements (every member's padded block end
 * to end), holds each member's block k (rank k's rows), so that one
 * ncclReduceScatter of `total` reduces all of them, in place into our
 * region. Spans: P pack spans per member (its block k into region k),
 * then one unpack span per member (its reduced block, out of our region,
 * into its output). *max_pack, *max_unpack: the longest of each kind. */
static void rs_spans(nccl_state_t *s, const hvd__exec_env_t *env,
                     const hvd__work_t *w, int64_t total, int64_t *max_pack,
                     int64_t *max_unpack) {
  size_t es = hvd_dtype_size(w->desc->dtype);
  int64_t P = env->size, off = 0;
  int n = w->n;
  hvd__cuda_span_t *sp = s->gpu.cur->spans;
  char *buf = s->gpu.buf;
  *max_pack = *max_unpack = 0;
  for (int i = 0; i < n; i++) {
    const hvd_request_t *r = w->reqs[i];
    int64_t rows = r->desc.shape[0], blk = padded_block(r, P);
    int64_t re = hvd__row_bytes(&r->desc) / (int64_t)es;
    int64_t mine = hvd__block_rows(rows, P, env->rank) * re;
    const char *in = r->send.data;
    for (int64_t k = 0; k < P; k++)
      sp[i * P + k] = (hvd__cuda_span_t){
          in + (size_t)(hvd__block_first(rows, P, k) * re) * es,
          buf + (size_t)(k * total + off) * es,
          hvd__block_rows(rows, P, k) * re};
    sp[P * n + i] = (hvd__cuda_span_t){
        buf + (size_t)(env->rank * total + off) * es, r->recv.data, mine};
    *max_pack = blk > *max_pack ? blk : *max_pack;
    *max_unpack = mine > *max_unpack ? mine : *max_unpack;
    off += blk;
  }
}

/* A fused group of device reducescatters (one dtype, op and scaling; any
 * shapes), each through the padded layout of an uneven one alone: one
 * pack kernel for every member (prescale fused), one ncclReduceScatter
 * for the whole group (rs_spans), one unpack kernel (average, postscale)
 * into the outputs. Outputs, buffer and spans are agreed before anything
 * runs. */
static hvd_result_t reducescatter_fused(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS, prep = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  size_t es = hvd_dtype_size(d->dtype);
  int64_t P = env->size, max_pack, max_unpack, total = 0;
  int n = w->n, npack = (int)P * n;
  cudaStream_t st = s->gpu.stream;
  for (int i = 0; i < n; i++) {
    const hvd__desc_t *di = &w->reqs[i]->desc;
    total += padded_block(w->reqs[i], P);
    if (prep == HVD_SUCCESS)
      prep = alloc_rows(s, w->reqs[i], di,
                        hvd__block_rows(di->shape[0], P, env->rank));
  }
  if (prep == HVD_SUCCESS)
    prep = hvd__gpu_buffer(&s->gpu, (size_t)(P * total) * es);
  if (prep == HVD_SUCCESS)
    prep = hvd__gpu_spans(&s->gpu, npack + n);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, prep));
  if (total == 0)
    return HVD_SUCCESS;
  rs_spans(s, env, w, total, &max_pack, &max_unpack);
  const hvd__cuda_span_t *dsp = s->gpu.cur->dspans;
  char *buf = s->gpu.buf;
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, npack + n));
  HVD__CHECK(hvd__cuda_pack(dsp, npack, max_pack, d->dtype, d->dtype,
                            d->prescale, st));
  NCCL_CHECK(ncclReduceScatter(buf, buf + (size_t)(env->rank * total) * es,
                               (size_t)total, nccl_dtype(d->dtype),
                               nccl_op(d->op), s->comm, st));
  if (max_unpack > 0)
    HVD__CHECK(hvd__cuda_unpack(dsp + npack, n, max_unpack, d->dtype, d->dtype,
                                d->op, d->postscale, env->size, st));
fail:
  return rc;
}

/* ---- one rank: nothing to exchange, so no NCCL call ---------------------
 * NCCL at one rank would copy each tensor on its own (a launch apiece); a
 * batched kernel does every member of the group at once. */

/* Allgathers at one rank: each output is its input (nothing to do in
 * place, as ZeRO's are). */
static hvd_result_t allgather_local(nccl_state_t *s, const hvd__exec_env_t *env,
                                    const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS, prep = HVD_SUCCESS;
  int64_t most = 0;
  for (int i = 0; i < w->n && prep == HVD_SUCCESS; i++)
    prep =
        alloc_rows(s, w->reqs[i], &w->reqs[i]->desc, w->reqs[i]->send.shape[0]);
  if (prep == HVD_SUCCESS)
    prep = hvd__gpu_spans(&s->gpu, w->n);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, prep));
  hvd__cuda_span_t *sp = s->gpu.cur->spans;
  int moved = 0;
  for (int i = 0; i < w->n; i++) {
    const hvd_request_t *r = w->reqs[i];
    int64_t b = (int64_t)hvd__tensor_bytes(&r->send);
    sp[i] = (hvd__cuda_span_t){r->send.data, r->recv.data, b};
    most = b > most ? b : most;
    moved += b > 0 && r->send.data != r->recv.data;
  }
  if (moved == 0) /* ZeRO's: nothing to launch */
    return HVD_SUCCESS;
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, w->n));
  HVD__CHECK(hvd__cuda_pack(s->gpu.cur->dspans, w->n, most, HVD_UINT8,
                            HVD_UINT8, 1.0, s->gpu.stream));
fail:
  return rc;
}

/* Reducescatters at one rank: each output is its input, prescaled then
 * finished (average over one rank, postscale), as through NCCL: the same
 * roundings, one kernel for the prescale and one for the
 * finish, each only when it changes something (an in-place group with
 * neither launches nothing). */
static hvd_result_t reducescatter_local(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS, prep = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  int n = w->n, moved = 0;
  int64_t most = 0;
  for (int i = 0; i < n && prep == HVD_SUCCESS; i++)
    prep =
        alloc_rows(s, w->reqs[i], &w->reqs[i]->desc, w->reqs[i]->desc.shape[0]);
  if (prep == HVD_SUCCESS)
    prep = hvd__gpu_spans(&s->gpu, 2 * n);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, prep));
  hvd__cuda_span_t *sp = s->gpu.cur->spans;
  for (int i = 0; i < n; i++) {
    hvd_request_t *r = w->reqs[i];
    int64_t m = hvd_tensor_numel(&r->send);
    sp[i] = (hvd__cuda_span_t){r->send.data, r->recv.data, m};
    sp[n + i] = (hvd__cuda_span_t){r->recv.data, r->recv.data, m};
    most = m > most ? m : most;
    moved += m > 0 && r->send.data != r->recv.data;
  }
  int pre = d->prescale != 1.0, post = d->postscale != 1.0;
  if (most == 0 || (!pre && !post && moved == 0))
    return HVD_SUCCESS;
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, 2 * n));
  const hvd__cuda_span_t *dsp = s->gpu.cur->dspans;
  cudaStream_t st = s->gpu.stream;
  if (pre) /* into the outputs; the finish then works in place */
    HVD__CHECK(
        hvd__cuda_pack(dsp, n, most, d->dtype, d->dtype, d->prescale, st));
  if (!pre || post)
    HVD__CHECK(hvd__cuda_unpack(pre ? dsp + n : dsp, n, most, d->dtype,
                                d->dtype, d->op, d->postscale, 1, st));
fail:
  return rc;
}

/* Enters and enqueues; then leaves the group in flight (the engine allows
 * it: nccl_reap completes it) or waits for it. Abandons the communicator
 * on any failure once something may have been launched. */
static hvd_result_t nccl_run(void *state, const hvd__exec_env_t *env,
                             const hvd__work_t *w, body_fn body,
                             const char *what) {
  nccl_state_t *s = state;
  double t0 = env->trace ? hvd__now() : 0;
  hvd_result_t rc = nccl_enter(s, env, w);
  if (rc == HVD_SUCCESS)
    rc = body(s, env, w);
  if (rc == HVD_SUCCESS && w->defer != NULL) {
    cudaEvent_t done = s->gpu.cur->done;
    rc = hvd__gpu_launch(&s->gpu);
    if (rc == HVD_SUCCESS) {
      w->defer->deferred = 1;
      w->defer->event = (void *)done;
      return HVD_SUCCESS; /* the engine traces it when it completes */
    }
  } else if (rc == HVD_SUCCESS) {
    rc = hvd__gpu_wait(&s->gpu, what, hvd__nccl_poll, s);
  }
  if (rc != HVD_SUCCESS && s->unlaunched) { /* agreed: nothing in flight */
    s->unlaunched = 0;
    return rc;
  }
  if (rc != HVD_SUCCESS)
    return s->comm != NULL ? hvd__nccl_abandon(s, rc) : rc;
  if (env->trace && w->desc->coll == HVD__ALLREDUCE) {
    double t1 = hvd__now();
    for (int i = 0; i < w->n; i++)
      hvd__gpu_trace(env, w->reqs[i], "ALLREDUCE", t0, t1);
  }
  return HVD_SUCCESS;
}

/* The oldest group in flight: done when its event has fired; failed
 * when the communicator was aborted before that (the abort ends kernels
 * early, which fires the event too). While it runs, NCCL's asynchronous
 * error, a peer's abort notice and HVD_NCCL_TIMEOUT (counted from its
 * launch) are checked, as hvd__gpu_wait does; one of them aborts. */
static int nccl_reap(void *state, const hvd__exec_env_t *env, int wait,
                     hvd_result_t *rc) {
  (void)env;
  nccl_state_t *s = state;
  hvd__gpu_slot_t *slot = hvd__gpu_oldest(&s->gpu);
  int ran = 0;
  *rc = HVD_SUCCESS;
  if (slot == NULL) { /* the engine's count and ours disagree */
    *rc = hvd__set_error(HVD_ERR_INTERNAL, "NCCL: no group in flight");
    return 1;
  }
  if (!slot->failed) {
    hvd_result_t q =
        hvd__gpu_query(&s->gpu, wait, "NCCL collective",
                       s->comm != NULL ? hvd__nccl_poll : NULL, s, &ran);
    if (q != HVD_SUCCESS && s->comm != NULL)
      (void)hvd__nccl_abandon(s, q); /* marks this group failed */
    else if (q != HVD_SUCCESS)
      slot->failed = 1;
    else if (!ran)
      return 0;
  }
  if (slot->failed)
    *rc = hvd__set_error(HVD_ERR_NCCL,
                         "NCCL: %.900s; the communicator was aborted",
                         s->failed[0] ? s->failed : hvd_last_error());
  hvd__gpu_retire(&s->gpu);
  return 1;
}

static hvd_result_t nccl_allreduce(void *state, const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  return nccl_run(state, env, w, allreduce, "NCCL allreduce");
}

static hvd_result_t nccl_broadcast(void *state, const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  return nccl_run(state, env, w, broadcast, "NCCL broadcast");
}

static hvd_result_t nccl_allgather(void *state, const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  return nccl_run(state, env, w, allgather, "NCCL allgather");
}

static hvd_result_t nccl_alltoall(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  return nccl_run(state, env, w, alltoall, "NCCL alltoall");
}

static hvd_result_t nccl_reducescatter(void *state, const hvd__exec_env_t *env,
                                       const hvd__work_t *w) {
  return nccl_run(state, env, w, reducescatter, "NCCL reducescatter");
}

/* ---- lifecycle ---------------------------------------------------------- */

/* Nothing collective and nothing CUDA here: a CUDA build on a machine
 * without a GPU opens it too. */
static hvd_result_t nccl_open(const hvd__exec_env_t *env, void **state) {
  nccl_state_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "NCCL executor state");
  hvd__gpu_init(&s->gpu, env);
  s->timeout_s = env->nccl_timeout_s;
  s->mpi = env->comm;
  s->rank = env->rank;
  s->size = env->size;
  s->world_ranks = env->world_ranks;
  *state = s;
  return HVD_SUCCESS;
}

static void nccl_close(void *state, int collective) {
  nccl_state_t *s = state;
  if (s == NULL)
    return;
  if (s->comm != NULL) {
    int caller = -1; /* maybe the caller's thread: put its device back */
    if (cudaGetDevice(&caller) != cudaSuccess)
      caller = -1;
    if (s->gpu.dev >= 0)
      cudaSetDevice(s->gpu.dev);
    /* together (every rank at the same point): an orderly end, finalize
     * (which waits for the peers, so within HVD_NCCL_TIMEOUT) then
     * destroy; alone (after a failure), or when finalize failed: abort,
     * which waits for nobody */
    ncclResult_t r = ncclSuccess;
    int timed_out = 0;
    if (collective)
      r = hvd__nccl_settle_wait(s->comm, ncclCommFinalize(s->comm),
                                s->timeout_s, &timed_out);
    if (collective && r == ncclSuccess)
      r = ncclCommDestroy(s->comm);
    else
      ncclCommAbort(s->comm);
    if (timed_out)
      HVD__LOG(HVD__LOG_WARNING,
               "closing the NCCL communicator: ncclCommFinalize still in "
               "progress after %g s (HVD_NCCL_TIMEOUT); aborted",
               s->timeout_s);
    else if (r != ncclSuccess)
      HVD__LOG(HVD__LOG_WARNING, "closing the NCCL communicator: %s",
               ncclGetErrorString(r));
    s->comm = NULL;
    if (caller >= 0)
      cudaSetDevice(caller);
    (void)cudaGetLastError();
  }
  hvd__gpu_close(&s->gpu);
  free(s->fdims);
  s->fdims = NULL;
  if (!hvd__nccl_end_notices(s))
    return; /* MPI may still read s->notice: kept (after a failure only) */
  free(s->sent);
  free(s);
}

const hvd__executor_t hvd__nccl_executor = {
    .name = "nccl",
    .open = nccl_open,
    .close = nccl_close,
    .run =
        {
            [HVD__ALLREDUCE] = nccl_allreduce,
            [HVD__BROADCAST] = nccl_broadcast,
            [HVD__ALLGATHER] = nccl_allgather,
            [HVD__ALLTOALL] = nccl_alltoall,
            [HVD__REDUCESCATTER] = nccl_reducescatter,
            /* no tensor: MPI, as on the host */
            [HVD__BARRIER] = hvd__mpi_barrier,
        },
    .stub_alloc = hvd__gpu_stub_alloc,
    .stub_free = hvd__gpu_stub_free,
    .fuses = 1u << HVD__ALLGATHER | 1u << HVD__REDUCESCATTER,
    .reap = nccl_reap,
    .max_in_flight = HVD__GPU_SLOTS,
};
