/*
 * bert_mixed.c - the BERT example in mixed precision on the CPU
 * (examples/bert/layers_lp.c, model.c with precision bf16/fp16):
 *
 * - the host conversions: exact encodings, ties to even, float16's
 *   overflow and subnormals, NaN; every one of the 65536 patterns of each
 *   format round-trips; float16 against the compiler's _Float16;
 * - the rules of layers.h's "Precisions", exactly: each low-precision
 *   entry equals the float32 function on the converted inputs with its
 *   outputs rounded once (linear forward and backward with accumulating
 *   dW/db/dx, LayerNorm, attention with ctx from the rounded
 *   probabilities, the embeddings' gradient with repeated ids rounded
 *   once per row, the cross-entropy);
 * - the model: bfloat16/float16 parameters that are the float32 model's
 *   rounded, a loss and gradients near the float32 model's, and AdamW
 *   (hvd's mixed-precision optimizer: float32 masters; float16 with loss
 *   scaling) whose loss curve tracks the float32 run's;
 * - the config's precision and the refusals.
 *
 * Tolerances (the model): bfloat16 rounds to 8 significant bits (2^-8
 * relative, 3.9e-3), float16 to 11 (4.9e-4), at every layer's output.
 * The initial loss (about 4.8 here) must be within 1e-2 of float32's for
 * bfloat16 (measured 1.5e-4) and 2e-3 for float16 (1.7e-5); the gradient
 * as a whole within 5e-2 relative (L2) for bfloat16 (measured 6e-3) and
 * 1e-2 for float16 (8e-4); over 40 AdamW steps every loss within 3 % of
 * float32's at the same step (measured 0.17 % for bfloat16, 0.02 % for
 * float16 from a loss scale of 1024). From GradScaler's 2^16 the first
 * step overflows float16 and is skipped: the run then lags float32's by
 * a step, so it is checked for what loss scaling promises (skips halve
 * the scale, the loss falls) rather than step for step. A wrong rule (a
 * lost accumulation, a missing rounding, a transposed operand) is off by
 * far more.
 */
#include "data.h"
#include "layers.h"
#include "model.h"
#include "tap.h"
#include "util.h"

#include <hvd.h>

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bert_rng_t rng;

/* A tensor's bytes (libbert's tests do not see lib/base). */
static size_t tensor_bytes(const hvd_tensor_t *t) {
  return (size_t)hvd_tensor_numel(t) * hvd_dtype_size(t->dtype);
}

static float uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)bert__rng_uniform(&rng);
}

static uint16_t enc(int p, float f) {
  uint16_t h;
  bert_from_float(p, &f, &h, 1);
  return h;
}

static float dec(int p, uint16_t h) {
  float f;
  bert_to_float(p, &h, &f, 1);
  return f;
}

/* ---- conversions --------------------------------------------------------- */

static void test_encodings(void) {
  const int B = BERT_BF16, F = BERT_FP16;
  is_int(0x3f80, enc(B, 1.0f), "bf16(1) = 0x3f80");
  is_int(0xc000, enc(B, -2.0f), "bf16(-2) = 0xc000");
  is_int(0x3f80, enc(B, 1.0f + 0x1p-8f), "bf16(1 + 2^-8): a tie, to even");
  is_int(0x3f82, enc(B, 1.0f + 3 * 0x1p-8f),
         "bf16(1 + 3 2^-8): a tie, up to even");
  is_int(0x3f81, enc(B, 1.0f + 0x1p-8f + 0x1p-20f),
         "bf16(1 + 2^-8 + 2^-20): above the tie");
  is_int(0x7f80, enc(B, INFINITY), "bf16(inf)");
  is_int(0x7f80, enc(B, 3.4028235e38f), "bf16(FLT_MAX) rounds to inf");
  ok(isnan(dec(B, enc(B, NAN))), "bf16(NaN) is a NaN");
  is_int(0x3c00, enc(F, 1.0f), "fp16(1) = 0x3c00");
  is_int(0x8000, enc(F, -0.0f), "fp16(-0) = 0x8000");
  is_int(0x7bff, enc(F, 65504.0f), "fp16(65504) = 0x7bff, the largest");
  is_int(0x7bff, enc(F, 65519.0f), "fp16(65519) = 0x7bff");
  is_int(0x7c00, enc(F, 65520.0f), "fp16(65520): a tie, to inf");
  is_int(0x0400, enc(F, 0x1p-14f), "fp16(2^-14) = 0x0400, the least normal");
  is_int(0x0001, enc(F, 0x1p-24f), "fp16(2^-24) = 0x0001, the least subnormal");
  is_int(0x0000, enc(F, 0x1p-25f), "fp16(2^-25): a tie, to 0");
  is_int(0x0002, enc(F, 3 * 0x1p-25f), "fp16(3 2^-25): a tie, to even 2");
  is_int(0x3c00, enc(F, 1.0f + 0x1p-11f), "fp16(1 + 2^-11): a tie, to even");
  is_int(0x3c02, enc(F, 1.0f + 3 * 0x1p-11f), "fp16(1 + 3 2^-11): up to even");
  ok(isnan(dec(F, enc(F, NAN))), "fp16(NaN) is a NaN");
  ok(dec(F, 0x0001) == 0x1p-24f && dec(F, 0x7c00) == INFINITY &&
         dec(B, 0xff80) == -INFINITY,
     "decodings: 0x0001 = 2^-24, 0x7c00 = inf, bf16 0xff80 = -inf");
  is_string("bf16", bert_precision_name(BERT_BF16), "precision name bf16");
  ok(bert_precision_name(7) == NULL && bert_precision_bytes(BERT_FP16) == 2 &&
         bert_precision_bytes(BERT_FP32) == 4,
     "no name for precision 7; 2 and 4 bytes");
}

static void test_round_trips(void) {
  for (int p = BERT_BF16; p <= BERT_FP16; p++) {
    int bad = 0;
    for (uint32_t u = 0; u <= 0xffff; u++) {
      float f = dec(p, (uint16_t)u);
      uint16_t back = enc(p, f);
      if (isnan(f) ? !isnan(dec(p, back)) : back != u)
        bad++;
    }
    is_int(0, bad, "%s: all 65536 patterns round-trip through float32",
           bert_precision_name(p));
  }
#ifdef __FLT16_MAX__
  int bad = 0;
  for (int i = 0; i < 200000; i++) {
    float f = ldexpf(uniform(-1, 1), (int)(bert__rng_below(&rng, 44)) - 28);
    _Float16 h = (_Float16)f;
    uint16_t want;
    memcpy(&want, &h, sizeof want);
    bad += enc(BERT_FP16, f) != want;
  }
  is_int(0, bad, "fp16: 200000 floats from 2^-28 to 2^16 encode as _Float16");
#else
  skip(1, "no _Float16 in this compiler");
#endif
}

/* ---- the rules ----------------------------------------------------------- */

/* n random T values in [-a, a], and their float32 twin. */
static void *rnd(int p, int64_t n, float a, float **f) {
  *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  void *t = malloc(2 * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++)
    (*f)[i] = uniform(-a, a);
  bert_from_float(p, *f, t, n);
  bert_to_float(p, t, *f, n);
  return t;
}

/* Whether T array t equals the float32 f rounded (once). */
static int same(int p, const void *t, const float *f, int64_t n) {
  uint16_t *want = malloc(2 * (size_t)(n > 0 ? n : 1));
  bert_from_float(p, f, want, n);
  int eq = memcmp(want, t, 2 * (size_t)n) == 0;
  free(want);
  return eq;
}

/* want = old + add (float32), the accumulation's exact expectation */
static float *plus(const float *old, const float *add, int64_t n) {
  float *s = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    s[i] = old[i] + add[i];
  return s;
}

static void test_linear_rules(int p, const bert_backend_t *k) {
  enum { N = 13, IN = 21, OUT = 17 };
  const char *name = bert_precision_name(p);
  float *x, *W, *b, *dy, *dW0, *db0, *dx0;
  void *tx = rnd(p, N * IN, 1, &x), *tW = rnd(p, OUT * IN, 0.5f, &W),
       *tb = rnd(p, OUT, 1, &b), *tdy = rnd(p, N * OUT, 1, &dy),
       *tdW = rnd(p, OUT * IN, 1, &dW0), *tdb = rnd(p, OUT, 1, &db0),
       *tdx = rnd(p, N * IN, 1, &dx0), *ty = malloc(2 * N * OUT);
  float y[N * OUT], dW[OUT * IN] = {0}, db[OUT] = {0}, dx[N * IN];
  k->linear_fwd(tx, tW, tb, ty, N, IN, OUT);
  bert_linear_fwd(x, W, b, y, N, IN, OUT);
  ok(same(p, ty, y, N * OUT),
     "%s linear_fwd = round(x W^T + b), the float32 result rounded once",
     name);
  k->linear_bwd(tx, tW, tdy, tdx, 1.0f, tdW, tdb, N, IN, OUT);
  bert_linear_bwd(x, W, dy, dx, 0.0f, dW, db, N, IN, OUT);
  float *wdW = plus(dW0, dW, OUT * IN), *wdb = plus(db0, db, OUT),
        *wdx = plus(dx0, dx, N * IN);
  ok(same(p, tdW, wdW, OUT * IN) && same(p, tdb, wdb, OUT) &&
         same(p, tdx, wdx, N * IN),
     "%s linear_bwd: dW, db and dx (beta 1) = round(old + float32 sum)", name);
  k->linear_bwd(tx, tW, tdy, tdx, 0.0f, tdW, NULL, N, IN, OUT);
  ok(same(p, tdx, dx, N * IN), "%s linear_bwd: dx (beta 0) = round(dy W)",
     name);
  free(wdW), free(wdb), free(wdx);
  free(x), free(W), free(b), free(dy), free(dW0), free(db0), free(dx0);
  free(tx), free(tW), free(tb), free(tdy), free(tdW), free(tdb), free(tdx);
  free(ty);
}

static void test_layernorm_rules(int p, const bert_backend_t *k) {
  enum { N = 9, H = 33 };
  const char *name = bert_precision_name(p);
  float *x, *g, *b;
  void *tx = rnd(p, N * H, 2, &x), *tg = rnd(p, H, 1, &g),
       *tb = rnd(p, H, 1, &b), *ty = malloc(2 * N * H);
  float y[N * H], mean[N], rstd[N], tmean[N], trstd[N];
  k->layernorm_fwd(tx, tg, tb, 1e-5f, ty, tmean, trstd, N, H);
  bert_layernorm_fwd(x, g, b, 1e-5f, y, mean, rstd, N, H);
  ok(same(p, ty, y, N * H) && memcmp(mean, tmean, sizeof mean) == 0 &&
         memcmp(rstd, trstd, sizeof rstd) == 0,
     "%s layernorm_fwd: y rounded once, mean and rstd float32 exactly", name);
  free(x), free(g), free(b), free(tx), free(tg), free(tb), free(ty);
}

/* x rounded to T and back, in place (bert__attention_bwd_rounding's
 * hook). */
static void to_t(float *x, int64_t n, int p) {
  void *t = malloc(2 * (size_t)n);
  bert_from_float(p, x, t, n);
  bert_to_float(p, t, x, n);
  free(t);
}

static void test_attention_rules(int p, const bert_backend_t *k) {
  enum { B = 2, S = 7, A = 2, DH = 5, H = A * DH };
  const char *name = bert_precision_name(p);
  static const int32_t lengths[B] = {7, 4};
  float *q, *kk, *v;
  void *tq = rnd(p, B * S * H, 1, &q), *tk = rnd(p, B * S * H, 1, &kk),
       *tv = rnd(p, B * S * H, 1, &v), *tp = malloc(2 * B * A * S * S),
       *tc = malloc(2 * B * S * H);
  float probs[B * A * S * S], ctx[B * S * H];
  k->attention_fwd(tq, tk, tv, lengths, tp, tc, B, S, A, DH);
  bert_attention_fwd(q, kk, v, lengths, probs, ctx, B, S, A, DH);
  int probs_ok = same(p, tp, probs, B * A * S * S);
  /* ctx from the rounded probabilities */
  bert_to_float(p, tp, probs, B * A * S * S);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < A; h++)
      for (int i = 0; i < S; i++)
        for (int d = 0; d < DH; d++) {
          float s = 0;
          for (int j = 0; j < S; j++)
            s += probs[((b * A + h) * S + i) * S + j] *
                 v[(b * S + j) * H + h * DH + d];
          ctx[(b * S + i) * H + h * DH + d] = s;
        }
  float got[B * S * H];
  bert_to_float(p, tc, got, B * S * H);
  double worst = 0;
  for (int i = 0; i < B * S * H; i++)
    worst = fmax(worst, fabs(got[i] - ctx[i]) / (fabs(ctx[i]) + 1e-3));
  ok(probs_ok && worst <= (p == BERT_BF16 ? 0x1p-8 : 0x1p-11) * 1.01,
     "%s attention_fwd: probs rounded once; ctx = round(probs_T v) (worst "
     "%.2e of one rounding)",
     name, worst);
  /* backward from the stored probabilities, dS rounded to T */
  float *dc, dq[B * S * H], dk[B * S * H], dv[B * S * H], scratch[S * S];
  void *tdc = rnd(p, B * S * H, 1, &dc), *g = malloc(3 * 2 * B * S * H);
  bert_to_float(p, tp, probs, B * A * S * S);
  k->attention_bwd(tq, tk, tv, tp, tdc, g, (char *)g + 2 * B * S * H,
                   (char *)g + 4 * B * S * H, NULL, B, S, A, DH);
  bert__attention_bwd_rounding(q, kk, v, probs, dc, dq, dk, dv, scratch, B, S,
                               A, DH, to_t, p);
  ok(same(p, g, dq, B * S * H) && same(p, (char *)g + 2 * B * S * H, dk,
                                       B * S * H) &&
         same(p, (char *)g + 4 * B * S * H, dv, B * S * H),
     "%s attention_bwd: from the stored probabilities, dS rounded to T, dq "
     "dk dv rounded once",
     name);
  free(dc), free(tdc), free(g);
  free(q), free(kk), free(v), free(tq), free(tk), free(tv), free(tp), free(tc);
}

static void test_embedding_rules(int p, const bert_backend_t *k) {
  enum { B = 2, S = 5, H = 6, V = 4 };
  const char *name = bert_precision_name(p);
  static const int32_t ids[B * S] = {1, 1, 1, 2, 1, 3, 1, 1, 2, 1};
  float *dout, *dw0;
  void *td = rnd(p, B * S * H, 1, &dout), *tw = rnd(p, V * H, 1, &dw0);
  float add[V * H] = {0};
  bert_embedding_bwd(ids, NULL, dout, add, NULL, NULL, B, S, H);
  k->embedding_bwd(ids, NULL, td, tw, NULL, NULL, B, S, H);
  float *want = plus(dw0, add, V * H);
  ok(same(p, tw, want, V * H),
     "%s embedding_bwd: id 1 seven times, one rounding of its row's float32 "
     "sum; row 0 (no token) unchanged",
     name);
  free(want), free(dout), free(dw0), free(td), free(tw);
}

static void test_xent_rules(int p, const bert_backend_t *k) {
  enum { M = 3, V = 11 };
  const char *name = bert_precision_name(p);
  static const int32_t targets[M] = {0, 5, 10};
  float *logits;
  void *tl = rnd(p, M * V, 4, &logits);
  int64_t c1 = -1, c2 = -2;
  double l1 = k->xent_fwd(tl, targets, M, V, &c1);
  double l2 = bert_xent_fwd(logits, targets, M, V, &c2);
  ok(l1 == l2 && c1 == c2 && same(p, tl, logits, M * V),
     "%s xent_fwd: the loss and hits of the float32 kernel on the converted "
     "logits (%.6f), probabilities rounded once",
     name, l1);
  bert_to_float(p, tl, logits, M * V);
  k->xent_bwd(tl, targets, M, V, 0.25f);
  bert_xent_bwd(logits, targets, M, V, 0.25f);
  ok(same(p, tl, logits, M * V), "%s xent_bwd: round(scale (p - onehot))",
     name);
  free(logits), free(tl);
}

/* ---- the model ----------------------------------------------------------- */

typedef struct run {
  bert_model_t *m;
  hvd_optimizer_t *opt;
  double loss[40];
  int skipped; /* steps skipped for an overflow */
} run_t;

static bert_dataset_t *data;

static void batch_of(int step, int32_t *ids, int32_t *labels, int32_t *lengths,
                     bert_batch_t *b) {
  int64_t idx[8];
  for (int i = 0; i < 8; i++)
    idx[i] = (step * 8 + i) % 64;
  bert_dataset_batch(data, idx, 8, 0, ids, NULL, labels, lengths);
  *b = (bert_batch_t){.batch = 8,
                      .seq_len = 32,
                      .input_ids = ids,
                      .lengths = lengths,
                      .labels = labels};
}

static bert_model_t *model(int precision) {
  bert_config_t c;
  bert_config_preset(&c, "tiny");
  c.vocab_size = bert_vocab_size(bert_dataset_vocab(data));
  c.precision = precision;
  bert_model_t *m = NULL;
  if (bert_model_create(&c, &m) != HVD_SUCCESS)
    bail("create (%d): %s", precision, bert_last_error());
  return m;
}

/* 40 AdamW steps; the losses into r->loss. init_scale > 0: loss scaling
 * from that scale. */
static void train(run_t *r, int precision, double init_scale) {
  r->m = model(precision);
  int n;
  hvd_param_t *p = bert_model_params(r->m, &n);
  hvd_adam_options_t o;
  hvd_adam_options_init(&o);
  o.lr = 3e-3, o.decoupled = 1, o.weight_decay = 0.01;
  if (hvd_adam_create(p, n, &o, &r->opt) != HVD_SUCCESS)
    bail("adam: %s", hvd_last_error());
  hvd_loss_scale_options_t so;
  hvd_loss_scale_options_init(&so);
  so.init_scale = init_scale;
  if (init_scale > 0 && hvd_optimizer_set_loss_scaling(r->opt, &so) != 0)
    bail("loss scaling: %s", hvd_last_error());
  r->skipped = 0;
  int32_t ids[8 * 32], labels[8 * 32], lengths[8];
  for (int s = 0; s < 40; s++) {
    bert_batch_t b;
    bert_output_t out;
    batch_of(s, ids, labels, lengths, &b);
    hvd_optimizer_zero_grad(r->opt);
    bert_model_forward(r->m, &b, &out);
    bert_model_backward_scaled(r->m, (float)hvd_optimizer_loss_scale(r->opt),
                               NULL, NULL);
    hvd_optimizer_step(r->opt);
    r->loss[s] = out.loss;
    r->skipped += hvd_optimizer_step_skipped(r->opt);
  }
}

static void no_rows(void *ctx, int i, const int32_t *rows, int64_t n,
                    const float *values) {
  (void)ctx, (void)i, (void)rows, (void)n, (void)values;
}

static void test_model_start(int p) {
  const char *name = bert_precision_name(p);
  bert_model_t *f = model(BERT_FP32), *m = model(p);
  int n;
  hvd_param_t *params = bert_model_params(m, &n);
  is_int(p == BERT_BF16 ? HVD_BFLOAT16 : HVD_FLOAT16, params[0].value.dtype,
         "%s model: params are %s", name, name);
  int64_t W = bert_model_num_weights(m);
  float *a = malloc(sizeof(float) * W), *b = malloc(sizeof(float) * W),
        *ga = malloc(sizeof(float) * W), *gb = malloc(sizeof(float) * W);
  void *t = malloc(2 * (size_t)W);
  bert_model_get(f, 0, a);
  bert_model_get(m, 0, b);
  bert_from_float(p, a, t, W);
  ok(same(p, t, b, W) && memcmp(params[0].value.data, t, 2 * (size_t)W) == 0,
     "%s model: the initial weights are float32's rounded", name);
  int32_t ids[8 * 32], labels[8 * 32], lengths[8];
  bert_batch_t batch;
  batch_of(0, ids, labels, lengths, &batch);
  bert_output_t of, om;
  bert_model_forward(f, &batch, &of);
  bert_model_forward(m, &batch, &om);
  bert_model_backward(f, NULL, NULL);
  bert_model_backward(m, NULL, NULL);
  bert_model_get(f, 1, ga);
  bert_model_get(m, 1, gb);
  double d2 = 0, n2 = 0;
  for (int64_t i = 0; i < W; i++)
    d2 += (ga[i] - gb[i]) * (double)(ga[i] - gb[i]), n2 += ga[i] * (double)ga[i];
  double gerr = sqrt(d2 / n2), lerr = fabs(om.loss - of.loss);
  ok(lerr <= (p == BERT_BF16 ? 1e-2 : 2e-3) && om.masked == of.masked,
     "%s model: loss %.5f vs float32 %.5f (|diff| %.1e)", name, om.loss,
     of.loss, lerr);
  ok(gerr <= (p == BERT_BF16 ? 5e-2 : 1e-2),
     "%s model: gradient within %.2e of float32's (L2, relative)", name, gerr);
  bert_model_set(m, 0, a);
  ok(memcmp(params[0].value.data, t, 2 * (size_t)W) == 0,
     "%s model: bert_model_set rounds float32 values", name);
  is_int(HVD_ERR_UNSUPPORTED, bert_model_set_sparse_embeddings(m, no_rows, NULL),
         "%s model: sparse embeddings refused", name);
  char want[128];
  snprintf(want, sizeof want,
           "bert_model_set_sparse_embeddings: the model is %s; sparse "
           "embedding gradients are float32-only",
           name);
  is_string(want, bert_last_error(), "%s model: the message", name);
  free(a), free(b), free(ga), free(gb), free(t);
  bert_model_destroy(f);
  bert_model_destroy(m);
}

/* Each loss within 3 % of float32's at the same step. */
static void tracks(const run_t *x, const run_t *f, const char *what) {
  double worst = 0;
  for (int s = 0; s < 40; s++)
    worst = fmax(worst, fabs(x->loss[s] - f->loss[s]) / f->loss[s]);
  ok(worst <= 0.03 && x->loss[39] < 0.8 * x->loss[0] && x->skipped == 0,
     "%s AdamW, 40 steps: loss %.4f -> %.4f (float32 %.4f -> %.4f), every "
     "step within %.2f %% of float32's",
     what, x->loss[0], x->loss[39], f->loss[0], f->loss[39], 100 * worst);
}

static void finish(run_t *r) {
  hvd_optimizer_destroy(r->opt);
  bert_model_destroy(r->m);
}

static void test_training(void) {
  run_t f, x;
  train(&f, BERT_FP32, 0);
  train(&x, BERT_BF16, 0);
  tracks(&x, &f, "bf16");
  finish(&x);
  /* float16 from a scale that never overflows here: step for step */
  train(&x, BERT_FP16, 1024);
  tracks(&x, &f, "fp16 (loss scale 1024)");
  finish(&x);
  /* GradScaler's 2^16: what overflows float16 is skipped, on and on */
  train(&x, BERT_FP16, 65536);
  double scale = hvd_optimizer_loss_scale(x.opt);
  int finite = 1;
  for (int s = 0; s < 40; s++)
    finite &= isfinite(x.loss[s]);
  ok(x.skipped >= 1 && scale == ldexp(65536, -x.skipped) &&
         hvd_optimizer_steps(x.opt) == 40 - x.skipped && finite &&
         x.loss[39] < 0.8 * x.loss[0],
     "fp16 from 2^16: %d step(s) skipped for overflow, scale %.0f, %lld "
     "taken, loss %.4f -> %.4f",
     x.skipped, scale, (long long)hvd_optimizer_steps(x.opt), x.loss[0],
     x.loss[39]);
  finish(&x);
  finish(&f);
}

/* ---- the graph path ------------------------------------------------------ */

typedef struct calls {
  bert_model_t *m;
  int n, order[512];
  char *snap; /* every gradient as it was at its call */
} calls_t;

static void on_ready(void *ctx, int i) {
  calls_t *c = ctx;
  int np;
  hvd_param_t *p = bert_model_params(c->m, &np);
  size_t at = (size_t)((char *)p[i].grad.data - (char *)p[0].grad.data);
  memcpy(c->snap + at, p[i].grad.data, tensor_bytes(&p[i].grad));
  if (c->n < 512)
    c->order[c->n++] = i;
}

/* The bytes of all of a model's gradients (one block). */
static size_t grad_bytes(const bert_model_t *m, int precision) {
  return (size_t)bert_model_num_weights(m) * bert_precision_bytes(precision);
}

/* One forward and backward of a fresh model with graphs on or off: the
 * loss, the gradients and the ready calls into *c. */
static double pass(int precision, int graphs, calls_t *c, void **grads) {
  bert_set_cuda_graphs(graphs);
  c->m = model(precision);
  c->n = 0;
  int np;
  hvd_param_t *p = bert_model_params(c->m, &np);
  size_t bytes = grad_bytes(c->m, precision);
  c->snap = calloc(1, bytes);
  int32_t ids[8 * 32], labels[8 * 32], lengths[8];
  bert_batch_t b;
  bert_output_t out;
  batch_of(3, ids, labels, lengths, &b);
  bert_model_forward(c->m, &b, &out);
  bert_model_backward(c->m, on_ready, c);
  *grads = malloc(bytes);
  memcpy(*grads, p[0].grad.data, bytes);
  bert_set_cuda_graphs(0);
  return out.loss;
}

static void test_graph_path(int precision) {
  const char *name = bert_precision_name(precision);
  calls_t a, b;
  void *ga, *gb;
  double la = pass(precision, 0, &a, &ga), lb = pass(precision, 1, &b, &gb);
  int np;
  (void)bert_model_params(a.m, &np);
  size_t bytes = grad_bytes(a.m, precision);
  ok(la == lb && memcmp(ga, gb, bytes) == 0,
     "%s, graph path (each layer one call, its ready calls after): the "
     "same loss and gradients bit for bit",
     name);
  ok(a.n == np && b.n == np && memcmp(a.order, b.order, sizeof(int) * np) == 0,
     "%s, graph path: the ready calls in the same order (%d)", name, b.n);
  ok(memcmp(b.snap, gb, bytes) == 0,
     "%s, graph path: every gradient complete at its call", name);
  bert_model_destroy(a.m);
  bert_model_destroy(b.m);
  free(a.snap), free(b.snap), free(ga), free(gb);
}

static void test_config(void) {
  bert_config_t c;
  bert_config_preset(&c, "tiny");
  is_int(BERT_FP32, c.precision, "presets are float32");
  is_int(HVD_SUCCESS, bert_config_set(&c, "precision", "fp16"),
         "config precision fp16");
  is_int(BERT_FP16, c.precision, "... set");
  char d[128];
  bert_config_describe(&c, d, sizeof d);
  is_string("L=2 H=64 A=2 F=256 V=512 P=128 S=32 B=8 fp16", d,
            "describe names the precision");
  is_int(HVD_ERR_INVALID_ARG, bert_config_set(&c, "precision", "fp8"),
         "precision fp8 refused");
  is_string("model option precision: 'fp8' is not fp32, bf16 or fp16",
            bert_last_error(), "... with the choices");
  c.precision = 9;
  is_int(HVD_ERR_INVALID_ARG, bert_config_check(&c), "precision 9 refused");
  is_string("model config: precision 9 is none of BERT_FP32, BERT_BF16, "
            "BERT_FP16",
            bert_last_error(), "... by the check");
  ok(bert_cpu_backend(9) == NULL && bert_cpu_backend(BERT_FP32) ==
                                        &bert_backend_cpu,
     "bert_cpu_backend: NULL for 9, bert_backend_cpu for fp32");
}

int main(void) {
  uint64_t seed = 77;
  bert__rng_seed(&rng, &seed, 1);
  bert_set_threads(1);
  test_encodings();
  test_round_trips();
  for (int p = BERT_BF16; p <= BERT_FP16; p++) {
    const bert_backend_t *k = bert_cpu_backend(p);
    is_int(p, k->precision, "bert_cpu_backend(%s)", bert_precision_name(p));
    test_linear_rules(p, k);
    test_layernorm_rules(p, k);
    test_attention_rules(p, k);
    test_embedding_rules(p, k);
    test_xent_rules(p, k);
  }
  bert_data_options_t dopt;
  bert_data_options_init(&dopt);
  dopt.seq_len = 32;
  dopt.synthetic_sentences = 400;
  if (bert_dataset_create(&dopt, &data) != HVD_SUCCESS)
    bail("dataset: %s", bert_last_error());
  test_model_start(BERT_BF16);
  test_model_start(BERT_FP16);
  test_training();
  test_graph_path(BERT_FP32);
  test_graph_path(BERT_BF16);
  test_config();
  bert_dataset_destroy(data);
  done_testing();
  return tap_exit_status();
}
