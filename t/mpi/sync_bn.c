/*
 * sync_bn.c - synchronized batch normalization equals one process's batch
 * norm over the concatenated batch, at every world size.
 *
 * Rank r holds N_r samples of one global batch, N_r = 3, 1, 0, 2 for
 * ranks 0..3 (uneven; rank 2 has none). Every rank computes the reference
 * itself, in double, over the whole batch: the outputs of its samples, the
 * running statistics after two steps, the input gradients of its samples,
 * and the parameter gradients, whose per-rank shares must sum to the
 * reference's. NCHW and NC tensors; float32 to 1e-5, float16 and
 * bfloat16 inputs against the reference of their rounded values. Then
 * ranks with different channel counts, too few values, and every
 * argument error with its message. Last, hvd_ps_sync_batch_norm_*: on
 * the sets of the ranks of each parity (np 4: {0, 2} and {1, 3}), the
 * batch is the set's members' samples alone, the float32 NCHW case; a
 * rank outside a set is refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "hvd.h"
#include "tap/tap.h"

static int rank, size;
/* hvd_ps_sync_batch_norm_*'s set (this rank's parity), or NULL: the world;
 * its ranks' samples make the batch, and comm sums their shares */
static hvd_process_set_t *set;
static MPI_Comm comm = MPI_COMM_WORLD;

static const int per_rank[4] = {3, 1, 0, 2};
#define MAXC 5
#define MAXS 6
#define MAXG 6 /* samples in the global batch at np 4 */

static int n_of(int r) { return per_rank[r % 4]; }
static int first_of(int r) {
  int g = 0;
  for (int q = 0; q < r; q++)
    g += n_of(q);
  return g;
}
static int total(void) { return first_of(size); }
/* Whether sample g of the whole layout is in the batch: its rank's (set
 * mode: a rank of this rank's parity). */
static int in_batch(int g) {
  int r = 0;
  while (g >= first_of(r + 1))
    r++;
  return set == NULL || r % 2 == rank % 2;
}

/* one entry of the batch nudged by bump (the finite-difference check) */
static int bump_g = -1, bump_c, bump_s;
static double bump;

static double x_at(int g, int c, int s) {
  double nudge = g == bump_g && c == bump_c && s == bump_s ? bump : 0;
  return 2 * sin(0.7 * g + 1.3 * c + 0.11 * s) + c + nudge;
}
static double dy_at(int g, int c, int s) {
  return cos(0.5 * g - 0.9 * c + 0.3 * s);
}

/* x rounded as the dtype stores it (the reference sees what hvd sees). */
static uint16_t f16(float f) {
  /* IEEE half, round to nearest even, for the normal range used here */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffff;
  if (e <= 0) /* the values here are never that small but 0 */
    return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)h;
}
static float from_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  uint32_t m = h & 0x3ff, sign = (uint32_t)(h & 0x8000) << 16, u;
  if (e == 0)
    u = sign; /* zero (no subnormals here) */
  else
    u = sign | ((uint32_t)(e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* v as the dtype holds it */
static double stored(hvd_dtype_t t, double v) {
  if (t == HVD_FLOAT64) /* the reference's own check */
    return v;
  if (t == HVD_FLOAT16)
    return from_f16(f16((float)v));
  if (t == HVD_BFLOAT16)
    return from_bf16(bf16((float)v));
  return (float)v;
}

static void store(void *p, hvd_dtype_t t, int i, double v) {
  if (t == HVD_FLOAT16)
    ((uint16_t *)p)[i] = f16((float)v);
  else if (t == HVD_BFLOAT16)
    ((uint16_t *)p)[i] = bf16((float)v);
  else
    ((float *)p)[i] = (float)v;
}

static double load(const void *p, hvd_dtype_t t, int i) {
  if (t == HVD_FLOAT16)
    return from_f16(((const uint16_t *)p)[i]);
  if (t == HVD_BFLOAT16)
    return from_bf16(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

typedef struct ref {
  double mean[MAXC], var[MAXC], rm[MAXC], rv[MAXC];
  double y[MAXG][MAXC][MAXS], dx[MAXG][MAXC][MAXS];
  double dw[MAXC], db[MAXC];
} ref_t;

/* The whole batch's batch norm, in double, two steps of running stats
 * from (0, 1). */
static void reference(hvd_dtype_t t, int C, int S, const double *w,
                      const double *b, double momentum, double eps, ref_t *r) {
  int G = total(), in = 0;
  for (int g = 0; g < G; g++)
    in += in_batch(g);
  for (int c = 0; c < C; c++) {
    double sum = 0, sq = 0;
    for (int g = 0; g < G; g++)
      for (int s = 0; s < S && in_batch(g); s++) {
        double v = stored(t, x_at(g, c, s));
        sum += v;
        sq += v * v;
      }
    double n = (double)in * S, mean = sum / n, var = sq / n - mean * mean;
    double invstd = 1 / sqrt(var + eps);
    r->mean[c] = mean, r->var[c] = var;
    r->rm[c] = 0, r->rv[c] = 1;
    for (int k = 0; k < 2; k++) {
      r->rm[c] = (1 - momentum) * r->rm[c] + momentum * mean;
      r->rv[c] = (1 - momentum) * r->rv[c] + momentum * var * n / (n - 1);
    }
    double sdy = 0, sdyx = 0;
    for (int g = 0; g < G; g++)
      for (int s = 0; s < S && in_batch(g); s++) {
        double xm = stored(t, x_at(g, c, s)) - mean;
        double gy = stored(t, dy_at(g, c, s));
        r->y[g][c][s] = xm * invstd * w[c] + b[c];
        sdy += gy;
        sdyx += gy * xm;
      }
    r->dw[c] = sdyx * invstd;
    r->db[c] = sdy;
    for (int g = 0; g < G; g++)
      for (int s = 0; s < S; s++) {
        double xm = stored(t, x_at(g, c, s)) - mean;
        double gy = stored(t, dy_at(g, c, s));
        r->dx[g][c][s] =
            w[c] * invstd * (gy - sdy / n - xm * invstd * invstd * sdyx / n);
      }
  }
}

static int near(double want, double got, double tol) {
  return fabs(want - got) <= tol * fmax(1.0, fabs(want));
}

/* One case: ndim 4 ([N, C, 2, 3]) or 2 ([N, C]); dtype t; tolerance. */
static void run_case(hvd_dtype_t t, int ndim, double tol) {
  const int C = ndim == 2 ? MAXC : 3, S = ndim == 2 ? 1 : MAXS;
  const int N = n_of(rank), g0 = first_of(rank);
  const double momentum = 0.1, eps = 1e-5;
  double w[MAXC], b[MAXC];
  float wf[MAXC], bf[MAXC], rm[MAXC], rv[MAXC], mean[MAXC], invstd[MAXC];
  float dw[MAXC], db[MAXC];
  for (int c = 0; c < C; c++) {
    w[c] = wf[c] = 1 + 0.25f * c;
    b[c] = bf[c] = 0.1f * c - 0.2f;
    rm[c] = 0, rv[c] = 1;
    dw[c] = 0.5f, db[c] = -0.25f; /* the backward adds to these */
  }
  char what[64];
  snprintf(what, sizeof what, "%s %s%s", hvd_dtype_name(t),
           ndim == 2 ? "[N, C]" : "[N, C, 2, 3]",
           set != NULL ? " on the parity set" : "");
  size_t es = t == HVD_FLOAT32 ? 4 : 2;
  void *x = calloc((size_t)(N * C * S) + 1, es);
  void *y = calloc((size_t)(N * C * S) + 1, es);
  void *dy = calloc((size_t)(N * C * S) + 1, es);
  void *dx = calloc((size_t)(N * C * S) + 1, es);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int s = 0; s < S; s++) {
        store(x, t, (n * C + c) * S + s, x_at(g0 + n, c, s));
        store(dy, t, (n * C + c) * S + s, dy_at(g0 + n, c, s));
      }
  int64_t shape[4] = {N, C, 2, 3};
  hvd_tensor_t tx = hvd_tensor_make(x, t, ndim, shape);
  hvd_tensor_t ty = hvd_tensor_make(y, t, ndim, shape);
  hvd_tensor_t tdy = hvd_tensor_make(dy, t, ndim, shape);
  hvd_tensor_t tdx = hvd_tensor_make(dx, t, ndim, shape);

  int good = 1;
  for (int k = 0; k < 2 && good; k++) {
    hvd_result_t rc =
        set != NULL
            ? hvd_ps_sync_batch_norm_forward(set, "bn", &tx, wf, bf, rm, rv,
                                             momentum, eps, &ty, mean, invstd)
            : hvd_sync_batch_norm_forward("bn", &tx, wf, bf, rm, rv, momentum,
                                          eps, &ty, mean, invstd);
    if (rc != HVD_SUCCESS)
      diag("%s", hvd_last_error());
    good = rc == HVD_SUCCESS;
  }
  ok(good, "%s: two forward steps (this rank: %d samples)", what, N);
  hvd_result_t rc =
      set != NULL ? hvd_ps_sync_batch_norm_backward(set, "bn", &tx, &tdy, wf,
                                                    mean, invstd, &tdx, dw, db)
                  : hvd_sync_batch_norm_backward("bn", &tx, &tdy, wf, mean,
                                                 invstd, &tdx, dw, db);
  if (rc != HVD_SUCCESS)
    diag("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "%s: backward", what);

  static ref_t r;
  reference(t, C, S, w, b, momentum, eps, &r);
  int y_ok = 1, dx_ok = 1, st_ok = 1;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int s = 0; s < S; s++) {
        int i = (n * C + c) * S + s;
        if (!near(r.y[g0 + n][c][s], load(y, t, i), tol)) {
          if (y_ok)
            diag("y[%d][%d][%d] = %.8g, expected %.8g", n, c, s, load(y, t, i),
                 r.y[g0 + n][c][s]);
          y_ok = 0;
        }
        if (!near(r.dx[g0 + n][c][s], load(dx, t, i), tol)) {
          if (dx_ok)
            diag("dx[%d][%d][%d] = %.8g, expected %.8g", n, c, s,
                 load(dx, t, i), r.dx[g0 + n][c][s]);
          dx_ok = 0;
        }
      }
  for (int c = 0; c < C; c++) {
    st_ok &= near(r.mean[c], mean[c], 1e-5) &&
             near(1 / sqrt(r.var[c] + eps), invstd[c], 1e-5) &&
             near(r.rm[c], rm[c], 1e-5) && near(r.rv[c], rv[c], 1e-5);
    if (!st_ok) {
      diag("channel %d: mean %.8g/%.8g running %.8g/%.8g var %.8g/%.8g", c,
           mean[c], r.mean[c], rm[c], r.rm[c], rv[c], r.rv[c]);
      break;
    }
  }
  ok(y_ok, "%s: y of this rank's samples", what);
  ok(st_ok, "%s: batch mean, invstd and running statistics", what);
  ok(dx_ok, "%s: dx of this rank's samples", what);
  /* the shares of dweight and dbias (minus what was there) sum to the
   * whole batch's */
  double share[2 * MAXC], sum[2 * MAXC];
  for (int c = 0; c < C; c++) {
    share[c] = dw[c] - 0.5;
    share[C + c] = db[c] + 0.25;
  }
  MPI_Allreduce(share, sum, 2 * C, MPI_DOUBLE, MPI_SUM, comm);
  int p_ok = 1;
  for (int c = 0; c < C; c++)
    p_ok &=
        near(r.dw[c], sum[c], tol * 4) && near(r.db[c], sum[C + c], tol * 4);
  ok(p_ok, "%s: dweight and dbias added, the ranks' shares sum to the batch's",
     what);
  free(x), free(y), free(dy), free(dx);
}

/* The reference's dx is d(sum dy * y)/dx: central differences of its
 * own forward, in double, for every entry of the batch. */
static void test_reference(void) {
  const int C = 3, S = MAXS, G = total();
  double w[3] = {1, 1.25, 1.5}, b[3] = {-0.2, -0.1, 0};
  static ref_t r, rp, rm;
  reference(HVD_FLOAT64, C, S, w, b, 0.1, 1e-5, &r);
  double worst = 0;
  for (int g = 0; g < G; g++)
    for (int c = 0; c < C; c++)
      for (int s = 0; s < S; s++) {
        const double h = 1e-5;
        bump_g = g, bump_c = c, bump_s = s;
        bump = h;
        reference(HVD_FLOAT64, C, S, w, b, 0.1, 1e-5, &rp);
        bump = -h;
        reference(HVD_FLOAT64, C, S, w, b, 0.1, 1e-5, &rm);
        double lp = 0, lm = 0;
        for (int q = 0; q < G; q++)
          for (int k = 0; k < C * S; k++) {
            lp += dy_at(q, k / S, k % S) * rp.y[q][k / S][k % S];
            lm += dy_at(q, k / S, k % S) * rm.y[q][k / S][k % S];
          }
        worst = fmax(worst, fabs((lp - lm) / (2 * h) - r.dx[g][c][s]));
      }
  bump_g = -1;
  ok(worst < 1e-6,
     "the reference's dx is the derivative of its forward (worst %.1e)", worst);
}

/* y = x and dx = dy in place, float32 NCHW: the same numbers */
static void test_in_place(void) {
  const int C = 3, S = MAXS, N = n_of(rank), g0 = first_of(rank);
  float x[MAXG * 3 * MAXS], y[MAXG * 3 * MAXS], dy[MAXG * 3 * MAXS],
      dx[MAXG * 3 * MAXS], m1[3], s1[3], m2[3], s2[3];
  for (int i = 0; i < N * C * S; i++) {
    int n = i / (C * S), c = i / S % C, s = i % S;
    x[i] = (float)x_at(g0 + n, c, s);
    dy[i] = (float)dy_at(g0 + n, c, s);
  }
  int64_t shape[4] = {N, C, 2, 3};
  hvd_tensor_t tx = hvd_tensor_make(x, HVD_FLOAT32, 4, shape);
  hvd_tensor_t ty = hvd_tensor_make(y, HVD_FLOAT32, 4, shape);
  hvd_tensor_t tdy = hvd_tensor_make(dy, HVD_FLOAT32, 4, shape);
  hvd_tensor_t tdx = hvd_tensor_make(dx, HVD_FLOAT32, 4, shape);
  int good = hvd_sync_batch_norm_forward("ip", &tx, NULL, NULL, NULL, NULL, 0.1,
                                         1e-5, &ty, m1, s1) == HVD_SUCCESS &&
             hvd_sync_batch_norm_backward("ip", &tx, &tdy, NULL, m1, s1, &tdx,
                                          NULL, NULL) == HVD_SUCCESS;
  /* in place: x becomes y, dy becomes dx (the backward reads x, so the
   * in-place backward uses a copy of the original x) */
  float x0[MAXG * 3 * MAXS];
  memcpy(x0, x, sizeof x0);
  hvd_tensor_t tx0 = hvd_tensor_make(x0, HVD_FLOAT32, 4, shape);
  good = good &&
         hvd_sync_batch_norm_forward("ip", &tx, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &tx, m2, s2) == HVD_SUCCESS &&
         hvd_sync_batch_norm_backward("ip", &tx0, &tdy, NULL, m2, s2, &tdy,
                                      NULL, NULL) == HVD_SUCCESS;
  ok(good, "in place: forward and backward run");
  ok(memcmp(x, y, sizeof(float) * (size_t)(N * C * S)) == 0 &&
         memcmp(dy, dx, sizeof(float) * (size_t)(N * C * S)) == 0,
     "in place, no affine, no running stats: the same numbers");
}

static void test_errors(void) {
  float x[12] = {0}, m[4], s[4], rm[4] = {0}, rv[4] = {1, 1, 1, 1};
  int64_t sh[2] = {3, 4}, other[2] = {3, 2}, one[1] = {12};
  hvd_tensor_t tx = hvd_tensor_make(x, HVD_FLOAT32, 2, sh);
  hvd_tensor_t ty = hvd_tensor_make(x, HVD_FLOAT32, 2, sh);
  hvd_tensor_t bad_y = hvd_tensor_make(x, HVD_FLOAT32, 2, other);
  hvd_tensor_t ints = hvd_tensor_make(x, HVD_INT32, 2, sh);
  hvd_tensor_t flat = hvd_tensor_make(x, HVD_FLOAT32, 1, one);
  static const char F[] = "hvd_sync_batch_norm_forward";
  struct {
    const char *what;
    hvd_result_t rc;
    const char *msg;
  } want[] = {
      {"NULL name", HVD_ERR_INVALID_ARG, "%s: the name is NULL"},
      {"y NULL", HVD_ERR_INVALID_ARG, "%s 'e': y is NULL"},
      {"int32 x", HVD_ERR_INVALID_ARG,
       "%s 'e': x is int32; float32, float16 or bfloat16"},
      {"1-d x", HVD_ERR_INVALID_ARG,
       "%s 'e': x has 1 dimensions; [N, C] or [N, C, ...] (NCHW)"},
      {"y of another shape", HVD_ERR_INVALID_ARG,
       "%s 'e': y is float32 [3, 2] but x is float32 [3, 4]"},
      {"momentum 2", HVD_ERR_INVALID_ARG,
       "%s 'e': momentum 2 is outside [0, 1]"},
      {"eps 0", HVD_ERR_INVALID_ARG, "%s 'e': eps 0 is not a positive number"},
      {"one running buffer", HVD_ERR_INVALID_ARG,
       "%s 'e': running_mean and running_var go together (one is NULL)"},
  };
  hvd_result_t got[8];
  char msgs[8][256];
#define TRY(k, call)                                                           \
  got[k] = (call);                                                             \
  snprintf(msgs[k], sizeof msgs[k], "%s", hvd_last_error())
  TRY(0, hvd_sync_batch_norm_forward(NULL, &tx, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &ty, m, s));
  TRY(1, hvd_sync_batch_norm_forward("e", &tx, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, NULL, m, s));
  TRY(2, hvd_sync_batch_norm_forward("e", &ints, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &ty, m, s));
  TRY(3, hvd_sync_batch_norm_forward("e", &flat, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &ty, m, s));
  TRY(4, hvd_sync_batch_norm_forward("e", &tx, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &bad_y, m, s));
  TRY(5, hvd_sync_batch_norm_forward("e", &tx, NULL, NULL, rm, rv, 2, 1e-5, &ty,
                                     m, s));
  TRY(6, hvd_sync_batch_norm_forward("e", &tx, NULL, NULL, rm, rv, 0.1, 0, &ty,
                                     m, s));
  TRY(7, hvd_sync_batch_norm_forward("e", &tx, NULL, NULL, rm, NULL, 0.1, 1e-5,
                                     &ty, m, s));
  for (int k = 0; k < 8; k++) {
    char w[256];
    snprintf(w, sizeof w, want[k].msg, F);
    is_int(want[k].rc, got[k], "forward, %s: code", want[k].what);
    is_string(w, msgs[k], "forward, %s: message", want[k].what);
  }
  is_int(HVD_ERR_INVALID_ARG,
         hvd_sync_batch_norm_backward("e", &tx, &tx, NULL, NULL, s, &ty, NULL,
                                      NULL),
         "backward without save_mean: code");
  is_string("hvd_sync_batch_norm_backward 'e': save_mean and save_invstd "
            "(from the forward) are needed",
            hvd_last_error(), "backward without save_mean: message");
  is_int(HVD_ERR_INVALID_ARG,
         hvd_sync_batch_norm_backward("e", &tx, &bad_y, NULL, m, s, NULL, NULL,
                                      NULL),
         "backward, dy of another shape: code");
  is_string("hvd_sync_batch_norm_backward 'e': dy is float32 [3, 2] but x is "
            "float32 [3, 4]",
            hvd_last_error(), "backward, dy of another shape: message");

  /* one value per channel over all ranks: rank 0 has one sample, the
   * others none; every rank gets the error */
  int64_t ns[2] = {rank == 0 ? 1 : 0, 4};
  hvd_tensor_t t1 = hvd_tensor_make(x, HVD_FLOAT32, 2, ns);
  hvd_result_t rc = hvd_sync_batch_norm_forward("one", &t1, NULL, NULL, rm, rv,
                                                0.1, 1e-5, &t1, m, s);
  is_int(HVD_ERR_INVALID_ARG, rc, "1 value per channel: code, on every rank");
  is_string("hvd_sync_batch_norm_forward 'one': 1 value per channel over all "
            "ranks; batch norm needs more than 1",
            hvd_last_error(), "1 value per channel: message");
  ok(rm[0] == 0 && rv[0] == 1, "1 value per channel: running stats untouched");

  /* rank 0 has 4 channels, the others 2 */
  if (size > 1) {
    int64_t cs[2] = {2, rank == 0 ? 4 : 2};
    hvd_tensor_t tc = hvd_tensor_make(x, HVD_FLOAT32, 2, cs);
    rc = hvd_sync_batch_norm_forward("chan", &tc, NULL, NULL, NULL, NULL, 0.1,
                                     1e-5, &tc, m, s);
    is_int(HVD_ERR_MISMATCH, rc, "different channel counts: HVD_ERR_MISMATCH");
    char w[512];
    size_t at = (size_t)snprintf(
        w, sizeof w,
        "hvd_sync_batch_norm_forward 'chan': ranks disagree (the shape is [3, "
        "channels]): allreduce 'hvd.sync_bn.chan.stats': rank 0 shape [3, 4] "
        "vs");
    for (int r = 1; r < size; r++)
      at += (size_t)snprintf(w + at, sizeof w - at, "%s rank %d shape [3, 2]",
                             r > 1 ? "," : "", r);
    is_string(w, hvd_last_error(), "different channel counts: message");
  }
}

/* On the parity sets: each set's batch is its ranks' samples; the
 * parameter shares sum over the set. A rank outside a set of rank 0
 * alone is refused. */
static void test_sets(void) {
  hvd_process_set_t *only0 = NULL;
  int zero = 0;
  if (hvd_process_set_split(rank % 2, &set) != HVD_SUCCESS ||
      hvd_process_set_create(&zero, 1, &only0) != HVD_SUCCESS)
    bail("sets: %s", hvd_last_error());
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &comm);
  run_case(HVD_FLOAT32, 4, 1e-5);
  MPI_Comm_free(&comm);
  comm = MPI_COMM_WORLD;
  hvd_process_set_destroy(set);
  set = NULL;
  float x[12] = {0}, m[2], s[2];
  int64_t sh[2] = {6, 2};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 2, sh);
  char want[128];
  snprintf(want, sizeof want,
           "hvd_ps_sync_batch_norm_forward: rank %d is not in process set %d",
           rank, hvd_process_set_id(only0));
  hvd_result_t rc = hvd_ps_sync_batch_norm_forward(
      only0, "x", &t, NULL, NULL, NULL, NULL, 0.1, 1e-5, &t, m, s);
  is_int(rank == 0 ? HVD_SUCCESS : HVD_ERR_INVALID_ARG, rc,
         "sets: only members take part");
  is_string(rank == 0 ? "" : want, rank == 0 ? "" : hvd_last_error(),
            "sets: a rank outside, the message");
  hvd_process_set_destroy(only0);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 4)
    bail("the batch is laid out for 1 to 4 ranks, not %d", size);
  float x[4] = {0}, m[2], s[2];
  int64_t sh[2] = {2, 2};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 2, sh);
  is_int(HVD_ERR_NOT_INITIALIZED,
         hvd_sync_batch_norm_forward("x", &t, NULL, NULL, NULL, NULL, 0.1, 1e-5,
                                     &t, m, s),
         "before hvd_init: not initialized");
  is_string("hvd_sync_batch_norm_forward: hvd_init() has not been called",
            hvd_last_error(), "before hvd_init: message");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_reference();
  run_case(HVD_FLOAT32, 4, 1e-5);
  run_case(HVD_FLOAT32, 2, 1e-5);
  run_case(HVD_FLOAT16, 4, 4e-3);
  run_case(HVD_BFLOAT16, 4, 3e-2);
  test_in_place();
  test_errors();
  test_sets();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
