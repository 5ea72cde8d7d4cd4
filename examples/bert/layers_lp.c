/*
 * layers_lp.c - mixed precision on the CPU: the host conversions of
 * layers.h (bert_to_float, bert_from_float) and the CPU backend of each
 * low precision (bfloat16, float16), a numerical model of the GPU's.
 *
 * Each entry converts its T inputs to float32 (exactly), runs the float32
 * function of layers.c on them, and rounds what it writes as layers.h's
 * "Precisions" says: every output element once; what accumulates as
 * round(old + the call's float32 contribution), the contribution
 * computed into zeroed float32 memory first; attention's ctx from the
 * probabilities rounded to T. It is not built for speed (every call
 * converts its operands), and exists so that a mixed-precision model
 * runs, and is tested, on a machine without a GPU, and so that the GPU's
 * kernels have a reference of their own precision (t/gpu/bert_layers).
 *
 * The temporaries are allocated per call; when one cannot be, the call
 * does nothing and the backend's error() says so from then on (the CPU
 * float32 backend never fails; this one can run out of memory).
 */
#include <config.h>

#include "layers.h"

#include "base/half.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Conversions --------------------------------------------------------- *
 * lib/base/half.h's, the library's own (round to nearest even; NaN kept
 * quiet; float16 subnormals and overflow to infinity). */

/* One element of a 16-bit T (bfloat16 or float16) and back. */
static float t_to_float(int p, uint16_t h) {
  return p == BERT_BF16 ? hvd__bf16_to_f32(h) : hvd__f16_to_f32(h);
}

static uint16_t float_to_t(int p, float v) {
  return p == BERT_BF16 ? hvd__f32_to_bf16(v) : hvd__f32_to_f16(v);
}

const char *bert_precision_name(int precision) {
  switch (precision) {
  case BERT_FP32:
    return "fp32";
  case BERT_BF16:
    return "bf16";
  case BERT_FP16:
    return "fp16";
  default:
    return NULL;
  }
}

int bert_precision_parse(const char *name) {
  for (int p = BERT_FP32; p <= BERT_FP16; p++)
    if (name != NULL && strcmp(name, bert_precision_name(p)) == 0)
      return p;
  return -1;
}

size_t bert_precision_bytes(int precision) {
  return precision == BERT_FP32 ? sizeof(float) : sizeof(uint16_t);
}

void bert_to_float(int precision, const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  if (precision == BERT_FP32)
    memmove(dst, src, sizeof(float) * (size_t)n);
  else
    for (int64_t i = 0; i < n; i++)
      dst[i] = t_to_float(precision, s[i]);
}

void bert_from_float(int precision, const float *src, void *dst, int64_t n) {
  uint16_t *d = dst;
  if (precision == BERT_FP32)
    memmove(dst, src, sizeof(float) * (size_t)n);
  else /* forward: d[i] overlaps only src elements already read */
    for (int64_t i = 0; i < n; i++)
      d[i] = float_to_t(precision, src[i]);
}

/* ---- Temporaries and rounding -------------------------------------------- */

/* the first failure (layers.h: error): kept until the process ends */
static char lp_err[160];

/* A call's temporaries, freed together (release); ok turns 0 when one
 * could not be allocated (the error recorded), and the call then does
 * nothing. */
typedef struct temps {
  const char *what; /* the entry, for the error */
  void *p[12];      /* the most an entry takes: 8 (embedding_bwd) */
  int n, ok;
} temps_t;

static void *take(temps_t *t, size_t bytes, int zero) {
  void *p = NULL;
  if (t->n < (int)(sizeof t->p / sizeof t->p[0]))
    p = zero ? calloc(1, bytes > 0 ? bytes : 1) : malloc(bytes > 0 ? bytes : 1);
  if (p == NULL) {
    t->ok = 0;
    if (lp_err[0] == '\0')
      snprintf(lp_err, sizeof lp_err, "out of memory for %zu bytes of %s",
               bytes, t->what);
    return NULL;
  }
  return t->p[t->n++] = p;
}

/* n floats (zeroed when zero). */
static float *tmp(temps_t *t, int64_t n, int zero) {
  return take(t, sizeof(float) * (size_t)(n > 0 ? n : 0), zero);
}

/* The float32 copy of n elements of T src (NULL src: NULL, not a failure). */
static float *up(temps_t *t, int p, const void *src, int64_t n) {
  if (src == NULL)
    return NULL;
  float *f = tmp(t, n, 0);
  if (f != NULL)
    bert_to_float(p, src, f, n);
  return f;
}

static void release(temps_t *t) {
  while (t->n > 0)
    free(t->p[--t->n]);
}

/* dst = round(dst + add), n elements of T. */
static void acc(int p, void *dst, const float *add, int64_t n) {
  if (dst == NULL)
    return;
  uint16_t *d = dst;
  for (int64_t i = 0; i < n; i++)
    d[i] = float_to_t(p, t_to_float(p, d[i]) + add[i]);
}

/* x = the float nearest to round-to-T(x), in place. */
static void quantize(float *x, int64_t n, int p) {
  for (int64_t i = 0; i < n; i++)
    x[i] = t_to_float(p, float_to_t(p, x[i]));
}

/* ---- The kernels, for precision p ---------------------------------------- */

static void lp_linear_fwd(int p, const void *x, const void *W, const void *b,
                          void *y, int n, int in, int out) {
  temps_t t = {.what = "linear_fwd", .ok = 1};
  int64_t ny = (int64_t)n * out;
  float *fx = up(&t, p, x, (int64_t)n * in),
        *fW = up(&t, p, W, (int64_t)out * in), *fb = up(&t, p, b, out),
        *fy = tmp(&t, ny, 0);
  if (t.ok) {
    bert_linear_fwd(fx, fW, fb, fy, n, in, out);
    bert_from_float(p, fy, y, ny);
  }
  release(&t);
}

static void lp_linear_bwd(int p, const void *x, const void *W, const void *dy,
                          void *dx, float dx_beta, void *dW, void *db, int n,
                          int in, int out) {
  temps_t t = {.what = "linear_bwd", .ok = 1};
  int64_t nx = (int64_t)n * in;
  float *fx = up(&t, p, x, nx), *fW = up(&t, p, W, (int64_t)out * in),
        *fdy = up(&t, p, dy, (int64_t)n * out),
        *fdW = tmp(&t, (int64_t)out * in, 1),
        *fdb = db != NULL ? tmp(&t, out, 1) : NULL,
        *fdx = dx != NULL ? tmp(&t, nx, 0) : NULL;
  if (t.ok) {
    bert_linear_bwd(fx, fW, fdy, fdx, 0.0f, fdW, fdb, n, in, out);
    acc(p, dW, fdW, (int64_t)out * in);
    acc(p, db, fdb, out);
    if (dx != NULL && dx_beta != 0.0f)
      acc(p, dx, fdx, nx);
    else if (dx != NULL)
      bert_from_float(p, fdx, dx, nx);
  }
  release(&t);
}

static void lp_layernorm_fwd(int p, const void *x, const void *g, const void *b,
                             float eps, void *y, float *mean, float *rstd,
                             int n, int h) {
  temps_t t = {.what = "layernorm_fwd", .ok = 1};
  int64_t nx = (int64_t)n * h;
  float *fx = up(&t, p, x, nx), *fg = up(&t, p, g, h), *fb = up(&t, p, b, h),
        *fy = tmp(&t, nx, 0);
  if (t.ok) {
    bert_layernorm_fwd(fx, fg, fb, eps, fy, mean, rstd, n, h);
    bert_from_float(p, fy, y, nx);
  }
  release(&t);
}

static void lp_layernorm_bwd(int p, const void *x, const float *mean,
                             const float *rstd, const void *g, const void *dy,
                             void *dx, void *dg, void *db, int n, int h) {
  temps_t t = {.what = "layernorm_bwd", .ok = 1};
  int64_t nx = (int64_t)n * h;
  float *fx = up(&t, p, x, nx), *fg = up(&t, p, g, h), *fdy = up(&t, p, dy, nx),
        *fdx = tmp(&t, nx, 0), *fdg = tmp(&t, h, 1), *fdb = tmp(&t, h, 1);
  if (t.ok) {
    bert_layernorm_bwd(fx, mean, rstd, fg, fdy, fdx, fdg, fdb, n, h);
    bert_from_float(p, fdx, dx, nx); /* dx may alias dy: fdy is a copy */
    acc(p, dg, fdg, h);
    acc(p, db, fdb, h);
  }
  release(&t);
}

static void lp_gelu_fwd(int p, const void *x, void *y, int64_t n) {
  temps_t t = {.what = "gelu_fwd", .ok = 1};
  float *f = up(&t, p, x, n);
  if (t.ok) {
    bert_gelu_fwd(f, f, n);
    bert_from_float(p, f, y, n);
  }
  release(&t);
}

static void lp_gelu_bwd(int p, const void *x, const void *dy, void *dx,
                        int64_t n) {
  temps_t t = {.what = "gelu_bwd", .ok = 1};
  float *fx = up(&t, p, x, n), *fdy = up(&t, p, dy, n);
  if (t.ok) {
    bert_gelu_bwd(fx, fdy, fdy, n);
    bert_from_float(p, fdy, dx, n);
  }
  release(&t);
}

/* ctx = P v per (sequence, head), from probabilities already rounded. */
static void ctx_from_probs(const float *probs, const float *v, float *ctx,
                           int B, int S, int A, int dh) {
  const int H = A * dh;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < A; h++) {
      int64_t off = (int64_t)b * S * H + (int64_t)h * dh;
      const float *pr = probs + ((int64_t)b * A + h) * S * S;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, dh, S, 1.0f, pr,
                  S, v + off, H, 0.0f, ctx + off, H);
    }
}

static void lp_attention_fwd(int p, const void *q, const void *k, const void *v,
                             const int32_t *lengths, void *probs, void *ctx,
                             int B, int S, int A, int dh) {
  temps_t t = {.what = "attention_fwd", .ok = 1};
  int64_t nx = (int64_t)B * S * A * dh, np = (int64_t)B * A * S * S;
  float *fq = up(&t, p, q, nx), *fk = up(&t, p, k, nx), *fv = up(&t, p, v, nx),
        *fp = tmp(&t, np, 0), *fc = tmp(&t, nx, 0);
  if (t.ok) {
    bert_attention_fwd(fq, fk, fv, lengths, fp, fc, B, S, A, dh);
    quantize(fp, np, p);
    ctx_from_probs(fp, fv, fc, B, S, A, dh);
    bert_from_float(p, fp, probs, np);
    bert_from_float(p, fc, ctx, nx);
  }
  release(&t);
}

static void lp_attention_bwd(int p, const void *q, const void *k, const void *v,
                             const void *probs, const void *dctx, void *dq,
                             void *dk, void *dv, int B, int S, int A, int dh) {
  temps_t t = {.what = "attention_bwd", .ok = 1};
  int64_t nx = (int64_t)B * S * A * dh, np = (int64_t)B * A * S * S;
  float *fq = up(&t, p, q, nx), *fk = up(&t, p, k, nx), *fv = up(&t, p, v, nx),
        *fp = up(&t, p, probs, np), *fd = up(&t, p, dctx, nx),
        *g = tmp(&t, 3 * nx, 0), *scratch = tmp(&t, (int64_t)S * S, 0);
  if (t.ok) {
    bert__attention_bwd_rounding(fq, fk, fv, fp, fd, g, g + nx, g + 2 * nx,
                                 scratch, B, S, A, dh, quantize, p);
    bert_from_float(p, g, dq, nx);
    bert_from_float(p, g + nx, dk, nx);
    bert_from_float(p, g + 2 * nx, dv, nx);
  }
  release(&t);
}

static void lp_embedding_fwd(int p, const int32_t *ids, const int32_t *types,
                             const void *word, const void *pos,
                             const void *type, void *out, int B, int S, int H) {
  const uint16_t *w = word, *ps = pos, *ty = type;
  uint16_t *o = out;
  for (int64_t t = 0; t < (int64_t)B * S; t++) {
    const uint16_t *wr = w + (int64_t)ids[t] * H, *pr = ps + (t % S) * H,
                   *tr = ty + (int64_t)(types != NULL ? types[t] : 0) * H;
    for (int j = 0; j < H; j++)
      o[t * H + j] = float_to_t(p, t_to_float(p, wr[j]) + t_to_float(p, pr[j]) +
                                       t_to_float(p, tr[j]));
  }
}

/* dst's rows rows[0..m-1] (as many as the table has: `rows_in_dst`) +=
 * src's rows 0..m-1, each touched row summed in float32 and rounded once. */
static void scatter_rows(int p, const float *src, const int32_t *rows,
                         int64_t m, int h, int64_t rows_in_dst, void *dst,
                         temps_t *t) {
  float *sum = tmp(t, rows_in_dst * h, 1);
  char *touched = take(t, (size_t)rows_in_dst, 1);
  if (!t->ok)
    return;
  for (int64_t i = 0; i < m; i++) {
    float *d = sum + (int64_t)rows[i] * h;
    touched[rows[i]] = 1;
    for (int j = 0; j < h; j++)
      d[j] += src[i * h + j];
  }
  for (int64_t r = 0; r < rows_in_dst; r++)
    if (touched[r])
      acc(p, (uint16_t *)dst + r * h, sum + r * h, h);
}

/* The largest of m rows (0 for none). */
static int32_t max_row(const int32_t *rows, int64_t m) {
  int32_t r = 0;
  for (int64_t i = 0; i < m; i++)
    r = rows[i] > r ? rows[i] : r;
  return r;
}

static void lp_embedding_bwd(int p, const int32_t *ids, const int32_t *types,
                             const void *dout, void *dword, void *dpos,
                             void *dtype, int B, int S, int H) {
  temps_t t = {.what = "embedding_bwd", .ok = 1};
  const int64_t N = (int64_t)B * S;
  float *fd = up(&t, p, dout, N * H);
  int32_t *r = take(&t, sizeof(int32_t) * (size_t)N, 0);
  if (!t.ok) {
    release(&t);
    return;
  }
  for (int64_t i = 0; i < N; i++)
    r[i] = types != NULL ? types[i] : 0;
  if (dtype != NULL)
    scatter_rows(p, fd, r, N, H, (int64_t)max_row(r, N) + 1, dtype, &t);
  for (int64_t i = 0; i < N; i++)
    r[i] = (int32_t)(i % S);
  if (dpos != NULL)
    scatter_rows(p, fd, r, N, H, S, dpos, &t);
  if (dword != NULL)
    scatter_rows(p, fd, ids, N, H, (int64_t)max_row(ids, N) + 1, dword, &t);
  release(&t);
}

static double lp_xent_fwd(int p, void *logits, const int32_t *targets, int m,
                          int V, int64_t *correct) {
  temps_t t = {.what = "xent_fwd", .ok = 1};
  int64_t n = (int64_t)m * V;
  float *f = up(&t, p, logits, n);
  double loss = 0;
  if (t.ok) {
    loss = bert_xent_fwd(f, targets, m, V, correct);
    bert_from_float(p, f, logits, n);
  }
  release(&t);
  return loss;
}

static void lp_xent_bwd(int p, void *probs, const int32_t *targets, int m,
                        int V, float scale) {
  temps_t t = {.what = "xent_bwd", .ok = 1};
  int64_t n = (int64_t)m * V;
  float *f = up(&t, p, probs, n);
  if (t.ok) {
    bert_xent_bwd(f, targets, m, V, scale);
    bert_from_float(p, f, probs, n);
  }
  release(&t);
}

static void lp_add(int p, const void *a, const void *b, void *y, int64_t n) {
  const uint16_t *x = a, *z = b;
  uint16_t *o = y;
  for (int64_t i = 0; i < n; i++)
    o[i] = float_to_t(p, t_to_float(p, x[i]) + t_to_float(p, z[i]));
}

static void lp_gather_rows(const void *src, const int32_t *rows, int m, int h,
                           void *dst) {
  for (int i = 0; i < m; i++)
    memcpy((uint16_t *)dst + (int64_t)i * h,
           (const uint16_t *)src + (int64_t)rows[i] * h, sizeof(uint16_t) * h);
}

static void lp_scatter_add_rows(int p, const void *src, const int32_t *rows,
                                int m, int h, void *dst) {
  temps_t t = {.what = "scatter_add_rows", .ok = 1};
  float *f = up(&t, p, src, (int64_t)m * h);
  if (t.ok)
    scatter_rows(p, f, rows, m, h, (int64_t)max_row(rows, m) + 1, dst, &t);
  release(&t);
}

static void lp_copy(const void *src, void *dst, int64_t n) {
  memmove(dst, src, sizeof(uint16_t) * (size_t)n);
}

static void lp_zero(void *x, int64_t n) {
  memset(x, 0, sizeof(uint16_t) * (size_t)n);
}

static const char *lp_error(void) { return lp_err[0] != '\0' ? lp_err : NULL; }

/* ---- The tables ---------------------------------------------------------- *
 * One set of entries per precision, each passing its precision on. */

#define LP_ENTRIES(SUF, P)                                                     \
  static void SUF##_linear_fwd(const void *x, const void *W, const void *b,    \
                               void *y, int n, int in, int out) {              \
    lp_linear_fwd(P, x, W, b, y, n, in, out);                                  \
  }                                                                            \
  static void SUF##_linear_bwd(const void *x, const void *W, const void *dy,   \
                               void *dx, float beta, void *dW, void *db,       \
                               int n, int in, int out) {                       \
    lp_linear_bwd(P, x, W, dy, dx, beta, dW, db, n, in, out);                  \
  }                                                                            \
  static void SUF##_layernorm_fwd(const void *x, const void *g, const void *b, \
                                  float eps, void *y, float *mean,             \
                                  float *rstd, int n, int h) {                 \
    lp_layernorm_fwd(P, x, g, b, eps, y, mean, rstd, n, h);                    \
  }                                                                            \
  static void SUF##_layernorm_bwd(                                             \
      const void *x, const float *mean, const float *rstd, const void *g,      \
      const void *dy, void *dx, void *dg, void *db, int n, int h) {            \
    lp_layernorm_bwd(P, x, mean, rstd, g, dy, dx, dg, db, n, h);               \
  }                                                                            \
  static void SUF##_gelu_fwd(const void *x, void *y, int64_t n) {              \
    lp_gelu_fwd(P, x, y, n);                                                   \
  }                                                                            \
  static void SUF##_gelu_bwd(const void *x, const void *dy, void *dx,          \
                             int64_t n) {                                      \
    lp_gelu_bwd(P, x, dy, dx, n);                                              \
  }                                                                            \
  static void SUF##_attention_fwd(const void *q, const void *k, const void *v, \
                                  const int32_t *len, void *probs, void *ctx,  \
                                  int B, int S, int A, int dh) {               \
    lp_attention_fwd(P, q, k, v, len, probs, ctx, B, S, A, dh);                \
  }                                                                            \
  static void SUF##_attention_bwd(                                             \
      const void *q, const void *k, const void *v, const void *probs,          \
      const void *dctx, void *dq, void *dk, void *dv, float *scratch, int B,   \
      int S, int A, int dh) {                                                  \
    (void)scratch;                                                             \
    lp_attention_bwd(P, q, k, v, probs, dctx, dq, dk, dv, B, S, A, dh);        \
  }                                                                            \
  static void SUF##_embedding_fwd(                                             \
      const int32_t *ids, const int32_t *types, const void *word,              \
      const void *pos, const void *type, void *out, int B, int S, int H) {     \
    lp_embedding_fwd(P, ids, types, word, pos, type, out, B, S, H);            \
  }                                                                            \
  static void SUF##_embedding_bwd(const int32_t *ids, const int32_t *types,    \
                                  const void *dout, void *dword, void *dpos,   \
                                  void *dtype, int B, int S, int H) {          \
    lp_embedding_bwd(P, ids, types, dout, dword, dpos, dtype, B, S, H);        \
  }                                                                            \
  static double SUF##_xent_fwd(void *logits, const int32_t *targets, int m,    \
                               int V, int64_t *correct) {                      \
    return lp_xent_fwd(P, logits, targets, m, V, correct);                     \
  }                                                                            \
  static void SUF##_xent_bwd(void *probs, const int32_t *targets, int m,       \
                             int V, float scale) {                             \
    lp_xent_bwd(P, probs, targets, m, V, scale);                               \
  }                                                                            \
  static void SUF##_add(const void *a, const void *b, void *y, int64_t n) {    \
    lp_add(P, a, b, y, n);                                                     \
  }                                                                            \
  static void SUF##_scatter_add_rows(const void *src, const int32_t *rows,     \
                                     int m, int h, void *dst) {                \
    lp_scatter_add_rows(P, src, rows, m, h, dst);                              \
  }

LP_ENTRIES(bf16, BERT_BF16)
LP_ENTRIES(fp16, BERT_FP16)

#define LP_TABLE(SUF, P)                                                       \
  {                                                                            \
    .name = "cpu", .precision = P, .alloc = bert_backend_cpu.alloc,            \
    .free = bert_backend_cpu.free, .host_alloc = bert_backend_cpu.host_alloc,  \
    .host_free = bert_backend_cpu.host_free,                                   \
    .to_device = bert_backend_cpu.to_device,                                   \
    .to_host = bert_backend_cpu.to_host, .reserve = bert_backend_cpu.reserve,  \
    .sync = bert_backend_cpu.sync, .sync_all = bert_backend_cpu.sync_all,      \
    .fence_record = bert_backend_cpu.fence_record,                             \
    .fence_wait = bert_backend_cpu.fence_wait, .error = lp_error,              \
    .graph_run = bert_backend_cpu.graph_run,                                   \
    .graph_forget = bert_backend_cpu.graph_forget,                             \
    .linear_fwd = SUF##_linear_fwd, .linear_bwd = SUF##_linear_bwd,            \
    .layernorm_fwd = SUF##_layernorm_fwd,                                      \
    .layernorm_bwd = SUF##_layernorm_bwd, .gelu_fwd = SUF##_gelu_fwd,          \
    .gelu_bwd = SUF##_gelu_bwd, .attention_fwd = SUF##_attention_fwd,          \
    .attention_bwd = SUF##_attention_bwd,                                      \
    .embedding_fwd = SUF##_embedding_fwd,                                      \
    .embedding_bwd = SUF##_embedding_bwd, .xent_fwd = SUF##_xent_fwd,          \
    .xent_bwd = SUF##_xent_bwd, .add = SUF##_add, .copy = lp_copy,             \
    .zero = lp_zero, .gather_rows = lp_gather_rows,                            \
    .scatter_add_rows = SUF##_scatter_add_rows,                                \
  }

/* The tables copy bert_backend_cpu's memory entries, so they are made on
 * first use (a static initializer cannot read another object's fields). */
static bert_backend_t lp_tables[2];
static pthread_once_t lp_once = PTHREAD_ONCE_INIT;

static void make_tables(void) {
  const bert_backend_t bf = LP_TABLE(bf16, BERT_BF16),
                       fp = LP_TABLE(fp16, BERT_FP16);
  lp_tables[0] = bf, lp_tables[1] = fp;
}

const bert_backend_t *bert_cpu_backend(int precision) {
  pthread_once(&lp_once, make_tables);
  switch (precision) {
  case BERT_FP32:
    return &bert_backend_cpu;
  case BERT_BF16:
    return &lp_tables[0];
  case BERT_FP16:
    return &lp_tables[1];
  default:
    return NULL;
  }
}
