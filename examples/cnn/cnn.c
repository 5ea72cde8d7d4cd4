/*
 * cnn.c - the residual CNN of cnn.h on the CPU.
 *
 * Layout NCHW, float32. A 3x3 convolution (stride 1, padding 1, no bias:
 * batch norm follows) is, per image, im2col into cols [C*9, H*W] and one
 * GEMM, W [Cout, C*9] x cols; its backward recomputes cols, adds
 * dY x cols^T into the weight gradient and scatters W^T x dY back through
 * col2im. Batch norm is hvd's synchronized one (names "bn1".."bn3").
 */
#include <config.h>

#include "cnn.h"
#include "cnn_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include <cblas.h>

static const char *const pnames[NPARAMS] = {
    "conv1.weight", "bn1.weight", "bn1.bias",     "conv2.weight",
    "bn2.weight",   "bn2.bias",   "conv3.weight", "bn3.weight",
    "bn3.bias",     "fc.weight",  "fc.bias"};
static const char *const bnames[6] = {"bn1.running_mean", "bn1.running_var",
                                      "bn2.running_mean", "bn2.running_var",
                                      "bn3.running_mean", "bn3.running_var"};

static float *val(cnn_t *m, int i) { return m->p[i].value.data; }
static float *grad(cnn_t *m, int i) { return m->p[i].grad.data; }

/* ---- the layers ---------------------------------------------------------- */

/* cols [C*9, S*S] of one image x [C, S, S] (zero padding). */
static void im2col(const float *x, int C, int S, float *cols) {
  for (int c = 0; c < C; c++)
    for (int ky = 0; ky < 3; ky++)
      for (int kx = 0; kx < 3; kx++) {
        float *row = cols + ((c * 3 + ky) * 3 + kx) * S * S;
        for (int y = 0; y < S; y++) {
          int sy = y + ky - 1;
          for (int xx = 0; xx < S; xx++) {
            int sx = xx + kx - 1;
            row[y * S + xx] = sy >= 0 && sy < S && sx >= 0 && sx < S
                                  ? x[(c * S + sy) * S + sx]
                                  : 0.0f;
          }
        }
      }
}

/* dx [C, S, S] += the columns' gradients dcols [C*9, S*S]. */
static void col2im(const float *dcols, int C, int S, float *dx) {
  for (int c = 0; c < C; c++)
    for (int ky = 0; ky < 3; ky++)
      for (int kx = 0; kx < 3; kx++) {
        const float *row = dcols + ((c * 3 + ky) * 3 + kx) * S * S;
        for (int y = 0; y < S; y++) {
          int sy = y + ky - 1;
          if (sy < 0 || sy >= S)
            continue;
          for (int xx = 0; xx < S; xx++) {
            int sx = xx + kx - 1;
            if (sx >= 0 && sx < S)
              dx[(c * S + sy) * S + sx] += row[y * S + xx];
          }
        }
      }
}

/* y [n, Co, S, S] = conv3x3(x [n, Ci, S, S], w [Co, Ci*9]). */
static void conv_fwd(const float *x, const float *w, float *y, int n, int Ci,
                     int Co, int S, float *cols) {
  for (int i = 0; i < n; i++) {
    im2col(x + (size_t)i * Ci * S * S, Ci, S, cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Co, S * S, Ci * 9,
                1.0f, w, Ci * 9, cols, S * S, 0.0f, y + (size_t)i * Co * S * S,
                S * S);
  }
}

/* dw += dY x cols^T; dx = col2im(W^T x dY) (dx may be NULL: none). */
static void conv_bwd(const float *x, const float *w, const float *dy, float *dw,
                     float *dx, int n, int Ci, int Co, int S, float *cols) {
  size_t in = (size_t)Ci * S * S, out = (size_t)Co * S * S;
  if (dx != NULL)
    memset(dx, 0, sizeof(float) * in * (size_t)n);
  for (int i = 0; i < n; i++) {
    im2col(x + i * in, Ci, S, cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Co, Ci * 9, S * S,
                1.0f, dy + i * out, S * S, cols, S * S, 1.0f, dw, Ci * 9);
    if (dx == NULL)
      continue;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Ci * 9, S * S, Co,
                1.0f, w, Ci * 9, dy + i * out, S * S, 0.0f, cols, S * S);
    col2im(cols, Ci, S, dx + i * in);
  }
}

static void relu(const float *x, float *y, size_t len) {
  for (size_t i = 0; i < len; i++)
    y[i] = x[i] > 0 ? x[i] : 0;
}

/* d *= (y > 0), y the ReLU's output (or its input: the same sign). */
static void relu_bwd(const float *y, float *d, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (!(y[i] > 0))
      d[i] = 0;
}

/* 2x2 max pool, stride 2: [n*C, S, S] -> [n*C, S/2, S/2]; argmax kept. */
static void pool_fwd(const float *x, float *y, int32_t *arg, int nc, int S) {
  int H = S / 2;
  for (int i = 0; i < nc; i++)
    for (int a = 0; a < H; a++)
      for (int b = 0; b < H; b++) {
        int best = (2 * a) * S + 2 * b;
        for (int dy = 0; dy < 2; dy++)
          for (int dx = 0; dx < 2; dx++) {
            int k = (2 * a + dy) * S + 2 * b + dx;
            if (x[(size_t)i * S * S + k] > x[(size_t)i * S * S + best])
              best = k;
          }
        y[((size_t)i * H + a) * H + b] = x[(size_t)i * S * S + best];
        arg[((size_t)i * H + a) * H + b] = best;
      }
}

static void pool_bwd(const float *dy, const int32_t *arg, float *dx, int nc,
                     int S) {
  int H = S / 2;
  memset(dx, 0, sizeof(float) * (size_t)nc * S * S);
  for (int i = 0; i < nc; i++)
    for (int k = 0; k < H * H; k++)
      dx[(size_t)i * S * S + arg[(size_t)i * H * H + k]] +=
          dy[(size_t)i * H * H + k];
}

static hvd_tensor_t t4(float *d, int n, int c, int s) {
  int64_t shape[4] = {n, c, s, s};
  return hvd_tensor_make(d, HVD_FLOAT32, 4, shape);
}

/* Batch norm k over this rank's batch only (torch's BatchNorm2d in
 * training): the same formulas as hvd's synchronized one, without the
 * allreduces. */
static hvd_result_t local_bn_fwd(cnn_t *m, int k, const float *x, float *y,
                                 int s) {
  const int n = m->n, W = m->w, HW = s * s;
  const float *w = val(m, P_BN1_W + 3 * k), *b = val(m, P_BN1_B + 3 * k);
  float *rm = m->b[2 * k].value.data, *rv = m->b[2 * k + 1].value.data;
  double cnt = (double)n * HW;
  if (cnt <= 1)
    return HVD_ERR_INVALID_ARG;
  for (int c = 0; c < W; c++) {
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < HW; j++) {
        double v = x[((size_t)i * W + c) * HW + j];
        sum += v, sq += v * v;
      }
    double mean = sum / cnt, var = fmax(sq / cnt - mean * mean, 0.0);
    double inv = 1 / sqrt(var + BN_EPS);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < HW; j++) {
        size_t q = ((size_t)i * W + c) * HW + j;
        y[q] = (float)((x[q] - mean) * inv * w[c] + b[c]);
      }
    rm[c] = (float)((1 - BN_MOMENTUM) * rm[c] + BN_MOMENTUM * mean);
    rv[c] = (float)((1 - BN_MOMENTUM) * rv[c] +
                    BN_MOMENTUM * var * cnt / (cnt - 1));
    m->mean[k][c] = (float)mean;
    m->invstd[k][c] = (float)inv;
  }
  return HVD_SUCCESS;
}

static void local_bn_bwd(cnn_t *m, int k, const float *x, const float *dy,
                         float *dx, int s) {
  const int n = m->n, W = m->w, HW = s * s;
  const float *w = val(m, P_BN1_W + 3 * k);
  float *dw = grad(m, P_BN1_W + 3 * k), *db = grad(m, P_BN1_B + 3 * k);
  double cnt = (double)n * HW;
  for (int c = 0; c < W; c++) {
    double sdy = 0, sdyx = 0, mean = m->mean[k][c], inv = m->invstd[k][c];
    for (int i = 0; i < n; i++)
      for (int j = 0; j < HW; j++) {
        size_t q = ((size_t)i * W + c) * HW + j;
        sdy += dy[q];
        sdyx += dy[q] * (x[q] - mean);
      }
    dw[c] += (float)(sdyx * inv);
    db[c] += (float)sdy;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < HW; j++) {
        size_t q = ((size_t)i * W + c) * HW + j;
        dx[q] = (float)(w[c] * inv *
                        (dy[q] - sdy / cnt -
                         (x[q] - mean) * inv * inv * sdyx / cnt));
      }
  }
}

void cnn_set_sync_bn(cnn_t *m, int sync) { m->sync_bn = sync != 0; }

/* Batch norm k (0..2) over [n, W, s, s]: synchronized or local. */
static hvd_result_t bn_fwd(cnn_t *m, int k, const float *x, float *y, int s) {
  static const char *const names[3] = {"bn1", "bn2", "bn3"};
  if (!m->sync_bn)
    return local_bn_fwd(m, k, x, y, s);
  /* the tensor's data is not const; hvd only reads x */
  hvd_tensor_t tx = t4((float *)x, m->n, m->w, s), ty = t4(y, m->n, m->w, s);
  int wi = P_BN1_W + 3 * k;
  return hvd_sync_batch_norm_forward(names[k], &tx, val(m, wi), val(m, wi + 1),
                                     m->b[2 * k].value.data,
                                     m->b[2 * k + 1].value.data, BN_MOMENTUM,
                                     BN_EPS, &ty, m->mean[k], m->invstd[k]);
}

static hvd_result_t bn_bwd(cnn_t *m, int k, float *x, float *dy, float *dx,
                           int s) {
  static const char *const names[3] = {"bn1", "bn2", "bn3"};
  if (!m->sync_bn) {
    local_bn_bwd(m, k, x, dy, dx, s);
    return HVD_SUCCESS;
  }
  hvd_tensor_t tx = t4(x, m->n, m->w, s), tdy = t4(dy, m->n, m->w, s),
               tdx = t4(dx, m->n, m->w, s);
  int wi = P_BN1_W + 3 * k;
  return hvd_sync_batch_norm_backward(names[k], &tx, &tdy, val(m, wi),
                                      m->mean[k], m->invstd[k], &tdx,
                                      grad(m, wi), grad(m, wi + 1));
}

/* Inference batch norm k with the running statistics, in place. */
static void bn_eval(cnn_t *m, int k, const float *x, float *y, int n, int s) {
  const float *rm = m->b[2 * k].value.data, *rv = m->b[2 * k + 1].value.data;
  const float *w = val(m, P_BN1_W + 3 * k), *b = val(m, P_BN1_B + 3 * k);
  for (int i = 0; i < n; i++)
    for (int c = 0; c < m->w; c++) {
      float sc = w[c] / sqrtf(rv[c] + (float)BN_EPS);
      size_t at = ((size_t)i * m->w + c) * s * s;
      for (int j = 0; j < s * s; j++)
        y[at + j] = (x[at + j] - rm[c]) * sc + b[c];
    }
}

/* Batch norm k of x into y: the batch's statistics when training, the
 * running ones for evaluation. */
static hvd_result_t norm(cnn_t *m, int k, const float *x, float *y, int n,
                         int s, int train) {
  if (train)
    return bn_fwd(m, k, x, y, s);
  bn_eval(m, k, x, y, n, s);
  return HVD_SUCCESS;
}

/* ---- the model ----------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_normal(uint64_t *s) { /* Box-Muller */
  double u = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
  double v = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* The values and gradients (total floats each), the running statistics
 * and the batch's small arrays; with host_scratch the activations and
 * scratch of the CPU path too. 0 if an allocation failed. */
static int alloc_arrays(cnn_t *m, size_t total, int host_scratch) {
  int W = m->w;
  size_t B = (size_t)m->maxb, big = B * W * S1 * S1, small = B * W * S2 * S2;
  m->vals = calloc(total, sizeof(float));
  m->grads = calloc(total, sizeof(float));
  m->bufs = calloc(6 * (size_t)W, sizeof(float));
  m->gap = malloc(sizeof(float) * B * W);
  m->prob = malloc(sizeof(float) * B * CNN_CLASSES);
  m->labels = malloc(sizeof(int32_t) * B);
  if (host_scratch) {
    m->x = malloc(sizeof(float) * B * CNN_PIXELS);
    m->c1 = malloc(sizeof(float) * big);
    m->n1 = malloc(sizeof(float) * big);
    m->r1 = malloc(sizeof(float) * big);
    m->argmax = malloc(sizeof(int32_t) * small);
    m->p1 = malloc(sizeof(float) * small);
    m->c2 = malloc(sizeof(float) * small);
    m->n2 = malloc(sizeof(float) * small);
    m->r2 = malloc(sizeof(float) * small);
    m->c3 = malloc(sizeof(float) * small);
    m->n3 = malloc(sizeof(float) * small);
    m->s3 = malloc(sizeof(float) * small);
    m->cols = malloc(sizeof(float) * 9 * (size_t)(W > 3 ? W : 3) * S1 * S1);
    m->da = malloc(sizeof(float) * big);
    m->db = malloc(sizeof(float) * big);
    m->dc = malloc(sizeof(float) * big);
  }
  int missing = !m->vals || !m->grads || !m->bufs || !m->gap || !m->prob ||
                !m->labels ||
                (host_scratch &&
                 (!m->x || !m->c1 || !m->n1 || !m->r1 || !m->argmax || !m->p1 ||
                  !m->c2 || !m->n2 || !m->r2 || !m->c3 || !m->n3 || !m->s3 ||
                  !m->cols || !m->da || !m->db || !m->dc));
  return !missing;
}

/* Parameter i's tensors at offset off[i] of the blocks, and its first
 * values: He-normal weights, batch-norm scales 1, the rest 0. */
static void init_params(cnn_t *m, int64_t shapes[NPARAMS][4], const int *ndims,
                        const size_t *off, uint64_t seed) {
  uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
  for (int i = 0; i < NPARAMS; i++) {
    m->p[i].name = pnames[i];
    m->p[i].value =
        hvd_tensor_make(m->vals + off[i], HVD_FLOAT32, ndims[i], shapes[i]);
    m->p[i].grad =
        hvd_tensor_make(m->grads + off[i], HVD_FLOAT32, ndims[i], shapes[i]);
    float *v = m->vals + off[i];
    int64_t k = hvd_tensor_numel(&m->p[i].value);
    if (ndims[i] > 1) { /* He-normal: std sqrt(2 / fan_in) */
      double fan = (double)(k / shapes[i][0]);
      for (int64_t j = 0; j < k; j++)
        v[j] = (float)(rng_normal(&s) * sqrt(2.0 / fan));
    } else if (i == P_BN1_W || i == P_BN2_W || i == P_BN3_W) {
      for (int64_t j = 0; j < k; j++)
        v[j] = 1.0f;
    }
  }
}

/* The batch norms' running statistics: means 0, variances 1. */
static void init_buffers(cnn_t *m) {
  int W = m->w;
  for (int i = 0; i < 6; i++) {
    int64_t w1 = W;
    m->b[i].name = bnames[i];
    m->b[i].value =
        hvd_tensor_make(m->bufs + (size_t)i * W, HVD_FLOAT32, 1, &w1);
    m->b[i].grad = hvd_tensor_make(NULL, HVD_FLOAT32, 1, &w1);
    if (i % 2 == 1) /* running variances start at 1 */
      for (int c = 0; c < W; c++)
        m->bufs[(size_t)i * W + c] = 1.0f;
  }
}

/* The model with its host values; the activations and scratch of the
 * CPU path only when host_scratch. */
static cnn_t *create(int width, int max_batch, uint64_t seed,
                     int host_scratch) {
  if (width < 1 || width > 64 || max_batch < 1)
    return NULL;
  cnn_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return NULL;
  int W = m->w = width;
  m->maxb = max_batch;
  m->sync_bn = 1;
  int64_t shapes[NPARAMS][4] = {
      {W, 3, 3, 3}, {W}, {W}, {W, W, 3, 3},     {W},          {W},
      {W, W, 3, 3}, {W}, {W}, {CNN_CLASSES, W}, {CNN_CLASSES}};
  int ndims[NPARAMS] = {4, 1, 1, 4, 1, 1, 4, 1, 1, 2, 1};
  size_t total = 0, off[NPARAMS];
  for (int i = 0; i < NPARAMS; i++) {
    size_t k = 1;
    for (int d = 0; d < ndims[i]; d++)
      k *= (size_t)shapes[i][d];
    off[i] = total;
    total += k;
  }
  if (!alloc_arrays(m, total, host_scratch)) {
    cnn_destroy(m);
    return NULL;
  }
  init_params(m, shapes, ndims, off, seed);
  init_buffers(m);
  return m;
}

cnn_t *cnn_create(int width, int max_batch, uint64_t seed) {
  return create(width, max_batch, seed, 1);
}

cnn_t *cnn_create_on(int width, int max_batch, uint64_t seed, int device,
                     char *msg, size_t len) {
  char dummy[8];
  if (msg == NULL || len == 0)
    msg = dummy, len = sizeof dummy;
  msg[0] = '\0';
  if (device == HVD_CPU) {
    cnn_t *m = cnn_create(width, max_batch, seed);
    if (m == NULL)
      snprintf(msg, len, "out of memory or bad sizes (width %d, batch %d)",
               width, max_batch);
    return m;
  }
  cnn_t *m = create(width, max_batch, seed, 0);
  if (m == NULL) {
    snprintf(msg, len, "out of memory or bad sizes (width %d, batch %d)", width,
             max_batch);
    return NULL;
  }
  if (cnn_gpu_open(m, device) != 0) {
    snprintf(msg, len, "%s", m->err);
    cnn_destroy(m);
    return NULL;
  }
  return m;
}

const char *cnn_last_error(const cnn_t *m) { return m->err; }

int cnn_device(const cnn_t *m) { return m->p[0].value.device; }

void cnn_destroy(cnn_t *m) {
  if (m == NULL)
    return;
  cnn_gpu_close(m);
  float *f[] = {m->vals, m->grads, m->bufs, m->x,  m->c1, m->n1, m->r1,
                m->p1,   m->c2,    m->n2,   m->r2, m->c3, m->n3, m->s3,
                m->gap,  m->prob,  m->cols, m->da, m->db, m->dc};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    free(f[i]);
  free(m->argmax);
  free(m->labels);
  free(m);
}

hvd_param_t *cnn_params(cnn_t *m, int *n) {
  *n = NPARAMS;
  return m->p;
}

hvd_param_t *cnn_buffers(cnn_t *m, int *n) {
  *n = 6;
  return m->b;
}

/* The convolutions, pool and block up to the block's output m->s3 (before
 * its ReLU), training (batch norm synchronized) or eval. */
static hvd_result_t trunk(cnn_t *m, const float *x, int n, int train) {
  const int W = m->w;
  size_t big = (size_t)n * W * S1 * S1, small = (size_t)n * W * S2 * S2;
  hvd_result_t rc;
  conv_fwd(x, val(m, P_CONV1), m->c1, n, 3, W, S1, m->cols);
  if ((rc = norm(m, 0, m->c1, m->n1, n, S1, train)) != HVD_SUCCESS)
    return rc;
  relu(m->n1, m->r1, big);
  pool_fwd(m->r1, m->p1, m->argmax, n * W, S1);
  conv_fwd(m->p1, val(m, P_CONV2), m->c2, n, W, W, S2, m->cols);
  if ((rc = norm(m, 1, m->c2, m->n2, n, S2, train)) != HVD_SUCCESS)
    return rc;
  relu(m->n2, m->r2, small);
  conv_fwd(m->r2, val(m, P_CONV3), m->c3, n, W, W, S2, m->cols);
  if ((rc = norm(m, 2, m->c3, m->n3, n, S2, train)) != HVD_SUCCESS)
    return rc;
  for (size_t i = 0; i < small; i++)
    m->s3[i] = m->n3[i] + m->p1[i];
  return HVD_SUCCESS;
}

/* The block's ReLU and the global average pool of m->s3: m->gap. */
static void pool_gap(cnn_t *m, int n) {
  const int W = m->w, HW = S2 * S2;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < W; c++) {
      const float *s = m->s3 + ((size_t)i * W + c) * HW;
      double acc = 0;
      for (int j = 0; j < HW; j++)
        acc += s[j] > 0 ? s[j] : 0;
      m->gap[i * W + c] = (float)(acc / HW);
    }
}

/* Classifier and softmax of m->gap (host, on every backend): m->prob;
 * loss and correct from labels. The fc weights are read from fw, fb. */
static void classify(cnn_t *m, const float *fw, const float *fb, int n,
                     const int32_t *labels, double *loss, int *correct) {
  const int W = m->w;
  double sum = 0;
  int right = 0;
  for (int i = 0; i < n; i++) {
    float *p = m->prob + i * CNN_CLASSES;
    float mx = -INFINITY;
    int arg = 0;
    for (int k = 0; k < CNN_CLASSES; k++) {
      double z = fb[k];
      for (int c = 0; c < W; c++)
        z += (double)fw[k * W + c] * m->gap[i * W + c];
      p[k] = (float)z;
      if (p[k] > mx)
        mx = p[k], arg = k;
    }
    double se = 0;
    for (int k = 0; k < CNN_CLASSES; k++)
      se += exp((double)p[k] - mx);
    for (int k = 0; k < CNN_CLASSES; k++)
      p[k] = (float)(exp((double)p[k] - mx) / se);
    sum += -log(fmax((double)p[labels[i]], 1e-30));
    right += arg == labels[i];
  }
  *loss = n > 0 ? sum / n : 0;
  *correct = right;
}

/* Softmax cross-entropy and the classifier backward: dlogits = (p - y) / n;
 * gfw, gfb += the classifier's gradients; dgap [n, W] = dlogits x fw. */
static void classify_bwd(cnn_t *m, const float *fw, float *gfw, float *gfb,
                         float *dgap) {
  const int W = m->w, n = m->n;
  memset(dgap, 0, sizeof(float) * (size_t)n * W);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < CNN_CLASSES; k++) {
      float d = (m->prob[i * CNN_CLASSES + k] - (k == m->labels[i])) / n;
      gfb[k] += d;
      for (int c = 0; c < W; c++) {
        gfw[k * W + c] += d * m->gap[i * W + c];
        dgap[i * W + c] += d * fw[k * W + c];
      }
    }
}

/* The fc weights on the host: the model's own, or (GPU) a copy. */
static hvd_result_t fc_host(cnn_t *m, float *fw, float *fb) {
  size_t nw = (size_t)CNN_CLASSES * m->w;
  if (m->gpu == NULL) {
    memcpy(fw, val(m, P_FC_W), sizeof(float) * nw);
    memcpy(fb, val(m, P_FC_B), sizeof(float) * CNN_CLASSES);
    return HVD_SUCCESS;
  }
  return cnn_gpu_fc_weights(m, fw, fb);
}

/* The head of forward and eval: gap (already in m->gap), classifier. */
static hvd_result_t head(cnn_t *m, int n, const int32_t *labels, double *loss,
                         int *correct) {
  float fw[CNN_CLASSES * 64], fb[CNN_CLASSES];
  hvd_result_t rc = fc_host(m, fw, fb);
  if (rc == HVD_SUCCESS)
    classify(m, fw, fb, n, labels, loss, correct);
  return rc;
}

hvd_result_t cnn_forward(cnn_t *m, const float *x, int n, const int32_t *labels,
                         double *loss, int *correct) {
  m->ready_for_backward = 0;
  m->err[0] = '\0';
  if (n < 0 || n > m->maxb)
    return HVD_ERR_INVALID_ARG;
  m->n = n;
  if (n > 0)
    memcpy(m->labels, labels, sizeof(int32_t) * (size_t)n);
  hvd_result_t rc;
  if (m->gpu != NULL) {
    rc = cnn_gpu_features(m, x, n, 1);
  } else {
    if (n > 0)
      memcpy(m->x, x, sizeof(float) * (size_t)n * CNN_PIXELS);
    rc = trunk(m, m->x, n, 1);
    if (rc == HVD_SUCCESS)
      pool_gap(m, n);
  }
  if (rc == HVD_SUCCESS)
    rc = head(m, n, m->labels, loss, correct);
  if (rc != HVD_SUCCESS)
    return rc;
  m->ready_for_backward = 1;
  return HVD_SUCCESS;
}

hvd_result_t cnn_eval(cnn_t *m, const float *x, int n, const int32_t *labels,
                      int *correct) {
  m->ready_for_backward = 0;
  m->err[0] = '\0';
  if (n < 0 || n > m->maxb)
    return HVD_ERR_INVALID_ARG;
  double loss;
  hvd_result_t rc;
  if (m->gpu != NULL) {
    rc = cnn_gpu_features(m, x, n, 0);
  } else {
    rc = trunk(m, x, n, 0);
    if (rc == HVD_SUCCESS)
      pool_gap(m, n);
  }
  if (rc == HVD_SUCCESS)
    rc = head(m, n, labels, &loss, correct);
  return rc;
}

/* The GPU's backward: the classifier's part on the host, into zeroed
 * host arrays that the backend adds into its gradients. */
static hvd_result_t gpu_backward(cnn_t *m, cnn_ready_fn ready, void *ctx) {
  const int W = m->w;
  float fw[CNN_CLASSES * 64], fb[CNN_CLASSES];
  float dfw[CNN_CLASSES * 64] = {0}, dfb[CNN_CLASSES] = {0};
  float *dgap = malloc(sizeof(float) * ((size_t)m->n * W + 1));
  if (dgap == NULL)
    return HVD_ERR_NO_MEMORY;
  hvd_result_t rc = fc_host(m, fw, fb);
  if (rc == HVD_SUCCESS) {
    classify_bwd(m, fw, dfw, dfb, dgap);
    rc = cnn_gpu_backward(m, dgap, dfw, dfb, ready, ctx);
  }
  free(dgap);
  return rc;
}

hvd_result_t cnn_backward(cnn_t *m, cnn_ready_fn ready, void *ctx) {
  if (!m->ready_for_backward)
    return HVD_ERR_INVALID_ARG;
  m->ready_for_backward = 0;
  m->err[0] = '\0';
  if (m->gpu != NULL)
    return gpu_backward(m, ready, ctx);
  const int W = m->w, n = m->n, HW = S2 * S2;
  size_t big = (size_t)n * W * S1 * S1, small = (size_t)n * W * S2 * S2;
  hvd_result_t rc;
#define READY(i)                                                               \
  do {                                                                         \
    if (ready != NULL)                                                         \
      ready(ctx, (i));                                                         \
  } while (0)
  float *dgap = m->dc; /* [n, W] */
  classify_bwd(m, val(m, P_FC_W), grad(m, P_FC_W), grad(m, P_FC_B), dgap);
  READY(P_FC_B);
  READY(P_FC_W);
  /* average pool and the block's ReLU: ds3 into da */
  float *ds3 = m->da;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < W; c++)
      for (int j = 0; j < HW; j++) {
        size_t k = ((size_t)i * W + c) * HW + j;
        ds3[k] = m->s3[k] > 0 ? dgap[i * W + c] / HW : 0;
      }
  /* bn3 then conv3: dr2 into dc */
  if ((rc = bn_bwd(m, 2, m->c3, ds3, m->db, S2)) != HVD_SUCCESS)
    return rc;
  READY(P_BN3_W);
  READY(P_BN3_B);
  conv_bwd(m->r2, val(m, P_CONV3), m->db, grad(m, P_CONV3), m->dc, n, W, W, S2,
           m->cols);
  READY(P_CONV3);
  relu_bwd(m->n2, m->dc, small);
  if ((rc = bn_bwd(m, 1, m->c2, m->dc, m->db, S2)) != HVD_SUCCESS)
    return rc;
  READY(P_BN2_W);
  READY(P_BN2_B);
  /* conv2 into dc, plus the skip's ds3: dp1 */
  conv_bwd(m->p1, val(m, P_CONV2), m->db, grad(m, P_CONV2), m->dc, n, W, W, S2,
           m->cols);
  READY(P_CONV2);
  for (size_t i = 0; i < small; i++)
    m->dc[i] += ds3[i];
  /* pool, ReLU, bn1, conv1 */
  pool_bwd(m->dc, m->argmax, m->db, n * W, S1);
  relu_bwd(m->n1, m->db, big);
  if ((rc = bn_bwd(m, 0, m->c1, m->db, m->da, S1)) != HVD_SUCCESS)
    return rc;
  READY(P_BN1_W);
  READY(P_BN1_B);
  conv_bwd(m->x, val(m, P_CONV1), m->da, grad(m, P_CONV1), NULL, n, 3, W, S1,
           m->cols);
  READY(P_CONV1);
#undef READY
  return HVD_SUCCESS;
}

#ifndef HVD_HAVE_CUDA
/* A build without CUDA: no GPU backend. */
int cnn_gpu_open(cnn_t *m, int device) {
  (void)device;
  snprintf(m->err, sizeof m->err,
           "this build has no CUDA (configure found no toolkit, or "
           "--without-cuda)");
  return -1;
}
void cnn_gpu_close(cnn_t *m) { (void)m; }
hvd_result_t cnn_gpu_features(cnn_t *m, const float *x, int n, int train) {
  (void)m, (void)x, (void)n, (void)train;
  return HVD_ERR_UNSUPPORTED;
}
hvd_result_t cnn_gpu_backward(cnn_t *m, const float *dgap, const float *dfw,
                              const float *dfb, cnn_ready_fn ready, void *ctx) {
  (void)m, (void)dgap, (void)dfw, (void)dfb, (void)ready, (void)ctx;
  return HVD_ERR_UNSUPPORTED;
}
hvd_result_t cnn_gpu_fc_weights(cnn_t *m, float *fw, float *fb) {
  (void)m, (void)fw, (void)fb;
  return HVD_ERR_UNSUPPORTED;
}
#endif
