/*
 * allocfail.c - one rank's host allocation failing before a device
 * collective's MPI steps (lib/base/fault.h's HVD_STANDIN_HOST_ALLOC_FAIL,
 * HVD_STANDIN_CUDA_MALLOC_LIMIT for device memory): the rank must still
 * make every MPI step its peers make, or they block in MPI for good. R is
 * the last rank; HVD_GPU_OPERATIONS=nccl, HVD_NCCL_TIMEOUT=30 (the peers
 * must not need it), every case within 10 s, each collective's failure
 * within 2 s.
 *
 *  1-3. R has joined and cannot make its stub (a host stub for a grouped
 *     allreduce, one for a lone allreduce, a stub's cudaMalloc): every
 *     other rank fails the allreduce with R's code and "rank R could not
 *     take part in the collective as a joined rank: <R's error>; nothing
 *     was launched"; then the join ends on every rank and a device
 *     allreduce works.
 *  4. R cannot hold the rows of a device allgather's MPI step (the NCCL
 *     executor's host scratch): every rank fails it with
 *     HVD_ERR_NO_MEMORY "rank R could not prepare the collective on its
 *     GPU: fused allgather: no host memory for N bytes; nothing was
 *     launched, NCCL is still usable"; then a grouped allgather is exact.
 *  5. The same for an alltoall's received splits ("could not allocate
 *     N bytes for the received splits of alltoall 'a.1'"); then an
 *     alltoall is exact.
 *  6. R cannot grow the engine's request list for a grouped allreduce of
 *     100 device tensors: every rank runs it in groups of 64 and 36 (two
 *     ncclAllReduce calls on every rank), exact; once R can, in one.
 *  7. A device group in flight on rank 0 that never ends (its NCCL call
 *     hangs, HVD_NCCL_TIMEOUT=1) while R cannot prepare an allgather: the
 *     agreement finds R unprepared, and the quiesce after it reaps rank
 *     0's group (timed out, NCCL aborted): every rank then fails the
 *     allgather with NCCL's loss (rank 0 "NCCL is unusable after an
 *     earlier failure: <why>", the others "NCCL: rank 0 aborted its NCCL
 *     communicator: <why>; ..."), not "NCCL is still usable".
 *  8. R joined while its peers keep device groups in flight (R waits for
 *     each of its own, so its slots differ from theirs) and grow their
 *     span arrays: exact, no MPI step out of step.
 * After each case hvd_shutdown returns HVD_SUCCESS and hvd has freed every
 * device and pinned allocation, stream and event it made. Registered at
 * np 2 and 3 (t/standin/local.mk); `allocfail N` runs case N only.
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gputest.h"
#include "hvd.h"
#include "hvdtest.h"
#include "standin.h"
#include "tap/tap.h"

enum { N = 64, BIG = 20000, MANY = 100 }; /* floats per tensor */

static int rank, size, dev, last;
static float *dbuf[4], *dbig, *dmany; /* device tensors */
static long allocs0;
static double t_start;

static hvd_tensor_t dtensor(float *p, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  hvd_tensor_t t = hvd_tensor_make(p, HVD_FLOAT32, 2, shape);
  t.device = dev;
  return t;
}

static void fill(float *d, int64_t n, float v) {
  float *h = malloc((size_t)n * sizeof *h);
  for (int64_t i = 0; i < n; i++)
    h[i] = v;
  cuda_ok(cudaMemcpy(d, h, (size_t)n * sizeof *h, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  free(h);
}

/* Every element of d's n is v. */
static int all_are(const float *d, int64_t n, float v) {
  float *h = malloc((size_t)n * sizeof *h);
  int same = 1;
  cuda_ok(cudaMemcpy(h, d, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  for (int64_t i = 0; i < n; i++)
    same = same && h[i] == v;
  free(h);
  return same;
}

static void start(const char *what, const char *site, const char *timeout) {
  char v[64];
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  setenv("HVD_NCCL_TIMEOUT", timeout, 1);
  snprintf(v, sizeof v, "%d:%s", last, site);
  setenv("HVD_STANDIN_HOST_ALLOC_FAIL", v, 1);
  allocs0 = standin_device_allocations();
  hvd_result_t rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", what))
    bail("hvd_init: %s", hvd_last_error());
  t_start = gpu_now_s();
}

static void stop(const char *what) {
  double took = gpu_now_s() - t_start;
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  unsetenv("HVD_STANDIN_CUDA_MALLOC_LIMIT");
  unsetenv("HVD_STANDIN_NCCL_HANG");
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown returns", what);
  tap_note("case took %.2f s", took);
  ok(took < 10, "%s: ends within 10 s", what);
  is_int(allocs0, standin_device_allocations(),
         "%s: hvd freed its device memory", what);
  is_int(0, standin_pinned_allocations(), "%s: and its pinned memory", what);
  is_int(0, standin_streams() + standin_events(),
         "%s: and its streams and events", what);
}

/* rc and its message got against want_rc and "<label>: <want>".
 * Collective: every rank makes the same checks. */
static void expect_msg(hvd_result_t rc, const char *got, hvd_result_t want_rc,
                       const char *label, const char *want, const char *what) {
  char full[2048];
  snprintf(full, sizeof full, "%s: %s", label, want);
  if (want_rc == HVD_SUCCESS)
    snprintf(full, sizeof full, "%s", "");
  is_int(want_rc, rc, "%s: %s: result", what, label);
  is_string(full, got, "%s: %s: message", what, label);
}

/* The same with hvd_last_error() as the message. */
static void expect(hvd_result_t rc, hvd_result_t want_rc, const char *label,
                   const char *want, const char *what) {
  char got[2048];
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  expect_msg(rc, got, want_rc, label, want, what);
}

/* A device allreduce of every rank's 1s over N floats is size. */
static void works(const char *name, const char *what) {
  hvd_tensor_t t = dtensor(dbuf[0], N / 4, 4);
  fill(dbuf[0], N, 1);
  hvd_result_t rc = hvd_allreduce(name, &t, &t, HVD_SUM, 1.0, 1.0);
  ok(rc == HVD_SUCCESS && all_are(dbuf[0], N, (float)size),
     "%s: a device allreduce works after it (%s)", what,
     rc == HVD_SUCCESS ? "exact" : hvd_last_error());
}

/* 1-3: R joins; the others reduce `n` tensors (`big`: of BIG floats). */
static void case_stub(int n, int big, const char *site, const char *what) {
  const char *names[2] = {"j.a", "j.b"};
  char want[1024], why[512];
  hvd_tensor_t t[2];
  if (big) {
    char v[64];
    snprintf(v, sizeof v, "%d:65536", last);
    setenv("HVD_STANDIN_CUDA_MALLOC_LIMIT", v, 1);
  }
  start(what, site, "30");
  works("j.0", what); /* NCCL's communicator made first */
  for (int i = 0; i < n; i++)
    t[i] = big ? dtensor(dbig, BIG, 1) : dtensor(dbuf[i], N / 4, 4);
  double t0 = gpu_now_s();
  hvd_result_t rc = HVD_SUCCESS, want_rc;
  if (rank != last) /* no check before the join: checks are collective */
    rc = hvd_grouped_allreduce(n, names, t, t, HVD_SUM, 1.0, 1.0);
  char got[1024];
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  int lr = -1;
  hvd_result_t jrc = hvd_join(&lr);
  double took = gpu_now_s() - t0;
  if (big)
    snprintf(why, sizeof why, "cudaMalloc: %s (cudaErrorMemoryAllocation)",
             cudaGetErrorString(cudaErrorMemoryAllocation));
  else
    snprintf(why, sizeof why, "stub for '%s': out of memory", names[n - 1]);
  want_rc = rank == last ? HVD_SUCCESS : big ? HVD_ERR_CUDA : HVD_ERR_NO_MEMORY;
  snprintf(want, sizeof want,
           "rank %d could not take part in the collective as a joined rank: "
           "%s; nothing was launched",
           last, why);
  expect_msg(rc, got, want_rc, "allreduce 'j.a'", want, what);
  ok(jrc == HVD_SUCCESS && took < 2,
     "%s: fails within 2 s, and the join ends (%.2f s)", what, took);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  unsetenv("HVD_STANDIN_CUDA_MALLOC_LIMIT");
  works("j.1", what);
  stop(what);
}

/* "rank R could not prepare the collective on its GPU: <why>; ..." */
static void unprepared(char *buf, size_t len, const char *why) {
  snprintf(buf, len,
           "rank %d could not prepare the collective on its GPU: %s; nothing "
           "was launched, NCCL is still usable",
           last, why);
}

/* A grouped device allgather of two tensors of 1 + rank and 2 rows of 4,
 * each row the rank's number; 1 when both outputs are exact. */
static hvd_result_t gather2(const char *a, const char *b, int *exact) {
  const char *names[2] = {a, b};
  hvd_tensor_t in[2] = {dtensor(dbuf[1], 1 + rank, 4), dtensor(dbuf[2], 2, 4)};
  hvd_tensor_t out[2];
  memset(out, 0, sizeof out);
  fill(dbuf[1], N, (float)rank);
  fill(dbuf[2], N, (float)rank);
  hvd_result_t rc = hvd_grouped_allgather(2, names, in, out);
  *exact = rc == HVD_SUCCESS;
  for (int i = 0; rc == HVD_SUCCESS && i < 2; i++) {
    int64_t at = 0;
    for (int q = 0; q < size; q++) {
      int64_t rows = i == 0 ? 1 + q : 2;
      *exact = *exact && all_are((float *)out[i].data + at, rows * 4, (float)q);
      at += rows * 4;
    }
    hvd_tensor_free(&out[i]);
  }
  return rc;
}

/* 4: R cannot hold the allgather's rows. */
static void case_scratch(void) {
  const char *what = "allgather scratch";
  char want[1024], why[256];
  int exact;
  start(what, "scratch", "30");
  works("s.0", what);
  double t0 = gpu_now_s();
  hvd_result_t rc = gather2("s.a", "s.b", &exact);
  snprintf(why, sizeof why, "fused allgather: no host memory for %d bytes",
           2 * 2 * size * 8);
  unprepared(want, sizeof want, why);
  expect(rc, HVD_ERR_NO_MEMORY, "allgather 's.a'", want, what);
  ok(gpu_now_s() - t0 < 2, "%s: fails within 2 s", what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = gather2("s.c", "s.d", &exact);
  ok(rc == HVD_SUCCESS && exact, "%s: the next allgather is exact", what);
  works("s.1", what);
  stop(what);
}

/* An alltoall of N/4 rows of 4 floats: one row to every other rank, the
 * rest to rank 0; each row the sender's number. 1 when exact. */
static hvd_result_t alltoall(const char *name, int *exact) {
  int64_t splits[8], rsplits[8];
  hvd_tensor_t t = dtensor(dbuf[1], N / 4, 4), out;
  memset(&out, 0, sizeof out);
  fill(dbuf[1], N, (float)rank);
  for (int q = 0; q < size; q++)
    splits[q] = q == 0 ? N / 4 - (size - 1) : 1;
  hvd_result_t rc = hvd_alltoall(name, &t, splits, &out, rsplits);
  *exact = rc == HVD_SUCCESS;
  int64_t at = 0;
  for (int q = 0; rc == HVD_SUCCESS && q < size; q++) {
    *exact = *exact && rsplits[q] == (rank == 0 ? N / 4 - (size - 1) : 1) &&
             all_are((float *)out.data + at, rsplits[q] * 4, (float)q);
    at += rsplits[q] * 4;
  }
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  return rc;
}

/* 5: R cannot hold an alltoall's received splits. */
static void case_splits(void) {
  const char *what = "alltoall splits";
  char want[1024];
  int exact;
  start(what, "splits", "30");
  works("a.0", what);
  double t0 = gpu_now_s();
  hvd_result_t rc = alltoall("a.1", &exact);
  char why[256];
  snprintf(why, sizeof why,
           "could not allocate %d bytes for the received splits of alltoall "
           "'a.1'",
           size * 8);
  unprepared(want, sizeof want, why);
  expect(rc, HVD_ERR_NO_MEMORY, "alltoall 'a.1'", want, what);
  ok(gpu_now_s() - t0 < 2, "%s: fails within 2 s", what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = alltoall("a.2", &exact);
  ok(rc == HVD_SUCCESS && exact, "%s: the next alltoall is exact", what);
  works("a.3", what);
  stop(what);
}

/* MANY device tensors of 4 floats reduced as one group: exact, and the
 * ncclAllReduce calls it took on this rank. */
static hvd_result_t many(const char *prefix, int *exact, long *calls) {
  static char names[MANY][16];
  const char *np[MANY];
  hvd_tensor_t t[MANY];
  fill(dmany, 4 * MANY, 1);
  for (int i = 0; i < MANY; i++) {
    snprintf(names[i], sizeof names[i], "%s%d", prefix, i);
    np[i] = names[i];
    t[i] = dtensor(dmany + 4 * i, 1, 4);
  }
  long c0 = standin_nccl_calls("ncclAllReduce");
  hvd_result_t rc = hvd_grouped_allreduce(MANY, np, t, t, HVD_SUM, 1.0, 1.0);
  *calls = standin_nccl_calls("ncclAllReduce") - c0;
  *exact = rc == HVD_SUCCESS && all_are(dmany, 4 * MANY, (float)size);
  return rc;
}

/* 6: R cannot grow the engine's request list. */
static void case_group(void) {
  const char *what = "group list";
  int exact;
  long calls;
  start(what, "group", "30");
  works("m.0", what);
  hvd_result_t rc = many("m.a", &exact, &calls);
  ok(rc == HVD_SUCCESS && exact, "%s: the group is exact (%s)", what,
     rc == HVD_SUCCESS ? "works" : hvd_last_error());
  is_int(2, calls, "%s: in groups of 64 and 36 on every rank", what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = many("m.b", &exact, &calls);
  ok(rc == HVD_SUCCESS && exact, "%s: then exact again", what);
  is_int(1, calls, "%s: in one group once R has the room", what);
  stop(what);
}

/* 7: rank 0's group hangs in flight (its second NCCL call) while R cannot
 * prepare an allgather; the quiesce after the agreement reaps it. */
static void case_release(void) {
  const char *what = "quiesce after the agreement";
  const char *lost = "no completion after 1 s (HVD_NCCL_TIMEOUT): a peer "
                     "failed, is gone or is stuck";
  char want[1024];
  int exact;
  hvd_request_t *req;
  setenv("HVD_STANDIN_NCCL_HANG", "0:1", 1);
  start(what, "scratch", "1");
  works("d.0", what);
  hvd_tensor_t t = dtensor(dbuf[3], N / 4, 4);
  hvd_allreduce_async("d.1", &t, &t, HVD_SUM, 1.0, 1.0, &req);
  double t0 = gpu_now_s();
  hvd_result_t rc = gather2("d.a", "d.b", &exact);
  if (rank == 0)
    snprintf(want, sizeof want, "NCCL is unusable after an earlier failure: %s",
             lost);
  else
    snprintf(want, sizeof want,
             "NCCL: rank 0 aborted its NCCL communicator: %s; the "
             "communicator was aborted",
             lost);
  expect(rc, HVD_ERR_NCCL, "allgather 'd.a'", want, what);
  ok(gpu_now_s() - t0 < 3, "%s: fails within 3 s", what);
  rc = hvd_wait(req);
  snprintf(want, sizeof want, "NCCL: %s; the communicator was aborted", lost);
  expect(rc, rank == 0 ? HVD_ERR_NCCL : HVD_SUCCESS, "allreduce 'd.1'", want,
         what);
  stop(what);
}

/* 8: R joins while the others keep three lone groups in flight, then a
 * fused group of MANY that grows their span arrays. */
static void case_slots(void) {
  const char *what = "joined rank's slots";
  hvd_request_t *req[3];
  hvd_op_t ops[3] = {HVD_SUM, HVD_MIN, HVD_MAX};
  int exact = 1, all = 1;
  long calls;
  start(what, "none", "30");
  works("e.0", what);
  if (rank != last) {
    for (int k = 0; k < 3; k++) {
      char name[16];
      hvd_tensor_t t = dtensor(dbuf[k], N / 4, 4);
      fill(dbuf[k], N, 1);
      snprintf(name, sizeof name, "e.%d", k + 1);
      hvd_allreduce_async(name, &t, &t, ops[k], 1.0, 1.0, &req[k]);
    }
    int sum_of_all; /* many's check: every rank's, but R adds 0 */
    hvd_result_t rc = many("e.m", &sum_of_all, &calls);
    for (int k = 0; k < 3; k++)
      all = all && hvd_wait(req[k]) == HVD_SUCCESS &&
            all_are(dbuf[k], N, k == 0 ? (float)(size - 1) : 1);
    exact = exact && rc == HVD_SUCCESS &&
            all_are(dmany, 4 * MANY, (float)(size - 1));
  }
  int lr = -1;
  hvd_result_t rc = hvd_join(&lr);
  ok(rc == HVD_SUCCESS && exact && all, "%s: every group exact", what);
  works("e.9", what);
  stop(what);
}

int main(int argc, char **argv) {
  dev = standin_gpu_each(&argc, &argv, &rank, &size);
  last = size - 1;
  int only = argc > 1 ? atoi(argv[1]) : 0;
  if (size < 2)
    bail("a one-sided failure needs two ranks (np 2 or more)");
  for (int k = 0; k < 4; k++)
    cuda_ok(cudaMalloc((void **)&dbuf[k], N * sizeof(float)), "cudaMalloc");
  cuda_ok(cudaMalloc((void **)&dbig, BIG * sizeof(float)), "cudaMalloc");
  cuda_ok(cudaMalloc((void **)&dmany, 4 * MANY * sizeof(float)), "cudaMalloc");
  if (!only || only == 1)
    case_stub(2, 0, "stub", "joined stub, grouped");
  if (!only || only == 2)
    case_stub(1, 0, "stub", "joined stub, alone");
  if (!only || only == 3)
    case_stub(1, 1, "none", "joined stub on its GPU");
  if (!only || only == 4)
    case_scratch();
  if (!only || only == 5)
    case_splits();
  if (!only || only == 6)
    case_group();
  if (!only || only == 7)
    case_release();
  if (!only || only == 8)
    case_slots();
  for (int k = 0; k < 4; k++)
    cuda_ok(cudaFree(dbuf[k]), "cudaFree");
  cuda_ok(cudaFree(dbig), "cudaFree");
  cuda_ok(cudaFree(dmany), "cudaFree");
  return tap_mpi_finish();
}
