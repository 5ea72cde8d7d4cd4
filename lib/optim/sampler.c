/*
 * sampler.c - each rank's shard of a dataset's indices, with the
 * semantics of torch.utils.data.DistributedSampler:
 *
 *   num_samples = drop_last ? floor(N / P) : ceil(N / P),  total = num_samples
 * * P order       = shuffle ? a permutation of 0..N-1 drawn from (seed + epoch)
 *                         : 0, 1, .., N-1
 *   list        = order[p % N] for p in 0..total-1  (padding repeats the
 *                 start, as often as needed; drop_last truncates)
 *   rank r      = list[r], list[r + P], list[r + 2P], ...
 *
 * From a position f of the epoch (hvd_sampler_epoch_from: f samples of
 * the order already trained on, at whatever world size), the same rule
 * applies to order[f..N-1] (padding repeats its start): with drop_last,
 * the world size unchanged and f a multiple of it, rank r's list is the
 * tail of its whole-epoch list.
 *
 * The permutation: splitmix64 seeded with seed + epoch (mod 2^64), then a
 * Fisher-Yates shuffle of 0..N-1 from the top: for i = N-1 down to 1, swap
 * i with j drawn uniformly from 0..i by rejection (draw x; reject while
 * x < 2^64 mod (i + 1); j = x mod (i + 1)). The order is therefore the same
 * on every rank and platform, but not torch's own (torch draws from its
 * Mersenne Twister).
 */
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/splitmix.h"

struct hvd_sampler {
  int64_t size;
  int ranks, rank, shuffle, drop_last;
  uint64_t seed;
  int64_t num_samples; /* per rank */
  int64_t *indices;    /* num_samples entries (at least 1 allocated) */
};

/* Uniform in 0..bound-1 (bound >= 1), without modulo bias. */
static uint64_t uniform(uint64_t *state, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
  for (;;) {
    uint64_t x = hvd__splitmix64(state);
    if (x >= threshold)
      return x % bound;
  }
}

hvd_result_t hvd_sampler_create(int64_t dataset_size, int ranks, int rank,
                                int shuffle, uint64_t seed, int drop_last,
                                hvd_sampler_t **out) {
  static const char fn[] = "hvd_sampler_create";
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", fn);
  *out = NULL;
  if (dataset_size < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: dataset_size %lld is negative", fn,
                          (long long)dataset_size);
  if (ranks < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: ranks %d must be at least 1", fn, ranks);
  if (rank < 0 || rank >= ranks)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: rank %d is out of range for %d ranks", fn, rank,
                          ranks);
  int64_t per = dataset_size / ranks;
  int64_t num = (drop_last || dataset_size % ranks == 0) ? per : per + 1;
  hvd_sampler_t *s = calloc(1, sizeof *s);
  if (s != NULL && (uint64_t)num < SIZE_MAX / sizeof(int64_t))
    s->indices = malloc((num > 0 ? (size_t)num : 1) * sizeof(int64_t));
  if (s == NULL || s->indices == NULL) {
    free(s);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: cannot allocate %lld indices",
                          fn, (long long)num);
  }
  s->size = dataset_size;
  s->ranks = ranks;
  s->rank = rank;
  s->shuffle = shuffle != 0;
  s->drop_last = drop_last != 0;
  s->seed = seed;
  s->num_samples = num;
  *out = s;
  return HVD_SUCCESS;
}

hvd_result_t hvd_sampler_epoch(hvd_sampler_t *s, int64_t epoch,
                               const int64_t **indices, int64_t *count) {
  return hvd_sampler_epoch_from(s, epoch, 0, indices, count);
}

/* The epoch's order (a permutation, or 0..n-1) from position `from` on:
 * the remaining m = n - from entries are padded (repeating their start)
 * or truncated to a multiple of P as at the start of an epoch, and rank r
 * takes every P-th from r. from 0 is hvd_sampler_epoch. */
hvd_result_t hvd_sampler_epoch_from(hvd_sampler_t *s, int64_t epoch,
                                    int64_t from, const int64_t **indices,
                                    int64_t *count) {
  static const char fn[] = "hvd_sampler_epoch";
  if (s == NULL || indices == NULL || count == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                          s == NULL         ? "sampler"
                          : indices == NULL ? "indices"
                                            : "count");
  if (epoch < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: epoch %lld is negative", fn,
                          (long long)epoch);
  if (from < 0 || from > s->size)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_sampler_epoch_from: position %lld is outside "
                          "the epoch's %lld samples",
                          (long long)from, (long long)s->size);
  int64_t n = s->size, p = s->ranks, num = s->num_samples, m = n - from;
  if (from > 0) /* the shard of what is left */
    num = (s->drop_last || m % p == 0) ? m / p : m / p + 1;
  int64_t *order = NULL;
  if (s->shuffle && num > 0) {
    if ((uint64_t)n >= SIZE_MAX / sizeof(int64_t) ||
        (order = malloc((size_t)n * sizeof(int64_t))) == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY,
                            "%s: cannot allocate a permutation of %lld "
                            "indices",
                            fn, (long long)n);
    uint64_t state = s->seed + (uint64_t)epoch;
    for (int64_t i = 0; i < n; i++)
      order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)uniform(&state, (uint64_t)i + 1);
      int64_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  /* position r + k * P of the padded/truncated rest; < total <= 2m */
  for (int64_t k = 0, pos = s->rank; k < num; k++, pos += p) {
    int64_t at = from + pos % m;
    s->indices[k] = order != NULL ? order[at] : at;
  }
  free(order);
  *indices = s->indices;
  *count = num;
  return HVD_SUCCESS;
}

int64_t hvd_sampler_num_samples(const hvd_sampler_t *s) {
  return s != NULL ? s->num_samples : -1;
}

void hvd_sampler_destroy(hvd_sampler_t *s) {
  if (s == NULL)
    return;
  free(s->indices);
  free(s);
}
