/*
 * util.h - what the BERT example's files share: the per-thread error
 * message behind bert_last_error(), and the deterministic random numbers
 * (initialisation, masking, the synthetic corpus).
 */
#ifndef BERT_UTIL_H
#define BERT_UTIL_H

#include "hvd.h"

#include <stdint.h>

#if defined(__GNUC__)
#define BERT__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define BERT__PRINTF(f, a)
#endif

/* The message of the calling thread's last failed bert_* call (empty if
 * none). Owned by the library; valid until this thread's next failure. */
const char *bert_last_error(void);

/* Sets this thread's message and returns rc. */
hvd_result_t bert__error(hvd_result_t rc, const char *fmt, ...)
    BERT__PRINTF(2, 3);

/* xoshiro256** seeded through splitmix64: the same stream on every
 * platform, so initialisation and masking are reproducible anywhere. */
typedef struct bert_rng {
  uint64_t s[4];
} bert_rng_t;

/* Seeds from a list of words (e.g. seed, sample index, epoch): each word
 * is mixed in, so (1, 2) and (2, 1) give different streams. */
void bert__rng_seed(bert_rng_t *r, const uint64_t *words, int n);
uint64_t bert__rng_next(bert_rng_t *r);
/* Uniform in [0, 1) with 53 random bits. */
double bert__rng_uniform(bert_rng_t *r);
/* Uniform integer in [0, n), n > 0 (rejection sampling: unbiased). */
uint64_t bert__rng_below(bert_rng_t *r, uint64_t n);
/* Standard normal by Box-Muller (one value per call; the pair's second
 * value is discarded so that the stream position never depends on
 * history). */
double bert__rng_normal(bert_rng_t *r);

#endif /* BERT_UTIL_H */
