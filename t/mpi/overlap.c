/*
 * overlap.c - an allreduce's output that overlaps its input without being
 * it (recv->data != send->data, the ranges intersecting) is refused on
 * the calling rank with HVD_ERR_INVALID_ARG and an exact message: it was
 * accepted and summed wrongly on every path. So is a grouped allreduce
 * where one tensor's recv meets another tensor's send, in the
 * world and in a process set. Exact in place (recv == send), alone and
 * in a group, and outputs that only touch their inputs still give the
 * exact sums, small (packed) and large (reduced in the caller's memory).
 *
 * Run at 1 to 3 ranks.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MSG_LEN 512

static int rank, size;

static void expect(hvd_result_t rc, const char *want, const char *what) {
  char seen[MSG_LEN];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: result", what);
  is_string(want, seen, "%s: message", what);
}

static hvd_tensor_t vec(int32_t *p, int64_t *n) {
  return hvd_tensor_make(p, HVD_INT32, 1, n);
}

/* x[i] = rank + 1 + i on every rank: the sum is size * (size + 1) / 2 +
 * size * i. */
static void fill(int32_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    x[i] = rank + 1 + (int32_t)(i % 1000);
}

static int sums(const int32_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (y[i] != size * (size + 1) / 2 + size * (int32_t)(i % 1000))
      return 0;
  return 1;
}

static void refusals(int32_t *buf, const hvd_process_set_t *ps) {
  int64_t n = 8;
  const char *where = ps ? "set" : "world";
  char what[128];
  hvd_tensor_t s = vec(buf + 4, &n), after = vec(buf + 5, &n),
               before = vec(buf + 1, &n);
  const char *want = "allreduce 'x': recv overlaps send without being it (in "
                     "place is recv->data == send->data)";
  snprintf(what, sizeof what, "%s: recv one element past send", where);
  expect(ps ? hvd_ps_allreduce(ps, "x", &s, &after, HVD_SUM, 1, 1)
            : hvd_allreduce("x", &s, &after, HVD_SUM, 1, 1),
         want, what);
  hvd_request_t *req = NULL;
  snprintf(what, sizeof what, "%s: async, recv three elements before send",
           where);
  expect(ps ? hvd_ps_allreduce_async(ps, "x", &s, &before, HVD_SUM, 1, 1, &req)
            : hvd_allreduce_async("x", &s, &before, HVD_SUM, 1, 1, &req),
         want, what);
  ok(req == NULL, "%s: no request", what);

  const char *names[2] = {"g0", "g1"};
  hvd_tensor_t sends[2] = {vec(buf, &n), vec(buf + 16, &n)};
  hvd_tensor_t recvs[2] = {vec(buf + 32, &n), vec(buf + 48, &n)};
  char msg[MSG_LEN];
#define GROUPED()                                                              \
  (ps ? hvd_ps_grouped_allreduce(ps, 2, names, sends, recvs, HVD_SUM, 1, 1)    \
      : hvd_grouped_allreduce(2, names, sends, recvs, HVD_SUM, 1, 1))
  recvs[1] = vec(buf + 18, &n);
  snprintf(msg, sizeof msg,
           "hvd_grouped_allreduce: tensor 1: allreduce 'g1': recv overlaps "
           "send without being it (in place is recv->data == send->data)");
  snprintf(what, sizeof what, "%s: grouped, tensor 1 overlaps itself", where);
  expect(GROUPED(), msg, what);
  recvs[1] = vec(buf, &n); /* tensor 1's output is tensor 0's input */
  snprintf(msg, sizeof msg, "hvd_grouped_allreduce: tensor 0's send overlaps "
                            "tensor 1's recv");
  snprintf(what, sizeof what, "%s: grouped, recv 1 is send 0", where);
  expect(GROUPED(), msg, what);
  recvs[1] = vec(buf + 48, &n);
  recvs[0] = vec(buf + 12, &n); /* into the first half of send 1 */
  snprintf(msg, sizeof msg, "hvd_grouped_allreduce: tensor 0's recv overlaps "
                            "tensor 1's send");
  snprintf(what, sizeof what, "%s: grouped, recv 0 meets send 1", where);
  expect(GROUPED(), msg, what);
  recvs[0] = sends[0];       /* in place ... */
  recvs[1] = vec(buf + 4, &n); /* ... and another's output inside it */
  snprintf(msg, sizeof msg, "hvd_grouped_allreduce: tensor 0's send overlaps "
                            "tensor 1's recv");
  snprintf(what, sizeof what, "%s: grouped, in place beside an overlap",
           where);
  expect(GROUPED(), msg, what);
#undef GROUPED
}

/* n elements: in place; recv just after send (touching); a group of one
 * in place and one whose send is shared with nothing. */
static void works(int64_t n, const char *label) {
  int32_t *a = hvdt_calloc((size_t)(3 * n), sizeof *a);
  hvd_tensor_t s = vec(a, &n), r = vec(a + n, &n);
  fill(a, n);
  hvd_result_t rc = hvd_allreduce("in", &s, &s, HVD_SUM, 1, 1);
  ok(rc == HVD_SUCCESS && sums(a, n), "%s: in place: exact sums", label);
  fill(a, n);
  rc = hvd_allreduce("touch", &s, &r, HVD_SUM, 1, 1);
  ok(rc == HVD_SUCCESS && sums(a + n, n), "%s: recv right after send: exact",
     label);
  const char *names[2] = {"g0", "g1"};
  hvd_tensor_t sends[2] = {vec(a, &n), vec(a + n, &n)};
  hvd_tensor_t recvs[2] = {vec(a, &n), vec(a + 2 * n, &n)};
  fill(a, n);
  fill(a + n, n);
  rc = hvd_grouped_allreduce(2, names, sends, recvs, HVD_SUM, 1, 1);
  ok(rc == HVD_SUCCESS && sums(a, n) && sums(a + 2 * n, n),
     "%s: grouped, in place beside a separate output: exact", label);
  sends[1] = sends[0]; /* one input, two outputs */
  recvs[0] = vec(a + n, &n);
  fill(a, n);
  rc = hvd_grouped_allreduce(2, names, sends, recvs, HVD_SUM, 1, 1);
  ok(rc == HVD_SUCCESS && sums(a + n, n) && sums(a + 2 * n, n),
     "%s: grouped, two members share a send: exact", label);
  free(a);
}

int main(int argc, char **argv) {
  int32_t buf[64] = {0};
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  refusals(buf, NULL);
  int *all = hvdt_calloc((size_t)size, sizeof *all);
  for (int q = 0; q < size; q++)
    all[q] = q;
  hvd_process_set_t *ps = NULL;
  if (hvd_process_set_create(all, size, &ps) != HVD_SUCCESS)
    bail("hvd_process_set_create: %s", hvd_last_error());
  refusals(buf, ps);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "set destroyed");
  free(all);
  works(7, "7 elements");
  works(300000, "300000 elements");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
