/*
 * le.h - little-endian bytes, whatever the host's order: what files and
 * checksums read and write (lib/base/checksum.c, the checkpoint format).
 */
#ifndef HVD_BASE_LE_H
#define HVD_BASE_LE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline int hvd__host_is_le(void) {
  const uint16_t one = 1;
  return *(const unsigned char *)&one == 1;
}

/* The low `bytes` bytes of v at p, least significant first. */
static inline void hvd__put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* The unsigned integer of `bytes` little-endian bytes at p. */
static inline uint64_t hvd__get_le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Copies elements of esize bytes between host order and little-endian
 * (the same operation both ways). */
static inline void hvd__copy_le(void *dst, const void *src, size_t bytes,
                                size_t esize) {
  if (hvd__host_is_le() || esize <= 1) {
    memcpy(dst, src, bytes);
    return;
  }
  unsigned char *d = dst;
  const unsigned char *s = src;
  for (size_t at = 0; at + esize <= bytes; at += esize)
    for (size_t b = 0; b < esize; b++)
      d[at + b] = s[at + esize - 1 - b];
}

#endif /* HVD_BASE_LE_H */
