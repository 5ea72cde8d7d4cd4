/*
 * adasum.c - HVD_ADASUM on the host (Horovod's Adasum, Maleki et al.,
 * "Scaling Distributed Training with Adaptive Summation"): the ranks'
 * tensors combined two by two, adasum(a, b) = (1 - a.b / (2 |a|^2)) a +
 * (1 - a.b / (2 |b|^2)) b, each tensor of a fused group on its own. What
 * is orthogonal adds up; what is parallel is averaged.
 *
 * The tree, the same on every rank and run: with P2 the largest power of
 * two <= size, rank r >= P2 first hands its tensors to r - P2, which
 * combines (its own, r's); then for d = 1, 2, ... P2 / 2 the ranks r and
 * r ^ d (r < P2) swap what they hold and both combine (the lower rank's,
 * the higher's); last, r - P2 hands the result to r. Both sides of a
 * swap compute the same expression on the same operands, so every rank
 * ends with the same bits. Dot products and squared norms are summed in
 * double in element order; each element is ca * a + cb * b in the
 * tensor's dtype (float32 or float64), the coefficients rounded to it
 * (a zero tensor's coefficient is 1: it adds nothing). A rank that joined
 * contributes zeros, the identity.
 *
 * Whole tensors travel at every level (log2 size exchanges of the group
 * with one peer, against two passes for a ring allreduce): meant for the
 * gradients of the distributed optimizer at the world sizes of a node or
 * a few, as Horovod's CPU Adasum is.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "ops/mpi_int.h"
#include "ops/reduce.h"

#define ADASUM_TAG 0x4144 /* "AD" */
#define PIECE_BYTES ((int64_t)1 << 30)

/* a's and b's dot product and squared norms, in double */
#define SUMS(type)                                                             \
  do {                                                                         \
    const type *x = a, *y = b;                                                 \
    for (int64_t i = 0; i < n; i++) {                                          \
      dot += (double)x[i] * y[i];                                              \
      aa += (double)x[i] * x[i];                                               \
      bb += (double)y[i] * y[i];                                               \
    }                                                                          \
  } while (0)

#define MIX(type)                                                              \
  do {                                                                         \
    const type fa = (type)ca, fb = (type)cb;                                   \
    type *o = out;                                                             \
    const type *x = a, *y = b;                                                 \
    for (int64_t i = 0; i < n; i++)                                            \
      o[i] = fa * x[i] + fb * y[i];                                            \
  } while (0)

/* out = adasum(a, b) over n elements of dtype (out may be a or b). */
static void combine(void *out, const void *a, const void *b, int64_t n,
                    hvd_dtype_t dtype) {
  double dot = 0, aa = 0, bb = 0;
  if (dtype == HVD_FLOAT32)
    SUMS(float);
  else
    SUMS(double);
  const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1;
  const double cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
  if (dtype == HVD_FLOAT32)
    MIX(float);
  else
    MIX(double);
}

/* Every member's segment of the packed group: mine = adasum(lower, higher)
 * where `mine_low` says which one mine is. */
static void combine_group(const hvd__work_t *w, char *mine, const char *peer,
                          int mine_low) {
  const hvd_dtype_t dtype = w->desc->dtype;
  const size_t es = hvd_dtype_size(dtype);
  int64_t at = 0;
  for (int i = 0; i < w->n; i++) {
    const int64_t m = hvd_tensor_numel(&w->reqs[i]->send);
    char *x = mine + at * es;
    const char *y = peer + at * es;
    combine(x, mine_low ? x : y, mine_low ? y : x, m, dtype);
    at += m;
  }
}

/* Sends `bytes` of out to rank `to` and/or receives as many into in from
 * `from` (MPI_PROC_NULL: that side is skipped), in pieces MPI's int
 * counts. */
static hvd_result_t swap(const hvd__exec_env_t *env, const char *out, char *in,
                         int64_t bytes, int to, int from) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int64_t off = 0; off < bytes; off += PIECE_BYTES) {
    const int cnt =
        (int)(bytes - off < PIECE_BYTES ? bytes - off : PIECE_BYTES);
    /* a side skipped sends or receives nothing from no buffer (MPI
     * refuses a NULL buffer with a count, even to MPI_PROC_NULL) */
    HVD__MPI_CHECK(MPI_Sendrecv(
        out != NULL ? out + off : NULL, out != NULL ? cnt : 0, MPI_BYTE, to,
        ADASUM_TAG, in != NULL ? in + off : NULL, in != NULL ? cnt : 0,
        MPI_BYTE, from, ADASUM_TAG, env->comm, MPI_STATUS_IGNORE));
  }
fail:
  return rc;
}

/* The tree over the packed group in mine (peer: as much scratch). */
static hvd_result_t tree(const hvd__exec_env_t *env, const hvd__work_t *w,
                         char *mine, char *peer, int64_t bytes) {
  hvd_result_t rc = HVD_SUCCESS;
  const int r = env->rank, size = env->size;
  int p2 = 1;
  while (p2 * 2 <= size)
    p2 *= 2;
  if (r >= p2) { /* folded into r - p2, which hands the result back */
    HVD__CHECK(swap(env, mine, NULL, bytes, r - p2, MPI_PROC_NULL));
    return swap(env, NULL, mine, bytes, MPI_PROC_NULL, r - p2);
  }
  if (r + p2 < size) {
    HVD__CHECK(swap(env, NULL, peer, bytes, MPI_PROC_NULL, r + p2));
    combine_group(w, mine, peer, 1);
  }
  for (int d = 1; d < p2; d *= 2) {
    const int q = r ^ d;
    HVD__CHECK(swap(env, mine, peer, bytes, q, q));
    combine_group(w, mine, peer, r < q);
  }
  if (r + p2 < size)
    HVD__CHECK(swap(env, mine, NULL, bytes, r + p2, MPI_PROC_NULL));
fail:
  return rc;
}

hvd_result_t hvd__adasum_allreduce(hvd__mpi_state_t *s,
                                   const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  const hvd__desc_t *d = w->desc;
  const size_t es = hvd_dtype_size(d->dtype);
  int64_t total = 0;
  for (int i = 0; i < w->n; i++)
    total += hvd_tensor_numel(&w->reqs[i]->send);
  const int64_t bytes = total * (int64_t)es;
  hvd_result_t rc = hvd__grow((void **)&s->ada, &s->ada_cap,
                              (size_t)(bytes > 0 ? bytes : 1), "adasum buffer");
  if (rc == HVD_SUCCESS)
    rc = hvd__grow((void **)&s->ada_peer, &s->ada_peer_cap,
                   (size_t)(bytes > 0 ? bytes : 1), "adasum buffer");
  if (rc != HVD_SUCCESS)
    return rc;
  int64_t at = 0;
  for (int i = 0; i < w->n; i++) { /* pack, prescaled; a stub's zeros */
    const hvd_request_t *q = w->reqs[i];
    const int64_t m = hvd_tensor_numel(&q->send);
    hvd__scale(s->ada + at * es, q->send.data, m, d->dtype,
               q->is_stub ? 1.0 : d->prescale);
    at += m;
  }
  rc = env->size > 1 ? tree(env, w, s->ada, s->ada_peer, bytes) : HVD_SUCCESS;
  at = 0;
  for (int i = 0; i < w->n && rc == HVD_SUCCESS; i++) { /* unpack */
    hvd_request_t *q = w->reqs[i];
    const int64_t m = hvd_tensor_numel(&q->send);
    if (!q->is_stub)
      hvd__scale(q->recv.data, s->ada + at * es, m, d->dtype, d->postscale);
    at += m;
  }
  return rc;
}
