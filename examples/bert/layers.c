/*
 * layers.c - the CPU kernels of the BERT example: CBLAS sgemm for every
 * matrix product, plain loops for the rest; the CPU backend table; and,
 * in a build without CUDA, the GPU backend's calls that say so. See
 * layers.h.
 */
#include <config.h>

#include "layers.h"

#include <hvd.h>

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int num_threads);
#endif

void bert_linear_fwd(const float *x, const float *W, const float *b, float *y,
                     int n, int in, int out) {
  if (b != NULL)
    for (int i = 0; i < n; i++)
      memcpy(y + (int64_t)i * out, b, sizeof(float) * out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in,
              W, in, b != NULL ? 1.0f : 0.0f, y, out);
}

void bert_linear_bwd(const float *x, const float *W, const float *dy, float *dx,
                     float dx_beta, float *dW, float *db, int n, int in,
                     int out) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy,
              out, x, in, 1.0f, dW, in);
  if (db != NULL)
    for (int i = 0; i < n; i++) {
      const float *r = dy + (int64_t)i * out;
      for (int j = 0; j < out; j++)
        db[j] += r[j];
    }
  if (dx != NULL)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy,
                out, W, in, dx_beta, dx, in);
}

void bert_layernorm_fwd(const float *x, const float *g, const float *b,
                        float eps, float *y, float *mean, float *rstd, int n,
                        int h) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (int64_t)i * h;
    float *yr = y + (int64_t)i * h;
    double s = 0, ss = 0;
    for (int j = 0; j < h; j++)
      s += xr[j];
    double mu = s / h;
    for (int j = 0; j < h; j++) {
      double d = xr[j] - mu;
      ss += d * d;
    }
    float r = (float)(1.0 / sqrt(ss / h + eps));
    float m = (float)mu;
    mean[i] = m;
    rstd[i] = r;
    for (int j = 0; j < h; j++)
      yr[j] = (xr[j] - m) * r * g[j] + b[j];
  }
}

void bert_layernorm_bwd(const float *x, const float *mean, const float *rstd,
                        const float *g, const float *dy, float *dx, float *dg,
                        float *db, int n, int h) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (int64_t)i * h, *dyr = dy + (int64_t)i * h;
    float *dxr = dx + (int64_t)i * h;
    float m = mean[i], r = rstd[i];
    /* dxhat = dy * g; dx = r * (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) */
    double s1 = 0, s2 = 0;
    for (int j = 0; j < h; j++) {
      float xhat = (xr[j] - m) * r, dxhat = dyr[j] * g[j];
      dg[j] += dyr[j] * xhat;
      db[j] += dyr[j];
      s1 += dxhat;
      s2 += (double)dxhat * xhat;
    }
    float a = (float)(s1 / h), c = (float)(s2 / h);
    for (int j = 0; j < h; j++) {
      float xhat = (xr[j] - m) * r;
      dxr[j] = r * (dyr[j] * g[j] - a - xhat * c);
    }
  }
}

void bert_gelu_fwd(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void bert_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n) {
  const float inv_sqrt_2pi = 0.3989422804014327f;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

/* Row-wise softmax of p[rows, cols] in place. */
static void softmax_rows(float *p, int rows, int cols) {
  for (int i = 0; i < rows; i++) {
    float *r = p + (int64_t)i * cols;
    float mx = r[0];
    for (int j = 1; j < cols; j++)
      mx = r[j] > mx ? r[j] : mx;
    float s = 0;
    for (int j = 0; j < cols; j++) {
      r[j] = expf(r[j] - mx);
      s += r[j];
    }
    float inv = 1.0f / s;
    for (int j = 0; j < cols; j++)
      r[j] *= inv;
  }
}

void bert_attention_fwd(const float *q, const float *k, const float *v,
                        const int32_t *lengths, float *probs, float *ctx, int B,
                        int S, int A, int dh) {
  const int H = A * dh;
  const float scale = 1.0f / sqrtf((float)dh);
  for (int b = 0; b < B; b++) {
    int len = lengths != NULL ? lengths[b] : S;
    for (int h = 0; h < A; h++) {
      int64_t off = (int64_t)b * S * H + (int64_t)h * dh;
      float *p = probs + ((int64_t)b * A + h) * S * S;
      /* scores = scale * Q K^T, padded keys masked, softmax per query */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, dh, scale,
                  q + off, H, k + off, H, 0.0f, p, S);
      if (len < S)
        for (int i = 0; i < S; i++)
          for (int j = len; j < S; j++)
            p[(int64_t)i * S + j] = BERT_MASK_VALUE;
      softmax_rows(p, S, S);
      /* ctx = P V */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, dh, S, 1.0f, p,
                  S, v + off, H, 0.0f, ctx + off, H);
    }
  }
}

void bert__attention_bwd_rounding(
    const float *q, const float *k, const float *v, const float *probs,
    const float *dctx, float *dq, float *dk, float *dv, float *scratch, int B,
    int S, int A, int dh, void (*round_ds)(float *ds, int64_t n, int arg),
    int arg) {
  const int H = A * dh;
  const float scale = 1.0f / sqrtf((float)dh);
  float *dp = scratch;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < A; h++) {
      int64_t off = (int64_t)b * S * H + (int64_t)h * dh;
      const float *p = probs + ((int64_t)b * A + h) * S * S;
      /* dP = dC V^T; dV = P^T dC */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, dh, 1.0f,
                  dctx + off, H, v + off, H, 0.0f, dp, S);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, dh, S, 1.0f, p, S,
                  dctx + off, H, 0.0f, dv + off, H);
      /* softmax backward: dS = P * (dP - rowsum(P * dP)); masked keys
       * have P = 0, so they get no gradient */
      for (int i = 0; i < S; i++) {
        const float *pr = p + (int64_t)i * S;
        float *dr = dp + (int64_t)i * S;
        float dot = 0;
        for (int j = 0; j < S; j++)
          dot += pr[j] * dr[j];
        for (int j = 0; j < S; j++)
          dr[j] = pr[j] * (dr[j] - dot);
      }
      if (round_ds != NULL)
        round_ds(dp, (int64_t)S * S, arg);
      /* dQ = scale dS K; dK = scale dS^T Q */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, dh, S, scale,
                  dp, S, k + off, H, 0.0f, dq + off, H);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, dh, S, scale, dp,
                  S, q + off, H, 0.0f, dk + off, H);
    }
}

void bert_attention_bwd(const float *q, const float *k, const float *v,
                        const float *probs, const float *dctx, float *dq,
                        float *dk, float *dv, float *scratch, int B, int S,
                        int A, int dh) {
  bert__attention_bwd_rounding(q, k, v, probs, dctx, dq, dk, dv, scratch, B, S,
                               A, dh, NULL, 0);
}

void bert_embedding_fwd(const int32_t *ids, const int32_t *types,
                        const float *word, const float *pos, const float *type,
                        float *out, int B, int S, int H) {
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++) {
      int64_t t = (int64_t)b * S + s;
      const float *w = word + (int64_t)ids[t] * H;
      const float *ps = pos + (int64_t)s * H;
      const float *ty = type + (int64_t)(types != NULL ? types[t] : 0) * H;
      float *o = out + t * H;
      for (int j = 0; j < H; j++)
        o[j] = w[j] + ps[j] + ty[j];
    }
}

void bert_embedding_bwd(const int32_t *ids, const int32_t *types,
                        const float *dout, float *dword, float *dpos,
                        float *dtype, int B, int S, int H) {
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++) {
      int64_t t = (int64_t)b * S + s;
      const float *d = dout + t * H;
      float *w = dword != NULL ? dword + (int64_t)ids[t] * H : NULL;
      float *ps = dpos != NULL ? dpos + (int64_t)s * H : NULL;
      float *ty = dtype != NULL
                      ? dtype + (int64_t)(types != NULL ? types[t] : 0) * H
                      : NULL;
      for (int j = 0; j < H; j++) {
        if (w != NULL)
          w[j] += d[j];
        if (ps != NULL)
          ps[j] += d[j];
        if (ty != NULL)
          ty[j] += d[j];
      }
    }
}

double bert_xent_fwd(float *logits, const int32_t *targets, int m, int V,
                     int64_t *correct) {
  double loss = 0;
  int64_t right = 0;
  for (int i = 0; i < m; i++) {
    float *r = logits + (int64_t)i * V;
    int arg = 0;
    for (int j = 1; j < V; j++)
      if (r[j] > r[arg])
        arg = j;
    float mx = r[arg];
    double s = 0;
    for (int j = 0; j < V; j++)
      s += exp((double)r[j] - mx);
    /* -log p(t) = log sum exp(r - mx) - (r[t] - mx) */
    loss += log(s) - ((double)r[targets[i]] - mx);
    right += arg == targets[i];
    float inv = (float)(1.0 / s);
    for (int j = 0; j < V; j++)
      r[j] = expf(r[j] - mx) * inv;
  }
  if (correct != NULL)
    *correct = right;
  return loss;
}

void bert_xent_bwd(float *probs, const int32_t *targets, int m, int V,
                   float scale) {
  for (int i = 0; i < m; i++) {
    float *r = probs + (int64_t)i * V;
    r[targets[i]] -= 1.0f;
    for (int j = 0; j < V; j++)
      r[j] *= scale;
  }
}

void bert_add(const float *a, const float *b, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = a[i] + b[i];
}

void bert_copy(const float *src, float *dst, int64_t n) {
  memcpy(dst, src, sizeof(float) * (size_t)n);
}

void bert_zero(float *x, int64_t n) { memset(x, 0, sizeof(float) * (size_t)n); }

void bert_gather_rows(const float *src, const int32_t *rows, int m, int h,
                      float *dst) {
  for (int i = 0; i < m; i++)
    memcpy(dst + (int64_t)i * h, src + (int64_t)rows[i] * h, sizeof(float) * h);
}

void bert_scatter_add_rows(const float *src, const int32_t *rows, int m, int h,
                           float *dst) {
  for (int i = 0; i < m; i++) {
    float *d = dst + (int64_t)rows[i] * h;
    const float *s = src + (int64_t)i * h;
    for (int j = 0; j < h; j++)
      d[j] += s[j];
  }
}

int bert_blas_set_threads(int n) {
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  openblas_set_num_threads(n < 1 ? 1 : n);
  return 0;
#else
  (void)n;
  return -1;
#endif
}

/* ---- the CPU backend ----------------------------------------------------- */

/* Weights, gradients and activations: hvd_alloc_host, so that the large
 * ones sit on huge pages (a run's allreduce speed does not then depend on
 * where its 4 KiB pages land; doc/bench.md, "Huge pages"). */
static void *cpu_alloc(size_t bytes) { return hvd_alloc_host(bytes); }

static void cpu_free(void *p) { (void)hvd_free_host(p); }

static void *cpu_host_alloc(size_t bytes) {
  size_t n = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n > 0 ? n : 64);
}

static void cpu_copy_bytes(void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
}

static void cpu_reserve(int B, int S, int A, int dh, int width, int types) {
  (void)B, (void)S, (void)A, (void)dh, (void)width, (void)types;
}

static void cpu_nothing(void) {}
/* bert_cpu_set_graphs: "graphs" that run at once (layers.h) */
static int cpu_graphs;

void bert_cpu_set_graphs(int on) { cpu_graphs = on != 0; }

static int cpu_graph_run(const void *owner, const int key[4],
                         void (*fn)(void *), void *ctx) {
  (void)owner, (void)key;
  if (!cpu_graphs)
    return 0;
  fn(ctx);
  return 1;
}
static void cpu_graph_forget(const void *owner) { (void)owner; }
static void cpu_fence(int slot) { (void)slot; }
static const char *cpu_error(void) { return NULL; }

/* The float32 functions above under the table's void * signatures. */
static void f_linear_fwd(const void *x, const void *W, const void *b, void *y,
                         int n, int in, int out) {
  bert_linear_fwd(x, W, b, y, n, in, out);
}
static void f_linear_bwd(const void *x, const void *W, const void *dy, void *dx,
                         float beta, void *dW, void *db, int n, int in,
                         int out) {
  bert_linear_bwd(x, W, dy, dx, beta, dW, db, n, in, out);
}
static void f_layernorm_fwd(const void *x, const void *g, const void *b,
                            float eps, void *y, float *mean, float *rstd, int n,
                            int h) {
  bert_layernorm_fwd(x, g, b, eps, y, mean, rstd, n, h);
}
static void f_layernorm_bwd(const void *x, const float *mean, const float *rstd,
                            const void *g, const void *dy, void *dx, void *dg,
                            void *db, int n, int h) {
  bert_layernorm_bwd(x, mean, rstd, g, dy, dx, dg, db, n, h);
}
static void f_gelu_fwd(const void *x, void *y, int64_t n) {
  bert_gelu_fwd(x, y, n);
}
static void f_gelu_bwd(const void *x, const void *dy, void *dx, int64_t n) {
  bert_gelu_bwd(x, dy, dx, n);
}
static void f_attention_fwd(const void *q, const void *k, const void *v,
                            const int32_t *lengths, void *probs, void *ctx,
                            int B, int S, int A, int dh) {
  bert_attention_fwd(q, k, v, lengths, probs, ctx, B, S, A, dh);
}
static void f_attention_bwd(const void *q, const void *k, const void *v,
                            const void *probs, const void *dctx, void *dq,
                            void *dk, void *dv, float *scratch, int B, int S,
                            int A, int dh) {
  bert_attention_bwd(q, k, v, probs, dctx, dq, dk, dv, scratch, B, S, A, dh);
}
static void f_embedding_fwd(const int32_t *ids, const int32_t *types,
                            const void *word, const void *pos, const void *type,
                            void *out, int B, int S, int H) {
  bert_embedding_fwd(ids, types, word, pos, type, out, B, S, H);
}
static void f_embedding_bwd(const int32_t *ids, const int32_t *types,
                            const void *dout, void *dword, void *dpos,
                            void *dtype, int B, int S, int H) {
  bert_embedding_bwd(ids, types, dout, dword, dpos, dtype, B, S, H);
}
static double f_xent_fwd(void *logits, const int32_t *targets, int m, int V,
                         int64_t *correct) {
  return bert_xent_fwd(logits, targets, m, V, correct);
}
static void f_xent_bwd(void *probs, const int32_t *targets, int m, int V,
                       float scale) {
  bert_xent_bwd(probs, targets, m, V, scale);
}
static void f_add(const void *a, const void *b, void *y, int64_t n) {
  bert_add(a, b, y, n);
}
static void f_copy(const void *src, void *dst, int64_t n) {
  bert_copy(src, dst, n);
}
static void f_zero(void *x, int64_t n) { bert_zero(x, n); }
static void f_gather_rows(const void *src, const int32_t *rows, int m, int h,
                          void *dst) {
  bert_gather_rows(src, rows, m, h, dst);
}
static void f_scatter_add_rows(const void *src, const int32_t *rows, int m,
                               int h, void *dst) {
  bert_scatter_add_rows(src, rows, m, h, dst);
}

const bert_backend_t bert_backend_cpu = {
    .name = "cpu",
    .precision = BERT_FP32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,
    .host_free = free,
    .to_device = cpu_copy_bytes,
    .to_host = cpu_copy_bytes,
    .reserve = cpu_reserve,
    .sync = cpu_nothing,
    .sync_all = cpu_nothing,
    .fence_record = cpu_fence,
    .fence_wait = cpu_fence,
    .error = cpu_error,
    .graph_run = cpu_graph_run,
    .graph_forget = cpu_graph_forget,
    .linear_fwd = f_linear_fwd,
    .linear_bwd = f_linear_bwd,
    .layernorm_fwd = f_layernorm_fwd,
    .layernorm_bwd = f_layernorm_bwd,
    .gelu_fwd = f_gelu_fwd,
    .gelu_bwd = f_gelu_bwd,
    .attention_fwd = f_attention_fwd,
    .attention_bwd = f_attention_bwd,
    .embedding_fwd = f_embedding_fwd,
    .embedding_bwd = f_embedding_bwd,
    .xent_fwd = f_xent_fwd,
    .xent_bwd = f_xent_bwd,
    .add = f_add,
    .copy = f_copy,
    .zero = f_zero,
    .gather_rows = f_gather_rows,
    .scatter_add_rows = f_scatter_add_rows,
};

#ifndef HVD_HAVE_CUDA
/* A build without CUDA: the GPU backend cannot be opened. */
int bert_cuda_open(int device, char *msg, size_t len) {
  (void)device;
  if (msg != NULL && len > 0)
    snprintf(msg, len,
             "this build has no CUDA (configure found no toolkit, or "
             "--without-cuda)");
  return -1;
}
void bert_cuda_close(void) {}
const bert_backend_t *bert_cuda_backend(int precision) {
  (void)precision;
  return NULL;
}
void bert_cuda_set_tf32(int on) { (void)on; }
void bert_cuda_set_graphs(int on) { (void)on; }
void bert_cuda_set_plain(int on) { (void)on; }
void bert_cuda_set_flash(int on) { (void)on; }
int bert_cuda_flash_fits(int precision, int S, int A, int dh) {
  (void)precision, (void)S, (void)A, (void)dh;
  return 0;
}
const char *bert_cuda_graphs_off(void) { return NULL; }
#endif

void bert_add_layernorm_fwd(const bert_backend_t *k, const void *a,
                            const void *res, const void *g, const void *b,
                            float eps, void *sum, void *y, float *mean,
                            float *rstd, int n, int h) {
  if (k->add_layernorm_fwd != NULL) {
    k->add_layernorm_fwd(a, res, g, b, eps, sum, y, mean, rstd, n, h);
    return;
  }
  k->add(a, res, sum, (int64_t)n * h);
  k->layernorm_fwd(sum, g, b, eps, y, mean, rstd, n, h);
}

void bert_layernorm_bwd2(const bert_backend_t *k, const void *x,
                         const float *mean, const float *rstd, const void *g,
                         const void *dy, void *dx, void *dx2, void *dg,
                         void *db, int n, int h) {
  if (k->layernorm_bwd2 != NULL) {
    k->layernorm_bwd2(x, mean, rstd, g, dy, dx, dx2, dg, db, n, h);
    return;
  }
  k->layernorm_bwd(x, mean, rstd, g, dy, dx, dg, db, n, h);
  k->copy(dx, dx2, (int64_t)n * h);
}
