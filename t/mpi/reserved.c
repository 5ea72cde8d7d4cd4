/*
 * reserved.c - "hvd.join" and "hvd.barrier", the names of hvd_join's and
 * hvd_barrier's own requests, are no tensor's: every collective refuses
 * them on the caller's thread with HVD_ERR_INVALID_ARG naming the tensor,
 * and submits nothing. Before, they shared the in-flight table with
 * hvd's own requests: a rank that had joined ran its join request as the
 * other ranks' allreduce "hvd.join" (and crashed), or completed its join
 * with a broadcast's error.
 *
 *   1. every collective, single and grouped, refuses both names;
 *      "hvd.join.x" (hvd's own collectives use "hvd." names) still runs;
 *   2. ranks 1.. join; rank 0 tries an allreduce and a broadcast named
 *      "hvd.join" (refused), allreduces "x" with the joined ranks' stubs
 *      (its own values, exactly), then joins last: every join succeeds,
 *      naming rank 0;
 *   3. the same with "hvd.barrier", then a barrier everywhere.
 *
 * Run at 2, 3 and 4 ranks.
 */
#include <stdio.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

#define N 4

static int rank, size;

static void refused(hvd_result_t rc, const char *want, const char *what) {
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: HVD_ERR_INVALID_ARG", what);
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "", "  the message");
}

/* Every collective under name (hvd.join or hvd.barrier, which is the
 * reserving call's name after "hvd."). */
static void every_collective(const char *name) {
  float a[N] = {1, 2, 3, 4}, b[N] = {0};
  int64_t shape[1] = {N};
  hvd_tensor_t s = hvd_tensor_make(a, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(b, HVD_FLOAT32, 1, shape);
  hvd_tensor_t out = {0};
  int64_t splits[16] = {0}, rsplits[16];
  char want[256], what[128];
  const char *call = name + 4;
#define REFUSED(kind, expr)                                                    \
  snprintf(want, sizeof want, "%s '%s': the name is reserved for hvd_%s",      \
           kind, name, call);                                                  \
  snprintf(what, sizeof what, "%s '%s'", kind, name);                          \
  refused(expr, want, what)
  REFUSED("allreduce", hvd_allreduce(name, &s, &r, HVD_SUM, 1, 1));
  REFUSED("broadcast", hvd_broadcast(name, &s, 0));
  REFUSED("allgather", hvd_allgather(name, &s, &out));
  splits[0] = N;
  REFUSED("alltoall", hvd_alltoall(name, &s, splits, &out, rsplits));
  REFUSED("reducescatter", hvd_reducescatter(name, &s, &out, HVD_SUM, 1, 1));
#undef REFUSED
  const char *names[2] = {"g0", name};
  hvd_tensor_t ss[2] = {s, s}, rs[2] = {r, r};
  snprintf(want, sizeof want,
           "hvd_grouped_allreduce: tensor 1: allreduce '%s': the name is "
           "reserved for hvd_%s",
           name, call);
  refused(hvd_grouped_allreduce(2, names, ss, rs, HVD_SUM, 1, 1), want,
          "grouped allreduce with a member so named");
}

/* "hvd.join.x": only the two names are reserved. */
static void prefix_allowed(void) {
  float a[N], b[N];
  int64_t shape[1] = {N};
  for (int i = 0; i < N; i++)
    a[i] = (float)(rank + i);
  hvd_tensor_t s = hvd_tensor_make(a, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(b, HVD_FLOAT32, 1, shape);
  is_int(HVD_SUCCESS, hvd_allreduce("hvd.join.x", &s, &r, HVD_SUM, 1, 1),
         "allreduce 'hvd.join.x' runs");
  int good = 1;
  for (int i = 0; i < N; i++)
    good &= b[i] == (float)(size * (size - 1) / 2 + size * i);
  ok(good, "  with the exact sum (b[0] = %g)", (double)b[0]);
}

/* Ranks 1.. join; rank 0 submits collectives named `name`, then "x",
 * then joins last. */
static void under_join(const char *name) {
  hvd_result_t rc_ar = HVD_ERR_INVALID_ARG, rc_bc = HVD_ERR_INVALID_ARG;
  hvd_result_t rc_x = HVD_SUCCESS;
  char msg_ar[256] = "", msg_bc[256] = "", want[256];
  float x[N] = {0};
  int64_t shape[1] = {N};
  if (rank == 0) {
    float a[N] = {1, 2, 3, 4};
    hvd_tensor_t t = hvd_tensor_make(a, HVD_FLOAT32, 1, shape);
    rc_ar = hvd_allreduce(name, &t, &t, HVD_SUM, 1, 1);
    snprintf(msg_ar, sizeof msg_ar, "%s", hvd_last_error());
    rc_bc = hvd_broadcast(name, &t, 0);
    snprintf(msg_bc, sizeof msg_bc, "%s", hvd_last_error());
    hvd_tensor_t s = hvd_tensor_make(a, HVD_FLOAT32, 1, shape);
    hvd_tensor_t r = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
    rc_x = hvd_allreduce("x", &s, &r, HVD_SUM, 1, 1);
  }
  int last = -2;
  hvd_result_t rc = hvd_join(&last);
  is_int(HVD_SUCCESS, rc, "'%s' under join: every hvd_join succeeds", name);
  is_int(0, last, "  naming rank 0, the last to join");
  snprintf(want, sizeof want, "allreduce '%s': the name is reserved for hvd_%s",
           name, name + 4);
  if (rank != 0)
    snprintf(msg_ar, sizeof msg_ar, "%s", want);
  is_int(HVD_ERR_INVALID_ARG, rc_ar, "  rank 0's allreduce: refused");
  is_string(want, msg_ar, "  the message");
  snprintf(want, sizeof want, "broadcast '%s': the name is reserved for hvd_%s",
           name, name + 4);
  if (rank != 0)
    snprintf(msg_bc, sizeof msg_bc, "%s", want);
  is_int(HVD_ERR_INVALID_ARG, rc_bc, "  rank 0's broadcast: refused");
  is_string(want, msg_bc, "  the message");
  is_int(HVD_SUCCESS, rc_x, "  rank 0's allreduce 'x' with the joined ranks");
  int good = 1;
  for (int i = 0; rank == 0 && i < N; i++)
    good &= x[i] == (float)(i + 1);
  ok(good, "  is rank 0's own values (x[0] = %g)", (double)x[0]);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 16)
    bail("run at 1 to 16 ranks");
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  every_collective("hvd.join");
  every_collective("hvd.barrier");
  prefix_allowed();
  under_join("hvd.join");
  under_join("hvd.barrier");
  is_int(HVD_SUCCESS, hvd_barrier(), "hvd_barrier after all");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
