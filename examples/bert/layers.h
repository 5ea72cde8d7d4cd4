/*
 * layers.h - the compute kernels of the BERT example: everything model.c
 * does to numbers goes through these functions, so a GPU build can swap
 * this one file (cuBLAS for the matrix products, CUDA kernels for the
 * rest) without touching the model's bookkeeping.
 *
 * Conventions: float32, row-major, contiguous. n counts rows (tokens).
 * A Linear weight is [out, in] as in PyTorch. Parameter gradients (dW,
 * db, dg, ...) ACCUMULATE (+=); activation gradients (dx, dq, ...) are
 * overwritten unless the function says otherwise. Every pointer is to the
 * same memory space (host here). The functions are thread-compatible:
 * distinct buffers may be used from distinct threads.
 *
 * Two implementations of this contract exist, chosen at run time through
 * a bert_backend_t table (end of this file): the CPU one (layers.c, the
 * bert_* functions below) and the CUDA one (layers_cuda.cu, device
 * pointers, one stream, cuBLAS), compiled in builds with CUDA only.
 */
#ifndef BERT_LAYERS_H
#define BERT_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The value added to the attention score of a padded key before the
 * softmax (finite, so that a row of only padding stays finite). */
#define BERT_MASK_VALUE (-1e9f)

/* y[n,out] = x[n,in] W[out,in]^T + b[out]; b may be NULL. */
void bert_linear_fwd(const float *x, const float *W, const float *b, float *y,
                     int n, int in, int out);
/* dW += dy^T x; db += column sums of dy (db may be NULL);
 * dx = dx_beta * dx + dy W when dx is not NULL (dx_beta 0 or 1). */
void bert_linear_bwd(const float *x, const float *W, const float *dy, float *dx,
                     float dx_beta, float *dW, float *db, int n, int in,
                     int out);

/* Per row of x[n,h]: y = (x - mean) * rstd * g + b with the biased
 * variance and rstd = 1 / sqrt(var + eps). mean and rstd ([n]) are kept
 * for the backward pass. y may not alias x. */
void bert_layernorm_fwd(const float *x, const float *g, const float *b,
                        float eps, float *y, float *mean, float *rstd, int n,
                        int h);
/* dx (overwritten; may alias dy), dg += , db += . */
void bert_layernorm_bwd(const float *x, const float *mean, const float *rstd,
                        const float *g, const float *dy, float *dx, float *dg,
                        float *db, int n, int h);

/* GELU, erf form: y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). y may
 * alias x. */
void bert_gelu_fwd(const float *x, float *y, int64_t n);
/* dx = dy * (Phi(x) + x phi(x)); dx may alias dy. */
void bert_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n);

/* Multi-head scaled dot-product attention of q, k, v ([B*S, A*dh], head
 * h in columns h*dh..h*dh+dh-1). lengths[b] (NULL: all S) is the number
 * of real tokens of row b; the keys at positions >= lengths[b] get
 * BERT_MASK_VALUE, so padding never reaches a real token. probs
 * ([B, A, S, S], kept for backward) and ctx ([B*S, A*dh]) are written. */
void bert_attention_fwd(const float *q, const float *k, const float *v,
                        const int32_t *lengths, float *probs, float *ctx, int B,
                        int S, int A, int dh);
/* dq, dk, dv (overwritten) from dctx; scratch holds S*S floats. */
void bert_attention_bwd(const float *q, const float *k, const float *v,
                        const float *probs, const float *dctx, float *dq,
                        float *dk, float *dv, float *scratch, int B, int S,
                        int A, int dh);
/* The same with round_ds(dS, S*S, arg) applied to each (sequence, head)'s
 * dS before the dq and dk products (NULL: none): the mixed-precision
 * model's rounding of dS (layers_lp.c). */
void bert__attention_bwd_rounding(
    const float *q, const float *k, const float *v, const float *probs,
    const float *dctx, float *dq, float *dk, float *dv, float *scratch, int B,
    int S, int A, int dh, void (*round_ds)(float *ds, int64_t n, int arg),
    int arg);

/* out[b*S+s] = word[ids] + pos[s] + type[types] (types NULL: type 0). */
void bert_embedding_fwd(const int32_t *ids, const int32_t *types,
                        const float *word, const float *pos, const float *type,
                        float *out, int B, int S, int H);
/* Scatter-adds dout into the three tables' gradients (each may be NULL). */
void bert_embedding_bwd(const int32_t *ids, const int32_t *types,
                        const float *dout, float *dword, float *dpos,
                        float *dtype, int B, int S, int H);

/* Softmax cross-entropy of logits[m,V] against targets[m]: returns the
 * SUM over rows of -log p(target) (in double), and in *correct (may be
 * NULL) how many rows' argmax is the target. logits is overwritten by
 * the probabilities. */
double bert_xent_fwd(float *logits, const int32_t *targets, int m, int V,
                     int64_t *correct);
/* In place: probs becomes scale * (probs - onehot(target)), the gradient
 * of scale * (sum of the rows' losses). */
void bert_xent_bwd(float *probs, const int32_t *targets, int m, int V,
                   float scale);

/* y = a + b (n elements; y may alias a or b). */
void bert_add(const float *a, const float *b, float *y, int64_t n);
/* dst = src (n elements). */
void bert_copy(const float *src, float *dst, int64_t n);
/* x = 0 (n elements). */
void bert_zero(float *x, int64_t n);
/* dst[i] = src[rows[i]] for i < m (rows of width h). */
void bert_gather_rows(const float *src, const int32_t *rows, int m, int h,
                      float *dst);
/* dst[rows[i]] += src[i] for i < m. */
void bert_scatter_add_rows(const float *src, const int32_t *rows, int m, int h,
                           float *dst);

/* Threads of the BLAS (process-wide). Returns 0, or -1 when the BLAS has
 * no such call (then set OPENBLAS_NUM_THREADS or OMP_NUM_THREADS in the
 * environment before the program starts). */
int bert_blas_set_threads(int n);

/* ---- Precisions -----------------------------------------------------------
 *
 * A backend works in one storage precision T: float32 (the bert_*
 * functions above), bfloat16 or float16. Every pointer of its kernel
 * entries that the float32 contract types `float *` is a T array, except
 * the LayerNorm statistics (mean, rstd) and attention_bwd's scratch,
 * which stay float32. With T = bfloat16 or float16 (mixed precision):
 * - every element is computed in float32 (or the double the float32
 *   kernel uses) from the T inputs, converted exactly, and each output
 *   element is rounded to T once, to nearest even;
 * - matrix products accumulate in float32; the bias is added before
 *   the rounding (y = round(x W^T + b));
 * - what ACCUMULATES (parameter gradients; dx with dx_beta 1; the
 *   scatter-add's dst) becomes round(old + the call's whole contribution
 *   summed in float32): one rounding per element and call;
 * - attention: the scores and the softmax in float32, probs stored in T,
 *   ctx = round(probs v) from the stored probs; backward from them too:
 *   dP = dctx v^T and dS = P (dP - rowsum(P dP)) in float32, dS rounded
 *   to T (as autocast does, for tensor-core products), dv = round(P^T
 *   dctx), dq = round(scale dS k), dk = round(scale dS^T q);
 * - xent_fwd reads T logits, computes in float32 and double (loss,
 *   argmax: the float32 kernel's on the converted logits) and writes the
 *   probabilities back rounded to T; xent_bwd writes round(scale (p -
 *   onehot)).
 * Results then differ from the float32 ones by T's rounding (2^-8
 * relative for bfloat16, 2^-11 for float16, per rounding), and between
 * two backends of one precision by the order of float32 sums. */
typedef enum bert_precision {
  BERT_FP32 = 0,
  BERT_BF16 = 1,
  BERT_FP16 = 2
} bert_precision_t;

/* "fp32", "bf16" or "fp16" (NULL for another value). */
const char *bert_precision_name(int precision);
/* The precision of such a name, or -1. */
int bert_precision_parse(const char *name);
/* Bytes per element: 4, 2, 2. */
size_t bert_precision_bytes(int precision);
/* Host conversions of n elements: T -> float32 (exact) and float32 -> T
 * (round to nearest even; float16 overflows to +-inf, keeps subnormals;
 * NaN stays NaN). For BERT_FP32 both are copies. bert_from_float may
 * write over its own src (dst == src: in place). */
void bert_to_float(int precision, const void *src, float *dst, int64_t n);
void bert_from_float(int precision, const float *src, void *dst, int64_t n);

/* ---- Backends ------------------------------------------------------------
 *
 * The kernels above and the memory they work on, as one table, so that
 * model.c runs unchanged on the host or on a GPU, in any precision. Every
 * kernel entry has the contract (and, with void * for the T arrays, the
 * signature) of the bert_* function of the same name; its pointers are
 * to the backend's memory. The CUDA backend
 * queues everything on one stream that it owns and returns before the
 * work is done, except where an entry says otherwise (xent_fwd, to_host,
 * sync, fence_wait); it does no allocation after reserve() other than
 * what the caller asks for with alloc. Its failures (a CUDA or cuBLAS
 * call, a launch) are recorded, the first one naming the call, and make
 * every later call return at once: error() says what happened. */
typedef struct bert_backend {
  const char *name; /* "cpu" or "gpu" */
  int precision;    /* bert_precision_t: the T of the kernels */

  /* Memory of the backend (64-byte aligned on the host); NULL when out
   * of memory. free accepts NULL. */
  void *(*alloc)(size_t bytes);
  void (*free)(void *p);
  /* Host memory for the copies below (page-locked on the GPU). */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  /* Host -> backend: src may be reused when it returns, except memory of
   * host_alloc on the GPU (page-locked: the copy is queued, so src may be
   * rewritten only after a sync or sync_all). Backend -> host: returns
   * when dst holds the data (after all work queued before it). */
  void (*to_device)(void *dst, const void *src, size_t bytes);
  void (*to_host)(void *dst, const void *src, size_t bytes);
  /* Sizes the scratch memory of the kernels for batches of up to B x S
   * tokens, A heads of dh, rows up to `width` elements wide and `types`
   * token types, so that no later call allocates. */
  void (*reserve)(int B, int S, int A, int dh, int width, int types);
  /* Waits until the backend's own queued work is done. */
  void (*sync)(void);
  /* Waits until all work on the device is done, whoever queued it (hvd's
   * optimizer on its own stream, say). */
  void (*sync_all)(void);
  /* Two fences (slot 0 and 1): record marks the work queued so far;
   * wait returns when that work is done. */
  void (*fence_record)(int slot);
  void (*fence_wait)(int slot);
  /* The first failure since the backend was opened, or NULL. */
  const char *(*error)(void);
  /* CUDA graphs. graph_run returns 0 at once where graphs are off (a
   * GPU unless bert_cuda_set_graphs(1), the CPU unless
   * bert_cpu_set_graphs(1)): the caller runs the work itself. The CPU's
   * "graphs" run fn(ctx) at once and return 1, so that a caller's graph
   * path runs (and is tested) without a GPU. Else it runs fn(ctx) as a graph,
   * captured on the stream at the first call with this owner and key and
   * replayed at later ones, and returns 1. fn may only queue this backend's
   * kernels and products (no allocation, synchronisation, copy to or from the
   * host, nor anything that touches another stream or the legacy default
   * stream, such as a call into hvd), and the owner and key must fix every
   * shape, pointer and flag it uses; the data it reads may change between
   * replays. A graph made before the backend's scratch memory grew is
   * captured again. graph_forget drops the owner's graphs (before the
   * memory they use is freed). */
  int (*graph_run)(const void *owner, const int key[4], void (*fn)(void *),
                   void *ctx);
  void (*graph_forget)(const void *owner);

  void (*linear_fwd)(const void *x, const void *W, const void *b, void *y,
                     int n, int in, int out);
  void (*linear_bwd)(const void *x, const void *W, const void *dy, void *dx,
                     float dx_beta, void *dW, void *db, int n, int in, int out);
  void (*layernorm_fwd)(const void *x, const void *g, const void *b, float eps,
                        void *y, float *mean, float *rstd, int n, int h);
  void (*layernorm_bwd)(const void *x, const float *mean, const float *rstd,
                        const void *g, const void *dy, void *dx, void *dg,
                        void *db, int n, int h);
  void (*gelu_fwd)(const void *x, void *y, int64_t n);
  void (*gelu_bwd)(const void *x, const void *dy, void *dx, int64_t n);
  void (*attention_fwd)(const void *q, const void *k, const void *v,
                        const int32_t *lengths, void *probs, void *ctx, int B,
                        int S, int A, int dh);
  /* scratch: S*S floats of the backend's memory (the CUDA backend and
   * the CPU's low precisions use their own and ignore it) */
  void (*attention_bwd)(const void *q, const void *k, const void *v,
                        const void *probs, const void *dctx, void *dq, void *dk,
                        void *dv, float *scratch, int B, int S, int A, int dh);
  void (*embedding_fwd)(const int32_t *ids, const int32_t *types,
                        const void *word, const void *pos, const void *type,
                        void *out, int B, int S, int H);
  void (*embedding_bwd)(const int32_t *ids, const int32_t *types,
                        const void *dout, void *dword, void *dpos, void *dtype,
                        int B, int S, int H);
  /* Waits for its result (one copy back to the host per call). */
  double (*xent_fwd)(void *logits, const int32_t *targets, int m, int V,
                     int64_t *correct);
  void (*xent_bwd)(void *probs, const int32_t *targets, int m, int V,
                   float scale);
  void (*add)(const void *a, const void *b, void *y, int64_t n);
  void (*copy)(const void *src, void *dst, int64_t n);
  void (*zero)(void *x, int64_t n);
  void (*gather_rows)(const void *src, const int32_t *rows, int m, int h,
                      void *dst);
  void (*scatter_add_rows)(const void *src, const int32_t *rows, int m, int h,
                           void *dst);

  /* Fused pairs, NULL where a backend does not fuse them (the CPU's):
   * the caller then makes the two calls (bert_add_layernorm_fwd and
   * bert_layernorm_bwd2 below do either). The same results bit for bit.
   *  - add_layernorm_fwd: add(a, res, sum, n h) then layernorm_fwd(sum,
   *    ...) (the residual add before a LayerNorm); sum may be a;
   *  - layernorm_bwd2: layernorm_bwd, then copy(dx, dx2, n h) (the
   *    residual's share of the gradient); dx2 aliases nothing. */
  void (*add_layernorm_fwd)(const void *a, const void *res, const void *g,
                            const void *b, float eps, void *sum, void *y,
                            float *mean, float *rstd, int n, int h);
  void (*layernorm_bwd2)(const void *x, const float *mean, const float *rstd,
                         const void *g, const void *dy, void *dx, void *dx2,
                         void *dg, void *db, int n, int h);
} bert_backend_t;

/* k's add_layernorm_fwd, or its add and layernorm_fwd. */
void bert_add_layernorm_fwd(const bert_backend_t *k, const void *a,
                            const void *res, const void *g, const void *b,
                            float eps, void *sum, void *y, float *mean,
                            float *rstd, int n, int h);
/* k's layernorm_bwd2, or its layernorm_bwd and copy. */
void bert_layernorm_bwd2(const bert_backend_t *k, const void *x,
                         const float *mean, const float *rstd, const void *g,
                         const void *dy, void *dx, void *dx2, void *dg,
                         void *db, int n, int h);

/* The host: the bert_* functions above; never fails. */
extern const bert_backend_t bert_backend_cpu;
/* 1: the CPU backends' graph_run runs the work at once and returns 1 (a
 * caller's graph path without a GPU); 0, the default: it declines.
 * Process-wide. */
void bert_cpu_set_graphs(int on);
/* The host in a precision: bert_backend_cpu for BERT_FP32; for bfloat16
 * and float16 a numerical model of the GPU's mixed precision (each entry
 * converts its T inputs to float32, runs the float32 function and rounds
 * its outputs as the rules above say: not built for speed, for tests and
 * for checking a GPU run on the CPU); NULL for another value. */
const bert_backend_t *bert_cpu_backend(int precision);

/* The CUDA backend (layers_cuda.cu), process-wide and reference-counted:
 * bert_cuda_open makes `device` (a CUDA ordinal, or -1 for the calling
 * thread's current device) current on the calling thread, creates the
 * stream, the cuBLAS handle and the fences on the first call, and
 * returns the device; every successful open needs one bert_cuda_close
 * (the last destroys everything). On failure it returns -1 and writes
 * why into msg: "this build has no CUDA (...)" in a build without CUDA,
 * "no CUDA device: cudaGetDeviceCount: ..." without a GPU or driver.
 * The kernels must be called from a thread whose current device is that
 * device. Not thread-safe. */
int bert_cuda_open(int device, char *msg, size_t len);
void bert_cuda_close(void);
/* The table of a precision (valid between open and the last close; NULL
 * without CUDA or for another precision). The three share the stream,
 * the cuBLAS handle, the fences and the scratch. */
const bert_backend_t *bert_cuda_backend(int precision);
/* cuBLAS may use TF32 tensor cores for the float32 products (on: faster,
 * about 1e-3 relative; off, the default: plain float32, the CPU's results
 * to float rounding). Applies to the open handle and later opens. */
void bert_cuda_set_tf32(int on);
/* 1: graph_run captures and replays CUDA graphs (model.c: one per
 * encoder layer and direction); 0, the default: graph_run declines and
 * every kernel is launched one by one. Process-wide; applies to later
 * calls. */
void bert_cuda_set_graphs(int on);
/* 1: the 16-bit layers take the plain path: each linear's bias written
 * first and the product added to it (cuBLAS, beta 1), the attention's
 * heads copied head-major and back. 0 (the default): the bias is added in
 * the product's epilogue (cuBLASLt; the plain path where it offers no
 * algorithm for a shape), and the attention's batched products read and
 * write the heads where they are. Both follow "Precisions" above, not
 * bit for bit (cuBLAS may pick other algorithms); float32 always takes the
 * plain path. Also, in every precision, the residual add and its
 * LayerNorm as two kernels (add_layernorm_fwd), and LayerNorm's backward
 * and the copy of its dx (layernorm_bwd2), instead of one each (the same
 * bits either way). For comparisons. */
void bert_cuda_set_plain(int on);
/* 1: the 16-bit attention of heads of 64 (dh 64) and S >= 70 runs as
 * flash attention: the scores are never written, probs keeps instead what
 * backward needs (each row's log-sum-exp, the lengths, a copy of ctx),
 * and backward recomputes the probabilities (layers_cuda.cu, "flash
 * attention"). Off by default (its first, WMMA kernels were slower than
 * the default attention on an H200; the register-resident ones of
 * flash_mma.h are not yet measured: doc/bert_train.md); set it between
 * passes, never between a forward and its backward. */
void bert_cuda_set_flash(int on);
/* Whether attention of S tokens, A heads of dh runs as flash attention
 * in `precision` (bert_precision_t) with the settings now: 0 or 1. */
int bert_cuda_flash_fits(int precision, int S, int A, int dh);
/* NULL, or why a failed capture turned graphs off (the layers then ran
 * kernel by kernel; bert_cuda_set_graphs(1) clears it). */
const char *bert_cuda_graphs_off(void);

#ifdef __cplusplus
}
#endif

#endif /* BERT_LAYERS_H */
