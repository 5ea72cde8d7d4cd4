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
 * double in one fixed order (eight partial sums, folded pairwise); each
 * element is ca * a + cb * b in the
 * tensor's dtype (float32 or float64), the coefficients rounded to it
 * (a zero tensor's coefficient is 1: it adds nothing). A rank that joined
 * contributes zeros, the identity.
 *
 * Each tensor is combined in its recv (send copied there first, with the
 * prescale, unless in place), the peer's received into one scratch
 * buffer of the largest tensor's size, kept across groups (its growth
 * agreed by every rank first: one without the memory fails the group
 * everywhere before any MPI step): one MPI_Sendrecv per tensor and
 * level. Whole tensors travel at every level (log2 size exchanges with
 * one peer, against about two passes for a ring allreduce): meant for
 * the gradients of the distributed optimizer at the world sizes of a
 * node or a few, as Horovod's CPU Adasum is.
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
#define LANES 8 /* the dot products' partial sums (element i: lane i % 8) */

/* a's and b's dot product and squared norms in double, in LANES partial
 * sums (element i into lane i % LANES: the compiler vectorizes it, where
 * one running sum is a chain of dependent adds) folded pairwise: one
 * fixed order, whatever the machine */
#define SUMS(type)                                                             \
  do {                                                                         \
    const type *x = a, *y = b;                                                 \
    double d[LANES] = {0}, p[LANES] = {0}, q[LANES] = {0};                     \
    int64_t i = 0;                                                             \
    for (; i + LANES <= n; i += LANES)                                         \
      for (int k = 0; k < LANES; k++) {                                        \
        const double u = x[i + k], v = y[i + k];                               \
        d[k] += u * v;                                                         \
        p[k] += u * u;                                                         \
        q[k] += v * v;                                                         \
      }                                                                        \
    for (int k = 0; i < n; i++, k++) {                                         \
      const double u = x[i], v = y[i];                                         \
      d[k] += u * v;                                                           \
      p[k] += u * u;                                                           \
      q[k] += v * v;                                                           \
    }                                                                          \
    dot = fold(d), aa = fold(p), bb = fold(q);                                 \
  } while (0)

#define MIX(type)                                                              \
  do {                                                                         \
    const type fa = (type)ca, fb = (type)cb;                                   \
    type *o = out;                                                             \
    const type *x = a, *y = b;                                                 \
    for (int64_t i = 0; i < n; i++)                                            \
      o[i] = fa * x[i] + fb * y[i];                                            \
  } while (0)

static double fold(const double *v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* out = adasum(a, b) over n elements of dtype (out may be a or b). */
static void combine(void *out, const void *a, const void *b, int64_t n,
                    hvd_dtype_t dtype) {
  double dot, aa, bb;
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

/* Sends `bytes` of out to rank `to` and/or receives as many into in from
 * `from` (NULL and MPI_PROC_NULL: that side is skipped), in pieces MPI's
 * int counts. */
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

/* One stage of the tree for every tensor of the group (in its recv, the
 * peer's into scratch): send to `to` and/or receive from `from`; with
 * `mix`, the received one combined into it, this rank's the lower side
 * when `low`. */
static hvd_result_t stage(const hvd__exec_env_t *env, const hvd__work_t *w,
                          char *scratch, int to, int from, int mix, int low) {
  const hvd_dtype_t dtype = w->desc->dtype;
  const int64_t es = (int64_t)hvd_dtype_size(dtype);
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < w->n && rc == HVD_SUCCESS; i++) {
    char *mine = w->reqs[i]->recv.data;
    const int64_t m = hvd_tensor_numel(&w->reqs[i]->send);
    rc = swap(env, to == MPI_PROC_NULL ? NULL : mine,
              from == MPI_PROC_NULL ? NULL
              : mix                 ? scratch
                                    : mine,
              m * es, to, from);
    if (rc == HVD_SUCCESS && mix)
      combine(mine, low ? mine : scratch, low ? scratch : mine, m, dtype);
  }
  return rc;
}

/* The tree over the group's tensors, each in its recv. */
static hvd_result_t tree(const hvd__exec_env_t *env, const hvd__work_t *w,
                         char *scratch) {
  hvd_result_t rc = HVD_SUCCESS;
  const int r = env->rank, size = env->size, none = MPI_PROC_NULL;
  int p2 = 1;
  while (p2 * 2 <= size)
    p2 *= 2;
  if (r >= p2) { /* folded into r - p2, which hands the result back */
    HVD__CHECK(stage(env, w, scratch, r - p2, none, 0, 0));
    return stage(env, w, scratch, none, r - p2, 0, 0);
  }
  if (r + p2 < size)
    HVD__CHECK(stage(env, w, scratch, none, r + p2, 1, 1));
  for (int d = 1; d < p2; d *= 2)
    HVD__CHECK(stage(env, w, scratch, r ^ d, r ^ d, 1, r < (r ^ d)));
  if (r + p2 < size)
    HVD__CHECK(stage(env, w, scratch, r + p2, none, 0, 0));
fail:
  return rc;
}

hvd_result_t hvd__adasum_allreduce(hvd__mpi_state_t *s,
                                   const hvd__exec_env_t *env,
                                   const hvd__work_t *w) {
  const hvd__desc_t *d = w->desc;
  hvd_result_t rc = HVD_SUCCESS;
  int64_t most = 1;
  for (int i = 0; i < w->n; i++)
    most = hvd_tensor_numel(&w->reqs[i]->send) > most
               ? hvd_tensor_numel(&w->reqs[i]->send)
               : most;
  /* the largest tensor's size, every rank's alike: the growth agreed,
   * before any MPI step and before any recv is written */
  if (env->size > 1)
    rc = hvd__grow_agreed(
        env, "adasum", (void **)&s->ada_peer, &s->ada_peer_cap,
        (size_t)most * hvd_dtype_size(d->dtype), "Adasum peer buffer");
  for (int i = 0; i < w->n && rc == HVD_SUCCESS; i++) { /* prescaled */
    const hvd_request_t *q = w->reqs[i];
    hvd__scale(q->recv.data, q->send.data, hvd_tensor_numel(&q->send), d->dtype,
               q->is_stub ? 1.0 : d->prescale);
  }
  if (rc == HVD_SUCCESS && env->size > 1)
    rc = tree(env, w, s->ada_peer);
  for (int i = 0; i < w->n && rc == HVD_SUCCESS; i++) {
    hvd_request_t *q = w->reqs[i];
    if (!q->is_stub)
      hvd__scale(q->recv.data, q->recv.data, hvd_tensor_numel(&q->send),
                 d->dtype, d->postscale);
  }
  return rc;
}
