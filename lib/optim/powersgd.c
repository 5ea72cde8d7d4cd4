/*
 * powersgd.c - PowerSGD gradient compression for the distributed
 * optimizer (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank
 * Gradient Compression for Distributed Optimization", 2019), with the
 * choices of PyTorch DDP's powerSGD_hook, so that a DDP user's settings
 * mean the same here (include/hvd.h, hvd_powersgd_options_t).
 *
 * A step of one compressed parameter, M its gradient viewed as n x m:
 *
 *   grad_ready     M = prescale * g + e        (in place, in g)
 *                  P = M Q                     (n x r)
 *                  allreduce P "hvd.psgd.<name>.p"  (fuses with the rest)
 *   step, phase 2  P orthonormalised (Gram-Schmidt, in double)
 *                  Q = M^T P                   (m x r)
 *                  allreduce Q "hvd.psgd.<name>.q"
 *   step, finish   t = P Q^T;  e = M - t / size;  g = t * postscale
 *
 * The first phase starts at grad_ready and overlaps backward as any
 * reduction does; the second needs every P and runs in the step. P after
 * its allreduce, Q after its, and so t and g, are the same bits on every
 * rank: the arithmetic between them is this file's fixed loops. Q is kept
 * transposed (r rows of m) so that every loop runs along a contiguous
 * row.
 *
 * With o.wire float16 or bfloat16 the allreduces of P and Q travel so
 * (hvd__allreduce_wire_async, as HVD_COMPRESS_FP16's do); the arithmetic
 * around them stays float32.
 *
 * Which parameters are compressed depends only on shapes and options, and
 * whether this step compresses only on the optimizer's step count, so
 * every rank submits the same reductions.
 *
 * A device parameter's M, e, P and Q live on its GPU, and the three
 * products and the element passes are kernels on the optimizer's stream
 * (device.h's hvd__odev_psgd; optim_math.h's arithmetic, so the host's
 * bits). Gram-Schmidt, Q's random values and the finiteness test run on
 * the host, on copies of P (n x r) and Q (r x m): small, and the same
 * host code on every rank. The allreduces of P and Q are submitted under
 * the optimizer's stream (hvd_cuda_set_stream), so they are ordered after
 * the kernels that wrote them on the device, and grad_ready never waits
 * on the host; the step waits three times in all (every P fetched; every
 * Q fetched; every gradient finished), not per parameter. Q^T = P^T M
 * sums its n rows by chunks of 64 (optim_math.h), so that the device has
 * chunks x r x m threads, not r x m.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/splitmix.h"
#include "base/tensor.h"
#include "optim/optim_math.h"
#include "optim/optimizer.h"

#define PSGD_PREFIX "hvd.psgd."

typedef struct psgd_param {
  int on;             /* compressed when the step count allows */
  int64_t n, m;       /* the matrix view */
  int r;              /* min(rank, n, m) */
  int dev;            /* the gradient's device (HVD_CPU: the host) */
  float *p;           /* n x r (a device parameter's: the host copy) */
  float *q;           /* Q transposed: r x m (likewise) */
  float *e;           /* n x m error feedback (error_feedback), else NULL */
  hvd__odev_psgd_t d; /* a device parameter's P, Qt and e on its GPU */
  int q_ready;        /* q holds a warm start */
  uint64_t draws;     /* random Qs drawn so far (the same on every rank) */
  char *name;         /* the parameter's */
  char *pname, *qname;
  hvd_tensor_t *g;    /* the gradient compressed this step, else NULL */
  hvd_request_t *req; /* phase 2's allreduce in flight */
  float *ck_q, *ck_e; /* a save's host copies: Q^T, the ranks' mean e */
} psgd_param_t;

struct hvd__psgd {
  hvd_powersgd_options_t o;
  int n;
  psgd_param_t *p;
  hvd__odev_t *odev; /* the optimizer's (device parameters), not owned */
  float *row;        /* the host's scratch: a row of t, or Q^T's chunk part (the
                        largest r m) */
};

/* ---- creation ----------------------------------------------------------- */

static hvd_result_t check(const char *fn, const hvd_powersgd_options_t *o) {
  if (o->rank < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: powersgd.rank %d is below 1", fn, o->rank);
  if (o->start_step < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: powersgd.start_step %lld is negative", fn,
                          (long long)o->start_step);
  if (!isfinite(o->min_compression_rate) || o->min_compression_rate < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: powersgd.min_compression_rate %g is not a "
                          "finite number >= 0",
                          fn, o->min_compression_rate);
  if ((o->error_feedback | o->warm_start) & ~1)
    return hvd__set_error(
        HVD_ERR_INVALID_ARG, "%s: powersgd.%s %d is not 0 or 1", fn,
        o->error_feedback & ~1 ? "error_feedback" : "warm_start",
        o->error_feedback & ~1 ? o->error_feedback : o->warm_start);
  if (o->wire != HVD_FLOAT32 && o->wire != HVD_FLOAT16 &&
      o->wire != HVD_BFLOAT16)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: powersgd.wire %s is not float32, float16 or "
                          "bfloat16",
                          fn,
                          hvd__dtype_valid((int)o->wire)
                              ? hvd_dtype_name(o->wire)
                              : "(not a dtype)");
  return HVD_SUCCESS;
}

/* Whether gradient g is compressed, and its matrix view (DDP's rule:
 * compressed when r (n + m) * rate < n m). */
static int compressible(const hvd_powersgd_options_t *o, const hvd_tensor_t *g,
                        int64_t *n, int64_t *m, int *r) {
  if (g->ndim < 2 || g->shape[0] == 0)
    return 0;
  *n = g->shape[0];
  *m = hvd_tensor_numel(g) / *n;
  int64_t k = o->rank;
  if (k > *n)
    k = *n;
  if (k > *m)
    k = *m;
  *r = (int)k;
  return (double)k * (double)(*n + *m) * o->min_compression_rate <
         (double)*n * (double)*m;
}

static char *name_of(const char *pname, const char *part) {
  size_t len = sizeof PSGD_PREFIX + strlen(pname) + strlen(part);
  char *s = malloc(len);
  if (s != NULL)
    snprintf(s, len, "%s%s%s", PSGD_PREFIX, pname, part);
  return s;
}

void hvd__psgd_free(hvd__psgd_t *s) {
  if (s == NULL)
    return;
  for (int i = 0; s->p != NULL && i < s->n; i++) {
    psgd_param_t *p = &s->p[i];
    if (p->req != NULL)
      (void)hvd_wait(p->req); /* its buffer is ours, freed below */
    free(p->p);
    free(p->q);
    free(p->e);
    if (p->dev != HVD_CPU) {
      hvd__odev_free(p->dev, p->d.P);
      hvd__odev_free(p->dev, p->d.Qt);
      hvd__odev_free(p->dev, p->d.e);
      hvd__odev_free(p->dev, p->d.parts);
    }
    free(p->name);
    free(p->pname);
    free(p->qname);
    free(p->ck_q);
    free(p->ck_e);
  }
  free(s->p);
  free(s->row);
  free(s);
}

/* A device parameter's P, Q and e on its GPU (zeroed). */
static hvd_result_t device_init(const char *fn, hvd__psgd_t *s,
                                psgd_param_t *p) {
  hvd_result_t rc = HVD_SUCCESS;
  void *P = NULL, *Qt = NULL, *e = NULL, *parts = NULL;
  const int64_t chunks = hvd__km_psgd_chunks(p->n);
  rc = hvd__odev_calloc(fn, s->odev, (size_t)(p->n * p->r) * sizeof(float), &P);
  if (rc == HVD_SUCCESS)
    rc = hvd__odev_calloc(fn, s->odev, (size_t)(p->m * p->r) * sizeof(float),
                          &Qt);
  if (rc == HVD_SUCCESS && s->o.error_feedback)
    rc = hvd__odev_calloc(fn, s->odev, (size_t)(p->n * p->m) * sizeof(float),
                          &e);
  if (rc == HVD_SUCCESS && chunks > 1)
    rc = hvd__odev_calloc(
        fn, s->odev, (size_t)(chunks * p->m * p->r) * sizeof(float), &parts);
  p->d = (hvd__odev_psgd_t){.P = P,
                            .Qt = Qt,
                            .e = e,
                            .parts = parts,
                            .n = p->n,
                            .m = p->m,
                            .r = p->r};
  return rc;
}

/* Parameter i's buffers, or a refusal of a gradient it cannot take. */
static hvd_result_t param_init(const char *fn, hvd__psgd_t *s,
                               const hvd_param_t *prm, int reduce_fp32,
                               psgd_param_t *p) {
  const hvd_tensor_t *g = &prm->grad;
  p->dev = HVD_CPU;
  if (!compressible(&s->o, g, &p->n, &p->m, &p->r))
    return HVD_SUCCESS;
  if (g->dtype != HVD_FLOAT32 && !reduce_fp32)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: compression powersgd compresses float32 "
                          "gradients (set reduce_fp32 for float16/bfloat16 "
                          "ones); parameter '%s' has %s",
                          fn, prm->name, hvd_dtype_name(g->dtype));
  p->on = 1;
  p->dev = g->device;
  p->p = malloc((size_t)(p->n * p->r) * sizeof *p->p);
  p->q = malloc((size_t)(p->m * p->r) * sizeof *p->q);
  if (s->o.error_feedback && p->dev == HVD_CPU)
    p->e = calloc((size_t)(p->n * p->m), sizeof *p->e);
  p->name = strdup(prm->name);
  p->pname = name_of(prm->name, ".p");
  p->qname = name_of(prm->name, ".q");
  if (p->p == NULL || p->q == NULL ||
      (s->o.error_feedback && p->dev == HVD_CPU && p->e == NULL) ||
      p->name == NULL || p->pname == NULL || p->qname == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: powersgd: out of memory for parameter '%s' "
                          "(%lld x %lld, rank %d)",
                          fn, prm->name, (long long)p->n, (long long)p->m,
                          p->r);
  return p->dev == HVD_CPU ? HVD_SUCCESS : device_init(fn, s, p);
}

hvd_result_t hvd__psgd_create(const char *fn, const hvd_powersgd_options_t *o,
                              const hvd_optimizer_t *base, int reduce_fp32,
                              hvd__psgd_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  HVD__CHECK(check(fn, o));
  hvd__psgd_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  s->o = *o;
  s->n = base->n;
  s->odev = base->odev;
  s->p = calloc(base->n > 0 ? (size_t)base->n : 1, sizeof *s->p);
  if (s->p == NULL) {
    free(s);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  }
  int64_t widest = 1;
  for (int i = 0; i < base->n && rc == HVD_SUCCESS; i++) {
    rc = param_init(fn, s, &base->params[i], reduce_fp32, &s->p[i]);
    if (s->p[i].on && s->p[i].m * s->p[i].r > widest)
      widest = s->p[i].m * s->p[i].r;
  }
  if (rc == HVD_SUCCESS &&
      (s->row = malloc((size_t)widest * sizeof(float))) == NULL)
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  if (rc != HVD_SUCCESS) {
    hvd__psgd_free(s);
    return rc;
  }
  *out = s;
  return HVD_SUCCESS;
fail:
  return rc;
}

int hvd__psgd_takes(const hvd__psgd_t *s, int i, int64_t steps) {
  return s != NULL && s->p[i].on && steps >= s->o.start_step;
}

int64_t hvd__psgd_values(const hvd__psgd_t *s, int i, int64_t numel) {
  if (s == NULL || !s->p[i].on)
    return numel;
  return (int64_t)s->p[i].r * (s->p[i].n + s->p[i].m);
}

/* ---- the arithmetic ----------------------------------------------------- */

/* Q's normal random values (Box-Muller), from (seed, parameter, draw):
 * the same on every rank. */
static void draw_q(const hvd__psgd_t *s, int i, psgd_param_t *p) {
  uint64_t x = s->o.seed ^ ((uint64_t)(i + 1) * 0xd1b54a32d192ed03ULL) ^
               (p->draws++ * 0x8cb92ba72f3d8dd7ULL);
  int64_t len = p->m * p->r;
  for (int64_t k = 0; k < len; k += 2) {
    double u1 = ((double)(hvd__splitmix64(&x) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(hvd__splitmix64(&x) >> 11) * 0x1p-53; /* u1: (0, 1] */
    double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
    p->q[k] = (float)(rad * cos(ang));
    if (k + 1 < len)
      p->q[k + 1] = (float)(rad * sin(ang));
  }
}

/* P = M Q (each entry a dot product along a row of M and one of Q^T, in
 * hvd__km_psgd_dot's order: the device kernel's). */
static void m_times_q(const float *M, const psgd_param_t *p, float *P) {
  for (int64_t a = 0; a < p->n; a++)
    for (int j = 0; j < p->r; j++)
      P[a * p->r + j] =
          hvd__km_psgd_dot(M + a * p->m, p->q + (int64_t)j * p->m, p->m);
}

/* Gram-Schmidt on P's r columns, in double; a column of norm 0 (or one
 * that the earlier columns spanned to the last bit) is left 0, a NaN
 * stays a NaN. */
static void orthonormalise(float *P, int64_t n, int r) {
  for (int j = 0; j < r; j++) {
    double norm = 0;
    for (int64_t a = 0; a < n; a++)
      norm += (double)P[a * r + j] * P[a * r + j];
    norm = sqrt(norm);
    for (int64_t a = 0; a < n; a++)
      P[a * r + j] = norm == 0 ? 0.0f : (float)(P[a * r + j] / norm);
    for (int k = j + 1; k < r; k++) {
      double dot = 0;
      for (int64_t a = 0; a < n; a++)
        dot += (double)P[a * r + j] * P[a * r + k];
      for (int64_t a = 0; a < n; a++)
        P[a * r + k] = (float)(P[a * r + k] - dot * P[a * r + j]);
    }
  }
}

/* Q^T = P^T M by chunks of rows: a chunk's part gains P[a][j] M[a] row
 * by row (contiguous), then joins Q^T; each element sees the operations
 * of hvd__km_psgd_mtp in its order (the device's bits). part: r m
 * floats of scratch. */
static void mt_times_p(const float *M, psgd_param_t *p, float *part) {
  const int64_t rm = p->m * p->r;
  memset(p->q, 0, (size_t)rm * sizeof *p->q);
  for (int64_t c0 = 0; c0 < p->n; c0 += HVD__KM_PSGD_CHUNK) {
    const int64_t end =
        c0 + HVD__KM_PSGD_CHUNK < p->n ? c0 + HVD__KM_PSGD_CHUNK : p->n;
    memset(part, 0, (size_t)rm * sizeof *part);
    for (int64_t a = c0; a < end; a++)
      for (int j = 0; j < p->r; j++) {
        const float c = p->p[a * p->r + j], *row = M + a * p->m;
        float *pj = part + (int64_t)j * p->m;
        if (c != 0.0f)
          for (int64_t b = 0; b < p->m; b++)
            pj[b] += c * row[b];
      }
    for (int64_t k = 0; k < rm; k++) /* the chunks' parts in order */
      p->q[k] += part[k];
  }
}

static int all_finite(const float *x, int64_t len) {
  for (int64_t k = 0; k < len; k++)
    if (!isfinite(x[k]))
      return 0;
  return 1;
}

/* ---- the step ----------------------------------------------------------- */

static const char who[] = HVD__STEP_WHO;

/* An allreduce (a sum, in place, on the wire of o.wire) of x, rows x
 * cols float32 on dev. A device tensor's is submitted under the
 * optimizer's stream (the collectives' ordering rule: it reads x after
 * the kernels that wrote it, on the device; the host waits for nothing). */
static hvd_result_t reduce_async(hvd__psgd_t *s, const char *name, float *x,
                                 int64_t rows, int64_t cols, int dev,
                                 hvd_request_t **req) {
  int64_t shape[2] = {rows, cols};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 2, shape);
  t.device = dev;
  return hvd__odev_allreduce_async(s->odev, name, &t, HVD_SUM, s->o.wire, req);
}

/* A device parameter's first round up to P's allreduce, enqueued after
 * the caller's stream: M = prescale M + e and, when a new Q is drawn, its
 * upload (staged from host memory before the call returns), then P = M Q. */
static hvd_result_t device_start(hvd__psgd_t *s, psgd_param_t *p, float *M,
                                 double prescale, int draw) {
  hvd_result_t rc = HVD_SUCCESS;
  p->d.M = M;
  HVD__CHECK(hvd__odev_after_caller(who, s->odev)); /* M may be in the making */
  HVD__CHECK(hvd__odev_psgd(who, s->odev, HVD__PSGD_PREPARE, &p->d, prescale,
                            1.0f, 0));
  if (draw)
    HVD__CHECK(hvd__odev_copy_async(who, s->odev, p->d.Qt, p->q,
                                    (size_t)(p->m * p->r) * sizeof(float), 1));
  rc = hvd__odev_psgd(who, s->odev, HVD__PSGD_MQ, &p->d, 1.0, 1.0f, 0);
fail:
  return rc;
}

hvd_result_t hvd__psgd_start(hvd__psgd_t *s, int i, hvd_tensor_t *g,
                             double prescale, hvd_request_t **req) {
  psgd_param_t *p = &s->p[i];
  float *M = g->data;
  const int draw = !s->o.warm_start || !p->q_ready;
  hvd_result_t rc = HVD_SUCCESS;
  if (draw)
    draw_q(s, i, p);
  if (p->dev != HVD_CPU) {
    HVD__CHECK(device_start(s, p, M, prescale, draw));
  } else {
    for (int64_t k = 0; k < p->n * p->m; k++)
      hvd__km_psgd_prepare(M, p->e, (float)prescale, k);
    m_times_q(M, p, p->p);
  }
  rc = reduce_async(s, p->pname, p->dev != HVD_CPU ? p->d.P : p->p, p->n, p->r,
                    p->dev, req);
  if (rc == HVD_SUCCESS)
    p->g = g;
fail:
  return rc;
}

/* Every device parameter compressed this step: its device P (q 0) or Q
 * (q 1) copied into its host copy, then one wait for them all. */
static hvd_result_t device_fetch(hvd__psgd_t *s, int q) {
  hvd_result_t rc = HVD_SUCCESS;
  int any = 0;
  for (int i = 0; i < s->n; i++) {
    psgd_param_t *p = &s->p[i];
    if (p->g == NULL || p->dev == HVD_CPU)
      continue;
    any = 1;
    if (q)
      HVD__CHECK(hvd__odev_copy_async(who, s->odev, p->q, p->d.Qt,
                                      (size_t)(p->m * p->r) * sizeof(float),
                                      0));
    else
      HVD__CHECK(hvd__odev_copy_async(who, s->odev, p->p, p->d.P,
                                      (size_t)(p->n * p->r) * sizeof(float),
                                      0));
  }
  if (any)
    rc = hvd__odev_sync(who, s->odev);
fail:
  return rc;
}

/* Q^T = P^T M for every parameter compressed this step, P orthonormalised
 * first: on the host, or (a device parameter) on the host copy, which
 * goes back, and the product enqueued (its allreduce is ordered after it
 * on the device). */
static hvd_result_t second_products(hvd__psgd_t *s) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = s->n - 1; i >= 0; i--) {
    psgd_param_t *p = &s->p[i];
    if (p->g == NULL)
      continue;
    orthonormalise(p->p, p->n, p->r);
    if (p->dev == HVD_CPU) {
      mt_times_p(p->g->data, p, s->row);
      continue;
    }
    HVD__CHECK(hvd__odev_copy_async(who, s->odev, p->d.P, p->p,
                                    (size_t)(p->n * p->r) * sizeof(float), 1));
    HVD__CHECK(
        hvd__odev_psgd(who, s->odev, HVD__PSGD_MTP, &p->d, 1.0, 1.0f, 0));
  }
fail:
  return rc;
}

/* Phase 2 of every parameter compressed this step: Q = M^T P, then the
 * allreduces; the first failure's message kept in msg. The device work
 * of all parameters is batched (two waits in all); if it fails, this
 * rank submits none of the second round (the others' wait for it ends as
 * a stall, as for any rank that stops submitting). */
static hvd_result_t start_q(hvd__psgd_t *s, char *msg, size_t cap) {
  hvd_result_t first = device_fetch(s, 0);
  if (first == HVD_SUCCESS)
    first = second_products(s);
  if (first != HVD_SUCCESS) {
    snprintf(msg, cap, "%s", hvd_last_error());
    return first;
  }
  for (int i = s->n - 1; i >= 0; i--) {
    psgd_param_t *p = &s->p[i];
    if (p->g == NULL)
      continue;
    hvd_result_t rc =
        reduce_async(s, p->qname, p->dev != HVD_CPU ? p->d.Qt : p->q, p->r,
                     p->m, p->dev, &p->req);
    if (rc != HVD_SUCCESS)
      p->req = NULL;
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, cap, "%s", hvd_last_error());
    }
  }
  return first;
}

/* A device parameter's end, its Q already on the host (device_fetch):
 * the finish kernel and the warm start's scaling, enqueued. */
static hvd_result_t device_finish(hvd__psgd_t *s, psgd_param_t *p,
                                  double postscale, float inv, int finite) {
  hvd_result_t rc = HVD_SUCCESS;
  HVD__CHECK(hvd__odev_psgd(who, s->odev, HVD__PSGD_FINISH, &p->d, postscale,
                            inv, finite));
  if (finite && s->o.warm_start)
    rc = hvd__odev_scale(who, s->odev, p->d.Qt, p->m * p->r, inv);
fail:
  return rc;
}

/* The host's finish, row by row: t's row accumulated over j (each
 * element sees hvd__km_psgd_finish's operations in its order: the
 * device's bits), then e's and M's: contiguous loops, which vectorize. */
static void host_finish(const psgd_param_t *p, float *M, float *t, float post,
                        float inv, int keep) {
  for (int64_t a = 0; a < p->n; a++) {
    float *row = M + a * p->m, *err = p->e != NULL ? p->e + a * p->m : NULL;
    for (int64_t b = 0; b < p->m; b++)
      t[b] = 0;
    for (int j = 0; j < p->r; j++) {
      const float c = p->p[a * p->r + j], *qj = p->q + (int64_t)j * p->m;
      for (int64_t b = 0; b < p->m; b++)
        t[b] += c * qj[b];
    }
    if (err != NULL && keep)
      for (int64_t b = 0; b < p->m; b++)
        err[b] = row[b] - t[b] * inv;
    for (int64_t b = 0; b < p->m; b++)
      row[b] = t[b] * post;
  }
}

/* t = P Q^T; e = M - t / size; g = t * post. A non-finite P or Q leaves g
 * non-finite (loss scaling skips the step), e as it was, and no warm
 * start. A device parameter's work is enqueued (the caller waits). */
static hvd_result_t finish(hvd__psgd_t *s, psgd_param_t *p, double postscale,
                           int size) {
  float *M = p->g->data;
  const float inv = 1.0f / (float)size;
  const int finite =
      all_finite(p->p, p->n * p->r) && all_finite(p->q, p->m * p->r);
  if (p->dev != HVD_CPU) {
    hvd_result_t rc = device_finish(s, p, postscale, inv, finite);
    if (rc != HVD_SUCCESS)
      return rc;
  } else {
    host_finish(p, M, s->row, (float)postscale, inv, finite);
    if (finite && s->o.warm_start) /* the mean Q, as DDP keeps it */
      for (int64_t k = 0; k < p->m * p->r; k++)
        p->q[k] *= inv;
  }
  p->q_ready = finite && s->o.warm_start;
  return HVD_SUCCESS;
}

/* Waits for every parameter's request in flight (phase 2's, or a save's
 * averages); the first failure into *first. */
static void wait_q(hvd__psgd_t *s, hvd_result_t *first, char *msg, size_t cap) {
  for (int i = 0; i < s->n; i++) {
    psgd_param_t *p = &s->p[i];
    if (p->req == NULL)
      continue;
    hvd_result_t rc = hvd_wait(p->req);
    p->req = NULL;
    if (rc != HVD_SUCCESS && *first == HVD_SUCCESS) {
      *first = rc;
      snprintf(msg, cap, "%s", hvd_last_error());
    }
  }
}

/* Every parameter's end (device Qs fetched first, one wait after). */
static hvd_result_t finish_all(hvd__psgd_t *s, double postscale) {
  hvd_result_t rc = device_fetch(s, 1);
  int size = hvd__coll_size(), any = 0;
  for (int i = 0; i < s->n && rc == HVD_SUCCESS; i++)
    if (s->p[i].g != NULL) {
      rc = finish(s, &s->p[i], postscale, size);
      any |= s->p[i].dev != HVD_CPU;
    }
  if (rc == HVD_SUCCESS && any)
    rc = hvd__odev_sync(who, s->odev);
  return rc;
}

hvd_result_t hvd__psgd_finish(hvd__psgd_t *s, int keep, double postscale) {
  char msg[HVD__ERRMSG_MAX] = "";
  hvd_result_t first = HVD_SUCCESS;
  if (s == NULL)
    return HVD_SUCCESS;
  if (keep)
    first = start_q(s, msg, sizeof msg);
  wait_q(s, &first, msg, sizeof msg);
  if (keep && first == HVD_SUCCESS) {
    first = finish_all(s, postscale);
    if (first != HVD_SUCCESS)
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
  }
  for (int i = 0; i < s->n; i++) {
    psgd_param_t *p = &s->p[i];
    if (p->g != NULL && (!keep || first != HVD_SUCCESS))
      p->q_ready = 0; /* q may hold this rank's own M^T P */
    p->g = NULL;
  }
  return first == HVD_SUCCESS ? HVD_SUCCESS : hvd__set_error_msg(first, msg);
}

/* ---- checkpoints and commits -------------------------------------------- */

/* The state that outlives a step is e, Q (with warm_start) and the draw
 * count. The result depends on the ranks' M only through their sum (P =
 * (sum M) Q, Q = (sum M)^T P), so only the sum of the ranks' e matters,
 * and the mean e is what the averaged gradient still owes: a checkpoint
 * holds the ranks' mean e, and a load gives it to every rank, at any
 * world size. Q and the draws are the same on every rank. hvd_state's
 * in-memory commits keep this rank's own e, exactly. */

static const char who_ck[] = "hvd_checkpoint_save";

static size_t e_bytes(const psgd_param_t *p) {
  return (size_t)(p->n * p->m) * sizeof(float);
}

static size_t q_bytes(const psgd_param_t *p) {
  return (size_t)(p->m * p->r) * sizeof(float);
}

/* This rank's e and Q^T of p into host memory e and q (either may be
 * NULL). A device parameter's copies are enqueued: the caller syncs. */
static hvd_result_t fetch_state(hvd__psgd_t *s, const psgd_param_t *p,
                                const char *fn, float *e, float *q) {
  hvd_result_t rc = HVD_SUCCESS;
  if (p->dev == HVD_CPU) {
    if (e != NULL)
      memcpy(e, p->e, e_bytes(p));
    if (q != NULL)
      memcpy(q, p->q, q_bytes(p));
    return HVD_SUCCESS;
  }
  if (e != NULL)
    HVD__CHECK(hvd__odev_copy_async(fn, s->odev, e, p->d.e, e_bytes(p), 0));
  if (q != NULL)
    rc = hvd__odev_copy_async(fn, s->odev, q, p->d.Qt, q_bytes(p), 0);
fail:
  return rc;
}

/* The reverse: host e and q (either NULL: left as it is) into p's. */
static hvd_result_t store_state(hvd__psgd_t *s, psgd_param_t *p, const char *fn,
                                const float *e, const float *q) {
  hvd_result_t rc = HVD_SUCCESS;
  if (q != NULL) /* the host copy, a device parameter's too */
    memcpy(p->q, q, q_bytes(p));
  if (p->dev == HVD_CPU) {
    if (e != NULL)
      memcpy(p->e, e, e_bytes(p));
    return HVD_SUCCESS;
  }
  if (e != NULL)
    HVD__CHECK(hvd__odev_copy_async(fn, s->odev, p->d.e, e, e_bytes(p), 1));
  if (q != NULL)
    rc = hvd__odev_copy_async(fn, s->odev, p->d.Qt, q, q_bytes(p), 1);
fail:
  return rc;
}

static int any_device(const hvd__psgd_t *s) {
  for (int i = 0; i < s->n; i++)
    if (s->p[i].on && s->p[i].dev != HVD_CPU)
      return 1;
  return 0;
}

int64_t hvd__psgd_state_bytes(const hvd__psgd_t *s) {
  int64_t b = 0;
  for (int i = 0; s != NULL && i < s->n; i++)
    if (s->p[i].on)
      b += (int64_t)q_bytes(&s->p[i]) +
           (s->o.error_feedback ? (int64_t)e_bytes(&s->p[i]) : 0);
  return b;
}

int hvd__psgd_record(const hvd__psgd_t *s, int i, hvd__psgd_record_t *rec) {
  if (s == NULL || i < 0 || i >= s->n || !s->p[i].on)
    return 0;
  const psgd_param_t *p = &s->p[i];
  *rec = (hvd__psgd_record_t){.name = p->name,
                              .n = p->n,
                              .m = p->m,
                              .r = p->r,
                              .draws = p->draws,
                              .qt = p->ck_q,
                              .e = p->ck_e};
  return 1;
}

void hvd__psgd_release(hvd__psgd_t *s) {
  for (int i = 0; s != NULL && i < s->n; i++) {
    free(s->p[i].ck_q);
    free(s->p[i].ck_e);
    s->p[i].ck_q = s->p[i].ck_e = NULL;
  }
}

/* Every ck_e replaced by the ranks' mean (in place): all submitted, so
 * that they fuse, then all waited for (p->req, free between steps); the
 * first failure kept. */
static hvd_result_t average_errors(hvd__psgd_t *s) {
  hvd_result_t first = HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX] = "";
  for (int i = 0; i < s->n && first == HVD_SUCCESS; i++) {
    psgd_param_t *p = &s->p[i];
    if (p->ck_e == NULL)
      continue;
    char *name = name_of(p->name, ".e");
    int64_t shape[2] = {p->n, p->m};
    hvd_tensor_t t = hvd_tensor_make(p->ck_e, HVD_FLOAT32, 2, shape);
    first =
        name != NULL
            ? hvd_allreduce_async(name, &t, &t, HVD_AVERAGE, 1, 1, &p->req)
            : hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who_ck);
    if (first != HVD_SUCCESS) {
      p->req = NULL;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
    free(name);
  }
  wait_q(s, &first, msg, sizeof msg);
  return first == HVD_SUCCESS ? HVD_SUCCESS : hvd__set_error_msg(first, msg);
}

hvd_result_t hvd__psgd_gather(hvd__psgd_t *s) {
  hvd_result_t rc = HVD_SUCCESS;
  if (s == NULL)
    return HVD_SUCCESS;
  for (int i = 0; i < s->n && rc == HVD_SUCCESS; i++) {
    psgd_param_t *p = &s->p[i];
    if (!p->on)
      continue;
    /* the same choices on every rank: q_ready and draws are */
    if ((p->q_ready && (p->ck_q = malloc(q_bytes(p))) == NULL) ||
        (s->o.error_feedback && p->draws > 0 &&
         (p->ck_e = malloc(e_bytes(p))) == NULL))
      rc = hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: out of memory for the PowerSGD state of '%s' "
                          "(%lld x %lld)",
                          who_ck, p->name, (long long)p->n, (long long)p->m);
    else
      rc = fetch_state(s, p, who_ck, p->ck_e, p->ck_q);
  }
  if (rc == HVD_SUCCESS && any_device(s))
    rc = hvd__odev_sync(who_ck, s->odev);
  rc = hvd__optim_agree("hvd.ckpt.psgd", rc);
  if (rc == HVD_SUCCESS)
    rc = average_errors(s);
  if (rc != HVD_SUCCESS)
    hvd__psgd_release(s);
  return rc;
}

int hvd__psgd_find(const hvd__psgd_t *s, const char *name, size_t len) {
  for (int i = 0; s != NULL && i < s->n; i++)
    if (s->p[i].on && strlen(s->p[i].name) == len &&
        memcmp(s->p[i].name, name, len) == 0)
      return i;
  return -1;
}

hvd_result_t hvd__psgd_reset(hvd__psgd_t *s, const char *fn) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; s != NULL && i < s->n && rc == HVD_SUCCESS; i++) {
    psgd_param_t *p = &s->p[i];
    if (!p->on)
      continue;
    p->q_ready = 0;
    p->draws = 0;
    if (!s->o.error_feedback)
      continue;
    if (p->dev == HVD_CPU)
      memset(p->e, 0, e_bytes(p));
    else
      rc = hvd__odev_zero(fn, s->odev, p->d.e, e_bytes(p));
  }
  if (rc == HVD_SUCCESS && s != NULL && any_device(s))
    rc = hvd__odev_sync(fn, s->odev);
  return rc;
}

hvd_result_t hvd__psgd_load(hvd__psgd_t *s, const char *fn, int i,
                            const hvd__psgd_record_t *rec) {
  psgd_param_t *p = &s->p[i];
  const int warm = s->o.warm_start && rec->qt != NULL && rec->r == p->r;
  hvd_result_t rc = store_state(s, p, fn, s->o.error_feedback ? rec->e : NULL,
                                warm ? rec->qt : NULL);
  if (rc == HVD_SUCCESS && p->dev != HVD_CPU)
    rc = hvd__odev_sync(fn, s->odev); /* rec's memory is the caller's */
  p->draws = rec->draws;
  p->q_ready = rc == HVD_SUCCESS && warm;
  return rc;
}

/* hvd_state's copy: each compressed parameter's e and Q^T, exactly. */
typedef struct kept {
  float *e, *q;
  int q_ready;
  uint64_t draws;
} kept_t;

struct hvd__psgd_copy {
  int n;
  kept_t *k;
};

void hvd__psgd_copy_free(hvd__psgd_copy_t *c) {
  for (int i = 0; c != NULL && i < c->n; i++) {
    free(c->k[i].e);
    free(c->k[i].q);
  }
  if (c != NULL)
    free(c->k);
  free(c);
}

static hvd_result_t copy_alloc(const hvd__psgd_t *s, const char *fn,
                               hvd__psgd_copy_t **out) {
  hvd__psgd_copy_t *c = calloc(1, sizeof *c);
  int oom =
      c == NULL || (c->k = calloc((size_t)s->n + 1, sizeof *c->k)) == NULL;
  if (c != NULL)
    c->n = s->n;
  for (int i = 0; !oom && i < s->n; i++) {
    const psgd_param_t *p = &s->p[i];
    if (!p->on)
      continue;
    oom = (c->k[i].q = malloc(q_bytes(p))) == NULL ||
          (s->o.error_feedback && (c->k[i].e = malloc(e_bytes(p))) == NULL);
  }
  if (oom) {
    hvd__psgd_copy_free(c);
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: out of memory for the PowerSGD state's copy",
                          fn);
  }
  *out = c;
  return HVD_SUCCESS;
}

hvd_result_t hvd__psgd_keep(hvd__psgd_t *s, const char *fn,
                            hvd__psgd_copy_t **copy, int to_live) {
  hvd_result_t rc = HVD_SUCCESS;
  if (s == NULL || (to_live && *copy == NULL))
    return HVD_SUCCESS;
  if (*copy == NULL)
    HVD__CHECK(copy_alloc(s, fn, copy));
  for (int i = 0; i < s->n && rc == HVD_SUCCESS; i++) {
    psgd_param_t *p = &s->p[i];
    kept_t *k = &(*copy)->k[i];
    if (!p->on)
      continue;
    if (to_live) {
      rc = store_state(s, p, fn, k->e, k->q_ready ? k->q : NULL);
      p->q_ready = k->q_ready, p->draws = k->draws;
    } else {
      rc = fetch_state(s, p, fn, k->e, p->q_ready ? k->q : NULL);
      k->q_ready = p->q_ready, k->draws = p->draws;
    }
  }
  if (rc == HVD_SUCCESS && any_device(s))
    rc = hvd__odev_sync(fn, s->odev);
fail:
  return rc;
}
