/*
 * rows_total.c - hvd__rows_total (lib/base/tensor.h), the first dimension
 * of an allgather's output (the ranks' first dimensions summed) and of an
 * alltoall's (the splits sent to one rank summed), at its exact limits:
 *  - the sum itself: INT64_MAX rows of 0 bytes (a [n, 0] tensor) fit,
 *    one more does not; so for 2 and 3 ranks, where 3 x INT64_MAX used to
 *    wrap to INT64_MAX - 2, a positive count (3 x 2^62 wraps negative);
 *  - the output's bytes: PTRDIFF_MAX bytes of uint8 rows fit, one more
 *    row does not; float32 rows of 4 elements: the largest count whose
 *    bytes fit, and one more; a product of the other dimensions that
 *    wraps with a sum that does not;
 *  - a negative count and a shape without a first dimension are refused;
 *    *total is left alone whenever the answer is 0.
 */
#include <stdint.h>
#include <stdlib.h>

#include "base/tensor.h"
#include "tap.h"

/* hvd__rows_total over n counts, the output shaped [sum, d1] (ndim 2)
 * of dtype; *total -7 until it is set. */
static int total_of(const int64_t *rows, int n, hvd_dtype_t dtype, int64_t d1,
                    int64_t *total) {
  int64_t shape[2] = {-1, d1};
  *total = -7;
  return hvd__rows_total(rows, n, dtype, 2, shape, total);
}

int main(void) {
  const int64_t max = INT64_MAX, pmax = PTRDIFF_MAX;
  int64_t t;
  plan(22);

  int64_t two[2] = {max - 5, 5};
  is_int(1, total_of(two, 2, HVD_FLOAT32, 0, &t),
         "0-byte rows: INT64_MAX - 5 + 5 fits");
  ok(t == max, "... its sum is INT64_MAX");
  two[1] = 6;
  is_int(0, total_of(two, 2, HVD_FLOAT32, 0, &t),
         "0-byte rows: INT64_MAX - 5 + 6 does not");
  ok(t == -7, "... and *total is left alone");
  int64_t half[2] = {(int64_t)1 << 62, ((int64_t)1 << 62) - 1};
  is_int(1, total_of(half, 2, HVD_INT8, 0, &t), "2^62 + 2^62 - 1 fits");
  ok(t == max, "... INT64_MAX");
  half[1] = (int64_t)1 << 62;
  is_int(0, total_of(half, 2, HVD_INT8, 0, &t), "2^62 + 2^62 does not");
  int64_t three[3] = {max, max, max};
  is_int(0, total_of(three, 3, HVD_FLOAT32, 0, &t),
         "3 x INT64_MAX (wrapped, INT64_MAX - 2) does not");
  int64_t quarters[3] = {(int64_t)1 << 62, (int64_t)1 << 62, (int64_t)1 << 62};
  is_int(0, total_of(quarters, 3, HVD_FLOAT32, 0, &t),
         "3 x 2^62 (wrapped, negative) does not");

  int64_t bytes[2] = {pmax - 1000, 1000};
  is_int(1, total_of(bytes, 2, HVD_UINT8, 1, &t),
         "uint8 rows of 1: PTRDIFF_MAX bytes fit");
  ok(t == pmax, "... PTRDIFF_MAX rows");
  bytes[1] = 1001;
  is_int(0, total_of(bytes, 2, HVD_UINT8, 1, &t), "... one row more does not");
  /* float32 rows of 4: 16 bytes each, at most PTRDIFF_MAX / 16 rows */
  int64_t most = pmax / 16,
          f32[3] = {most / 3, most / 3, most - 2 * (most / 3)};
  is_int(1, total_of(f32, 3, HVD_FLOAT32, 4, &t),
         "float32 rows of 4 over 3 ranks: PTRDIFF_MAX / 16 rows fit");
  ok(t == most, "... their sum");
  f32[2]++;
  is_int(0, total_of(f32, 3, HVD_FLOAT32, 4, &t), "... one row more does not");
  int64_t wide[2] = {1, 1};
  is_int(0, total_of(wide, 2, HVD_FLOAT64, (int64_t)1 << 60, &t),
         "2 rows of 2^60 float64 (the bytes wrap) do not");
  is_int(1, total_of(wide, 2, HVD_FLOAT64, (int64_t)1 << 58, &t),
         "2 rows of 2^58 float64 (2^62 bytes) fit");

  int64_t neg[2] = {3, -1};
  is_int(0, total_of(neg, 2, HVD_FLOAT32, 1, &t), "a negative count: refused");
  int64_t none[1] = {0};
  is_int(1, total_of(none, 1, HVD_FLOAT32, 1, &t), "one rank of 0 rows fits");
  ok(t == 0, "... 0 rows");
  is_int(1, hvd__rows_total(NULL, 0, HVD_FLOAT32, 1, (int64_t[]){9}, &t),
         "no ranks: 0 rows");
  is_int(0, hvd__rows_total(none, 1, HVD_FLOAT32, 0, NULL, &t),
         "an output without a first dimension: refused");
  return tap_exit_status();
}
