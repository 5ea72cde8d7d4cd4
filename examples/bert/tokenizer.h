/*
 * tokenizer.h - a deterministic word-level tokenizer for the BERT example.
 *
 * A word is a maximal run of ASCII letters and digits, lowercased; every
 * other byte separates words (and is dropped). Ids 0..4 are the special
 * tokens; the vocabulary built from a corpus lists the words by count,
 * most frequent first, ties in strcmp order, up to a maximum size. A word
 * outside the vocabulary is [UNK].
 *
 * Vocabulary file: one token per line, the line number (from 0) is the
 * id, the first five lines are the special tokens (as Hugging Face's
 * vocab.txt, so such a file reads in Python as well).
 *
 * Calls that can fail return hvd_result_t and set bert_last_error().
 * A vocabulary is immutable once built: share it between threads freely.
 */
#ifndef BERT_TOKENIZER_H
#define BERT_TOKENIZER_H

#include "hvd.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

#define BERT_PAD_ID 0
#define BERT_UNK_ID 1
#define BERT_CLS_ID 2
#define BERT_SEP_ID 3
#define BERT_MASK_ID 4
#define BERT_NUM_SPECIAL 5 /* ids below this are special tokens */

typedef struct bert_vocab bert_vocab_t;

/* Counts the words of text[0..len) and builds the vocabulary: the five
 * special tokens, then the words, at most max_size tokens in all
 * (max_size <= 0: no cap; else at least BERT_NUM_SPECIAL + 1).
 * HVD_ERR_INVALID_ARG when the text has no word. Free with
 * bert_vocab_destroy. */
hvd_result_t bert_vocab_build(const char *text, size_t len, int max_size,
                              bert_vocab_t **out);
/* Writes the vocabulary file atomically (path.tmp, then rename). */
hvd_result_t bert_vocab_save(const bert_vocab_t *v, const char *path);
/* Reads a vocabulary file: HVD_ERR_IO when it cannot be read,
 * HVD_ERR_CORRUPT (naming the line) when it is not a vocabulary. */
hvd_result_t bert_vocab_load(const char *path, bert_vocab_t **out);
void bert_vocab_destroy(bert_vocab_t *v); /* accepts NULL */

int bert_vocab_size(const bert_vocab_t *v);
/* The token of id ("[UNK]" etc. for specials), or NULL out of range. */
const char *bert_vocab_token(const bert_vocab_t *v, int id);
/* The id of word[0..len) (lowercased first), or BERT_UNK_ID. */
int bert_vocab_id(const bert_vocab_t *v, const char *word, size_t len);

/* The ids of the words of text[0..len), in order, into *ids (malloc'ed,
 * the caller frees; NULL when *n is 0). */
hvd_result_t bert_tokenize(const bert_vocab_t *v, const char *text, size_t len,
                           int32_t **ids, int64_t *n);

#endif /* BERT_TOKENIZER_H */
