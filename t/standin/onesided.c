/*
 * onesided.c - an NCCL failure on one rank only, before a device
 * collective that has MPI steps (lib/ops/nccl_ops.c, nccl_run): the
 * failed rank must still take part in them, or a peer that has not yet
 * read its abort notice blocks in MPI for good. R is the last rank; its
 * second NCCL call gets an asynchronous error after doing its part
 * (HVD_STANDIN_NCCL_ASYNC_ERROR=R:1), HVD_NCCL_TIMEOUT=30, so that only
 * the agreement can end a peer's wait within the bound.
 *
 * The notice is what made the hang a race (a peer that had read it failed
 * at once, with no MPI step). Here the peers do not see it while a case
 * runs: this program's MPI_Iprobe hides hvd's notice tag, as if the
 * notice were still on its way, so that the old engine hangs every time.
 *
 *  1-4. For each kind whose body has MPI steps (an allgather, an alltoall,
 *     a grouped allreduce through the fusion buffer, a reducescatter):
 *     o.1 works; o.2 fails on R with NCCL's words and works on the
 *     others (R did its part); then o.3 of that kind fails on every rank
 *     within 2 s: on R "NCCL is unusable after an earlier failure: <R's
 *     reason>", on the others "NCCL: rank R aborted its NCCL
 *     communicator: <R's reason>; the communicator was aborted" (as a
 *     notice would have said); o.4, a device allreduce, fails at once on
 *     every rank ("NCCL is unusable after an earlier failure: ...", each
 *     with its own reason), and a host allreduce still works.
 *  5. The reviewer's race, notices visible: three unfusable device
 *     allreduces and an allgather submitted at once, the second failing
 *     on R; the allgather fails on every rank within 2 s with R's reason
 *     (on a peer, aborted in the allgather's own quiesce or by the
 *     agreement), the next allreduce at once on every rank.
 * After each case hvd_shutdown returns HVD_SUCCESS and hvd has freed every
 * device and pinned allocation, stream and event it made; each case ends
 * within 10 s. Registered at np 2 and 3 (t/standin/local.mk).
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gputest.h"
#include "hvd.h"
#include "hvdtest.h"
#include "standin.h"
#include "tap/tap.h"

/* lib/ops/nccl_fail.c's NOTICE_TAG, on the executor's communicator. */
#define NOTICE_TAG 0x4e43

static atomic_int late;    /* hide the notices from hvd */
static atomic_long hidden; /* probes for one answered "none" meanwhile */

/* hvd's notices are read by MPI_Iprobe on their tag; while `late`, none
 * has come yet (the notice itself is left in MPI, read at close). */
int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag,
               MPI_Status *status) {
  if (tag == NOTICE_TAG && atomic_load(&late)) {
    atomic_fetch_add(&hidden, 1);
    *flag = 0;
    return MPI_SUCCESS;
  }
  return PMPI_Iprobe(source, tag, comm, flag, status);
}

enum { N = 64 }; /* floats per tensor: 16 rows of 4 */

static int rank, size, dev, last;
static float *dbuf[4]; /* device tensors */
static long allocs0;
static double t_start;
static char async_why[512]; /* R's reason */

static hvd_tensor_t dtensor(int k, int64_t rows) {
  int64_t shape[2] = {rows, 4};
  hvd_tensor_t t = hvd_tensor_make(dbuf[k], HVD_FLOAT32, 2, shape);
  t.device = dev;
  return t;
}

static void start(const char *what) {
  char v[64];
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  setenv("HVD_NCCL_TIMEOUT", "30", 1); /* the peers must not need it */
  snprintf(v, sizeof v, "%d:1", last);
  setenv("HVD_STANDIN_NCCL_ASYNC_ERROR", v, 1);
  allocs0 = standin_device_allocations();
  hvd_result_t rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", what))
    bail("hvd_init: %s", hvd_last_error());
  t_start = gpu_now_s();
}

static void stop(const char *what) {
  double took = gpu_now_s() - t_start;
  atomic_store(&late, 0);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown returns", what);
  tap_note("case took %.2f s", took);
  ok(took < 10, "%s: ends within 10 s", what);
  is_int(allocs0, standin_device_allocations(),
         "%s: hvd freed its device memory", what);
  is_int(0, standin_pinned_allocations(), "%s: and its pinned memory", what);
  is_int(0, standin_streams() + standin_events(),
         "%s: and its streams and events", what);
  unsetenv("HVD_STANDIN_NCCL_ASYNC_ERROR");
}

/* rc and hvd_last_error() against want_rc and "<label>: <want>" (no
 * message when it works). The checks are collective (t/tap): every rank
 * makes the same ones. */
static void expect(hvd_result_t rc, const char *got, hvd_result_t want_rc,
                   const char *label, const char *want, const char *what) {
  char full[2048];
  is_int(want_rc, rc, "%s: %s: result", what, label);
  snprintf(full, sizeof full, "%s: %s", label,
           want_rc == HVD_SUCCESS ? "" : want);
  if (want_rc == HVD_SUCCESS)
    snprintf(full, sizeof full, "%s", got);
  is_string(full, got, "%s: %s: message", what, label);
}

static hvd_result_t dev_allreduce(const char *name, char *msg, size_t len) {
  hvd_tensor_t t = dtensor(0, N / 4);
  hvd_result_t rc = hvd_allreduce(name, &t, &t, HVD_SUM, 1.0, 1.0);
  snprintf(msg, len, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  return rc;
}

/* "NCCL: rank R aborted its NCCL communicator: <R's reason>; ..." on a
 * peer, "NCCL is unusable after an earlier failure: <it>" on R. */
static void words(char *buf, size_t len) {
  if (rank == last)
    snprintf(buf, len, "NCCL is unusable after an earlier failure: %s",
             async_why);
  else
    snprintf(buf, len,
             "NCCL: rank %d aborted its NCCL communicator: %s; the "
             "communicator was aborted",
             last, async_why);
}

/* Then everything on the device fails at once, each rank with its own
 * reason; the host still works. */
static void afterwards(const char *name, const char *what) {
  char msg[2048], want[2048];
  double t0 = gpu_now_s();
  hvd_result_t rc = dev_allreduce(name, msg, sizeof msg);
  if (rank == last)
    snprintf(want, sizeof want, "NCCL is unusable after an earlier failure: %s",
             async_why);
  else
    snprintf(want, sizeof want,
             "NCCL is unusable after an earlier failure: rank %d aborted its "
             "NCCL communicator: %s",
             last, async_why);
  char label[64];
  snprintf(label, sizeof label, "allreduce '%s'", name);
  expect(rc, msg, HVD_ERR_NCCL, label, want, what);
  ok(gpu_now_s() - t0 < 1, "%s: %s fails at once", what, label);
  float x = (float)rank, y = -1;
  int64_t one[1] = {1};
  hvd_tensor_t s = hvd_tensor_make(&x, HVD_FLOAT32, 1, one);
  hvd_tensor_t r = hvd_tensor_make(&y, HVD_FLOAT32, 1, one);
  rc = hvd_allreduce("o.host", &s, &r, HVD_SUM, 1.0, 1.0);
  ok(rc == HVD_SUCCESS && y == (float)(size * (size - 1) / 2),
     "%s: a host allreduce still works", what);
}

/* Collective o.3 of one kind; its result, message and label. */
static hvd_result_t third(int kind, char *msg, size_t len, char *label,
                          size_t llen) {
  hvd_tensor_t t = dtensor(1, N / 4), out;
  hvd_result_t rc;
  int64_t splits[4] = {0}, rsplits[4];
  const char *names[2] = {"o.3a", "o.3b"};
  hvd_tensor_t ins[2] = {dtensor(1, N / 4), dtensor(2, N / 4)};
  memset(&out, 0, sizeof out);
  switch (kind) {
  case 0:
    snprintf(label, llen, "allgather 'o.3'");
    rc = hvd_allgather("o.3", &t, &out);
    break;
  case 1:
    snprintf(label, llen, "alltoall 'o.3'");
    for (int q = 0; q < size; q++)
      splits[q] = q == 0 ? N / 4 - (size - 1) : 1;
    rc = hvd_alltoall("o.3", &t, splits, &out, rsplits);
    break;
  case 2:
    snprintf(label, llen, "allreduce 'o.3a'");
    rc = hvd_grouped_allreduce(2, names, ins, ins, HVD_SUM, 1.0, 1.0);
    break;
  default:
    snprintf(label, llen, "reducescatter 'o.3'");
    rc = hvd_reducescatter("o.3", &t, &out, HVD_SUM, 1.0, 1.0);
  }
  snprintf(msg, len, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (rc == HVD_SUCCESS && kind != 2)
    hvd_tensor_free(&out);
  return rc;
}

/* 1-4: R fails alone (o.2, waited for), then a collective of `kind`. */
static void case_kind(int kind, const char *what) {
  char msg[2048], want[2048], label[64];
  start(what);
  atomic_store(&hidden, 0);
  hvd_result_t rc = dev_allreduce("o.1", msg, sizeof msg);
  ok(rc == HVD_SUCCESS, "%s: o.1 works (%s)", what, msg);
  atomic_store(&late, 1);
  rc = dev_allreduce("o.2", msg, sizeof msg);
  snprintf(want, sizeof want, "NCCL: %s; the communicator was aborted",
           async_why);
  expect(rc, msg, rank == last ? HVD_ERR_NCCL : HVD_SUCCESS, "allreduce 'o.2'",
         want, what);
  double t0 = gpu_now_s();
  rc = third(kind, msg, sizeof msg, label, sizeof label);
  double took = gpu_now_s() - t0;
  words(want, sizeof want);
  expect(rc, msg, HVD_ERR_NCCL, label, want, what);
  ok(took < 2, "%s: %s fails within 2 s (%.2f s)", what, label, took);
  ok(rank == last || atomic_load(&hidden) > 0,
     "%s: the peers probed for R's notice in vain", what);
  afterwards("o.4", what);
  stop(what);
}

/* 5: the reviewer's quiesce_err, notices visible: the peers learn from
 * the notice (in the allgather's quiesce or before) or from the
 * agreement, so a peer's words are either. */
static void case_race(void) {
  const char *what = "in flight, notices visible";
  char want[2048], want2[2048], msg[2048];
  hvd_op_t ops[3] = {HVD_SUM, HVD_MIN, HVD_MAX};
  hvd_request_t *req[3], *g;
  start(what);
  hvd_tensor_t t[3], in = dtensor(3, N / 4), out = {0};
  double t0 = gpu_now_s();
  for (int k = 0; k < 3; k++) {
    char name[16];
    snprintf(name, sizeof name, "r.%d", k);
    t[k] = dtensor(k, N / 4);
    hvd_allreduce_async(name, &t[k], &t[k], ops[k], 1.0, 1.0, &req[k]);
  }
  hvd_allgather_async("r.g", &in, &out, &g);
  for (int k = 0; k < 3; k++) {
    hvd_result_t rc = hvd_wait(req[k]);
    tap_note("r.%d: %s", k, rc == HVD_SUCCESS ? "works" : hvd_last_error());
  }
  hvd_result_t rc = hvd_wait(g);
  snprintf(msg, sizeof msg, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  double took = gpu_now_s() - t0;
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  words(want, sizeof want);
  snprintf(want2, sizeof want2,
           "allgather 'r.g': NCCL is unusable after an earlier failure: rank "
           "%d aborted its NCCL communicator: %s",
           last, async_why);
  is_int(HVD_ERR_NCCL, rc, "%s: the allgather fails", what);
  char full[2100];
  snprintf(full, sizeof full, "allgather 'r.g': %s", want);
  tap_note("rank %d: %s", rank, msg);
  ok(strcmp(msg, full) == 0 || (rank != last && !strcmp(msg, want2)),
     "%s: with R's reason", what);
  ok(took < 2, "%s: within 2 s (%.2f s)", what, took);
  afterwards("r.next", what);
  stop(what);
}

int main(int argc, char **argv) {
  dev = standin_gpu_each(&argc, &argv, &rank, &size);
  last = size - 1;
  if (size < 2)
    bail("a one-sided failure needs two ranks (np 2 or more)");
  snprintf(async_why, sizeof async_why,
           "ncclAllReduce: %s (stand-in: asynchronous ncclRemoteError on "
           "rank %d after 1 calls as asked (HVD_STANDIN_NCCL_ASYNC_ERROR))",
           ncclGetErrorString(ncclRemoteError), last);
  for (int k = 0; k < 4; k++) {
    cuda_ok(cudaMalloc((void **)&dbuf[k], N * sizeof(float)), "cudaMalloc");
    cuda_ok(cudaMemset(dbuf[k], 0, N * sizeof(float)), "cudaMemset");
  }
  case_kind(0, "allgather");
  case_kind(1, "alltoall");
  case_kind(2, "grouped allreduce");
  case_kind(3, "reducescatter");
  case_race();
  for (int k = 0; k < 4; k++)
    cuda_ok(cudaFree(dbuf[k]), "cudaFree");
  return tap_mpi_finish();
}
