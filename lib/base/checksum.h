/*
 * checksum.h - a 64-bit checksum of bytes at memory speed, for what hvd
 * compares or stores in bulk (checkpoint files from version 4, the
 * parameters that hvd_broadcast_parameters verifies). FNV-1a, a multiply
 * per byte in one chain, runs at ~0.5 GB/s; this takes the bytes as
 * little-endian 64-bit words, word k into lane k % 4:
 *
 *   lane = rotl64(lane + w * K2, 31) * K1
 *
 * (lanes seeded apart), zero-pads the last partial block, then folds the
 * byte count and each lane in turn through splitmix64's finalizer. Every
 * step is a bijection of the lane, and the fold of each lane, so any
 * change confined to one word, or to the length, changes the sum; beyond
 * that it mixes well enough for corruption, not against an adversary.
 */
#ifndef HVD_BASE_CHECKSUM_H
#define HVD_BASE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

typedef struct hvd__sum {
  uint64_t lane[4];
  unsigned char tail[32]; /* bytes short of a whole block */
  size_t ntail;
  uint64_t bytes; /* all added */
} hvd__sum_t;

void hvd__sum_init(hvd__sum_t *s);
void hvd__sum_add(hvd__sum_t *s, const void *p, size_t n);
uint64_t hvd__sum_end(const hvd__sum_t *s); /* s stays as it was */
/* The sum of p[0..n) in one call. */
uint64_t hvd__sum64(const void *p, size_t n);

#endif /* HVD_BASE_CHECKSUM_H */
