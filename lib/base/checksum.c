/*
 * checksum.c - hvd__sum (checksum.h).
 */
#include "base/checksum.h"
#include "base/le.h"

#include <string.h>

#define K1 0x9e3779b97f4a7c15ull /* 2^64 / the golden ratio, odd */
#define K2 0xbf58476d1ce4e5b9ull /* splitmix64's multipliers */
#define K3 0x94d049bb133111ebull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t mix(uint64_t z) { /* splitmix64's finalizer */
  z = (z ^ (z >> 30)) * K2;
  z = (z ^ (z >> 27)) * K3;
  return z ^ (z >> 31);
}

/* Whole 32-byte blocks of p (n a multiple of 32). */
static void blocks(uint64_t lane[4], const unsigned char *p, size_t n) {
  uint64_t a = lane[0], b = lane[1], c = lane[2], d = lane[3], w[4];
  const int le = hvd__host_is_le();
  for (size_t at = 0; at < n; at += 32) {
    if (le)
      memcpy(w, p + at, 32);
    else
      for (int k = 0; k < 4; k++)
        w[k] = hvd__get_le(p + at + 8 * k, 8);
    a = rotl(a + w[0] * K2, 31) * K1;
    b = rotl(b + w[1] * K2, 31) * K1;
    c = rotl(c + w[2] * K2, 31) * K1;
    d = rotl(d + w[3] * K2, 31) * K1;
  }
  lane[0] = a, lane[1] = b, lane[2] = c, lane[3] = d;
}

void hvd__sum_init(hvd__sum_t *s) {
  for (int k = 0; k < 4; k++)
    s->lane[k] = K1 * (uint64_t)(k + 1);
  s->ntail = 0;
  s->bytes = 0;
}

void hvd__sum_add(hvd__sum_t *s, const void *p, size_t n) {
  const unsigned char *b = p;
  s->bytes += n;
  if (s->ntail > 0) {
    size_t k = 32 - s->ntail < n ? 32 - s->ntail : n;
    memcpy(s->tail + s->ntail, b, k);
    s->ntail += k;
    b += k;
    n -= k;
    if (s->ntail < 32)
      return;
    blocks(s->lane, s->tail, 32);
    s->ntail = 0;
  }
  size_t whole = n / 32 * 32;
  blocks(s->lane, b, whole);
  memcpy(s->tail, b + whole, n - whole);
  s->ntail = n - whole;
}

uint64_t hvd__sum_end(const hvd__sum_t *s) {
  uint64_t lane[4] = {s->lane[0], s->lane[1], s->lane[2], s->lane[3]};
  if (s->ntail > 0) {
    unsigned char last[32] = {0};
    memcpy(last, s->tail, s->ntail);
    blocks(lane, last, 32);
  }
  uint64_t h = mix(s->bytes ^ K3);
  for (int k = 0; k < 4; k++)
    h = mix(h ^ lane[k]);
  return h;
}

uint64_t hvd__sum64(const void *p, size_t n) {
  hvd__sum_t s;
  hvd__sum_init(&s);
  hvd__sum_add(&s, p, n);
  return hvd__sum_end(&s);
}
