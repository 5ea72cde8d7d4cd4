/*
 * util.c - error messages and random numbers for the BERT example.
 */
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *bert_last_error(void) { return last_error; }

hvd_result_t bert__error(hvd_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return rc;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void bert__rng_seed(bert_rng_t *r, const uint64_t *words, int n) {
  uint64_t x = 0x6a09e667f3bcc908ULL; /* any fixed start */
  for (int i = 0; i < n; i++) {
    x ^= words[i];
    x = splitmix64(&x);
  }
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t bert__rng_next(bert_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double bert__rng_uniform(bert_rng_t *r) {
  return (double)(bert__rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t bert__rng_below(bert_rng_t *r, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* accept [0, limit) */
  uint64_t x;
  do
    x = bert__rng_next(r);
  while (x >= limit);
  return x % n;
}

double bert__rng_normal(bert_rng_t *r) {
  double u1 = bert__rng_uniform(r), u2 = bert__rng_uniform(r);
  if (u1 < 1e-300)
    u1 = 1e-300; /* log(0) */
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
