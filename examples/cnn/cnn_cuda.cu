/*
 * cnn_cuda.cu - the GPU backend of the CIFAR CNN (cnn.h, cnn_create_on):
 * the trunk of cnn.c on device memory, one stream and one cuBLAS handle
 * per model.
 *
 *   3x3 convolutions    im2col of a chunk of images (a kernel), then one
 *                       strided-batched GEMM per chunk (weights shared:
 *                       stride 0); the backward adds dY x cols^T into the
 *                       weight gradient image by image (GEMMs with beta 1,
 *                       in order) and scatters W^T x dY back through col2im
 *                       (a gather kernel: no atomics, reproducible)
 *   batch norm          hvd_sync_batch_norm_* on device tensors, or (per-
 *                       rank statistics) kernels of this file, a block per
 *                       channel summing in double as cnn.c does
 *   ReLU, pool, add     element kernels; the pool's backward a gather
 *   average pool        a thread per (image, channel), in double
 *
 * The classifier (10 x W) and the softmax run on the host, in cnn.c, for
 * both backends: gap comes back, dgap and the classifier's gradients go
 * down. Row-major vs cuBLAS (column-major): a row-major [r, c] matrix is
 * cuBLAS's [c, r] with the same leading dimension, so each GEMM below
 * computes the transpose of the row-major product it names, operands
 * swapped. Numerics: float32, -fmad=false (Makefile.am), the CPU's
 * expressions; the GEMMs' summation order is cuBLAS's, so results agree
 * with the CPU to rounding, not bit for bit.
 *
 * Synchronisation with hvd: its optimizers and collectives read device
 * memory on streams of their own and want inputs complete when called.
 * The model's stream is a blocking one (it orders with the legacy default
 * stream, which hvd's sync batch norm uses), and the stream is
 * synchronised before each ready() and before any hvd call.
 */
#include <config.h>

#include "cnn_impl.h"

#include "hvd.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

const int kThreads = 256;
/* im2col columns of a chunk of images: at most this many floats */
const size_t kColsFloats = (size_t)16 << 20;

struct Gpu {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  float *vals, *grads, *bufs;
  float *x, *c1, *n1, *r1, *p1, *c2, *n2, *r2, *c3, *n3, *s3;
  int32_t *argmax;
  float *gap, *dgap, *dfc; /* dfc: [10 * W + 10] */
  float *da, *db, *dc;
  float *cols;
  int chunk;            /* images per im2col chunk */
  float *mean, *invstd; /* [3][W]: each batch norm's saved statistics */
};

Gpu *G(cnn_t *m) { return reinterpret_cast<Gpu *>(m->gpu); }

/* Records the first failure in m->err; false on failure. */
bool cuda_ok(cnn_t *m, cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return true;
  if (m->err[0] == '\0')
    snprintf(m->err, sizeof m->err, "%s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
  return false;
}

bool blas_ok(cnn_t *m, cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return true;
  if (m->err[0] == '\0')
    snprintf(m->err, sizeof m->err, "%s: cuBLAS status %d", what, (int)s);
  return false;
}

bool launched(cnn_t *m, const char *what) {
  return cuda_ok(m, cudaPeekAtLastError(), what);
}

unsigned blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1 ? 1 : b > 1u << 20 ? 1u << 20 : b);
}

#define GRID_LOOP(i, n)                                                        \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* ---- element kernels -------------------------------------------------------
 */

/* cols [g][C*9][S*S] of g images x [g][C][S][S], zero padding (cnn.c's
 * im2col). */
__global__ void im2col_kernel(const float *x, int C, int S, int g,
                              float *cols) {
  const size_t SS = (size_t)S * S, per = (size_t)C * 9 * SS;
  GRID_LOOP(q, per * g) {
    size_t i = q / per, r = q % per;
    int row = (int)(r / SS), pix = (int)(r % SS);
    int c = row / 9, ky = row / 3 % 3, kx = row % 3;
    int sy = pix / S + ky - 1, sx = pix % S + kx - 1;
    cols[q] = sy >= 0 && sy < S && sx >= 0 && sx < S
                  ? x[((i * C + c) * S + sy) * S + sx]
                  : 0.0f;
  }
}

/* dx [g][C][S][S] = the sum of the columns' gradients that read each
 * pixel (cnn.c's col2im after a memset, as a gather). */
__global__ void col2im_kernel(const float *dcols, int C, int S, int g,
                              float *dx) {
  const size_t SS = (size_t)S * S, per = (size_t)C * SS;
  GRID_LOOP(q, per * g) {
    size_t i = q / per, r = q % per;
    int c = (int)(r / SS), sy = (int)(r % SS) / S, sx = (int)(r % SS) % S;
    const float *base = dcols + i * (size_t)C * 9 * SS;
    float acc = 0.0f;
    for (int ky = 0; ky < 3; ky++) {
      int y = sy - ky + 1;
      if (y < 0 || y >= S)
        continue;
      for (int kx = 0; kx < 3; kx++) {
        int xx = sx - kx + 1;
        if (xx >= 0 && xx < S)
          acc += base[((size_t)(c * 3 + ky) * 3 + kx) * SS + y * S + xx];
      }
    }
    dx[q] = acc;
  }
}

__global__ void relu_kernel(const float *x, float *y, size_t n) {
  GRID_LOOP(i, n) { y[i] = x[i] > 0 ? x[i] : 0; }
}

/* d *= (y > 0) */
__global__ void relu_bwd_kernel(const float *y, float *d, size_t n) {
  GRID_LOOP(i, n) {
    if (!(y[i] > 0))
      d[i] = 0;
  }
}

__global__ void add_kernel(const float *a, const float *b, float *y, size_t n) {
  GRID_LOOP(i, n) { y[i] = a[i] + b[i]; }
}

/* 2x2 max pool, stride 2, over nc planes of S x S (the first maximum). */
__global__ void pool_kernel(const float *x, float *y, int32_t *arg, int nc,
                            int S) {
  const int H = S / 2;
  GRID_LOOP(q, (size_t)nc * H * H) {
    size_t i = q / ((size_t)H * H);
    int a = (int)(q % ((size_t)H * H)) / H, b = (int)(q % ((size_t)H * H)) % H;
    const float *p = x + i * S * S;
    int best = (2 * a) * S + 2 * b;
    for (int dy = 0; dy < 2; dy++)
      for (int dx = 0; dx < 2; dx++) {
        int k = (2 * a + dy) * S + 2 * b + dx;
        if (p[k] > p[best])
          best = k;
      }
    y[q] = p[best];
    arg[q] = best;
  }
}

/* dx [nc][S][S]: dy at each window's maximum, 0 elsewhere (a gather). */
__global__ void pool_bwd_kernel(const float *dy, const int32_t *arg, float *dx,
                                int nc, int S) {
  const int H = S / 2;
  GRID_LOOP(q, (size_t)nc * S * S) {
    size_t i = q / ((size_t)S * S);
    int k = (int)(q % ((size_t)S * S)), y = k / S, x = k % S;
    size_t o = (i * H + y / 2) * H + x / 2;
    dx[q] = arg[o] == k ? dy[o] : 0.0f;
  }
}

/* gap [n][W] = mean over HW of relu(s3) (in double, as cnn.c). */
__global__ void gap_kernel(const float *s3, float *gap, int nw, int HW) {
  GRID_LOOP(q, (size_t)nw) {
    const float *s = s3 + q * HW;
    double acc = 0;
    for (int j = 0; j < HW; j++)
      acc += s[j] > 0 ? s[j] : 0;
    gap[q] = (float)(acc / HW);
  }
}

/* ds3 = s3 > 0 ? dgap / HW : 0 */
__global__ void gap_bwd_kernel(const float *s3, const float *dgap, float *ds3,
                               size_t n, int HW) {
  GRID_LOOP(q, n) { ds3[q] = s3[q] > 0 ? dgap[q / HW] / HW : 0; }
}

__global__ void add_into_kernel(float *dst, const float *src, int n) {
  GRID_LOOP(i, (size_t)n) { dst[i] += src[i]; }
}

/* ---- per-rank batch norm (cnn.c's local_bn_*), a block per channel ------- */

/* The block's sums of a and b (double), in thread 0's registers. */
__device__ void block_sum2(double &a, double &b) {
  __shared__ double sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if ((int)threadIdx.x < h) {
      sa[threadIdx.x] += sa[threadIdx.x + h];
      sb[threadIdx.x] += sb[threadIdx.x + h];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

/* Channel c's mean and 1/std over [n, W, HW], y, running statistics. */
__global__ void bn_fwd_kernel(const float *x, float *y, const float *w,
                              const float *b, float *rm, float *rv,
                              float *mean_out, float *inv_out, int n, int W,
                              int HW) {
  const int c = blockIdx.x;
  double sum = 0, sq = 0;
  for (int q = threadIdx.x; q < n * HW; q += kThreads) {
    double v = x[((size_t)(q / HW) * W + c) * HW + q % HW];
    sum += v, sq += v * v;
  }
  block_sum2(sum, sq);
  double cnt = (double)n * HW;
  double mean = sum / cnt, var = fmax(sq / cnt - mean * mean, 0.0);
  double inv = 1 / sqrt(var + BN_EPS);
  for (int q = threadIdx.x; q < n * HW; q += kThreads) {
    size_t at = ((size_t)(q / HW) * W + c) * HW + q % HW;
    y[at] = (float)((x[at] - mean) * inv * w[c] + b[c]);
  }
  if (threadIdx.x == 0) {
    rm[c] = (float)((1 - BN_MOMENTUM) * rm[c] + BN_MOMENTUM * mean);
    rv[c] = (float)((1 - BN_MOMENTUM) * rv[c] +
                    BN_MOMENTUM * var * cnt / (cnt - 1));
    mean_out[c] = (float)mean;
    inv_out[c] = (float)inv;
  }
}

__global__ void bn_bwd_kernel(const float *x, const float *dy, float *dx,
                              const float *w, const float *mean_in,
                              const float *inv_in, float *dw, float *db, int n,
                              int W, int HW) {
  const int c = blockIdx.x;
  const double mean = mean_in[c], inv = inv_in[c], cnt = (double)n * HW;
  double sdy = 0, sdyx = 0;
  for (int q = threadIdx.x; q < n * HW; q += kThreads) {
    size_t at = ((size_t)(q / HW) * W + c) * HW + q % HW;
    sdy += dy[at];
    sdyx += dy[at] * (x[at] - mean);
  }
  block_sum2(sdy, sdyx);
  for (int q = threadIdx.x; q < n * HW; q += kThreads) {
    size_t at = ((size_t)(q / HW) * W + c) * HW + q % HW;
    dx[at] =
        (float)(w[c] * inv *
                (dy[at] - sdy / cnt - (x[at] - mean) * inv * inv * sdyx / cnt));
  }
  if (threadIdx.x == 0) {
    dw[c] += (float)(sdyx * inv);
    db[c] += (float)sdy;
  }
}

/* Inference: the running statistics (cnn.c's bn_eval). */
__global__ void bn_eval_kernel(const float *x, float *y, const float *w,
                               const float *b, const float *rm, const float *rv,
                               int W, int HW, size_t total) {
  GRID_LOOP(q, total) {
    int c = (int)(q / HW % W);
    float sc = w[c] / sqrtf(rv[c] + (float)BN_EPS);
    y[q] = (x[q] - rm[c]) * sc + b[c];
  }
}

/* ---- layers -----------------------------------------------------------------
 */

float *val(cnn_t *m, int i) { return static_cast<float *>(m->p[i].value.data); }
float *grad(cnn_t *m, int i) { return static_cast<float *>(m->p[i].grad.data); }

/* y [n][Co][S][S] = conv3x3(x [n][Ci][S][S], w [Co][Ci*9]). */
bool conv_fwd(cnn_t *m, const float *x, const float *w, float *y, int n, int Ci,
              int Co, int S) {
  Gpu *g = G(m);
  const int SS = S * S, K = Ci * 9;
  const float one = 1.0f, zero = 0.0f;
  for (int i0 = 0; i0 < n; i0 += g->chunk) {
    int c = n - i0 < g->chunk ? n - i0 : g->chunk;
    im2col_kernel<<<blocks((size_t)c * K * SS), kThreads, 0, g->stream>>>(
        x + (size_t)i0 * Ci * SS, Ci, S, c, g->cols);
    if (!launched(m, "im2col"))
      return false;
    /* per image, row-major Y [Co, SS] = W [Co, K] x cols [K, SS]:
     * cuBLAS Y^T [SS, Co] = cols^T [SS, K] x W^T [K, Co] */
    if (!blas_ok(m,
                 cublasSgemmStridedBatched(
                     g->blas, CUBLAS_OP_N, CUBLAS_OP_N, SS, Co, K, &one,
                     g->cols, SS, (long long)K * SS, w, K, 0, &zero,
                     y + (size_t)i0 * Co * SS, SS, (long long)Co * SS, c),
                 "cublasSgemmStridedBatched (conv forward)"))
      return false;
  }
  return true;
}

/* dw += sum over images of dY x cols^T; dx = col2im(W^T x dY) (dx NULL:
 * none). */
bool conv_bwd(cnn_t *m, const float *x, const float *w, const float *dy,
              float *dw, float *dx, int n, int Ci, int Co, int S) {
  Gpu *g = G(m);
  const int SS = S * S, K = Ci * 9;
  const float one = 1.0f, zero = 0.0f;
  for (int i0 = 0; i0 < n; i0 += g->chunk) {
    int c = n - i0 < g->chunk ? n - i0 : g->chunk;
    const float *dyc = dy + (size_t)i0 * Co * SS;
    im2col_kernel<<<blocks((size_t)c * K * SS), kThreads, 0, g->stream>>>(
        x + (size_t)i0 * Ci * SS, Ci, S, c, g->cols);
    if (!launched(m, "im2col"))
      return false;
    /* per image, row-major dW [Co, K] += dY [Co, SS] x cols^T [SS, K]:
     * cuBLAS dW^T [K, Co] += op_T(cols^T [SS, K]) x dY^T [SS, Co] */
    for (int j = 0; j < c; j++)
      if (!blas_ok(m,
                   cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, K, Co, SS,
                               &one, g->cols + (size_t)j * K * SS, SS,
                               dyc + (size_t)j * Co * SS, SS, &one, dw, K),
                   "cublasSgemm (conv weight gradient)"))
        return false;
    if (dx == NULL)
      continue;
    /* row-major dcols [K, SS] = W^T [K, Co] x dY [Co, SS]:
     * cuBLAS dcols^T [SS, K] = dY^T [SS, Co] x W [Co, K] */
    if (!blas_ok(m,
                 cublasSgemmStridedBatched(g->blas, CUBLAS_OP_N, CUBLAS_OP_T,
                                           SS, K, Co, &one, dyc, SS,
                                           (long long)Co * SS, w, K, 0, &zero,
                                           g->cols, SS, (long long)K * SS, c),
                 "cublasSgemmStridedBatched (conv input gradient)"))
      return false;
    col2im_kernel<<<blocks((size_t)c * Ci * SS), kThreads, 0, g->stream>>>(
        g->cols, Ci, S, c, dx + (size_t)i0 * Ci * SS);
    if (!launched(m, "col2im"))
      return false;
  }
  return true;
}

hvd_tensor_t t4(cnn_t *m, float *d, int n, int c, int s) {
  int64_t shape[4] = {n, c, s, s};
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 4, shape);
  t.device = G(m)->device;
  return t;
}

bool sync(cnn_t *m, const char *what) {
  return cuda_ok(m, cudaStreamSynchronize(G(m)->stream), what);
}

const char *const bn_names[3] = {"bn1", "bn2", "bn3"};

/* Batch norm k of x into y over [n, W, s, s]: training (synchronized or
 * per rank) or eval. */
hvd_result_t norm(cnn_t *m, int k, float *x, float *y, int n, int s,
                  int train) {
  Gpu *g = G(m);
  const int W = m->w, HW = s * s, wi = P_BN1_W + 3 * k;
  float *rm = static_cast<float *>(m->b[2 * k].value.data);
  float *rv = static_cast<float *>(m->b[2 * k + 1].value.data);
  if (!train) {
    bn_eval_kernel<<<blocks((size_t)n * W * HW), kThreads, 0, g->stream>>>(
        x, y, val(m, wi), val(m, wi + 1), rm, rv, W, HW, (size_t)n * W * HW);
    return launched(m, "bn_eval") ? HVD_SUCCESS : HVD_ERR_CUDA;
  }
  if (!m->sync_bn) {
    if ((double)n * HW <= 1)
      return HVD_ERR_INVALID_ARG;
    bn_fwd_kernel<<<W, kThreads, 0, g->stream>>>(
        x, y, val(m, wi), val(m, wi + 1), rm, rv, g->mean + k * W,
        g->invstd + k * W, n, W, HW);
    return launched(m, "bn_fwd") ? HVD_SUCCESS : HVD_ERR_CUDA;
  }
  if (!sync(m, "cudaStreamSynchronize (before sync batch norm)"))
    return HVD_ERR_CUDA;
  hvd_tensor_t tx = t4(m, x, n, W, s), ty = t4(m, y, n, W, s);
  return hvd_sync_batch_norm_forward(
      bn_names[k], &tx, val(m, wi), val(m, wi + 1), rm, rv, BN_MOMENTUM, BN_EPS,
      &ty, g->mean + k * W, g->invstd + k * W);
}

hvd_result_t norm_bwd(cnn_t *m, int k, float *x, float *dy, float *dx, int s) {
  Gpu *g = G(m);
  const int W = m->w, n = m->n, HW = s * s, wi = P_BN1_W + 3 * k;
  if (!m->sync_bn) {
    bn_bwd_kernel<<<W, kThreads, 0, g->stream>>>(
        x, dy, dx, val(m, wi), g->mean + k * W, g->invstd + k * W, grad(m, wi),
        grad(m, wi + 1), n, W, HW);
    return launched(m, "bn_bwd") ? HVD_SUCCESS : HVD_ERR_CUDA;
  }
  if (!sync(m, "cudaStreamSynchronize (before sync batch norm)"))
    return HVD_ERR_CUDA;
  hvd_tensor_t tx = t4(m, x, n, W, s), tdy = t4(m, dy, n, W, s),
               tdx = t4(m, dx, n, W, s);
  return hvd_sync_batch_norm_backward(bn_names[k], &tx, &tdy, val(m, wi),
                                      g->mean + k * W, g->invstd + k * W, &tdx,
                                      grad(m, wi), grad(m, wi + 1));
}

#define CU(call, what)                                                         \
  do {                                                                         \
    if (!cuda_ok(m, (call), (what)))                                           \
      return HVD_ERR_CUDA;                                                     \
  } while (0)
#define LAUNCHED(what)                                                         \
  do {                                                                         \
    if (!launched(m, (what)))                                                  \
      return HVD_ERR_CUDA;                                                     \
  } while (0)
#define LAYER(ok)                                                              \
  do {                                                                         \
    if (!(ok))                                                                 \
      return HVD_ERR_CUDA;                                                     \
  } while (0)
#define HVD(call)                                                              \
  do {                                                                         \
    hvd_result_t rc_ = (call);                                                 \
    if (rc_ != HVD_SUCCESS)                                                    \
      return rc_;                                                              \
  } while (0)

void release(Gpu *g) {
  void *bufs[] = {g->vals, g->grads, g->bufs,   g->x,    g->c1,   g->n1,
                  g->r1,   g->p1,    g->c2,     g->n2,   g->r2,   g->c3,
                  g->n3,   g->s3,    g->argmax, g->gap,  g->dgap, g->dfc,
                  g->da,   g->db,    g->dc,     g->cols, g->mean, g->invstd};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i] != NULL)
      cudaFree(bufs[i]);
  if (g->blas != NULL)
    cublasDestroy(g->blas);
  if (g->stream != NULL)
    cudaStreamDestroy(g->stream);
  free(g);
}

/* Device (CNN_CURRENT_GPU: the current one) is a visible CUDA device?
 * Else why not in m->err. */
bool pick_device(cnn_t *m, int *device) {
  bool ok = false;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    snprintf(m->err, sizeof m->err, "no CUDA device: %s",
             hvd_cuda_unavailable());
  else if (*device == CNN_CURRENT_GPU &&
           (e = cudaGetDevice(device)) != cudaSuccess)
    snprintf(m->err, sizeof m->err, "cudaGetDevice: %s", cudaGetErrorString(e));
  else if (count == 0)
    snprintf(m->err, sizeof m->err,
             "no CUDA device: cudaGetDeviceCount found none");
  else if (*device < 0 || *device >= count)
    snprintf(m->err, sizeof m->err, "no CUDA device %d (%d visible)", *device,
             count);
  else
    ok = true;
  return ok;
}

/* On device: g's stream and cuBLAS handle, and every array of g, the
 * values and gradients nvals floats each, the im2col columns of as many
 * images as fit kColsFloats (g->chunk). False on the first failure. */
bool alloc_device(cnn_t *m, Gpu *g, int device, size_t nvals) {
  const int W = m->w;
  const size_t B = (size_t)m->maxb, big = B * W * S1 * S1,
               small = B * W * S2 * S2;
  /* the most columns one image needs: conv1 (27 x 1024) or conv2/3 */
  size_t per = (size_t)27 * S1 * S1 > (size_t)9 * W * S2 * S2
                   ? (size_t)27 * S1 * S1
                   : (size_t)9 * W * S2 * S2;
  size_t chunk = kColsFloats / per;
  g->chunk = (int)(chunk < 1 ? 1 : chunk > B ? B : chunk);
  struct {
    void **p;
    size_t bytes;
  } want[] = {
      {(void **)&g->vals, nvals * 4},
      {(void **)&g->grads, nvals * 4},
      {(void **)&g->bufs, 6 * (size_t)W * 4},
      {(void **)&g->x, B * CNN_PIXELS * 4},
      {(void **)&g->c1, big * 4},
      {(void **)&g->n1, big * 4},
      {(void **)&g->r1, big * 4},
      {(void **)&g->p1, small * 4},
      {(void **)&g->c2, small * 4},
      {(void **)&g->n2, small * 4},
      {(void **)&g->r2, small * 4},
      {(void **)&g->c3, small * 4},
      {(void **)&g->n3, small * 4},
      {(void **)&g->s3, small * 4},
      {(void **)&g->argmax, small * 4},
      {(void **)&g->gap, B * W * 4},
      {(void **)&g->dgap, B * W * 4},
      {(void **)&g->dfc, (size_t)11 * W * 4 + 40},
      {(void **)&g->da, big * 4},
      {(void **)&g->db, big * 4},
      {(void **)&g->dc, big * 4},
      {(void **)&g->cols, (size_t)g->chunk * per * 4},
      {(void **)&g->mean, 3 * (size_t)W * 4},
      {(void **)&g->invstd, 3 * (size_t)W * 4},
  };
  bool ok = cuda_ok(m, cudaSetDevice(device), "cudaSetDevice") &&
            cuda_ok(m, cudaStreamCreate(&g->stream), "cudaStreamCreate") &&
            blas_ok(m, cublasCreate(&g->blas), "cublasCreate") &&
            blas_ok(m, cublasSetStream(g->blas, g->stream), "cublasSetStream");
  for (size_t i = 0; ok && i < sizeof want / sizeof want[0]; i++)
    ok = cuda_ok(m, cudaMalloc(want[i].p, want[i].bytes), "cudaMalloc");
  return ok;
}

/* The host model's values and buffers (the seed's weights) onto the
 * device, gradients 0; complete on return. False on the first failure. */
bool upload(cnn_t *m, Gpu *g, size_t nvals) {
  const int W = m->w;
  return cuda_ok(
             m, cudaMemcpy(g->vals, m->vals, nvals * 4, cudaMemcpyHostToDevice),
             "cudaMemcpy (values)") &&
         cuda_ok(m, cudaMemset(g->grads, 0, nvals * 4), "cudaMemset") &&
         cuda_ok(m,
                 cudaMemcpy(g->bufs, m->bufs, 6 * (size_t)W * 4,
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy (buffers)") &&
         cuda_ok(m, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/* The parameters' and buffers' tensors moved to their device copies. */
void point_params(cnn_t *m, Gpu *g, int device) {
  const int W = m->w;
  for (int i = 0; i < NPARAMS; i++) {
    size_t off = (size_t)(static_cast<float *>(m->p[i].value.data) - m->vals);
    m->p[i].value.data = g->vals + off;
    m->p[i].grad.data = g->grads + off;
    m->p[i].value.device = m->p[i].grad.device = device;
  }
  for (int i = 0; i < 6; i++) {
    m->b[i].value.data = g->bufs + (size_t)i * W;
    m->b[i].value.device = m->b[i].grad.device = device;
  }
}

} // namespace

/* ---- the backend's entry points (cnn_impl.h) ------------------------------
 */

extern "C" int cnn_gpu_open(cnn_t *m, int device) {
  if (!pick_device(m, &device))
    return -1;
  Gpu *g = static_cast<Gpu *>(calloc(1, sizeof *g));
  if (g == NULL) {
    snprintf(m->err, sizeof m->err, "out of memory");
    return -1;
  }
  m->gpu = reinterpret_cast<struct cnn_gpu *>(g);
  g->device = device;
  size_t nvals = 0;
  for (int i = 0; i < NPARAMS; i++)
    nvals += (size_t)hvd_tensor_numel(&m->p[i].value);
  if (!alloc_device(m, g, device, nvals) || !upload(m, g, nvals)) {
    release(g);
    m->gpu = NULL;
    return -1;
  }
  point_params(m, g, device);
  return 0;
}

extern "C" void cnn_gpu_close(cnn_t *m) {
  if (m->gpu == NULL)
    return;
  cudaStreamSynchronize(G(m)->stream);
  release(G(m));
  m->gpu = NULL;
}

extern "C" hvd_result_t cnn_gpu_fc_weights(cnn_t *m, float *fw, float *fb) {
  Gpu *g = G(m);
  CU(cudaMemcpyAsync(fw, val(m, P_FC_W), sizeof(float) * CNN_CLASSES * m->w,
                     cudaMemcpyDeviceToHost, g->stream),
     "cudaMemcpyAsync (fc weights)");
  CU(cudaMemcpyAsync(fb, val(m, P_FC_B), sizeof(float) * CNN_CLASSES,
                     cudaMemcpyDeviceToHost, g->stream),
     "cudaMemcpyAsync (fc bias)");
  CU(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize");
  return HVD_SUCCESS;
}

extern "C" hvd_result_t cnn_gpu_features(cnn_t *m, const float *x, int n,
                                         int train) {
  Gpu *g = G(m);
  const int W = m->w;
  const size_t big = (size_t)n * W * S1 * S1, small = (size_t)n * W * S2 * S2;
  CU(cudaSetDevice(g->device), "cudaSetDevice");
  if (n > 0)
    CU(cudaMemcpyAsync(g->x, x, sizeof(float) * (size_t)n * CNN_PIXELS,
                       cudaMemcpyHostToDevice, g->stream),
       "cudaMemcpyAsync (images)");
  LAYER(conv_fwd(m, g->x, val(m, P_CONV1), g->c1, n, 3, W, S1));
  HVD(norm(m, 0, g->c1, g->n1, n, S1, train));
  relu_kernel<<<blocks(big), kThreads, 0, g->stream>>>(g->n1, g->r1, big);
  LAUNCHED("relu");
  pool_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->r1, g->p1,
                                                         g->argmax, n * W, S1);
  LAUNCHED("pool");
  LAYER(conv_fwd(m, g->p1, val(m, P_CONV2), g->c2, n, W, W, S2));
  HVD(norm(m, 1, g->c2, g->n2, n, S2, train));
  relu_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->n2, g->r2, small);
  LAUNCHED("relu");
  LAYER(conv_fwd(m, g->r2, val(m, P_CONV3), g->c3, n, W, W, S2));
  HVD(norm(m, 2, g->c3, g->n3, n, S2, train));
  add_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->n3, g->p1, g->s3,
                                                        small);
  LAUNCHED("add");
  gap_kernel<<<blocks((size_t)n * W), kThreads, 0, g->stream>>>(g->s3, g->gap,
                                                                n * W, S2 * S2);
  LAUNCHED("gap");
  if (n > 0)
    CU(cudaMemcpyAsync(m->gap, g->gap, sizeof(float) * (size_t)n * W,
                       cudaMemcpyDeviceToHost, g->stream),
       "cudaMemcpyAsync (gap)");
  CU(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (forward)");
  return HVD_SUCCESS;
}

extern "C" hvd_result_t cnn_gpu_backward(cnn_t *m, const float *dgap,
                                         const float *dfw, const float *dfb,
                                         cnn_ready_fn ready, void *ctx) {
  Gpu *g = G(m);
  const int W = m->w, n = m->n, HW = S2 * S2;
  const size_t big = (size_t)n * W * S1 * S1, small = (size_t)n * W * S2 * S2;
  const int nfw = CNN_CLASSES * W;
  CU(cudaSetDevice(g->device), "cudaSetDevice");
/* each gradient complete on the device before hvd sees it */
#define READY(i)                                                               \
  do {                                                                         \
    if (ready != NULL) {                                                       \
      CU(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (ready)");   \
      ready(ctx, (i));                                                         \
    }                                                                          \
  } while (0)
  /* the classifier's gradients, computed on the host, added in */
  CU(cudaMemcpyAsync(g->dfc, dfw, sizeof(float) * nfw, cudaMemcpyHostToDevice,
                     g->stream),
     "cudaMemcpyAsync (fc gradients)");
  CU(cudaMemcpyAsync(g->dfc + nfw, dfb, sizeof(float) * CNN_CLASSES,
                     cudaMemcpyHostToDevice, g->stream),
     "cudaMemcpyAsync (fc gradients)");
  if (n > 0)
    CU(cudaMemcpyAsync(g->dgap, dgap, sizeof(float) * (size_t)n * W,
                       cudaMemcpyHostToDevice, g->stream),
       "cudaMemcpyAsync (dgap)");
  add_into_kernel<<<blocks(CNN_CLASSES), kThreads, 0, g->stream>>>(
      grad(m, P_FC_B), g->dfc + nfw, CNN_CLASSES);
  LAUNCHED("add_into");
  READY(P_FC_B);
  add_into_kernel<<<blocks(nfw), kThreads, 0, g->stream>>>(grad(m, P_FC_W),
                                                           g->dfc, nfw);
  LAUNCHED("add_into");
  READY(P_FC_W);
  /* average pool and the block's ReLU: ds3 into da */
  float *ds3 = g->da;
  gap_bwd_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->s3, g->dgap, ds3,
                                                            small, HW);
  LAUNCHED("gap_bwd");
  /* bn3 then conv3: dr2 into dc */
  HVD(norm_bwd(m, 2, g->c3, ds3, g->db, S2));
  READY(P_BN3_W);
  READY(P_BN3_B);
  LAYER(conv_bwd(m, g->r2, val(m, P_CONV3), g->db, grad(m, P_CONV3), g->dc, n,
                 W, W, S2));
  READY(P_CONV3);
  relu_bwd_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->n2, g->dc,
                                                             small);
  LAUNCHED("relu_bwd");
  HVD(norm_bwd(m, 1, g->c2, g->dc, g->db, S2));
  READY(P_BN2_W);
  READY(P_BN2_B);
  /* conv2 into dc, plus the skip's ds3: dp1 */
  LAYER(conv_bwd(m, g->p1, val(m, P_CONV2), g->db, grad(m, P_CONV2), g->dc, n,
                 W, W, S2));
  READY(P_CONV2);
  add_kernel<<<blocks(small), kThreads, 0, g->stream>>>(g->dc, ds3, g->dc,
                                                        small);
  LAUNCHED("add");
  /* pool, ReLU, bn1, conv1 */
  pool_bwd_kernel<<<blocks(big), kThreads, 0, g->stream>>>(g->dc, g->argmax,
                                                           g->db, n * W, S1);
  LAUNCHED("pool_bwd");
  relu_bwd_kernel<<<blocks(big), kThreads, 0, g->stream>>>(g->n1, g->db, big);
  LAUNCHED("relu_bwd");
  HVD(norm_bwd(m, 0, g->c1, g->db, g->da, S1));
  READY(P_BN1_W);
  READY(P_BN1_B);
  LAYER(conv_bwd(m, g->x, val(m, P_CONV1), g->da, grad(m, P_CONV1), NULL, n, 3,
                 W, S1));
  READY(P_CONV1);
  CU(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (backward)");
#undef READY
  return HVD_SUCCESS;
}
