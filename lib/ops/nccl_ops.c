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
 *    waited for here, within HVD_NCCL_TIMEOUT (settle()). When NCCL's init
 *    fails on any rank, every rank fails, and NCCL stays unusable (as
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
 *  - Broadcast: ncclBroadcast in place. Allgather: ncclAllGather when every
 *    rank has as many rows, else one ncclBroadcast per rank of its rows in
 *    a group (first dimensions from the negotiation, or an MPI_Allgather
 *    when the collective was agreed through the cache). Alltoall: splits
 *    exchanged with MPI_Alltoall, then ncclSend/ncclRecv to every other
 *    rank in a group and a device copy of our own rows. Reducescatter:
 *    rank r gets N/P rows plus one if r < N%P, as on the host; NCCL wants
 *    equal blocks, so an uneven tensor is padded: block k of ceil(N/P)
 *    rows holds rank k's rows (prescale fused into that copy), the padding
 *    rows are left as they are and their results dropped. Barrier: MPI.
 *  - Completion: an event recorded after the work and waited for before
 *    returning (hvd__gpu_wait, hvd__mpi_wait's polling policy), checking
 *    ncclCommGetAsyncError meanwhile. An asynchronous error, or no
 *    completion within HVD_NCCL_TIMEOUT seconds (of an enqueue that NCCL
 *    left in progress, or of the work), or any other failure once
 *    the communicator exists, aborts it (ncclCommAbort: kernels still
 *    waiting for peers end) and fails with NCCL's message; later device
 *    collectives then fail at once with that message. Peers of a rank that
 *    failed alone see their collective time out and abort in turn, so no
 *    rank waits forever.
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

typedef struct nccl_state {
  hvd__gpu_t gpu;   /* first: hvd__gpu_stub_alloc/free take the state as one */
  ncclComm_t comm;  /* NULL before the first collective and after abort */
  double timeout_s; /* HVD_NCCL_TIMEOUT; 0: none */
  char failed[HVD__ERRMSG_MAX]; /* why comm was aborted; "" while usable */
  int64_t *dims0;               /* per rank: allgather's first dimensions */
} nccl_state_t;

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

/* HVD_ERR_NCCL "<what>: <ncclGetErrorString> (<ncclGetLastError>)", what
 * cut at its first '(' as for hvd__mpi_error. */
static hvd_result_t nccl_error(ncclResult_t r, const char *what) {
  const char *last = ncclGetLastError(NULL);
  int fn = (int)strcspn(what, "(");
  if (last != NULL && last[0] != '\0')
    return hvd__set_error(HVD_ERR_NCCL, "%.*s: %s (%s)", fn, what,
                          ncclGetErrorString(r), last);
  return hvd__set_error(HVD_ERR_NCCL, "%.*s: %s", fn, what,
                        ncclGetErrorString(r));
}

/* The communicator is non-blocking (ncclConfig_t.blocking = 0): a call that
 * has to wait for peers (making the communicator, the connections NCCL
 * makes on first use, a collective's enqueue behind them, finalize)
 * returns ncclInProgress and goes on in NCCL's own threads. Until
 * ncclCommGetAsyncError no longer says ncclInProgress, no other NCCL call
 * and no kernel on hvd's stream may be issued. Waiting here (with
 * hvd__wait_backoff) bounds that wait by HVD_NCCL_TIMEOUT: a blocking
 * communicator would block inside NCCL, with no timeout, when a peer never
 * comes. Returns the call's final result; *timed_out when it gave up. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r, double timeout_s,
                           int *timed_out) {
  double t0 = hvd__now();
  *timed_out = 0;
  for (unsigned spin = 0; r == ncclInProgress; spin++) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess)
      return q;
    if (state != ncclInProgress)
      return state;
    if (timeout_s > 0 && hvd__now() - t0 > timeout_s) {
      *timed_out = 1;
      return ncclInProgress;
    }
    hvd__wait_backoff(spin);
  }
  return r;
}

/* settle() as an hvd result: NCCL's error, or HVD_ERR_NCCL "<what>: still
 * in progress after <t> s (HVD_NCCL_TIMEOUT): ...". */
static hvd_result_t nccl_settle(nccl_state_t *s, ncclResult_t r,
                                const char *what) {
  int timed_out = 0;
  r = settle(s->comm, r, s->timeout_s, &timed_out);
  if (timed_out)
    return hvd__set_error(HVD_ERR_NCCL,
                          "%.*s: still in progress after %g s "
                          "(HVD_NCCL_TIMEOUT): a peer failed, is gone or is "
                          "stuck",
                          (int)strcspn(what, "("), what, s->timeout_s);
  return r == ncclSuccess ? HVD_SUCCESS : nccl_error(r, what);
}

/* A call that returned (or will settle) without error. */
#define NCCL_OK(r) ((r) == ncclSuccess || (r) == ncclInProgress)

/* Settles an NCCL call on s->comm; jumps to `fail:` when it fails. Needs
 * `hvd_result_t rc` and `nccl_state_t *s`. */
#define NCCL_CHECK(call)                                                       \
  do {                                                                         \
    rc = nccl_settle(s, (call), #call);                                        \
    if (rc != HVD_SUCCESS)                                                     \
      goto fail;                                                               \
  } while (0)

/* While waiting: NCCL's asynchronous error, and the timeout. */
static hvd_result_t nccl_poll(void *ctx, double waited_s) {
  nccl_state_t *s = ctx;
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(s->comm, &st);
  if (r != ncclSuccess)
    return nccl_error(r, "ncclCommGetAsyncError");
  if (st != ncclSuccess && st != ncclInProgress)
    return nccl_error(st, "asynchronous error");
  if (s->timeout_s > 0 && waited_s > s->timeout_s)
    return hvd__set_error(HVD_ERR_NCCL,
                          "no completion after %g s (HVD_NCCL_TIMEOUT): a "
                          "peer failed, is gone or is stuck",
                          s->timeout_s);
  return HVD_SUCCESS;
}

/* After a failure once the communicator exists: aborts it and remembers
 * why. Returns rc with "NCCL: <why>; the communicator was aborted". */
static hvd_result_t nccl_abandon(nccl_state_t *s, hvd_result_t rc) {
  char why[HVD__ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", hvd_last_error());
  ncclCommAbort(s->comm);
  s->comm = NULL;
  (void)cudaGetLastError();
  snprintf(s->failed, sizeof s->failed, "%s", why);
  HVD__LOG(HVD__LOG_ERROR, "NCCL: %s; the communicator was aborted", why);
  return hvd__set_error(rc, "NCCL: %.900s; the communicator was aborted", why);
}

/* MPI_MIN over the ranks of (ok ? size : rank): the first rank that
 * failed, or size. */
static hvd_result_t first_failed(const hvd__exec_env_t *env, int ok,
                                 int *first) {
  hvd_result_t rc = HVD_SUCCESS;
  int mine = ok ? env->size : env->rank;
  HVD__MPI_CHECK(MPI_Allreduce(&mine, first, 1, MPI_INT, MPI_MIN, env->comm));
fail:
  return rc;
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
  HVD__CHECK(first_failed(env, mine == HVD_SUCCESS, &first));
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
      nccl_error(r, "ncclGetUniqueId");
      snprintf(msg.why, sizeof msg.why, "%s", hvd_last_error());
    }
  }
  HVD__MPI_CHECK(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, env->comm));
  if (!msg.ok)
    return hvd__set_error(HVD_ERR_NCCL, "NCCL: on rank 0: %s", msg.why);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* see settle() */
  s->comm = NULL;
  ncclResult_t r =
      ncclCommInitRankConfig(&s->comm, env->size, msg.id, env->rank, &cfg);
  if (s->comm == NULL && NCCL_OK(r))
    r = ncclInternalError; /* no communicator to wait for */
  mine = s->comm != NULL ? nccl_settle(s, r, "ncclCommInitRankConfig")
                         : nccl_error(r, "ncclCommInitRankConfig");
  rc = first_failed(env, mine == HVD_SUCCESS, &first);
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
  return hvd__gpu_enter(&s->gpu, w, "NCCL");
}

/* ---- the collectives: each enqueues its work on hvd's stream ---------- */

typedef hvd_result_t (*body_fn)(nccl_state_t *s, const hvd__exec_env_t *env,
                                const hvd__work_t *w);

/* One tensor reduced in the caller's memory: prescale into recv first,
 * then in place. */
static hvd_result_t allreduce_one(nccl_state_t *s, const hvd__exec_env_t *env,
                                  const hvd__desc_t *d, hvd_request_t *r) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  hvd_op_t op = (hvd_op_t)d->op;
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
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype, wire = (hvd_dtype_t)d->wire;
  hvd_op_t op = (hvd_op_t)d->op;
  cudaStream_t st = s->gpu.stream;
  /* Alone, or one rank (nothing to exchange, so no fusion buffer: its pack
   * and unpack would be two passes over the bytes for nothing; an in-place
   * group then costs no device pass at all): in the caller's memory. */
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
  HVD__CHECK(hvd__gpu_buffer(&s->gpu, (size_t)total * wsize));
  HVD__CHECK(hvd__gpu_spans(&s->gpu, w->n + real));
  hvd__cuda_span_t *sp = s->gpu.spans, *dsp = s->gpu.dspans;
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
    return nccl_error(r, what);
  return nccl_settle(s, e, what);
}

static hvd_result_t allgather(nccl_state_t *s, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  const int64_t *dims0 = w->dims0s[0];
  if (dims0 == NULL) { /* agreed through the cache: learn them now */
    s->dims0[env->rank] = r->send.shape[0];
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 1, MPI_INT64_T, s->dims0, 1,
                                 MPI_INT64_T, env->comm));
    dims0 = s->dims0;
  }
  int64_t total = 0;
  int equal = 1;
  for (int k = 0; k < env->size; k++) {
    total += dims0[k];
    equal = equal && dims0[k] == dims0[0];
  }
  HVD__CHECK(alloc_rows(s, r, d, total));
  size_t rb = (size_t)hvd__row_bytes(d);
  char *out = r->recv.data;
  if (rb == 0 || total == 0)
    return HVD_SUCCESS;
  if (equal) {
    NCCL_CHECK(ncclAllGather(r->send.data, out, (size_t)dims0[0] * rb,
                             ncclUint8, s->comm, s->gpu.stream));
    return HVD_SUCCESS;
  }
  /* first dimensions differ: each rank broadcasts its rows into place */
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t nr = ncclSuccess;
  size_t at = 0;
  for (int k = 0; k < env->size; k++) {
    size_t bytes = (size_t)dims0[k] * rb;
    const void *src = k == env->rank ? r->send.data : (const void *)(out + at);
    if (bytes > 0 && NCCL_OK(nr))
      nr = ncclBroadcast(src, out + at, bytes, ncclUint8, k, s->comm,
                         s->gpu.stream);
    at += bytes;
  }
  rc = group_end(s, nr, "ncclBroadcast (allgather)");
fail:
  return rc;
}

static hvd_result_t alltoall(nccl_state_t *s, const hvd__exec_env_t *env,
                             const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  size_t n = (size_t)env->size;
  int64_t total;
  HVD__CHECK(hvd__exchange_splits(r, env, &total));
  HVD__CHECK(alloc_rows(s, r, d, total));
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
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  hvd_op_t op = (hvd_op_t)d->op;
  cudaStream_t st = s->gpu.stream;
  size_t esize = hvd_dtype_size(dtype);
  int64_t p = env->size, rows = d->shape[0];
  int64_t row_elems = hvd__row_bytes(d) / (int64_t)esize;
  int64_t mine = hvd__block_rows(rows, p, env->rank);
  int64_t blk = (rows + p - 1) / p; /* rows per block, padded */
  size_t blk_elems = (size_t)(blk * row_elems);
  /* the finishing kernel changes something (with factor 1 it is a copy) */
  int finish = (op == HVD_AVERAGE && p > 1) || d->postscale != 1.0;
  HVD__CHECK(alloc_rows(s, r, d, mine));
  if (blk_elems == 0)
    return HVD_SUCCESS;
  char *out = r->recv.data;
  if (rows % p == 0) { /* even blocks: straight from the caller's tensor */
    const void *src = r->send.data;
    if (d->prescale != 1.0) {
      size_t n = (size_t)(rows * row_elems);
      HVD__CHECK(hvd__gpu_buffer(&s->gpu, n * esize));
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
  size_t in_bytes = (size_t)p * blk_elems * esize;
  HVD__CHECK(hvd__gpu_buffer(&s->gpu, in_bytes + blk_elems * esize));
  HVD__CHECK(hvd__gpu_spans(&s->gpu, (int)p));
  char *pad = s->gpu.buf, *pout = pad + in_bytes;
  const char *in = r->send.data;
  int64_t start = 0;
  for (int64_t k = 0; k < p; k++) {
    int64_t rk = hvd__block_rows(rows, p, k);
    s->gpu.spans[k] =
        (hvd__cuda_span_t){in + (size_t)(start * row_elems) * esize,
                           pad + (size_t)k * blk_elems * esize, rk * row_elems};
    start += rk;
  }
  HVD__CHECK(hvd__gpu_upload_spans(&s->gpu, (int)p));
  HVD__CHECK(hvd__cuda_pack(s->gpu.dspans, (int)p, (int64_t)blk_elems, dtype,
                            dtype, d->prescale, st));
  NCCL_CHECK(ncclReduceScatter(pad, pout, blk_elems, nccl_dtype(dtype),
                               nccl_op(op), s->comm, st));
  if (mine > 0) /* our rows out of the padded block, finished */
    HVD__CHECK(hvd__cuda_reduce_finish(out, pout, mine * row_elems, dtype, op,
                                       finish ? d->postscale : 1.0,
                                       finish ? env->size : 1, st));
fail:
  return rc;
}

/* Enters, enqueues, waits; abandons the communicator on any failure. */
static hvd_result_t nccl_run(void *state, const hvd__exec_env_t *env,
                             const hvd__work_t *w, body_fn body,
                             const char *what) {
  nccl_state_t *s = state;
  double t0 = env->trace ? hvd__now() : 0;
  hvd_result_t rc = nccl_enter(s, env, w);
  if (rc == HVD_SUCCESS)
    rc = body(s, env, w);
  if (rc == HVD_SUCCESS)
    rc = hvd__gpu_wait(&s->gpu, what, nccl_poll, s);
  if (rc != HVD_SUCCESS)
    return s->comm != NULL ? nccl_abandon(s, rc) : rc;
  if (env->trace && w->desc->coll == HVD__ALLREDUCE) {
    double t1 = hvd__now();
    for (int i = 0; i < w->n; i++)
      hvd__gpu_trace(env, w->reqs[i], "ALLREDUCE", t0, t1);
  }
  return HVD_SUCCESS;
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
  if (s != NULL)
    s->dims0 = calloc((size_t)env->size, sizeof *s->dims0);
  if (s == NULL || s->dims0 == NULL) {
    free(s);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "NCCL executor state");
  }
  hvd__gpu_init(&s->gpu);
  s->timeout_s = env->nccl_timeout_s;
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
      r = settle(s->comm, ncclCommFinalize(s->comm), s->timeout_s, &timed_out);
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
  free(s->dims0);
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
};
