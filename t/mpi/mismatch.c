/*
 * mismatch.c - ranks that disagree on a collective get HVD_ERR_MISMATCH,
 * every one of them, with a message naming the reference rank (the lowest)
 * and every rank whose value differs; the job then goes on.
 *
 * Run at 2, 3 and 4 ranks: each expected message is built here from the
 * world size, so the list of differing ranks grows with it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"
#include "tap/tap.h"

#define MSG_LEN 1024

static int rank, size;

/* "<head>: rank 0 <field> <v0> vs rank r1 <field> <v1>, ..." for every
 * rank r whose keys[r] differs from the reference rank 0's. keys is what
 * hvd compares (NULL: the printed vals themselves). */
static void expect_msg(char *out, const char *head, const char *field,
                       char vals[][64], char keys[][64]) {
  size_t n = (size_t)snprintf(out, MSG_LEN, "%s: rank 0 %s %s vs", head, field,
                              vals[0]);
  int first = 1;
  if (!keys)
    keys = vals;
  for (int r = 1; r < size; r++) {
    if (strcmp(keys[r], keys[0]) == 0)
      continue;
    n += (size_t)snprintf(out + n, MSG_LEN - n, "%s rank %d %s %s",
                          first ? "" : ",", r, field, vals[r]);
    first = 0;
  }
}

/* Checks a failed collective: HVD_ERR_MISMATCH and exactly the message. */
static void is_mismatch(hvd_result_t rc, const char *seen, const char *want,
                        const char *what) {
  is_int(HVD_ERR_MISMATCH, rc, "%s: HVD_ERR_MISMATCH on every rank", what);
  is_string(want, seen, "%s: message", what);
}

/* A correct allreduce after each failure: sum over ranks of rank+1+i. */
static void allreduce_works(const char *after) {
  static int seq;
  char name[32];
  float x[5], y[5];
  int64_t shape[1] = {5};
  snprintf(name, sizeof name, "ok.%d", seq++);
  for (int i = 0; i < 5; i++) {
    x[i] = (float)(rank + 1 + i);
    y[i] = -1.0f;
  }
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce(name, &s, &r, HVD_SUM, 1.0, 1.0);
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "allreduce after %s", after);
  int good = 1;
  for (int i = 0; i < 5; i++) {
    float want = (float)(size * (size + 1) / 2 + size * i);
    if (y[i] != want) {
      tap_note("y[%d] = %g, expected %g", i, y[i], want);
      good = 0;
    }
  }
  ok(good, "allreduce after %s: values", after);
}

int main(int argc, char **argv) {
  char want[MSG_LEN], seen[MSG_LEN];
  char vals[64][64], keys[64][64];
  static const char *op_names[] = {"sum", "average", "min", "max", "product"};
  double buf[64];
  hvd_result_t rc;

  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 64)
    bail("at most 64 ranks");
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  memset(buf, 0, sizeof buf);

  /* Shape 17 + rank (submitted async, then waited). */
  {
    int64_t shape[1] = {17 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    hvd_request_t *req = NULL;
    rc = hvd_allreduce_async("w", &t, &t, HVD_SUM, 1.0, 1.0, &req);
    is_int(HVD_SUCCESS, rc, "shape: submission accepted");
    rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "[%d]", 17 + r);
    expect_msg(want, "allreduce 'w'", "shape", vals, NULL);
    is_mismatch(rc, seen, want, "shape 17+rank");
    allreduce_works("a shape mismatch");
  }

  /* dtype: int32 on even ranks, float32 on odd ones (polled with test). */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t =
        hvd_tensor_make(buf, rank % 2 ? HVD_FLOAT32 : HVD_INT32, 1, shape);
    hvd_request_t *req = NULL;
    int done = 0;
    rc = hvd_allreduce_async("x", &t, &t, HVD_SUM, 1.0, 1.0, &req);
    while (rc == HVD_SUCCESS && !done) {
      rc = hvd_test(req, &done);
      if (!done)
        usleep(200);
    }
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r % 2 ? "float32" : "int32");
    expect_msg(want, "allreduce 'x'", "dtype", vals, NULL);
    is_mismatch(rc, seen, want, "dtype int32/float32");
    allreduce_works("a dtype mismatch");
  }

  /* A different op on every rank. */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    rc = hvd_allreduce("op", &t, &t, (hvd_op_t)(rank % HVD_OP_COUNT), 1.0, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", op_names[r % HVD_OP_COUNT]);
    expect_msg(want, "allreduce 'op'", "op", vals, NULL);
    is_mismatch(rc, seen, want, "op per rank");
    allreduce_works("an op mismatch");
  }

  /* Broadcast, each rank naming itself the root. */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    rc = hvd_broadcast("b", &t, rank);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%d", r);
    expect_msg(want, "broadcast 'b'", "root", vals, NULL);
    is_mismatch(rc, seen, want, "broadcast roots");
    allreduce_works("a root mismatch");
  }

  /* prescale 0.5 on odd ranks, 1 on even ones. */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    rc = hvd_allreduce("pre", &t, &t, HVD_SUM, rank % 2 ? 0.5 : 1.0, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r % 2 ? "0.5" : "1");
    expect_msg(want, "allreduce 'pre'", "prescale", vals, NULL);
    is_mismatch(rc, seen, want, "prescale");
    allreduce_works("a prescale mismatch");
  }

  /* postscale 3 on rank 0, 0.25 elsewhere (prescale agrees). */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT64, 1, shape);
    rc =
        hvd_allreduce("post", &t, &t, HVD_AVERAGE, 2.0, rank == 0 ? 3.0 : 0.25);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r == 0 ? "3" : "0.25");
    expect_msg(want, "allreduce 'post'", "postscale", vals, NULL);
    is_mismatch(rc, seen, want, "postscale");
    allreduce_works("a postscale mismatch");
  }

  /* One name, two collective kinds: allreduce on rank 0, broadcast
   * elsewhere. The message uses the reference rank's kind. */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    if (rank == 0)
      rc = hvd_allreduce("kind", &t, &t, HVD_SUM, 1.0, 1.0);
    else
      rc = hvd_broadcast("kind", &t, 0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r == 0 ? "allreduce" : "broadcast");
    expect_msg(want, "allreduce 'kind'", "collective", vals, NULL);
    is_mismatch(rc, seen, want, "allreduce vs broadcast");
    allreduce_works("a collective mismatch");
  }

  /* The first differing field is reported: dtype before shape. */
  {
    int64_t shape[1] = {8 + rank % 2};
    hvd_tensor_t t =
        hvd_tensor_make(buf, rank % 2 ? HVD_FLOAT64 : HVD_FLOAT32, 1, shape);
    rc = hvd_allreduce("order", &t, &t, HVD_SUM, 1.0, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r % 2 ? "float64" : "float32");
    expect_msg(want, "allreduce 'order'", "dtype", vals, NULL);
    is_mismatch(rc, seen, want, "dtype and shape differ: dtype reported");
    allreduce_works("a dtype and shape mismatch");
  }

  /* The first differing field is reported: prescale before shape. */
  {
    int64_t shape[1] = {3 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    rc =
        hvd_allreduce("order2", &t, &t, HVD_SUM, rank == size - 1 ? 4 : 1, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "%s", r == size - 1 ? "4" : "1");
    expect_msg(want, "allreduce 'order2'", "prescale", vals, NULL);
    is_mismatch(rc, seen, want, "prescale and shape differ: prescale");
    allreduce_works("a prescale and shape mismatch");
  }

  /* Allgather: dim 0 may differ, dims 1.. may not; the message prints the
   * full shapes of the ranks whose dims 1.. differ (not rank 2's). */
  {
    int64_t shape[2] = {rank + 1, 3 + rank % 2};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_allgather("g", &t, &out);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    hvd_tensor_free(&out);
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], 64, "[%d, %d]", r + 1, 3 + r % 2);
      snprintf(keys[r], 64, "%d", 3 + r % 2);
    }
    expect_msg(want, "allgather 'g'", "shape", vals, keys);
    is_mismatch(rc, seen, want, "allgather dims 1..");
    allreduce_works("an allgather mismatch");
  }

  /* Allgather: a different ndim is a shape mismatch too. */
  {
    int64_t shape[3] = {rank + 1, 3, 1};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 2 + rank % 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_allgather("g3", &t, &out);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    hvd_tensor_free(&out);
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], 64, r % 2 ? "[%d, 3, 1]" : "[%d, 3]", r + 1);
      snprintf(keys[r], 64, "%d", 2 + r % 2);
    }
    expect_msg(want, "allgather 'g3'", "shape", vals, keys);
    is_mismatch(rc, seen, want, "allgather ndim");
    allreduce_works("an allgather ndim mismatch");
  }

  /* ...while a differing dim 0 alone is fine. */
  {
    float x[3 * 64];
    int64_t shape[2] = {rank + 1, 3};
    for (int i = 0; i < 3 * (rank + 1); i++)
      x[i] = (float)(100 * rank + i);
    hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_allgather("g2", &t, &out);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "allgather with dim 0 differing");
    int rows = size * (size + 1) / 2, good = rc == HVD_SUCCESS;
    if (good && (out.dtype != HVD_FLOAT32 || out.ndim != 2 ||
                 out.shape[0] != rows || out.shape[1] != 3)) {
      tap_note("output shape wrong");
      good = 0;
    }
    for (int r = 0, off = 0; good && r < size; off += 3 * (r + 1), r++)
      for (int i = 0; i < 3 * (r + 1); i++) {
        float v = ((float *)out.data)[off + i];
        if (v != (float)(100 * r + i)) {
          tap_note("from rank %d element %d: %g", r, i, v);
          good = 0;
        }
      }
    ok(good, "allgather with dim 0 differing: values");
    hvd_tensor_free(&out);
  }

  /* Alltoall compares dims 1.. as allgather does. */
  {
    int64_t shape[2] = {size, 2 + rank % 2};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_alltoall("a2a", &t, NULL, &out, NULL);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    hvd_tensor_free(&out);
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], 64, "[%d, %d]", size, 2 + r % 2);
      snprintf(keys[r], 64, "%d", 2 + r % 2);
    }
    expect_msg(want, "alltoall 'a2a'", "shape", vals, keys);
    is_mismatch(rc, seen, want, "alltoall dims 1..");
    allreduce_works("an alltoall mismatch");
  }

  /* Reducescatter needs the same shape everywhere, dim 0 included. */
  {
    int64_t shape[1] = {4 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_reducescatter("rs", &t, &out, HVD_SUM, 1.0, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    hvd_tensor_free(&out);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], 64, "[%d]", 4 + r);
    expect_msg(want, "reducescatter 'rs'", "shape", vals, NULL);
    is_mismatch(rc, seen, want, "reducescatter dim 0");
    allreduce_works("a reducescatter mismatch");
  }

  /* The same name may be used again after it failed. */
  {
    int64_t shape[1] = {8};
    float x[8];
    for (int i = 0; i < 8; i++)
      x[i] = (float)rank;
    hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    rc = hvd_allreduce("w", &t, &t, HVD_MAX, 1.0, 1.0);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "name 'w' works again after its mismatch");
    is_double(size - 1, x[7], 0, "name 'w' again: max of ranks");
  }

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
