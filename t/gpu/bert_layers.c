/*
 * bert_layers.c - the GPU backend of the BERT example
 * (examples/bert/layers_cuda.cu) against the CPU one (layers.c), one
 * process, random data from a fixed seed:
 *
 *  - every layer of layers.h, forward and backward, on odd sizes (rows
 *    and widths that are no multiple of a warp or a block, LayerNorm
 *    rows wider than a block, 0 to S real tokens per sequence): linear
 *    (with and without bias, dx overwritten and accumulated, no dx),
 *    LayerNorm (dx aliasing dy), GELU, attention with a padding mask
 *    (a sequence of length 0 included; rows of 200, 300, 700 and 1100
 *    keys for each of the softmaxes' kernels), embeddings (repeated ids, two
 *    token types, no types), cross-entropy (a row whose maximum is tied:
 *    the first index wins on both), add, copy, zero, gather and
 *    scatter-add of rows (repeated rows); gradients of parameters must
 *    accumulate (+=) onto what was there;
 *  - the same layers and sizes in bfloat16 and float16: each entry of
 *    bert_cuda_backend(p) against bert_cpu_backend(p), the CPU's model of
 *    the GPU's mixed precision, on the same T inputs, within a few units
 *    of T's rounding (its own tolerance, "the 16-bit precisions" below);
 *    then at BERT's aligned sizes (dh 64, 16-byte rows: the fast
 *    algorithms); all of it with the fused kernels (the bias in cuBLASLt's
 *    epilogue, the attention's heads in place) and, in bfloat16, with the
 *    plain ones too (bert_cuda_set_plain); flash attention
 *    (bert_cuda_set_flash) against the same CPU model, forward and
 *    backward, with a partial last tile, padding and a length-0 sequence;
 *  - the whole model (bert_model_create_on): the same initial weights,
 *    the same loss and gradients as the CPU model, the gradient-ready
 *    calls in the same order with every gradient complete when its call
 *    comes (read on a stream that does not wait for the model's),
 *    backward_scaled, and three SGD steps with losses that stay together.
 *
 * Tolerances: a result r is compared with the CPU's c as
 * max|r - c| / max|c| over the tensor (1e-4 for a layer, 1e-3 for the
 * model's gradients): cuBLAS and the kernels add in other orders than
 * the CPU, which moves float32 results by a few ulps of the largest
 * term; a wrong kernel is off by O(1).
 *
 * Skips ("no CUDA device: ...") in a build without CUDA and when
 * cudaGetDeviceCount finds no device or fails.
 */
#include <config.h>

#include "gputest.h"
#include "hvdtest.h"
#include "tap.h"

#ifndef HVD_HAVE_CUDA

int main(void) { skip_all("%s", GPU_TEST_NO_CUDA); }

#else /* HVD_HAVE_CUDA */

#include "data.h"
#include "layers.h"
#include "model.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_LAYER 1e-4
#define TOL_MODEL 1e-3

static const bert_backend_t *G; /* the GPU backend */
static bert_rng_t rng;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL)
    bail("out of memory (%zu bytes)", n);
  return p;
}

static float *randn(int64_t n, double std) {
  float *p = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(std * bert__rng_normal(&rng));
  return p;
}

static int32_t *randi(int64_t n, int lo, int hi) { /* [lo, hi) */
  int32_t *p = xmalloc(sizeof(int32_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    p[i] = lo + (int32_t)bert__rng_below(&rng, (uint64_t)(hi - lo));
  return p;
}

/* A device copy of n bytes of host memory. */
static void *up(const void *h, size_t n) {
  void *d = G->alloc(n);
  if (d == NULL)
    bail("device allocation of %zu bytes: %s", n,
         G->error() ? G->error() : "?");
  G->to_device(d, h, n);
  return d;
}

static float *upf(const float *h, int64_t n) {
  return up(h, sizeof(float) * (size_t)n);
}

static int32_t *upi(const int32_t *h, int64_t n) {
  return h == NULL ? NULL : up(h, sizeof(int32_t) * (size_t)n);
}

/* The device's n floats, in new host memory. */
static float *down(const float *d, int64_t n) {
  float *h = xmalloc(sizeof(float) * (size_t)n);
  G->to_host(h, d, sizeof(float) * (size_t)n);
  if (G->error() != NULL)
    bail("%s", G->error());
  return h;
}

static double max_abs(const float *a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    m = fmax(m, fabs((double)a[i]));
  return m;
}

/* max|gpu - cpu|; a NaN anywhere counts as infinitely far. */
static double max_err(const float *gpu, const float *cpu, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)gpu[i] - (double)cpu[i]);
    if (isnan(d))
      return INFINITY;
    e = fmax(e, d);
  }
  return e;
}

/* max|gpu - cpu| / max|cpu| (or the plain error when cpu is all zero). */
static double rel_err(const float *gpu, const float *cpu, int64_t n) {
  double e = max_err(gpu, cpu, n), m = max_abs(cpu, n);
  return m > 0 ? e / m : e;
}

/* ok() that the device tensor d equals the host tensor c; frees nothing. */
static void same(const char *what, const float *d, const float *c, int64_t n,
                 double tol) {
  float *g = down(d, n);
  double e = rel_err(g, c, n);
  ok(e <= tol, "%s: relative error %.2e <= %.0e", what, e, tol);
  free(g);
}

/* ---- layers ----------------------------------------------------------- */

/* The layer cases of one precision, each run on the same odd shapes
 * (run_cases). */
typedef struct layer_cases {
  void (*linear)(int n, int in, int out, int bias, int with_dx, float beta);
  void (*layernorm)(int n, int h);
  void (*gelu)(int64_t n);
  void (*attention)(int B, int S, int A, int dh, const int32_t *lengths);
  void (*embedding)(int B, int S, int H, int V, int with_types);
  void (*xent)(int m, int V);
  void (*elementwise)(int64_t n);
  void (*rows)(int m, int h, int src_rows);
} layer_cases_t;

/* Rows and widths that are no multiple of a warp or a block, LayerNorm
 * rows wider than a block, 0 to S real tokens per sequence. */
static void run_cases(const layer_cases_t *c) {
  static const int32_t len4[4] = {13, 5, 1, 0}, len1[1] = {1};
  static const int32_t len2[2] = {190, 61}, len1b[1] = {650};
  c->linear(37, 45, 51, 1, 1, 0.0f);
  c->linear(37, 45, 51, 1, 1, 1.0f);
  c->linear(1, 300, 7, 0, 1, 0.0f);
  c->linear(129, 64, 33, 1, 0, 0.0f);
  c->layernorm(29, 77);
  c->layernorm(5, 300); /* wider than a block */
  c->layernorm(1, 1);
  c->gelu(1001);
  c->attention(4, 13, 3, 7, len4);
  c->attention(2, 37, 5, 13, NULL);
  c->attention(1, 1, 1, 1, len1);
  /* rows of 200, 300 and 700 keys: the softmaxes that hold a row in
   * registers, 8, 16 and 32 values a lane; 1100 keys: their loops */
  c->attention(2, 200, 1, 5, len2);
  c->attention(1, 300, 2, 3, NULL);
  c->attention(1, 700, 1, 2, len1b);
  c->attention(1, 1100, 1, 2, NULL);
  c->embedding(3, 11, 19, 17, 1);
  c->embedding(2, 5, 40, 3, 0);
  c->xent(23, 1031);
  c->xent(3, 9);
  c->elementwise(777);
  c->rows(9, 33, 4);
}

static void test_linear(int n, int in, int out, int bias, int with_dx,
                        float dx_beta) {
  char name[96];
  snprintf(name, sizeof name, "linear n=%d in=%d out=%d%s%s dx_beta=%g", n, in,
           out, bias ? "" : " (no bias)", with_dx ? "" : " (no dx)",
           (double)dx_beta);
  float *x = randn((int64_t)n * in, 1), *W = randn((int64_t)out * in, 0.3);
  float *b = bias ? randn(out, 0.5) : NULL;
  float *y = randn((int64_t)n * out, 1); /* overwritten */
  float *dy = randn((int64_t)n * out, 1);
  float *dx = randn((int64_t)n * in, 1), *dW = randn((int64_t)out * in, 1);
  float *db = randn(out, 1);
  float *gx = upf(x, (int64_t)n * in), *gW = upf(W, (int64_t)out * in);
  float *gb = bias ? upf(b, out) : NULL, *gy = upf(y, (int64_t)n * out);
  float *gdy = upf(dy, (int64_t)n * out), *gdx = upf(dx, (int64_t)n * in);
  float *gdW = upf(dW, (int64_t)out * in), *gdb = upf(db, out);

  bert_linear_fwd(x, W, b, y, n, in, out);
  G->linear_fwd(gx, gW, gb, gy, n, in, out);
  snprintf(name + strlen(name), sizeof name - strlen(name), ": y");
  same(name, gy, y, (int64_t)n * out, TOL_LAYER);
  bert_linear_bwd(x, W, dy, with_dx ? dx : NULL, dx_beta, dW, bias ? db : NULL,
                  n, in, out);
  G->linear_bwd(gx, gW, gdy, with_dx ? gdx : NULL, dx_beta, gdW,
                bias ? gdb : NULL, n, in, out);
  name[strlen(name) - 1] = '\0';
  char part[128];
  snprintf(part, sizeof part, "%sdW (+=)", name);
  same(part, gdW, dW, (int64_t)out * in, TOL_LAYER);
  snprintf(part, sizeof part, "%sdb (+=)", name);
  same(part, gdb, db, out, TOL_LAYER);
  snprintf(part, sizeof part, "%sdx", name);
  same(part, gdx, dx, (int64_t)n * in, TOL_LAYER);
  free(x), free(W), free(b), free(y), free(dy), free(dx), free(dW), free(db);
  G->free(gx), G->free(gW), G->free(gb), G->free(gy), G->free(gdy);
  G->free(gdx), G->free(gdW), G->free(gdb);
}

/* The fused pairs (float32): add_layernorm_fwd in place (sum over a)
 * against bert_add and bert_layernorm_fwd, the sum bit for bit; then
 * layernorm_bwd2 against bert_layernorm_bwd, its dx2 the GPU's dx bit for
 * bit. */
static void test_fused_layernorm(int n, int h) {
  const int64_t nx = (int64_t)n * h;
  char name[96];
  float *a = randn(nx, 2), *res = randn(nx, 1), *g = randn(h, 1);
  float *b = randn(h, 1), *y = xmalloc(sizeof(float) * (size_t)nx);
  float *mean = xmalloc(sizeof(float) * n), *rstd = xmalloc(sizeof(float) * n);
  float *dy = randn(nx, 1), *dx = xmalloc(sizeof(float) * (size_t)nx);
  float *dg = randn(h, 1), *db = randn(h, 1);
  float *ga = upf(a, nx), *gres = upf(res, nx), *gg = upf(g, h),
        *gb = upf(b, h);
  float *gy = G->alloc(sizeof(float) * (size_t)nx);
  float *gmean = G->alloc(sizeof(float) * n),
        *grstd = G->alloc(sizeof(float) * n);
  float *gdy = upf(dy, nx), *gdx = G->alloc(sizeof(float) * (size_t)nx);
  float *gdx2 = G->alloc(sizeof(float) * (size_t)nx);
  float *gdg = upf(dg, h), *gdb = upf(db, h);

  bert_add(a, res, a, nx);
  bert_layernorm_fwd(a, g, b, 1e-12f, y, mean, rstd, n, h);
  G->add_layernorm_fwd(ga, gres, gg, gb, 1e-12f, ga, gy, gmean, grstd, n, h);
  snprintf(name, sizeof name, "add_layernorm_fwd n=%d h=%d: sum (in place)", n,
           h);
  same(name, ga, a, nx, 0);
  snprintf(name, sizeof name, "add_layernorm_fwd n=%d h=%d: y", n, h);
  same(name, gy, y, nx, TOL_LAYER);
  snprintf(name, sizeof name, "add_layernorm_fwd n=%d h=%d: mean, rstd", n, h);
  same(name, gmean, mean, n, TOL_LAYER);
  same(name, grstd, rstd, n, TOL_LAYER);
  bert_layernorm_bwd(a, mean, rstd, g, dy, dx, dg, db, n, h);
  G->layernorm_bwd2(ga, gmean, grstd, gg, gdy, gdx, gdx2, gdg, gdb, n, h);
  snprintf(name, sizeof name, "layernorm_bwd2 n=%d h=%d: dx", n, h);
  same(name, gdx, dx, nx, TOL_LAYER);
  snprintf(name, sizeof name, "layernorm_bwd2 n=%d h=%d: dg, db (+=)", n, h);
  same(name, gdg, dg, h, TOL_LAYER);
  same(name, gdb, db, h, TOL_LAYER);
  float *h1 = down(gdx, nx), *h2 = down(gdx2, nx);
  ok(memcmp(h1, h2, sizeof(float) * (size_t)nx) == 0,
     "layernorm_bwd2 n=%d h=%d: dx2 is dx bit for bit", n, h);
  free(h1), free(h2);
  free(a), free(res), free(g), free(b), free(y), free(mean), free(rstd);
  free(dy), free(dx), free(dg), free(db);
  G->free(ga), G->free(gres), G->free(gg), G->free(gb), G->free(gy);
  G->free(gmean), G->free(grstd), G->free(gdy), G->free(gdx), G->free(gdx2);
  G->free(gdg), G->free(gdb);
}

static void test_layernorm(int n, int h) {
  char name[96];
  float *x = randn((int64_t)n * h, 2), *g = randn(h, 1), *b = randn(h, 1);
  for (int64_t i = 0; i < (int64_t)n * h; i++)
    x[i] += 3.0f; /* a mean far from 0 */
  float *y = xmalloc(sizeof(float) * (size_t)n * h);
  float *mean = xmalloc(sizeof(float) * n), *rstd = xmalloc(sizeof(float) * n);
  float *dy = randn((int64_t)n * h, 1), *dg = randn(h, 1), *db = randn(h, 1);
  float *gx = upf(x, (int64_t)n * h), *gg = upf(g, h), *gb = upf(b, h);
  float *gy = G->alloc(sizeof(float) * (size_t)n * h);
  float *gmean = G->alloc(sizeof(float) * n),
        *grstd = G->alloc(sizeof(float) * n);
  float *gdy = upf(dy, (int64_t)n * h), *gdg = upf(dg, h), *gdb = upf(db, h);

  bert_layernorm_fwd(x, g, b, 1e-12f, y, mean, rstd, n, h);
  G->layernorm_fwd(gx, gg, gb, 1e-12f, gy, gmean, grstd, n, h);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: y", n, h);
  same(name, gy, y, (int64_t)n * h, TOL_LAYER);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: mean", n, h);
  same(name, gmean, mean, n, TOL_LAYER);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: rstd", n, h);
  same(name, grstd, rstd, n, TOL_LAYER);
  /* backward in place (dx aliases dy), as the contract allows */
  bert_layernorm_bwd(x, mean, rstd, g, dy, dy, dg, db, n, h);
  G->layernorm_bwd(gx, gmean, grstd, gg, gdy, gdy, gdg, gdb, n, h);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: dx (aliasing dy)", n, h);
  same(name, gdy, dy, (int64_t)n * h, TOL_LAYER);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: dg (+=)", n, h);
  same(name, gdg, dg, h, TOL_LAYER);
  snprintf(name, sizeof name, "layernorm n=%d h=%d: db (+=)", n, h);
  same(name, gdb, db, h, TOL_LAYER);
  free(x), free(g), free(b), free(y), free(mean), free(rstd), free(dy);
  free(dg), free(db);
  G->free(gx), G->free(gg), G->free(gb), G->free(gy), G->free(gmean);
  G->free(grstd), G->free(gdy), G->free(gdg), G->free(gdb);
  test_fused_layernorm(n, h);
}

static void test_gelu(int64_t n) {
  float *x = randn(n, 3), *dy = randn(n, 1);
  float *y = xmalloc(sizeof(float) * (size_t)n);
  float *gx = upf(x, n), *gy = G->alloc(sizeof(float) * (size_t)n),
        *gdy = upf(dy, n);
  bert_gelu_fwd(x, y, n);
  G->gelu_fwd(gx, gy, n);
  same("gelu forward", gy, y, n, TOL_LAYER);
  bert_gelu_bwd(x, dy, dy, n); /* in place */
  G->gelu_bwd(gx, gdy, gdy, n);
  same("gelu backward (dx aliasing dy)", gdy, dy, n, TOL_LAYER);
  free(x), free(dy), free(y);
  G->free(gx), G->free(gy), G->free(gdy);
}

static void test_attention(int B, int S, int A, int dh,
                           const int32_t *lengths) {
  const int64_t nh = (int64_t)B * S * A * dh, np = (int64_t)B * A * S * S;
  char name[128], what[160];
  snprintf(name, sizeof name, "attention B=%d S=%d A=%d dh=%d%s", B, S, A, dh,
           lengths ? " (padding)" : "");
  float *q = randn(nh, 1), *k = randn(nh, 1), *v = randn(nh, 1);
  float *probs = xmalloc(sizeof(float) * (size_t)np);
  float *ctx = xmalloc(sizeof(float) * (size_t)nh);
  float *dctx = randn(nh, 1), *dq = xmalloc(sizeof(float) * (size_t)nh);
  float *dk = xmalloc(sizeof(float) * (size_t)nh);
  float *dv = xmalloc(sizeof(float) * (size_t)nh);
  float *scratch = xmalloc(sizeof(float) * (size_t)S * S);
  float *gq = upf(q, nh), *gk = upf(k, nh), *gv = upf(v, nh);
  int32_t *glen = upi(lengths, B);
  float *gprobs = G->alloc(sizeof(float) * (size_t)np);
  float *gctx = G->alloc(sizeof(float) * (size_t)nh), *gdctx = upf(dctx, nh);
  float *gdq = G->alloc(sizeof(float) * (size_t)nh);
  float *gdk = G->alloc(sizeof(float) * (size_t)nh);
  float *gdv = G->alloc(sizeof(float) * (size_t)nh);

  bert_attention_fwd(q, k, v, lengths, probs, ctx, B, S, A, dh);
  G->attention_fwd(gq, gk, gv, glen, gprobs, gctx, B, S, A, dh);
  snprintf(what, sizeof what, "%s: probs", name);
  same(what, gprobs, probs, np, TOL_LAYER);
  snprintf(what, sizeof what, "%s: ctx", name);
  same(what, gctx, ctx, nh, TOL_LAYER);
  bert_attention_bwd(q, k, v, probs, dctx, dq, dk, dv, scratch, B, S, A, dh);
  G->attention_bwd(gq, gk, gv, gprobs, gdctx, gdq, gdk, gdv, NULL, B, S, A, dh);
  snprintf(what, sizeof what, "%s: dq", name);
  same(what, gdq, dq, nh, TOL_LAYER);
  snprintf(what, sizeof what, "%s: dk", name);
  same(what, gdk, dk, nh, TOL_LAYER);
  snprintf(what, sizeof what, "%s: dv", name);
  same(what, gdv, dv, nh, TOL_LAYER);
  free(q), free(k), free(v), free(probs), free(ctx), free(dctx), free(dq);
  free(dk), free(dv), free(scratch);
  G->free(gq), G->free(gk), G->free(gv), G->free(glen), G->free(gprobs);
  G->free(gctx), G->free(gdctx), G->free(gdq), G->free(gdk), G->free(gdv);
}

static void test_embedding(int B, int S, int H, int V, int with_types) {
  const int64_t N = (int64_t)B * S;
  char name[96], what[128];
  snprintf(name, sizeof name, "embedding B=%d S=%d H=%d V=%d%s", B, S, H, V,
           with_types ? "" : " (no types)");
  int32_t *ids = randi(N, 0, V); /* V small: ids repeat */
  int32_t *types = with_types ? randi(N, 0, 2) : NULL;
  float *word = randn((int64_t)V * H, 1), *pos = randn((int64_t)S * H, 1);
  float *type = randn(2 * (int64_t)H, 1);
  float *out = xmalloc(sizeof(float) * (size_t)(N * H));
  float *dout = randn(N * H, 1), *dword = randn((int64_t)V * H, 1);
  float *dpos = randn((int64_t)S * H, 1), *dtype = randn(2 * (int64_t)H, 1);
  int32_t *gids = upi(ids, N), *gtypes = upi(types, N);
  float *gword = upf(word, (int64_t)V * H), *gpos = upf(pos, (int64_t)S * H);
  float *gtype = upf(type, 2 * (int64_t)H);
  float *gout = G->alloc(sizeof(float) * (size_t)(N * H));
  float *gdout = upf(dout, N * H), *gdword = upf(dword, (int64_t)V * H);
  float *gdpos = upf(dpos, (int64_t)S * H),
        *gdtype = upf(dtype, 2 * (int64_t)H);

  bert_embedding_fwd(ids, types, word, pos, type, out, B, S, H);
  G->embedding_fwd(gids, gtypes, gword, gpos, gtype, gout, B, S, H);
  snprintf(what, sizeof what, "%s: forward", name);
  same(what, gout, out, N * H, TOL_LAYER);
  bert_embedding_bwd(ids, types, dout, dword, dpos, dtype, B, S, H);
  G->embedding_bwd(gids, gtypes, gdout, gdword, gdpos, gdtype, B, S, H);
  snprintf(what, sizeof what, "%s: dword (+=, repeated ids)", name);
  same(what, gdword, dword, (int64_t)V * H, TOL_LAYER);
  snprintf(what, sizeof what, "%s: dpos (+=)", name);
  same(what, gdpos, dpos, (int64_t)S * H, TOL_LAYER);
  snprintf(what, sizeof what, "%s: dtype (+=)", name);
  same(what, gdtype, dtype, 2 * (int64_t)H, TOL_LAYER);
  free(ids), free(types), free(word), free(pos), free(type), free(out);
  free(dout), free(dword), free(dpos), free(dtype);
  G->free(gids), G->free(gtypes), G->free(gword), G->free(gpos);
  G->free(gtype), G->free(gout), G->free(gdout), G->free(gdword);
  G->free(gdpos), G->free(gdtype);
}

static void test_xent(int m, int V) {
  char what[96];
  float *logits = randn((int64_t)m * V, 3);
  int32_t *targets = randi(m, 0, V);
  /* row 0: a tied maximum at 5 and V - 2, the target on the second (so
   * the first-index rule decides whether it counts as correct) */
  logits[5] = logits[V - 2] = 50.0f;
  targets[0] = V - 2;
  /* row 1: the target is the clear maximum */
  logits[(int64_t)V + 7] = 60.0f;
  targets[1] = 7;
  float *glogits = upf(logits, (int64_t)m * V);
  int32_t *gtargets = upi(targets, m);
  int64_t c_cpu = -1, c_gpu = -1;
  double l_cpu = bert_xent_fwd(logits, targets, m, V, &c_cpu);
  double l_gpu = G->xent_fwd(glogits, gtargets, m, V, &c_gpu);
  snprintf(what, sizeof what, "xent m=%d V=%d: loss sum", m, V);
  is_double(l_cpu, l_gpu, 1e-6 * fabs(l_cpu), "%s (%.9g vs %.9g)", what, l_gpu,
            l_cpu);
  is_int(c_cpu, c_gpu, "xent m=%d V=%d: correct rows (first argmax on ties)", m,
         V);
  snprintf(what, sizeof what, "xent m=%d V=%d: probabilities", m, V);
  same(what, glogits, logits, (int64_t)m * V, TOL_LAYER);
  bert_xent_bwd(logits, targets, m, V, 0.37f);
  G->xent_bwd(glogits, gtargets, m, V, 0.37f);
  snprintf(what, sizeof what, "xent m=%d V=%d: backward", m, V);
  same(what, glogits, logits, (int64_t)m * V, TOL_LAYER);
  free(logits), free(targets);
  G->free(glogits), G->free(gtargets);
}

static void test_elementwise(int64_t n) {
  float *a = randn(n, 1), *b = randn(n, 1), *y = xmalloc(sizeof(float) * n);
  float *ga = upf(a, n), *gb = upf(b, n), *gy = G->alloc(sizeof(float) * n);
  bert_add(a, b, y, n);
  G->add(ga, gb, gy, n);
  same("add", gy, y, n, 0);
  bert_add(a, b, a, n); /* y aliasing a */
  G->add(ga, gb, ga, n);
  same("add in place", ga, a, n, 0);
  G->copy(gb, gy, n);
  same("copy", gy, b, n, 0);
  memset(y, 0, sizeof(float) * (size_t)n);
  G->zero(gy, n);
  same("zero", gy, y, n, 0);
  free(a), free(b), free(y);
  G->free(ga), G->free(gb), G->free(gy);
}

static void test_rows(int m, int h, int src_rows) {
  float *src = randn((int64_t)src_rows * h, 1);
  int32_t *rows = randi(m, 0, src_rows); /* repeats */
  float *dst = xmalloc(sizeof(float) * (size_t)m * h);
  float *acc = randn((int64_t)src_rows * h, 1);
  float *gsrc = upf(src, (int64_t)src_rows * h),
        *gacc = upf(acc, (int64_t)src_rows * h);
  int32_t *grows = upi(rows, m);
  float *gdst = G->alloc(sizeof(float) * (size_t)m * h);
  bert_gather_rows(src, rows, m, h, dst);
  G->gather_rows(gsrc, grows, m, h, gdst);
  same("gather_rows", gdst, dst, (int64_t)m * h, 0);
  bert_scatter_add_rows(dst, rows, m, h, acc);
  G->scatter_add_rows(gdst, grows, m, h, gacc);
  same("scatter_add_rows (+=, repeated rows)", gacc, acc, (int64_t)src_rows * h,
       TOL_LAYER);
  free(src), free(rows), free(dst), free(acc);
  G->free(gsrc), G->free(gacc), G->free(grows), G->free(gdst);
}

/* ---- the 16-bit precisions ---------------------------------------------
 *
 * Each layer entry of bert_cuda_backend(p) against bert_cpu_backend(p),
 * the CPU's model of the same precision, on the same T inputs (normal
 * floats rounded to T by bert_from_float); the outputs are compared as
 * floats (bert_to_float), element by element:
 *
 *   |g - c| <= R max(|g|, |c|) + (R / 2) max|c over the tensor|,
 *   R = 2^-6 for bfloat16, 2^-9 for float16 (4 units of T's rounding).
 *
 * Why: both sides compute the same float32 value in other orders (cuBLAS
 * and the kernels against OpenBLAS and loops, ~1e-7 apart) and round it
 * to T once, so two results can land on adjacent T values: one ulp, up
 * to 2 units of rounding relative. A probability that rounded the other
 * way inside attention_fwd moves ctx by another ulp of it: 4 units. The
 * absolute term covers the elements that are sums with cancellation or
 * float16 subnormals (small probabilities), where a relative bound means
 * nothing. A wrong kernel is off by O(1) of the tensor's largest value.
 * Each backward pass gets the same T inputs on both sides (the CPU's
 * probabilities are copied to the GPU first), so errors do not compound.
 * Copy, zero, gather and add are bit for bit (add rounds the same float
 * sum on both). */

static int P;                   /* the precision under test */
static int PLAIN;               /* ... with bert_cuda_set_plain(1) */
static const bert_backend_t *C; /* the CPU's model of it */
static size_t ES;               /* bytes per element */
static double R_TOL;            /* R above */

/* "bf16", or "bf16 plain" for the plain kernels: the checks' prefix. */
static const char *plabel(void) {
  static char buf[32];
  snprintf(buf, sizeof buf, "%s%s", bert_precision_name(P),
           PLAIN ? " plain" : "");
  return buf;
}

/* n floats rounded to T, in new host memory; frees f. */
static void *to_t(float *f, int64_t n) {
  void *t = xmalloc(ES * (size_t)n);
  bert_from_float(P, f, t, n);
  free(f);
  return t;
}

static void *trandn(int64_t n, double std) { return to_t(randn(n, std), n); }

static void *tup(const void *h, int64_t n) { return up(h, ES * (size_t)n); }

static void *tdev(int64_t n) {
  void *d = G->alloc(ES * (size_t)n);
  if (d == NULL)
    bail("device allocation of %lld elements: %s", (long long)n,
         G->error() ? G->error() : "?");
  return d;
}

/* ok() that the device T tensor d matches the host T tensor c (bit for
 * bit when exact). */
static void tsame(const char *what, const void *d, const void *c, int64_t n,
                  int exact) {
  const char *pn = plabel();
  void *raw = xmalloc(ES * (size_t)n);
  G->to_host(raw, d, ES * (size_t)n);
  if (G->error() != NULL)
    bail("%s", G->error());
  if (exact) {
    ok(memcmp(raw, c, ES * (size_t)n) == 0, "%s %s: bit for bit", pn, what);
  } else {
    float *g = xmalloc(sizeof(float) * (size_t)n);
    float *h = xmalloc(sizeof(float) * (size_t)n);
    bert_to_float(P, raw, g, n);
    bert_to_float(P, c, h, n);
    double e = hvdt_rounding_err(g, h, n, R_TOL);
    ok(e <= 1, "%s %s: %.2f of the tolerance", pn, what, e);
    free(g), free(h);
  }
  free(raw);
}

static void lp_linear(int n, int in, int out, int bias, int with_dx,
                      float dx_beta) {
  const int64_t nx = (int64_t)n * in, nw = (int64_t)out * in,
                ny = (int64_t)n * out;
  char name[96], what[128];
  snprintf(name, sizeof name, "linear n=%d in=%d out=%d%s%s dx_beta=%g", n, in,
           out, bias ? "" : " (no bias)", with_dx ? "" : " (no dx)",
           (double)dx_beta);
  void *x = trandn(nx, 1), *W = trandn(nw, 0.3);
  void *b = bias ? trandn(out, 0.5) : NULL, *y = trandn(ny, 1);
  void *dy = trandn(ny, 1), *dx = trandn(nx, 1), *dW = trandn(nw, 1);
  void *db = trandn(out, 1);
  void *gx = tup(x, nx), *gW = tup(W, nw), *gb = bias ? tup(b, out) : NULL;
  void *gy = tup(y, ny), *gdy = tup(dy, ny), *gdx = tup(dx, nx);
  void *gdW = tup(dW, nw), *gdb = tup(db, out);

  C->linear_fwd(x, W, b, y, n, in, out);
  G->linear_fwd(gx, gW, gb, gy, n, in, out);
  snprintf(what, sizeof what, "%s: y", name);
  tsame(what, gy, y, ny, 0);
  C->linear_bwd(x, W, dy, with_dx ? dx : NULL, dx_beta, dW, bias ? db : NULL, n,
                in, out);
  G->linear_bwd(gx, gW, gdy, with_dx ? gdx : NULL, dx_beta, gdW,
                bias ? gdb : NULL, n, in, out);
  snprintf(what, sizeof what, "%s: dW (+=)", name);
  tsame(what, gdW, dW, nw, 0);
  snprintf(what, sizeof what, "%s: db (+=)", name);
  tsame(what, gdb, db, out, 0);
  snprintf(what, sizeof what, "%s: dx", name);
  tsame(what, gdx, dx, nx, 0);
  free(x), free(W), free(b), free(y), free(dy), free(dx), free(dW), free(db);
  G->free(gx), G->free(gW), G->free(gb), G->free(gy), G->free(gdy);
  G->free(gdx), G->free(gdW), G->free(gdb);
}

/* A LayerNorm backward's three gradients, device (g*) against the CPU
 * model's, named "<op> n=N h=H: <dx_name>", "...: dg (+=)", "db (+=)". */
static void lp_ln_grads(const char *op, const char *dx_name, int n, int h,
                        const void *gdx, const void *dx, const void *gdg,
                        const void *dg, const void *gdb, const void *db) {
  char what[96];
  snprintf(what, sizeof what, "%s n=%d h=%d: %s", op, n, h, dx_name);
  tsame(what, gdx, dx, (int64_t)n * h, 0);
  snprintf(what, sizeof what, "%s n=%d h=%d: dg (+=)", op, n, h);
  tsame(what, gdg, dg, h, 0);
  snprintf(what, sizeof what, "%s n=%d h=%d: db (+=)", op, n, h);
  tsame(what, gdb, db, h, 0);
}

/* The fused pairs in precision P (fused kernels, or with PLAIN the two
 * calls each): add_layernorm_fwd in place against the CPU model's add and
 * layernorm_fwd (bert_add_layernorm_fwd composes them), the sum bit for
 * bit; layernorm_bwd2 against its layernorm_bwd and copy, dx2 the GPU's
 * dx bit for bit. */
static void lp_fused_layernorm(int n, int h) {
  const int64_t nx = (int64_t)n * h;
  char what[96];
  void *a = trandn(nx, 2), *res = trandn(nx, 1), *g = trandn(h, 1);
  void *b = trandn(h, 1), *y = xmalloc(ES * (size_t)nx);
  void *dy = trandn(nx, 1), *dx = xmalloc(ES * (size_t)nx);
  void *dx2 = xmalloc(ES * (size_t)nx), *dg = trandn(h, 1), *db = trandn(h, 1);
  float *mean = xmalloc(sizeof(float) * n), *rstd = xmalloc(sizeof(float) * n);
  void *ga = tup(a, nx), *gres = tup(res, nx), *gg = tup(g, h), *gb = tup(b, h);
  void *gy = tdev(nx), *gdy = tup(dy, nx), *gdx = tdev(nx), *gdx2 = tdev(nx);
  void *gdg = tup(dg, h), *gdb = tup(db, h);
  float *gmean = G->alloc(sizeof(float) * n),
        *grstd = G->alloc(sizeof(float) * n);

  bert_add_layernorm_fwd(C, a, res, g, b, 1e-12f, a, y, mean, rstd, n, h);
  bert_add_layernorm_fwd(G, ga, gres, gg, gb, 1e-12f, ga, gy, gmean, grstd, n,
                         h);
  snprintf(what, sizeof what, "add_layernorm_fwd n=%d h=%d: sum (in place)", n,
           h);
  tsame(what, ga, a, nx, 1);
  snprintf(what, sizeof what, "add_layernorm_fwd n=%d h=%d: y", n, h);
  tsame(what, gy, y, nx, 0);
  snprintf(what, sizeof what, "%s add_layernorm_fwd n=%d h=%d: mean, rstd",
           plabel(), n, h);
  same(what, gmean, mean, n, TOL_LAYER);
  same(what, grstd, rstd, n, TOL_LAYER);
  bert_layernorm_bwd2(C, a, mean, rstd, g, dy, dx, dx2, dg, db, n, h);
  bert_layernorm_bwd2(G, ga, gmean, grstd, gg, gdy, gdx, gdx2, gdg, gdb, n, h);
  lp_ln_grads("layernorm_bwd2", "dx", n, h, gdx, dx, gdg, dg, gdb, db);
  void *h1 = xmalloc(ES * (size_t)nx), *h2 = xmalloc(ES * (size_t)nx);
  G->to_host(h1, gdx, ES * (size_t)nx);
  G->to_host(h2, gdx2, ES * (size_t)nx);
  ok(memcmp(h1, h2, ES * (size_t)nx) == 0,
     "%s layernorm_bwd2 n=%d h=%d: dx2 is dx bit for bit", plabel(), n, h);
  free(h1), free(h2);
  free(a), free(res), free(g), free(b), free(y), free(dy), free(dx), free(dx2);
  free(dg), free(db), free(mean), free(rstd);
  G->free(ga), G->free(gres), G->free(gg), G->free(gb), G->free(gy);
  G->free(gdy), G->free(gdx), G->free(gdx2), G->free(gdg), G->free(gdb);
  G->free(gmean), G->free(grstd);
}

static void lp_layernorm(int n, int h) {
  const int64_t nx = (int64_t)n * h;
  char what[96];
  float *fx = randn(nx, 2);
  for (int64_t i = 0; i < nx; i++)
    fx[i] += 3.0f; /* a mean far from 0 */
  void *x = to_t(fx, nx), *g = trandn(h, 1), *b = trandn(h, 1);
  void *y = xmalloc(ES * (size_t)nx), *dy = trandn(nx, 1);
  void *dg = trandn(h, 1), *db = trandn(h, 1);
  float *mean = xmalloc(sizeof(float) * n), *rstd = xmalloc(sizeof(float) * n);
  void *gx = tup(x, nx), *gg = tup(g, h), *gb = tup(b, h), *gy = tdev(nx);
  float *gmean = G->alloc(sizeof(float) * n),
        *grstd = G->alloc(sizeof(float) * n);
  void *gdy = tup(dy, nx), *gdg = tup(dg, h), *gdb = tup(db, h);

  C->layernorm_fwd(x, g, b, 1e-12f, y, mean, rstd, n, h);
  G->layernorm_fwd(gx, gg, gb, 1e-12f, gy, gmean, grstd, n, h);
  snprintf(what, sizeof what, "layernorm n=%d h=%d: y", n, h);
  tsame(what, gy, y, nx, 0);
  snprintf(what, sizeof what, "%s layernorm n=%d h=%d: mean (float32)",
           plabel(), n, h);
  same(what, gmean, mean, n, TOL_LAYER);
  snprintf(what, sizeof what, "%s layernorm n=%d h=%d: rstd (float32)",
           plabel(), n, h);
  same(what, grstd, rstd, n, TOL_LAYER);
  /* backward in place (dx aliases dy), as the contract allows */
  C->layernorm_bwd(x, mean, rstd, g, dy, dy, dg, db, n, h);
  G->layernorm_bwd(gx, gmean, grstd, gg, gdy, gdy, gdg, gdb, n, h);
  lp_ln_grads("layernorm", "dx (aliasing dy)", n, h, gdy, dy, gdg, dg, gdb, db);
  free(x), free(g), free(b), free(y), free(mean), free(rstd), free(dy);
  free(dg), free(db);
  G->free(gx), G->free(gg), G->free(gb), G->free(gy), G->free(gmean);
  G->free(grstd), G->free(gdy), G->free(gdg), G->free(gdb);
  lp_fused_layernorm(n, h);
}

static void lp_gelu(int64_t n) {
  void *x = trandn(n, 3), *dy = trandn(n, 1), *y = xmalloc(ES * (size_t)n);
  void *gx = tup(x, n), *gy = tdev(n), *gdy = tup(dy, n);
  C->gelu_fwd(x, y, n);
  G->gelu_fwd(gx, gy, n);
  tsame("gelu forward", gy, y, n, 0);
  C->gelu_bwd(x, dy, dy, n); /* in place */
  G->gelu_bwd(gx, gdy, gdy, n);
  tsame("gelu backward (dx aliasing dy)", gdy, dy, n, 0);
  free(x), free(dy), free(y);
  G->free(gx), G->free(gy), G->free(gdy);
}

/* With `flash` (bert_cuda_set_flash(1) and a shape it takes), probs
 * holds the flash kernels' state, not probabilities: ctx is compared,
 * and backward runs from the GPU's own forward. */
static void attention_case(int B, int S, int A, int dh, const int32_t *lengths,
                           int flash) {
  const int64_t nh = (int64_t)B * S * A * dh, np = (int64_t)B * A * S * S;
  char name[128], what[160];
  snprintf(name, sizeof name, "%sattention B=%d S=%d A=%d dh=%d%s",
           flash ? "flash " : "", B, S, A, dh, lengths ? " (padding)" : "");
  if (flash)
    is_int(1, bert_cuda_flash_fits(P, S, A, dh), "%s %s: flash fits", plabel(),
           name);
  void *q = trandn(nh, 1), *k = trandn(nh, 1), *v = trandn(nh, 1);
  void *probs = xmalloc(ES * (size_t)np), *ctx = xmalloc(ES * (size_t)nh);
  void *dctx = trandn(nh, 1), *dq = xmalloc(ES * (size_t)nh);
  void *dk = xmalloc(ES * (size_t)nh), *dv = xmalloc(ES * (size_t)nh);
  float *scratch = xmalloc(sizeof(float) * (size_t)S * S);
  void *gq = tup(q, nh), *gk = tup(k, nh), *gv = tup(v, nh);
  int32_t *glen = upi(lengths, B);
  void *gprobs = tdev(np), *gctx = tdev(nh), *gdctx = tup(dctx, nh);
  void *gdq = tdev(nh), *gdk = tdev(nh), *gdv = tdev(nh);

  C->attention_fwd(q, k, v, lengths, probs, ctx, B, S, A, dh);
  G->attention_fwd(gq, gk, gv, glen, gprobs, gctx, B, S, A, dh);
  if (!flash) {
    snprintf(what, sizeof what, "%s: probs", name);
    tsame(what, gprobs, probs, np, 0);
  }
  snprintf(what, sizeof what, "%s: ctx", name);
  tsame(what, gctx, ctx, nh, 0);
  /* backward from the same probabilities: the CPU's on both */
  if (!flash)
    G->to_device(gprobs, probs, ES * (size_t)np);
  C->attention_bwd(q, k, v, probs, dctx, dq, dk, dv, scratch, B, S, A, dh);
  G->attention_bwd(gq, gk, gv, gprobs, gdctx, gdq, gdk, gdv, NULL, B, S, A, dh);
  snprintf(what, sizeof what, "%s: dq", name);
  tsame(what, gdq, dq, nh, 0);
  snprintf(what, sizeof what, "%s: dk", name);
  tsame(what, gdk, dk, nh, 0);
  snprintf(what, sizeof what, "%s: dv", name);
  tsame(what, gdv, dv, nh, 0);
  free(q), free(k), free(v), free(probs), free(ctx), free(dctx), free(dq);
  free(dk), free(dv), free(scratch);
  G->free(gq), G->free(gk), G->free(gv), G->free(glen), G->free(gprobs);
  G->free(gctx), G->free(gdctx), G->free(gdq), G->free(gdk), G->free(gdv);
}

static void lp_attention(int B, int S, int A, int dh, const int32_t *lengths) {
  attention_case(B, S, A, dh, lengths, 0);
}

/* Flash attention in precision P: a last tile of 16 keys, padding (a
 * sequence of length 0: uniform weights), three tiles without lengths;
 * and the shapes it does not take. */
static void test_flash(void) {
  static const int32_t len2[2] = {80, 37}, len1[1] = {0};
  bert_cuda_set_flash(1);
  attention_case(2, 80, 2, 64, len2, 1);
  attention_case(1, 72, 3, 64, len1, 1);
  attention_case(3, 150, 2, 64, NULL, 1);
  ok(!bert_cuda_flash_fits(P, 64, 2, 64) &&
         !bert_cuda_flash_fits(P, 128, 2, 32) &&
         !bert_cuda_flash_fits(BERT_FP32, 128, 2, 64),
     "%s: flash does not take S 64, dh 32 or float32", plabel());
  bert_cuda_set_flash(0);
  ok(!bert_cuda_flash_fits(P, 128, 2, 64), "%s: flash off: not taken",
     plabel());
}

static void lp_embedding(int B, int S, int H, int V, int with_types) {
  const int64_t N = (int64_t)B * S, nw = (int64_t)V * H, np = (int64_t)S * H;
  char name[96], what[128];
  snprintf(name, sizeof name, "embedding B=%d S=%d H=%d V=%d%s", B, S, H, V,
           with_types ? "" : " (no types)");
  int32_t *ids = randi(N, 0, V); /* V small: ids repeat */
  int32_t *types = with_types ? randi(N, 0, 2) : NULL;
  void *word = trandn(nw, 1), *pos = trandn(np, 1), *type = trandn(2 * H, 1);
  void *out = xmalloc(ES * (size_t)(N * H)), *dout = trandn(N * H, 1);
  void *dword = trandn(nw, 1), *dpos = trandn(np, 1);
  void *dtype = trandn(2 * H, 1);
  int32_t *gids = upi(ids, N), *gtypes = upi(types, N);
  void *gword = tup(word, nw), *gpos = tup(pos, np), *gtype = tup(type, 2 * H);
  void *gout = tdev(N * H), *gdout = tup(dout, N * H);
  void *gdword = tup(dword, nw), *gdpos = tup(dpos, np);
  void *gdtype = tup(dtype, 2 * H);

  C->embedding_fwd(ids, types, word, pos, type, out, B, S, H);
  G->embedding_fwd(gids, gtypes, gword, gpos, gtype, gout, B, S, H);
  snprintf(what, sizeof what, "%s: forward", name);
  tsame(what, gout, out, N * H, 0);
  C->embedding_bwd(ids, types, dout, dword, dpos, dtype, B, S, H);
  G->embedding_bwd(gids, gtypes, gdout, gdword, gdpos, gdtype, B, S, H);
  snprintf(what, sizeof what, "%s: dword (+=, repeated ids)", name);
  tsame(what, gdword, dword, nw, 0);
  snprintf(what, sizeof what, "%s: dpos (+=)", name);
  tsame(what, gdpos, dpos, np, 0);
  snprintf(what, sizeof what, "%s: dtype (+=)", name);
  tsame(what, gdtype, dtype, 2 * H, 0);
  free(ids), free(types), free(word), free(pos), free(type), free(out);
  free(dout), free(dword), free(dpos), free(dtype);
  G->free(gids), G->free(gtypes), G->free(gword), G->free(gpos);
  G->free(gtype), G->free(gout), G->free(gdout), G->free(gdword);
  G->free(gdpos), G->free(gdtype);
}

static void lp_xent(int m, int V) {
  const int64_t n = (int64_t)m * V;
  const char *pn = plabel();
  char what[96];
  float *f = randn(n, 3);
  int32_t *targets = randi(m, 0, V);
  /* the rows of test_xent: a tied maximum (the first index wins), and a
   * target that is the clear maximum (exact in both types) */
  f[5] = f[V - 2] = 50.0f;
  targets[0] = V - 2;
  f[(int64_t)V + 7] = 60.0f;
  targets[1] = 7;
  void *logits = to_t(f, n), *glogits = tup(logits, n);
  int32_t *gtargets = upi(targets, m);
  int64_t c_cpu = -1, c_gpu = -1;
  double l_cpu = C->xent_fwd(logits, targets, m, V, &c_cpu);
  double l_gpu = G->xent_fwd(glogits, gtargets, m, V, &c_gpu);
  is_double(l_cpu, l_gpu, 1e-6 * fabs(l_cpu),
            "%s xent m=%d V=%d: loss sum (%.9g vs %.9g)", pn, m, V, l_gpu,
            l_cpu);
  is_int(c_cpu, c_gpu, "%s xent m=%d V=%d: correct rows (first argmax)", pn, m,
         V);
  snprintf(what, sizeof what, "xent m=%d V=%d: probabilities", m, V);
  tsame(what, glogits, logits, n, 0);
  /* backward from the same probabilities: the CPU's on both */
  G->to_device(glogits, logits, ES * (size_t)n);
  C->xent_bwd(logits, targets, m, V, 0.37f);
  G->xent_bwd(glogits, gtargets, m, V, 0.37f);
  snprintf(what, sizeof what, "xent m=%d V=%d: backward", m, V);
  tsame(what, glogits, logits, n, 0);
  free(logits), free(targets);
  G->free(glogits), G->free(gtargets);
}

static void lp_elementwise(int64_t n) {
  void *a = trandn(n, 1), *b = trandn(n, 1), *y = xmalloc(ES * (size_t)n);
  void *ga = tup(a, n), *gb = tup(b, n), *gy = tdev(n);
  C->add(a, b, y, n);
  G->add(ga, gb, gy, n);
  tsame("add", gy, y, n, 1);
  C->add(a, b, a, n); /* y aliasing a */
  G->add(ga, gb, ga, n);
  tsame("add in place", ga, a, n, 1);
  G->copy(gb, gy, n);
  tsame("copy", gy, b, n, 1);
  memset(y, 0, ES * (size_t)n);
  G->zero(gy, n);
  tsame("zero", gy, y, n, 1);
  free(a), free(b), free(y);
  G->free(ga), G->free(gb), G->free(gy);
}

static void lp_rows(int m, int h, int src_rows) {
  const int64_t ns = (int64_t)src_rows * h, nd = (int64_t)m * h;
  void *src = trandn(ns, 1), *acc = trandn(ns, 1);
  int32_t *rows = randi(m, 0, src_rows); /* repeats */
  void *dst = xmalloc(ES * (size_t)nd);
  void *gsrc = tup(src, ns), *gacc = tup(acc, ns), *gdst = tdev(nd);
  int32_t *grows = upi(rows, m);
  C->gather_rows(src, rows, m, h, dst);
  G->gather_rows(gsrc, grows, m, h, gdst);
  tsame("gather_rows", gdst, dst, nd, 1);
  C->scatter_add_rows(dst, rows, m, h, acc);
  G->scatter_add_rows(gdst, grows, m, h, gacc);
  tsame("scatter_add_rows (+=, repeated rows)", gacc, acc, ns, 0);
  free(src), free(rows), free(dst), free(acc);
  G->free(gsrc), G->free(gacc), G->free(grows), G->free(gdst);
}

static const layer_cases_t lp_cases = {lp_linear,      lp_layernorm, lp_gelu,
                                       lp_attention,   lp_embedding, lp_xent,
                                       lp_elementwise, lp_rows};

/* Every layer in precision p, with the float32 cases' sizes, then at
 * BERT's aligned sizes (the fast algorithms of cuBLASLt's bias epilogue
 * and of the batched products over heads in place: dh 64, rows of 16
 * bytes and more); with `plain`, the plain kernels (bert_cuda_set_plain). */
static void test_precision(int p, int plain) {
  static const int32_t len2[2] = {64, 29};
  P = p;
  PLAIN = plain;
  bert_cuda_set_plain(plain);
  ES = bert_precision_bytes(p);
  R_TOL = p == BERT_BF16 ? 0x1p-6 : 0x1p-9;
  G = bert_cuda_backend(p);
  C = bert_cpu_backend(p);
  if (G == NULL || C == NULL)
    bail("no %s backend (GPU %p, CPU %p)", bert_precision_name(p), (void *)G,
         (void *)C);
  is_int(p, G->precision, "bert_cuda_backend(%s)->precision", plabel());
  run_cases(&lp_cases);
  lp_linear(128, 256, 512, 1, 1, 0.0f);
  lp_linear(64, 512, 128, 1, 1, 1.0f);
  lp_attention(2, 64, 4, 64, len2);
  if (!plain)
    test_flash();
  ok(C->error() == NULL, "%s: the CPU model recorded no failure%s%s", plabel(),
     C->error() ? ": " : "", C->error() ? C->error() : "");
}

/* ---- the model ---------------------------------------------------------- */

#define T_B 3
#define T_S 19

typedef struct ready_log {
  bert_model_t *m;
  cudaStream_t side; /* non-blocking: orders itself only as told */
  cudaEvent_t ev;
  int fences; /* the model's host fences are on: no device wait */
  int calls, order[1024];
  float *snapshot; /* every grad as it was when declared ready */
} ready_log_t;

static void on_ready(void *ctx, int i) {
  ready_log_t *r = ctx;
  int n;
  hvd_param_t *p = bert_model_params(r->m, &n);
  if (r->calls < 1024)
    r->order[r->calls] = i;
  r->calls++;
  if (r->snapshot == NULL)
    return;
  int64_t off = (float *)p[i].grad.data - (float *)p[0].grad.data;
  size_t bytes = sizeof(float) * (size_t)hvd_tensor_numel(&p[i].grad);
  if (p[i].grad.device == HVD_CPU) {
    memcpy(r->snapshot + off, p[i].grad.data, bytes);
    return;
  }
  /* By default the model hands a gradient over once its kernels are
   * queued and hvd orders the collective after the legacy default stream
   * (which the model's blocking stream is ordered with): the copy waits
   * for the device the same way. With host fences the gradient must
   * already be complete: the copy waits for nothing. */
  if (!r->fences && (cudaEventRecord(r->ev, cudaStreamLegacy) != cudaSuccess ||
                     cudaStreamWaitEvent(r->side, r->ev, 0) != cudaSuccess))
    bail("ordering the snapshot of gradient %d failed", i);
  if (cudaMemcpyAsync(r->snapshot + off, p[i].grad.data, bytes,
                      cudaMemcpyDeviceToHost, r->side) != cudaSuccess ||
      cudaStreamSynchronize(r->side) != cudaSuccess)
    bail("snapshot of gradient %d failed", i);
}

static void make_batch(int V, int32_t *ids, int32_t *types, int32_t *lengths,
                       int32_t *labels, bert_batch_t *b) {
  static const int32_t lens[T_B] = {T_S, 7, 1};
  for (int s = 0; s < T_B; s++) {
    lengths[s] = lens[s];
    for (int t = 0; t < T_S; t++) {
      int i = s * T_S + t, real = t < lens[s];
      ids[i] =
          real ? BERT_NUM_SPECIAL + (int32_t)bert__rng_below(
                                        &rng, (uint64_t)V - BERT_NUM_SPECIAL)
               : BERT_PAD_ID;
      types[i] = real && t >= lens[s] / 2;
      labels[i] = BERT_LABEL_IGNORE;
      if (real && bert__rng_uniform(&rng) < 0.3) {
        labels[i] = ids[i];
        ids[i] = BERT_MASK_ID;
      }
    }
  }
  labels[T_S + 2] = 11; /* at least one label in a padded sequence */
  *b = (bert_batch_t){.batch = T_B,
                      .seq_len = T_S,
                      .input_ids = ids,
                      .token_type_ids = types,
                      .lengths = lengths,
                      .labels = labels};
}

static void test_model(void) {
  bert_config_t cfg;
  bert_config_preset(&cfg, "tiny");
  cfg.layers = 2, cfg.hidden = 48, cfg.heads = 3, cfg.ffn = 100;
  cfg.vocab_size = 97, cfg.max_position = 23, cfg.seq_len = T_S;
  cfg.batch = T_B, cfg.seed = 11, cfg.init_std = 0.2f;
  bert_model_t *cpu = NULL, *gpu = NULL;
  if (bert_model_create(&cfg, &cpu) != HVD_SUCCESS)
    bail("CPU model: %s", bert_last_error());
  hvd_result_t rc = bert_model_create_on(&cfg, 0, &gpu);
  if (!is_int(HVD_SUCCESS, rc, "model on cuda:0: create"))
    diag("%s", bert_last_error());
  if (gpu == NULL)
    bail("no GPU model");
  int n, ng;
  hvd_param_t *p = bert_model_params(cpu, &n),
              *pg = bert_model_params(gpu, &ng);
  is_int(n, ng, "model: as many parameters on both");
  int on_dev = 1;
  for (int i = 0; i < ng; i++)
    on_dev &= pg[i].value.device == 0 && pg[i].grad.device == 0 &&
              strcmp(pg[i].name, p[i].name) == 0;
  ok(on_dev, "model: every value and grad tensor has device 0, same names");
  is_int(0, bert_model_device(gpu), "bert_model_device");
  const int64_t W = bert_model_num_weights(cpu);
  float *hv = xmalloc(sizeof(float) * (size_t)W);
  float *hg = xmalloc(sizeof(float) * (size_t)W);
  float *gv = xmalloc(sizeof(float) * (size_t)W);
  float *gg = xmalloc(sizeof(float) * (size_t)W);
  bert_model_get(cpu, 0, hv);
  is_int(HVD_SUCCESS, bert_model_get(gpu, 0, gv), "bert_model_get values");
  ok(memcmp(hv, gv, sizeof(float) * (size_t)W) == 0,
     "model: the same initial weights, bit for bit");

  int32_t ids[T_B * T_S], types[T_B * T_S], lengths[T_B], labels[T_B * T_S];
  bert_batch_t batch;
  make_batch(cfg.vocab_size, ids, types, lengths, labels, &batch);

  ready_log_t rc_cpu = {.m = cpu}, rc_gpu = {.m = gpu};
  rc_cpu.snapshot = xmalloc(sizeof(float) * (size_t)W);
  rc_gpu.snapshot = xmalloc(sizeof(float) * (size_t)W);
  if (cudaStreamCreateWithFlags(&rc_gpu.side, cudaStreamNonBlocking) !=
          cudaSuccess ||
      cudaEventCreateWithFlags(&rc_gpu.ev, cudaEventDisableTiming) !=
          cudaSuccess)
    bail("cudaStreamCreateWithFlags");

  const float lr = 0.05f;
  for (int step = 0; step < 3; step++) {
    bert_output_t oc, og;
    bert_model_zero_grad(cpu);
    bert_model_zero_grad(gpu);
    if (bert_model_forward(cpu, &batch, &oc) != HVD_SUCCESS)
      bail("CPU forward: %s", bert_last_error());
    rc = bert_model_forward(gpu, &batch, &og);
    if (!is_int(HVD_SUCCESS, rc, "step %d: GPU forward", step))
      bail("%s", bert_last_error());
    is_double(oc.loss, og.loss, 1e-5 * fabs(oc.loss),
              "step %d: loss %.7f on the GPU, %.7f on the CPU", step, og.loss,
              oc.loss);
    ok(oc.masked == og.masked && oc.correct == og.correct,
       "step %d: masked %lld/%lld, correct %lld/%lld", step,
       (long long)og.masked, (long long)oc.masked, (long long)og.correct,
       (long long)oc.correct);
    rc_cpu.calls = rc_gpu.calls = 0;
    /* the last step with host fences: each call after its stage's fence */
    rc_gpu.fences = step == 2;
    bert_model_set_host_fences(gpu, rc_gpu.fences);
    bert_model_backward(cpu, on_ready, &rc_cpu);
    rc = bert_model_backward(gpu, on_ready, &rc_gpu);
    if (!is_int(HVD_SUCCESS, rc, "step %d: GPU backward", step))
      bail("%s", bert_last_error());
    ok(rc_cpu.calls == n && rc_gpu.calls == n &&
           memcmp(rc_cpu.order, rc_gpu.order, sizeof(int) * (size_t)n) == 0,
       "step %d: %d gradient-ready calls, in the CPU's order", step,
       rc_gpu.calls);
    bert_model_get(cpu, 1, hg);
    bert_model_get(gpu, 1, gg);
    /* The key bias's gradient is zero in exact arithmetic (softmax does
     * not change when a row of scores shifts by q.b), so both sides hold
     * rounding noise there, which differs by 100% (seen on an H100).
     * Each tensor's error is measured against its own largest value, but
     * never against less than 1% of the model's largest gradient; and
     * the key biases' gradients must be that noise on both sides. */
    double gmax = max_abs(hg, W), worst = 0, kb = 0;
    int worst_i = 0;
    for (int i = 0; i < n; i++) {
      int64_t off = (float *)p[i].grad.data - (float *)p[0].grad.data;
      int64_t m = hvd_tensor_numel(&p[i].grad);
      double e = max_err(gg + off, hg + off, m) /
                 fmax(max_abs(hg + off, m), 1e-2 * gmax);
      if (e > worst)
        worst = e, worst_i = i;
      const char *k = strstr(p[i].name, "attention.self.key.bias");
      if (k != NULL && k[strlen("attention.self.key.bias")] == '\0')
        kb = fmax(kb, fmax(max_abs(hg + off, m), max_abs(gg + off, m)));
    }
    ok(worst <= TOL_MODEL,
       "step %d: every gradient within %.0e (worst %.2e, %s)", step, TOL_MODEL,
       worst, p[worst_i].name);
    ok(gmax > 0 && kb <= 1e-4 * gmax,
       "step %d: the key biases' gradients are rounding noise on both sides "
       "(%.2e of the largest gradient %.2e)",
       step, gmax > 0 ? kb / gmax : 0.0, gmax);
    ok(memcmp(rc_gpu.snapshot, gg, sizeof(float) * (size_t)W) == 0,
       "step %d: each gradient was complete when declared ready (%s)", step,
       rc_gpu.fences ? "host fences: on the host"
                     : "ordered after the legacy stream, as hvd does");
    /* SGD on the host for both, so both continue from their own weights */
    bert_model_get(gpu, 0, gv);
    for (int64_t j = 0; j < W; j++) {
      hv[j] -= lr * hg[j];
      gv[j] -= lr * gg[j];
    }
    bert_model_set(cpu, 0, hv);
    is_int(HVD_SUCCESS, bert_model_set(gpu, 0, gv), "step %d: bert_model_set",
           step);
  }

  /* backward_scaled: 2.5 x the gradients */
  bert_output_t o;
  bert_model_zero_grad(gpu);
  bert_model_forward(gpu, &batch, &o);
  bert_model_backward(gpu, NULL, NULL);
  bert_model_get(gpu, 1, hg);
  bert_model_zero_grad(gpu);
  bert_model_forward(gpu, &batch, &o);
  rc = bert_model_backward_scaled(gpu, 2.5f, NULL, NULL);
  bert_model_get(gpu, 1, gg);
  for (int64_t j = 0; j < W; j++)
    hg[j] *= 2.5f;
  double e = rel_err(gg, hg, W);
  ok(rc == HVD_SUCCESS && e <= TOL_LAYER,
     "backward_scaled(2.5) = 2.5 x backward (relative error %.2e)", e);

  bert_model_set_host_fences(gpu, 0);
  cudaEventDestroy(rc_gpu.ev);
  cudaStreamDestroy(rc_gpu.side);
  free(hv), free(hg), free(gv), free(gg);
  free(rc_cpu.snapshot), free(rc_gpu.snapshot);
  bert_model_destroy(cpu);
  bert_model_destroy(gpu);
}

/* ---- CUDA graphs --------------------------------------------------------- */

/* One forward and backward: the loss, the gradients (as float32) and the
 * ready calls' order (r->order, r->calls). */
static double graph_pass(bert_model_t *m, const bert_batch_t *b, float *grads,
                         ready_log_t *r) {
  bert_output_t o;
  bert_model_zero_grad(m);
  if (bert_model_forward(m, b, &o) != HVD_SUCCESS)
    bail("forward: %s", bert_last_error());
  r->calls = 0;
  if (bert_model_backward(m, on_ready, r) != HVD_SUCCESS)
    bail("backward: %s", bert_last_error());
  bert_model_get(m, 1, grads);
  return o.loss;
}

/* A bf16 model with graphs on (bert_set_cuda_graphs): the first pass
 * captures each layer's forward and backward, the second replays them, a
 * batch of 2 sequences makes new ones, and after the workspace grew
 * (reserve with larger shapes) they are captured again; each pass gives
 * the loss, every gradient bit and the ready calls of the same pass
 * without graphs (the bf16 kernels are deterministic). */
static void test_model_graphs(void) {
  bert_config_t cfg;
  bert_config_preset(&cfg, "tiny");
  cfg.layers = 2, cfg.hidden = 48, cfg.heads = 3, cfg.ffn = 100;
  cfg.vocab_size = 97, cfg.max_position = 23, cfg.seq_len = T_S;
  cfg.batch = T_B, cfg.seed = 11, cfg.init_std = 0.2f;
  cfg.precision = BERT_BF16;
  bert_model_t *m = NULL;
  if (bert_model_create_on(&cfg, 0, &m) != HVD_SUCCESS)
    bail("bf16 model: %s", bert_last_error());
  const int64_t W = bert_model_num_weights(m);
  int32_t ids[T_B * T_S], types[T_B * T_S], lengths[T_B], labels[T_B * T_S];
  bert_batch_t b3, b2;
  make_batch(cfg.vocab_size, ids, types, lengths, labels, &b3);
  b2 = b3;
  b2.batch = 2;
  float *g[2], *got = xmalloc(sizeof(float) * (size_t)W);
  double loss[2];
  ready_log_t want[2] = {{.m = m}, {.m = m}}, r = {.m = m};
  const bert_batch_t *bs[2] = {&b3, &b2};
  for (int k = 0; k < 2; k++) { /* without graphs */
    g[k] = xmalloc(sizeof(float) * (size_t)W);
    loss[k] = graph_pass(m, bs[k], g[k], &want[k]);
  }
  bert_set_cuda_graphs(1);
  static const char *const what[4] = {"captured", "replayed",
                                      "a new shape (2 sequences)",
                                      "captured again (the workspace grew)"};
  for (int pass = 0; pass < 4; pass++) {
    int k = pass == 2;
    if (pass == 3) /* more scratch: the workspace moves */
      bert_cuda_backend(BERT_BF16)->reserve(2 * T_B, 2 * T_S, 3, 16, 4096, 2);
    double l = graph_pass(m, bs[k], got, &r);
    ok(l == loss[k] && memcmp(got, g[k], sizeof(float) * (size_t)W) == 0 &&
           r.calls == want[k].calls &&
           memcmp(r.order, want[k].order, sizeof(int) * (size_t)r.calls) == 0,
       "bf16 with CUDA graphs, %s: the loss, every gradient and the ready "
       "calls of the pass without, bit for bit",
       what[pass]);
  }
  ok(bert_cuda_graphs_off() == NULL, "no capture failed%s%s",
     bert_cuda_graphs_off() ? ": " : "",
     bert_cuda_graphs_off() ? bert_cuda_graphs_off() : "");
  bert_set_cuda_graphs(0);
  free(g[0]), free(g[1]), free(got);
  bert_model_destroy(m);
}

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  gpu_devices_or_skip(e, count);
  char msg[512];
  if (bert_cuda_open(0, msg, sizeof msg) != 0)
    bail("bert_cuda_open(0): %s", msg);
  G = bert_cuda_backend(BERT_FP32);
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    diag("device 0: %s, compute capability %d.%d", prop.name, prop.major,
         prop.minor);
  uint64_t seed = 20240611;
  bert__rng_seed(&rng, &seed, 1);
  /* token types: 2 (the model's); widths up to the largest V below */
  G->reserve(7, 37, 5, 13, 1031, 2);

  static const layer_cases_t f32_cases = {
      test_linear,    test_layernorm, test_gelu,        test_attention,
      test_embedding, test_xent,      test_elementwise, test_rows};
  run_cases(&f32_cases);
  test_precision(BERT_BF16, 0);
  test_precision(BERT_FP16, 0);
  test_precision(BERT_BF16, 1);
  bert_cuda_set_plain(0);
  PLAIN = 0;
  G = bert_cuda_backend(BERT_FP32);
  ok(bert_cuda_backend(3) == NULL, "bert_cuda_backend(3) is NULL");
  ok(G->error() == NULL, "no CUDA or cuBLAS failure recorded%s%s",
     G->error() ? ": " : "", G->error() ? G->error() : "");
  bert_cuda_close();

  test_model();
  test_model_graphs();
  done_testing();
  return tap_exit_status();
}

#endif /* HVD_HAVE_CUDA */
