/*
 * splitmix.h - splitmix64 (Steele, Lea and Flood), the one small
 * deterministic generator of lib/: the sampler's permutation and
 * PowerSGD's random Q draw from it, so that every rank given the same
 * seed gets the same numbers.
 */
#ifndef HVD_BASE_SPLITMIX_H
#define HVD_BASE_SPLITMIX_H

#include <stdint.h>

/* The next value of the sequence whose state is *state. */
static inline uint64_t hvd__splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

#endif /* HVD_BASE_SPLITMIX_H */
