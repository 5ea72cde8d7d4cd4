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
 *  - Broadcast: ncclBroadcast in place. Allgather and reducescatter,
 *    alone or fused: nccl_gather.c. Alltoall: splits exchanged with
 *    MPI_Alltoall, then ncclSend/ncclRecv to every other rank in a group
 *    and a device copy of our own rows. Barrier: MPI.
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
 *    (hvd__nccl_agree_prepared; with peers, every group that has any MPI
 *    step): a rank that could not allocate fails the group on every rank
 *    with its own error, nothing is launched, and the communicator stays
 *    usable. A rank whose NCCL failed earlier takes part too (nccl_run):
 *    a failure is often one rank's alone, and a peer that has not yet read
 *    its notice must not wait in MPI for it. Then every rank fails the
 *    group, aborts its communicator (naming the failed rank, as a notice
 *    would) and fails later device collectives at once, with no MPI step.
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

ncclDataType_t hvd__nccl_dtype(int dtype) {
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

ncclRedOp_t hvd__nccl_op(int op) {
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
    s->all_failed = 1;
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
    return hvd__nccl_unusable(s);
  if (s->comm == NULL)
    return comm_create(s, env, w);
  hvd_result_t peer =
      hvd__nccl_peer_notice(s); /* nothing launched for a peer gone */
  if (peer != HVD_SUCCESS)
    return peer;
  return hvd__gpu_enter(&s->gpu, w, "NCCL");
}

/* ---- the collectives: each enqueues its work on hvd's stream ---------- */

/* A collective's body; `entry` is nccl_enter's result. A body that makes
 * no MPI call returns a failed entry at once; one that makes any makes
 * all of them whatever its entry, allocates nothing after a failed one,
 * and ends its MPI steps with hvd__nccl_agree_prepared before it launches
 * anything (nccl_run says why). */
typedef hvd_result_t (*body_fn)(nccl_state_t *s, const hvd__exec_env_t *env,
                                const hvd__work_t *w, hvd_result_t entry);

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
  NCCL_CHECK(ncclAllReduce(src, dst, (size_t)n, hvd__nccl_dtype(dtype),
                           hvd__nccl_op(op), s->comm, st));
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
                              const hvd__work_t *w, hvd_result_t entry) {
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
    if (entry != HVD_SUCCESS) /* no MPI step here */
      return entry;
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
  /* 2n spans, not n + real: a joined rank (stubs only) must grow alike.
   * With peers, agreed every time: a rank whose NCCL failed cannot know
   * whether the others' buffers grow (nccl_run). */
  int grows = hvd__gpu_grows(&s->gpu, (size_t)total * wsize, 2 * w->n);
  hvd_result_t mine = entry;
  if (mine == HVD_SUCCESS)
    mine = hvd__gpu_buffer(&s->gpu, (size_t)total * wsize);
  if (mine == HVD_SUCCESS)
    mine = hvd__gpu_spans(&s->gpu, 2 * w->n);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, grows || env->size > 1, mine));
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
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)total, hvd__nccl_dtype(wire),
                             hvd__nccl_op(op), s->comm, st));
  if (real > 0)
    HVD__CHECK(hvd__cuda_unpack(dsp + w->n, real, max_real, wire, dtype, op,
                                d->postscale, env->size, st));
fail:
  return rc;
}

static hvd_result_t broadcast(nccl_state_t *s, const hvd__exec_env_t *env,
                              const hvd__work_t *w, hvd_result_t entry) {
  (void)env;
  hvd_result_t rc = HVD_SUCCESS;
  if (entry != HVD_SUCCESS) /* no MPI step here */
    return entry;
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
hvd_result_t hvd__nccl_alloc_rows(nccl_state_t *s, hvd_request_t *r,
                                  const hvd__desc_t *d, int64_t rows) {
  int64_t shape[HVD_MAX_DIMS];
  memcpy(shape, d->shape, sizeof shape);
  shape[0] = rows;
  return hvd__gpu_alloc_output(&s->gpu, r, d->ndim, shape);
}

/* The end of a group of NCCL calls whose first failure is r (ncclSuccess
 * when none failed): the group's work is enqueued (and settled) here. */
hvd_result_t hvd__nccl_group_end(nccl_state_t *s, ncclResult_t r,
                                 const char *what) {
  ncclResult_t e = ncclGroupEnd(); /* always: the group must be closed */
  if (!NCCL_OK(r))
    return hvd__nccl_error(r, what);
  return hvd__nccl_settle(s, e, what);
}

static hvd_result_t alltoall(nccl_state_t *s, const hvd__exec_env_t *env,
                             const hvd__work_t *w, hvd_result_t entry) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_request_t *r = w->reqs[0];
  size_t n = (size_t)env->size;
  int64_t total = 0;
  int ok = 0;
  /* the splits' answers land in the scratch: no rank skips the exchange
   * for want of memory (an answer it cannot keep fails in the agreement) */
  HVD__CHECK(hvd__nccl_scratch(s, env, n * sizeof(int64_t), "alltoall splits",
                               &ok, &entry));
  if (ok) {
    hvd_result_t got = hvd__exchange_splits(r, env, s->fdims, 0, &total);
    if (got == HVD_ERR_NO_MEMORY) /* made, not kept: carried */
      entry = entry != HVD_SUCCESS ? entry : got;
    else
      HVD__CHECK(got);
  }
  if (entry == HVD_SUCCESS && ok) /* !ok: some rank fails the agreement */
    entry = hvd__nccl_alloc_rows(s, r, d, total);
  HVD__CHECK(hvd__nccl_agree_prepared(s, env, 1, entry));
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
  rc = hvd__nccl_group_end(s, nr, "ncclSend/ncclRecv (alltoall)");
fail:
  return rc;
}

/* Enters and enqueues; then leaves the group in flight (the engine allows
 * it: nccl_reap completes it) or waits for it. Abandons the communicator
 * on any failure once something may have been launched.
 *
 * Every rank makes every MPI call of a collective that its peers may
 * make, whatever its own NCCL's state: a failure is often one rank's
 * alone (an asynchronous error, a timeout), its abort notice may not have
 * come yet, and a rank that skipped an MPI step would leave its peers
 * blocked in MPI for good, where neither HVD_NCCL_TIMEOUT nor the stall
 * inspector can end it. So a failed entry (NCCL failed earlier on this
 * rank, a peer's notice, the GPU check) still runs the body, which makes
 * its MPI steps (allgather's rows, alltoall's splits), allocates nothing
 * and fails in hvd__nccl_agree_prepared, the last of them, with every rank
 * (a body without MPI steps returns it at once: its peers' NCCL calls end
 * by the notice or the timeout). Which steps a body makes depends only on
 * what every rank agreed (the kind, the group, the sizes), never on a
 * rank's own state, so every rank reaches the same ones; the agreement
 * then fails the collective everywhere or nowhere. Only where every rank
 * knows the entry failed everywhere is the body skipped: the communicator
 * made just now (comm_create agrees its outcome), or NCCL already agreed
 * to be gone (all_failed). */
static hvd_result_t nccl_run(void *state, const hvd__exec_env_t *env,
                             const hvd__work_t *w, body_fn body,
                             const char *what) {
  nccl_state_t *s = state;
  double t0 = env->trace ? hvd__now() : 0;
  if (s->all_failed)
    return hvd__nccl_unusable(s);
  int fresh = s->comm == NULL && s->failed[0] == '\0';
  hvd_result_t rc = nccl_enter(s, env, w);
  if (rc == HVD_SUCCESS || !(fresh || s->all_failed))
    rc = body(s, env, w, rc);
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
  if (w->desc->op == HVD_ADASUM) /* hvd__executor_for sends it elsewhere */
    return hvd__set_error(HVD_ERR_INTERNAL,
                          "NCCL allreduce: HVD_ADASUM is not an NCCL op");
  return nccl_run(state, env, w, allreduce, "NCCL allreduce");
}

static hvd_result_t nccl_broadcast(void *state, const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  return nccl_run(state, env, w, broadcast, "NCCL broadcast");
}

static hvd_result_t nccl_allgather(void *state, const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  return nccl_run(state, env, w, hvd__nccl_allgather, "NCCL allgather");
}

static hvd_result_t nccl_alltoall(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  return nccl_run(state, env, w, alltoall, "NCCL alltoall");
}

static hvd_result_t nccl_reducescatter(void *state, const hvd__exec_env_t *env,
                                       const hvd__work_t *w) {
  return nccl_run(state, env, w, hvd__nccl_reducescatter, "NCCL reducescatter");
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
