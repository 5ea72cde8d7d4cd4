/*
 * model.h - a BERT masked-language model in C (float32; CBLAS on the CPU,
 * or cuBLAS and CUDA kernels on a GPU: layers.h), for examples/bert_train
 * and the tests.
 *
 *   bert_config_t c;
 *   bert_config_preset(&c, "tiny");          // then override any field
 *   c.vocab_size = bert_vocab_size(vocab);
 *   bert_model_t *m;
 *   if (bert_model_create(&c, &m) != HVD_SUCCESS)
 *     fprintf(stderr, "%s\n", bert_last_error());
 *   int n;
 *   hvd_param_t *p = bert_model_params(m, &n);  // give to hvd_*_create
 *   ...
 *   bert_output_t o;
 *   bert_model_forward(m, &batch, &o);          // o.loss: masked-LM loss
 *   bert_model_backward(m, ready, opt);         // grads += d loss
 *   hvd_optimizer_step(opt);
 *
 * The architecture is BERT's (post-LN blocks: x = LN(x + Attn(x));
 * x = LN(x + FFN(x)); GELU, erf form; no dropout) with the masked-LM head
 * (dense, GELU, LayerNorm, decoder tied to the word embeddings, bias).
 * Parameter names are those of Hugging Face's BertForMaskedLM without its
 * "bert." prefix, e.g. "encoder.layer.3.attention.self.query.weight".
 *
 * Every call that can fail returns an hvd_result_t and leaves a sentence
 * in bert_last_error() (util.h). A model is not thread-safe: one thread
 * drives it. The BLAS thread count is process-wide.
 *
 * Mixed precision (config precision BERT_BF16 or BERT_FP16): the
 * parameters, their gradients and the activations are bfloat16 or
 * float16 (the params' tensors say so), the LayerNorm statistics, the
 * softmaxes and the loss are computed in float32, and every matrix
 * product accumulates in float32 (layers.h, "Precisions"). An hvd
 * optimizer over such params keeps float32 master weights (hvd.h, "Mixed
 * precision"); float16 needs its loss scaling. On the CPU this is a
 * numerical model of the GPU's path (not built for speed). The initial
 * weights are the float32 model's, rounded; bert_model_get / set convert
 * to and from float32.
 *
 * On a GPU (bert_model_create_on with a CUDA device) the parameters,
 * gradients and activations live in device memory: the params' tensors
 * have .device = that device, so hvd reduces, broadcasts and checkpoints
 * them there. The batch is copied to the device once per forward pass;
 * forward waits for its loss (one copy back); backward returns with every
 * gradient complete. Values and gradients are read and written from the
 * host with bert_model_get / bert_model_set.
 */
#ifndef BERT_MODEL_H
#define BERT_MODEL_H

#include "hvd.h"
#include "layers.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

typedef struct bert_config {
  int vocab_size;      /* V: rows of the word embeddings and MLM classes */
  int max_position;    /* rows of the position table (>= seq_len) */
  int type_vocab_size; /* token types (segments), 2 */
  int layers;          /* L: encoder blocks */
  int hidden;          /* H, a multiple of heads */
  int heads;           /* A: attention heads */
  int ffn;             /* F: the intermediate size */
  int seq_len;         /* S: the longest sequence a batch may hold */
  int batch;           /* B: the most sequences a batch may hold */
  float ln_eps;        /* LayerNorm epsilon, 1e-12 */
  float init_std;      /* weights ~ normal(0, init_std), 0.02 */
  uint64_t seed;       /* of the initial weights */
  int threads;         /* BLAS threads set by bert_model_create (default
                          1); 0 leaves the BLAS as configured. */
  int precision;       /* bert_precision_t (layers.h): BERT_FP32 (the
                          presets), BERT_BF16 or BERT_FP16: the dtype of
                          the parameters, their gradients and the
                          activations (mixed precision, below) */
} bert_config_t;

/* Fills c with a preset: "tiny" (L2 H64 A2 F256, V512, S32), "mini" (L4
 * H256 A4 F1024, V8192, S128) or "base" (L12 H768 A12 F3072, V30522,
 * S128); all with B8, 512 positions (128 for tiny), 2 types, eps 1e-12,
 * std 0.02, seed 42, 1 thread, float32. HVD_ERR_INVALID_ARG for another
 * name. */
hvd_result_t bert_config_preset(bert_config_t *c, const char *name);

/* Sets one field from text, key = the field's name ("hidden", "ffn",
 * "vocab_size", ...; "precision" takes fp32, bf16 or fp16).
 * HVD_ERR_INVALID_ARG for an unknown key or a value that does not parse;
 * the whole config is checked at create. */
hvd_result_t bert_config_set(bert_config_t *c, const char *key,
                             const char *value);

/* HVD_SUCCESS if the dimensions are usable, else HVD_ERR_INVALID_ARG
 * with the reason. */
hvd_result_t bert_config_check(const bert_config_t *c);

/* "L=2 H=64 A=2 F=256 V=512 P=128 S=32 B=8" into buf (always
 * terminated), then " bf16" or " fp16" for those precisions. */
void bert_config_describe(const bert_config_t *c, char *buf, size_t len);

typedef struct bert_model bert_model_t;

/* Allocates the parameters (initialised from c->seed, see
 * bert_model_init), their gradients (zero) and the activations for
 * c->batch x c->seq_len tokens; sets the BLAS threads (c->threads). The
 * config is copied. Free with bert_model_destroy. */
hvd_result_t bert_model_create(const bert_config_t *c, bert_model_t **out);
/* The same on a device: HVD_CPU (bert_model_create), or a CUDA ordinal
 * (-1 is HVD_CPU; to mean "the current GPU", pass bert_gpu_check's
 * answer). HVD_ERR_UNSUPPORTED in a build without CUDA; HVD_ERR_CUDA when
 * the GPU cannot be used (the message says why); HVD_ERR_NO_MEMORY. */
hvd_result_t bert_model_create_on(const bert_config_t *c, int device,
                                  bert_model_t **out);
void bert_model_destroy(bert_model_t *m); /* accepts NULL */

/* Which GPU a model would use: *device if >= 0, else the calling thread's
 * current CUDA device, written back to *device. HVD_ERR_UNSUPPORTED "this
 * build has no CUDA (configure found no toolkit, or --without-cuda)";
 * HVD_ERR_CUDA "no CUDA device: cudaGetDeviceCount: ..." and the like. */
hvd_result_t bert_gpu_check(int *device);

/* GPU models: cuBLAS may use TF32 tensor cores for the float32 matrix
 * products (faster; about 1e-3 relative). Off by default: plain float32,
 * equal to the CPU model to float rounding. Process-wide. */
void bert_set_tf32(int on);

/* GPU models: each encoder layer's forward and backward kernels run as
 * one CUDA graph per batch shape, captured at its first use and replayed
 * after (one launch instead of some 25 forward and 45 backward); the
 * gradient-ready calls of a layer then come after its graph, not between
 * its kernels. Off by default (16 % faster at base B 32 on an H200,
 * doc/bert_train.md). Process-wide. On
 * the CPU it makes each layer's work one call with its ready calls
 * after it, as on a GPU with graphs (the same numbers; for tests). A
 * capture that fails turns graphs off (the layers then run kernel by
 * kernel): bert_cuda_graphs_off() says why, else NULL (layers.h). */
void bert_set_cuda_graphs(int on);

/* GPU models in bf16 or fp16: 1 runs the layers' plain kernels (each
 * linear's bias written before its product, the attention's heads copied
 * head-major and back) instead of the fused ones (the bias in cuBLASLt's
 * epilogue, the heads read and written where they are). Off by default;
 * for comparisons. float32 always runs the plain kernels. Process-wide
 * (layers.h, bert_cuda_set_plain). */
void bert_set_plain_kernels(int on);

/* GPU models in bf16 or fp16 with heads of 64 and S >= 70: 1 runs the
 * attention as flash attention (layers.h, bert_cuda_set_flash): no
 * B*A*S*S scores, the probabilities recomputed in backward. Off by
 * default (slower than the default attention on an H200). Process-wide;
 * between steps. */
void bert_set_flash_attention(int on);

/* HVD_CPU or the CUDA device of the model's memory. */
int bert_model_device(const bert_model_t *m);

/* Copies all values (grads 0) or all gradients (grads 1), in parameter
 * order (bert_model_num_weights floats), to or from host memory, as
 * float32 in every precision (set rounds to the model's). */
hvd_result_t bert_model_get(bert_model_t *m, int grads, float *host);
hvd_result_t bert_model_set(bert_model_t *m, int grads, const float *host);

const bert_config_t *bert_model_config(const bert_model_t *m);

/* The parameters, in a fixed order: embeddings (word, position, type,
 * LayerNorm), layers 0..L-1 (query, key, value, attention output dense,
 * its LayerNorm, intermediate dense, output dense, its LayerNorm; each
 * weight then bias), then the head (transform dense, transform
 * LayerNorm, cls.predictions.bias). The array, names and tensors are
 * owned by the model and live until bert_model_destroy; values and grads
 * are each one contiguous float buffer in this order. The decoder has no
 * parameter of its own: it is the word embeddings (tied). */
hvd_param_t *bert_model_params(bert_model_t *m, int *n);
/* The index of the parameter with this name, or -1. */
int bert_model_param_index(const bert_model_t *m, const char *name);
/* Total number of weights (elements of all parameters). */
int64_t bert_model_num_weights(const bert_model_t *m);

/* Re-initialises every value deterministically from seed: one
 * xoshiro256** stream in parameter order; weights and embeddings
 * normal(0, init_std) (Box-Muller), biases 0, LayerNorm weights 1. */
void bert_model_init(bert_model_t *m, uint64_t seed);

/* Sets every gradient to zero (for callers without an optimizer). */
void bert_model_zero_grad(bert_model_t *m);

/* One batch. Arrays are row-major [batch, seq_len] (lengths: [batch]);
 * the model copies what it needs, so they may be reused after forward. */
typedef struct bert_batch {
  int batch;                     /* 1 .. config batch */
  int seq_len;                   /* 1 .. config seq_len */
  const int32_t *input_ids;      /* 0 .. V-1 */
  const int32_t *token_type_ids; /* 0 .. type_vocab_size-1; NULL: all 0 */
  const int32_t *lengths;        /* real tokens per row (the attention
                                    mask: keys at >= length are padding);
                                    NULL: all seq_len */
  const int32_t *labels;         /* the token to predict, or -100 */
} bert_batch_t;

typedef struct bert_output {
  double loss;     /* mean cross-entropy over the masked positions (0 if
                      there are none) */
  int64_t masked;  /* positions with a label */
  int64_t correct; /* of which the most likely token is the label */
} bert_output_t;

/* Forward pass and masked-LM loss; keeps what backward needs.
 * HVD_ERR_INVALID_ARG (nothing computed) for a batch that does not fit
 * the config or holds an id, type, length or label out of range. */
hvd_result_t bert_model_forward(bert_model_t *m, const bert_batch_t *b,
                                bert_output_t *out);

/* Called once per parameter and backward pass, as soon as that
 * parameter's gradient is final: the head first, then layers L-1 .. 0,
 * then the embeddings, the word embeddings last (their gradient has both
 * the decoder's and the input's share; first with
 * bert_model_set_sparse_embeddings). E.g. hvd_optimizer_grad_ready. */
typedef void (*bert_grad_ready_fn)(void *ctx, int param_index);

/* Backward pass of the last forward: ADDS d(loss)/d(param) into every
 * param's grad, calling ready(ctx, i) (if not NULL) for each i as it
 * completes. HVD_ERR_INVALID_ARG if no forward preceded it.
 *
 * On a GPU, ready(ctx, i) is called as soon as the kernels that write
 * gradient i are queued: hvd orders a device collective after the work
 * queued on the legacy default stream, which the model's (blocking)
 * stream is ordered with (hvd.h, "Device ordering"), so the host never
 * waits. With bert_model_set_host_fences(m, 1) the calls wait instead
 * until the stream has passed the gradient (the calls for one encoder
 * layer come while the next one's kernels are queued): what a library
 * without device ordering needs, kept for comparison. */
hvd_result_t bert_model_backward(bert_model_t *m, bert_grad_ready_fn ready,
                                 void *ctx);
/* The same with the loss multiplied by `scale`: ADDS scale *
 * d(loss)/d(param) (the factor enters once, at the loss, so weighting a
 * micro-batch costs no pass over the gradients). */
hvd_result_t bert_model_backward_scaled(bert_model_t *m, float scale,
                                        bert_grad_ready_fn ready, void *ctx);

/* 1: backward's ready calls on a GPU wait for the stream to pass each
 * stage (an event synchronised per stage); 0 (the default): at once. */
void bert_model_set_host_fences(bert_model_t *m, int on);

/* The word embeddings' sparse share: instead of adding the lookup's
 * gradient rows into the word embeddings' gradient at the end of
 * backward, the model hands them to fn(ctx, P, rows, N, values): row
 * rows[t] (token t's id) gets values[t * H ...], for the N = batch x
 * seq_len tokens in order (e.g. hvd_optimizer_sparse_grad). The word
 * embeddings' ready call then comes right after the decoder's share is
 * in, first of all, not last. fn NULL turns it off (the default). CPU
 * float32 models only: HVD_ERR_UNSUPPORTED on a GPU or in another
 * precision. */
typedef void (*bert_sparse_grad_fn)(void *ctx, int param_index,
                                    const int32_t *rows, int64_t n,
                                    const float *values);
hvd_result_t bert_model_set_sparse_embeddings(bert_model_t *m,
                                              bert_sparse_grad_fn fn,
                                              void *ctx);

/* Process-wide BLAS threads (n >= 1). HVD_ERR_UNSUPPORTED when the BLAS
 * cannot be told at run time: then set OPENBLAS_NUM_THREADS (or
 * OMP_NUM_THREADS) before the program starts. */
hvd_result_t bert_set_threads(int n);

#endif /* BERT_MODEL_H */
