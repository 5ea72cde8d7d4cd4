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
 */
#ifndef BERT_LAYERS_H
#define BERT_LAYERS_H

#include <stdint.h>

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

#endif /* BERT_LAYERS_H */
