/*
 * gpu_timing.c - HVD_GPU_TIMING=1 and hvd_gpu_timing (lib/ops/gpu_timing.c)
 * on the host stand-in, whose cudaEventElapsedTime measures the host times
 * at which the events were recorded (the work runs at the call), a GPU
 * per rank:
 *
 *  1. before hvd_init, HVD_ERR_NOT_INITIALIZED; after it without
 *     HVD_GPU_TIMING, HVD_ERR_INVALID_ARG "hvd_gpu_timing: HVD_GPU_TIMING
 *     is not set (1 turns device group timing on)"; out NULL,
 *     "hvd_gpu_timing: out is NULL";
 *  2. with HVD_GPU_TIMING=1, once per device executor (nccl: the groups
 *     left in flight, accounted when reaped; mpi: host-staged, waited
 *     for): three device allreduces one after the other, each waited for,
 *     with 0.1 s of sleep between one's completion and the next
 *     submission, and each submitted while the caller's stream still has
 *     0.05 s of device time to run (standin_stream_busy: its compute
 *     writing the tensor), so that its ready event fires 0.05 s after the
 *     submission. Exactly 3 groups; busy >= 0; lag <= idle; idle - lag >=
 *     2 x 0.15 s: the sleeps and the compute come before the next group's
 *     inputs are ready, so they are idle but not hvd's lag (a lower bound
 *     only: nothing here bounds a time from above); max_lag <= lag; a read
 *     with reset 1 gives the same totals as the read before it, and the
 *     next read 0 groups;
 *  3. then eight device allreduces that cannot fuse (float32 and int32,
 *     sum, min, max, product), submitted together (on nccl up to
 *     HVD__GPU_SLOTS in flight at once, with HVD_STANDIN_POLLS=40): exactly
 *     8 groups, 0 <= lag <= idle, max lag <= lag;
 * then hvd has freed every stream and event it made.
 *
 * Registered at np 1, 2, 3 and 4 (t/standin/local.mk).
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gputest.h"
#include "hvd.h"
#include "standin.h"
#include "tap/tap.h"

#define N 4096       /* floats per allreduce */
#define SLEEP_S 0.1  /* between one's completion and the next submission */
#define BUSY_S 0.05 /* device time of the caller's stream at submission */

static int rank, size, dev;

static void test_refused(void) {
  hvd_gpu_timing_t t;
  is_int(HVD_ERR_NOT_INITIALIZED, hvd_gpu_timing(&t, 0),
         "before hvd_init: not initialised");
  is_string("hvd_gpu_timing: hvd_init() has not been called", hvd_last_error(),
            "its message");
  unsetenv("HVD_GPU_TIMING");
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, hvd_gpu_timing(&t, 0),
         "HVD_GPU_TIMING unset: invalid argument");
  is_string("hvd_gpu_timing: HVD_GPU_TIMING is not set (1 turns device group "
            "timing on)",
            hvd_last_error(), "its message");
  is_int(HVD_ERR_INVALID_ARG, hvd_gpu_timing(NULL, 0), "out NULL");
  is_string("hvd_gpu_timing: out is NULL", hvd_last_error(), "its message");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
}

/* A device allreduce of d (N elements of dt, in place), submitted. */
static hvd_request_t *submit(const char *name, void *d, hvd_dtype_t dt,
                             hvd_op_t op) {
  int64_t shape[1] = {N};
  hvd_tensor_t t = hvd_tensor_make(d, dt, 1, shape);
  t.device = dev;
  hvd_request_t *req = NULL;
  if (hvd_allreduce_async(name, &t, &t, op, 1, 1, &req) != HVD_SUCCESS)
    bail("%s: %s", name, hvd_last_error());
  return req;
}

/* One device allreduce of d (N floats), waited for. */
static void allreduce(const char *name, float *d) {
  if (hvd_wait(submit(name, d, HVD_FLOAT32, HVD_SUM)) != HVD_SUCCESS)
    bail("%s: %s", name, hvd_last_error());
}

static int same(const hvd_gpu_timing_t *a, const hvd_gpu_timing_t *b) {
  return a->groups == b->groups && a->busy_s == b->busy_s &&
         a->idle_s == b->idle_s && a->lag_s == b->lag_s &&
         a->max_lag_s == b->max_lag_s;
}

/* Eight groups at once (none fuses with another): all timed. */
static void test_burst(const char *ops, float *d) {
  static const hvd_op_t op[4] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT};
  hvd_request_t *req[8];
  hvd_gpu_timing_t t;
  for (int q = 0; q < 8; q++) {
    char name[64];
    snprintf(name, sizeof name, "burst.%s.%d", ops, q);
    req[q] = submit(name, d + q * N, q < 4 ? HVD_FLOAT32 : HVD_INT32, op[q % 4]);
  }
  for (int q = 0; q < 8; q++)
    if (hvd_wait(req[q]) != HVD_SUCCESS)
      bail("burst %d: %s", q, hvd_last_error());
  is_int(HVD_SUCCESS, hvd_gpu_timing(&t, 1), "%s: burst: hvd_gpu_timing", ops);
  tap_note("%s: burst: %lld groups, busy %g s, idle %g s, lag %g s, max %g s",
           ops, (long long)t.groups, t.busy_s, t.idle_s, t.lag_s, t.max_lag_s);
  is_int(8, t.groups, "%s: burst: 8 groups timed", ops);
  ok(t.lag_s >= 0 && t.lag_s <= t.idle_s && t.max_lag_s <= t.lag_s,
     "%s: burst: 0 <= max lag %g s <= lag %g s <= idle %g s", ops, t.max_lag_s,
     t.lag_s, t.idle_s);
}

static void test_three(const char *ops) {
  hvd_gpu_timing_t t, again, after;
  float *d = NULL;
  setenv("HVD_GPU_OPERATIONS", ops, 1);
  setenv("HVD_GPU_TIMING", "1", 1);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  cuda_ok(cudaMalloc((void **)&d, 8 * N * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMemset(d, 0, 8 * N * sizeof *d), "cudaMemset");
  for (int i = 0; i < 3; i++) {
    char name[64];
    snprintf(name, sizeof name, "timed.%s.%d", ops, i);
    if (i > 0) /* after the last completed, before the next is submitted */
      nanosleep(&(struct timespec){0, (long)(SLEEP_S * 1e9)}, NULL);
    standin_stream_busy(NULL, BUSY_S); /* the legacy stream: ready's */
    allreduce(name, d);
  }
  is_int(HVD_SUCCESS, hvd_gpu_timing(&t, 0), "%s: hvd_gpu_timing", ops);
  tap_note("%s: %lld groups, busy %g s, idle %g s, lag %g s, max lag %g s",
           ops, (long long)t.groups, t.busy_s, t.idle_s, t.lag_s, t.max_lag_s);
  is_int(3, t.groups, "%s: 3 groups timed", ops);
  ok(t.busy_s >= 0, "%s: busy %g s >= 0", ops, t.busy_s);
  ok(t.lag_s >= 0 && t.lag_s <= t.idle_s, "%s: 0 <= lag %g s <= idle %g s",
     ops, t.lag_s, t.idle_s);
  ok(t.idle_s - t.lag_s >= 2 * (SLEEP_S + BUSY_S),
     "%s: idle - lag = %g s >= the %g s slept and computed before the inputs "
     "were ready",
     ops, t.idle_s - t.lag_s, 2 * (SLEEP_S + BUSY_S));
  ok(t.max_lag_s >= 0 && t.max_lag_s <= t.lag_s, "%s: max lag %g s <= lag",
     ops, t.max_lag_s);
  is_int(HVD_SUCCESS, hvd_gpu_timing(&again, 1), "%s: read with reset", ops);
  ok(same(&t, &again), "%s: it gives the same totals", ops);
  is_int(HVD_SUCCESS, hvd_gpu_timing(&after, 0), "%s: read again", ops);
  ok(after.groups == 0 && after.busy_s == 0 && after.idle_s == 0 &&
         after.lag_s == 0 && after.max_lag_s == 0,
     "%s: zero after the reset (%lld groups)", ops, (long long)after.groups);
  test_burst(ops, d);
  cuda_ok(cudaFree(d), "cudaFree");
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", ops);
}

int main(int argc, char **argv) {
  dev = standin_gpu_each(&argc, &argv, &rank, &size);
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  setenv("HVD_STANDIN_POLLS", "40", 1);
  test_refused();
  test_three("nccl");
  test_three("mpi");
  is_int(0, standin_streams() + standin_events(),
         "hvd freed its streams and events");
  return tap_mpi_finish();
}
