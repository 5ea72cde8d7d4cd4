/*
 * checksum.c - hvd__sum64 (lib/base/checksum.h), the checksum of
 * checkpoint files from format version 4 and of hvd_broadcast_parameters'
 * verification:
 *  - it is the definition in checksum.h and doc/checkpoint-format.md,
 *    as t/util/hvdtest.c's plain second implementation (hvdt_sum64)
 *    computes it a word at a time from the bytes, for lengths 0 to 200;
 *  - added in pieces, split at every place, it is the one-call sum;
 *  - one byte changed anywhere in 1 KiB (every byte, every bit) changes
 *    it, and so does a zero byte more (the length is in it).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "hvdtest.h"
#include "tap.h"

int main(void) {
  unsigned char buf[1024];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (unsigned char)((i * 131 + 7) ^ (i >> 3));
  plan(5);

  int good = 1;
  for (size_t n = 0; n <= 200; n++)
    good &= hvd__sum64(buf, n) == hvdt_sum64(buf, n);
  ok(good, "the documented definition, for 0 to 200 bytes");

  good = 1;
  for (size_t n = 0; n <= 200 && good; n += 7)
    for (size_t cut = 0; cut <= n; cut++) {
      hvd__sum_t s;
      hvd__sum_init(&s);
      hvd__sum_add(&s, buf, cut / 2);
      hvd__sum_add(&s, buf + cut / 2, cut - cut / 2);
      hvd__sum_add(&s, buf + cut, n - cut);
      good &= hvd__sum_end(&s) == hvd__sum64(buf, n);
    }
  ok(good, "added in three pieces, cut at every place: the one-call sum");

  const uint64_t whole = hvd__sum64(buf, sizeof buf);
  int all = 1;
  for (size_t i = 0; i < sizeof buf; i++)
    for (int bit = 0; bit < 8; bit++) {
      buf[i] ^= (unsigned char)(1u << bit);
      all &= hvd__sum64(buf, sizeof buf) != whole;
      buf[i] ^= (unsigned char)(1u << bit);
    }
  ok(all, "every one of the 8192 single-bit changes of 1 KiB changes it");
  unsigned char more[1025];
  memcpy(more, buf, sizeof buf);
  more[1024] = 0;
  ok(hvd__sum64(more, sizeof more) != whole,
     "a zero byte more changes it (the length is in it)");
  ok(hvd__sum64(buf, 0) != hvd__sum64(more + 1024, 1),
     "no bytes and one zero byte differ");
  return tap_exit_status();
}
