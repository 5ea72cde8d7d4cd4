/*
 * nccl_gather.c - the NCCL executor's allgathers and reducescatters, alone
 * or fused (nccl_ops.c runs them through nccl_run, as its other
 * collectives; the executor's state and helpers are in nccl_int.h).
 *
 *  - Allgather (first dimensions from the negotiation, or one
 *    MPI_Allgather for the tensors agreed through the cache): one NCCL
 *    group holding an ncclAllGather per tensor of at least 64 KiB with as
 *    many rows on every rank, straight into its output (in place when its
 *    rows are there already, as ZeRO-1's are), and one ncclAllGather for
 *    all the others together, packed by rank into the fusion buffer (each
 *    rank's rows padded to the tensor's largest share) and unpacked after.
 *  - Reducescatter: rank r gets N/P rows plus one if r < N%P, as on the
 *    host; NCCL wants equal blocks, so an uneven tensor is padded: block k
 *    of ceil(N/P) rows holds rank k's rows (prescale fused into that
 *    copy), the padding rows are left as they are and their results
 *    dropped. A fused group lays every member's block k end to end in the
 *    buffer's region k, and one ncclReduceScatter (in place) reduces them
 *    all; one pack kernel before it, one unpack (average, postscale) after.
 *  - One rank: neither calls NCCL (it would copy each tensor with a launch
 *    of its own): one batched copy kernel (nothing in place), or the
 *    prescale and finish kernels.
 *
 * Every group's outputs, buffer and spans are allocated and agreed
 * (hvd__nccl_agree_prepared) before anything is launched.
 */
#include <config.h>

#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "ops/gpu_ops.h"
#include "ops/nccl_int.h"

static hvd_result_t reducescatter_fused(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w,
                                        hvd_result_t entry);
static hvd_result_t reducescatter_local(nccl_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w);
static hvd_result_t allgather_local(nccl_state_t *s, const hvd__exec_env_t *env,
                                    const hvd__work_t *w);

hvd_result_t hvd__nccl_reducescatter(nccl_state_t *s,
                                     const hvd__exec_env_t *env,
                                     const hvd__work_t *w, hvd_result_t entry) {
  hvd_result_t rc = HVD_SUCCESS;
  if (env->size == 1) /* no peer to wait for */
    return entry != HVD_SUCCESS ? entry : reducescatter_local(s, env, w);
  if (w->n > 1)
    return reducescatter_fused(s, env, w, entry);
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
  hvd_result_t prep = entry;
  if (prep == HVD_SUCCESS)
    prep = hvd__nccl_alloc_rows(s, r, d, mine);
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
    NCCL_CHECK(ncclReduceScatter(src, out, blk_elems, hvd__nccl_dtype(dtype),
                                 hvd__nccl_op(op), s->comm, st));
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
  NCCL_CHECK(ncclReduceScatter(pad, pout, blk_elems, hvd__nccl_dtype(dtype),
                               hvd__nccl_op(op), s->comm, st));
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
 * MPI_Allgather for all of them, into the executor's scratch; when some
 * rank has not the scratch, no rank makes the step, *out is NULL and
 * *prep this rank's failure, if it had one (hvd__nccl_scratch). */
static hvd_result_t fused_dims(nccl_state_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w, int64_t **out,
                               hvd_result_t *prep) {
  hvd_result_t rc = HVD_SUCCESS;
  int m = w->n, P = env->size, nc = 0, ok = 0;
  size_t need = (size_t)(2 * m) * (size_t)P * sizeof(int64_t);
  *out = NULL;
  HVD__CHECK(hvd__nccl_scratch(s, env, need, "fused allgather", &ok, prep));
  if (!ok)
    return HVD_SUCCESS;
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
 * ZeRO's are); the others are packed into one (ag_spans). Below it, a
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
  for (int i = 0; i < w->n; i++) /* the unpack spans follow the pack ones */
    nun += !ag_direct(w, dims, P, i) && ag_bytes(w, dims, P, i, me) > 0;
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
hvd_result_t hvd__nccl_allgather(nccl_state_t *s, const hvd__exec_env_t *env,
                                 const hvd__work_t *w, hvd_result_t entry) {
  hvd_result_t rc = HVD_SUCCESS, prep = entry;
  int64_t *dims = NULL, max_pack = 0, max_unpack = 0;
  int P = env->size, packed = 0, npack = 0, nspans = 0;
  size_t region = 0;
  if (P == 1) /* no peer to wait for */
    return entry != HVD_SUCCESS ? entry : allgather_local(s, env, w);
  HVD__CHECK(fused_dims(s, env, w, &dims, &prep));
  /* dims NULL: some rank had no scratch, and fails the agreement; else
   * every output fits, alike on every rank */
  int64_t rows = 0;
  for (int i = 0; dims != NULL && i < w->n; i++)
    HVD__CHECK(hvd__allgather_rows(w->reqs[i], w->n > 1, dims + (size_t)i * P,
                                   P, &rows));
  for (int i = 0; dims != NULL && i < w->n && prep == HVD_SUCCESS; i++) {
    (void)hvd__allgather_rows(w->reqs[i], w->n > 1, dims + (size_t)i * P, P,
                              &rows); /* checked above */
    prep = hvd__nccl_alloc_rows(s, w->reqs[i], &w->reqs[i]->desc, rows);
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
  if (dims == NULL) /* cannot be: a rank without scratch is unprepared */
    return hvd__set_error(HVD_ERR_INTERNAL, "fused allgather: no rows");
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
  HVD__CHECK(hvd__nccl_group_end(s, nr, "ncclAllGather (fused allgather)"));
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
                                        const hvd__work_t *w,
                                        hvd_result_t entry) {
  hvd_result_t rc = HVD_SUCCESS, prep = entry;
  const hvd__desc_t *d = w->desc;
  size_t es = hvd_dtype_size(d->dtype);
  int64_t P = env->size, max_pack, max_unpack, total = 0;
  int n = w->n, npack = (int)P * n;
  cudaStream_t st = s->gpu.stream;
  for (int i = 0; i < n; i++) {
    const hvd__desc_t *di = &w->reqs[i]->desc;
    total += padded_block(w->reqs[i], P);
    if (prep == HVD_SUCCESS)
      prep = hvd__nccl_alloc_rows(s, w->reqs[i], di,
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
                               (size_t)total, hvd__nccl_dtype(d->dtype),
                               hvd__nccl_op(d->op), s->comm, st));
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
    prep = hvd__nccl_alloc_rows(s, w->reqs[i], &w->reqs[i]->desc,
                                w->reqs[i]->send.shape[0]);
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
    prep = hvd__nccl_alloc_rows(s, w->reqs[i], &w->reqs[i]->desc,
                                w->reqs[i]->desc.shape[0]);
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
