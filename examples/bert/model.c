/*
 * model.c - the BERT masked-language model: parameters, activations and
 * the order of the kernels (layers.h) in the forward and backward passes.
 *
 * Shapes: N = B*S tokens, H hidden, F intermediate, V vocabulary, M the
 * masked positions of the batch (the head runs on those rows only: the
 * other rows have no loss, so their logits would be thrown away).
 *
 * Every kernel and every allocation goes through the model's backend
 * (m->be: the CPU's or the GPU's, layers.h), so this file is the same
 * for both; what is host memory on one is device memory on the other.
 * Only the batch's small integer arrays are prepared on the host, in a
 * staging block copied to the backend once per forward pass.
 */
#include <config.h>

#include "model.h"

#include "layers.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parameter indices. */
enum {
  P_WORD,
  P_POS,
  P_TYPE,
  P_EMB_LN_W,
  P_EMB_LN_B,
  P_FIRST_LAYER /* then PER_LAYER per layer, then the head */
};
enum {
  L_Q_W,
  L_Q_B,
  L_K_W,
  L_K_B,
  L_V_W,
  L_V_B,
  L_AO_W,
  L_AO_B,
  L_ALN_W,
  L_ALN_B,
  L_I_W,
  L_I_B,
  L_O_W,
  L_O_B,
  L_OLN_W,
  L_OLN_B,
  PER_LAYER
};
enum { H_T_W, H_T_B, H_TLN_W, H_TLN_B, H_DEC_B, PER_HEAD };

#define NAME_MAX_LEN 64
#define LABEL_IGNORE (-100)

/* What the forward pass keeps for the backward pass, per layer. */
/* Activations are of the model's precision (T: float32, bfloat16 or
 * float16; void * here), the LayerNorm statistics float32. */
typedef struct layer_act {
  void *q, *k, *v;            /* [N,H] */
  void *probs;                /* [B,A,S,S] */
  void *ctx;                  /* [N,H] attention output before its dense */
  void *h1_pre;               /* [N,H] x + attention */
  float *ln1_mean, *ln1_rstd; /* [N] */
  void *h1;                   /* [N,H] */
  void *inter_pre;            /* [N,F] */
  void *inter;                /* [N,F] GELU */
  void *h2_pre;               /* [N,H] h1 + FFN */
  float *ln2_mean, *ln2_rstd;
} layer_act_t;

struct bert_model {
  bert_config_t c;
  int n; /* parameters */
  hvd_param_t *params;
  char (*names)[NAME_MAX_LEN];
  void *values, *grads; /* all parameters (T), contiguous in param order */
  int64_t nweights;
  size_t elt; /* bytes of a T */

  /* activations (one allocation, `arena`) */
  char *arena;
  void *emb_pre;              /* embeddings before LayerNorm */
  float *emb_mean, *emb_rstd; /* its statistics */
  void **hs;                  /* hs[l]: input of layer l; hs[L] output */
  layer_act_t *acts;
  void *hm, *t_pre, *t_act, *t; /* head, [M,...] */
  float *t_mean, *t_rstd;
  void *g_x, *g_tmp, *g_h1, *g_ctx, *g_q, *g_k, *g_v, *g_inter;
  float *scratch;     /* S*S floats: attention_bwd */
  void *logits;       /* [M,V], grown on demand */
  int64_t logits_cap; /* rows */

  const bert_backend_t *be; /* the kernels and the memory */
  int device;               /* HVD_CPU or the CUDA device */

  /* the batch of the last forward, in the backend's memory: one block
   * (batch_dev) holding ids, types, rows, targets ([N] each) and lengths
   * ([B]), filled from its host twin (batch_host) by one copy */
  int32_t *batch_dev, *batch_host;
  int32_t *ids, *types, *lengths, *rows, *targets;
  int has_types, has_lengths;
  int B, S, M;
  int ready_for_backward;
  bert_sparse_grad_fn sparse_fn; /* bert_model_set_sparse_embeddings */
  int host_fences;               /* bert_model_set_host_fences */
  void *sparse_ctx;
};

/* ---- Config ------------------------------------------------------------ */

hvd_result_t bert_config_preset(bert_config_t *c, const char *name) {
  if (c == NULL || name == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_config_preset: NULL");
  bert_config_t d = {.vocab_size = 512,
                     .max_position = 512,
                     .type_vocab_size = 2,
                     .seq_len = 128,
                     .batch = 8,
                     .ln_eps = 1e-12f,
                     .init_std = 0.02f,
                     .seed = 42,
                     .threads = 1};
  if (strcmp(name, "tiny") == 0) {
    d.layers = 2, d.hidden = 64, d.heads = 2, d.ffn = 256;
    d.max_position = 128, d.seq_len = 32;
  } else if (strcmp(name, "mini") == 0) {
    d.layers = 4, d.hidden = 256, d.heads = 4, d.ffn = 1024;
    d.vocab_size = 8192;
  } else if (strcmp(name, "base") == 0) {
    d.layers = 12, d.hidden = 768, d.heads = 12, d.ffn = 3072;
    d.vocab_size = 30522;
  } else {
    return bert__error(HVD_ERR_INVALID_ARG,
                       "unknown model preset '%s' (tiny, mini or base)", name);
  }
  *c = d;
  return HVD_SUCCESS;
}

hvd_result_t bert_config_set(bert_config_t *c, const char *key,
                             const char *value) {
  static const struct {
    const char *key;
    size_t off;
    char kind; /* i int, f float, u uint64, p precision */
  } fields[] = {
#define F(name, kind) {#name, offsetof(bert_config_t, name), kind}
      F(vocab_size, 'i'), F(max_position, 'i'), F(type_vocab_size, 'i'),
      F(layers, 'i'),     F(hidden, 'i'),       F(heads, 'i'),
      F(ffn, 'i'),        F(seq_len, 'i'),      F(batch, 'i'),
      F(ln_eps, 'f'),     F(init_std, 'f'),     F(seed, 'u'),
      F(threads, 'i'),    F(precision, 'p'),
#undef F
  };
  if (c == NULL || key == NULL || value == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_config_set: NULL");
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    if (strcmp(key, fields[i].key) != 0)
      continue;
    char *end;
    errno = 0;
    char *p = (char *)c + fields[i].off;
    if (fields[i].kind == 'i') {
      long v = strtol(value, &end, 10);
      if (errno == 0 && end != value && *end == '\0' && v >= INT_MIN &&
          v <= INT_MAX) {
        int iv = (int)v;
        memcpy(p, &iv, sizeof iv);
        return HVD_SUCCESS;
      }
    } else if (fields[i].kind == 'f') {
      float v = strtof(value, &end);
      if (errno == 0 && end != value && *end == '\0') {
        memcpy(p, &v, sizeof v);
        return HVD_SUCCESS;
      }
    } else if (fields[i].kind == 'p') {
      int pr = bert_precision_parse(value);
      if (pr >= 0) {
        memcpy(p, &pr, sizeof pr);
        return HVD_SUCCESS;
      }
      return bert__error(HVD_ERR_INVALID_ARG,
                         "model option precision: '%s' is not fp32, bf16 or "
                         "fp16",
                         value);
    } else {
      unsigned long long v = strtoull(value, &end, 0);
      if (errno == 0 && end != value && *end == '\0' && value[0] != '-') {
        uint64_t u = v;
        memcpy(p, &u, sizeof u);
        return HVD_SUCCESS;
      }
    }
    return bert__error(HVD_ERR_INVALID_ARG, "model option %s: '%s' is not %s",
                       key, value,
                       fields[i].kind == 'f' ? "a number" : "an integer");
  }
  return bert__error(HVD_ERR_INVALID_ARG,
                     "unknown model option '%s' (vocab_size, max_position, "
                     "type_vocab_size, layers, hidden, heads, ffn, seq_len, "
                     "batch, ln_eps, init_std, seed, threads, precision)",
                     key);
}

hvd_result_t bert_config_check(const bert_config_t *c) {
  if (c == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "model config: NULL");
  const struct {
    const char *name;
    int v;
  } pos[] = {{"vocab_size", c->vocab_size},
             {"max_position", c->max_position},
             {"type_vocab_size", c->type_vocab_size},
             {"layers", c->layers},
             {"hidden", c->hidden},
             {"heads", c->heads},
             {"ffn", c->ffn},
             {"seq_len", c->seq_len},
             {"batch", c->batch}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v < 1)
      return bert__error(HVD_ERR_INVALID_ARG,
                         "model config: %s must be at least 1, not %d",
                         pos[i].name, pos[i].v);
  if (c->hidden % c->heads != 0)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "model config: hidden (%d) must be a multiple of heads "
                       "(%d)",
                       c->hidden, c->heads);
  if (c->seq_len > c->max_position)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "model config: seq_len (%d) exceeds max_position (%d)",
                       c->seq_len, c->max_position);
  if (bert_precision_name(c->precision) == NULL)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "model config: precision %d is none of BERT_FP32, "
                       "BERT_BF16, BERT_FP16",
                       c->precision);
  if (!(c->ln_eps > 0) || !(c->init_std >= 0) || c->threads < 0)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "model config: ln_eps must be > 0, init_std >= 0, "
                       "threads >= 0");
  /* every buffer is indexed with int64 products, but the BLAS takes int */
  if ((int64_t)c->batch * c->seq_len * c->ffn > INT_MAX ||
      (int64_t)c->batch * c->seq_len * c->vocab_size > INT_MAX ||
      (int64_t)c->vocab_size * c->hidden > INT_MAX)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "model config: batch x seq_len x ffn (or x vocab) is "
                       "too large");
  return HVD_SUCCESS;
}

void bert_config_describe(const bert_config_t *c, char *buf, size_t len) {
  if (buf == NULL || len == 0)
    return;
  const char *prec =
      c->precision != BERT_FP32 ? bert_precision_name(c->precision) : NULL;
  snprintf(buf, len, "L=%d H=%d A=%d F=%d V=%d P=%d S=%d B=%d%s%s", c->layers,
           c->hidden, c->heads, c->ffn, c->vocab_size, c->max_position,
           c->seq_len, c->batch, prec != NULL ? " " : "",
           prec != NULL ? prec : "");
}

hvd_result_t bert_set_threads(int n) {
  if (n < 1)
    return bert__error(HVD_ERR_INVALID_ARG, "BLAS threads must be >= 1, not %d",
                       n);
  if (bert_blas_set_threads(n) != 0)
    return bert__error(HVD_ERR_UNSUPPORTED,
                       "this BLAS cannot set its threads at run time; set "
                       "OPENBLAS_NUM_THREADS=%d before starting the program",
                       n);
  return HVD_SUCCESS;
}

/* ---- Parameters -------------------------------------------------------- */

static int layer_param(int l, int k) {
  return P_FIRST_LAYER + l * PER_LAYER + k;
}
static int head_param(const bert_config_t *c, int k) {
  return P_FIRST_LAYER + c->layers * PER_LAYER + k;
}

/* Elements of a parameter (libbert needs hvd.h's types, not libhvd). */
static int64_t numel(const hvd_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++)
    n *= t->shape[d];
  return n;
}

static void *val(bert_model_t *m, int i) { return m->params[i].value.data; }
static void *grad(bert_model_t *m, int i) { return m->params[i].grad.data; }

/* Names and shapes, in parameter order. */
static void describe_params(bert_model_t *m) {
  const bert_config_t *c = &m->c;
  const int H = c->hidden, F = c->ffn;
  int i = 0;
#define ADD(d0, d1, ...)                                                       \
  do {                                                                         \
    snprintf(m->names[i], NAME_MAX_LEN, __VA_ARGS__);                          \
    m->params[i].name = m->names[i];                                           \
    m->params[i].value.ndim = (d1) > 0 ? 2 : 1;                                \
    m->params[i].value.shape[0] = (d0);                                        \
    m->params[i].value.shape[1] = (d1);                                        \
    i++;                                                                       \
  } while (0)
  ADD(c->vocab_size, H, "embeddings.word_embeddings.weight");
  ADD(c->max_position, H, "embeddings.position_embeddings.weight");
  ADD(c->type_vocab_size, H, "embeddings.token_type_embeddings.weight");
  ADD(H, 0, "embeddings.LayerNorm.weight");
  ADD(H, 0, "embeddings.LayerNorm.bias");
  for (int l = 0; l < c->layers; l++) {
    static const char *const qkv[] = {"query", "key", "value"};
    for (int j = 0; j < 3; j++) {
      ADD(H, H, "encoder.layer.%d.attention.self.%s.weight", l, qkv[j]);
      ADD(H, 0, "encoder.layer.%d.attention.self.%s.bias", l, qkv[j]);
    }
    ADD(H, H, "encoder.layer.%d.attention.output.dense.weight", l);
    ADD(H, 0, "encoder.layer.%d.attention.output.dense.bias", l);
    ADD(H, 0, "encoder.layer.%d.attention.output.LayerNorm.weight", l);
    ADD(H, 0, "encoder.layer.%d.attention.output.LayerNorm.bias", l);
    ADD(F, H, "encoder.layer.%d.intermediate.dense.weight", l);
    ADD(F, 0, "encoder.layer.%d.intermediate.dense.bias", l);
    ADD(H, F, "encoder.layer.%d.output.dense.weight", l);
    ADD(H, 0, "encoder.layer.%d.output.dense.bias", l);
    ADD(H, 0, "encoder.layer.%d.output.LayerNorm.weight", l);
    ADD(H, 0, "encoder.layer.%d.output.LayerNorm.bias", l);
  }
  ADD(H, H, "cls.predictions.transform.dense.weight");
  ADD(H, 0, "cls.predictions.transform.dense.bias");
  ADD(H, 0, "cls.predictions.transform.LayerNorm.weight");
  ADD(H, 0, "cls.predictions.transform.LayerNorm.bias");
  ADD(c->vocab_size, 0, "cls.predictions.bias");
#undef ADD
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

void bert_model_init(bert_model_t *m, uint64_t seed) {
  if (m == NULL)
    return;
  /* drawn on the host in float32 (the same stream of numbers in every
   * precision), then rounded to T and copied; out of host memory, the
   * values stay as they were */
  float *host = m->values;
  int direct = m->device == HVD_CPU && m->c.precision == BERT_FP32;
  if (!direct && (host = malloc(sizeof(float) * (size_t)m->nweights)) == NULL)
    return;
  bert_rng_t rng;
  bert__rng_seed(&rng, &seed, 1);
  int64_t off = 0;
  for (int i = 0; i < m->n; i++) {
    float *v = host + off;
    int64_t k = numel(&m->params[i].value);
    off += k;
    const char *name = m->params[i].name;
    if (ends_with(name, "LayerNorm.weight")) {
      for (int64_t j = 0; j < k; j++)
        v[j] = 1.0f;
    } else if (ends_with(name, "bias")) {
      bert_zero(v, k);
    } else {
      for (int64_t j = 0; j < k; j++)
        v[j] = (float)(m->c.init_std * bert__rng_normal(&rng));
    }
  }
  if (!direct) {
    bert_from_float(m->c.precision, host, host, m->nweights); /* in place */
    m->be->to_device(m->values, host, m->elt * (size_t)m->nweights);
    free(host);
  }
}

void bert_model_zero_grad(bert_model_t *m) {
  if (m != NULL)
    m->be->zero(m->grads, m->nweights);
}

/* ---- Create / destroy ---------------------------------------------------- */

/* Carves the activation buffers out of base (NULL: only counts): T
 * arrays (TAKE) and float32 ones (TAKE_F), each on 64 bytes. Returns the
 * number of bytes. */
static int64_t layout(bert_model_t *m, char *base) {
  const bert_config_t *c = &m->c;
  const int64_t N = (int64_t)c->batch * c->seq_len, H = c->hidden, F = c->ffn,
                S = c->seq_len, T = (int64_t)m->elt;
  int64_t used = 0;
#define TAKE_BYTES(ptr, bytes)                                                 \
  do {                                                                         \
    if (base != NULL)                                                          \
      (ptr) = (void *)(base + used);                                           \
    used += ((int64_t)(bytes) + 63) & ~(int64_t)63;                            \
  } while (0)
#define TAKE(ptr, count) TAKE_BYTES(ptr, (int64_t)(count)*T)
#define TAKE_F(ptr, count) TAKE_BYTES(ptr, (int64_t)(count)*4)
  TAKE(m->emb_pre, N * H);
  TAKE_F(m->emb_mean, N);
  TAKE_F(m->emb_rstd, N);
  for (int l = 0; l <= c->layers; l++)
    TAKE(m->hs[l], N * H);
  for (int l = 0; l < c->layers; l++) {
    layer_act_t *a = &m->acts[l];
    TAKE(a->q, N * H);
    TAKE(a->k, N * H);
    TAKE(a->v, N * H);
    TAKE(a->probs, (int64_t)c->batch * c->heads * S * S);
    TAKE(a->ctx, N * H);
    TAKE(a->h1_pre, N * H);
    TAKE_F(a->ln1_mean, N);
    TAKE_F(a->ln1_rstd, N);
    TAKE(a->h1, N * H);
    TAKE(a->inter_pre, N * F);
    TAKE(a->inter, N * F);
    TAKE(a->h2_pre, N * H);
    TAKE_F(a->ln2_mean, N);
    TAKE_F(a->ln2_rstd, N);
  }
  TAKE(m->hm, N * H);
  TAKE(m->t_pre, N * H);
  TAKE(m->t_act, N * H);
  TAKE_F(m->t_mean, N);
  TAKE_F(m->t_rstd, N);
  TAKE(m->t, N * H);
  TAKE(m->g_x, N * H);
  TAKE(m->g_tmp, N * H);
  TAKE(m->g_h1, N * H);
  TAKE(m->g_ctx, N * H);
  TAKE(m->g_q, N * H);
  TAKE(m->g_k, N * H);
  TAKE(m->g_v, N * H);
  TAKE(m->g_inter, N * F);
  TAKE_F(m->scratch, S * S);
#undef TAKE
#undef TAKE_F
#undef TAKE_BYTES
  return used;
}

/* n elements of T in the backend's memory. */
static void *alloc_elts(const bert_model_t *m, int64_t n) {
  return m->be->alloc((size_t)n * m->elt);
}
/* The failure a backend recorded (a GPU's: HVD_ERR_CUDA; the CPU's mixed
 * precision runs out of memory), else success. */
static hvd_result_t backend_status(const bert_model_t *m, const char *what) {
  const char *e = m->be->error();
  if (e == NULL)
    return HVD_SUCCESS;
  if (m->device == HVD_CPU)
    return bert__error(HVD_ERR_NO_MEMORY, "%s: %s", what, e);
  return bert__error(HVD_ERR_CUDA, "%s on cuda:%d: %s", what, m->device, e);
}

/* Why a GPU backend could not be opened: the build, or the machine. */
static hvd_result_t no_cuda_result(void) {
#ifdef HVD_HAVE_CUDA
  return HVD_ERR_CUDA;
#else
  return HVD_ERR_UNSUPPORTED;
#endif
}

hvd_result_t bert_gpu_check(int *device) {
  char msg[512];
  if (device == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_gpu_check: NULL");
  int d = bert_cuda_open(*device, msg, sizeof msg);
  if (d < 0)
    return bert__error(no_cuda_result(), "%s", msg);
  bert_cuda_close();
  *device = d;
  return HVD_SUCCESS;
}

void bert_set_tf32(int on) { bert_cuda_set_tf32(on); }

void bert_set_cuda_graphs(int on) {
  bert_cuda_set_graphs(on);
  bert_cpu_set_graphs(on);
}

void bert_set_plain_kernels(int on) { bert_cuda_set_plain(on); }

void bert_set_flash_attention(int on) { bert_cuda_set_flash(on); }

hvd_result_t bert_model_create(const bert_config_t *c, bert_model_t **out) {
  return bert_model_create_on(c, HVD_CPU, out);
}

/* The parameters: their descriptions, one block of values and one of
 * gradients (zeroed), each parameter's tensors pointing into them; 0 if
 * an allocation failed. */
static int alloc_params(bert_model_t *m) {
  const bert_config_t *c = &m->c;
  m->n = P_FIRST_LAYER + c->layers * PER_LAYER + PER_HEAD;
  m->params = calloc(m->n, sizeof *m->params);
  m->names = calloc(m->n, sizeof *m->names);
  m->hs = calloc(c->layers + 1, sizeof *m->hs);
  m->acts = calloc(c->layers, sizeof *m->acts);
  if (m->params == NULL || m->names == NULL || m->hs == NULL || m->acts == NULL)
    return 0;
  describe_params(m);
  m->nweights = 0;
  for (int i = 0; i < m->n; i++)
    m->nweights += numel(&m->params[i].value);
  m->values = alloc_elts(m, m->nweights);
  m->grads = alloc_elts(m, m->nweights);
  if (m->values == NULL || m->grads == NULL)
    return 0;
  m->be->zero(m->grads, m->nweights);
  static const hvd_dtype_t dtypes[] = {
      [BERT_FP32] = HVD_FLOAT32,
      [BERT_BF16] = HVD_BFLOAT16,
      [BERT_FP16] = HVD_FLOAT16,
  };
  int64_t off = 0;
  for (int i = 0; i < m->n; i++) {
    hvd_param_t *p = &m->params[i];
    p->value.dtype = dtypes[c->precision];
    p->value.device = m->device;
    p->value.data = (char *)m->values + off * (int64_t)m->elt;
    p->grad = p->value;
    p->grad.data = (char *)m->grads + off * (int64_t)m->elt;
    off += numel(&p->value);
  }
  return 1;
}

/* The activations' arena, the batch block and its host twin, and on a GPU
 * the logits of the largest batch; then the backend's scratch reserved.
 * 0 if an allocation failed. */
static int alloc_activations(bert_model_t *m) {
  const bert_config_t *c = &m->c;
  int64_t N = (int64_t)c->batch * c->seq_len;
  size_t batch_bytes = sizeof(int32_t) * (size_t)(4 * N + c->batch);
  m->arena = m->be->alloc((size_t)layout(m, NULL));
  m->batch_dev = m->be->alloc(batch_bytes);
  m->batch_host = m->be->host_alloc(batch_bytes);
  if (m->arena == NULL || m->batch_dev == NULL || m->batch_host == NULL)
    return 0;
  memset(m->batch_host, 0, batch_bytes);
  m->ids = m->batch_dev;
  m->types = m->batch_dev + N;
  m->rows = m->batch_dev + 2 * N;
  m->targets = m->batch_dev + 3 * N;
  m->lengths = m->batch_dev + 4 * N;
  layout(m, m->arena);
  if (m->device != HVD_CPU) {
    /* all the logits a batch can have (every token masked), so that
     * training never allocates device memory: V floats per token */
    m->logits = alloc_elts(m, N * c->vocab_size);
    if (m->logits == NULL)
      return 0;
    m->logits_cap = N;
  }
  int H = c->hidden, F = c->ffn, V = c->vocab_size;
  int width = H > F ? H : F;
  m->be->reserve(c->batch, c->seq_len, c->heads, H / c->heads,
                 width > V ? width : V, c->type_vocab_size);
  return 1;
}

hvd_result_t bert_model_create_on(const bert_config_t *c, int device,
                                  bert_model_t **out) {
  hvd_result_t rc;
  bert_model_t *m = NULL;
  char msg[512];
  if (out == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_model_create: out is NULL");
  *out = NULL;
  if ((rc = bert_config_check(c)) != HVD_SUCCESS)
    return rc;
  if (device < HVD_CPU)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "bert_model_create_on: device %d is neither HVD_CPU "
                       "(-1) nor a CUDA ordinal",
                       device);
  m = calloc(1, sizeof *m);
  if (m == NULL)
    goto nomem;
  m->c = *c;
  m->be = bert_cpu_backend(c->precision);
  m->elt = bert_precision_bytes(c->precision);
  m->device = HVD_CPU;
  if (device != HVD_CPU) {
    int d = bert_cuda_open(device, msg, sizeof msg);
    if (d < 0) {
      free(m);
      return bert__error(no_cuda_result(), "a BERT model on cuda:%d: %s",
                         device, msg);
    }
    m->be = bert_cuda_backend(c->precision);
    m->device = d;
  }
  if (!alloc_params(m) || !alloc_activations(m))
    goto nomem;
  bert_model_init(m, c->seed);
  if ((rc = backend_status(m, "creating a BERT model")) != HVD_SUCCESS) {
    bert_model_destroy(m);
    return rc;
  }
  if (c->threads > 0 && m->device == HVD_CPU)
    (void)bert_blas_set_threads(c->threads); /* else: the environment's */
  *out = m;
  return HVD_SUCCESS;
nomem:
  if (m != NULL && m->be->error() != NULL) { /* a CUDA failure, not memory */
    rc = backend_status(m, "creating a BERT model");
    bert_model_destroy(m);
    return rc;
  }
  bert_model_destroy(m);
  return bert__error(HVD_ERR_NO_MEMORY,
                     "out of memory for a BERT model (L=%d H=%d F=%d V=%d, "
                     "B=%d S=%d)",
                     c->layers, c->hidden, c->ffn, c->vocab_size, c->batch,
                     c->seq_len);
}

void bert_model_destroy(bert_model_t *m) {
  if (m == NULL)
    return;
  free(m->params);
  free(m->names);
  free(m->hs);
  free(m->acts);
  m->be->graph_forget(m); /* before the memory its graphs use goes */
  m->be->free(m->values);
  m->be->free(m->grads);
  m->be->free(m->arena);
  m->be->free(m->logits);
  m->be->free(m->batch_dev);
  m->be->host_free(m->batch_host);
  if (m->device != HVD_CPU)
    bert_cuda_close();
  free(m);
}

int bert_model_device(const bert_model_t *m) {
  return m != NULL ? m->device : HVD_CPU;
}

/* Values or gradients between the model (T, the backend's memory) and
 * host float32: straight for a float32 model, else through a host
 * buffer of T (to_float: model -> host). */
static hvd_result_t transfer(bert_model_t *m, int grads, float *host,
                             int to_float, const char *what) {
  void *dev = grads ? m->grads : m->values;
  const int p = m->c.precision;
  const size_t n = (size_t)m->nweights;
  if (p == BERT_FP32) {
    if (to_float)
      m->be->to_host(host, dev, sizeof(float) * n);
    else
      m->be->to_device(dev, host, sizeof(float) * n);
    return backend_status(m, what);
  }
  void *t = malloc(m->elt * n);
  if (t == NULL)
    return bert__error(HVD_ERR_NO_MEMORY,
                       "%s: out of host memory for %zu %s weights", what, n,
                       bert_precision_name(p));
  if (to_float) {
    m->be->to_host(t, dev, m->elt * n);
    bert_to_float(p, t, host, (int64_t)n);
  } else { /* t is pageable: to_device has read it when it returns */
    bert_from_float(p, host, t, (int64_t)n);
    m->be->to_device(dev, t, m->elt * n);
  }
  free(t);
  return backend_status(m, what);
}

hvd_result_t bert_model_get(bert_model_t *m, int grads, float *host) {
  if (m == NULL || host == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_model_get: NULL");
  return transfer(m, grads, host, 1, "bert_model_get");
}

hvd_result_t bert_model_set(bert_model_t *m, int grads, const float *host) {
  if (m == NULL || host == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_model_set: NULL");
  return transfer(m, grads, (float *)host, 0, "bert_model_set");
}

const bert_config_t *bert_model_config(const bert_model_t *m) {
  return m != NULL ? &m->c : NULL;
}

hvd_param_t *bert_model_params(bert_model_t *m, int *n) {
  if (n != NULL)
    *n = m != NULL ? m->n : 0;
  return m != NULL ? m->params : NULL;
}

int bert_model_param_index(const bert_model_t *m, const char *name) {
  if (m == NULL || name == NULL)
    return -1;
  for (int i = 0; i < m->n; i++)
    if (strcmp(m->params[i].name, name) == 0)
      return i;
  return -1;
}

int64_t bert_model_num_weights(const bert_model_t *m) {
  return m != NULL ? m->nweights : 0;
}

/* ---- Forward ------------------------------------------------------------- */

static hvd_result_t check_batch(const bert_model_t *m, const bert_batch_t *b) {
  const bert_config_t *c = &m->c;
  if (b == NULL || b->input_ids == NULL || b->labels == NULL)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "batch: input_ids and labels are required");
  if (b->batch < 1 || b->batch > c->batch || b->seq_len < 1 ||
      b->seq_len > c->seq_len)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "batch of %d x %d tokens does not fit the model's %d x "
                       "%d",
                       b->batch, b->seq_len, c->batch, c->seq_len);
  int64_t N = (int64_t)b->batch * b->seq_len;
  for (int64_t i = 0; i < N; i++) {
    int r = (int)(i / b->seq_len), s = (int)(i % b->seq_len);
    if (b->input_ids[i] < 0 || b->input_ids[i] >= c->vocab_size)
      return bert__error(HVD_ERR_INVALID_ARG,
                         "batch row %d position %d: token id %" PRId32
                         " is outside the vocabulary (0..%d)",
                         r, s, b->input_ids[i], c->vocab_size - 1);
    if (b->token_type_ids != NULL &&
        (b->token_type_ids[i] < 0 ||
         b->token_type_ids[i] >= c->type_vocab_size))
      return bert__error(HVD_ERR_INVALID_ARG,
                         "batch row %d position %d: token type %" PRId32
                         " is outside 0..%d",
                         r, s, b->token_type_ids[i], c->type_vocab_size - 1);
    if (b->labels[i] != LABEL_IGNORE &&
        (b->labels[i] < 0 || b->labels[i] >= c->vocab_size))
      return bert__error(HVD_ERR_INVALID_ARG,
                         "batch row %d position %d: label %" PRId32
                         " is neither -100 nor in 0..%d",
                         r, s, b->labels[i], c->vocab_size - 1);
  }
  if (b->lengths != NULL)
    for (int r = 0; r < b->batch; r++)
      if (b->lengths[r] < 0 || b->lengths[r] > b->seq_len)
        return bert__error(HVD_ERR_INVALID_ARG,
                           "batch row %d: length %" PRId32 " is outside 0..%d",
                           r, b->lengths[r], b->seq_len);
  return HVD_SUCCESS;
}

/* The batch, copied for backward: staged on the host, one copy (the
 * previous pass's copy from batch_host is done: the caller's sync_all).
 * The masked positions become the head's rows and targets; the CPU's
 * logits grow to hold them. */
static hvd_result_t stage_batch(bert_model_t *m, const bert_batch_t *b) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int B = b->batch, S = b->seq_len, N = B * S, V = c->vocab_size;
  const int64_t NC = (int64_t)c->batch * c->seq_len; /* the block's [N] */
  int32_t *h = m->batch_host;
  m->B = B, m->S = S;
  memcpy(h, b->input_ids, sizeof(int32_t) * N);
  m->has_types = b->token_type_ids != NULL;
  if (m->has_types)
    memcpy(h + NC, b->token_type_ids, sizeof(int32_t) * N);
  m->has_lengths = b->lengths != NULL;
  if (m->has_lengths)
    memcpy(h + 4 * NC, b->lengths, sizeof(int32_t) * B);
  m->M = 0;
  for (int i = 0; i < N; i++)
    if (b->labels[i] != LABEL_IGNORE) {
      h[2 * NC + m->M] = i;
      h[3 * NC + m->M++] = b->labels[i];
    }
  const int M = m->M;
  if (M > m->logits_cap) { /* the CPU's grow on demand */
    void *p = alloc_elts(m, (int64_t)M * V);
    if (p == NULL)
      return bert__error(HVD_ERR_NO_MEMORY,
                         "out of memory for the logits of %d masked tokens", M);
    k->free(m->logits);
    m->logits = p;
    m->logits_cap = M;
  }
  k->to_device(m->batch_dev, h, sizeof(int32_t) * (size_t)(4 * NC + c->batch));
  return HVD_SUCCESS;
}

/* Encoder layer l forward, from hs[l] to hs[l + 1], keeping what backward
 * needs in acts[l]. */
static void layer_fwd(bert_model_t *m, int l) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int B = m->B, S = m->S, N = B * S, H = c->hidden, F = c->ffn,
            A = c->heads;
  const float eps = c->ln_eps;
  const int32_t *lengths = m->has_lengths ? m->lengths : NULL;
  layer_act_t *a = &m->acts[l];
  const void *x = m->hs[l];
  k->linear_fwd(x, val(m, layer_param(l, L_Q_W)), val(m, layer_param(l, L_Q_B)),
                a->q, N, H, H);
  k->linear_fwd(x, val(m, layer_param(l, L_K_W)), val(m, layer_param(l, L_K_B)),
                a->k, N, H, H);
  k->linear_fwd(x, val(m, layer_param(l, L_V_W)), val(m, layer_param(l, L_V_B)),
                a->v, N, H, H);
  k->attention_fwd(a->q, a->k, a->v, lengths, a->probs, a->ctx, B, S, A, H / A);
  k->linear_fwd(a->ctx, val(m, layer_param(l, L_AO_W)),
                val(m, layer_param(l, L_AO_B)), a->h1_pre, N, H, H);
  bert_add_layernorm_fwd(k, a->h1_pre, x, val(m, layer_param(l, L_ALN_W)),
                         val(m, layer_param(l, L_ALN_B)), eps, a->h1_pre, a->h1,
                         a->ln1_mean, a->ln1_rstd, N, H);
  k->linear_fwd(a->h1, val(m, layer_param(l, L_I_W)),
                val(m, layer_param(l, L_I_B)), a->inter_pre, N, H, F);
  k->gelu_fwd(a->inter_pre, a->inter, (int64_t)N * F);
  k->linear_fwd(a->inter, val(m, layer_param(l, L_O_W)),
                val(m, layer_param(l, L_O_B)), a->h2_pre, N, F, H);
  bert_add_layernorm_fwd(k, a->h2_pre, a->h1, val(m, layer_param(l, L_OLN_W)),
                         val(m, layer_param(l, L_OLN_B)), eps, a->h2_pre,
                         m->hs[l + 1], a->ln2_mean, a->ln2_rstd, N, H);
}

/* ---- CUDA graphs ---------------------------------------------------------
 * With graphs on (bert_set_cuda_graphs) each encoder layer's forward and
 * backward kernels are one graph per batch shape (layers.h, graph_run):
 * the key fixes the direction, the layer, B, S and whether the batch has
 * lengths; every pointer is the model's own (the owner). The backward's
 * gradient-ready calls cannot be made inside a graph (they call into
 * hvd), so with graphs they come after the layer's graph, in the order
 * the kernels would have made them (bwd_order). */

typedef struct layer_job {
  bert_model_t *m;
  int l;
  struct ready_queue *muted; /* backward: no calls (made after the graph) */
} layer_job_t;

static void graph_key(const bert_model_t *m, int backward, int l, int key[4]) {
  key[0] = backward | m->has_lengths << 1;
  key[1] = l;
  key[2] = m->B;
  key[3] = m->S;
}

static void layer_fwd_job(void *p) {
  layer_job_t *j = p;
  layer_fwd(j->m, j->l);
}

static void layer_fwd_graph(bert_model_t *m, int l) {
  int key[4];
  layer_job_t job = {m, l, NULL};
  graph_key(m, 0, l, key);
  if (!m->be->graph_run(m, key, layer_fwd_job, &job))
    layer_fwd(m, l);
}

/* The masked-LM head on the masked rows: the loss and the correct
 * predictions into out. */
static void head_fwd(bert_model_t *m, bert_output_t *out) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int H = c->hidden, V = c->vocab_size, M = m->M;
  const float eps = c->ln_eps;
  out->loss = 0;
  out->masked = M;
  out->correct = 0;
  if (M > 0) {
    k->gather_rows(m->hs[c->layers], m->rows, M, H, m->hm);
    k->linear_fwd(m->hm, val(m, head_param(c, H_T_W)),
                  val(m, head_param(c, H_T_B)), m->t_pre, M, H, H);
    k->gelu_fwd(m->t_pre, m->t_act, (int64_t)M * H);
    k->layernorm_fwd(m->t_act, val(m, head_param(c, H_TLN_W)),
                     val(m, head_param(c, H_TLN_B)), eps, m->t, m->t_mean,
                     m->t_rstd, M, H);
    /* decoder: tied to the word embeddings */
    k->linear_fwd(m->t, val(m, P_WORD), val(m, head_param(c, H_DEC_B)),
                  m->logits, M, H, V);
    out->loss = k->xent_fwd(m->logits, m->targets, M, V, &out->correct) / M;
  }
}

hvd_result_t bert_model_forward(bert_model_t *m, const bert_batch_t *b,
                                bert_output_t *out) {
  hvd_result_t rc;
  if (m == NULL || out == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_model_forward: NULL");
  m->ready_for_backward = 0;
  if ((rc = check_batch(m, b)) != HVD_SUCCESS)
    return rc;
  const bert_config_t *c = &m->c;
  const int B = b->batch, S = b->seq_len, N = B * S, H = c->hidden;
  const float eps = c->ln_eps;
  const bert_backend_t *k = m->be;

  /* Work that others queued on the device (hvd's optimizer update, zero
   * grad, a checkpoint load: perhaps on streams of their own) must be
   * done before this pass reads the parameters. On a GPU the device is
   * idle here anyway (the last pass ended with a synchronisation). */
  k->sync_all();
  if ((rc = stage_batch(m, b)) != HVD_SUCCESS)
    return rc;
  const int32_t *types = m->has_types ? m->types : NULL;

  /* embeddings */
  k->embedding_fwd(m->ids, types, val(m, P_WORD), val(m, P_POS), val(m, P_TYPE),
                   m->emb_pre, B, S, H);
  k->layernorm_fwd(m->emb_pre, val(m, P_EMB_LN_W), val(m, P_EMB_LN_B), eps,
                   m->hs[0], m->emb_mean, m->emb_rstd, N, H);
  /* encoder */
  for (int l = 0; l < c->layers; l++)
    layer_fwd_graph(m, l);
  /* masked-LM head on the masked rows */
  head_fwd(m, out);
  if ((rc = backend_status(m, "bert_model_forward")) != HVD_SUCCESS)
    return rc;
  m->ready_for_backward = 1;
  return HVD_SUCCESS;
}

void bert_model_set_host_fences(bert_model_t *m, int on) {
  if (m != NULL)
    m->host_fences = on != 0;
}

hvd_result_t bert_model_set_sparse_embeddings(bert_model_t *m,
                                              bert_sparse_grad_fn fn,
                                              void *ctx) {
  if (m == NULL)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "bert_model_set_sparse_embeddings: NULL");
  if (fn != NULL && m->device != HVD_CPU)
    return bert__error(HVD_ERR_UNSUPPORTED,
                       "bert_model_set_sparse_embeddings: the model is on "
                       "cuda:%d; sparse embedding gradients are CPU-only",
                       m->device);
  if (fn != NULL && m->c.precision != BERT_FP32)
    return bert__error(HVD_ERR_UNSUPPORTED,
                       "bert_model_set_sparse_embeddings: the model is %s; "
                       "sparse embedding gradients are float32-only",
                       bert_precision_name(m->c.precision));
  m->sparse_fn = fn;
  m->sparse_ctx = ctx;
  return HVD_SUCCESS;
}

/* ---- Backward ------------------------------------------------------------ */

/* The gradient-ready calls. On the host a gradient is final when its
 * kernel returns, so each call is made at once. On a GPU the kernels only
 * queue work; hvd orders its collectives after it on the device (hvd.h,
 * "Device ordering"), so by default each call is made at once too. With
 * host fences (bert_model_set_host_fences: a library that needs a
 * gradient complete when it is handed over) the calls of a stage (the
 * head, one encoder layer, the embeddings) are held until its fence has
 * passed, and that is waited for one stage late: after the next stage's
 * kernels are queued, so the GPU never waits for the host. The order of
 * the calls is the same either way. */
#define READY_MAX 32 /* calls per stage: 16 per encoder layer */
typedef struct ready_queue {
  bert_grad_ready_fn fn;
  void *ctx;
  const bert_backend_t *be;
  int lazy;                     /* hold the calls (a GPU) */
  int held[2][READY_MAX], n[2]; /* per fence slot */
  int cur;                      /* the slot of the stage being queued */
} ready_queue_t;

static void rq_deliver(ready_queue_t *q, int slot) {
  if (q->be->error() != NULL) /* the gradients are not what they should be:
                                 hand none over; backward reports it */
    q->n[slot] = 0;
  for (int i = 0; i < q->n[slot]; i++)
    q->fn(q->ctx, q->held[slot][i]);
  q->n[slot] = 0;
}

static void ready1(ready_queue_t *q, int i) {
  if (q->fn == NULL)
    return;
  if (!q->lazy) {
    q->fn(q->ctx, i);
    return;
  }
  if (q->n[q->cur] == READY_MAX) { /* cannot happen with the stages below */
    q->be->sync();
    rq_deliver(q, 1 - q->cur);
    rq_deliver(q, q->cur);
  }
  q->held[q->cur][q->n[q->cur]++] = i;
}

static void signal2(ready_queue_t *q, int i) {
  ready1(q, i);
  ready1(q, i + 1);
}

/* The end of a stage: fence it; deliver the previous stage's calls once
 * its fence has passed. */
static void rq_stage(ready_queue_t *q) {
  if (q->fn == NULL || !q->lazy)
    return;
  q->be->fence_record(q->cur);
  int prev = 1 - q->cur;
  if (q->n[prev] > 0) {
    q->be->fence_wait(prev);
    rq_deliver(q, prev);
  }
  q->cur = prev;
}

/* The end of the pass: everything queued is done; the rest, in order. */
static void rq_finish(ready_queue_t *q) {
  q->be->sync();
  if (q->fn == NULL || !q->lazy)
    return;
  rq_deliver(q, 1 - q->cur);
  rq_deliver(q, q->cur);
}

hvd_result_t bert_model_backward(bert_model_t *m, bert_grad_ready_fn ready,
                                 void *ctx) {
  return bert_model_backward_scaled(m, 1.0f, ready, ctx);
}

/* The head: scale * d(mean loss)/d logits, then back to the masked rows
 * of the encoder output (g_x); the other rows get no gradient. */
static void head_bwd(bert_model_t *m, float scale, ready_queue_t *q) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int N = m->B * m->S, H = c->hidden, V = c->vocab_size, M = m->M;
  k->zero(m->g_x, (int64_t)N * H);
  if (M > 0) {
    k->xent_bwd(m->logits, m->targets, M, V, scale / (float)M);
    k->linear_bwd(m->t, val(m, P_WORD), m->logits, m->g_tmp, 0.0f,
                  grad(m, P_WORD), grad(m, head_param(c, H_DEC_B)), M, H, V);
  }
  ready1(q, head_param(c, H_DEC_B));
  if (m->sparse_fn != NULL) /* the lookup's share comes apart */
    ready1(q, P_WORD);
  if (M > 0)
    k->layernorm_bwd(m->t_act, m->t_mean, m->t_rstd,
                     val(m, head_param(c, H_TLN_W)), m->g_tmp, m->g_h1,
                     grad(m, head_param(c, H_TLN_W)),
                     grad(m, head_param(c, H_TLN_B)), M, H);
  signal2(q, head_param(c, H_TLN_W));
  if (M > 0) {
    k->gelu_bwd(m->t_pre, m->g_h1, m->g_h1, (int64_t)M * H);
    k->linear_bwd(m->hm, val(m, head_param(c, H_T_W)), m->g_h1, m->g_ctx, 0.0f,
                  grad(m, head_param(c, H_T_W)), grad(m, head_param(c, H_T_B)),
                  M, H, H);
    k->scatter_add_rows(m->g_ctx, m->rows, M, H, m->g_x);
  }
  signal2(q, head_param(c, H_T_W));
  rq_stage(q);
}

/* The weights whose (weight, bias) ready calls layer_bwd makes, in order. */
static const int bwd_order[8] = {L_OLN_W, L_O_W, L_I_W, L_ALN_W,
                                 L_AO_W,  L_Q_W, L_K_W, L_V_W};

/* Encoder layer l backward; g_x: the gradient of the layer's output on
 * entry, of its input on return. */
static void layer_bwd(bert_model_t *m, int l, ready_queue_t *q) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int B = m->B, S = m->S, N = B * S, H = c->hidden, F = c->ffn,
            A = c->heads;
  layer_act_t *a = &m->acts[l];
  const void *x = m->hs[l];
#define W(p) val(m, layer_param(l, p))
#define G(p) grad(m, layer_param(l, p))
  /* output LayerNorm; the residual sends its gradient to h1 too */
  bert_layernorm_bwd2(k, a->h2_pre, a->ln2_mean, a->ln2_rstd, W(L_OLN_W),
                      m->g_x, m->g_tmp, m->g_h1, G(L_OLN_W), G(L_OLN_B), N, H);
  signal2(q, layer_param(l, bwd_order[0]));
  /* FFN: output dense, GELU, intermediate dense */
  k->linear_bwd(a->inter, W(L_O_W), m->g_tmp, m->g_inter, 0.0f, G(L_O_W),
                G(L_O_B), N, F, H);
  signal2(q, layer_param(l, bwd_order[1]));
  k->gelu_bwd(a->inter_pre, m->g_inter, m->g_inter, (int64_t)N * F);
  k->linear_bwd(a->h1, W(L_I_W), m->g_inter, m->g_h1, 1.0f, G(L_I_W), G(L_I_B),
                N, H, F);
  signal2(q, layer_param(l, bwd_order[2]));
  /* attention LayerNorm; the residual sends its gradient to x (g_x is
   * free: layernorm_bwd above read it, the Q, K, V products add to it) */
  bert_layernorm_bwd2(k, a->h1_pre, a->ln1_mean, a->ln1_rstd, W(L_ALN_W),
                      m->g_h1, m->g_tmp, m->g_x, G(L_ALN_W), G(L_ALN_B), N, H);
  signal2(q, layer_param(l, bwd_order[3]));
  k->linear_bwd(a->ctx, W(L_AO_W), m->g_tmp, m->g_ctx, 0.0f, G(L_AO_W),
                G(L_AO_B), N, H, H);
  signal2(q, layer_param(l, bwd_order[4]));
  k->attention_bwd(a->q, a->k, a->v, a->probs, m->g_ctx, m->g_q, m->g_k, m->g_v,
                   m->scratch, B, S, A, H / A);
  k->linear_bwd(x, W(L_Q_W), m->g_q, m->g_x, 1.0f, G(L_Q_W), G(L_Q_B), N, H, H);
  signal2(q, layer_param(l, bwd_order[5]));
  k->linear_bwd(x, W(L_K_W), m->g_k, m->g_x, 1.0f, G(L_K_W), G(L_K_B), N, H, H);
  signal2(q, layer_param(l, bwd_order[6]));
  k->linear_bwd(x, W(L_V_W), m->g_v, m->g_x, 1.0f, G(L_V_W), G(L_V_B), N, H, H);
  signal2(q, layer_param(l, bwd_order[7]));
  rq_stage(q);
#undef W
#undef G
}

static void layer_bwd_job(void *p) {
  layer_job_t *j = p;
  layer_bwd(j->m, j->l, j->muted);
}

/* Layer l backward, as a graph where graphs are on: then its ready calls
 * follow, in layer_bwd's order, and the stage ends. */
static void layer_bwd_graph(bert_model_t *m, int l, ready_queue_t *q) {
  int key[4];
  ready_queue_t muted = {.fn = NULL, .be = m->be};
  layer_job_t job = {m, l, &muted};
  graph_key(m, 1, l, key);
  if (!m->be->graph_run(m, key, layer_bwd_job, &job)) {
    layer_bwd(m, l, q);
    return;
  }
  for (int i = 0; i < 8; i++)
    signal2(q, layer_param(l, bwd_order[i]));
  rq_stage(q);
}

/* The embeddings: LayerNorm, then the three tables. */
static void embeddings_bwd(bert_model_t *m, ready_queue_t *q) {
  const bert_config_t *c = &m->c;
  const bert_backend_t *k = m->be;
  const int B = m->B, S = m->S, N = B * S, H = c->hidden;
  const int32_t *types = m->has_types ? m->types : NULL;
  k->layernorm_bwd(m->emb_pre, m->emb_mean, m->emb_rstd, val(m, P_EMB_LN_W),
                   m->g_x, m->g_tmp, grad(m, P_EMB_LN_W), grad(m, P_EMB_LN_B),
                   N, H);
  signal2(q, P_EMB_LN_W);
  k->embedding_bwd(m->ids, types, m->g_tmp,
                   m->sparse_fn != NULL ? NULL : grad(m, P_WORD),
                   grad(m, P_POS), grad(m, P_TYPE), B, S, H);
  ready1(q, P_POS);
  ready1(q, P_TYPE);
  if (m->sparse_fn == NULL)
    ready1(q, P_WORD); /* last: the decoder's share is in it too */
}

hvd_result_t bert_model_backward_scaled(bert_model_t *m, float scale,
                                        bert_grad_ready_fn ready, void *ctx) {
  if (m == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_model_backward: NULL");
  if (!m->ready_for_backward)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "bert_model_backward: no forward pass to go back "
                       "through (call bert_model_forward first, once per "
                       "backward)");
  m->ready_for_backward = 0;
  const int N = m->B * m->S;
  ready_queue_t rq = {.fn = ready,
                      .ctx = ctx,
                      .be = m->be,
                      .lazy = m->device != HVD_CPU && m->host_fences};
  ready_queue_t *q = &rq;

  head_bwd(m, scale, q);
  /* encoder, last layer first */
  for (int l = m->c.layers - 1; l >= 0; l--)
    layer_bwd_graph(m, l, q);
  embeddings_bwd(m, q);
  rq_finish(q);
  if (m->sparse_fn != NULL) /* token t's row of g_tmp is its id's gradient */
    m->sparse_fn(m->sparse_ctx, P_WORD, m->ids, (int64_t)N, m->g_tmp);
  return backend_status(m, "bert_model_backward");
}
