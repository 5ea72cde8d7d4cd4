/*
 * layers_cuda.cu - the GPU backend of the BERT example: the contract of
 * layers.h on device pointers, in its three precisions. cuBLAS for every
 * matrix product (the attention's per-(batch, head) products as one
 * strided-batched GEMM each), CUDA kernels for the rest, all on one
 * stream owned by this module; the tables bert_cuda_backend(precision)
 * hands to model.c.
 *
 * Numerics follow layers.c: float32 data, the same expression for every
 * element (built with -fmad=false, Makefile.am, so a * b + c is not
 * fused), double where the CPU sums in double (LayerNorm statistics, the
 * cross-entropy's sum of exponentials and loss). Reductions run in a
 * fixed order (no atomics), so results are reproducible run to run,
 * except the float32 word-embedding and scatter-add gradients, which add
 * with atomicAdd where several tokens share a row (as PyTorch does).
 *
 * Precisions (layers.h, "Precisions"). Every kernel is a template on the
 * storage type T: float, __nv_bfloat16 or __half. to_float() converts an
 * element to float (exact); from_float<T>() rounds a float to T, to
 * nearest even, and is the identity for float, so the float32
 * instantiations are the float32 kernels operation for operation (and
 * the float32 products the same cublasSgemm calls). With T = bfloat16 or
 * float16 a kernel computes the float32 kernel's expression (in double
 * where that one uses double) on the converted inputs and rounds each
 * output element once:
 *  - products: cublasGemmEx and cublasGemmStridedBatchedEx on T operands,
 *    accumulating in float32 (CUBLAS_COMPUTE_32F, float alpha and beta:
 *    tensor cores whatever the math mode). cuBLAS adds beta C before it
 *    rounds, so the linear layer's y = b, then beta 1, is round(x W^T + b)
 *    and dW, dx (dx_beta 1) are round(old + product) (a split k reduces
 *    its parts in float32: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
 *    apply_math_mode);
 *  - column sums (bias, LayerNorm and token-type gradients): in float,
 *    then old + sum rounded once (colsum_finish);
 *  - the word-embedding and scatter-add gradients: one atomicAdd per
 *    token would round once per token, and a float32 copy of the
 *    destination would need its row count, which neither call knows. So
 *    row_links_kernel chains the tokens of each destination row and the
 *    row's first token sums them in float, in token order (the CPU's),
 *    and rounds old + sum once (rows_add_kernel): deterministic, O(m^2)
 *    comparisons for m tokens. The position gradient likewise sums a
 *    position's tokens first;
 *  - attention: the scores Q K^T in float32 (a CUDA_R_32F C in the
 *    workspace), the masked softmax in float32 writing T probabilities,
 *    ctx = round(P V) from those. Backward: dP = dC V^T in float32, dV =
 *    round(P^T dC), dS = P (dP - rowsum(P dP)) in float32 from the T
 *    probabilities and rounded once to T (as autocast does: the dQ and
 *    dK products run on tensor cores), dQ = round(scale dS K) and dK =
 *    round(scale dS^T Q);
 *  - the cross-entropy reads T logits, computes as the float32 kernel and
 *    writes T probabilities; LayerNorm's mean and rstd stay float32.
 *
 * Fused kernels (16-bit T, unless bert_cuda_set_plain(1)): a linear
 * layer's bias is added in cuBLASLt's epilogue (lt_linear), and the
 * attention's batched products take each head where it is in its
 * [B*S, A*dh] buffer (gemm_ptrs: pointer arrays, leading dimension A*dh)
 * instead of copying it head-major and back. The same products on the
 * same values; float32 keeps the plain path, operation for operation.
 * With bert_cuda_set_flash(1) the 16-bit attention of heads of 64 runs
 * as flash attention ("flash attention" below): no B*A*S*S scores. In
 * every precision (unless bert_cuda_set_plain(1)), the residual add is
 * fused into the LayerNorm after it (add_layernorm_fwd) and the copy of
 * the residual's gradient into LayerNorm's backward (layernorm_bwd2):
 * the same expressions, the same bits, two launches and passes fewer.
 *
 * Performance, later work: the GELU in the epilogue too (cuBLASLt's GELU
 * is the tanh approximation, not this model's erf); vectorised (2 or 8
 * element) loads of the T kernels; a sort instead of row_links_kernel's
 * O(m^2) scan.
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

/* No arithmetic operators or implicit conversions on the 16-bit types:
 * every value goes through to_float and from_float, so no expression
 * rounds to T by accident. */
#define __CUDA_NO_HALF_OPERATORS__
#define __CUDA_NO_HALF_CONVERSIONS__
#define __CUDA_NO_HALF2_OPERATORS__
#define __CUDA_NO_BFLOAT16_OPERATORS__
#define __CUDA_NO_BFLOAT16_CONVERSIONS__
#define __CUDA_NO_BFLOAT162_OPERATORS__

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flash_mma.h"
#include "softmax_rows.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>

namespace {

typedef __nv_bfloat16 bf16;
typedef __half fp16;

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

/* A CUDA graph of graph_run: its owner and key, the workspace generation
 * it was captured in (its kernels hold workspace addresses). */
struct Graph {
  const void *owner;
  int key[4];
  unsigned gen;
  cudaGraphExec_t exec;
};
/* Graphs kept at once: model.c makes two per encoder layer and batch
 * shape; beyond this graph_run declines (the work runs kernel by
 * kernel). */
const int kMaxGraphs = 256;
/* cuBLAS's own workspace, fixed at open so that captured products keep
 * a valid address (cuBLAS's default would be its pool's). */
const size_t kBlasWorkspace = (size_t)32 << 20;
/* cuBLASLt plans kept at once (lt_plan): one per linear shape, type and
 * operand alignment; beyond this the linears take the plain path. */
const int kMaxPlans = 64;

/* A cuBLASLt product y = x W^T + b for one shape, type and alignment of
 * the operands: the descriptor (bias epilogue), the layouts, and the
 * algorithm the heuristic chose; ok 0 where it found none (the linear
 * then runs as cuBLAS's two steps). */
struct LtPlan {
  int n, in, out, align;
  cudaDataType_t type;
  int ok;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t w, x, y;
  cublasLtMatmulAlgo_t algo;
};

struct State {
  int refs;
  int device;
  int tf32;
  cudaStream_t stream;
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  int plain;    /* bert_cuda_set_plain: no cuBLASLt epilogue, heads copied */
  int flash;    /* bert_cuda_set_flash */
  int flash_ok; /* the device gives the flash kernels their shared memory */
  int nplans;
  LtPlan plan[kMaxPlans];
  cudaEvent_t fence[2];
  int failed;
  char err[512];
  /* scratch memory of the kernels (attention's head-major copies and
   * scores or their gradient, column-sum partials, cross-entropy rows,
   * the row chains of the 16-bit gradients), shared by the three tables */
  void *ws;
  size_t ws_bytes;
  unsigned ws_gen; /* bumped when ws moves: the graphs made before are
                      captured again */
  XentResult *xres_dev, *xres_host; /* host: page-locked */
  void *blas_ws;                    /* kBlasWorkspace bytes */
  cudaStream_t cap;                 /* graphs are captured here */
  int types;                        /* token types (reserve; 0: none yet) */
  int graphs;                       /* bert_cuda_set_graphs */
  char graphs_off[512];             /* why a failed capture turned them off */
  int ngraphs;
  Graph graph[kMaxGraphs];
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

/* blas_ok for `call` made for `what`: "call (what): message". */
bool blas_ok_in(cublasStatus_t s, const char *call, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return true;
  fail("%s (%s): %s (%s)", call, what, cublasGetStatusString(s),
       cublasGetStatusName(s));
  return false;
}

/* After a launch: configuration errors show at once (no synchronisation;
 * an error some other code left pending on this thread shows here too). */
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
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st.stream, &cs) == cudaSuccess &&
      cs != cudaStreamCaptureStatusNone) {
    fail("workspace: %zu bytes needed inside a CUDA graph's capture, %zu "
         "reserved (reserve() with the shapes in use)",
         bytes, st.ws_bytes);
    return NULL;
  }
  if (!cuda_ok(cudaStreamSynchronize(st.stream), "cudaStreamSynchronize"))
    return NULL;
  if (st.ws != NULL && !cuda_ok(cudaFree(st.ws), "cudaFree (workspace)"))
    return NULL;
  st.ws = NULL;
  st.ws_bytes = 0;
  st.ws_gen++;
  if (!cuda_ok(cudaMalloc(&st.ws, bytes), "cudaMalloc (workspace)"))
    return NULL;
  st.ws_bytes = bytes;
  return st.ws;
}

/* ---- storage types ------------------------------------------------------- */

/* T -> float: exact. */
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_float(fp16 v) { return __half2float(v); }

/* float -> T: rounded to nearest even (float16: overflow to +-inf,
 * subnormals kept); the identity for float. */
template <typename T> __device__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ fp16 from_float<fp16>(float v) {
  return __float2half_rn(v);
}

/* An element of one storage type as another (exact, or rounded once). */
template <typename To, typename From> __device__ To convert(From v) {
  return from_float<To>(to_float(v));
}

template <typename T> __host__ __device__ constexpr bool is_f32(void) {
  return std::is_same<T, float>::value;
}

/* The cuBLAS type of T. */
template <typename T> cudaDataType_t blas_type(void);
template <> cudaDataType_t blas_type<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t blas_type<bf16>(void) { return CUDA_R_16BF; }
template <> cudaDataType_t blas_type<fp16>(void) { return CUDA_R_16F; }

/* ---- matrix products ----------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C, in cuBLAS's column-major terms (the
 * callers map): float32 by cublasSgemm, T by cublasGemmEx accumulating
 * in float32 and rounding C once. */
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const float *a, int lda, const float *b, int ldb,
          float beta, float *c, int ldc, const char *what) {
  blas_ok_in(cublasSgemm(st.blas, ta, tb, m, n, k, &alpha, a, lda, b, ldb,
                         &beta, c, ldc),
             "cublasSgemm", what);
}

template <typename T>
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const T *a, int lda, const T *b, int ldb, float beta,
          T *c, int ldc, const char *what) {
  const cudaDataType_t t = blas_type<T>();
  blas_ok_in(cublasGemmEx(st.blas, ta, tb, m, n, k, &alpha, a, t, lda, b, t,
                          ldb, &beta, c, t, ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx", what);
}

/* C_i = alpha op(X_i) op(Y_i) over the B*A head-major matrices, in the
 * column-major terms of cuBLAS (callers map): float32 by
 * cublasSgemmStridedBatched; T operands, with a T or a float32 C, by
 * cublasGemmStridedBatchedEx accumulating in float32. */
void gemm_heads(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                float alpha, const float *a, int lda, long long sa,
                const float *b, int ldb, long long sb, float *c, int ldc,
                long long sc, int count, const char *what) {
  const float zero = 0.0f;
  blas_ok_in(cublasSgemmStridedBatched(st.blas, ta, tb, m, n, k, &alpha, a, lda,
                                       sa, b, ldb, sb, &zero, c, ldc, sc,
                                       count),
             "cublasSgemmStridedBatched", what);
}

template <typename T, typename TC>
void gemm_heads(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                float alpha, const T *a, int lda, long long sa, const T *b,
                int ldb, long long sb, TC *c, int ldc, long long sc, int count,
                const char *what) {
  const float zero = 0.0f;
  const cudaDataType_t t = blas_type<T>();
  blas_ok_in(cublasGemmStridedBatchedEx(
                 st.blas, ta, tb, m, n, k, &alpha, a, t, lda, sa, b, t, ldb, sb,
                 &zero, c, blas_type<TC>(), ldc, sc, count, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx", what);
}

/* C_i = alpha op(A_i) op(B_i) for count matrices anywhere in memory (the
 * pointer arrays in device memory, head_ptrs): T operands, a T or float32
 * C, accumulating in float32. Each head is read and written where it is
 * in its [B*S, A*dh] buffer (leading dimension A*dh), so no head-major
 * copy is made. */
template <typename T, typename TC>
void gemm_ptrs(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
               float alpha, const void *const *a, int lda, const void *const *b,
               int ldb, void *const *c, int ldc, int count, const char *what) {
  const float zero = 0.0f;
  const cudaDataType_t t = blas_type<T>();
  blas_ok_in(cublasGemmBatchedEx(st.blas, ta, tb, m, n, k, &alpha, a, t, lda, b,
                                 t, ldb, &zero, c, blas_type<TC>(), ldc, count,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmBatchedEx", what);
}

/* ---- cuBLASLt: the bias in the product's epilogue ------------------------
 *
 * y = round(x W^T + b) in one pass for a 16-bit T: cuBLASLt adds the bias
 * to the float32 accumulator before the one rounding (layers.h's rule), so
 * the linear layer needs neither fill_rows_kernel's pass nor cuBLAS's read
 * of y for beta 1. The float32 products stay cublasSgemm (unchanged). The
 * plan of each shape is made once: the heuristic is asked for an
 * algorithm that works at the operands' actual alignment (cuBLASLt
 * assumes 256 bytes otherwise) and, as apply_math_mode asks of cuBLAS,
 * that never adds a split k's parts in T. */

/* The largest power of two up to 256 that divides every address. */
int lt_align(const void *a, const void *b, const void *c, const void *d) {
  uintptr_t v = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | 256;
  return (int)(v & (~v + 1));
}

void lt_plan_free(LtPlan *p) {
  if (p->y != NULL)
    cublasLtMatrixLayoutDestroy(p->y);
  if (p->x != NULL)
    cublasLtMatrixLayoutDestroy(p->x);
  if (p->w != NULL)
    cublasLtMatrixLayoutDestroy(p->w);
  if (p->desc != NULL)
    cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof *p);
}

/* The descriptor and layouts of p's product, and its algorithm (p->ok 0
 * where the heuristic has none); false after a failure (recorded). In
 * cuBLAS's column-major terms, as linear_fwd: y^T (out x n, ld out) =
 * op_T(W: in x out, ld in) times x^T (in x n, ld in), the bias one value
 * per row of y^T. */
bool lt_plan_make(LtPlan *p) {
  const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  const uint32_t reduce = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint32_t align = (uint32_t)p->align;
  const uint64_t ws = kBlasWorkspace;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  bool good =
      blas_ok(
          cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate") &&
      blas_ok(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt),
              "cublasLtMatmulDescSetAttribute (TRANSA)") &&
      blas_ok(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn),
              "cublasLtMatmulDescSetAttribute (TRANSB)") &&
      blas_ok(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              "cublasLtMatmulDescSetAttribute (EPILOGUE)") &&
      blas_ok(cublasLtMatrixLayoutCreate(&p->w, p->type, p->in, p->out, p->in),
              "cublasLtMatrixLayoutCreate") &&
      blas_ok(cublasLtMatrixLayoutCreate(&p->x, p->type, p->in, p->n, p->in),
              "cublasLtMatrixLayoutCreate") &&
      blas_ok(cublasLtMatrixLayoutCreate(&p->y, p->type, p->out, p->n, p->out),
              "cublasLtMatrixLayoutCreate") &&
      blas_ok(cublasLtMatmulPreferenceCreate(&pref),
              "cublasLtMatmulPreferenceCreate") &&
      blas_ok(
          cublasLtMatmulPreferenceSetAttribute(
              pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
          "cublasLtMatmulPreferenceSetAttribute (workspace)") &&
      blas_ok(cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduce,
                  sizeof reduce),
              "cublasLtMatmulPreferenceSetAttribute (reduction)");
  const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; good && i < 4; i++)
    good = blas_ok(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align,
                                                        sizeof align),
                   "cublasLtMatmulPreferenceSetAttribute (alignment)");
  if (good) {
    /* NOT_SUPPORTED: no algorithm for this shape; the plain path runs */
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        st.lt, p->desc, p->w, p->x, p->y, p->y, pref, 1, &res, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
      p->algo = res.algo;
      p->ok = 1;
    } else if (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_SUCCESS) {
      good = blas_ok(s, "cublasLtMatmulAlgoGetHeuristic");
    }
  }
  if (pref != NULL)
    cublasLtMatmulPreferenceDestroy(pref);
  return good;
}

/* The plan of this linear (made the first time); NULL where there is none:
 * the plain path runs. */
const LtPlan *lt_plan(cudaDataType_t type, int n, int in, int out, int align) {
  for (int i = 0; i < st.nplans; i++) {
    const LtPlan *p = &st.plan[i];
    if (p->type == type && p->n == n && p->in == in && p->out == out &&
        p->align == align)
      return p->ok ? p : NULL;
  }
  if (st.nplans == kMaxPlans)
    return NULL;
  LtPlan *p = &st.plan[st.nplans];
  memset(p, 0, sizeof *p);
  p->type = type;
  p->n = n;
  p->in = in;
  p->out = out;
  p->align = align;
  if (!lt_plan_make(p)) {
    lt_plan_free(p);
    return NULL;
  }
  st.nplans++;
  return p->ok ? p : NULL;
}

/* Whether T's layers take the fused kernels (the bias in the epilogue,
 * the heads in place): 16-bit T, unless bert_cuda_set_plain(1). */
template <typename T> bool fused(void) { return !is_f32<T>() && !st.plain; }

/* y = x W^T + b through cuBLASLt's bias epilogue; false where no plan
 * applies (nothing was queued: the caller takes the plain path). */
template <typename T>
bool lt_linear(const T *x, const T *W, const T *b, T *y, int n, int in,
               int out) {
  if (!fused<T>() || b == NULL)
    return false;
  const LtPlan *p = lt_plan(blas_type<T>(), n, in, out, lt_align(x, W, y, y));
  if (p == NULL)
    return false;
  const float one = 1.0f, zero = 0.0f;
  if (blas_ok(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b),
              "cublasLtMatmulDescSetAttribute (bias)"))
    blas_ok_in(cublasLtMatmul(st.lt, p->desc, &one, W, p->w, x, p->x, &zero, y,
                              p->y, y, p->y, &p->algo, st.blas_ws,
                              kBlasWorkspace, st.stream),
               "cublasLtMatmul", "linear forward, bias epilogue");
  return true;
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

template <typename T>
__global__ void fill_rows_kernel(T *y, const T *b, int64_t n, int out) {
  GRID_STRIDE(i, n * out) { y[i] = b[i % out]; }
}

template <typename T>
__global__ void gelu_fwd_kernel(const T *x, T *y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = to_float(x[i]);
    y[i] = from_float<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

template <typename T>
__global__ void gelu_bwd_kernel(const T *x, const T *dy, T *dx, int64_t n) {
  const float inv_sqrt_2pi = 0.3989422804014327f;
  GRID_STRIDE(i, n) {
    float v = to_float(x[i]);
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
    dx[i] = from_float<T>(to_float(dy[i]) * (cdf + v * pdf));
  }
}

template <typename T>
__global__ void add_kernel(const T *a, const T *b, T *y, int64_t n) {
  GRID_STRIDE(i, n) { y[i] = from_float<T>(to_float(a[i]) + to_float(b[i])); }
}

template <typename T>
__global__ void gather_rows_kernel(const T *src, const int32_t *rows, int m,
                                   int h, T *dst) {
  GRID_STRIDE(i, (int64_t)m * h) {
    int64_t r = i / h, j = i % h;
    dst[i] = src[(int64_t)rows[r] * h + j];
  }
}

/* float32, atomicAdd: the contract allows repeated rows. */
__global__ void scatter_add_rows_kernel(const float *src, const int32_t *rows,
                                        int m, int h, float *dst) {
  GRID_STRIDE(i, (int64_t)m * h) {
    int64_t r = i / h, j = i % h;
    atomicAdd(dst + (int64_t)rows[r] * h + j, src[i]);
  }
}

/* ---- row chains: dst[rows[i]] += src[i] with one rounding per element ----
 *
 * For the 16-bit types (the header). row_links_kernel: for each i < m,
 * next[i] = the first k > i with rows[k] == rows[i] (-1: none), head[i] =
 * 1 when no k < i has rows[k] == rows[i]; one thread per i, scanning the
 * m rows. rows_add_kernel: the head of each destination row walks its
 * chain, summing in float in token order, and rounds old + sum once (as
 * layers.h says and the CPU's model does); only heads write, each its
 * own row. */
__global__ void row_links_kernel(const int32_t *rows, int64_t m, int32_t *next,
                                 int32_t *head) {
  GRID_STRIDE(i, m) {
    const int32_t r = rows[i];
    int32_t nx = -1, hd = 1;
    for (int64_t k = 0; k < i && hd; k++)
      hd = rows[k] != r;
    for (int64_t k = i + 1; k < m && nx < 0; k++)
      if (rows[k] == r)
        nx = (int32_t)k;
    next[i] = nx;
    head[i] = hd;
  }
}

template <typename T>
__global__ void rows_add_kernel(const T *src, const int32_t *rows,
                                const int32_t *next, const int32_t *head,
                                int64_t m, int h, T *dst) {
  GRID_STRIDE(i, m * h) {
    const int64_t t = i / h, j = i % h;
    if (!head[t])
      continue;
    T *d = dst + (int64_t)rows[t] * h + j;
    float sum = 0;
    for (int64_t u = t; u >= 0; u = next[u])
      sum += to_float(src[u * h + j]);
    *d = from_float<T>(to_float(*d) + sum);
  }
}

size_t links_bytes(int64_t m) {
  return 2 * align_up(sizeof(int32_t) * (size_t)m);
}

/* dst[rows[i]] += src[i] for i < m (rows of h), T != float. */
template <typename T>
void rows_add(const T *src, const int32_t *rows, int64_t m, int h, T *dst) {
  char *w = (char *)workspace(links_bytes(m));
  if (w == NULL)
    return;
  int32_t *next = (int32_t *)w;
  int32_t *head = (int32_t *)(w + align_up(sizeof(int32_t) * (size_t)m));
  row_links_kernel<<<grid_for(m), kThreads, 0, st.stream>>>(rows, m, next,
                                                            head);
  launched("row_links_kernel");
  rows_add_kernel<T><<<grid_for(m * h), kThreads, 0, st.stream>>>(
      src, rows, next, head, m, h, dst);
  launched("rows_add_kernel");
}

/* ---- column sums: out[q][j] += sum over rows i of value(q, i, j) ----------
 *
 * Two deterministic passes instead of atomics. colsum_partial: block
 * (x: kWarp columns, y: kColRows row lanes) at (column tile, row chunk
 * of kColChunk rows) sums its chunk per column in shared memory and
 * writes partial[q][chunk][j]; colsum_finish adds the chunks in order
 * and the sum to the old T value, rounding once. Op gives Q values per
 * (i, j) (LayerNorm's dg and db, the types of the token-type table). */
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
template <typename T>
__global__ void colsum_finish(const float *partial, int nchunks, int h, int Q,
                              T *d0, T *d1) {
  GRID_STRIDE(i, (int64_t)Q * h) {
    int q = (int)(i / h), j = (int)(i % h);
    float s = 0;
    for (int c = 0; c < nchunks; c++)
      s += partial[((int64_t)q * nchunks + c) * h + j];
    T *d = q == 0 ? d0 : d1 + (int64_t)(q - 1) * h;
    d[j] = from_float<T>(to_float(d[j]) + s);
  }
}

int colsum_chunks(int64_t n) { return (int)((n + kColChunk - 1) / kColChunk); }

size_t colsum_bytes(int64_t n, int h, int Q) {
  return align_up(sizeof(float) * (size_t)Q * colsum_chunks(n) * h);
}

template <int Q, typename T, typename Op>
void colsum(const Op &op, int64_t n, int h, T *d0, T *d1, const char *what) {
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
  colsum_finish<T><<<grid_for((int64_t)Q * h), kThreads, 0, st.stream>>>(
      partial, nchunks, h, Q, d0, d1);
  launched(what);
}

template <typename T> struct ColOfMatrix { /* db += column sums of dy */
  const T *y;
  int w;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    acc[0] += to_float(y[i * w + j]);
  }
};

template <typename T> struct LayerNormParams { /* dg += dy xhat, db += dy */
  const T *x, *dy;
  const float *mean, *rstd;
  int h;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    float xhat = (to_float(x[i * h + j]) - mean[i]) * rstd[i];
    acc[0] += to_float(dy[i * h + j]) * xhat;
    acc[1] += to_float(dy[i * h + j]);
  }
};

template <int Q, typename T>
struct TypeRows { /* dtype[t] += dout of the tokens of type t */
  const T *dout;
  const int32_t *types;
  int h;
  __device__ void operator()(int64_t i, int j, float *acc) const {
    int t = types != NULL ? types[i] : 0;
    if (t >= 0 && t < Q)
      acc[t] += to_float(dout[i * h + j]);
  }
};

/* ---- LayerNorm ----------------------------------------------------------- */

/* One block per row (grid-stride over rows; the row index is the same
 * for the whole block, so the barriers inside block_sum are reached by
 * every thread). With Add, the row is first sum = a + res rounded to T
 * (add_kernel's expression), written to sum, and normalised from there:
 * each thread reads back only the elements it wrote (sum may be a). */
template <typename T, bool Add>
__global__ void layernorm_fwd_kernel(const T *x, const T *res, const T *g,
                                     const T *b, float eps, T *sum, T *y,
                                     float *mean, float *rstd, int64_t n,
                                     int h) {
  __shared__ double sh[kThreads / kWarp];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T *xr = x + row * h;
    T *yr = y + row * h;
    double s = 0;
    if (Add) {
      const T *rr = res + row * h;
      T *sr = sum + row * h;
      for (int j = threadIdx.x; j < h; j += blockDim.x) {
        const T v = from_float<T>(to_float(xr[j]) + to_float(rr[j]));
        sr[j] = v;
        s += to_float(v);
      }
      xr = sr;
    } else {
      for (int j = threadIdx.x; j < h; j += blockDim.x)
        s += to_float(xr[j]);
    }
    double mu = block_sum(s, sh) / h;
    double ss = 0;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      double d = to_float(xr[j]) - mu;
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
      yr[j] = from_float<T>((to_float(xr[j]) - m) * r * to_float(g[j]) +
                            to_float(b[j]));
  }
}

/* dx only (dg and db come from colsum first, as dx may alias dy), and
 * the same value into dx2 where it is given (layernorm_bwd2). Each
 * thread reads dy[j] and then writes dx[j] at the same j, after the
 * block's sums are complete. */
template <typename T>
__global__ void layernorm_bwd_kernel(const T *x, const float *mean,
                                     const float *rstd, const T *g, const T *dy,
                                     T *dx, T *dx2, int64_t n, int h) {
  __shared__ double sh[kThreads / kWarp];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T *xr = x + row * h, *dyr = dy + row * h;
    T *dxr = dx + row * h, *dx2r = dx2 != NULL ? dx2 + row * h : NULL;
    const float m = mean[row], r = rstd[row];
    double s1 = 0, s2 = 0;
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (to_float(xr[j]) - m) * r;
      float dxhat = to_float(dyr[j]) * to_float(g[j]);
      s1 += dxhat;
      s2 += (double)dxhat * xhat;
    }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    float a = (float)(s1 / h), c = (float)(s2 / h);
    for (int j = threadIdx.x; j < h; j += blockDim.x) {
      float xhat = (to_float(xr[j]) - m) * r;
      const T v =
          from_float<T>(r * (to_float(dyr[j]) * to_float(g[j]) - a - xhat * c));
      dxr[j] = v;
      if (dx2r != NULL)
        dx2r[j] = v;
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
 * at i*S*dh, and the results copied back (merge_heads); either copy may
 * convert (T to float exactly, float to T rounding once). probs is
 * already [B, A, S, S], matrix i at i*S*S. */

template <typename From, typename To>
__global__ void split_heads_kernel(const From *src, To *dst, int B, int S,
                                   int A, int dh) {
  const int64_t total = (int64_t)B * S * A * dh;
  GRID_STRIDE(i, total) { /* i indexes dst: ((b*A + h)*S + s)*dh + e */
    int64_t e = i % dh, s = (i / dh) % S, bh = i / ((int64_t)dh * S);
    int64_t b = bh / A, h = bh % A;
    dst[i] = convert<To>(src[(b * S + s) * A * dh + h * dh + e]);
  }
}

template <typename From, typename To>
__global__ void merge_heads_kernel(const From *src, To *dst, int B, int S,
                                   int A, int dh) {
  const int64_t total = (int64_t)B * S * A * dh;
  GRID_STRIDE(i, total) { /* i indexes dst: (b*S + s)*A*dh + h*dh + e */
    int64_t e = i % dh, h = (i / dh) % A, bs = i / ((int64_t)dh * A);
    int64_t b = bs / S, s = bs % S;
    dst[i] = convert<To>(src[((b * A + h) * S + s) * dh + e]);
  }
}

/* One warp per row of the float32 scores sc ([B*A*S rows, S]); blockDim
 * (kWarp, rows per block). Keys at >= lengths[b] get BERT_MASK_VALUE,
 * then the softmax of layers.c: max, exponentials (kept in sc) and their
 * float sum, times 1 / sum into p. For float32, p is sc (in place). */
template <typename T>
__global__ void softmax_fwd_kernel(float *sc, T *p, const int32_t *lengths,
                                   int64_t rows, int S, int A) {
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
       row += (int64_t)gridDim.x * blockDim.y) {
    float *r = sc + row * S;
    T *pr = p + row * S;
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
      pr[j] = from_float<T>(r[j] * inv);
  }
}

/* dS = P * (dP - rowsum(P * dP)) from the float32 dp into ds: in place
 * for float32 (ds is dp), rounded once to T for the 16-bit types (a
 * buffer of its own); one warp per row. */
template <typename T>
__global__ void softmax_bwd_kernel(const T *p, float *dp, T *ds, int64_t rows,
                                   int S) {
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
       row += (int64_t)gridDim.x * blockDim.y) {
    const T *pr = p + row * S;
    float *dr = dp + row * S;
    T *sr = ds + row * S;
    float dot = 0;
    for (int j = threadIdx.x; j < S; j += kWarp)
      dot += to_float(pr[j]) * dr[j];
    dot = warp_sum(dot);
    for (int j = threadIdx.x; j < S; j += kWarp)
      sr[j] = from_float<T>(to_float(pr[j]) * (dr[j] - dot));
  }
}

const int kRowsPerBlock = kThreads / kWarp; /* warps per softmax block */

/* Pointer arrays of the batched products that take the heads where they
 * are (gemm_ptrs): at most this many per call of head_ptrs. */
const int kPtrSets = 10;

/* Where set j's (sequence b, head a) matrix starts: base + b bstride + a
 * astride bytes. */
struct PtrSet {
  const char *base;
  long long bstride, astride;
};
struct PtrSets {
  PtrSet set[kPtrSets];
};

/* out[j * count + i], i = b A + a: set j's matrix i, for j < nsets. */
__global__ void head_ptrs_kernel(PtrSets sets, int nsets, int count, int A,
                                 const void **out) {
  GRID_STRIDE(i, (int64_t)count * nsets) {
    const PtrSet &p = sets.set[i / count];
    const int h = (int)(i % count);
    out[i] = p.base + (h / A) * p.bstride + (h % A) * p.astride;
  }
}

/* Four head-major buffers of float32 size (they hold T or float32), the
 * float32 scores or their gradient, dS in a 16-bit T, and kPtrSets
 * pointer arrays of B*A entries. */
size_t attention_bytes(int B, int S, int A, int dh) {
  size_t nh = (size_t)B * S * A * dh, ns = (size_t)B * A * S * S;
  return 4 * align_up(sizeof(float) * nh) + align_up(sizeof(float) * ns) +
         align_up(sizeof(uint16_t) * ns) +
         align_up(sizeof(void *) * kPtrSets * (size_t)B * A);
}

/* ---- embeddings ---------------------------------------------------------- */

template <typename T>
__global__ void embedding_fwd_kernel(const int32_t *ids, const int32_t *types,
                                     const T *word, const T *pos, const T *type,
                                     T *out, int B, int S, int H) {
  GRID_STRIDE(i, (int64_t)B * S * H) {
    int64_t t = i / H, j = i % H, s = t % S;
    const float w = to_float(word[(int64_t)ids[t] * H + j]);
    const float ps = to_float(pos[s * H + j]);
    const float ty =
        to_float(type[(int64_t)(types != NULL ? types[t] : 0) * H + j]);
    out[i] = from_float<T>(w + ps + ty);
  }
}

/* float32 (T: rows_add) */
__global__ void embedding_bwd_word_kernel(const int32_t *ids, const float *dout,
                                          float *dword, int64_t N, int H) {
  GRID_STRIDE(i, N * H) {
    int64_t t = i / H, j = i % H;
    atomicAdd(dword + (int64_t)ids[t] * H + j, dout[i]);
  }
}

/* dpos[s] += dout of position s in every sequence, added in sequence
 * order as layers.c does (one thread per (s, j)): for float32 onto dpos
 * as it goes, for T summed first and added to the old value rounding
 * once (layers.h). */
template <typename T>
__global__ void embedding_bwd_pos_kernel(const T *dout, T *dpos, int B, int S,
                                         int H) {
  GRID_STRIDE(i, (int64_t)S * H) {
    int64_t s = i / H, j = i % H;
    float acc = is_f32<T>() ? to_float(dpos[i]) : 0.0f;
    for (int b = 0; b < B; b++)
      acc += to_float(dout[((int64_t)b * S + s) * H + j]);
    dpos[i] = from_float<T>(is_f32<T>() ? acc : to_float(dpos[i]) + acc);
  }
}

/* ---- cross-entropy ------------------------------------------------------- */

/* One block per row of logits [m, V]: the argmax (the first one, as
 * layers.c), the loss log sum exp(r - max) - (r[t] - max) in double, the
 * probabilities in place; the row's loss and hit into rows_loss and
 * rows_hit (summed by xent_sum_kernel, in a fixed order). */
template <typename T>
__global__ void xent_fwd_kernel(T *logits, const int32_t *targets, int64_t m,
                                int V, double *rows_loss, int *rows_hit) {
  __shared__ double sh[kThreads / kWarp];
  __shared__ float best_v[kThreads];
  __shared__ int best_i[kThreads];
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
    T *r = logits + row * V;
    /* argmax: each thread scans its columns in increasing order (keeping
     * the first of equal maxima), then a tree over threads prefers the
     * larger value, and the lower index on ties */
    float bv = -INFINITY;
    int bi = V; /* none yet */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = to_float(r[j]);
      if (bi == V || v > bv) {
        bv = v;
        bi = j;
      }
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
      s += exp((double)to_float(r[j]) - mx);
    s = block_sum(s, sh);
    const int t = targets[row];
    if (threadIdx.x == 0) {
      rows_loss[row] = log(s) - ((double)to_float(r[t]) - mx);
      rows_hit[row] = arg == t;
    }
    __syncthreads(); /* r[t] is read above before anyone overwrites it */
    const float inv = (float)(1.0 / s);
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      r[j] = from_float<T>(expf(to_float(r[j]) - mx) * inv);
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
 * scale (then round). */
template <typename T>
__global__ void xent_bwd_kernel(T *probs, const int32_t *targets, int64_t m,
                                int V, float scale) {
  GRID_STRIDE(i, m * V) {
    int64_t row = i / V;
    int j = (int)(i % V);
    float v = to_float(probs[i]);
    if (j == targets[row])
      v -= 1.0f;
    probs[i] = from_float<T>(v * scale);
  }
}

size_t xent_bytes(int64_t m) {
  return align_up(sizeof(double) * (size_t)m) +
         align_up(sizeof(int) * (size_t)m);
}

/* ---- the layers ----------------------------------------------------------
 *
 * Templates on T, the entries of the three tables (void * as layers.h
 * types them: T arrays of the table's precision). */

template <typename T>
void linear_fwd(const void *xv, const void *Wv, const void *bv, void *yv, int n,
                int in, int out) {
  const T *x = (const T *)xv, *W = (const T *)Wv, *b = (const T *)bv;
  T *y = (T *)yv;
  if (!usable() || n <= 0 || out <= 0)
    return;
  if (in > 0 && lt_linear(x, W, b, y, n, in, out))
    return;
  if (b != NULL) { /* y = b, then y += x W^T (beta 1), as layers.c */
    fill_rows_kernel<T>
        <<<grid_for((int64_t)n * out), kThreads, 0, st.stream>>>(y, b, n, out);
    launched("fill_rows_kernel");
  }
  /* Row-major y[n,out] = x[n,in] W[out,in]^T. Column-major: y^T (out x n,
   * ld out) = W (out x in: the column-major view of W is W^T, in x out
   * with ld in, so OP_T) times x^T (in x n, ld in: OP_N). */
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, 1.0f, W, in, x, in,
       b != NULL ? 1.0f : 0.0f, y, out, "linear forward");
}

template <typename T>
void linear_bwd(const void *xv, const void *Wv, const void *dyv, void *dxv,
                float dx_beta, void *dWv, void *dbv, int n, int in, int out) {
  const T *x = (const T *)xv, *W = (const T *)Wv, *dy = (const T *)dyv;
  T *dx = (T *)dxv, *dW = (T *)dWv, *db = (T *)dbv;
  if (!usable() || n <= 0)
    return;
  /* Row-major dW[out,in] += dy^T[out,n] x[n,in]. Column-major: dW^T (in x
   * out, ld in) += x^T (in x n, ld in: OP_N) times dy (n x out: the view
   * of dy is dy^T, out x n with ld out, so OP_T). */
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, 1.0f, x, in, dy, out, 1.0f, dW, in,
       "linear weight gradient");
  if (db != NULL)
    colsum<1, T>(ColOfMatrix<T>{dy, out}, n, out, db, NULL,
                 "colsum (bias gradient)");
  if (dx != NULL) {
    /* Row-major dx[n,in] = dy[n,out] W[out,in] (+ dx_beta dx).
     * Column-major: dx^T (in x n, ld in) = W^T (in x out: the view of W,
     * ld in, OP_N) times dy^T (out x n: the view of dy, ld out, OP_N). */
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, 1.0f, W, in, dy, out, dx_beta,
         dx, in, "linear input gradient");
  }
}

template <typename T>
void layernorm_fwd(const void *x, const void *g, const void *b, float eps,
                   void *y, float *mean, float *rstd, int n, int h) {
  if (!usable() || n <= 0)
    return;
  layernorm_fwd_kernel<T, false><<<grid_rows(n), kThreads, 0, st.stream>>>(
      (const T *)x, NULL, (const T *)g, (const T *)b, eps, NULL, (T *)y, mean,
      rstd, n, h);
  launched("layernorm_fwd_kernel");
}

template <typename T>
void add_elems(const void *a, const void *b, void *y, int64_t n);
template <typename T> void copy_elems(const void *src, void *dst, int64_t n);

/* The residual add and the LayerNorm in one kernel (two with
 * bert_cuda_set_plain(1)): the same bits either way. */
template <typename T>
void add_layernorm_fwd(const void *a, const void *res, const void *g,
                       const void *b, float eps, void *sum, void *y,
                       float *mean, float *rstd, int n, int h) {
  if (!usable() || n <= 0)
    return;
  if (st.plain) {
    add_elems<T>(a, res, sum, (int64_t)n * h);
    layernorm_fwd<T>(sum, g, b, eps, y, mean, rstd, n, h);
    return;
  }
  layernorm_fwd_kernel<T, true><<<grid_rows(n), kThreads, 0, st.stream>>>(
      (const T *)a, (const T *)res, (const T *)g, (const T *)b, eps, (T *)sum,
      (T *)y, mean, rstd, n, h);
  launched("layernorm_fwd_kernel (residual add)");
}

/* layernorm_bwd, writing dx into dx2 too where given. */
template <typename T>
void layernorm_bwd_into(const void *xv, const float *mean, const float *rstd,
                        const void *g, const void *dyv, void *dx, void *dx2,
                        void *dg, void *db, int n, int h) {
  const T *x = (const T *)xv, *dy = (const T *)dyv;
  if (!usable() || n <= 0)
    return;
  /* dg and db first: dx may alias dy */
  colsum<2, T>(LayerNormParams<T>{x, dy, mean, rstd, h}, n, h, (T *)dg, (T *)db,
               "colsum (LayerNorm gradients)");
  layernorm_bwd_kernel<T><<<grid_rows(n), kThreads, 0, st.stream>>>(
      x, mean, rstd, (const T *)g, dy, (T *)dx, (T *)dx2, n, h);
  launched("layernorm_bwd_kernel");
}

template <typename T>
void layernorm_bwd(const void *x, const float *mean, const float *rstd,
                   const void *g, const void *dy, void *dx, void *dg, void *db,
                   int n, int h) {
  layernorm_bwd_into<T>(x, mean, rstd, g, dy, dx, NULL, dg, db, n, h);
}

/* LayerNorm's backward and the copy of its dx in one kernel (two with
 * bert_cuda_set_plain(1)). */
template <typename T>
void layernorm_bwd2(const void *x, const float *mean, const float *rstd,
                    const void *g, const void *dy, void *dx, void *dx2,
                    void *dg, void *db, int n, int h) {
  if (st.plain) {
    layernorm_bwd<T>(x, mean, rstd, g, dy, dx, dg, db, n, h);
    copy_elems<T>(dx, dx2, (int64_t)n * h);
    return;
  }
  layernorm_bwd_into<T>(x, mean, rstd, g, dy, dx, dx2, dg, db, n, h);
}

template <typename T> void gelu_fwd(const void *x, void *y, int64_t n) {
  if (!usable() || n <= 0)
    return;
  gelu_fwd_kernel<T>
      <<<grid_for(n), kThreads, 0, st.stream>>>((const T *)x, (T *)y, n);
  launched("gelu_fwd_kernel");
}

template <typename T>
void gelu_bwd(const void *x, const void *dy, void *dx, int64_t n) {
  if (!usable() || n <= 0)
    return;
  gelu_bwd_kernel<T><<<grid_for(n), kThreads, 0, st.stream>>>(
      (const T *)x, (const T *)dy, (T *)dx, n);
  launched("gelu_bwd_kernel");
}

/* The four head-major buffers (each room for nh floats: T or float32
 * data) and the float32 scores or their gradient, in the workspace. */
struct AttnScratch {
  void *q, *k, *v, *c;
  float *dp;
  void *ds;          /* dS of a 16-bit T */
  const void **ptrs; /* kPtrSets arrays of B*A pointers (head_ptrs) */
};

bool attn_scratch(int B, int S, int A, int dh, AttnScratch *s) {
  char *w = (char *)workspace(attention_bytes(B, S, A, dh));
  if (w == NULL)
    return false;
  size_t nh = align_up(sizeof(float) * (size_t)B * S * A * dh);
  s->q = w;
  s->k = w + nh;
  s->v = w + 2 * nh;
  s->c = w + 3 * nh;
  s->dp = (float *)(w + 4 * nh);
  s->ds = w + 4 * nh + align_up(sizeof(float) * (size_t)B * A * S * S);
  s->ptrs = (const void **)((char *)s->ds +
                            align_up(sizeof(uint16_t) * (size_t)B * A * S * S));
  return true;
}

/* The n sets' pointer arrays in w.ptrs (array j at w.ptrs + j B A). */
void head_ptrs(const PtrSet *sets, int n, int B, int A, const AttnScratch &w) {
  PtrSets all;
  memset(&all, 0, sizeof all);
  memcpy(all.set, sets, (size_t)n * sizeof *sets);
  head_ptrs_kernel<<<grid_for((int64_t)B * A * n), kThreads, 0, st.stream>>>(
      all, n, B * A, A, w.ptrs);
  launched("head_ptrs_kernel");
}

/* A head of a [B*S, A*dh] buffer of E-byte elements; the (sequence, head)
 * S x S matrices of a [B, A, S, S] one. */
PtrSet heads_of(const void *p, int S, int A, int dh, size_t E) {
  return PtrSet{(const char *)p, (long long)S * A * dh * (long long)E,
                (long long)dh * (long long)E};
}
PtrSet squares_of(const void *p, int S, int A, size_t E) {
  return PtrSet{(const char *)p, (long long)A * S * S * (long long)E,
                (long long)S * S * (long long)E};
}

template <typename From, typename To>
void split_heads(const From *src, To *dst, int B, int S, int A, int dh) {
  split_heads_kernel<From, To>
      <<<grid_for((int64_t)B * S * A * dh), kThreads, 0, st.stream>>>(
          src, dst, B, S, A, dh);
  launched("split_heads_kernel");
}

template <typename From, typename To>
void merge_heads(const From *src, To *dst, int B, int S, int A, int dh) {
  merge_heads_kernel<From, To>
      <<<grid_for((int64_t)B * S * A * dh), kThreads, 0, st.stream>>>(
          src, dst, B, S, A, dh);
  launched("merge_heads_kernel");
}

/* The softmax kernels' launch: a warp per row of the B*A*S rows. */
dim3 softmax_grid(int64_t rows) {
  return dim3(grid_rows((rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

/* Calls f(std::integral_constant<int, N>()) with softmax_rows.h's values
 * per lane for rows of S keys, and returns 1; 0 (f not called) past S
 * 1024, where the loop kernels take the rows. */
template <typename F> bool with_lanes(int S, F f) {
  switch (fa::softmax_lanes(S)) {
  case 4:
    return f(std::integral_constant<int, 4>()), true;
  case 8:
    return f(std::integral_constant<int, 8>()), true;
  case 16:
    return f(std::integral_constant<int, 16>()), true;
  case 32:
    return f(std::integral_constant<int, 32>()), true;
  }
  return false;
}

/* The forward softmax of the rows of sc into p (float32: p is sc), keys
 * at >= lengths[b] masked: a row in registers up to S 1024
 * (softmax_rows.h), the loop kernel beyond. */
template <typename T>
void softmax_fwd(float *sc, T *p, const int32_t *lengths, int64_t rows, int S,
                 int A) {
  if (rows == 0) /* no grid of 0 blocks */
    return;
  const dim3 g((unsigned)((rows + fa::kRows - 1) / fa::kRows));
  if (!with_lanes(S, [&](auto n) {
        fa::softmax_fwd_rows<T, decltype(n)::value>
            <<<g, fa::kThreads, 0, st.stream>>>(sc, p, lengths, rows, S, A);
      }))
    softmax_fwd_kernel<T>
        <<<softmax_grid(rows), dim3(kWarp, kRowsPerBlock), 0, st.stream>>>(
            sc, p, lengths, rows, S, A);
  launched("softmax_fwd_kernel");
}

/* dS = P * (dP - rowsum(P * dP)) into ds (float32: ds is dp), as
 * softmax_fwd chooses its kernel. */
template <typename T>
void softmax_bwd(const T *p, float *dp, T *ds, int64_t rows, int S) {
  if (rows == 0)
    return;
  const dim3 g((unsigned)((rows + fa::kRows - 1) / fa::kRows));
  if (!with_lanes(S, [&](auto n) {
        fa::softmax_bwd_rows<T, decltype(n)::value>
            <<<g, fa::kThreads, 0, st.stream>>>(p, dp, ds, rows, S);
      }))
    softmax_bwd_kernel<T>
        <<<softmax_grid(rows), dim3(kWarp, kRowsPerBlock), 0, st.stream>>>(
            p, dp, ds, rows, S);
  launched("softmax_bwd_kernel");
}

/* ---- flash attention (16-bit T, heads of 64) -----------------------------
 *
 * With bert_cuda_set_flash(1), a 16-bit T, dh 64 and sequences long
 * enough (flash_fits), the attention never writes the B*A*S*S scores:
 * flash_mma.h's kernels (FlashAttention-2's algorithm, register-resident
 * on mma.sync tensor-core products) take 64 queries (forward, dQ) or 64
 * keys (dK and dV) of one (sequence, head) per block, walk the other
 * side in tiles of 64, and keep the running softmax (max and sum per
 * row) as they go. Numerics (layers.h's, as near as the algorithm
 * allows): the scores in float32 (scale times the product, masked keys
 * BERT_MASK_VALUE, or 0 where all are: fa_mask_value); the exponentials
 * (the hardware's base-2 ones, the scale folded into their argument)
 * relative to the running maximum rounded to T for the P V product;
 * ctx = round(O / sum). Backward recomputes P = exp(score - LSE) from the
 * log-sum-exp per row that forward saved, rounds it to T, and takes
 * rowsum(P dP) as rowsum(dctx ctx) (equal in exact arithmetic), dS =
 * round(P (dP - that)), dQ = round(scale dS K), dK = round(scale dS^T Q),
 * dV = round(P^T dctx). Two backward kernels, one over queries (dQ) and
 * one over keys (dK, dV), each recomputing P: no atomics, so the results
 * are the same bits run to run. The same kernel source runs on the CPU
 * in t/unit/flash_simt.cc (t/unit/simt.h), the host twin that checks it
 * without a GPU.
 *
 * Forward saves in the probs buffer (B*A*S*S elements of T, unused
 * otherwise) the LSE of every row (float), the sequences' lengths and a
 * copy of ctx, which backward needs (the mask; rowsum(dctx ctx)) and
 * attention_bwd is not given. */

const int kFlashD = fa::kD; /* the head width the kernels take */

/* d[row] = sum over the row's 64 elements of dctx ctx, per (sequence,
 * head, query): rowsum(P dP). One warp per row. */
template <typename T>
__global__ void flash_rowdot_kernel(const T *dout, const T *o, float *d,
                                    int64_t rows, int S, int A) {
  const int H = A * kFlashD, lane = threadIdx.x;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; r < rows;
       r += (int64_t)gridDim.x * blockDim.y) {
    const int64_t bh = r / S, s = r % S;
    const int64_t off = (bh / A * S + s) * H + bh % A * kFlashD;
    float x = to_float(dout[off + lane]) * to_float(o[off + lane]) +
              to_float(dout[off + lane + 32]) * to_float(o[off + lane + 32]);
    x = warp_sum(x);
    if (lane == 0)
      d[r] = x;
  }
}

/* What forward keeps inside probs for backward: the LSE of every row,
 * the lengths, then the copy of ctx. */
template <typename T> struct FlashKept {
  float *lse;
  int32_t *lens;
  T *ctx;
};
template <typename T>
FlashKept<T> flash_kept(const void *probs, int B, int S, int A) {
  char *p = (char *)probs;
  const size_t lse = align_up(sizeof(float) * (size_t)B * A * S);
  const size_t lens = align_up(sizeof(int32_t) * (size_t)B);
  return FlashKept<T>{(float *)p, (int32_t *)(p + lse), (T *)(p + lse + lens)};
}

/* Whether the flash kernels take this attention: on, a 16-bit T, heads
 * of 64, and the probs buffer holds what forward keeps (flash_kept) with
 * room to spare for any B and A: S*S elements of T per (sequence, head)
 * against S LSEs, S*dh elements, a length and 512 bytes of alignment
 * (S >= 70 in bf16). The same answer in forward and backward for the
 * same shape. */
template <typename T> bool flash_fits(int S, int dh) {
  if (!st.flash || !st.flash_ok || is_f32<T>() || dh != kFlashD)
    return false;
  const size_t E = sizeof(T), s = (size_t)S;
  return s * s * E >= s * (sizeof(float) + E * (size_t)dh) + 4 + 512;
}

/* The flash grids put the B*A (sequence, head) pairs on y, at most
 * 65535 (B 4096 at 16 heads would not launch): beyond, the default
 * attention, forward and backward alike. */
bool flash_grid_fits(int B, int A) { return (int64_t)B * A <= 65535; }

/* Every pointer 16-byte aligned (the kernels' loads); a failure if not. */
bool flash_aligned(const void *const *ps, int n) {
  for (int i = 0; i < n; i++)
    if ((uintptr_t)ps[i] % 16 != 0) {
      fail("flash attention: operand %d at %p is not 16-byte aligned", i,
           ps[i]);
      return false;
    }
  return true;
}

/* Lets each kernel of T have its dynamic shared memory (above the
 * default 48 KiB); false where the device refuses (no flash then). */
template <typename T> bool flash_prepare_t(void) {
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  return cudaFuncSetAttribute(fa::fa_fwd_kernel<T>, a, (int)fa::fa_smem(0)) ==
             cudaSuccess &&
         cudaFuncSetAttribute(fa::fa_dq_kernel<T>, a, (int)fa::fa_smem(1)) ==
             cudaSuccess &&
         cudaFuncSetAttribute(fa::fa_dkdv_kernel<T>, a, (int)fa::fa_smem(2)) ==
             cudaSuccess;
}

/* At open (not inside a graph's capture): st.flash_ok. */
void flash_prepare(void) {
  st.flash_ok = flash_prepare_t<bf16>() && flash_prepare_t<fp16>();
  (void)cudaGetLastError(); /* a refusal is not the layers' failure */
}

template <typename T>
void flash_fwd(const T *q, const T *k, const T *v, const int32_t *lengths,
               void *probs, T *ctx, int B, int S, int A) {
  const void *ps[5] = {q, k, v, probs, ctx};
  if (!flash_aligned(ps, 5))
    return;
  const FlashKept<T> kept = flash_kept<T>(probs, B, S, A);
  const size_t bytes = fa::fa_smem(0);
  const dim3 grid((S + fa::kTile - 1) / fa::kTile, B * A);
  fa::fa_fwd_kernel<T><<<grid, fa::kThreads, bytes, st.stream>>>(
      q, k, v, lengths, ctx, kept.lse, kept.lens, kept.ctx, S, A,
      1.0f / sqrtf((float)kFlashD));
  launched("fa_fwd_kernel");
}

template <typename T>
void flash_bwd(const T *q, const T *k, const T *v, const void *probs,
               const T *dctx, T *dq, T *dk, T *dv, const AttnScratch &w, int B,
               int S, int A) {
  const void *ps[8] = {q, k, v, probs, dctx, dq, dk, dv};
  if (!flash_aligned(ps, 8))
    return;
  const FlashKept<T> kept = flash_kept<T>(probs, B, S, A);
  const float scale = 1.0f / sqrtf((float)kFlashD);
  const int64_t rows = (int64_t)B * A * S;
  flash_rowdot_kernel<T>
      <<<softmax_grid(rows), dim3(kWarp, kRowsPerBlock), 0, st.stream>>>(
          dctx, kept.ctx, w.dp, rows, S, A);
  launched("flash_rowdot_kernel");
  const dim3 grid((S + fa::kTile - 1) / fa::kTile, B * A);
  const size_t b1 = fa::fa_smem(1), b2 = fa::fa_smem(2);
  fa::fa_dq_kernel<T><<<grid, fa::kThreads, b1, st.stream>>>(
      q, k, v, dctx, kept.lens, kept.lse, w.dp, dq, S, A, scale);
  launched("fa_dq_kernel");
  fa::fa_dkdv_kernel<T><<<grid, fa::kThreads, b2, st.stream>>>(
      q, k, v, dctx, kept.lens, kept.lse, w.dp, dk, dv, S, A, scale);
  launched("fa_dkdv_kernel");
}

/* float32 never takes them (flash_fits): no tensor-core instantiation. */
template <>
void flash_fwd<float>(const float *, const float *, const float *,
                      const int32_t *, void *, float *, int, int, int) {}
template <>
void flash_bwd<float>(const float *, const float *, const float *, const void *,
                      const float *, float *, float *, float *,
                      const AttnScratch &, int, int, int) {}

/* attention_fwd of a 16-bit T with the heads where they are: the same
 * products on the same values as the head-major path below (whose copies
 * are exact), each head read from q, k, v and written into ctx with
 * leading dimension A*dh. Pointer arrays: Q, K, V, ctx, scores, probs. */
template <typename T>
void attention_fwd_direct(const T *q, const T *k, const T *v,
                          const int32_t *lengths, T *probs, T *ctx,
                          const AttnScratch &w, int B, int S, int A, int dh) {
  const int count = B * A, H = A * dh;
  const size_t E = sizeof(T);
  const float scale = 1.0f / sqrtf((float)dh);
  const PtrSet sets[6] = {
      heads_of(q, S, A, dh, E),  heads_of(k, S, A, dh, E),
      heads_of(v, S, A, dh, E),  heads_of(ctx, S, A, dh, E),
      squares_of(w.dp, S, A, 4), squares_of(probs, S, A, E)};
  const void *const *P = w.ptrs;
  void *const *out = (void *const *)w.ptrs;
  head_ptrs(sets, 6, B, A, w);
  /* Column-major: P^T (S x S, ld S) = K_i (the view of K_i is K_i^T, dh x
   * S with ld H: OP_T) times Q_i^T (OP_N, ld H), as attention_fwd. */
  gemm_ptrs<T, float>(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, scale, P + count, H,
                      P, H, out + 4 * count, S, count, "Q K^T");
  if (!usable())
    return;
  softmax_fwd<T>(w.dp, probs, lengths, (int64_t)count * S, S, A);
  /* C^T (dh x S, ld H: into ctx) = V_i^T (OP_N, ld H) times P_i^T (OP_N,
   * ld S). */
  gemm_ptrs<T, T>(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, 1.0f, P + 2 * count, H,
                  P + 5 * count, S, out + 3 * count, H, count, "P V");
}

template <typename T>
void attention_fwd(const void *q, const void *k, const void *v,
                   const int32_t *lengths, void *probsv, void *ctx, int B,
                   int S, int A, int dh) {
  T *probs = (T *)probsv;
  AttnScratch w;
  if (!usable() || B <= 0 || !attn_scratch(B, S, A, dh, &w))
    return;
  if (flash_fits<T>(S, dh) && flash_grid_fits(B, A)) {
    flash_fwd((const T *)q, (const T *)k, (const T *)v, lengths, probsv,
              (T *)ctx, B, S, A);
    return;
  }
  if (fused<T>()) {
    attention_fwd_direct((const T *)q, (const T *)k, (const T *)v, lengths,
                         probs, (T *)ctx, w, B, S, A, dh);
    return;
  }
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  const float scale = 1.0f / sqrtf((float)dh);
  T *hq = (T *)w.q, *hk = (T *)w.k, *hv = (T *)w.v, *hc = (T *)w.c;
  split_heads((const T *)q, hq, B, S, A, dh);
  split_heads((const T *)k, hk, B, S, A, dh);
  split_heads((const T *)v, hv, B, S, A, dh);
  /* The scores, in float32: probs itself for float32 (the softmax runs in
   * place), the workspace for T. Row-major P_i[S,S] = scale Q_i[S,dh]
   * K_i[S,dh]^T. Column-major: P^T (S x S, ld S) = K_i (the view of K_i
   * is K_i^T, dh x S, ld dh: OP_T) times Q_i^T (the view of Q_i: OP_N). */
  float *scores = is_f32<T>() ? (float *)probsv : w.dp;
  gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, scale, hk, dh, sh, hq, dh, sh,
             scores, S, ss, count, "Q K^T");
  if (!usable())
    return;
  softmax_fwd<T>(scores, probs, lengths, (int64_t)count * S, S, A);
  /* Row-major C_i[S,dh] = P_i[S,S] V_i[S,dh]. Column-major: C^T (dh x S,
   * ld dh) = V_i^T (the view of V_i, OP_N) times P_i^T (the view of P_i,
   * OP_N). */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, 1.0f, hv, dh, sh,
             (const T *)probs, S, ss, hc, dh, sh, count, "P V");
  merge_heads(hc, (T *)ctx, B, S, A, dh);
}

/* attention_bwd's second half: dS = P * (dP - rowsum(P * dP)) from dP in
 * w.dp (masked keys have P = 0, so they get no gradient), then dQ =
 * scale dS K and dK = scale dS^T Q. float32: dS in place in w.dp,
 * cuBLAS's float32 products. */
void attention_bwd_qk(const float *q, const float *k, const float *probs,
                      void *dq, void *dk, const AttnScratch &w, int B, int S,
                      int A, int dh) {
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  const float scale = 1.0f / sqrtf((float)dh);
  softmax_bwd<float>(probs, w.dp, w.dp, (int64_t)count * S, S);
  float *fq = (float *)w.q, *fk = (float *)w.k, *fc = (float *)w.c;
  split_heads(q, fq, B, S, A, dh);
  split_heads(k, fk, B, S, A, dh);
  /* Row-major dQ_i[S,dh] = scale dS_i[S,S] K_i[S,dh]: as P V. Into fc
   * (dC_i is no longer needed). */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, scale, fk, dh, sh, w.dp, S, ss,
             fc, dh, sh, count, "dS K");
  merge_heads(fc, (float *)dq, B, S, A, dh);
  /* Row-major dK_i[S,dh] = scale dS_i^T Q_i: as P^T dC. Into fk. */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, scale, fq, dh, sh, w.dp, S, ss,
             fk, dh, sh, count, "dS^T Q");
  merge_heads(fk, (float *)dk, B, S, A, dh);
}

/* The same for a 16-bit T: dS rounded once to T (w.ds), as autocast
 * does, so that both products run on tensor cores; Q and K head-major in
 * T; each product rounded once to T (the merges copy exactly). */
template <typename T>
void attention_bwd_qk(const T *q, const T *k, const T *probs, void *dq,
                      void *dk, const AttnScratch &w, int B, int S, int A,
                      int dh) {
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  const float scale = 1.0f / sqrtf((float)dh);
  T *ds = (T *)w.ds, *hq = (T *)w.q, *hk = (T *)w.k, *hc = (T *)w.c;
  softmax_bwd<T>(probs, w.dp, ds, (int64_t)count * S, S);
  split_heads(q, hq, B, S, A, dh);
  split_heads(k, hk, B, S, A, dh);
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, scale, hk, dh, sh,
             (const T *)ds, S, ss, hc, dh, sh, count, "dS K");
  merge_heads(hc, (T *)dq, B, S, A, dh);
  /* into hk: K_i was read by the product above (the stream orders them) */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, scale, hq, dh, sh,
             (const T *)ds, S, ss, hk, dh, sh, count, "dS^T Q");
  merge_heads(hk, (T *)dk, B, S, A, dh);
}

/* attention_bwd of a 16-bit T with the heads where they are (as
 * attention_fwd_direct; dq, dk, dv alias no input). Pointer arrays: dC,
 * V, dP, P, dV, dS, Q, K, dQ, dK. */
template <typename T>
void attention_bwd_direct(const T *q, const T *k, const T *v, const T *probs,
                          const T *dctx, T *dq, T *dk, T *dv,
                          const AttnScratch &w, int B, int S, int A, int dh) {
  const int count = B * A, H = A * dh;
  const size_t E = sizeof(T);
  const float scale = 1.0f / sqrtf((float)dh);
  const PtrSet sets[10] = {
      heads_of(dctx, S, A, dh, E), heads_of(v, S, A, dh, E),
      squares_of(w.dp, S, A, 4),   squares_of(probs, S, A, E),
      heads_of(dv, S, A, dh, E),   squares_of(w.ds, S, A, E),
      heads_of(q, S, A, dh, E),    heads_of(k, S, A, dh, E),
      heads_of(dq, S, A, dh, E),   heads_of(dk, S, A, dh, E)};
  const void *const *P = w.ptrs;
  void *const *out = (void *const *)w.ptrs;
  head_ptrs(sets, 10, B, A, w);
  /* dP_i = dC_i V_i^T in float32: as Q K^T. */
  gemm_ptrs<T, float>(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, 1.0f, P + count, H, P,
                      H, out + 2 * count, S, count, "dC V^T");
  /* dV^T (dh x S, ld H: into dv) = dC_i^T (OP_N, ld H) times P_i (the
   * view of P_i is P_i^T: OP_T, ld S). */
  gemm_ptrs<T, T>(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, 1.0f, P, H, P + 3 * count,
                  S, out + 4 * count, H, count, "P^T dC");
  if (!usable())
    return;
  softmax_bwd<T>(probs, w.dp, (T *)w.ds, (int64_t)count * S, S);
  /* dQ_i = scale dS_i K_i: dQ^T (dh x S, ld H) = K_i^T (OP_N, ld H) times
   * dS_i^T (OP_N, ld S). */
  gemm_ptrs<T, T>(CUBLAS_OP_N, CUBLAS_OP_N, dh, S, S, scale, P + 7 * count, H,
                  P + 5 * count, S, out + 8 * count, H, count, "dS K");
  /* dK_i = scale dS_i^T Q_i: dK^T = Q_i^T (OP_N, ld H) times dS_i (OP_T). */
  gemm_ptrs<T, T>(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, scale, P + 6 * count, H,
                  P + 5 * count, S, out + 9 * count, H, count, "dS^T Q");
}

template <typename T>
void attention_bwd(const void *q, const void *k, const void *v,
                   const void *probsv, const void *dctx, void *dq, void *dk,
                   void *dv, float *scratch, int B, int S, int A, int dh) {
  (void)scratch; /* the batched products need B*A*S*S: the workspace's */
  const T *probs = (const T *)probsv;
  AttnScratch w;
  if (!usable() || B <= 0 || !attn_scratch(B, S, A, dh, &w))
    return;
  if (flash_fits<T>(S, dh) && flash_grid_fits(B, A)) {
    flash_bwd((const T *)q, (const T *)k, (const T *)v, probsv, (const T *)dctx,
              (T *)dq, (T *)dk, (T *)dv, w, B, S, A);
    return;
  }
  if (fused<T>()) {
    attention_bwd_direct((const T *)q, (const T *)k, (const T *)v, probs,
                         (const T *)dctx, (T *)dq, (T *)dk, (T *)dv, w, B, S, A,
                         dh);
    return;
  }
  const int count = B * A;
  const long long sh = (long long)S * dh, ss = (long long)S * S;
  T *hc = (T *)w.c, *hv = (T *)w.v;
  split_heads((const T *)dctx, hc, B, S, A, dh);
  split_heads((const T *)v, hv, B, S, A, dh);
  /* Row-major dP_i[S,S] = dC_i[S,dh] V_i^T, in float32: as Q K^T above. */
  gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, S, S, dh, 1.0f, hv, dh, sh, hc, dh, sh,
             w.dp, S, ss, count, "dC V^T");
  /* Row-major dV_i[S,dh] = P_i^T[S,S] dC_i[S,dh]. Column-major: dV^T (dh x
   * S) = dC_i^T (the view of dC_i, OP_N) times P_i (the view of P_i is
   * P_i^T: OP_T). Written to hv: V_i is no longer needed. */
  gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, dh, S, S, 1.0f, hc, dh, sh, probs, S, ss,
             hv, dh, sh, count, "P^T dC");
  merge_heads(hv, (T *)dv, B, S, A, dh);
  if (!usable())
    return;
  attention_bwd_qk((const T *)q, (const T *)k, probs, dq, dk, w, B, S, A, dh);
}

template <typename T>
void embedding_fwd(const int32_t *ids, const int32_t *types, const void *word,
                   const void *pos, const void *type, void *out, int B, int S,
                   int H) {
  if (!usable() || B <= 0)
    return;
  embedding_fwd_kernel<T>
      <<<grid_for((int64_t)B * S * H), kThreads, 0, st.stream>>>(
          ids, types, (const T *)word, (const T *)pos, (const T *)type,
          (T *)out, B, S, H);
  launched("embedding_fwd_kernel");
}

/* The token-type table has type_vocab_size rows (2 in BERT); colsum takes
 * its Q as a template argument, so a few sizes are instantiated. */
template <int Q, typename T>
void type_grad(const T *dout, const int32_t *types, T *dtype, int64_t N,
               int H) {
  colsum<Q, T>(TypeRows<Q, T>{dout, types, H}, N, H, dtype, dtype + H,
               "colsum (token-type gradient)");
}

template <typename T>
void type_grads(const T *dout, const int32_t *types, T *dtype, int64_t N,
                int H) {
  /* types NULL: every token is type 0, whatever the table's size */
  int Q = types == NULL ? 1 : st.types > 0 ? st.types : 2;
  switch (Q) {
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
    fail("embedding_bwd: %d token types; the CUDA layers take 1 to 4", Q);
  }
}

/* dword[ids[t]] += dout[t]: atomicAdd for float32, chains for T. */
void word_grad(const int32_t *ids, const float *dout, float *dword, int64_t N,
               int H) {
  embedding_bwd_word_kernel<<<grid_for(N * H), kThreads, 0, st.stream>>>(
      ids, dout, dword, N, H);
  launched("embedding_bwd_word_kernel");
}

template <typename T>
void word_grad(const int32_t *ids, const T *dout, T *dword, int64_t N, int H) {
  rows_add(dout, ids, N, H, dword);
}

template <typename T>
void embedding_bwd(const int32_t *ids, const int32_t *types, const void *doutv,
                   void *dword, void *dpos, void *dtype, int B, int S, int H) {
  const T *dout = (const T *)doutv;
  if (!usable() || B <= 0)
    return;
  const int64_t N = (int64_t)B * S;
  if (dword != NULL)
    word_grad(ids, dout, (T *)dword, N, H);
  if (dpos != NULL) {
    embedding_bwd_pos_kernel<T>
        <<<grid_for((int64_t)S * H), kThreads, 0, st.stream>>>(dout, (T *)dpos,
                                                               B, S, H);
    launched("embedding_bwd_pos_kernel");
  }
  if (dtype != NULL)
    type_grads(dout, types, (T *)dtype, N, H);
}

template <typename T>
double xent_fwd(void *logits, const int32_t *targets, int m, int V,
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
  xent_fwd_kernel<T><<<grid_rows(m), kThreads, 0, st.stream>>>(
      (T *)logits, targets, m, V, rows_loss, rows_hit);
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

template <typename T>
void xent_bwd(void *probs, const int32_t *targets, int m, int V, float scale) {
  if (!usable() || m <= 0)
    return;
  xent_bwd_kernel<T><<<grid_for((int64_t)m * V), kThreads, 0, st.stream>>>(
      (T *)probs, targets, m, V, scale);
  launched("xent_bwd_kernel");
}

template <typename T>
void add_elems(const void *a, const void *b, void *y, int64_t n) {
  if (!usable() || n <= 0)
    return;
  add_kernel<T><<<grid_for(n), kThreads, 0, st.stream>>>(
      (const T *)a, (const T *)b, (T *)y, n);
  launched("add_kernel");
}

template <typename T> void copy_elems(const void *src, void *dst, int64_t n) {
  if (!usable() || n <= 0)
    return;
  cuda_ok(cudaMemcpyAsync(dst, src, sizeof(T) * (size_t)n,
                          cudaMemcpyDeviceToDevice, st.stream),
          "cudaMemcpyAsync (copy)");
}

template <typename T> void zero_elems(void *x, int64_t n) {
  if (!usable() || n <= 0)
    return;
  cuda_ok(cudaMemsetAsync(x, 0, sizeof(T) * (size_t)n, st.stream),
          "cudaMemsetAsync (zero)");
}

template <typename T>
void gather_rows(const void *src, const int32_t *rows, int m, int h,
                 void *dst) {
  if (!usable() || m <= 0)
    return;
  gather_rows_kernel<T><<<grid_for((int64_t)m * h), kThreads, 0, st.stream>>>(
      (const T *)src, rows, m, h, (T *)dst);
  launched("gather_rows_kernel");
}

/* dst[rows[i]] += src[i]: atomicAdd for float32, chains for T. */
void scatter_rows(const float *src, const int32_t *rows, int m, int h,
                  float *dst) {
  scatter_add_rows_kernel<<<grid_for((int64_t)m * h), kThreads, 0, st.stream>>>(
      src, rows, m, h, dst);
  launched("scatter_add_rows_kernel");
}

template <typename T>
void scatter_rows(const T *src, const int32_t *rows, int m, int h, T *dst) {
  rows_add(src, rows, m, h, dst);
}

template <typename T>
void scatter_add_rows(const void *src, const int32_t *rows, int m, int h,
                      void *dst) {
  if (!usable() || m <= 0)
    return;
  scatter_rows((const T *)src, rows, m, h, (T *)dst);
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
  if (types < 1 || types > 4) {
    fail("reserve: %d token types; the CUDA layers take 1 to 4", types);
    return;
  }
  if (st.types != 0 && st.types != types) {
    fail("reserve: %d token types, %d before (one table size per process)",
         types, st.types);
    return;
  }
  st.types = types;
  const int64_t N = (int64_t)B * S;
  size_t need = attention_bytes(B, S, A, dh);
  size_t cols = colsum_bytes(N, width, types > 2 ? types : 2);
  size_t xent = xent_bytes(N), links = links_bytes(N);
  if (cols > need)
    need = cols;
  if (xent > need)
    need = xent;
  if (links > need)
    need = links;
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

/* ---- CUDA graphs -----------------------------------------------------------
 */

Graph *graph_find(const void *owner, const int key[4]) {
  for (int i = 0; i < st.ngraphs; i++)
    if (st.graph[i].owner == owner &&
        memcmp(st.graph[i].key, key, sizeof st.graph[i].key) == 0)
      return &st.graph[i];
  return NULL;
}

/* Destroys graph i; the last one takes its place. */
void graph_drop(int i) {
  cudaGraphExecDestroy(st.graph[i].exec);
  st.graph[i] = st.graph[--st.ngraphs];
}

void graphs_drop_all(void) {
  while (st.ngraphs > 0)
    graph_drop(st.ngraphs - 1);
}

/* *setting = on, for a setting the captured graphs baked in (the math
 * mode, the kernels' path): they are dropped when it changes. */
void set_captured(int *setting, int on) {
  if (*setting != (on != 0))
    graphs_drop_all();
  *setting = on != 0;
}

/* The stream the layers queue on, for them and for cuBLAS (whose
 * workspace cublasSetStream resets). */
bool use_stream(cudaStream_t s) {
  st.stream = s;
  return blas_ok(cublasSetStream(st.blas, s), "cublasSetStream") &&
         blas_ok(cublasSetWorkspace(st.blas, st.blas_ws, kBlasWorkspace),
                 "cublasSetWorkspace");
}

/* fn(ctx) captured into a new graph, on a stream of its own that is
 * non-blocking: while a blocking stream captures, no thread of the
 * process may use the legacy default stream (hvd's optimizer and sync BN
 * do), so the layers' blocking stream only replays. Thread-local mode:
 * other threads go on using CUDA. The capture runs nothing; the caller
 * launches the graph. NULL with *eager 1 when the capture itself failed
 * (then graphs are turned off, graphs_off says why, and the caller runs
 * fn eagerly: an error of fn's own recurs there and is kept); NULL with
 * *eager 0 after an earlier failure. */
cudaGraphExec_t graph_capture(void (*fn)(void *), void *ctx, int *eager) {
  const cudaStream_t run = st.stream;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  *eager = 0;
  if (!use_stream(st.cap))
    return NULL;
  if (cuda_ok(cudaStreamBeginCapture(st.cap, cudaStreamCaptureModeThreadLocal),
              "cudaStreamBeginCapture")) {
    fn(ctx);
    /* ended whatever happened inside: the stream leaves capture mode */
    cudaError_t e = cudaStreamEndCapture(st.cap, &graph);
    if (e == cudaSuccess && !st.failed)
      cuda_ok(cudaGraphInstantiateWithFlags(&exec, graph, 0),
              "cudaGraphInstantiateWithFlags");
    else if (e != cudaSuccess && !st.failed)
      fail("cudaStreamEndCapture: %s", cudaGetErrorString(e));
  }
  if (graph != NULL)
    cudaGraphDestroy(graph);
  if (st.failed) { /* the capture's failure: eagerly from now on */
    snprintf(st.graphs_off, sizeof st.graphs_off, "%s", st.err);
    st.failed = 0;
    st.err[0] = '\0';
    (void)cudaGetLastError();
    st.graphs = 0;
    *eager = 1;
    exec = NULL;
  }
  use_stream(run);
  return exec;
}

int graph_run(const void *owner, const int key[4], void (*fn)(void *),
              void *ctx) {
  if (!st.graphs || st.refs == 0)
    return 0;
  if (!usable())
    return 1; /* failed: nothing more runs, error() says why */
  Graph *g = graph_find(owner, key);
  if (g != NULL && g->gen != st.ws_gen) { /* the workspace moved */
    graph_drop((int)(g - st.graph));
    g = NULL;
  }
  if (g == NULL) {
    if (st.ngraphs == kMaxGraphs)
      return 0;
    int eager;
    cudaGraphExec_t exec = graph_capture(fn, ctx, &eager);
    if (exec == NULL)
      return eager ? 0 : 1;
    g = &st.graph[st.ngraphs++];
    g->owner = owner;
    memcpy(g->key, key, sizeof g->key);
    g->gen = st.ws_gen;
    g->exec = exec;
  }
  cuda_ok(cudaGraphLaunch(g->exec, st.stream), "cudaGraphLaunch");
  return 1;
}

void graph_forget(const void *owner) {
  for (int i = st.ngraphs - 1; i >= 0; i--)
    if (st.graph[i].owner == owner)
      graph_drop(i);
}

/* The table of precision T; the memory, synchronisation and error entries
 * are the same in all three. */
template <typename T> constexpr bert_backend_t make_table(int precision) {
  return bert_backend_t{
      /* .name = */ "gpu",
      /* .precision = */ precision,
      /* .alloc = */ dev_alloc,
      /* .free = */ dev_free,
      /* .host_alloc = */ pinned_alloc,
      /* .host_free = */ pinned_free,
      /* .to_device = */ to_device,
      /* .to_host = */ to_host,
      /* .reserve = */ reserve_ws,
      /* .sync = */ stream_sync,
      /* .sync_all = */ sync_all,
      /* .fence_record = */ fence_record,
      /* .fence_wait = */ fence_wait,
      /* .error = */ first_error,
      /* .graph_run = */ graph_run,
      /* .graph_forget = */ graph_forget,
      /* .linear_fwd = */ linear_fwd<T>,
      /* .linear_bwd = */ linear_bwd<T>,
      /* .layernorm_fwd = */ layernorm_fwd<T>,
      /* .layernorm_bwd = */ layernorm_bwd<T>,
      /* .gelu_fwd = */ gelu_fwd<T>,
      /* .gelu_bwd = */ gelu_bwd<T>,
      /* .attention_fwd = */ attention_fwd<T>,
      /* .attention_bwd = */ attention_bwd<T>,
      /* .embedding_fwd = */ embedding_fwd<T>,
      /* .embedding_bwd = */ embedding_bwd<T>,
      /* .xent_fwd = */ xent_fwd<T>,
      /* .xent_bwd = */ xent_bwd<T>,
      /* .add = */ add_elems<T>,
      /* .copy = */ copy_elems<T>,
      /* .zero = */ zero_elems<T>,
      /* .gather_rows = */ gather_rows<T>,
      /* .scatter_add_rows = */ scatter_add_rows<T>,
      /* .add_layernorm_fwd = */ add_layernorm_fwd<T>,
      /* .layernorm_bwd2 = */ layernorm_bwd2<T>,
  };
}

/* Indexed by bert_precision_t. */
const bert_backend_t backends[3] = {make_table<float>(BERT_FP32),
                                    make_table<bf16>(BERT_BF16),
                                    make_table<fp16>(BERT_FP16)};

/* TF32 or not for the float32 products; and for the 16-bit ones no
 * split-k reduction in T (cuBLAS would otherwise add a product's partial
 * sums in bf16/fp16, rounding more than once: layers.h's rule is one
 * rounding, and PyTorch's allow_bf16_reduced_precision_reduction is the
 * same switch the other way). */
void apply_math_mode(void) {
  const int mode =
      (st.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  blas_ok(cublasSetMathMode(st.blas, (cublasMath_t)mode), "cublasSetMathMode");
}

/* Everything open() made, in reverse; each handle NULL once gone. */
void teardown(void) {
  if (st.stream != NULL)
    cudaStreamSynchronize(st.stream);
  graphs_drop_all();
  if (st.ws != NULL)
    cudaFree(st.ws);
  if (st.xres_dev != NULL)
    cudaFree(st.xres_dev);
  if (st.xres_host != NULL)
    cudaFreeHost(st.xres_host);
  for (int i = 0; i < 2; i++)
    if (st.fence[i] != NULL)
      cudaEventDestroy(st.fence[i]);
  for (int i = 0; i < st.nplans; i++)
    lt_plan_free(&st.plan[i]);
  if (st.lt != NULL)
    cublasLtDestroy(st.lt);
  if (st.blas != NULL)
    cublasDestroy(st.blas);
  if (st.blas_ws != NULL) /* after the handle that used it */
    cudaFree(st.blas_ws);
  if (st.cap != NULL)
    cudaStreamDestroy(st.cap);
  if (st.stream != NULL)
    cudaStreamDestroy(st.stream);
  int tf32 = st.tf32, graphs = st.graphs, plain = st.plain, flash = st.flash;
  char off[sizeof st.graphs_off];
  memcpy(off, st.graphs_off, sizeof off);
  memset(&st, 0, sizeof st);
  st.tf32 = tf32;
  st.graphs = graphs;
  st.plain = plain;
  st.flash = flash;
  memcpy(st.graphs_off, off, sizeof off);
}

} /* namespace */

namespace {

/* bert_cuda_open with the module open: the same device, made current on
 * the calling thread. */
int open_again(int device, char *msg, size_t len) {
  if (device >= 0 && device != st.device) {
    snprintf(msg, len,
             "the CUDA layers are open on device %d, not %d (one GPU per "
             "process)",
             st.device, device);
    return -1;
  }
  cudaError_t e = cudaSetDevice(st.device);
  if (e != cudaSuccess) {
    snprintf(msg, len, "cudaSetDevice: %s", cudaGetErrorString(e));
    return -1;
  }
  st.refs++;
  return st.device;
}

/* The streams, cuBLAS with its workspace, the fences and the
 * cross-entropy's result; false after a failure (recorded). The layers'
 * stream is blocking (not cudaStreamNonBlocking): it also waits for the
 * legacy default stream, where code that is not ours may work, and hvd
 * orders its collectives after that one (hvd.h, "Device ordering"). */
bool make_handles(int device) {
  return cuda_ok(cudaSetDevice(device), "cudaSetDevice") &&
         cuda_ok(cudaStreamCreate(&st.stream), "cudaStreamCreate") &&
         cuda_ok(cudaStreamCreateWithFlags(&st.cap, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags (the graphs' capture)") &&
         blas_ok(cublasCreate(&st.blas), "cublasCreate") &&
         blas_ok(cublasLtCreate(&st.lt), "cublasLtCreate") &&
         cuda_ok(cudaMalloc(&st.blas_ws, kBlasWorkspace),
                 "cudaMalloc (cuBLAS workspace)") &&
         use_stream(st.stream) &&
         cuda_ok(cudaEventCreateWithFlags(&st.fence[0], cudaEventDisableTiming),
                 "cudaEventCreateWithFlags") &&
         cuda_ok(cudaEventCreateWithFlags(&st.fence[1], cudaEventDisableTiming),
                 "cudaEventCreateWithFlags") &&
         cuda_ok(cudaMalloc((void **)&st.xres_dev, sizeof(XentResult)),
                 "cudaMalloc") &&
         cuda_ok(cudaMallocHost((void **)&st.xres_host, sizeof(XentResult)),
                 "cudaMallocHost");
}

} /* namespace */

extern "C" int bert_cuda_open(int device, char *msg, size_t len) {
  char dummy[8];
  if (msg == NULL || len == 0)
    msg = dummy, len = sizeof dummy;
  msg[0] = '\0';
  if (st.refs > 0)
    return open_again(device, msg, len);
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
  if (make_handles(device)) {
    apply_math_mode();
    flash_prepare();
  }
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
  if (st.refs == 0 || precision < BERT_FP32 || precision > BERT_FP16)
    return NULL;
  return &backends[precision];
}

extern "C" void bert_cuda_set_tf32(int on) {
  set_captured(&st.tf32, on);
  if (st.refs > 0)
    apply_math_mode();
}

extern "C" void bert_cuda_set_graphs(int on) {
  if (st.graphs && !on)
    graphs_drop_all();
  st.graphs = on != 0;
  if (on)
    st.graphs_off[0] = '\0';
}

extern "C" void bert_cuda_set_plain(int on) { set_captured(&st.plain, on); }

extern "C" void bert_cuda_set_flash(int on) { set_captured(&st.flash, on); }

extern "C" int bert_cuda_flash_fits(int precision, int S, int A, int dh) {
  (void)A;
  if (st.refs == 0)
    return 0;
  switch (precision) {
  case BERT_BF16:
    return flash_fits<bf16>(S, dh);
  case BERT_FP16:
    return flash_fits<fp16>(S, dh);
  default:
    return 0;
  }
}

extern "C" const char *bert_cuda_graphs_off(void) {
  return st.graphs_off[0] != '\0' ? st.graphs_off : NULL;
}
