/*
 * layers_cuda.cu - the GPU backend of the BERT example: the contract of
 * layers.h on device pointers. cuBLAS for every matrix product (the
 * attention's per-(batch, head) products as one strided-batched GEMM
 * each), CUDA kernels for the rest, all on one stream owned by this
 * module; the table bert_cuda_backend() hands to model.c.
 *
 * Numerics follow layers.c: float32 data, the same expression for every
 * element (built with -fmad=false, Makefile.am, so a * b + c is not
 * fused), double where the CPU sums in double (LayerNorm statistics, the
 * cross-entropy's sum of exponentials and loss). Reductions run in a
 * fixed order (no atomics), so results are reproducible run to run,
 * except the word-embedding and scatter-add gradients, which add with
 * atomicAdd where several tokens share a row (as PyTorch does).
 *
 * Row-major vs cuBLAS. cuBLAS is column-major: a row-major [r, c] matrix
 * with leading dimension ld is, to cuBLAS, the column-major [c, r] matrix
 * (its transpose) with the same ld. So a row-major product C = A B is
 * computed as the column-major C^T = B^T A^T: swap the operands, and each
 * "transpose" flag is the row-major one. Each call below spells out its
 * mapping.
 *
 * Errors. Every CUDA and cuBLAS call and every launch is checked; the
 * first failure is kept as "CALL: message" (error()) and every later
 * call returns at once, so model.c reports it after the pass. The layers
 * run asynchronously: a fault inside a kernel surfaces at the next
 * checked synchronisation (xent_fwd, to_host, sync).
 */
#include <config.h>

#include "layers.h"

#include "hvd.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

namespace {

/* Threads per block of the element kernels and of the row kernels: a
 * multiple of the warp (the reductions shuffle with a full mask) and a
 * power of two (xent_fwd_kernel's argmax halves it). */
const int kThreads = 256;
/* The warp width of every NVIDIA GPU to date; the kernels that give one
 * warp to a row launch blockDim.x == kWarp and check it against warpSize
 * at open. */
const int kWarp = 32;
const unsigned kFullMask = 0xffffffffu;
/* Rows handled per block by the column sums (colsum_partial). */
const int kColChunk = 64;
/* Column-sum blocks: kWarp columns x kColRows row lanes. */
const int kColRows = 8;

/* ---- module state -------------------------------------------------------- */

struct XentResult {
  double loss;
  long long correct;
};

struct State {
  int refs;
  int device;
  int tf32;
  cudaStream_t stream;
  cublasHandle_t blas;
  cudaEvent_t fence[2];
  int failed;
  char err[512];
  /* scratch memory of the kernels (attention's head-major copies and
   * scores gradient, column-sum partials, cross-entropy rows) */
  void *ws;
  size_t ws_bytes;
  XentResult *xres_dev, *xres_host; /* host: page-locked */
};

State st;

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) {
  if (st.failed)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st.err, sizeof st.err, fmt, ap);
  va_end(ap);
  st.failed = 1;
}

bool cuda_ok(cudaError_t e, const char *call) {
  if (e == cudaSuccess)
    return true;
  fail("%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
  return false;
}

bool blas_ok(cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return true;
  fail("%s: %s (%s)", call, cublasGetStatusString(s), cublasGetStatusName(s));
  return false;
}

/* After a launch: configuration errors show at once (no synchronisation). */
void launched(const char *kernel) { cuda_ok(cudaGetLastError(), kernel); }

/* Whether a layer may run: the module is open and nothing failed. */
bool usable(void) {
  if (st.refs == 0)
    fail("bert CUDA layers: used before bert_cuda_open");
  return !st.failed;
}

/* Blocks for n elements, kThreads each, with grid-stride loops beyond. */
unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 65536)
    b = 65536;
  return (unsigned)(b > 0 ? b : 1);
}

/* Blocks for `rows` rows, one block (or warp) per row, grid-stride. */
unsigned grid_rows(int64_t rows) {
  int64_t b = rows > 65536 ? 65536 : rows;
  return (unsigned)(b > 0 ? b : 1);
}

size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* Scratch memory of at least `bytes`. Grows (never shrinks); the growth
 * waits for the stream first, as queued kernels may still use the old
 * one. reserve() sizes it once, so training never reaches cudaMalloc. */
void *workspace(size_t bytes) {
  if (bytes <= st.ws_bytes)
    return st.ws;
  if (!cuda_ok(cudaStreamSynchronize(st.stream), "cudaStreamSynchronize"))
    return NULL;
  if (st.ws != NULL && !cuda_ok(cudaFree(st.ws), "cudaFree (workspace)"))
    return NULL;
  st.ws = NULL;
  st.ws_bytes = 0;
  if (!cuda_ok(cudaMalloc(&st.ws, bytes), "cudaMalloc (workspace)"))
    return NULL;
  st.ws_bytes = bytes;
  return st.ws;
}

/* ---- reductions ---------------------------------------------------------- */

template <typename T> __device__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

/* The sum of v over the block (blockDim.x a multiple of kWarp, at most
 * kThreads), returned to every thread. Every thread adds the warps'
 * partial sums in the same order, so all get the same bits. shared holds
 * kThreads / kWarp values; the first barrier keeps a previous call's
 * readers from seeing this call's writes. */
__device__ double block_sum(double v, double *shared) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  double r = 0;
  for (int w = 0; w < (int)(blockDim.x / kWarp); w++)
    r += shared[w];
  return r;
}

/* ---- element kernels ----------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                      \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
       i += (int64_t)gridDim.x * blockDim.x)

__global__ void fill_rows_kernel(float *y, const float *b, int64_t n, int out) {
  GRID_STRIDE(i, n * out) { y[i] = b[i % out]; }
}

__global__ void gelu_fwd_kernel(const float *x, float *y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}

__global__ void gelu_bwd_kernel(const float *x, const float *dy, float *dx,
                                int64_t n) {
  const float inv_sqrt_2pi = 0.3989422804014327f;
  GRID_STRIDE(i, n) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

__global__ void add_kernel(const float *a, const float *b, float *y,
                           int64_t n) {
  GRID_STRIDE(i, n) { y[i] = a[i] + b[i]; }
}

__global__ void gather_rows_kernel(const float *src, const int32_t *rows, int m,
                                   int h, float *dst) {
  GRID_STRIDE(i, (int64_t)m * h) {
    int64_t r = i / h, j = i % h;
    dst[i] = src[(int64_t)rows[r] * h + j];
  }
}

/* atomicAdd: the contract allows repeated rows. */
__global__ void scatter_add_rows_kernel(const float *src, const int32_t *rows,
                                        int m, int h, float *dst) {
  GRID_STRIDE(i, (int64_t)m * h) {
    int64_t r = i / h, j = i % h;
    atomicAdd(dst + (int64_t)rows[r] * h + j, src[i]);
  }
}

/* ---- column sums: out[q][j] += sum over rows i of value(q, i, j) ----------
 *
 * Two deterministic passes instead of atomics. colsum_partial: block
 * (x: kWarp columns, y: kColRows row lanes) at (column tile, row chunk
 * of kColChunk rows) sums its chunk per column in shared memory and
 * writes partial[q][chunk][j]; colsum_finish adds the chunks in order. Op
 * gives Q values per (i, j) (LayerNorm's dg and db, the types of the
 * token-type table). */
template <int Q, typename Op>
__global__ void colsum_partial(Op op, int64_t n, int h, float *partial) {
  __shared__ float sh[Q][kColRows][kWarp];
  const int j = blockIdx.x * kWarp + threadIdx.x;
  const int64_t chunk = blockIdx.y, nchunks = gridDim.y;
  const int64_t first = chunk * kColChunk;
  const int64_t last = first + kColChunk < n ? first + kColChunk : n;
  float acc[Q];
  for (int q = 0; q < Q; q++)
    acc[q] = 0;
  if (j < h)
    for (int64_t i = first + threadIdx.y; i < last; i += kColRows)
      op(i, j, acc);
  for (int q = 0; q < Q; q++)
    sh[q][threadIdx.y][threadIdx.x] = acc[q];
  __syncthreads();
  if (threadIdx.y == 0 && j < h)
    for (int q = 0; q < Q; q++) {
      float s = 0;
      for (int r = 0; r < kColRows; r++)
        s += sh[q][r][threadIdx.x];
      partial[((int64_t)q * nchunks + chunk) * h + j] = s;
    }
}

/* Output q goes to d0 (q = 0) or to d1 + (q - 1) h. */
__global__ void colsum_finish(const float *partial, int nchunks, int h, int Q,
                              float *d0, float *d1) {
  GRID_STRIDE(i, (int64_t)Q * h) {
    int q = (int)(i / h), j = (int)(i % h);
    float s = 0;
    for (int c = 0; c < nchunks; c++)
      s += partial[((int64_t)q * nchunks + c) * h + j];
    float *d = q == 0 ? d0 : d1 + (int64_t)(q - 1) * h;
    d[j] += s;
  }
}

int colsum_chunks(int64_t n) { return (int)((n + kColChunk - 1) / kColChunk); }

size_t colsum_bytes(int64_t n, int h, int Q) {
  return align_up(sizeof(float) * (size_t)Q * colsum_chunks(n) * h);
}

template <int Q, typename Op>
void colsum(const Op &op, int64_t n, int h, float *d0, float *d1,
            const char *what) {
  if (n <= 0 || h <= 0)
    return;
  int nchunks = colsum_chunks(n);
  if (nchunks > 65535) {
    fail("%s: %lld rows are more than this kernel takes", what, (long long)n);
    return;
  }
  float *partial = (float *)workspace(colsum_bytes(n, h, Q));
  if (partial == NULL)
    return;
  dim3 grid((h + kWarp - 1) / kWarp, nchunks), block(kWarp, kColRows);
  colsum_partial<Q, Op><<<grid, block, 0, st.stream>>>(op, n, h, partial);
  launched(what);
  colsum_finish<<<grid_for((int64_t)Q * h), kThreads, 0, st.stream>>>(
      partial, nchunks, h, Q, d0, d1);
  launched(what);
}

struct ColOfMatrix { /* db += column sums of dy */
  const float *y;
  int w;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    acc[0] += y[i * w + j];
  }
};

struct LayerNormParams { /* dg += dy xhat, db += dy */
  const float *x, *dy, *mean, *rstd;
  int h;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    float xhat = (x[i * h + j] - mean[i]) * rstd[i];
    acc[0] += dy[i * h + j] * xhat;
    acc[1] += dy[i * h + j];
  }
};

template <int T>
struct TypeRows { /* dtype[t] += dout of the tokens of type t */
  const float *dout;
  const int32_t *types;
  int h;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    int t = types != NULL ? types[i] : 0;
    if (t >= 0 && t < T)
      acc[t] += dout[i * h + j];
  }
};

/* ---- LayerNorm ----------------------------------------------------------- */

/* One block per row (grid-stride over rows; the row index is the same
 * for the whole block, so the barriers inside block_sum are reached by
 * every thread). */
__global__ void layernorm_fwd_kernel(const float *x, const float *g,
                                     const float *b, float eps, float *y,
                                     float *mean, float *rstd, int64_t n,
                                     int h) {
  __shared__ double sh[kThreads / kWarp];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float *xr = x + row * h;
    float *yr = y + row * h;
    double s = 0;
    for (int j = threadIdx.x; j < h; j += blockDim.x)
      s += xr[j];
    double mu = block_sum(s, sh) / h;
    double ss = 0;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      double d = xr[j] - mu;
      ss += d * d;
    }
    ss = block_sum(ss, sh);
    float r = (float)(1.0 / sqrt(ss / h + eps));
    float m = (float)mu;
    if (threadIdx.x == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
    for (int j = threadIdx.x; j < h; j += blockDim.x)
      yr[j] = (xr[j] - m) * r * g[j] + b[j];
  }
}

/* dx only (dg and db come from colsum first, as dx may alias dy). Each
 * thread reads dy[j] and then writes dx[j] at the same j, after the
 * block's sums are complete. */
__global__ void layernorm_bwd_kernel(const float *x, const float *mean,
                                     const float *rstd, const float *g,
                                     const float *dy, float *dx, int64_t n,
                                     int h) {
  __shared__ double sh[kThreads / kWarp];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float *xr = x + row * h, *dyr = dy + row * h;
    float *dxr = dx + row * h;
    const float m = mean[row], r = rstd[row];
    double s1 = 0, s2 = 0;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (xr[j] - m) * r, dxhat = dyr[j] * g[j];
      s1 += dxhat;
      s2 += (double)dxhat * xhat;
    }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    float a = (float)(s1 / h), c = (float)(s2 / h);
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (xr[j] - m) * r;
      dxr[j] = r * (dyr[j] * g[j] - a - xhat * c);
    }
  }
}

/* ---- attention -------------------------------------------------------------
 *
 * q, k, v, ctx are [B*S, A*dh] (head h in columns h*dh..); cuBLAS's
 * strided batches need one stride between consecutive (batch, head)
 * matrices, which that layout does not have (dh between heads, S*A*dh
 * between sequences). So, as PyTorch does, the heads are first copied to
 * head-major [B, A, S, dh] (split_heads), where matrix i = b*A + h starts
 * at i*S*dh, and the results copied back (merge_heads). probs is already
 * [B, A, S, S], matrix i at i*S*S. */

__global__ void split_heads_kernel(const float *src, float *dst, int B, int S,
                                   int A, int dh) {
  const int64_t total = (int64_t)B * S * A * dh;
  GRID_STRIDE(i, total) { /* i indexes dst: ((b*A + h)*S + s)*dh + e */
    int64_t e = i % dh, s = (i / dh) % S, bh = i / ((int64_t)dh * S);
    int64_t b = bh / A, h = bh % A;
    dst[i] = src[(b * S + s) * A * dh + h * dh + e];
  }
}

__global__ void merge_heads_kernel(const float *src, float *dst, int B, int S,
                                   int A, int dh) {
  const int64_t total = (int64_t)B * S * A * dh;
  GRID_STRIDE(i, total) { /* i indexes dst: (b*S + s)*A*dh + h*dh + e */
    int64_t e = i % dh, h = (i / dh) % A, bs = i / ((int64_t)dh * A);
    int64_t b = bs / S, s = bs % S;
    dst[i] = src[((b * A + h) * S + s) * dh + e];
  }
}

/* One warp per row of probs ([B*A*S rows, S]); blockDim (kWarp, rows per
 * block). Keys at >= lengths[b] get BERT_MASK_VALUE, then the softmax of
 * layers.c: max, exponentials and their float sum, times 1 / sum. */
__global__ void softmax_fwd_kernel(float *p, const int32_t *lengths,
                                   int64_t rows, int S, int A) {
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
       row += (int64_t)gridDim.x * blockDim.y) {
    float *r = p + row * S;
    const int64_t b = row / ((int64_t)A * S);
    const int len = lengths != NULL ? lengths[b] : S;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < S; j += kWarp)
      mx = fmaxf(mx, j < len ? r[j] : BERT_MASK_VALUE);
    mx = warp_max(mx);
    float s = 0;
    for (int j = threadIdx.x; j < S; j += kWarp) {
      float e = expf((j < len ? r[j] : BERT_MASK_VALUE) - mx);
      r[j] = e;
      s += e;
    }
    s = warp_sum(s);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < S; j += kWarp)
      r[j] *= inv;
  }
}

/* dS = P * (dP - rowsum(P * dP)), in place in dp; one warp per row. */
__global__ void softmax_bwd_kernel(const float *p, float *dp, int64_t rows,
                                   int S) {
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
       row += (int64_t)gridDim.x * blockDim.y) {
    const float *pr = p + row * S;
    float *dr = dp + row * S;
    float dot = 0;
    for (int j = threadIdx.x; j < S; j += kWarp)
      dot += pr[j] * dr[j];
    dot = warp_sum(dot);
    for (int j = threadIdx.x; j < S; j += kWarp)
      dr[j] = pr[j] * (dr[j] - dot);
  }
}

const int kRowsPerBlock = kThreads / kWarp; /* warps per softmax block */

size_t attention_bytes(int B, int S, int A, int dh) {
  size_t nh = (size_t)B * S * A * dh;
  return 4 * align_up(sizeof(float) * nh) +
         align_up(sizeof(float) * (size_t)B * A * S * S);
}

/* ---- embeddings ---------------------------------------------------------- */

__global__ void embedding_fwd_kernel(const int32_t *ids, const int32_t *types,
                                     const float *word, const float *pos,
                                     const float *type, float *out, int B,
                                     int S, int H) {
  GRID_STRIDE(i, (int64_t)B * S * H) {
    int64_t t = i / H, j = i % H, s = t % S;
    const float w = word[(int64_t)ids[t] * H + j];
    const float ps = pos[s * H + j];
    const float ty = type[(int64_t)(types != NULL ? types[t] : 0) * H + j];
    out[i] = w + ps + ty;
  }
}

__global__ void embedding_bwd_word_kernel(const int32_t *ids, const float *dout,
                                          float *dword, int64_t N, int H) {
  GRID_STRIDE(i, N * H) {
    int64_t t = i / H, j = i % H;
    atomicAdd(dword + (int64_t)ids[t] * H + j, dout[i]);
  }
}

/* dpos[s] += dout of position s in every sequence, added in sequence
 * order as layers.c does (one thread per (s, j)). */
__global__ void embedding_bwd_pos_kernel(const float *dout, float *dpos, int B,
                                         int S, int H) {
  GRID_STRIDE(i, (int64_t)S * H) {
    int64_t s = i / H, j = i % H;
    float acc = dpos[i];
    for (int b = 0; b < B; b++)
      acc += dout[((int64_t)b * S + s) * H + j];
    dpos[i] = acc;
  }
}

/* ---- cross-entropy ------------------------------------------------------- */

/* One block per row of logits [m, V]: the argmax (the first one, as
 * layers.c), the loss log sum exp(r - max) - (r[t] - max) in double, the
 * probabilities in place; the row's loss and hit into rows_loss and
 * rows_hit (summed by xent_sum_kernel, in a fixed order). */
__global__ void xent_fwd_kernel(float *logits, const int32_t *targets,
                                int64_t m, int V, double *rows_loss,
                                int *rows_hit) {
  __shared__ double sh[kThreads / kWarp];
  __shared__ float best_v[kThreads];
  __shared__ int best_i[kThreads];
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
    float *r = logits + row * V;
    /* argmax: each thread scans its columns in increasing order (keeping
     * the first of equal maxima), then a tree over threads prefers the
     * larger value, and the lower index on ties */
    float bv = -INFINITY;
    int bi = V; /* none yet */
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      if (bi == V || r[j] > bv) {
        bv = r[j];
        bi = j;
      }
    __syncthreads(); /* the previous row's readers are done */
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int span = blockDim.x / 2; span > 0; span /= 2) {
      if (threadIdx.x < span) {
        float ov = best_v[threadIdx.x + span];
        int oi = best_i[threadIdx.x + span];
        float mv = best_v[threadIdx.x];
        int mi = best_i[threadIdx.x];
        if (oi != V && (mi == V || ov > mv || (ov == mv && oi < mi))) {
          best_v[threadIdx.x] = ov;
          best_i[threadIdx.x] = oi;
        }
      }
      __syncthreads();
    }
    const int arg = best_i[0];
    const float mx = best_v[0];
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      s += exp((double)r[j] - mx);
    s = block_sum(s, sh);
    const int t = targets[row];
    if (threadIdx.x == 0) {
      rows_loss[row] = log(s) - ((double)r[t] - mx);
      rows_hit[row] = arg == t;
    }
    __syncthreads(); /* r[t] is read above before anyone overwrites it */
    const float inv = (float)(1.0 / s);
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      r[j] = expf(r[j] - mx) * inv;
  }
}

/* One block: the sums of rows_loss and rows_hit, thread k taking rows k,
 * k + blockDim.x, ..., then block_sum: the same order every time. */
__global__ void xent_sum_kernel(const double *rows_loss, const int *rows_hit,
                                int64_t m, XentResult *out) {
  __shared__ double sh[kThreads / kWarp];
  double loss = 0, hits = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    loss += rows_loss[i];
    hits += rows_hit[i];
  }
  loss = block_sum(loss, sh);
  hits = block_sum(hits, sh);
  if (threadIdx.x == 0) {
    out->loss = loss;
    out->correct = (long long)hits;
  }
}

/* probs = scale * (probs - onehot(target)), as layers.c: subtract, then
 * scale. */
__global__ void xent_bwd_kernel(float *probs, const int32_t *targets, int64_t m,
                                int V, float scale) {
  GRID_STRIDE(i, m * V) {
    int64_t row = i / V;
    int j = (int)(i % V);
    float v = probs[i];
    if (j == targets[row])
      v -= 1.0f;
    probs[i] = v * scale;
  }
}

size_t xent_bytes(int64_t m) {
  return align_up(sizeof(double) * (size_t)m) +
         align_up(sizeof(int) * (size_t)m);
}

/* ---- the layers ---------------------------------------------------------- */

void linear_fwd(const float *x, const float *W, const float *b, float *y, int n,
                int in, int out) {
  if (!usable() || n <= 0 || out <= 0)
    return;
  if (b != NULL) { /* y = b, then y += x W^T (beta 1), as layers.c */
    fill_rows_kernel<<<grid_for((int64_t)n * out), kThreads, 0, st.stream>>>(
        y, b, n, out);
    launched("fill_rows_kernel");
  }
  /* Row-major y[n,out] = x[n,in] W[out,in]^T. Column-major: y^T (out x n,
   * ld out) = W (out x in: the column-major view of W is W^T, in x out
   * with ld in, so OP_T) times x^T (in x n, ld in: OP_N). */
  const float one = 1.0f, beta = b != NULL ? 1.0f : 0.0f;
  blas_ok(cublasSgemm(st.blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W,
                      in, x, in, &beta, y, out),
          "cublasSgemm (linear forward)");
}

void linear_bwd(const float *x, const float *W, const float *dy, float *dx,
                float dx_beta, float *dW, float *db, int n, int in, int out) {
  if (!usable() || n <= 0)
    return;
  const float one = 1.0f;
  /* Row-major dW[out,in] += dy^T[out,n] x[n,in]. Column-major: dW^T (in x
   * out, ld in) += x^T (in x n, ld in: OP_N) times dy (n x out: the view
   * of dy is dy^T, out x n with ld out, so OP_T). */
  blas_ok(cublasSgemm(st.blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x,
                      in, dy, out, &one, dW, in),
          "cublasSgemm (linear weight gradient)");
  if (db != NULL)
    colsum<1>(ColOfMatrix{dy, out}, n, out, db, NULL, "colsum (bias gradient)");
  if (dx != NULL) {
    /* Row-major dx[n,in] = dy[n,out] W[out,in] (+ dx_beta dx).
     * Column-major: dx^T (in x n, ld in) = W^T (in x out: the view of W,
     * ld in, OP_N) times dy^T (out x n: the view of dy, ld out, OP_N). */
    blas_ok(cublasSgemm(st.blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, W,
                        in, dy, out, &dx_beta, dx, in),
            "cublasSgemm (linear input gradient)");
  }
}

void layernorm_fwd(const float *x, const float *g, const float *b, float eps,
                   float *y, float *mean, float *rstd, int n, int h) {
  if (!usable() || n <= 0)
    return;
  layernorm_fwd_kernel<<<grid_rows(n), kThreads, 0, st.stream>>>(
      x, g, b, eps, y, mean, rstd, n, h);
  launched("layernorm_fwd_kernel");
}

void layernorm_bwd(const float *x, const float *mean, const float *rstd,
                   const float *g, const float *dy, float *dx, float *dg,
                   float *db, int n, int h) {
  if (!usable() || n <= 0)
    return;
  /* dg and db first: dx may alias dy */
  colsum<2>(LayerNormParams{x, dy, mean, rstd, h}, n, h, dg, db,
            "colsum (LayerNorm gradients)");
  layernorm_bwd_kernel<<<grid_rows(n), kThreads, 0, st.stream>>>(
      x, mean, rstd, g, dy, dx, n, h);
  launched("layernorm_bwd_kernel");
}

void gelu_fwd(const float *x, float *y, int64_t n) {
  if (!usable() || n <= 0)
    return;
  gelu_fwd_kernel<<<grid_for(n), kThreads, 0, st.stream>>>(x, y, n);
  launched("gelu_fwd_kernel");
}

void gelu_bwd(const float *x, const float *dy, float *dx, int64_t n) {
  if (!usable() || n <= 0)
    return;
  gelu_bwd_kernel<<<grid_for(n), kThreads, 0, st.stream>>>(x, dy, dx, n);
  launched("gelu_bwd_kernel");
}

/* The four head-major buffers and the scores' gradient, in the
 * workspace. */
struct AttnScratch {
  float *q, *k, *v, *c, *dp;
};

bool attn_scratch(int B, int S, int A, int dh, AttnScratch *s) {
  char *w = (char *)workspace(attention_bytes(B, S, A, dh));
  if (w == NULL)
    return false;
  size_t nh = align_up(sizeof(float) * (size_t)B * S * A * dh);
  s->q = (float *)w;
  s->k = (float *)(w + nh);
  s->v = (float *)(w + 2 * nh);
  s->c = (float *)(w + 3 * nh);
  s->dp = (float *)(w + 4 * nh);
  return true;
}

void split_heads(const float *src, float *dst, int B, int S, int A, int dh) {
  split_heads_kernel<<<grid_for((int64_t)B * S * A * dh), kThreads, 0,
                       st.stream>>>(src, dst, B, S, A, dh);
  launched("split_heads_kernel");
}

void merge_heads(const float *src, float *dst, int B, int S, int A, int dh) {
  merge_heads_kernel<<<grid_for((int64_t)B * S * A * dh), kThreads, 0,
                       st.stream>>>(src, dst, B, S, A, dh);
  launched("merge_heads_kernel");
}

/* C_i = alpha op(X_i) op(Y_i) over the B*A head-major matrices, in the
 * column-major terms of cublasSgemmStridedBatched (callers map). */
void gemm_heads(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                float alpha, const float *a, int lda, long long sa,
                const float *b, int ldb, long long sb, float *c, int ldc,
                long long sc, int count, const char *what) {
  const float zero = 0.0f;
  blas_ok(cublasSgemmStridedBatched(st.blas, ta, tb, m, n, k, &alpha, a, lda,
                                    sa, b, ldb, sb, &zero, c, ldc, sc, count),
          what);
}

void attention_fwd(const float *q, const float *k, const float *v,
                   const int32_t *lengths, float *probs, float *ctx, int B,
                   int S, int A, int dh) {
  AttnScratch w;
  if (!usable() || B <= 0 || !attn_scratch(B, S, A, dh, &w))
    return;
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  const float scale = 1.0f / sqrtf((float)dh);
  split_heads(q, w.q, B, S, A, dh);
  split_heads(k, w.k, B, S, A, dh);
  split_heads(v, w.v, B, S, A, dh);
  /* Row-major P_i[S,S] = scale Q_i[S,dh] K_i[S,dh]^T. Column-major: P^T
   * (S x S, ld S) = K_i (the view of K_i is K_i^T, dh x S, ld dh: OP_T)
   * times Q_i^T (the view of Q_i: OP_N). */
  gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, scale, w.k, dh, sh, w.q, dh,
             sh, probs, S, ss, count, "cublasSgemmStridedBatched (Q K^T)");
  if (!usable())
    return;
  softmax_fwd_kernel<<<grid_rows(((int64_t)count * S + kRowsPerBlock - 1) /
                                 kRowsPerBlock),
                       dim3(kWarp, kRowsPerBlock), 0, st.stream>>>(
      probs, lengths, (int64_t)count * S, S, A);
  launched("softmax_fwd_kernel");
  /* Row-major C_i[S,dh] = P_i[S,S] V_i[S,dh]. Column-major: C^T (dh x S,
   * ld dh) = V_i^T (the view of V_i, OP_N) times P_i^T (the view of P_i,
   * OP_N). */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, 1.0f, w.v, dh, sh, probs, S,
             ss, w.c, dh, sh, count, "cublasSgemmStridedBatched (P V)");
  merge_heads(w.c, ctx, B, S, A, dh);
}

void attention_bwd(const float *q, const float *k, const float *v,
                   const float *probs, const float *dctx, float *dq, float *dk,
                   float *dv, float *scratch, int B, int S, int A, int dh) {
  (void)scratch; /* the batched products need B*A*S*S: the workspace's */
  AttnScratch w;
  if (!usable() || B <= 0 || !attn_scratch(B, S, A, dh, &w))
    return;
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  const float scale = 1.0f / sqrtf((float)dh);
  split_heads(dctx, w.c, B, S, A, dh);
  split_heads(v, w.v, B, S, A, dh);
  /* Row-major dP_i[S,S] = dC_i[S,dh] V_i^T: as Q K^T above. */
  gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, 1.0f, w.v, dh, sh, w.c, dh, sh,
             w.dp, S, ss, count, "cublasSgemmStridedBatched (dC V^T)");
  /* Row-major dV_i[S,dh] = P_i^T[S,S] dC_i[S,dh]. Column-major: dV^T (dh x
   * S) = dC_i^T (the view of dC_i, OP_N) times P_i (the view of P_i is
   * P_i^T: OP_T). Written to w.v: V_i is no longer needed. */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, 1.0f, w.c, dh, sh, probs, S,
             ss, w.v, dh, sh, count, "cublasSgemmStridedBatched (P^T dC)");
  merge_heads(w.v, dv, B, S, A, dh);
  if (!usable())
    return;
  /* dS = P * (dP - rowsum(P * dP)); masked keys have P = 0 */
  softmax_bwd_kernel<<<grid_rows(((int64_t)count * S + kRowsPerBlock - 1) /
                                 kRowsPerBlock),
                       dim3(kWarp, kRowsPerBlock), 0, st.stream>>>(
      probs, w.dp, (int64_t)count * S, S);
  launched("softmax_bwd_kernel");
  split_heads(q, w.q, B, S, A, dh);
  split_heads(k, w.k, B, S, A, dh);
  /* Row-major dQ_i[S,dh] = scale dS_i[S,S] K_i[S,dh]: as P V. Into w.c
   * (dC_i is no longer needed). */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, scale, w.k, dh, sh, w.dp, S,
             ss, w.c, dh, sh, count, "cublasSgemmStridedBatched (dS K)");
  merge_heads(w.c, dq, B, S, A, dh);
  /* Row-major dK_i[S,dh] = scale dS_i^T Q_i: as P^T dC. Into w.k. */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, scale, w.q, dh, sh, w.dp, S,
             ss, w.k, dh, sh, count, "cublasSgemmStridedBatched (dS^T Q)");
  merge_heads(w.k, dk, B, S, A, dh);
}

void embedding_fwd(const int32_t *ids, const int32_t *types, const float *word,
                   const float *pos, const float *type, float *out, int B,
                   int S, int H) {
  if (!usable() || B <= 0)
    return;
  embedding_fwd_kernel<<<grid_for((int64_t)B * S * H), kThreads, 0,
                         st.stream>>>(ids, types, word, pos, type, out, B, S,
                                      H);
  launched("embedding_fwd_kernel");
}

/* The token-type table has type_vocab_size rows (2 in BERT); colsum takes
 * its Q as a template argument, so a few sizes are instantiated. */
template <int T>
void type_grad(const float *dout, const int32_t *types, float *dtype, int64_t N,
               int H) {
  colsum<T>(TypeRows<T>{dout, types, H}, N, H, dtype, dtype + H,
            "colsum (token-type gradient)");
}

int g_types = 2; /* rows of the token-type table: reserve() */

void embedding_bwd(const int32_t *ids, const int32_t *types, const float *dout,
                   float *dword, float *dpos, float *dtype, int B, int S,
                   int H) {
  if (!usable() || B <= 0)
    return;
  const int64_t N = (int64_t)B * S;
  if (dword != NULL) {
    embedding_bwd_word_kernel<<<grid_for(N * H), kThreads, 0, st.stream>>>(
        ids, dout, dword, N, H);
    launched("embedding_bwd_word_kernel");
  }
  if (dpos != NULL) {
    embedding_bwd_pos_kernel<<<grid_for((int64_t)S * H), kThreads, 0,
                               st.stream>>>(dout, dpos, B, S, H);
    launched("embedding_bwd_pos_kernel");
  }
  if (dtype != NULL) {
    /* types NULL: every token is type 0, whatever the table's size */
    int T = types == NULL ? 1 : g_types;
    switch (T) {
    case 1:
      type_grad<1>(dout, types, dtype, N, H);
      break;
    case 2:
      type_grad<2>(dout, types, dtype, N, H);
      break;
    case 3:
      type_grad<3>(dout, types, dtype, N, H);
      break;
    case 4:
      type_grad<4>(dout, types, dtype, N, H);
      break;
    default:
      fail("embedding_bwd: %d token types; the CUDA layers take 1 to 4", T);
    }
  }
}

double xent_fwd(float *logits, const int32_t *targets, int m, int V,
                int64_t *correct) {
  if (correct != NULL)
    *correct = 0;
  if (!usable() || m <= 0)
    return 0;
  char *w = (char *)workspace(xent_bytes(m));
  if (w == NULL)
    return 0;
  double *rows_loss = (double *)w;
  int *rows_hit = (int *)(w + align_up(sizeof(double) * (size_t)m));
  xent_fwd_kernel<<<grid_rows(m), kThreads, 0, st.stream>>>(
      logits, targets, m, V, rows_loss, rows_hit);
  launched("xent_fwd_kernel");
  xent_sum_kernel<<<1, kThreads, 0, st.stream>>>(rows_loss, rows_hit, m,
                                                 st.xres_dev);
  launched("xent_sum_kernel");
  if (!cuda_ok(cudaMemcpyAsync(st.xres_host, st.xres_dev, sizeof(XentResult),
                               cudaMemcpyDeviceToHost, st.stream),
               "cudaMemcpyAsync (cross-entropy result)") ||
      !cuda_ok(cudaStreamSynchronize(st.stream),
               "cudaStreamSynchronize (cross-entropy result)"))
    return 0;
  if (correct != NULL)
    *correct = st.xres_host->correct;
  return st.xres_host->loss;
}

void xent_bwd(float *probs, const int32_t *targets, int m, int V, float scale) {
  if (!usable() || m <= 0)
    return;
  xent_bwd_kernel<<<grid_for((int64_t)m * V), kThreads, 0, st.stream>>>(
      probs, targets, m, V, scale);
  launched("xent_bwd_kernel");
}

void add_floats(const float *a, const float *b, float *y, int64_t n) {
  if (!usable() || n <= 0)
    return;
  add_kernel<<<grid_for(n), kThreads, 0, st.stream>>>(a, b, y, n);
  launched("add_kernel");
}

void copy_floats(const float *src, float *dst, int64_t n) {
  if (!usable() || n <= 0)
    return;
  cuda_ok(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n,
                          cudaMemcpyDeviceToDevice, st.stream),
          "cudaMemcpyAsync (copy)");
}

void zero_floats(float *x, int64_t n) {
  if (!usable() || n <= 0)
    return;
  cuda_ok(cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, st.stream),
          "cudaMemsetAsync (zero)");
}

void gather_rows(const float *src, const int32_t *rows, int m, int h,
                 float *dst) {
  if (!usable() || m <= 0)
    return;
  gather_rows_kernel<<<grid_for((int64_t)m * h), kThreads, 0, st.stream>>>(
      src, rows, m, h, dst);
  launched("gather_rows_kernel");
}

void scatter_add_rows(const float *src, const int32_t *rows, int m, int h,
                      float *dst) {
  if (!usable() || m <= 0)
    return;
  scatter_add_rows_kernel<<<grid_for((int64_t)m * h), kThreads, 0, st.stream>>>(
      src, rows, m, h, dst);
  launched("scatter_add_rows_kernel");
}

/* ---- memory, synchronisation --------------------------------------------- */

void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (!usable())
    return NULL;
  if (!cuda_ok(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc"))
    return NULL;
  return p;
}

void dev_free(void *p) {
  if (p != NULL)
    cuda_ok(cudaFree(p), "cudaFree");
}

void *pinned_alloc(size_t bytes) {
  void *p = NULL;
  if (!usable())
    return NULL;
  if (!cuda_ok(cudaMallocHost(&p, bytes > 0 ? bytes : 1), "cudaMallocHost"))
    return NULL;
  return p;
}

void pinned_free(void *p) {
  if (p != NULL)
    cuda_ok(cudaFreeHost(p), "cudaFreeHost");
}

/* From pageable memory the runtime stages src before it returns; from
 * page-locked memory (pinned_alloc) the copy is only queued (layers.h). */
void to_device(void *dst, const void *src, size_t bytes) {
  if (!usable() || bytes == 0)
    return;
  cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st.stream),
          "cudaMemcpyAsync (to the device)");
}

void to_host(void *dst, const void *src, size_t bytes) {
  if (!usable() || bytes == 0)
    return;
  if (cuda_ok(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st.stream),
          "cudaMemcpyAsync (to the host)"))
    cuda_ok(cudaStreamSynchronize(st.stream),
            "cudaStreamSynchronize (to the host)");
}

void reserve_ws(int B, int S, int A, int dh, int width, int types) {
  if (!usable())
    return;
  g_types = types;
  const int64_t N = (int64_t)B * S;
  size_t need = attention_bytes(B, S, A, dh);
  size_t cols = colsum_bytes(N, width, types > 2 ? types : 2);
  size_t xent = xent_bytes(N);
  if (cols > need)
    need = cols;
  if (xent > need)
    need = xent;
  workspace(need);
}

void stream_sync(void) {
  if (usable())
    cuda_ok(cudaStreamSynchronize(st.stream), "cudaStreamSynchronize");
}

void sync_all(void) {
  if (usable())
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void fence_record(int slot) {
  if (usable())
    cuda_ok(cudaEventRecord(st.fence[slot & 1], st.stream), "cudaEventRecord");
}

void fence_wait(int slot) {
  if (usable())
    cuda_ok(cudaEventSynchronize(st.fence[slot & 1]), "cudaEventSynchronize");
}

const char *first_error(void) { return st.failed ? st.err : NULL; }

const bert_backend_t backend = {
    /* .name = */ "gpu",
    /* .precision = */ BERT_FP32,
    /* .alloc = */ reinterpret_cast<decltype(bert_backend_t::alloc)>(dev_alloc),
    /* .free = */ reinterpret_cast<decltype(bert_backend_t::free)>(dev_free),
    /* .host_alloc = */
    reinterpret_cast<decltype(bert_backend_t::host_alloc)>(pinned_alloc),
    /* .host_free = */
    reinterpret_cast<decltype(bert_backend_t::host_free)>(pinned_free),
    /* .to_device = */
    reinterpret_cast<decltype(bert_backend_t::to_device)>(to_device),
    /* .to_host = */
    reinterpret_cast<decltype(bert_backend_t::to_host)>(to_host),
    /* .reserve = */
    reinterpret_cast<decltype(bert_backend_t::reserve)>(reserve_ws),
    /* .sync = */ reinterpret_cast<decltype(bert_backend_t::sync)>(stream_sync),
    /* .sync_all = */
    reinterpret_cast<decltype(bert_backend_t::sync_all)>(sync_all),
    /* .fence_record = */
    reinterpret_cast<decltype(bert_backend_t::fence_record)>(fence_record),
    /* .fence_wait = */
    reinterpret_cast<decltype(bert_backend_t::fence_wait)>(fence_wait),
    /* .error = */
    reinterpret_cast<decltype(bert_backend_t::error)>(first_error),
    /* .linear_fwd = */
    reinterpret_cast<decltype(bert_backend_t::linear_fwd)>(linear_fwd),
    /* .linear_bwd = */
    reinterpret_cast<decltype(bert_backend_t::linear_bwd)>(linear_bwd),
    /* .layernorm_fwd = */
    reinterpret_cast<decltype(bert_backend_t::layernorm_fwd)>(layernorm_fwd),
    /* .layernorm_bwd = */
    reinterpret_cast<decltype(bert_backend_t::layernorm_bwd)>(layernorm_bwd),
    /* .gelu_fwd = */
    reinterpret_cast<decltype(bert_backend_t::gelu_fwd)>(gelu_fwd),
    /* .gelu_bwd = */
    reinterpret_cast<decltype(bert_backend_t::gelu_bwd)>(gelu_bwd),
    /* .attention_fwd = */
    reinterpret_cast<decltype(bert_backend_t::attention_fwd)>(attention_fwd),
    /* .attention_bwd = */
    reinterpret_cast<decltype(bert_backend_t::attention_bwd)>(attention_bwd),
    /* .embedding_fwd = */
    reinterpret_cast<decltype(bert_backend_t::embedding_fwd)>(embedding_fwd),
    /* .embedding_bwd = */
    reinterpret_cast<decltype(bert_backend_t::embedding_bwd)>(embedding_bwd),
    /* .xent_fwd = */
    reinterpret_cast<decltype(bert_backend_t::xent_fwd)>(xent_fwd),
    /* .xent_bwd = */
    reinterpret_cast<decltype(bert_backend_t::xent_bwd)>(xent_bwd),
    /* .add = */ reinterpret_cast<decltype(bert_backend_t::add)>(add_floats),
    /* .copy = */ reinterpret_cast<decltype(bert_backend_t::copy)>(copy_floats),
    /* .zero = */ reinterpret_cast<decltype(bert_backend_t::zero)>(zero_floats),
    /* .gather_rows = */
    reinterpret_cast<decltype(bert_backend_t::gather_rows)>(gather_rows),
    /* .scatter_add_rows = */
    reinterpret_cast<decltype(bert_backend_t::scatter_add_rows)>(
        scatter_add_rows),
};

void apply_math_mode(void) {
  blas_ok(cublasSetMathMode(st.blas, st.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                             : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
}

/* Everything open() made, in reverse; each handle NULL once gone. */
void teardown(void) {
  if (st.stream != NULL)
    cudaStreamSynchronize(st.stream);
  if (st.ws != NULL)
    cudaFree(st.ws);
  if (st.xres_dev != NULL)
    cudaFree(st.xres_dev);
  if (st.xres_host != NULL)
    cudaFreeHost(st.xres_host);
  for (int i = 0; i < 2; i++)
    if (st.fence[i] != NULL)
      cudaEventDestroy(st.fence[i]);
  if (st.blas != NULL)
    cublasDestroy(st.blas);
  if (st.stream != NULL)
    cudaStreamDestroy(st.stream);
  int tf32 = st.tf32;
  memset(&st, 0, sizeof st);
  st.tf32 = tf32;
}

} /* namespace */

extern "C" int bert_cuda_open(int device, char *msg, size_t len) {
  char dummy[8];
  if (msg == NULL || len == 0)
    msg = dummy, len = sizeof dummy;
  msg[0] = '\0';
  if (st.refs > 0) {
    if (device >= 0 && device != st.device) {
      snprintf(msg, len,
               "the CUDA layers are open on device %d, not %d (one GPU per "
               "process)",
               st.device, device);
      return -1;
    }
    st.refs++;
    return st.device;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    snprintf(msg, len, "no CUDA device: %s", hvd_cuda_unavailable());
    return -1;
  }
  if (count == 0) {
    snprintf(msg, len, "no CUDA device: cudaGetDeviceCount found none");
    return -1;
  }
  if (device < 0 && (e = cudaGetDevice(&device)) != cudaSuccess) {
    snprintf(msg, len, "cudaGetDevice: %s", cudaGetErrorString(e));
    return -1;
  }
  if (device >= count) {
    snprintf(msg, len, "no CUDA device %d (%d visible)", device, count);
    return -1;
  }
  int warp = 0;
  if ((e = cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, device)) !=
      cudaSuccess) {
    snprintf(msg, len, "cudaDeviceGetAttribute: %s", cudaGetErrorString(e));
    return -1;
  }
  if (warp != kWarp) {
    snprintf(msg, len,
             "CUDA device %d has warps of %d threads; the layers "
             "need %d",
             device, warp, kWarp);
    return -1;
  }
  st.refs = 1;
  st.device = device;
  st.failed = 0;
  /* A blocking stream (not cudaStreamNonBlocking): it also waits for the
   * legacy default stream, where code that is not ours may work. */
  if (cuda_ok(cudaSetDevice(device), "cudaSetDevice") &&
      cuda_ok(cudaStreamCreate(&st.stream), "cudaStreamCreate") &&
      blas_ok(cublasCreate(&st.blas), "cublasCreate") &&
      blas_ok(cublasSetStream(st.blas, st.stream), "cublasSetStream") &&
      cuda_ok(cudaEventCreateWithFlags(&st.fence[0], cudaEventDisableTiming),
              "cudaEventCreateWithFlags") &&
      cuda_ok(cudaEventCreateWithFlags(&st.fence[1], cudaEventDisableTiming),
              "cudaEventCreateWithFlags") &&
      cuda_ok(cudaMalloc((void **)&st.xres_dev, sizeof(XentResult)),
              "cudaMalloc") &&
      cuda_ok(cudaMallocHost((void **)&st.xres_host, sizeof(XentResult)),
              "cudaMallocHost"))
    apply_math_mode();
  if (st.failed) {
    snprintf(msg, len, "%s", st.err);
    teardown();
    return -1;
  }
  return device;
}

extern "C" void bert_cuda_close(void) {
  if (st.refs > 0 && --st.refs == 0)
    teardown();
}

extern "C" const bert_backend_t *bert_cuda_backend(int precision) {
  return st.refs > 0 && precision == BERT_FP32 ? &backend : NULL;
}

extern "C" void bert_cuda_set_tf32(int on) {
  st.tf32 = on != 0;
  if (st.refs > 0)
    apply_math_mode();
}
