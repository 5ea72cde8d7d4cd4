/*
 * big_gather.c - the program of big.sh (not a test itself): a grouped
 * allgather whose rows add up to more bytes than one MPI call's int
 * counts reach, though each member alone is gathered in rows. np 2: two
 * uint8 members, "A" and "B"; rank 0 has 1 row of each, rank 1
 * 1,200,000,000 (2.4 GB in all). Before, the fused group failed with
 * "a fused allgather of 2400000002 bytes exceeds MPI's int counts"; now
 * each member is gathered on its own. Twice: through the coordinator,
 * then through the response cache. Prints "big_gather[R]: round K ok"
 * per round, or what was wrong, and exits 0 when every check held.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"

#define ROWS 1200000000LL

static int check(int R, int k, const hvd_tensor_t *r) {
  for (int i = 0; i < 2; i++) {
    const unsigned char *d = r[i].data;
    if (r[i].shape[0] != ROWS + 1) {
      printf("big_gather[%d]: round %d: member %d has %lld rows\n", R, k, i,
             (long long)r[i].shape[0]);
      return 0;
    }
    /* row 0 is rank 0's, rows 1.. rank 1's */
    const int64_t at[4] = {1, ROWS / 2, ROWS - 1, ROWS};
    if (d[0] != (unsigned char)('a' + i))
      return printf("big_gather[%d]: round %d: row 0 wrong\n", R, k), 0;
    for (int j = 0; j < 4; j++)
      if (d[at[j]] != (unsigned char)('a' + i + 1)) {
        printf("big_gather[%d]: round %d: member %d row %lld wrong\n", R, k, i,
               (long long)at[j]);
        return 0;
      }
  }
  return 1;
}

int main(void) {
  if (hvd_init() != HVD_SUCCESS || hvd_size() != 2) {
    fprintf(stderr, "big_gather: hvd_init at np 2: %s\n", hvd_last_error());
    return 2;
  }
  int R = hvd_rank(), good = 1;
  int64_t n = R == 0 ? 1 : ROWS;
  const char *names[2] = {"A", "B"};
  hvd_tensor_t s[2], r[2];
  for (int i = 0; i < 2; i++) {
    void *d = malloc((size_t)n);
    if (d == NULL)
      return fprintf(stderr, "big_gather: no memory\n"), 2;
    memset(d, 'a' + i + R, (size_t)n);
    s[i] = hvd_tensor_make(d, HVD_UINT8, 1, &n);
  }
  for (int k = 0; k < 2; k++) {
    memset(r, 0, sizeof r);
    hvd_result_t rc = hvd_grouped_allgather(2, names, s, r);
    if (rc != HVD_SUCCESS) {
      printf("big_gather[%d]: round %d: rc %d: %s\n", R, k, (int)rc,
             hvd_last_error());
      good = 0;
      break;
    }
    if (check(R, k, r))
      printf("big_gather[%d]: round %d ok\n", R, k);
    else
      good = 0;
    for (int i = 0; i < 2; i++)
      hvd_tensor_free(&r[i]);
  }
  fflush(stdout);
  for (int i = 0; i < 2; i++)
    free(s[i].data);
  hvd_shutdown();
  return good ? 0 : 1;
}
