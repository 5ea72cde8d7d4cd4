/*
 * mismatch.c - ranks that disagree on a collective get HVD_ERR_MISMATCH,
 * every one of them, with a message naming the reference rank (the lowest)
 * and every rank whose value differs; the job then goes on.
 *
 * Run at 2, 3 and 4 ranks: each expected message is built here from the
 * world size, so the list of differing ranks grows with it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MSG_LEN 1024

static int rank, size;
/* What each rank contributed, as the message prints it and as hvd
 * compares it (see hvdt_expect_mismatch). */
static char vals[64][HVDT_VAL_LEN], keys[64][HVDT_VAL_LEN];

/* Checks the collective just made, which had to fail with a mismatch of
 * field (vals, and keys unless NULL, filled in), then that an allreduce
 * works. */
static void mismatch(hvd_result_t rc, const char *head, const char *field,
                     char k[][HVDT_VAL_LEN], const char *what,
                     const char *after) {
  char seen[MSG_LEN];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  hvdt_expect_mismatch(rc, seen, head, field, vals, k, what);
  /* a correct allreduce: sum over ranks of rank+1+i */
  hvdt_allreduce_works(NULL, HVD_FLOAT32, 5, "allreduce after %s", after);
}

int main(int argc, char **argv) {
  static const char *op_names[] = {"sum",     "average", "min",
                                   "max",     "product", "adasum"};
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
  int64_t shape8[1] = {8};
  hvd_tensor_t t8 = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape8);

  /* Shape 17 + rank (submitted async, then waited). */
  {
    int64_t shape[1] = {17 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    hvd_request_t *req = NULL;
    rc = hvd_allreduce_async("w", &t, &t, HVD_SUM, 1.0, 1.0, &req);
    is_int(HVD_SUCCESS, rc, "shape: submission accepted");
    rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "[%d]", 17 + r);
    mismatch(rc, "allreduce 'w'", "shape", NULL, "shape 17+rank",
             "a shape mismatch");
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
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r % 2 ? "float32" : "int32");
    mismatch(rc, "allreduce 'x'", "dtype", NULL, "dtype int32/float32",
             "a dtype mismatch");
  }

  /* A different op on every rank. */
  {
    hvd_tensor_t t = t8;
    rc = hvd_allreduce("op", &t, &t, (hvd_op_t)(rank % HVD_OP_COUNT), 1.0, 1.0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", op_names[r % HVD_OP_COUNT]);
    mismatch(rc, "allreduce 'op'", "op", NULL, "op per rank", "an op mismatch");
  }

  /* Broadcast, each rank naming itself the root. */
  {
    hvd_tensor_t t = t8;
    rc = hvd_broadcast("b", &t, rank);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%d", r);
    mismatch(rc, "broadcast 'b'", "root", NULL, "broadcast roots",
             "a root mismatch");
  }

  /* prescale 0.5 on odd ranks, 1 on even ones. */
  {
    hvd_tensor_t t = t8;
    rc = hvd_allreduce("pre", &t, &t, HVD_SUM, rank % 2 ? 0.5 : 1.0, 1.0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r % 2 ? "0.5" : "1");
    mismatch(rc, "allreduce 'pre'", "prescale", NULL, "prescale",
             "a prescale mismatch");
  }

  /* postscale 3 on rank 0, 0.25 elsewhere (prescale agrees). */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT64, 1, shape);
    rc =
        hvd_allreduce("post", &t, &t, HVD_AVERAGE, 2.0, rank == 0 ? 3.0 : 0.25);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r == 0 ? "3" : "0.25");
    mismatch(rc, "allreduce 'post'", "postscale", NULL, "postscale",
             "a postscale mismatch");
  }

  /* postscale 0.1 on rank 0, the next double up elsewhere: printed with
   * the digits that tell them apart (with 6, both read "0.1"). */
  {
    int64_t shape[1] = {8};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT64, 1, shape);
    rc = hvd_allreduce("near", &t, &t, HVD_SUM, 1.0,
                       rank == 0 ? 0.1 : nextafter(0.1, 1.0));
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s",
               r == 0 ? "0.1" : "0.10000000000000002");
    mismatch(rc, "allreduce 'near'", "postscale", NULL, "postscale",
             "a postscale mismatch of one ulp");
  }

  /* A name of 400 characters (prescale 0.5 on odd ranks): the label has
   * room for 299 bytes, so the name is cut to its first 284 characters
   * and ends visibly, its closing quote kept (it used to end without
   * one: "allreduce 'nnn...nnn: rank 0 ..."). */
  {
    char name[401], head[400];
    hvd_tensor_t t = t8;
    memset(name, 'n', 400);
    name[400] = '\0';
    name[0] = 'L';
    rc = hvd_allreduce(name, &t, &t, HVD_SUM, rank % 2 ? 0.5 : 1.0, 1.0);
    snprintf(head, sizeof head, "allreduce '%.284s...'", name);
    is_int(299, (int)strlen(head), "a long name: the label is 299 bytes");
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r % 2 ? "0.5" : "1");
    mismatch(rc, head, "prescale", NULL, "a 400-character name",
             "a long name's mismatch");
  }

  /* One name, two collective kinds: allreduce on rank 0, broadcast
   * elsewhere. The message uses the reference rank's kind. */
  {
    hvd_tensor_t t = t8;
    if (rank == 0)
      rc = hvd_allreduce("kind", &t, &t, HVD_SUM, 1.0, 1.0);
    else
      rc = hvd_broadcast("kind", &t, 0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r == 0 ? "allreduce" : "broadcast");
    mismatch(rc, "allreduce 'kind'", "collective", NULL,
             "allreduce vs broadcast", "a collective mismatch");
  }

  /* The first differing field is reported: dtype before shape. */
  {
    int64_t shape[1] = {8 + rank % 2};
    hvd_tensor_t t =
        hvd_tensor_make(buf, rank % 2 ? HVD_FLOAT64 : HVD_FLOAT32, 1, shape);
    rc = hvd_allreduce("order", &t, &t, HVD_SUM, 1.0, 1.0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r % 2 ? "float64" : "float32");
    mismatch(rc, "allreduce 'order'", "dtype", NULL,
             "dtype and shape differ: dtype reported",
             "a dtype and shape mismatch");
  }

  /* The first differing field is reported: prescale before shape. */
  {
    int64_t shape[1] = {3 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    rc =
        hvd_allreduce("order2", &t, &t, HVD_SUM, rank == size - 1 ? 4 : 1, 1.0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "%s", r == size - 1 ? "4" : "1");
    mismatch(rc, "allreduce 'order2'", "prescale", NULL,
             "prescale and shape differ: prescale",
             "a prescale and shape mismatch");
  }

  /* Allgather: dim 0 may differ, dims 1.. may not; the message prints the
   * full shapes of the ranks whose dims 1.. differ (not rank 2's). */
  {
    int64_t shape[2] = {rank + 1, 3 + rank % 2};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_allgather("g", &t, &out);
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], HVDT_VAL_LEN, "[%d, %d]", r + 1, 3 + r % 2);
      snprintf(keys[r], HVDT_VAL_LEN, "%d", 3 + r % 2);
    }
    mismatch(rc, "allgather 'g'", "shape", keys, "allgather dims 1..",
             "an allgather mismatch");
    hvd_tensor_free(&out);
  }

  /* Allgather: a different ndim is a shape mismatch too. */
  {
    int64_t shape[3] = {rank + 1, 3, 1};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 2 + rank % 2, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_allgather("g3", &t, &out);
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], HVDT_VAL_LEN, r % 2 ? "[%d, 3, 1]" : "[%d, 3]", r + 1);
      snprintf(keys[r], HVDT_VAL_LEN, "%d", 2 + r % 2);
    }
    mismatch(rc, "allgather 'g3'", "shape", keys, "allgather ndim",
             "an allgather ndim mismatch");
    hvd_tensor_free(&out);
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
    for (int r = 0; r < size; r++) {
      snprintf(vals[r], HVDT_VAL_LEN, "[%d, %d]", size, 2 + r % 2);
      snprintf(keys[r], HVDT_VAL_LEN, "%d", 2 + r % 2);
    }
    mismatch(rc, "alltoall 'a2a'", "shape", keys, "alltoall dims 1..",
             "an alltoall mismatch");
    hvd_tensor_free(&out);
  }

  /* Reducescatter needs the same shape everywhere, dim 0 included. */
  {
    int64_t shape[1] = {4 + rank};
    hvd_tensor_t t = hvd_tensor_make(buf, HVD_FLOAT32, 1, shape);
    hvd_tensor_t out;
    memset(&out, 0, sizeof out);
    rc = hvd_reducescatter("rs", &t, &out, HVD_SUM, 1.0, 1.0);
    for (int r = 0; r < size; r++)
      snprintf(vals[r], HVDT_VAL_LEN, "[%d]", 4 + r);
    mismatch(rc, "reducescatter 'rs'", "shape", NULL, "reducescatter dim 0",
             "a reducescatter mismatch");
    hvd_tensor_free(&out);
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
