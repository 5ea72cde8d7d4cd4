/*
 * bert_ops.c - where an encoder layer's time goes on the GPU: each kernel
 * entry of the CUDA backend (examples/bert/layers.h) that one encoder
 * layer of bert_train calls, timed alone at one batch shape, and what a
 * layer's forward and backward add up to. No hvd, no model: the layers
 * on random data (values do not change their time).
 *
 *   bench/bert-ops [--preset base] [--batch 32] [--seq 512]
 *                  [--precision bf16] [--iters 20] [--reps 5]
 *
 * Each entry runs --iters times back to back, then the backend's stream
 * is waited for; a rep's time per call is the wall time over iters (so
 * launch overhead counts, as in a step without CUDA graphs); the median
 * of --reps reps after one warm-up rep is printed, with TFLOP/s for the
 * products. The attention runs as it does by default and, where it fits
 * (bert_cuda_flash_fits), as flash attention; the residual add and
 * LayerNorm fused (the default) and apart (bert_cuda_set_plain(1), which
 * also turns off the products' bias epilogue, timed the same way). The
 * sum per layer counts what model.c calls: forward 4 H x H products (Q,
 * K, V, attention output), H -> F, F -> H, the attention, 2 residual
 * LayerNorms, GELU; backward the same products' gradients, the attention's,
 * 2 LayerNorm backwards and GELU's. Without a GPU (or CUDA) it prints
 * "# SKIP bert-ops: <why>" and exits 0. bench/gpu-session.sh's bert stage
 * runs it at base, B 32 x S 128 and x S 512.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers.h"
#include "model.h"

enum { REPS_MAX = 101 };

typedef struct shape {
  int B, S, N, H, A, F, p;
  size_t es;
} shape_t;

typedef struct bufs {
  void *x, *y, *dy, *dx, *inter, *dinter, *whh, *whf, *wfh, *dwhh, *dwhf;
  void *dwfh, *bh, *bf, *dbh, *dbf, *g, *b, *dg, *db, *q, *k, *v, *ctx;
  void *dctx, *dq, *dk, *dv, *probs;
  float *mean, *rstd;
  int32_t *len;
} bufs_t;

static const bert_backend_t *G;
static int iters = 20, reps = 5;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "bert-ops: %s%s%s\n", what, G && G->error() ? ": " : "",
          G && G->error() ? G->error() : "");
  exit(1);
}

/* n elements of the backend's type, uniform in [-scale, scale) from a
 * fixed generator. */
static void *dev_random(const shape_t *sh, int64_t n, float scale) {
  static uint64_t state = 0x9e3779b97f4a7c15u;
  float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  void *t = malloc(sh->es * (size_t)(n > 0 ? n : 1));
  void *d = G->alloc(sh->es * (size_t)(n > 0 ? n : 1));
  if (h == NULL || t == NULL || d == NULL)
    die("out of memory");
  for (int64_t i = 0; i < n; i++) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    h[i] = scale * ((float)(state >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
  }
  bert_from_float(sh->p, h, t, n);
  G->to_device(d, t, sh->es * (size_t)n);
  free(h);
  free(t);
  return d;
}

static void make_bufs(const shape_t *s, bufs_t *u) {
  int64_t nh = (int64_t)s->N * s->H, nf = (int64_t)s->N * s->F;
  const int64_t hh = (int64_t)s->H * s->H, hf = (int64_t)s->H * s->F;
  const struct {
    void **at;
    int64_t n;
    float scale;
  } fill[] = {
      {&u->x, nh, 1},        {&u->y, nh, 1},        {&u->dy, nh, 1},
      {&u->dx, nh, 1},       {&u->inter, nf, 1},    {&u->dinter, nf, 1},
      {&u->whh, hh, 0.05f},  {&u->whf, hf, 0.05f},  {&u->wfh, hf, 0.05f},
      {&u->dwhh, hh, 0.05f}, {&u->dwhf, hf, 0.05f}, {&u->dwfh, hf, 0.05f},
      {&u->bh, s->H, 0.1f},  {&u->bf, s->F, 0.1f},  {&u->dbh, s->H, 0.1f},
      {&u->dbf, s->F, 0.1f}, {&u->g, s->H, 1},      {&u->b, s->H, 0.1f},
      {&u->dg, s->H, 0.1f},  {&u->db, s->H, 0.1f},  {&u->q, nh, 1},
      {&u->k, nh, 1},        {&u->v, nh, 1},        {&u->ctx, nh, 1},
      {&u->dctx, nh, 1},     {&u->dq, nh, 1},       {&u->dk, nh, 1},
      {&u->dv, nh, 1}};
  for (size_t i = 0; i < sizeof fill / sizeof fill[0]; i++)
    *fill[i].at = dev_random(s, fill[i].n, fill[i].scale);
  int64_t np = (int64_t)s->B * s->A * s->S * s->S;
  if ((u->probs = G->alloc(s->es * (size_t)np)) == NULL)
    die("device memory for the probabilities");
  G->zero(u->probs, np);
  u->mean = G->alloc(sizeof(float) * (size_t)s->N);
  u->rstd = G->alloc(sizeof(float) * (size_t)s->N);
  u->len = G->alloc(sizeof(int32_t) * (size_t)s->B);
  int32_t *len = malloc(sizeof(int32_t) * (size_t)s->B);
  if (u->mean == NULL || u->rstd == NULL || u->len == NULL || len == NULL)
    die("device memory");
  for (int i = 0; i < s->B; i++)
    len[i] = s->S; /* full sequences: the packed corpus's */
  G->to_device(u->len, len, sizeof(int32_t) * (size_t)s->B);
  G->sync();
  free(len);
  /* the LayerNorm statistics of x, for the backwards */
  G->layernorm_fwd(u->x, u->g, u->b, 1e-12f, u->y, u->mean, u->rstd, s->N,
                   s->H);
}

enum op {
  LIN_HH_F,
  LIN_HH_B,
  LIN_HF_F,
  LIN_HF_B,
  LIN_FH_F,
  LIN_FH_B,
  GELU_F,
  GELU_B,
  LN_F,
  LN_B,
  ADD_LN_F,
  LN_B2,
  ATT_F,
  ATT_B,
  OPS
};

static const char *const op_names[OPS] = {"linear H->H forward",
                                          "linear H->H backward",
                                          "linear H->F forward",
                                          "linear H->F backward",
                                          "linear F->H forward",
                                          "linear F->H backward",
                                          "gelu forward",
                                          "gelu backward",
                                          "layernorm forward",
                                          "layernorm backward",
                                          "add + layernorm forward",
                                          "layernorm backward + copy",
                                          "attention forward",
                                          "attention backward"};

static void run_op(const shape_t *s, bufs_t *u, int op) {
  const int N = s->N, H = s->H, F = s->F;
  switch (op) {
  case LIN_HH_F:
    G->linear_fwd(u->x, u->whh, u->bh, u->y, N, H, H);
    break;
  case LIN_HH_B:
    G->linear_bwd(u->x, u->whh, u->dy, u->dx, 1.0f, u->dwhh, u->dbh, N, H, H);
    break;
  case LIN_HF_F:
    G->linear_fwd(u->x, u->whf, u->bf, u->inter, N, H, F);
    break;
  case LIN_HF_B:
    G->linear_bwd(u->x, u->whf, u->dinter, u->dx, 1.0f, u->dwhf, u->dbf, N, H,
                  F);
    break;
  case LIN_FH_F:
    G->linear_fwd(u->inter, u->wfh, u->bh, u->y, N, F, H);
    break;
  case LIN_FH_B:
    G->linear_bwd(u->inter, u->wfh, u->dy, u->dinter, 0.0f, u->dwfh, u->dbh, N,
                  F, H);
    break;
  case GELU_F:
    G->gelu_fwd(u->inter, u->dinter, (int64_t)N * F);
    break;
  case GELU_B:
    G->gelu_bwd(u->inter, u->dinter, u->dinter, (int64_t)N * F);
    break;
  case LN_F:
    G->layernorm_fwd(u->x, u->g, u->b, 1e-12f, u->y, u->mean, u->rstd, N, H);
    break;
  case LN_B:
    G->layernorm_bwd(u->x, u->mean, u->rstd, u->g, u->dy, u->dx, u->dg, u->db,
                     N, H);
    break;
  case ADD_LN_F: /* into y, not over x: the next rep starts the same */
    bert_add_layernorm_fwd(G, u->x, u->ctx, u->g, u->b, 1e-12f, u->dx, u->y,
                           u->mean, u->rstd, N, H);
    break;
  case LN_B2:
    bert_layernorm_bwd2(G, u->x, u->mean, u->rstd, u->g, u->dy, u->dx, u->y,
                        u->dg, u->db, N, H);
    break;
  case ATT_F:
    G->attention_fwd(u->q, u->k, u->v, u->len, u->probs, u->ctx, s->B, s->S,
                     s->A, H / s->A);
    break;
  case ATT_B:
    G->attention_bwd(u->q, u->k, u->v, u->probs, u->dctx, u->dq, u->dk, u->dv,
                     NULL, s->B, s->S, s->A, H / s->A);
    break;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Seconds per call of op: the median over reps (after one warm-up). */
static double time_op(const shape_t *s, bufs_t *u, int op) {
  double t[REPS_MAX];
  for (int r = -1; r < reps; r++) {
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
      run_op(s, u, op);
    G->sync();
    if (r >= 0)
      t[r] = (now_s() - t0) / iters;
  }
  if (G->error() != NULL)
    die(op_names[op]);
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  return t[reps / 2];
}

/* The FLOPs of op's products (0 for the others). */
static double op_flops(const shape_t *s, int op) {
  double n = s->N, h = s->H, f = s->F, a = s->A, S = s->S, b = s->B;
  switch (op) {
  case LIN_HH_F:
    return 2 * n * h * h;
  case LIN_HH_B:
    return 4 * n * h * h;
  case LIN_HF_F:
  case LIN_FH_F:
    return 2 * n * h * f;
  case LIN_HF_B:
  case LIN_FH_B:
    return 4 * n * h * f;
  case ATT_F: /* Q K^T and P V */
    return 4 * b * a * S * S * (h / a);
  case ATT_B: /* dP, dV, dQ, dK */
    return 8 * b * a * S * S * (h / a);
  default:
    return 0;
  }
}

static void usage(void) {
  fputs("usage: bench/bert-ops [--preset NAME] [--batch B] [--seq S]\n"
        "                      [--precision fp32|bf16|fp16] [--iters N] "
        "[--reps R]\n",
        stderr);
  exit(2);
}

static int int_arg(const char *v, int lo, int hi) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < lo || x > hi)
    usage();
  return (int)x;
}

int main(int argc, char **argv) {
  const char *preset = "base";
  int B = 32, S = 512, p = BERT_BF16;
  for (int i = 1; i < argc; i += 2) { /* --option VALUE pairs */
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL)
      usage();
    if (strcmp(argv[i], "--preset") == 0)
      preset = v;
    else if (strcmp(argv[i], "--batch") == 0)
      B = int_arg(v, 1, 4096);
    else if (strcmp(argv[i], "--seq") == 0)
      S = int_arg(v, 1, 8192);
    else if (strcmp(argv[i], "--precision") == 0) {
      if ((p = bert_precision_parse(v)) < 0)
        usage();
    } else if (strcmp(argv[i], "--iters") == 0)
      iters = int_arg(v, 1, 100000);
    else if (strcmp(argv[i], "--reps") == 0)
      reps = int_arg(v, 1, REPS_MAX);
    else
      usage();
  }
  bert_config_t c;
  if (bert_config_preset(&c, preset) != HVD_SUCCESS) {
    fprintf(stderr, "bert-ops: no preset '%s' (tiny, mini, base)\n", preset);
    return 2;
  }
  char msg[512];
  if (bert_cuda_open(-1, msg, sizeof msg) < 0) {
    printf("# SKIP bert-ops: %s\n", msg);
    return 0;
  }
  G = bert_cuda_backend(p);
  shape_t s = {B,       S,     B * S, c.hidden,
               c.heads, c.ffn, p,     bert_precision_bytes(p)};
  G->reserve(B, S, s.A, s.H / s.A, s.F > s.H ? s.F : s.H, 2);
  bufs_t u;
  make_bufs(&s, &u);
  printf("bert-ops %s B%dxS%d %s (H %d, A %d, F %d): per call, median of %d "
         "reps of %d\n",
         preset, B, S, bert_precision_name(p), s.H, s.A, s.F, reps, iters);
  double t[OPS];
  for (int op = 0; op < OPS; op++) {
    t[op] = time_op(&s, &u, op);
    double fl = op_flops(&s, op);
    printf("  %-28s %9.3f ms", op_names[op], 1e3 * t[op]);
    if (fl > 0)
      printf("  %7.1f TFLOP/s", fl / t[op] / 1e12);
    printf("\n");
  }
  double fwd = 4 * t[LIN_HH_F] + t[LIN_HF_F] + t[LIN_FH_F] + t[ATT_F] +
               2 * t[ADD_LN_F] + t[GELU_F];
  double bwd = 4 * t[LIN_HH_B] + t[LIN_HF_B] + t[LIN_FH_B] + t[ATT_B] +
               2 * t[LN_B2] + t[GELU_B];
  printf("  one layer: forward %.3f ms, backward %.3f ms; attention %.0f %% "
         "of it\n",
         1e3 * fwd, 1e3 * bwd, 100 * (t[ATT_F] + t[ATT_B]) / (fwd + bwd));
  bert_cuda_set_plain(1);
  double pf = time_op(&s, &u, ADD_LN_F), pb = time_op(&s, &u, LN_B2);
  double lf = time_op(&s, &u, LIN_HH_F);
  bert_cuda_set_plain(0);
  printf("  plain kernels: add + layernorm %.3f ms (fused %.3f), layernorm "
         "backward + copy %.3f ms (fused %.3f), linear H->H forward %.3f ms "
         "(epilogue %.3f)\n",
         1e3 * pf, 1e3 * t[ADD_LN_F], 1e3 * pb, 1e3 * t[LN_B2], 1e3 * lf,
         1e3 * t[LIN_HH_F]);
  bert_cuda_set_flash(1);
  if (bert_cuda_flash_fits(p, S, s.A, s.H / s.A)) {
    double ff = time_op(&s, &u, ATT_F), fb = time_op(&s, &u, ATT_B);
    printf("  flash attention: forward %.3f ms (%.1f TFLOP/s), backward %.3f "
           "ms (%.1f TFLOP/s); default %.3f and %.3f\n",
           1e3 * ff, op_flops(&s, ATT_F) / ff / 1e12, 1e3 * fb,
           op_flops(&s, ATT_B) / fb / 1e12, 1e3 * t[ATT_F], 1e3 * t[ATT_B]);
  } else {
    printf("  flash attention: does not fit S %d, dh %d, %s\n", S, s.H / s.A,
           bert_precision_name(p));
  }
  bert_cuda_set_flash(0);
  if (G->error() != NULL)
    die("at the end");
  bert_cuda_close();
  return 0;
}
