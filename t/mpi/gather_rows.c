/*
 * gather_rows.c - an allgather's or alltoall's output rows, summed from
 * the ranks' counts, at their limit; np 2 and 3. Rows of 0 bytes (shape
 * [n, 0]) let a rank claim any first dimension without memory, so the
 * sums reach INT64_MAX:
 *  - allgather of [INT64_MAX - (P - 1), 0] on rank 0 and [1, 0] on the
 *    others: their sum, INT64_MAX, fits (output [INT64_MAX, 0]); one row
 *    more on rank 0, or INT64_MAX on every rank (at np 3 that used to
 *    wrap to INT64_MAX - 2 and succeed with that shape; at np 2 to -2, an
 *    HVD_ERR_NO_MEMORY "output of 18446744073709551615 bytes"), is
 *    HVD_ERR_INVALID_ARG on every rank: "allgather 'ag.over': the first
 *    dimensions of the P ranks sum past the largest tensor (INT64_MAX
 *    rows, PTRDIFF_MAX bytes)";
 *  - a grouped allgather (one fused group) of a real float32 tensor and
 *    such an overflowing one: both members fail on every rank, each
 *    message naming the member that overflows ("tensor 'g.over' of its
 *    fused group: ..."); then an allgather works again;
 *  - alltoall where rank 0 sends INT64_MAX - (P - 1) rows of 0 bytes to
 *    the last rank and every other rank 1: the last rank receives
 *    INT64_MAX rows (its recv_splits exact); one more from rank 0 is
 *    HVD_ERR_INVALID_ARG on every rank, not only on the last (which got
 *    HVD_ERR_NO_MEMORY before while the others succeeded): "alltoall
 *    'a2a.over': rank P-1 would receive more rows than a tensor holds
 *    (...)"; on a process set of world ranks 1..P-1 (np 3) the message
 *    names the world rank.
 *  - alltoall of uint8 rows where the last rank would receive 2^31 + 1
 *    rows (rank 0 sends it 2^30 + 1, the last 2^30 to itself; the
 *    buffers mapped, never touched): past MPI's int counts on the last
 *    rank alone, which used to fail there while its peers waited in
 *    MPI_Alltoallv for good; now HVD_ERR_UNSUPPORTED on every rank,
 *    "alltoall 'a2a.ints': rank P-1 would send or receive more rows, or
 *    longer rows, than MPI's int counts"; then an alltoall works.
 *  - reducescatter of [2P, 6e8] uint8 (mapped, never touched): more
 *    than 2^31 - 1 elements, each block fewer; alike on every rank, so no
 *    rank is named (it once came through the allocations' agreement as
 *    "rank 0: ..."): "reducescatter 'rs.ints': a reducescatter of N
 *    elements exceeds MPI's int counts".
 */
#include "hvd.h"
#include "tap/tap.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static int rank, size;
static float dummy[8]; /* the data of 0-byte tensors */

static const char ag_why[] = "the first dimensions of the %d ranks sum past "
                             "the largest tensor (INT64_MAX rows, PTRDIFF_MAX "
                             "bytes)";

/* hvd_allgather of [rows, 0] float32 named name; *out its output's first
 * dimension (-1 when it failed). */
static hvd_result_t gather_empty(const char *name, int64_t rows, int64_t *out) {
  int64_t shape[2] = {rows, 0};
  hvd_tensor_t send = hvd_tensor_make(dummy, HVD_FLOAT32, 2, shape), recv;
  memset(&recv, 0, sizeof recv);
  hvd_result_t rc = hvd_allgather(name, &send, &recv);
  *out = rc == HVD_SUCCESS ? recv.shape[0] : -1;
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&recv);
  return rc;
}

static void allgather_limit(void) {
  char want[400], why[300];
  int64_t got = 0, r0 = INT64_MAX - (size - 1);
  is_int(HVD_SUCCESS, gather_empty("ag.fit", rank == 0 ? r0 : 1, &got),
         "allgather: first dimensions summing to INT64_MAX");
  ok(got == INT64_MAX, "... the output has INT64_MAX rows (%lld)",
     (long long)got);
  snprintf(why, sizeof why, ag_why, size);
  snprintf(want, sizeof want, "allgather 'ag.over': %s", why);
  hvd_result_t rc = gather_empty("ag.over", rank == 0 ? r0 + 1 : 1, &got);
  is_int(HVD_ERR_INVALID_ARG, rc, "... one row more: refused on every rank");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... naming the tensor");
  snprintf(want, sizeof want, "allgather 'ag.max': %s", why);
  rc = gather_empty("ag.max", INT64_MAX, &got);
  is_int(HVD_ERR_INVALID_ARG, rc,
         "INT64_MAX rows on every rank (wrapped to a positive count at np "
         "3): refused");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... naming the tensor");
}

/* A fused group: a real tensor and one whose rows overflow. */
static void grouped_limit(void) {
  float x[6] = {1, 2, 3, 4, 5, 6};
  int64_t real[2] = {2, 3}, empty[2] = {rank == 0 ? INT64_MAX : 1, 0};
  const char *names[2] = {"g.real", "g.over"};
  hvd_tensor_t sends[2] = {hvd_tensor_make(x, HVD_FLOAT32, 2, real),
                           hvd_tensor_make(dummy, HVD_FLOAT32, 2, empty)};
  hvd_tensor_t recvs[2];
  hvd_request_t *reqs[2] = {NULL, NULL};
  memset(recvs, 0, sizeof recvs);
  is_int(HVD_SUCCESS, hvd_grouped_allgather_async(2, names, sends, recvs, reqs),
         "grouped allgather of a real tensor and one that overflows");
  char why[300], want[600];
  snprintf(why, sizeof why, ag_why, size);
  for (int i = 0; i < 2; i++) {
    hvd_result_t rc = hvd_wait(reqs[i]);
    is_int(HVD_ERR_INVALID_ARG, rc, "... member '%s' fails on every rank",
           names[i]);
    snprintf(want, sizeof want,
             "allgather '%s': tensor 'g.over' of its fused group: %s", names[i],
             why);
    is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
              "... naming the member that overflows");
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&recvs[i]);
  }
  hvd_tensor_t recv;
  memset(&recv, 0, sizeof recv);
  hvd_result_t rc = hvd_allgather("g.after", &sends[0], &recv);
  is_int(HVD_SUCCESS, rc, "an allgather after it works");
  ok(rc == HVD_SUCCESS && recv.shape[0] == 2 * size &&
         ((float *)recv.data)[6 * size - 1] == 6,
     "... with every rank's rows");
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&recv);
}

/* Alltoall on ps (NULL: the world) of P ranks, this one being rank me:
 * rank 0 sends `first` rows of 0 bytes to the last rank, the others 1.
 * *last_got: the last rank's output rows and recv_splits[0] agree. */
static hvd_result_t a2a_empty(const hvd_process_set_t *ps, int me, int P,
                              const char *name, int64_t first, int *last_got) {
  int64_t splits[4] = {0, 0, 0, 0}, recv_splits[4] = {-1, -1, -1, -1};
  splits[P - 1] = me == 0 ? first : 1;
  int64_t shape[2] = {splits[P - 1], 0};
  hvd_tensor_t send = hvd_tensor_make(dummy, HVD_FLOAT32, 2, shape), recv;
  memset(&recv, 0, sizeof recv);
  hvd_result_t rc =
      ps != NULL ? hvd_ps_alltoall(ps, name, &send, splits, &recv, recv_splits)
                 : hvd_alltoall(name, &send, splits, &recv, recv_splits);
  *last_got =
      rc == HVD_SUCCESS &&
      (me != P - 1 || (recv.shape[0] == INT64_MAX && recv_splits[0] == first &&
                       (P < 2 || recv_splits[1] == 1)));
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&recv);
  return rc;
}

static void alltoall_limit(void) {
  char want[400];
  int good = 0;
  int64_t first = INT64_MAX - (size - 1);
  is_int(HVD_SUCCESS, a2a_empty(NULL, rank, size, "a2a.fit", first, &good),
         "alltoall: the last rank receives INT64_MAX rows");
  ok(good, "... its output and recv_splits say so");
  hvd_result_t rc = a2a_empty(NULL, rank, size, "a2a.over", first + 1, &good);
  is_int(HVD_ERR_INVALID_ARG, rc, "... one row more: refused on every rank");
  snprintf(want, sizeof want,
           "alltoall 'a2a.over': rank %d would receive more rows than a "
           "tensor holds (the splits sent to it sum past INT64_MAX rows or "
           "PTRDIFF_MAX bytes)",
           size - 1);
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... naming the tensor and the rank");
}

/* On a set of world ranks 1..P-1 (np 3): the message names world ranks. */
static void alltoall_on_set(void) {
  int ranks[3] = {1, 2, 3}, good = 0;
  hvd_process_set_t *ps = NULL;
  is_int(HVD_SUCCESS, hvd_process_set_create(ranks, size - 1, &ps),
         "a process set of world ranks 1..%d", size - 1);
  hvd_result_t rc = HVD_SUCCESS;
  if (rank > 0) /* set rank 0 (world 1) sends INT64_MAX, set rank 1 one */
    rc = a2a_empty(ps, rank - 1, size - 1, "a2a.set", INT64_MAX, &good);
  char want[400];
  snprintf(want, sizeof want,
           "alltoall 'a2a.set': rank %d would receive more rows than a "
           "tensor holds (the splits sent to it sum past INT64_MAX rows or "
           "PTRDIFF_MAX bytes)",
           size - 1);
  is_int(rank > 0 ? HVD_ERR_INVALID_ARG : HVD_SUCCESS, rc,
         "... its alltoall past INT64_MAX: refused on every member");
  is_string(rank > 0 ? want : "", rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... naming world rank %d", size - 1);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "... the set destroyed");
}

/* Past MPI's int counts on the last rank alone (see the top). */
static void alltoall_ints(void) {
  int64_t splits[4] = {0}, recv_splits[4], mine = 0;
  const int64_t half = (int64_t)1 << 30;
  if (rank == 0)
    mine = splits[size - 1] = half + 1;
  if (rank == size - 1)
    mine = splits[size - 1] = half + (rank == 0 ? half + 1 : 0);
  size_t bytes = mine > 0 ? (size_t)mine : 1;
  void *data = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED)
    bail("mmap of %zu bytes failed", bytes);
  int64_t shape[2] = {mine, 1};
  hvd_tensor_t send = hvd_tensor_make(data, HVD_UINT8, 2, shape), recv;
  memset(&recv, 0, sizeof recv);
  hvd_result_t rc = hvd_alltoall("a2a.ints", &send, splits, &recv, recv_splits);
  char want[300];
  snprintf(want, sizeof want,
           "alltoall 'a2a.ints': rank %d would send or receive more rows, or "
           "longer rows, than MPI's int counts",
           size - 1);
  is_int(HVD_ERR_UNSUPPORTED, rc,
         "alltoall past MPI's int counts on the last rank: refused on every "
         "rank");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... naming the rank");
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&recv);
  munmap(data, bytes);
  float x[4] = {(float)rank, (float)rank, (float)rank, (float)rank};
  int64_t rows[2] = {(int64_t)size, 1}, ones[4] = {1, 1, 1, 1};
  hvd_tensor_t a = hvd_tensor_make(x, HVD_FLOAT32, 2, rows), b;
  memset(&b, 0, sizeof b);
  rc = hvd_alltoall("a2a.after", &a, ones, &b, recv_splits);
  int good = rc == HVD_SUCCESS && b.shape[0] == size;
  for (int q = 0; good && q < size; q++) /* row q from rank q */
    good = ((float *)b.data)[q] == (float)q;
  ok(good, "... then an alltoall works");
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&b);
}

/* More elements than MPI's int counts, alike on every rank. */
static void reducescatter_ints(void) {
  int64_t cols = 600000000, shape[2] = {2 * size, cols};
  size_t bytes = (size_t)(2 * size * cols);
  void *data = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED)
    bail("mmap of %zu bytes failed", bytes);
  hvd_tensor_t send = hvd_tensor_make(data, HVD_UINT8, 2, shape), recv;
  memset(&recv, 0, sizeof recv);
  hvd_result_t rc =
      hvd_reducescatter("rs.ints", &send, &recv, HVD_SUM, 1.0, 1.0);
  char want[300];
  snprintf(want, sizeof want,
           "reducescatter 'rs.ints': a reducescatter of %lld elements exceeds "
           "MPI's int counts",
           (long long)(2 * size * cols));
  is_int(HVD_ERR_UNSUPPORTED, rc, "reducescatter past MPI's int counts");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... no rank named: every rank's is the same");
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&recv);
  munmap(data, bytes);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  size = hvd_size();
  if (size < 2 || size > 4) {
    hvd_shutdown();
    skip_all("needs 2 to 4 ranks (np %d)", size);
  }
  allgather_limit();
  grouped_limit();
  alltoall_limit();
  if (size >= 3)
    alltoall_on_set();
  alltoall_ints();
  reducescatter_ints();
  hvd_shutdown();
  return tap_mpi_finish();
}
