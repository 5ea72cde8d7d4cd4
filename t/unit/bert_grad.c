/*
 * bert_grad.c - the BERT example's backward passes against finite
 * differences, layer by layer (examples/bert/layers.h: LayerNorm,
 * embeddings + LayerNorm, self-attention with a padding mask, FFN with
 * GELU, the MLM head with its decoder tied to the word embeddings) and for
 * the whole model (examples/bert/model.h); the gradient-ready callback;
 * accumulation; parameters and initialisation; a loss that falls under
 * plain SGD.
 *
 * How exact the comparison is. Every forward pass runs in float32 (the
 * objective is summed in double). The numerical derivative of a
 * coordinate is the central difference D(h) = (f(x+h) - f(x-h)) / 2h,
 * Richardson-extrapolated: (4 D(h/2) - D(h)) / 3, with h = 4e-2 (inputs
 * and weights are of order 0.3..1 here).
 *  - Truncation: D(h) alone is off by h^2 f'''/6, which reached 4e-2
 *    relative on coordinates where many paths meet (token-type
 *    embeddings, at h = 1e-2); the extrapolation cancels the h^2 term and
 *    leaves O(h^4): below 1e-3 in practice. Every function here is smooth
 *    (GELU, softmax, LayerNorm; no ReLU kinks), so this holds everywhere.
 *  - Rounding: the objective carries float32 noise of a few ulps (about
 *    2e-7 absolute on a loss of 3), divided by the step: ~1e-5 absolute
 *    on the derivative, whatever its size.
 * Hence the error of a coordinate is
 *   |analytic - numeric| / max(|analytic|, |numeric|, 1e-2 max|analytic|,
 *                              2e-3)
 * (max|analytic| over the tensor): relative where the gradient rises
 * above the noise, absolute (to 4e-5) where it does not. It must stay
 * below 2e-2 on every coordinate checked (all of a small tensor, a random
 * subset of a large one). Over 40 seeds of the test data
 * (BERT_GRAD_SEED=n) the worst seen is about 1e-2; a wrong backward (a
 * missing term, a transposed product, a lost accumulation) is off by O(1).
 * The model is checked with weights ~ normal(0, 0.3): at BERT's 0.02 the
 * attention is almost uniform and the query/key gradients sink into the
 * float32 noise (that initialisation is exercised by the SGD test).
 * The key bias has a zero gradient (softmax ignores a shift common to all
 * keys), so its differences are pure noise: they use h = 0.5, which no
 * truncation error can spoil.
 */
#include "data.h"
#include "layers.h"
#include "model.h"
#include "tap.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-2
#define ABS_FLOOR 2e-3
#define KEY_BIAS_H 0.5
#define FD_H 4e-2

static bert_rng_t rng;

static float *randn(int64_t n, double std) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (p == NULL)
    bail("out of memory");
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(std * bert__rng_normal(&rng));
  return p;
}

static float *zeros(int64_t n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  if (p == NULL)
    bail("out of memory");
  return p;
}

static double dot(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

typedef double (*objective_fn)(void *ctx);

/* (f(x + h) - f(x - h)) / 2h for the coordinate *xi, with the steps
 * actually taken in float. */
static double central(objective_fn f, void *ctx, float *xi, double h) {
  float keep = *xi;
  *xi = (float)(keep + h);
  double hp = (double)*xi - keep;
  double fp = f(ctx);
  *xi = (float)(keep - h);
  double hm = keep - (double)*xi;
  double fm = f(ctx);
  *xi = keep;
  return (fp - fm) / (hp + hm);
}

/* Compares ga (the analytic gradient of f with respect to x[0..n)) with
 * central differences on k coordinates (all of them when n <= k), chosen
 * at random. Returns the largest error (see the top of the file). */
static double fd_check(objective_fn f, void *ctx, float *x, const float *ga,
                       int64_t n, int k, double h) {
  double gmax = 0;
  for (int64_t i = 0; i < n; i++)
    gmax = fmax(gmax, fabs(ga[i]));
  double floor_ = fmax(1e-2 * gmax, ABS_FLOOR), worst = 0;
  int all = n <= k;
  for (int j = 0; j < (all ? n : k); j++) {
    int64_t i = all ? j : (int64_t)bert__rng_below(&rng, (uint64_t)n);
    double d1 = central(f, ctx, x + i, h), d2 = central(f, ctx, x + i, h / 2);
    double num = (4 * d2 - d1) / 3; /* Richardson: the h^2 terms cancel */
    double err = fabs(ga[i] - num) / fmax(fmax(fabs(ga[i]), fabs(num)), floor_);
    if (err > worst) {
      worst = err;
      tap_note("worst coordinate %lld: analytic %.6g numeric %.6g",
               (long long)i, ga[i], num);
    }
  }
  return worst;
}

/* ok() for one tensor's check, with the worst error in the name. */
static void check(const char *what, objective_fn f, void *ctx, float *x,
                  const float *ga, int64_t n, int k, double h) {
  double e = fd_check(f, ctx, x, ga, n, k, h);
  ok(e < TOL, "%s: max relative error %.2e < %.0e", what, e, TOL);
}

/* ---- LayerNorm ------------------------------------------------------------
 */

enum { LN_N = 6, LN_H = 16 };
typedef struct ln_case {
  float *x, *g, *b, *r, *y, mean[LN_N], rstd[LN_N];
} ln_case_t;

static double ln_objective(void *p) {
  ln_case_t *c = p;
  bert_layernorm_fwd(c->x, c->g, c->b, 1e-12f, c->y, c->mean, c->rstd, LN_N,
                     LN_H);
  return dot(c->y, c->r, LN_N * LN_H);
}

static void test_layernorm(void) {
  ln_case_t c;
  const int n = LN_N * LN_H;
  c.x = randn(n, 1.0);
  for (int i = 0; i < n; i++)
    c.x[i] += (float)(i / LN_H); /* rows with different means */
  c.g = randn(LN_H, 0.2);
  for (int j = 0; j < LN_H; j++)
    c.g[j] += 1.0f;
  c.b = randn(LN_H, 0.2);
  c.r = randn(n, 1.0);
  c.y = zeros(n);
  float *dx = zeros(n), *dg = zeros(LN_H), *db = zeros(LN_H);
  ln_objective(&c);
  bert_layernorm_bwd(c.x, c.mean, c.rstd, c.g, c.r, dx, dg, db, LN_N, LN_H);
  check("layernorm dx", ln_objective, &c, c.x, dx, n, n, FD_H);
  check("layernorm dweight", ln_objective, &c, c.g, dg, LN_H, LN_H, FD_H);
  check("layernorm dbias", ln_objective, &c, c.b, db, LN_H, LN_H, FD_H);
  /* the output rows are normalised: mean 0, variance 1 before g, b */
  ln_objective(&c);
  double s = 0, ss = 0;
  for (int j = 0; j < LN_H; j++) {
    double z = (c.y[j] - c.b[j]) / c.g[j];
    s += z, ss += z * z;
  }
  ok(fabs(s / LN_H) < 1e-5 && fabs(ss / LN_H - 1) < 1e-4,
     "layernorm: row 0 normalised (mean %.1e, variance %.6f)", s / LN_H,
     ss / LN_H);
  free(c.x), free(c.g), free(c.b), free(c.r), free(c.y);
  free(dx), free(dg), free(db);
}

/* ---- Embeddings + LayerNorm -------------------------------------------------
 */

enum { E_B = 2, E_S = 5, E_H = 16, E_V = 11, E_P = 8, E_T = 2 };
typedef struct emb_case {
  int32_t ids[E_B * E_S], types[E_B * E_S];
  float *word, *pos, *type, *g, *b, *r, *pre, *y, mean[E_B * E_S],
      rstd[E_B * E_S];
} emb_case_t;

static double emb_objective(void *p) {
  emb_case_t *c = p;
  bert_embedding_fwd(c->ids, c->types, c->word, c->pos, c->type, c->pre, E_B,
                     E_S, E_H);
  bert_layernorm_fwd(c->pre, c->g, c->b, 1e-12f, c->y, c->mean, c->rstd,
                     E_B * E_S, E_H);
  return dot(c->y, c->r, E_B * E_S * E_H);
}

static void test_embeddings(void) {
  emb_case_t c;
  const int N = E_B * E_S;
  for (int i = 0; i < N; i++) {
    c.ids[i] = (int32_t)bert__rng_below(&rng, E_V);
    c.types[i] = (int32_t)bert__rng_below(&rng, E_T);
  }
  c.ids[1] = c.ids[7]; /* a repeated id accumulates twice */
  c.word = randn(E_V * E_H, 0.5);
  c.pos = randn(E_P * E_H, 0.5);
  c.type = randn(E_T * E_H, 0.5);
  c.g = randn(E_H, 0.2);
  for (int j = 0; j < E_H; j++)
    c.g[j] += 1.0f;
  c.b = randn(E_H, 0.2);
  c.r = randn(N * E_H, 1.0);
  c.pre = zeros(N * E_H);
  c.y = zeros(N * E_H);
  float *dpre = zeros(N * E_H), *dword = zeros(E_V * E_H),
        *dpos = zeros(E_P * E_H), *dtype = zeros(E_T * E_H), *dg = zeros(E_H),
        *db = zeros(E_H);
  emb_objective(&c);
  bert_layernorm_bwd(c.pre, c.mean, c.rstd, c.g, c.r, dpre, dg, db, N, E_H);
  bert_embedding_bwd(c.ids, c.types, dpre, dword, dpos, dtype, E_B, E_S, E_H);
  check("embeddings+LN dword", emb_objective, &c, c.word, dword, E_V * E_H, 64,
        FD_H);
  check("embeddings+LN dposition", emb_objective, &c, c.pos, dpos, E_P * E_H,
        64, FD_H);
  check("embeddings+LN dtype", emb_objective, &c, c.type, dtype, E_T * E_H, 32,
        FD_H);
  check("embeddings+LN dLN.weight", emb_objective, &c, c.g, dg, E_H, E_H, FD_H);
  check("embeddings+LN dLN.bias", emb_objective, &c, c.b, db, E_H, E_H, FD_H);
  free(c.word), free(c.pos), free(c.type), free(c.g), free(c.b), free(c.r);
  free(c.pre), free(c.y), free(dpre), free(dword), free(dpos), free(dtype);
  free(dg), free(db);
}

/* ---- Self-attention (q, k, v, attention, output dense) with padding ---------
 */

enum { A_B = 2, A_S = 6, A_A = 2, A_DH = 4, A_H = A_A * A_DH };
typedef struct attn_case {
  int32_t lengths[A_B];
  float *x, *w[4], *bias[4], *r, *q, *k, *v, *probs, *ctx, *out;
} attn_case_t;

static double attn_objective(void *p) {
  attn_case_t *c = p;
  const int N = A_B * A_S;
  bert_linear_fwd(c->x, c->w[0], c->bias[0], c->q, N, A_H, A_H);
  bert_linear_fwd(c->x, c->w[1], c->bias[1], c->k, N, A_H, A_H);
  bert_linear_fwd(c->x, c->w[2], c->bias[2], c->v, N, A_H, A_H);
  bert_attention_fwd(c->q, c->k, c->v, c->lengths, c->probs, c->ctx, A_B, A_S,
                     A_A, A_DH);
  bert_linear_fwd(c->ctx, c->w[3], c->bias[3], c->out, N, A_H, A_H);
  return dot(c->out, c->r, N * A_H);
}

/* Analytic gradients of attn_objective: dx, dw[4], dbias[4]. */
static void attn_backward(attn_case_t *c, float *dx, float **dw,
                          float **dbias) {
  const int N = A_B * A_S, NH = N * A_H;
  float *dctx = zeros(NH), *dq = zeros(NH), *dk = zeros(NH), *dv = zeros(NH),
        *scratch = zeros(A_S * A_S);
  attn_objective(c);
  bert_linear_bwd(c->ctx, c->w[3], c->r, dctx, 0.0f, dw[3], dbias[3], N, A_H,
                  A_H);
  bert_attention_bwd(c->q, c->k, c->v, c->probs, dctx, dq, dk, dv, scratch, A_B,
                     A_S, A_A, A_DH);
  bert_linear_bwd(c->x, c->w[0], dq, dx, 0.0f, dw[0], dbias[0], N, A_H, A_H);
  bert_linear_bwd(c->x, c->w[1], dk, dx, 1.0f, dw[1], dbias[1], N, A_H, A_H);
  bert_linear_bwd(c->x, c->w[2], dv, dx, 1.0f, dw[2], dbias[2], N, A_H, A_H);
  free(dctx), free(dq), free(dk), free(dv), free(scratch);
}

static void test_attention(void) {
  attn_case_t c;
  const int N = A_B * A_S, NH = N * A_H;
  c.lengths[0] = A_S;
  c.lengths[1] = 3; /* positions 3..5 of row 1 are padding */
  c.x = randn(NH, 1.0);
  for (int i = 0; i < 4; i++) {
    c.w[i] = randn(A_H * A_H, 0.4); /* scores of order 1: a real softmax */
    c.bias[i] = randn(A_H, 0.1);
  }
  c.r = randn(NH, 1.0);
  c.q = zeros(NH), c.k = zeros(NH), c.v = zeros(NH), c.ctx = zeros(NH);
  c.out = zeros(NH);
  c.probs = zeros(A_B * A_A * A_S * A_S);
  float *dx = zeros(NH), *dw[4], *dbias[4];
  for (int i = 0; i < 4; i++)
    dw[i] = zeros(A_H * A_H), dbias[i] = zeros(A_H);
  attn_backward(&c, dx, dw, dbias);
  static const char *const names[4] = {"query", "key", "value", "output"};
  check("attention dx", attn_objective, &c, c.x, dx, NH, 64, FD_H);
  for (int i = 0; i < 4; i++) {
    char what[64];
    snprintf(what, sizeof what, "attention d%s.weight", names[i]);
    check(what, attn_objective, &c, c.w[i], dw[i], A_H * A_H, 24, FD_H);
    snprintf(what, sizeof what, "attention d%s.bias", names[i]);
    check(what, attn_objective, &c, c.bias[i], dbias[i], A_H, A_H,
          i == 1 ? KEY_BIAS_H : FD_H);
  }

  /* padding: a padded key gets probability exactly 0, so changing a padded
   * token leaves every real token's output bit for bit unchanged ... */
  attn_objective(&c);
  int zero = 1;
  for (int h = 0; h < A_A; h++)
    for (int i = 0; i < A_S; i++)
      for (int j = c.lengths[1]; j < A_S; j++)
        zero &= c.probs[((1 * A_A + h) * A_S + i) * A_S + j] == 0.0f;
  ok(zero, "attention: padded keys have probability 0");
  float *before = zeros(NH);
  memcpy(before, c.out, sizeof(float) * NH);
  for (int j = 0; j < A_H; j++)
    c.x[(1 * A_S + 4) * A_H + j] += 3.0f;
  attn_objective(&c);
  ok(memcmp(before + A_S * A_H, c.out + A_S * A_H,
            sizeof(float) * c.lengths[1] * A_H) == 0,
     "attention: a padded token does not change the real tokens' outputs");
  /* ... and a loss on the real tokens sends no gradient to padding */
  for (int s = c.lengths[1]; s < A_S; s++)
    for (int j = 0; j < A_H; j++)
      c.r[(1 * A_S + s) * A_H + j] = 0.0f;
  for (int i = 0; i < 4; i++)
    memset(dw[i], 0, sizeof(float) * A_H * A_H),
        memset(dbias[i], 0, sizeof(float) * A_H);
  attn_backward(&c, dx, dw, dbias);
  zero = 1;
  for (int s = c.lengths[1]; s < A_S; s++)
    for (int j = 0; j < A_H; j++)
      zero &= dx[(1 * A_S + s) * A_H + j] == 0.0f;
  ok(zero, "attention: no gradient reaches padded tokens");
  double kb = 0, kw = 0;
  for (int j = 0; j < A_H; j++)
    kb = fmax(kb, fabs(dbias[1][j]));
  for (int j = 0; j < A_H * A_H; j++)
    kw = fmax(kw, fabs(dw[1][j]));
  ok(kb < 1e-5 * kw,
     "attention: dkey.bias = 0 (softmax ignores a shift "
     "common to all keys): %.1e against dkey.weight %.1e",
     kb, kw);
  free(before);
  free(c.x), free(c.r), free(c.q), free(c.k), free(c.v), free(c.ctx);
  free(c.out), free(c.probs), free(dx);
  for (int i = 0; i < 4; i++)
    free(c.w[i]), free(c.bias[i]), free(dw[i]), free(dbias[i]);
}

/* ---- FFN: dense, GELU, dense ----------------------------------------------
 */

enum { F_N = 6, F_H = 8, F_F = 16 };
typedef struct ffn_case {
  float *x, *w1, *b1, *w2, *b2, *r, *pre, *act, *out;
} ffn_case_t;

static double ffn_objective(void *p) {
  ffn_case_t *c = p;
  bert_linear_fwd(c->x, c->w1, c->b1, c->pre, F_N, F_H, F_F);
  bert_gelu_fwd(c->pre, c->act, F_N * F_F);
  bert_linear_fwd(c->act, c->w2, c->b2, c->out, F_N, F_F, F_H);
  return dot(c->out, c->r, F_N * F_H);
}

static void test_ffn(void) {
  ffn_case_t c;
  c.x = randn(F_N * F_H, 1.0);
  c.w1 = randn(F_F * F_H, 0.5); /* pre-activations across GELU's bend */
  c.b1 = randn(F_F, 0.3);
  c.w2 = randn(F_H * F_F, 0.5);
  c.b2 = randn(F_H, 0.3);
  c.r = randn(F_N * F_H, 1.0);
  c.pre = zeros(F_N * F_F), c.act = zeros(F_N * F_F);
  c.out = zeros(F_N * F_H);
  float *dx = zeros(F_N * F_H), *dact = zeros(F_N * F_F),
        *dw1 = zeros(F_F * F_H), *db1 = zeros(F_F), *dw2 = zeros(F_H * F_F),
        *db2 = zeros(F_H);
  ffn_objective(&c);
  bert_linear_bwd(c.act, c.w2, c.r, dact, 0.0f, dw2, db2, F_N, F_F, F_H);
  bert_gelu_bwd(c.pre, dact, dact, F_N * F_F);
  bert_linear_bwd(c.x, c.w1, dact, dx, 0.0f, dw1, db1, F_N, F_H, F_F);
  check("FFN dx", ffn_objective, &c, c.x, dx, F_N * F_H, 48, FD_H);
  check("FFN dintermediate.weight", ffn_objective, &c, c.w1, dw1, F_F * F_H, 48,
        FD_H);
  check("FFN dintermediate.bias", ffn_objective, &c, c.b1, db1, F_F, F_F, FD_H);
  check("FFN doutput.weight", ffn_objective, &c, c.w2, dw2, F_H * F_F, 48,
        FD_H);
  check("FFN doutput.bias", ffn_objective, &c, c.b2, db2, F_H, F_H, FD_H);
  /* GELU, erf form, at known points */
  float gx[3] = {-1.0f, 0.0f, 2.0f}, gy[3];
  bert_gelu_fwd(gx, gy, 3);
  ok(fabs(gy[0] - -0.15865525f) < 1e-6 && gy[1] == 0.0f &&
         fabs(gy[2] - 1.95449974f) < 1e-6,
     "GELU(-1, 0, 2) = (%.8f, %.8f, %.8f), the erf form", gy[0], gy[1], gy[2]);
  free(c.x), free(c.w1), free(c.b1), free(c.w2), free(c.b2), free(c.r);
  free(c.pre), free(c.act), free(c.out);
  free(dx), free(dact), free(dw1), free(db1), free(dw2), free(db2);
}

/* ---- MLM head, decoder tied to the word embeddings --------------------------
 */

/* The head's input is the word embeddings of ids (no encoder), so the
 * table is used twice, as in the model: once looked up, once as the
 * decoder. Both shares must add into the one gradient. */
enum { M_N = 7, M_M = 4, M_H = 8, M_V = 13 };
typedef struct head_case {
  int32_t ids[M_N], rows[M_M], targets[M_M];
  float *word, *tw, *tb, *g, *b, *dec_b;
  float *h, *hm, *pre, *act, *t, *logits, mean[M_M], rstd[M_M];
} head_case_t;

static double head_objective(void *p) {
  head_case_t *c = p;
  for (int i = 0; i < M_N; i++)
    for (int j = 0; j < M_H; j++)
      c->h[i * M_H + j] = c->word[c->ids[i] * M_H + j];
  bert_gather_rows(c->h, c->rows, M_M, M_H, c->hm);
  bert_linear_fwd(c->hm, c->tw, c->tb, c->pre, M_M, M_H, M_H);
  bert_gelu_fwd(c->pre, c->act, M_M * M_H);
  bert_layernorm_fwd(c->act, c->g, c->b, 1e-12f, c->t, c->mean, c->rstd, M_M,
                     M_H);
  bert_linear_fwd(c->t, c->word, c->dec_b, c->logits, M_M, M_H, M_V);
  return bert_xent_fwd(c->logits, c->targets, M_M, M_V, NULL) / M_M;
}

static void test_head(void) {
  head_case_t c;
  for (int i = 0; i < M_N; i++)
    c.ids[i] = (int32_t)bert__rng_below(&rng, M_V);
  for (int i = 0; i < M_M; i++) {
    c.rows[i] = 2 * i;
    c.targets[i] = (int32_t)bert__rng_below(&rng, M_V);
  }
  c.targets[0] = c.ids[c.rows[0]]; /* a target that is also an input */
  c.word = randn(M_V * M_H, 0.5);
  c.tw = randn(M_H * M_H, 0.5);
  c.tb = randn(M_H, 0.2);
  c.g = randn(M_H, 0.2);
  for (int j = 0; j < M_H; j++)
    c.g[j] += 1.0f;
  c.b = randn(M_H, 0.2);
  c.dec_b = randn(M_V, 0.2);
  c.h = zeros(M_N * M_H), c.hm = zeros(M_M * M_H), c.pre = zeros(M_M * M_H);
  c.act = zeros(M_M * M_H), c.t = zeros(M_M * M_H);
  c.logits = zeros(M_M * M_V);
  float *dword = zeros(M_V * M_H), *dtw = zeros(M_H * M_H), *dtb = zeros(M_H),
        *dg = zeros(M_H), *db = zeros(M_H), *ddec = zeros(M_V),
        *dt = zeros(M_M * M_H), *dact = zeros(M_M * M_H),
        *dhm = zeros(M_M * M_H), *dh = zeros(M_N * M_H);
  double loss = head_objective(&c);
  ok(loss > 0 && loss < 10,
     "MLM head: loss %.4f is a plausible mean "
     "cross-entropy",
     loss);
  bert_xent_bwd(c.logits, c.targets, M_M, M_V, 1.0f / M_M);
  bert_linear_bwd(c.t, c.word, c.logits, dt, 0.0f, dword, ddec, M_M, M_H, M_V);
  bert_layernorm_bwd(c.act, c.mean, c.rstd, c.g, dt, dact, dg, db, M_M, M_H);
  bert_gelu_bwd(c.pre, dact, dact, M_M * M_H);
  bert_linear_bwd(c.hm, c.tw, dact, dhm, 0.0f, dtw, dtb, M_M, M_H, M_H);
  bert_scatter_add_rows(dhm, c.rows, M_M, M_H, dh);
  bert_embedding_bwd(c.ids, NULL, dh, dword, NULL, NULL, 1, M_N, M_H);
  check("MLM head dword (tied: decoder + lookup)", head_objective, &c, c.word,
        dword, M_V * M_H, 64, FD_H);
  check("MLM head dtransform.dense.weight", head_objective, &c, c.tw, dtw,
        M_H * M_H, 32, FD_H);
  check("MLM head dtransform.dense.bias", head_objective, &c, c.tb, dtb, M_H,
        M_H, FD_H);
  check("MLM head dtransform.LayerNorm.weight", head_objective, &c, c.g, dg,
        M_H, M_H, FD_H);
  check("MLM head dtransform.LayerNorm.bias", head_objective, &c, c.b, db, M_H,
        M_H, FD_H);
  check("MLM head dpredictions.bias", head_objective, &c, c.dec_b, ddec, M_V,
        M_V, FD_H);
  free(c.word), free(c.tw), free(c.tb), free(c.g), free(c.b), free(c.dec_b);
  free(c.h), free(c.hm), free(c.pre), free(c.act), free(c.t), free(c.logits);
  free(dword), free(dtw), free(dtb), free(dg), free(db), free(ddec), free(dt);
  free(dact), free(dhm), free(dh);
}

/* ---- The whole model
 * --------------------------------------------------------- */

enum { T_B = 3, T_S = 8 };
typedef struct model_case {
  bert_model_t *m;
  bert_batch_t batch;
  int32_t ids[T_B * T_S], types[T_B * T_S], labels[T_B * T_S], lengths[T_B];
} model_case_t;

static double model_objective(void *p) {
  model_case_t *c = p;
  bert_output_t o;
  if (bert_model_forward(c->m, &c->batch, &o) != HVD_SUCCESS)
    bail("forward: %s", bert_last_error());
  return o.loss;
}

static void small_config(bert_config_t *cfg) {
  bert_config_preset(cfg, "tiny");
  cfg->layers = 2, cfg->hidden = 16, cfg->heads = 2, cfg->ffn = 32;
  cfg->vocab_size = 23, cfg->max_position = 10, cfg->seq_len = T_S;
  cfg->batch = T_B, cfg->seed = 7;
  cfg->init_std = 0.3f;
}

static void make_batch(model_case_t *c, int vocab) {
  static const int32_t lengths[T_B] = {T_S, 5, 3};
  for (int b = 0; b < T_B; b++) {
    c->lengths[b] = lengths[b];
    for (int s = 0; s < T_S; s++) {
      int i = b * T_S + s, real = s < lengths[b];
      c->ids[i] = real ? BERT_NUM_SPECIAL +
                             (int32_t)bert__rng_below(
                                 &rng, (uint64_t)vocab - BERT_NUM_SPECIAL)
                       : BERT_PAD_ID;
      c->types[i] = real && s >= lengths[b] / 2;
      c->labels[i] = BERT_LABEL_IGNORE;
    }
  }
  /* masked positions: some [MASK], one left as it is */
  static const int masked[][2] = {{0, 1}, {0, 4}, {0, 6},
                                  {1, 2}, {1, 3}, {2, 1}};
  for (size_t k = 0; k < sizeof masked / sizeof masked[0]; k++) {
    int i = masked[k][0] * T_S + masked[k][1];
    c->labels[i] = c->ids[i];
    if (k != 3)
      c->ids[i] = BERT_MASK_ID;
  }
  c->batch = (bert_batch_t){.batch = T_B,
                            .seq_len = T_S,
                            .input_ids = c->ids,
                            .token_type_ids = c->types,
                            .lengths = c->lengths,
                            .labels = c->labels};
}

typedef struct ready_log {
  bert_model_t *m;
  int calls, *count, *order;
  float *snapshot; /* every grad as it was when declared ready */
} ready_log_t;

static void on_ready(void *ctx, int i) {
  ready_log_t *r = ctx;
  int n;
  hvd_param_t *p = bert_model_params(r->m, &n);
  if (i < 0 || i >= n)
    return;
  r->count[i]++;
  r->order[r->calls++ % n] = i;
  int64_t off = (float *)p[i].grad.data - (float *)p[0].grad.data;
  memcpy(r->snapshot + off, p[i].grad.data,
         sizeof(float) * (size_t)hvd_tensor_numel(&p[i].grad));
}

static void test_model_gradients(void) {
  bert_config_t cfg;
  small_config(&cfg);
  model_case_t c;
  if (!is_int(HVD_SUCCESS, bert_model_create(&cfg, &c.m), "model: create"))
    diag("%s", bert_last_error());
  if (c.m == NULL)
    bail("no model");
  make_batch(&c, cfg.vocab_size);
  int n;
  hvd_param_t *p = bert_model_params(c.m, &n);
  int64_t total = bert_model_num_weights(c.m);

  ready_log_t r = {.m = c.m};
  r.count = calloc(n, sizeof(int));
  r.order = calloc(n, sizeof(int));
  r.snapshot = zeros(total);
  bert_output_t o;
  is_int(HVD_SUCCESS, bert_model_forward(c.m, &c.batch, &o), "model: forward");
  is_int(6, o.masked, "model: 6 masked positions");
  ok(o.loss > 0 && isfinite(o.loss), "model: loss %.4f", o.loss);
  is_int(HVD_SUCCESS, bert_model_backward(c.m, on_ready, &r),
         "model: backward");

  /* every gradient checked against central differences */
  int bad = 0;
  double worst = 0;
  const char *worst_name = "";
  for (int i = 0; i < n; i++) {
    int64_t k = hvd_tensor_numel(&p[i].value);
    int key_bias = strstr(p[i].name, "key.bias") != NULL;
    double e = fd_check(model_objective, &c, p[i].value.data, p[i].grad.data, k,
                        12, key_bias ? KEY_BIAS_H : FD_H);
    if (e >= TOL) {
      bad++;
      diag("%s: max relative error %.2e", p[i].name, e);
    }
    if (e > worst)
      worst = e, worst_name = p[i].name;
  }
  ok(bad == 0,
     "model: all %d parameters' gradients match central "
     "differences (worst %.2e, %s)",
     n, worst, worst_name);

  /* the ready callback: once each, when final, in reverse order */
  int once = 1;
  for (int i = 0; i < n; i++)
    once &= r.count[i] == 1;
  ok(once && r.calls == n, "ready: each of %d parameters exactly once", n);
  ok(memcmp(r.snapshot, p[0].grad.data, sizeof(float) * (size_t)total) == 0,
     "ready: no gradient changed after it was declared ready");
  int word = bert_model_param_index(c.m, "embeddings.word_embeddings.weight");
  ok(r.order[n - 1] == word, "ready: the tied word embeddings come last");
  int head = bert_model_param_index(c.m, "cls.predictions.bias");
  ok(r.order[0] == head, "ready: cls.predictions.bias comes first");
  int l1 = bert_model_param_index(
      c.m, "encoder.layer.1.attention.self.query.weight");
  int l0 = bert_model_param_index(c.m, "encoder.layer.0.output.LayerNorm.bias");
  int pos1 = -1, pos0 = -1;
  for (int i = 0; i < n; i++) {
    if (r.order[i] == l1)
      pos1 = i;
    if (r.order[i] == l0)
      pos0 = i;
  }
  ok(pos1 >= 0 && pos0 > pos1, "ready: layer 1 before layer 0");

  /* gradients accumulate: a second backward of the same batch doubles
   * them */
  float *g1 = zeros(total);
  memcpy(g1, p[0].grad.data, sizeof(float) * (size_t)total);
  bert_model_forward(c.m, &c.batch, &o);
  bert_model_backward(c.m, NULL, NULL);
  double dev = 0, g1max = 0;
  const float *g2 = p[0].grad.data;
  for (int64_t i = 0; i < total; i++) {
    dev = fmax(dev, fabs(g2[i] - 2 * g1[i]));
    g1max = fmax(g1max, fabs(g1[i]));
  }
  ok(dev < 1e-5 * g1max,
     "backward accumulates: a second pass doubles the "
     "gradients (max deviation %.1e of %.1e)",
     dev, g1max);
  is_int(HVD_ERR_INVALID_ARG, bert_model_backward(c.m, NULL, NULL),
         "backward without a new forward is refused");
  diag("%s", bert_last_error());

  free(g1), free(r.count), free(r.order), free(r.snapshot);
  bert_model_destroy(c.m);
}

/* The sparse mode of the word embeddings: the decoder's share is handed
 * over first; the lookup's rows come to the sparse callback, one per
 * token in order; added back they give the dense mode's gradient bit for
 * bit. */
typedef struct sparse_log {
  ready_log_t r;
  int calls, param, H;
  int64_t n;
  int32_t rows[T_B * T_S];
  float *values;
  int ready_before; /* the ready calls made before the sparse one */
} sparse_log_t;

static void on_sparse(void *ctx, int i, const int32_t *rows, int64_t n,
                      const float *values) {
  sparse_log_t *s = ctx;
  s->calls++, s->param = i, s->n = n;
  s->ready_before = s->r.calls;
  if (n > T_B * T_S)
    return;
  memcpy(s->rows, rows, sizeof(int32_t) * (size_t)n);
  s->values = malloc(sizeof(float) * (size_t)(n * s->H));
  if (s->values != NULL)
    memcpy(s->values, values, sizeof(float) * (size_t)(n * s->H));
}

static void test_sparse_embeddings(void) {
  bert_config_t cfg;
  small_config(&cfg);
  model_case_t c;
  if (bert_model_create(&cfg, &c.m) != HVD_SUCCESS)
    bail("model: %s", bert_last_error());
  make_batch(&c, cfg.vocab_size);
  int n;
  hvd_param_t *p = bert_model_params(c.m, &n);
  int64_t total = bert_model_num_weights(c.m);
  const int H = cfg.hidden, N = T_B * T_S;
  int word = bert_model_param_index(c.m, "embeddings.word_embeddings.weight");
  bert_output_t o;

  /* the dense mode's gradients */
  bert_model_forward(c.m, &c.batch, &o);
  bert_model_backward(c.m, NULL, NULL);
  float *dense = zeros(total);
  memcpy(dense, p[0].grad.data, sizeof(float) * (size_t)total);

  sparse_log_t s = {.r = {.m = c.m}, .H = H};
  s.r.count = calloc(n, sizeof(int));
  s.r.order = calloc(n, sizeof(int));
  s.r.snapshot = zeros(total);
  is_int(HVD_SUCCESS, bert_model_set_sparse_embeddings(c.m, on_sparse, &s),
         "sparse embeddings: set");
  memset(p[0].grad.data, 0, sizeof(float) * (size_t)total);
  bert_model_forward(c.m, &c.batch, &o);
  is_int(HVD_SUCCESS, bert_model_backward(c.m, on_ready, &s.r),
         "sparse embeddings: backward");
  ok(s.calls == 1 && s.param == word && s.n == N,
     "sparse embeddings: one call for the word embeddings with %d rows "
     "(%d calls, param %d, %lld rows)",
     N, s.calls, s.param, (long long)s.n);
  ok(memcmp(s.rows, c.ids, sizeof(int32_t) * (size_t)N) == 0,
     "sparse embeddings: the rows are the tokens' ids, in order");
  ok(s.ready_before == n, "sparse embeddings: after every ready call");
  int head = bert_model_param_index(c.m, "cls.predictions.bias");
  ok(s.r.order[0] == head && s.r.order[1] == word,
     "sparse embeddings: the word embeddings are ready second, after the "
     "decoder bias");
  ok(memcmp(s.r.snapshot, p[0].grad.data, sizeof(float) * (size_t)total) ==
         0,
     "sparse embeddings: no gradient changed after it was declared ready");
  float *g = p[word].grad.data;
  for (int t = 0; t < N && s.values != NULL; t++)
    for (int j = 0; j < H; j++)
      g[(int64_t)s.rows[t] * H + j] += s.values[(int64_t)t * H + j];
  ok(memcmp(dense, p[0].grad.data, sizeof(float) * (size_t)total) == 0,
     "sparse embeddings: decoder share + rows = the dense gradients, bit for "
     "bit");

  is_int(HVD_SUCCESS, bert_model_set_sparse_embeddings(c.m, NULL, NULL),
         "sparse embeddings: off again");
  is_int(HVD_ERR_INVALID_ARG, bert_model_set_sparse_embeddings(NULL, NULL, NULL),
         "sparse embeddings: NULL model");
  free(s.values), free(s.r.count), free(s.r.order), free(s.r.snapshot);
  free(dense);
  bert_model_destroy(c.m);
}

/* ---- Parameters, initialisation, errors
 * ---------------------------------------- */

static void test_params(void) {
  bert_config_t cfg;
  is_int(HVD_SUCCESS, bert_config_preset(&cfg, "tiny"), "preset tiny");
  is_int(HVD_SUCCESS, bert_config_set(&cfg, "vocab_size", "100"),
         "config_set vocab_size");
  is_int(HVD_ERR_INVALID_ARG, bert_config_set(&cfg, "hiden", "8"),
         "config_set: an unknown key is refused");
  is_int(HVD_ERR_INVALID_ARG, bert_config_set(&cfg, "hidden", "8x"),
         "config_set: a bad number is refused");
  bert_config_t bad = cfg;
  bad.heads = 3;
  is_int(HVD_ERR_INVALID_ARG, bert_config_check(&bad),
         "hidden not a multiple of heads is refused: %s", bert_last_error());
  bad = cfg;
  bad.seq_len = bad.max_position + 1;
  is_int(HVD_ERR_INVALID_ARG, bert_config_check(&bad),
         "seq_len beyond max_position is refused");

  bert_model_t *a = NULL, *b = NULL;
  bert_model_create(&cfg, &a);
  bert_model_create(&cfg, &b);
  if (a == NULL || b == NULL)
    bail("create: %s", bert_last_error());
  int n;
  hvd_param_t *p = bert_model_params(a, &n);
  is_int(5 + 16 * cfg.layers + 5, n, "tiny: %d parameters", n);
  int64_t H = cfg.hidden, F = cfg.ffn, V = cfg.vocab_size;
  int64_t expect =
      V * H + cfg.max_position * H + 2 * H + 2 * H +
      cfg.layers * (4 * (H * H + H) + 2 * 2 * H + (F * H + F) + (H * F + H)) +
      (H * H + H) + 2 * H + V;
  is_int(expect, bert_model_num_weights(a), "tiny: weight count");
  is_string("embeddings.word_embeddings.weight", p[0].name, "first name");
  is_string("encoder.layer.1.attention.self.key.bias",
            p[bert_model_param_index(a, "encoder.layer.1.attention.self.key."
                                        "bias")]
                .name,
            "a layer name");
  is_string("cls.predictions.bias", p[n - 1].name, "last name");
  int qi = bert_model_param_index(a, "encoder.layer.0.attention.self.query."
                                     "weight");
  ok(qi > 0 && p[qi].value.ndim == 2 && p[qi].value.shape[0] == H &&
         p[qi].value.shape[1] == H,
     "query.weight is [H, H]");
  int ii = bert_model_param_index(a, "encoder.layer.0.intermediate.dense."
                                     "weight");
  ok(ii > 0 && p[ii].value.shape[0] == F && p[ii].value.shape[1] == H,
     "intermediate.dense.weight is [F, H] (PyTorch's [out, in])");
  is_int(-1, bert_model_param_index(a, "cls.predictions.decoder.weight"),
         "no decoder weight of its own: it is tied");
  ok(memcmp(p[0].value.data, bert_model_params(b, NULL)[0].value.data,
            sizeof(float) * (size_t)bert_model_num_weights(a)) == 0,
     "init: the same seed gives the same weights");
  bert_model_init(b, cfg.seed + 1);
  ok(memcmp(p[0].value.data, bert_model_params(b, NULL)[0].value.data,
            sizeof(float) * (size_t)(V * H)) != 0,
     "init: another seed gives other weights");
  const float *w = p[0].value.data;
  double s = 0, ss = 0;
  for (int64_t i = 0; i < V * H; i++)
    s += w[i], ss += (double)w[i] * w[i];
  double mean = s / (V * H), sd = sqrt(ss / (V * H) - mean * mean);
  ok(fabs(mean) < 0.002 && fabs(sd - 0.02) < 0.001,
     "init: word embeddings ~ normal(0, 0.02) (mean %.5f, sd %.5f)", mean, sd);
  int lnw = bert_model_param_index(a, "encoder.layer.1.output.LayerNorm."
                                      "weight"),
      lnb = bert_model_param_index(a, "encoder.layer.1.output.LayerNorm.bias");
  int ones = 1, zero = 1;
  for (int64_t j = 0; j < H; j++) {
    ones &= ((float *)p[lnw].value.data)[j] == 1.0f;
    zero &= ((float *)p[lnb].value.data)[j] == 0.0f;
  }
  ok(ones && zero, "init: LayerNorm weights 1, biases 0");

  /* batches that do not fit */
  int32_t ids[4] = {2, 7, 200, 3}, labels[4] = {-100, 7, -100, -100};
  bert_batch_t batch = {
      .batch = 1, .seq_len = 4, .input_ids = ids, .labels = labels};
  bert_output_t o;
  is_int(HVD_ERR_INVALID_ARG, bert_model_forward(a, &batch, &o),
         "forward: a token id beyond the vocabulary is refused");
  ok(strstr(bert_last_error(), "200") != NULL, "... saying which: %s",
     bert_last_error());
  ids[2] = 9;
  batch.seq_len = cfg.seq_len + 1;
  is_int(HVD_ERR_INVALID_ARG, bert_model_forward(a, &batch, &o),
         "forward: a batch longer than seq_len is refused");
  batch.seq_len = 4;
  labels[0] = -5;
  is_int(HVD_ERR_INVALID_ARG, bert_model_forward(a, &batch, &o),
         "forward: a label that is neither -100 nor a token is refused");
  labels[0] = -100;
  for (int i = 0; i < 4; i++)
    labels[i] = -100;
  is_int(HVD_SUCCESS, bert_model_forward(a, &batch, &o),
         "forward: a batch with no masked token");
  ok(o.loss == 0 && o.masked == 0, "... has loss 0 over 0 positions");
  bert_model_zero_grad(a);
  is_int(HVD_SUCCESS, bert_model_backward(a, NULL, NULL),
         "... and a backward pass");
  int allzero = 1;
  const float *g = p[0].grad.data;
  for (int64_t i = 0; i < bert_model_num_weights(a); i++)
    allzero &= g[i] == 0.0f;
  ok(allzero, "... that adds nothing to the gradients");
  bert_model_destroy(a);
  bert_model_destroy(b);
}

/* ---- Learning
 * ------------------------------------------------------------------ */

/* Plain SGD (value -= lr * grad) on one fixed batch of the synthetic
 * corpus: the loss must fall. (Our own update rather than hvd_sgd_create,
 * so the model's test needs nothing of lib/optim.) */
static void test_learns(void) {
  bert_data_options_t dopt;
  bert_data_options_init(&dopt);
  dopt.seq_len = 32;
  dopt.synthetic_sentences = 400;
  bert_dataset_t *d = NULL;
  if (bert_dataset_create(&dopt, &d) != HVD_SUCCESS)
    bail("dataset: %s", bert_last_error());
  bert_config_t cfg;
  bert_config_preset(&cfg, "tiny");
  cfg.vocab_size = bert_vocab_size(bert_dataset_vocab(d));
  cfg.seq_len = 32;
  bert_model_t *m = NULL;
  if (bert_model_create(&cfg, &m) != HVD_SUCCESS)
    bail("create: %s", bert_last_error());
  enum { B = 8, S = 32 };
  int32_t ids[B * S], labels[B * S], lengths[B];
  int64_t idx[B];
  for (int i = 0; i < B; i++)
    idx[i] = i;
  bert_dataset_batch(d, idx, B, 0, ids, NULL, labels, lengths);
  bert_batch_t batch = {.batch = B,
                        .seq_len = S,
                        .input_ids = ids,
                        .lengths = lengths,
                        .labels = labels};
  int n;
  hvd_param_t *p = bert_model_params(m, &n);
  int64_t total = bert_model_num_weights(m);
  float *v = p[0].value.data, *g = p[0].grad.data;
  bert_output_t o;
  double first = 0, last = 0;
  for (int step = 0; step < 30; step++) {
    bert_model_zero_grad(m);
    bert_model_forward(m, &batch, &o);
    bert_model_backward(m, NULL, NULL);
    for (int64_t i = 0; i < total; i++)
      v[i] -= 0.1f * g[i];
    if (step == 0)
      first = o.loss;
    last = o.loss;
  }
  ok(fabs(first - log(cfg.vocab_size)) < 0.1,
     "initial loss %.3f is about log V = %.3f (weights ~ normal(0, 0.02))",
     first, log(cfg.vocab_size));
  ok(last < 0.7 * first,
     "SGD on one batch: loss falls from %.3f to %.3f in 30 steps", first, last);
  bert_model_destroy(m);
  bert_dataset_destroy(d);
}

int main(void) {
  const char *env = getenv("BERT_GRAD_SEED"); /* of the test data */
  uint64_t seed = env != NULL ? strtoull(env, NULL, 10) : 2024;
  bert__rng_seed(&rng, &seed, 1);
  bert_set_threads(1);
  test_layernorm();
  test_embeddings();
  test_attention();
  test_ffn();
  test_head();
  test_model_gradients();
  test_sparse_embeddings();
  test_params();
  test_learns();
  done_testing();
  return tap_exit_status();
}
