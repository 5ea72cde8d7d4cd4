/*
 * sampler.c - hvd_sampler against torch.utils.data.DistributedSampler's
 * rules: sizes with and without drop_last, the exact order without
 * shuffle, padding by repeating the start (more than once when the
 * dataset is smaller than the world), shards that interleave back into
 * one list (a permutation of the dataset, then its start again), a new
 * order every epoch that depends only on (seed, epoch), the documented
 * PRNG (splitmix64 + Fisher-Yates, rebuilt here independently), and the
 * argument checks. One process, no hvd_init.
 */
#include "hvd.h"
#include "tap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every rank's shard, interleaved back into the list they came from:
 * list[r + k * P] = shard_r[k]. Returns the list (malloc'd; *len entries)
 * or NULL if some call failed. */
static int64_t *gather(int64_t size, int ranks, int shuffle, uint64_t seed,
                       int drop_last, int64_t epoch, int64_t *len) {
  int64_t num = -1, *list = NULL;
  for (int r = 0; r < ranks; r++) {
    hvd_sampler_t *s = NULL;
    const int64_t *idx = NULL;
    int64_t count = -1;
    if (hvd_sampler_create(size, ranks, r, shuffle, seed, drop_last, &s) !=
            HVD_SUCCESS ||
        hvd_sampler_epoch(s, epoch, &idx, &count) != HVD_SUCCESS ||
        count != hvd_sampler_num_samples(s) || (r > 0 && count != num)) {
      hvd_sampler_destroy(s);
      free(list);
      return NULL;
    }
    if (r == 0) {
      num = count;
      list = malloc((size_t)(num * ranks + 1) * sizeof *list);
    }
    for (int64_t k = 0; k < count; k++)
      list[r + k * ranks] = idx[k];
    hvd_sampler_destroy(s);
  }
  *len = num * ranks;
  return list;
}

/* The list is order[p % N] for a permutation `order` of 0..N-1 (identity
 * without shuffle) and p < len: the first min(N, len) entries are distinct
 * and in range, the rest repeat from the start. */
static int well_formed(const int64_t *list, int64_t len, int64_t size,
                       int shuffle) {
  char *seen = calloc((size_t)size + 1, 1);
  int good = 1;
  for (int64_t p = 0; p < len && good; p++) {
    int64_t x = list[p];
    if (p < size) {
      good = x >= 0 && x < size && !seen[x] && (shuffle || x == p);
      if (good)
        seen[x] = 1;
    } else
      good = x == list[p % size];
  }
  free(seen);
  return good;
}

/* The PRNG as documented at the top of lib/optim/sampler.c, written
 * again here. */
static uint64_t ref_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void ref_perm(int64_t *order, int64_t n, uint64_t seed, int64_t epoch) {
  uint64_t state = seed + (uint64_t)epoch;
  for (int64_t i = 0; i < n; i++)
    order[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t bound = (uint64_t)i + 1, x;
    do
      x = ref_next(&state);
    while (x < (0 - bound) % bound);
    int64_t j = (int64_t)(x % bound), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

static int same(const int64_t *a, const int64_t *b, int64_t n) {
  return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* One rank's shard as a string, e.g. "0 3 6 9". */
static const char *shard(int64_t size, int ranks, int rank, int shuffle,
                         int drop_last) {
  static char buf[256];
  hvd_sampler_t *s = NULL;
  const int64_t *idx = NULL;
  int64_t count = 0;
  buf[0] = '\0';
  if (hvd_sampler_create(size, ranks, rank, shuffle, 0, drop_last, &s) != 0 ||
      hvd_sampler_epoch(s, 0, &idx, &count) != 0)
    snprintf(buf, sizeof buf, "error: %s", hvd_last_error());
  for (int64_t k = 0, at = 0; k < count; k++)
    at += snprintf(buf + at, sizeof buf - (size_t)at, "%s%lld", k ? " " : "",
                   (long long)idx[k]);
  hvd_sampler_destroy(s);
  return buf;
}

static int64_t num_samples(int64_t size, int ranks, int drop_last) {
  hvd_sampler_t *s = NULL;
  if (hvd_sampler_create(size, ranks, 0, 1, 7, drop_last, &s) != 0)
    return -2;
  int64_t n = hvd_sampler_num_samples(s);
  hvd_sampler_destroy(s);
  return n;
}

/* hvd_sampler_epoch_from: for every world size, drop_last and position,
 * the ranks' lists together are the rest of the epoch's order, each entry
 * once (plus the padding, which repeats the rest's start); position 0 is
 * hvd_sampler_epoch; with drop_last, at an unchanged world size, a
 * position that is a multiple of it gives the tail of each rank's whole
 * list (padding, without drop_last, repeats the rest's start instead). */
static void test_from(void) {
  enum { N = 103 };
  static const int64_t froms[] = {0, 7, 8, 50, 101, 102, 103};
  int bad = 0, cases = 0;
  for (int P = 1; P <= 4; P++)
    for (int drop = 0; drop <= 1; drop++)
      for (size_t f = 0; f < sizeof froms / sizeof froms[0]; f++) {
        int64_t from = froms[f], rest = N - from;
        int64_t order[N], seen[N] = {0}, total = 0, whole_n = 0;
        hvd_sampler_t *one = NULL;
        const int64_t *o;
        if (hvd_sampler_create(N, 1, 0, 1, 77, 0, &one) != HVD_SUCCESS ||
            hvd_sampler_epoch(one, 2, &o, &whole_n) != HVD_SUCCESS)
          bail("whole order: %s", hvd_last_error());
        memcpy(order, o, sizeof order);
        hvd_sampler_destroy(one);
        int64_t want = drop ? rest / P : (rest + P - 1) / P;
        for (int r = 0; r < P; r++) {
          hvd_sampler_t *s = NULL;
          const int64_t *idx, *all;
          int64_t count = -1, n_all = 0;
          cases++;
          if (hvd_sampler_create(N, P, r, 1, 77, drop, &s) != HVD_SUCCESS ||
              hvd_sampler_epoch_from(s, 2, from, &idx, &count) !=
                  HVD_SUCCESS) {
            bad++;
            continue;
          }
          if (count != want)
            bad++, diag("P %d drop %d from %lld rank %d: %lld indices, not "
                        "%lld", P, drop, (long long)from, r, (long long)count,
                        (long long)want);
          for (int64_t k = 0; k < count; k++) {
            int64_t pos = r + k * P; /* of the rest */
            if (idx[k] != order[from + pos % (rest > 0 ? rest : 1)])
              bad++;
            if (pos < rest)
              seen[from + pos]++, total++;
          }
          int64_t copy[N];
          memcpy(copy, idx, (size_t)count * sizeof *idx);
          if (hvd_sampler_epoch(s, 2, &all, &n_all) != HVD_SUCCESS)
            bad++;
          if (from == 0 && (n_all != count || !same(copy, all, count)))
            bad++, diag("from 0 is not hvd_sampler_epoch (P %d)", P);
          if (from % P == 0 && drop && from / P <= n_all &&
              (count != n_all - from / P ||
               !same(copy, all + from / P, count)))
            bad++, diag("P %d from %lld: not the tail of rank %d's list", P,
                        (long long)from, r);
          hvd_sampler_destroy(s);
        }
        for (int64_t i = from; i < N; i++)
          if (seen[i] != (drop && i >= from + (rest / P) * P ? 0 : 1))
            bad++, diag("P %d drop %d from %lld: position %lld taken %lld "
                        "times", P, drop, (long long)from, (long long)i,
                        (long long)seen[i]);
        (void)total;
      }
  is_int(0, bad, "epoch_from: %d cases (world sizes 1-4, drop_last or not, 7 "
                 "positions): the rest of the order once, position 0 as "
                 "hvd_sampler_epoch, the tail at an unchanged world size (drop_last)",
         cases);
}

int main(void) {
  /* sizes: torch's num_samples */
  is_int(4, num_samples(10, 3, 0), "N=10 P=3: 4 per rank (2 padded)");
  is_int(3, num_samples(10, 3, 1), "N=10 P=3 drop_last: 3 per rank");
  is_int(5, num_samples(10, 2, 0), "N=10 P=2: 5 per rank");
  is_int(5, num_samples(10, 2, 1), "N=10 P=2 drop_last: 5 per rank");
  is_int(1, num_samples(2, 5, 0), "N=2 P=5: 1 per rank (3 padded)");
  is_int(0, num_samples(2, 5, 1), "N=2 P=5 drop_last: 0 per rank");
  is_int(0, num_samples(0, 4, 0), "N=0: 0 per rank");
  is_int(7, num_samples(7, 1, 1), "N=7 P=1: 7");
  is_int(-1, hvd_sampler_num_samples(NULL), "num_samples(NULL) is -1");

  /* without shuffle: torch's exact order */
  is_string("0 3 6 9", shard(10, 3, 0, 0, 0), "N=10 P=3 rank 0");
  is_string("1 4 7 0", shard(10, 3, 1, 0, 0), "N=10 P=3 rank 1 (padded)");
  is_string("2 5 8 1", shard(10, 3, 2, 0, 0), "N=10 P=3 rank 2 (padded)");
  is_string("0 3 6", shard(10, 3, 0, 0, 1), "N=10 P=3 drop_last rank 0");
  is_string("1 4 7", shard(10, 3, 1, 0, 1), "N=10 P=3 drop_last rank 1");
  is_string("2 5 8", shard(10, 3, 2, 0, 1), "N=10 P=3 drop_last rank 2");
  is_string("0 2", shard(3, 2, 0, 0, 0) /* [0 1 2 0] */, "N=3 P=2 rank 0");
  is_string("1 0", shard(3, 2, 1, 0, 0), "N=3 P=2 rank 1 (padded)");
  is_string("0", shard(2, 5, 2, 0, 0), "N=2 P=5 rank 2: padding repeats");
  is_string("1", shard(2, 5, 3, 0, 0), "N=2 P=5 rank 3: ... the start");
  is_string("0", shard(2, 5, 4, 0, 0), "N=2 P=5 rank 4: ... again");
  is_string("", shard(2, 5, 4, 0, 1), "N=2 P=5 drop_last rank 4: none");
  is_string("", shard(0, 3, 1, 1, 0), "N=0 shuffled: none");

  /* shards interleave into one well-formed list, shuffled or not */
  static const struct {
    int64_t size;
    int ranks;
  } cases[] = {{10, 3}, {10, 2},  {1, 1},    {1, 4}, {2, 5},
               {7, 7},  {100, 8}, {1000, 3}, {13, 4}};
  int bad = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int shuffle = 0; shuffle < 2; shuffle++)
      for (int drop = 0; drop < 2; drop++)
        for (int64_t epoch = 0; epoch < 3; epoch++) {
          int64_t n = cases[c].size, len = -1;
          int p = cases[c].ranks;
          int64_t *list = gather(n, p, shuffle, 42, drop, epoch, &len);
          int64_t want = drop ? n / p * p : (n + p - 1) / p * p;
          if (list == NULL || len != want ||
              !well_formed(list, len, n, shuffle)) {
            diag("N=%lld P=%d shuffle %d drop_last %d epoch %lld: bad list",
                 (long long)n, p, shuffle, drop, (long long)epoch);
            bad++;
          }
          free(list);
        }
  is_int(0, bad,
         "every shard set covers the dataset, disjoint up to the "
         "exact padding (36 cases x 3 epochs)");

  /* the documented PRNG */
  uint64_t st = 0;
  ok(ref_next(&st) == 0xe220a8397b1dcdafull,
     "reference splitmix64(0) is the published first value");
  int64_t len = 0, ref[1000];
  int64_t *l0 = gather(1000, 1, 1, 1234, 0, 5, &len);
  ref_perm(ref, 1000, 1234, 5);
  ok(l0 && len == 1000 && same(l0, ref, 1000),
     "shuffle = splitmix64(seed + epoch) + Fisher-Yates, as documented");
  int64_t *l0b = gather(1000, 1, 1, 1235, 0, 4, &len);
  ok(l0 && l0b && same(l0, l0b, 1000),
     "the order depends on seed + epoch only (torch's seed + epoch)");
  free(l0b);
  free(l0);

  /* per epoch: a new order; the same one again for the same epoch */
  int64_t *e0 = gather(100, 4, 1, 9, 0, 0, &len);
  int64_t *e1 = gather(100, 4, 1, 9, 0, 1, &len);
  int64_t *e0b = gather(100, 4, 1, 9, 0, 0, &len);
  int64_t *other = gather(100, 4, 1, 10, 0, 0, &len);
  ok(e0 && e1 && !same(e0, e1, 100), "epoch 1's order differs from epoch 0's");
  ok(e0 && e0b && same(e0, e0b, 100), "epoch 0 again: the same order");
  ok(e0 && other && !same(e0, other, 100), "another seed: another order");
  free(e0);
  free(e1);
  free(e0b);
  free(other);

  /* one sampler: epochs in any order, each the same as a fresh sampler's */
  hvd_sampler_t *s = NULL;
  const int64_t *idx = NULL;
  int64_t count = 0, first[25];
  is_int(HVD_SUCCESS, hvd_sampler_create(100, 4, 2, 1, 9, 0, &s), "create");
  is_int(HVD_SUCCESS, hvd_sampler_epoch(s, 3, &idx, &count), "epoch 3");
  is_int(25, count, "... 25 indices");
  memcpy(first, idx, sizeof first);
  hvd_sampler_epoch(s, 4, &idx, &count);
  ok(!same(first, idx, 25), "epoch 4 on the same sampler: another order");
  hvd_sampler_epoch(s, 3, &idx, &count);
  ok(same(first, idx, 25), "epoch 3 again: the same indices");
  int64_t *full = gather(100, 4, 1, 9, 0, 3, &len);
  int match = full != NULL;
  for (int k = 0; k < 25 && match; k++)
    match = full[2 + 4 * k] == first[k];
  ok(match, "rank 2's shard is every 4th index of the list from 2");
  free(full);

  /* argument checks */
  hvd_sampler_t *bad_s = (hvd_sampler_t *)&count;
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_create(-1, 2, 0, 1, 0, 0, &bad_s),
         "dataset_size -1");
  is_string("hvd_sampler_create: dataset_size -1 is negative", hvd_last_error(),
            "... message");
  ok(bad_s == NULL, "... *out is NULL");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_create(10, 0, 0, 1, 0, 0, &bad_s),
         "ranks 0");
  is_string("hvd_sampler_create: ranks 0 must be at least 1", hvd_last_error(),
            "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_create(10, 3, 3, 1, 0, 0, &bad_s),
         "rank 3 of 3");
  is_string("hvd_sampler_create: rank 3 is out of range for 3 ranks",
            hvd_last_error(), "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_create(10, 3, -1, 1, 0, 0, &bad_s),
         "rank -1");
  is_string("hvd_sampler_create: rank -1 is out of range for 3 ranks",
            hvd_last_error(), "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_create(10, 3, 0, 1, 0, 0, NULL),
         "out NULL");
  is_string("hvd_sampler_create: out is NULL", hvd_last_error(), "... message");
  const int64_t *keep = idx;
  int64_t keep_count = count;
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_epoch(s, -1, &idx, &count),
         "epoch -1");
  is_string("hvd_sampler_epoch: epoch -1 is negative", hvd_last_error(),
            "... message");
  ok(idx == keep && count == keep_count && same(first, idx, 25),
     "... the outputs and the last epoch's indices are untouched");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_epoch(NULL, 0, &idx, &count),
         "sampler NULL");
  is_string("hvd_sampler_epoch: sampler is NULL", hvd_last_error(),
            "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_epoch(s, 0, NULL, &count),
         "indices NULL");
  is_string("hvd_sampler_epoch: indices is NULL", hvd_last_error(),
            "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_sampler_epoch(s, 0, &idx, NULL),
         "count NULL");
  is_string("hvd_sampler_epoch: count is NULL", hvd_last_error(),
            "... message");
  hvd_sampler_t *s25 = NULL;
  hvd_sampler_create(25, 2, 1, 1, 5, 0, &s25);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_sampler_epoch_from(s25, 0, 26, &idx, &count),
         "from past the end");
  is_string("hvd_sampler_epoch_from: position 26 is outside the epoch's 25 "
            "samples",
            hvd_last_error(), "... message");
  is_int(HVD_ERR_INVALID_ARG,
         hvd_sampler_epoch_from(s25, 0, -1, &idx, &count), "from negative");
  hvd_sampler_destroy(s25);
  hvd_sampler_destroy(s);
  hvd_sampler_destroy(NULL);
  ok(1, "destroy accepts NULL");
  test_from();
  done_testing();
  return tap_exit_status();
}
