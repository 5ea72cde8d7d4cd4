/*
 * data.c - corpus (file or synthetic), packing into samples, masking.
 * See data.h.
 */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bert_dataset {
  bert_vocab_t *vocab;
  int seq_len;
  double mask_prob;
  uint64_t seed;
  int64_t n;    /* samples */
  int64_t *off; /* [n+1]: sample i's words are tok[off[i]..off[i+1]) */
  int32_t *tok;
};

void bert_data_options_init(bert_data_options_t *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->synthetic_sentences = 20000;
  o->seq_len = 128;
  o->vocab_max = 30522;
  o->mask_prob = 0.15;
  o->min_samples = 1;
}

/* ---- The synthetic corpus ------------------------------------------------ */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
static const char *const nouns[] = {
    "cat",   "dog",  "bird",  "fish",  "horse", "cow",   "sheep",  "goat",
    "mouse", "lion", "tiger", "bear",  "wolf",  "fox",   "rabbit", "frog",
    "duck",  "owl",  "snake", "whale", "shark", "eagle", "deer",   "bee"};
static const char *const verbs[] = {"eats",  "chases",  "sees",    "likes",
                                    "finds", "follows", "watches", "hears"};
static const char *const objects[] = {"apple", "bone",  "seed",   "worm",
                                      "hay",   "grass", "carrot", "cheese",
                                      "honey", "berry", "nut",    "leaf"};
static const char *const adjectives[] = {"big",   "small",  "old",   "young",
                                         "happy", "sleepy", "brown", "white",
                                         "quick", "lazy"};
static const char *const numbers[] = {
    "one",     "two",       "three",    "four",     "five",
    "six",     "seven",     "eight",    "nine",     "ten",
    "eleven",  "twelve",    "thirteen", "fourteen", "fifteen",
    "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};
static const char *const days[] = {"monday",   "tuesday", "wednesday",
                                   "thursday", "friday",  "saturday",
                                   "sunday"};
static const char *const months[] = {
    "january", "february", "march",     "april",   "may",      "june",
    "july",    "august",   "september", "october", "november", "december"};
static const char *const colors[] = {"red",   "blue",   "green",  "yellow",
                                     "black", "orange", "purple", "pink"};
static const char *const places[] = {"farm", "forest", "river",  "lake",
                                     "hill", "field",  "garden", "barn"};

typedef struct text_buf {
  char *p;
  size_t len, cap;
  int failed;
} text_buf_t;

static void put(text_buf_t *b, const char *s) {
  size_t n = strlen(s);
  if (b->failed)
    return;
  if (b->len + n + 2 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 1 << 16;
    while (cap < b->len + n + 2)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->failed = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* One sentence; every choice after the first word of a pattern follows
 * from it, so a model that attends to the context can fill any gap. */
static void sentence(text_buf_t *b, bert_rng_t *r) {
  double u = bert__rng_uniform(r);
  if (u < 0.4) { /* The quick fox chases the worm. (verb, object: noun's) */
    int n = (int)bert__rng_below(r, COUNT(nouns));
    put(b, "The ");
    put(b, adjectives[bert__rng_below(r, COUNT(adjectives))]);
    put(b, " ");
    put(b, nouns[n]);
    put(b, " ");
    put(b, verbs[n % COUNT(verbs)]);
    put(b, " the ");
    put(b, objects[n % COUNT(objects)]);
    put(b, ".");
  } else if (u < 0.6) { /* counting: five six seven eight nine */
    int len = 3 + (int)bert__rng_below(r, 3);
    int k = (int)bert__rng_below(r, COUNT(numbers) - len + 1);
    for (int i = 0; i < len; i++) {
      put(b, i ? " " : "");
      put(b, numbers[k + i]);
    }
    put(b, ".");
  } else if (u < 0.75) { /* days or months in order, wrapping */
    int use_days = bert__rng_below(r, 2) == 0;
    const char *const *w = use_days ? days : months;
    int nw = use_days ? COUNT(days) : COUNT(months);
    int len = 3 + (int)bert__rng_below(r, 3);
    int k = (int)bert__rng_below(r, nw);
    for (int i = 0; i < len; i++) {
      put(b, i ? ", " : "");
      put(b, w[(k + i) % nw]);
    }
    put(b, ".");
  } else { /* The owl lives in the forest and is green. */
    int n = (int)bert__rng_below(r, COUNT(nouns));
    put(b, "The ");
    put(b, nouns[n]);
    put(b, " lives in the ");
    put(b, places[n % COUNT(places)]);
    put(b, " and is ");
    put(b, colors[(n * 5) % COUNT(colors)]);
    put(b, ".");
  }
  put(b, "\n");
}

hvd_result_t bert_synthetic_corpus(uint64_t seed, int64_t sentences,
                                   char **text, size_t *len) {
  if (text == NULL || len == NULL || sentences < 1)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "bert_synthetic_corpus: NULL, or no sentences");
  uint64_t words[2] = {seed, 0x73796e7468ULL /* "synth" */};
  bert_rng_t r;
  bert__rng_seed(&r, words, 2);
  text_buf_t b = {0};
  for (int64_t i = 0; i < sentences && !b.failed; i++)
    sentence(&b, &r);
  if (b.failed) {
    free(b.p);
    return bert__error(HVD_ERR_NO_MEMORY,
                       "out of memory for a synthetic corpus of %lld "
                       "sentences",
                       (long long)sentences);
  }
  *text = b.p;
  *len = b.len;
  return HVD_SUCCESS;
}

/* ---- Reading, packing ------------------------------------------------------
 */

static hvd_result_t read_file(const char *path, char **text, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return bert__error(HVD_ERR_IO, "cannot open corpus '%s': %s", path,
                       strerror(errno));
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap + 1);
  while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *p = realloc(buf, cap * 2 + 1);
      if (p == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = p, cap *= 2;
    }
  }
  int err = errno, bad = buf != NULL && ferror(f);
  fclose(f);
  if (buf == NULL)
    return bert__error(HVD_ERR_NO_MEMORY, "out of memory reading '%s'", path);
  if (bad) {
    free(buf);
    return bert__error(HVD_ERR_IO, "cannot read corpus '%s': %s", path,
                       strerror(err));
  }
  buf[n] = '\0';
  /* a text corpus has no NUL byte; a program, an archive, a checkpoint do */
  const char *nul = memchr(buf, '\0', n);
  if (nul != NULL) {
    size_t at = (size_t)(nul - buf);
    free(buf);
    return bert__error(HVD_ERR_INVALID_ARG,
                       "corpus '%s' is not a text file (a NUL byte at offset "
                       "%zu)",
                       path, at);
  }
  *text = buf;
  *len = n;
  return HVD_SUCCESS;
}

typedef struct packer {
  bert_dataset_t *d;
  int64_t ntok, cap_tok, cap_off;
  int64_t cur; /* words in the open sample */
} packer_t;

static int reserve(packer_t *p, int64_t words) {
  bert_dataset_t *d = p->d;
  if (p->ntok + words > p->cap_tok) {
    int64_t cap = p->cap_tok ? p->cap_tok : 4096;
    while (cap < p->ntok + words)
      cap *= 2;
    int32_t *t = realloc(d->tok, (size_t)cap * sizeof *t);
    if (t == NULL)
      return -1;
    d->tok = t, p->cap_tok = cap;
  }
  /* a sample per word at most, plus the open one */
  if (d->n + words + 2 > p->cap_off) {
    int64_t cap = p->cap_off ? p->cap_off : 1024;
    while (cap < d->n + words + 2)
      cap *= 2;
    int64_t *o = realloc(d->off, (size_t)cap * sizeof *o);
    if (o == NULL)
      return -1;
    d->off = o, p->cap_off = cap;
  }
  return 0;
}

static void close_sample(packer_t *p) {
  if (p->cur > 0) {
    p->d->n++;
    p->d->off[p->d->n] = p->ntok;
    p->cur = 0;
  }
}

/* Appends one line's words: into the open sample if they fit, else into
 * a new one; a line longer than a sample fills whole samples. */
static int pack_line(packer_t *p, const int32_t *ids, int64_t n) {
  const int64_t room = p->d->seq_len - 2;
  if (n == 0)
    return 0;
  if (reserve(p, n) != 0)
    return -1;
  if (p->cur + n > room)
    close_sample(p);
  while (n > 0) {
    int64_t k = n < room - p->cur ? n : room - p->cur;
    memcpy(p->d->tok + p->ntok, ids, (size_t)k * sizeof *ids);
    p->ntok += k, p->cur += k, ids += k, n -= k;
    if (p->cur == room)
      close_sample(p);
  }
  return 0;
}

/* The dataset's vocabulary: read from o->vocab_path, else built from the
 * corpus (what: its name in messages). */
static hvd_result_t make_vocab(const bert_data_options_t *o, bert_dataset_t *d,
                               const char *text, size_t len, const char *what) {
  hvd_result_t rc;
  if (o->vocab_path != NULL) {
    rc = bert_vocab_load(o->vocab_path, &d->vocab);
  } else if ((rc = bert_vocab_build(text, len, o->vocab_max, &d->vocab)) !=
             HVD_SUCCESS) {
    if (rc == HVD_ERR_INVALID_ARG &&
        (o->vocab_max <= 0 || o->vocab_max > BERT_NUM_SPECIAL))
      rc = bert__error(HVD_ERR_INVALID_ARG,
                       "corpus '%s' is empty: it has no words (letters or "
                       "digits)",
                       what);
  }
  return rc;
}

/* The corpus, line by line, tokenized and packed into d's samples; its
 * words counted into *words_out. */
static hvd_result_t pack_corpus(bert_dataset_t *d, const char *text, size_t len,
                                const char *what, int64_t *words_out) {
  hvd_result_t rc = HVD_SUCCESS;
  packer_t p = {.d = d};
  int64_t words = 0;
  if (reserve(&p, 0) != 0)
    goto nomem;
  d->off[0] = 0;
  for (size_t start = 0; start < len;) {
    const char *nl = memchr(text + start, '\n', len - start);
    size_t end = nl != NULL ? (size_t)(nl - text) : len;
    int32_t *ids;
    int64_t n;
    if ((rc = bert_tokenize(d->vocab, text + start, end - start, &ids, &n)) !=
        HVD_SUCCESS)
      goto done;
    int bad = pack_line(&p, ids, n);
    free(ids);
    if (bad)
      goto nomem;
    words += n;
    start = end + 1;
  }
  close_sample(&p);
  goto done;
nomem:
  rc =
      bert__error(HVD_ERR_NO_MEMORY, "out of memory reading corpus '%s'", what);
done:
  *words_out = words;
  return rc;
}

/* Enough samples for one batch (o->min_samples) from words words? */
static hvd_result_t check_size(const bert_data_options_t *o,
                               const bert_dataset_t *d, int64_t words,
                               const char *what) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t need = o->min_samples > 1 ? o->min_samples : 1;
  if (words == 0)
    rc = bert__error(HVD_ERR_INVALID_ARG,
                     "corpus '%s' is empty: it has no words (letters or "
                     "digits)",
                     what);
  else if (d->n < need)
    rc = bert__error(HVD_ERR_INVALID_ARG,
                     "corpus '%s' is too small: its %lld words make %lld "
                     "sequence%s of %d tokens, and one batch needs %lld",
                     what, (long long)words, (long long)d->n,
                     d->n == 1 ? "" : "s", d->seq_len, (long long)need);
  return rc;
}

hvd_result_t bert_dataset_create(const bert_data_options_t *o,
                                 bert_dataset_t **out) {
  hvd_result_t rc;
  char *text = NULL;
  size_t len = 0;
  int64_t words = 0;
  bert_dataset_t *d = NULL;
  const char *what =
      o != NULL && o->corpus_path != NULL ? o->corpus_path : "(synthetic)";
  if (o == NULL || out == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_dataset_create: NULL");
  *out = NULL;
  if (o->seq_len < 3)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "sequence length %d: needs at least 3 ([CLS] word "
                       "[SEP])",
                       o->seq_len);
  if (!(o->mask_prob > 0 && o->mask_prob <= 1))
    return bert__error(HVD_ERR_INVALID_ARG,
                       "masking probability %g is outside (0, 1]",
                       o->mask_prob);
  if (o->corpus_path != NULL)
    rc = read_file(o->corpus_path, &text, &len);
  else
    rc = bert_synthetic_corpus(o->seed, o->synthetic_sentences, &text, &len);
  if (rc != HVD_SUCCESS)
    return rc;

  if ((d = calloc(1, sizeof *d)) == NULL)
    goto nomem;
  d->seq_len = o->seq_len;
  d->mask_prob = o->mask_prob;
  d->seed = o->seed;
  if ((rc = make_vocab(o, d, text, len, what)) != HVD_SUCCESS ||
      (rc = pack_corpus(d, text, len, what, &words)) != HVD_SUCCESS ||
      (rc = check_size(o, d, words, what)) != HVD_SUCCESS)
    goto fail;
  free(text);
  *out = d;
  return HVD_SUCCESS;
nomem:
  rc =
      bert__error(HVD_ERR_NO_MEMORY, "out of memory reading corpus '%s'", what);
fail:
  free(text);
  bert_dataset_destroy(d);
  return rc;
}

void bert_dataset_destroy(bert_dataset_t *d) {
  if (d == NULL)
    return;
  bert_vocab_destroy(d->vocab);
  free(d->off);
  free(d->tok);
  free(d);
}

int64_t bert_dataset_size(const bert_dataset_t *d) {
  return d != NULL ? d->n : 0;
}
int bert_dataset_seq_len(const bert_dataset_t *d) {
  return d != NULL ? d->seq_len : 0;
}
const bert_vocab_t *bert_dataset_vocab(const bert_dataset_t *d) {
  return d != NULL ? d->vocab : NULL;
}

/* ---- Masking, samples
 * -------------------------------------------------------- */

void bert_mask_tokens(const int32_t *tokens, int len, int vocab_size,
                      double mask_prob, uint64_t seed, int64_t index,
                      int64_t epoch, int32_t *input_ids, int32_t *labels) {
  uint64_t words[4] = {seed, (uint64_t)index, (uint64_t)epoch,
                       0x6d61736bULL /* "mask" */};
  bert_rng_t r;
  bert__rng_seed(&r, words, 4);
  int cand = 0;
  for (int i = 0; i < len; i++) {
    input_ids[i] = tokens[i];
    labels[i] = BERT_LABEL_IGNORE;
    cand += tokens[i] >= BERT_NUM_SPECIAL;
  }
  int k = (int)lround(mask_prob * cand);
  if (k < 1 && cand > 0 && mask_prob > 0)
    k = 1;
  if (k > cand)
    k = cand;
  /* Knuth's selection sampling: exactly k of the cand positions, each
   * set equally likely, in one pass */
  int seen = 0;
  for (int i = 0; i < len && k > 0; i++) {
    if (tokens[i] < BERT_NUM_SPECIAL)
      continue;
    if ((cand - seen++) * bert__rng_uniform(&r) >= k)
      continue;
    k--;
    labels[i] = tokens[i];
    double u = bert__rng_uniform(&r);
    if (u < 0.8 || vocab_size <= BERT_NUM_SPECIAL)
      input_ids[i] = BERT_MASK_ID;
    else if (u < 0.9)
      input_ids[i] =
          BERT_NUM_SPECIAL + (int32_t)bert__rng_below(
                                 &r, (uint64_t)(vocab_size - BERT_NUM_SPECIAL));
    /* else: unchanged */
  }
}

hvd_result_t bert_dataset_get(const bert_dataset_t *d, int64_t index,
                              int64_t epoch, int32_t *input_ids,
                              int32_t *labels, int32_t *length) {
  if (d == NULL || input_ids == NULL || labels == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_dataset_get: NULL");
  if (index < 0 || index >= d->n)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "sample %lld is outside the dataset (0..%lld)",
                       (long long)index, (long long)d->n - 1);
  const int S = d->seq_len;
  int n = (int)(d->off[index + 1] - d->off[index]);
  int32_t *seq = input_ids; /* masked in place below */
  seq[0] = BERT_CLS_ID;
  memcpy(seq + 1, d->tok + d->off[index], (size_t)n * sizeof *seq);
  seq[n + 1] = BERT_SEP_ID;
  for (int i = n + 2; i < S; i++)
    seq[i] = BERT_PAD_ID;
  bert_mask_tokens(seq, S, bert_vocab_size(d->vocab), d->mask_prob, d->seed,
                   index, epoch, input_ids, labels);
  if (length != NULL)
    *length = n + 2;
  return HVD_SUCCESS;
}

hvd_result_t bert_dataset_batch(const bert_dataset_t *d, const int64_t *indices,
                                int count, int64_t epoch, int32_t *input_ids,
                                int32_t *token_type_ids, int32_t *labels,
                                int32_t *lengths) {
  if (d == NULL || indices == NULL || input_ids == NULL || labels == NULL ||
      lengths == NULL || count < 0)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_dataset_batch: NULL");
  const int S = d->seq_len;
  for (int i = 0; i < count; i++) {
    hvd_result_t rc =
        bert_dataset_get(d, indices[i], epoch, input_ids + (int64_t)i * S,
                         labels + (int64_t)i * S, &lengths[i]);
    if (rc != HVD_SUCCESS)
      return rc;
  }
  if (token_type_ids != NULL)
    memset(token_type_ids, 0, (size_t)count * S * sizeof *token_type_ids);
  return HVD_SUCCESS;
}
