/*
 * data.h - the masked-language-model dataset of the BERT example.
 *
 * A corpus is text, one sentence or document per line: a file, or the
 * built-in synthetic corpus (a small grammar with learnable structure).
 * Its lines are tokenized (tokenizer.h) and packed greedily, in order,
 * into samples of seq_len tokens: [CLS] words [SEP] [PAD]...; a line is
 * never split unless it alone is longer than seq_len - 2 tokens.
 *
 * Masking (as in BERT): of a sample's non-special tokens,
 * max(1, round(mask_prob x count)) positions are chosen; each becomes
 * [MASK] with probability 0.8, a random word (ids >= BERT_NUM_SPECIAL)
 * with 0.1, and stays with 0.1. The label of a chosen position is its
 * original token, every other label is -100. All of it is a function of
 * (seed, sample index, epoch) alone, so any rank can make any sample, and
 * the next epoch masks differently.
 *
 * Calls that can fail return hvd_result_t and set bert_last_error().
 * A dataset is immutable after create: threads may share it.
 */
#ifndef BERT_DATA_H
#define BERT_DATA_H

#include "hvd.h"
#include "tokenizer.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

#define BERT_LABEL_IGNORE (-100)

typedef struct bert_data_options {
  const char *corpus_path;     /* NULL: the synthetic corpus */
  int64_t synthetic_sentences; /* its size (default 20000 lines) */
  uint64_t seed;               /* synthetic corpus and masking (0) */
  int seq_len;                 /* tokens per sample with [CLS] and [SEP]
                                  (default 128, at least 3) */
  const char *vocab_path;      /* NULL: build the vocabulary from the
                                  corpus; else read it (bert_vocab_load) */
  int vocab_max;               /* cap when building (default 30522) */
  double mask_prob;            /* default 0.15 */
  int64_t min_samples;         /* fewer samples is an error, e.g. one
                                  global batch (default 1) */
} bert_data_options_t;

void bert_data_options_init(bert_data_options_t *o);

typedef struct bert_dataset bert_dataset_t;

/* Reads (or generates) and tokenizes the corpus. Errors: HVD_ERR_IO for
 * a corpus or vocabulary file that cannot be opened or read;
 * HVD_ERR_INVALID_ARG for a corpus with no words, or one that makes
 * fewer than min_samples samples; HVD_ERR_CORRUPT for a bad vocabulary
 * file. Free with bert_dataset_destroy. */
hvd_result_t bert_dataset_create(const bert_data_options_t *o,
                                 bert_dataset_t **out);
void bert_dataset_destroy(bert_dataset_t *d); /* accepts NULL */

int64_t bert_dataset_size(const bert_dataset_t *d); /* samples */
int bert_dataset_seq_len(const bert_dataset_t *d);
/* Borrowed; lives as long as the dataset (save it next to checkpoints
 * with bert_vocab_save). */
const bert_vocab_t *bert_dataset_vocab(const bert_dataset_t *d);

/* Sample `index` (0 .. size-1) as masked for `epoch`: input_ids and
 * labels get seq_len entries, *length the real tokens ([CLS] to [SEP]). */
hvd_result_t bert_dataset_get(const bert_dataset_t *d, int64_t index,
                              int64_t epoch, int32_t *input_ids,
                              int32_t *labels, int32_t *length);

/* count samples (e.g. a slice of hvd_sampler_epoch's indices) laid out
 * for bert_batch_t: input_ids, labels and token_type_ids (may be NULL;
 * set to 0) get count x seq_len entries, lengths count. */
hvd_result_t bert_dataset_batch(const bert_dataset_t *d, const int64_t *indices,
                                int count, int64_t epoch, int32_t *input_ids,
                                int32_t *token_type_ids, int32_t *labels,
                                int32_t *lengths);

/* The masking above on one sequence of len tokens (specials included;
 * they are never chosen), into input_ids and labels (len each). tokens
 * may be input_ids (masking in place), not labels. */
void bert_mask_tokens(const int32_t *tokens, int len, int vocab_size,
                      double mask_prob, uint64_t seed, int64_t index,
                      int64_t epoch, int32_t *input_ids, int32_t *labels);

/* The synthetic corpus: `sentences` lines from (seed), NUL-terminated
 * into *text (malloc'ed; the caller frees), *len bytes without the NUL.
 * Its vocabulary has about 110 words. */
hvd_result_t bert_synthetic_corpus(uint64_t seed, int64_t sentences,
                                   char **text, size_t *len);

#endif /* BERT_DATA_H */
