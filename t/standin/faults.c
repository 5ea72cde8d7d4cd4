/*
 * faults.c - the NCCL executor's failures (lib/ops/nccl_ops.c), with faults
 * that the host stand-in injects (t/standin/standin.h), HVD_NCCL_TIMEOUT=1.
 * Every case is one hvd_init ... hvd_shutdown of its own, with device
 * allreduces of 4 float32 (rank + i on each rank, summed in place); R is
 * the last rank:
 *
 *  0. no fault: the allreduces work, hvd polled (cudaEventQuery said
 *     cudaErrorNotReady), and the communicator is non-blocking
 *     (ncclCommInitRankConfig with config.blocking = 0) on every rank;
 *  A. R's init never finishes: R's first device allreduce fails with
 *     "ncclCommInitRankConfig: still in progress after 1 s
 *     (HVD_NCCL_TIMEOUT) ...", the others' name rank R, none hangs; the
 *     next one fails at once everywhere ("NCCL is unusable after an
 *     earlier failure: <the first message>");
 *  B. R's init fails (ncclSystemError): R says NCCL's words and the
 *     stand-in's message, the others name rank R; the next device
 *     allreduce fails at once as in A (nothing is retried);
 *  C. (HVD_NCCL_TIMEOUT=30) R's third collective gets an asynchronous
 *     ncclRemoteError: R fails with NCCL's words, aborts the communicator
 *     and sends every peer its reason (an abort notice over MPI); the
 *     others' third allreduce works (R did its part); in the fourth R
 *     fails at once ("NCCL is unusable after an earlier failure"), the
 *     others fail within 2 s with "NCCL: rank R aborted its NCCL
 *     communicator: <R's reason>; the communicator was aborted", not
 *     after the timeout; in the fifth everyone fails at once; a host
 *     allreduce still works;
 *  D. R's second collective hangs: R times out ("no completion after 1 s
 *     (HVD_NCCL_TIMEOUT)"), aborts and tells the peers, whose second
 *     allreduce works; in the third R fails at once and the others with
 *     R's notice;
 *  E. R cannot allocate more than 64 KiB (case_alloc_fail says what then);
 *  F. the same under a sharded optimizer on device parameters, whose
 *     whole state R cannot gather (case_zero_alloc_fail says what then);
 * and after each case hvd_shutdown returns HVD_SUCCESS and hvd has freed
 * every device and pinned allocation, stream and event it made. Each case
 * ends within 10 s.
 *
 * Registered at np 1, 2 and 3 (t/standin/local.mk).
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gputest.h"
#include "hvd.h"
#include "hvdtest.h"
#include "standin.h"
#include "tap/tap.h"

static int rank, size, dev, last;
static float *dbuf; /* the allreduces' tensor, on this rank's GPU */
static long allocs0;

static const char timeout_msg[] =
    "no completion after 1 s (HVD_NCCL_TIMEOUT): a peer failed, is gone or "
    "is stuck";

/* One device allreduce: its result, its message ("" when it worked), and
 * whether the sums are exact when it worked. */
static hvd_result_t dev_allreduce(const char *name, char *msg, size_t len,
                                  int *good) {
  float h[4];
  int64_t shape[1] = {4};
  for (int i = 0; i < 4; i++)
    h[i] = (float)(rank + i);
  cuda_ok(cudaMemcpy(dbuf, h, sizeof h, cudaMemcpyHostToDevice), "H2D");
  hvd_tensor_t t = hvd_tensor_make(dbuf, HVD_FLOAT32, 1, shape);
  t.device = dev;
  hvd_result_t rc = hvd_allreduce(name, &t, &t, HVD_SUM, 1.0, 1.0);
  snprintf(msg, len, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  *good = 0;
  if (rc == HVD_SUCCESS) {
    cuda_ok(cudaMemcpy(h, dbuf, sizeof h, cudaMemcpyDeviceToHost), "D2H");
    *good = 1;
    for (int i = 0; i < 4; i++)
      *good &= h[i] == (float)(size * (size - 1) / 2 + size * i);
    if (!*good)
      snprintf(msg, len, "got {%g, %g, %g, %g}", h[0], h[1], h[2], h[3]);
  }
  return rc;
}

/* A device allreduce that must work everywhere. */
static void works(const char *name, const char *what) {
  char msg[1024];
  int good;
  hvd_result_t rc = dev_allreduce(name, msg, sizeof msg, &good);
  tap_note("rc %d: %s", rc, msg);
  ok(rc == HVD_SUCCESS && good, "%s: allreduce '%s' works, sums exact", what,
     name);
}

/* A device allreduce whose result and message on this rank are want_rc and
 * "allreduce 'name': want" (want_rc HVD_SUCCESS: it works, sums exact). */
static void expect(const char *name, hvd_result_t want_rc, const char *want,
                   const char *what) {
  char msg[1024], full[1024];
  int good;
  hvd_result_t rc = dev_allreduce(name, msg, sizeof msg, &good);
  is_int(want_rc, rc, "%s: allreduce '%s': result", what, name);
  if (want_rc == HVD_SUCCESS) {
    tap_note("%s", msg);
    ok(rc == HVD_SUCCESS && good, "%s: allreduce '%s': sums exact", what, name);
    return;
  }
  snprintf(full, sizeof full, "allreduce '%s': %s", name, want);
  is_string(full, msg, "%s: allreduce '%s': message", what, name);
}

/* "NCCL is unusable after an earlier failure: <why>" */
static const char *unusable(char *buf, size_t len, const char *why) {
  snprintf(buf, len, "NCCL is unusable after an earlier failure: %s", why);
  return buf;
}

static double t_start;

/* HVD_NCCL_TIMEOUT for the next case (start sets it, then back to 1). */
static const char *nccl_timeout = "1";

static void start(const char *what) {
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  setenv("HVD_NCCL_TIMEOUT", nccl_timeout, 1);
  nccl_timeout = "1";
  allocs0 = standin_device_allocations();
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", what))
    bail("hvd_init: %s", hvd_last_error());
  t_start = gpu_now_s();
}

/* hvd_shutdown, then nothing of hvd's left on the device. */
static void stop(const char *what) {
  double took = gpu_now_s() - t_start;
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown returns", what);
  tap_note("case took %.2f s", took);
  ok(took < 10, "%s: ends within 10 s", what);
  is_int(allocs0, standin_device_allocations(),
         "%s: hvd freed its device memory", what);
  is_int(0, standin_pinned_allocations(), "%s: and its pinned memory", what);
  is_int(0, standin_streams() + standin_events(),
         "%s: and its streams and events", what);
  unsetenv("HVD_STANDIN_NCCL_INIT_HANG");
  unsetenv("HVD_STANDIN_NCCL_INIT_FAIL");
  unsetenv("HVD_STANDIN_NCCL_ASYNC_ERROR");
  unsetenv("HVD_STANDIN_NCCL_HANG");
}

static void setenv_rank(const char *name, const char *fmt, int n) {
  char v[64];
  snprintf(v, sizeof v, fmt, last, n);
  setenv(name, v, 1);
}

static void case_none(void) {
  const char *what = "no fault";
  start(what);
  long polls0 = standin_not_ready_answers();
  works("n.1", what);
  works("n.2", what);
  ok(standin_not_ready_answers() > polls0,
     "%s: hvd polled cudaEventQuery while it said cudaErrorNotReady", what);
  int blocking = standin_nccl_last_blocking();
  MPI_Allreduce(MPI_IN_PLACE, &blocking, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  is_int(0, blocking,
         "%s: every rank's communicator is non-blocking "
         "(ncclCommInitRankConfig, config.blocking = 0)",
         what);
  stop(what);
}

/* A and B: R's init did not work (on R: mine); the first device
 * allreduce fails with that on R and names R on the others, the second
 * fails at once with the first's message. */
static void init_failed(const char *what, const char *n1, const char *n2,
                        const char *mine) {
  char want[512], again[1024];
  if (rank == last)
    snprintf(want, sizeof want, "%s", mine);
  else
    snprintf(want, sizeof want,
             "NCCL: ncclCommInitRankConfig failed on rank %d (its "
             "hvd_last_error says why)",
             last);
  expect(n1, HVD_ERR_NCCL, want, what);
  expect(n2, HVD_ERR_NCCL, unusable(again, sizeof again, want), what);
}

static void case_init_hang(void) {
  const char *what = "init never finishes";
  setenv_rank("HVD_STANDIN_NCCL_INIT_HANG", "%d", 0);
  start(what);
  init_failed(what, "a.1", "a.2",
              "ncclCommInitRankConfig: still in progress after 1 s "
              "(HVD_NCCL_TIMEOUT): a peer failed, is gone or is stuck");
  stop(what);
}

static void case_init_fail(void) {
  const char *what = "init fails";
  char mine[512];
  setenv_rank("HVD_STANDIN_NCCL_INIT_FAIL", "%d", 0);
  start(what);
  snprintf(mine, sizeof mine,
           "ncclCommInitRankConfig: %s (stand-in: ncclCommInitRankConfig "
           "failed on rank %d as asked (HVD_STANDIN_NCCL_INIT_FAIL=%d))",
           ncclGetErrorString(ncclSystemError), last, last);
  init_failed(what, "b.1", "b.2", mine);
  stop(what);
}

/* C and D: R's collective `name` fails with why and R aborts; the
 * others' works (R did its part). */
static void last_aborts(const char *name, const char *why, const char *what) {
  char want[1024];
  if (rank != last) {
    expect(name, HVD_SUCCESS, "", what);
    return;
  }
  snprintf(want, sizeof want, "NCCL: %s; the communicator was aborted", why);
  expect(name, HVD_ERR_NCCL, want, what);
}

/* Then: R fails at once (its abort's why); the others have R's abort
 * notice (its why), at once or while they wait for R in vain, and abort
 * in turn: within 2 s, whatever HVD_NCCL_TIMEOUT. */
static void peers_learn(const char *name, const char *why, const char *what) {
  char want[1024];
  if (rank == last)
    unusable(want, sizeof want, why);
  else
    snprintf(want, sizeof want,
             "NCCL: rank %d aborted its NCCL communicator: %s; the "
             "communicator was aborted",
             last, why);
  double t0 = gpu_now_s();
  expect(name, HVD_ERR_NCCL, want, what);
  double took = gpu_now_s() - t0;
  ok(took < 2, "%s: allreduce '%s' ends within 2 s (%.2f s)", what, name,
     took);
}

static void case_async_error(void) {
  const char *what = "asynchronous error";
  char async[512], want[2048];
  setenv_rank("HVD_STANDIN_NCCL_ASYNC_ERROR", "%d:%d", 2);
  nccl_timeout = "30"; /* the peers must not need it */
  start(what);
  works("c.1", what);
  works("c.2", what);
  snprintf(async, sizeof async,
           "ncclAllReduce: %s (stand-in: asynchronous ncclRemoteError on "
           "rank %d after 2 calls as asked (HVD_STANDIN_NCCL_ASYNC_ERROR))",
           ncclGetErrorString(ncclRemoteError), last);
  last_aborts("c.3", async, what);
  peers_learn("c.4", async, what);
  /* 5: everyone at once, each with its own reason */
  char peer[1024];
  snprintf(peer, sizeof peer, "rank %d aborted its NCCL communicator: %s",
           last, async);
  unusable(want, sizeof want, rank == last ? async : peer);
  expect("c.5", HVD_ERR_NCCL, want, what);
  /* host tensors do not need NCCL */
  float x = (float)rank, y = -1;
  int64_t shape[1] = {1};
  hvd_tensor_t s = hvd_tensor_make(&x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(&y, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce("c.host", &s, &r, HVD_SUM, 1.0, 1.0);
  tap_note("rc %d (%s), y = %g", rc, hvd_last_error(), y);
  ok(rc == HVD_SUCCESS && y == (float)(size * (size - 1) / 2),
     "%s: a host allreduce still works", what);
  stop(what);
}

static void case_hang(void) {
  const char *what = "hung collective";
  setenv_rank("HVD_STANDIN_NCCL_HANG", "%d:%d", 1);
  start(what);
  works("d.1", what);
  last_aborts("d.2", timeout_msg, what); /* R times out */
  peers_learn("d.3", timeout_msg, what);
  stop(what);
}

/* E: R's cudaMalloc of more than 64 KiB fails
 * (HVD_STANDIN_CUDA_MALLOC_LIMIT). At np >= 2 an allgather whose output
 * (P x 64 KiB) R cannot allocate, and a grouped allreduce whose fusion
 * buffer (1 MiB at least) R cannot allocate, fail on every rank with the
 * same words naming R, at once (nothing launched, no timeout); a lone
 * allreduce works after each: the communicator was kept. At np 1 both
 * work (the output fits, one rank needs no fusion buffer). */
static void case_alloc_fail(void) {
  const char *what = "device allocation fails";
  char v[64], want[1024], got[1024];
  enum { N = 16384 }; /* 64 KiB of float32: R may still allocate that */
  snprintf(v, sizeof v, "%d:%d", last, N * 4);
  setenv("HVD_STANDIN_CUDA_MALLOC_LIMIT", v, 1);
  start(what);
  works("e.1", what);
  snprintf(want, sizeof want,
           "rank %d could not prepare the collective on its GPU: cudaMalloc: "
           "out of memory (cudaErrorMemoryAllocation); nothing was launched, "
           "NCCL is still usable",
           last);
  float *d = NULL, *d2 = NULL;
  cuda_ok(cudaMalloc((void **)&d, N * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMalloc((void **)&d2, N * sizeof *d2), "cudaMalloc");
  cuda_ok(cudaMemset(d, 0, N * sizeof *d), "cudaMemset");
  cuda_ok(cudaMemset(d2, 0, N * sizeof *d2), "cudaMemset");
  int64_t shape[1] = {N};
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, shape), out;
  hvd_tensor_t t2 = hvd_tensor_make(d2, HVD_FLOAT32, 1, shape);
  t.device = t2.device = dev;
  double t0 = gpu_now_s();
  hvd_result_t rc = hvd_allgather("e.2", &t, &out);
  double took = gpu_now_s() - t0;
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  if (size == 1) {
    is_int(HVD_SUCCESS, rc, "%s: np 1: the allgather's output fits", what);
  } else {
    char full[1100];
    snprintf(full, sizeof full, "allgather 'e.2': %s", want);
    is_int(HVD_ERR_CUDA, rc, "%s: allgather: HVD_ERR_CUDA on every rank", what);
    is_string(full, got, "%s: allgather: the same words on every rank", what);
  }
  ok(took < 2, "%s: allgather: ends within 2 s (%.2f s)", what, took);
  works("e.3", what);
  const char *names[2] = {"e.4a", "e.4b"};
  hvd_tensor_t ins[2] = {t, t2};
  t0 = gpu_now_s();
  rc = hvd_grouped_allreduce(2, names, ins, ins, HVD_SUM, 1.0, 1.0);
  took = gpu_now_s() - t0;
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (size == 1) {
    is_int(HVD_SUCCESS, rc, "%s: np 1: the grouped allreduce (no buffer)",
           what);
  } else {
    is_int(HVD_ERR_CUDA, rc, "%s: grouped allreduce: HVD_ERR_CUDA everywhere",
           what);
    char full[1100];
    snprintf(full, sizeof full, "allreduce 'e.4a': %s", want);
    is_string(full, got, "%s: grouped allreduce: the same words on every rank",
              what);
  }
  ok(took < 2, "%s: grouped allreduce: ends within 2 s (%.2f s)", what, took);
  works("e.5", what);
  cuda_ok(cudaFree(d), "cudaFree");
  cuda_ok(cudaFree(d2), "cudaFree");
  stop(what);
  unsetenv("HVD_STANDIN_CUDA_MALLOC_LIMIT");
}

/* F. A sharded Adam (ZeRO-1) over two device parameters, p0 of 65536
 * floats (256 KiB) and p1 of 17, one step taken; then R cannot allocate
 * more than 64 KiB, so it could not hold the whole state (256 KiB
 * tensors). None of the three calls unshards it on R:
 * hvd_broadcast_optimizer_state sends only the scalars (each block has
 * one owner already) and an hvd_state commit copies each rank's blocks
 * to host memory: both work; hvd_checkpoint_save gathers the state on
 * rank 0 only: with R not rank 0 it works, and at np 1 (R is rank 0) the
 * alltoall that would give rank 0 the state fails, named, within 2 s.
 * With the limit gone the step and the three calls work again. */
typedef struct zmodel {
  float *v[2], *g[2];
  hvd_param_t p[2];
  hvd_optimizer_t *opt;
} zmodel_t;

static void zmodel_make(zmodel_t *m) {
  static const int64_t n[2] = {65536, 17};
  static const char *const names[2] = {"f.p0", "f.p1"};
  for (int i = 0; i < 2; i++) {
    size_t bytes = (size_t)n[i] * sizeof(float);
    cuda_ok(cudaMalloc((void **)&m->v[i], bytes), "cudaMalloc");
    cuda_ok(cudaMalloc((void **)&m->g[i], bytes), "cudaMalloc");
    cuda_ok(cudaMemset(m->v[i], 0, bytes), "cudaMemset");
    cuda_ok(cudaMemset(m->g[i], 0, bytes), "cudaMemset");
    m->p[i].name = names[i];
    m->p[i].value = hvd_tensor_make(m->v[i], HVD_FLOAT32, 1, &n[i]);
    m->p[i].value.device = dev;
    m->p[i].grad = m->p[i].value;
    m->p[i].grad.data = m->g[i];
  }
  hvd_adam_options_t ao;
  hvd_distributed_options_t o;
  hvd_optimizer_t *base = NULL;
  hvd_adam_options_init(&ao);
  hvd_distributed_options_init(&o);
  o.shard_optimizer_state = 1;
  if (hvd_adam_create(m->p, 2, &ao, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &m->opt) != HVD_SUCCESS)
    bail("a sharded Adam: %s", hvd_last_error());
}

static void zmodel_free(zmodel_t *m) {
  hvd_optimizer_destroy(m->opt);
  for (int i = 0; i < 2; i++) {
    cuda_ok(cudaFree(m->v[i]), "cudaFree");
    cuda_ok(cudaFree(m->g[i]), "cudaFree");
  }
}

/* A step of gradients as they are (zero): both ready, then the update. */
static hvd_result_t zstep(zmodel_t *m) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 1; i >= 0 && rc == HVD_SUCCESS; i--)
    rc = hvd_optimizer_grad_ready(m->opt, i);
  return rc == HVD_SUCCESS ? hvd_optimizer_step(m->opt) : rc;
}

/* The three gathering calls; 0 each that succeeds, else its result with
 * its message in msgs[k]. */
static void zgather(zmodel_t *m, const char *path, hvd_state_t *st,
                    hvd_result_t rcs[3], char msgs[3][1024], double *took) {
  double t0 = gpu_now_s();
  rcs[0] = hvd_checkpoint_save(path, m->p, 2, m->opt, 1);
  snprintf(msgs[0], 1024, "%s", rcs[0] ? hvd_last_error() : "");
  rcs[1] = hvd_broadcast_optimizer_state(m->opt, 0);
  snprintf(msgs[1], 1024, "%s", rcs[1] ? hvd_last_error() : "");
  rcs[2] = hvd_state_commit(st);
  snprintf(msgs[2], 1024, "%s", rcs[2] ? hvd_last_error() : "");
  *took = gpu_now_s() - t0;
}

static void case_zero_alloc_fail(void) {
  static const char *const calls[3] = {
      "hvd_checkpoint_save", "hvd_broadcast_optimizer_state",
      "hvd_state_commit"};
  const char *what = "sharded state, allocation fails";
  char dir[1024], path[1100], v[64], msgs[3][1024];
  hvd_result_t rcs[3];
  double took;
  zmodel_t m;
  hvd_state_t *st = NULL;
  start(what);
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-faults-zero");
  snprintf(path, sizeof path, "%s/z.ckpt", dir);
  zmodel_make(&m);
  if (hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, m.p, 2, m.opt) != HVD_SUCCESS)
    bail("hvd_state: %s", hvd_last_error());
  if (!ok(zstep(&m) == HVD_SUCCESS, "%s: a step", what))
    diag("%s", hvd_last_error());
  snprintf(v, sizeof v, "%d:%d", last, 65536);
  setenv("HVD_STANDIN_CUDA_MALLOC_LIMIT", v, 1);
  zgather(&m, path, st, rcs, msgs, &took);
  unsetenv("HVD_STANDIN_CUDA_MALLOC_LIMIT");
  if (last != 0)
    is_int(HVD_SUCCESS, rcs[0],
           "%s: hvd_checkpoint_save works: rank %d sends its blocks to rank "
           "0 and holds no full state (%s)",
           what, last, msgs[0]);
  else if (is_int(HVD_ERR_CUDA, rcs[0], "%s: at np 1 hvd_checkpoint_save fails",
                  what))
    is_string("the full optimizer state on rank 0: alltoall "
              "'hvd.zero.f.p0.state0.root': rank 0 could not prepare the "
              "collective on its GPU: cudaMalloc: out of memory "
              "(cudaErrorMemoryAllocation); nothing was launched, NCCL is "
              "still usable",
              msgs[0], "%s: at np 1 hvd_checkpoint_save fails, naming the "
              "gather to rank 0", what);
  is_int(HVD_SUCCESS, rcs[1],
         "%s: %s works: only the scalars travel, no full state (%s)", what,
         calls[1], msgs[1]);
  is_int(HVD_SUCCESS, rcs[2],
         "%s: hvd_state_commit works: the blocks are copied, no full state "
         "(%s)",
         what, msgs[2]);
  ok(took < 2 * 3, "%s: the three return within 2 s each (%.2f s)", what,
     took);
  if (!ok(zstep(&m) == HVD_SUCCESS, "%s: the next step works", what))
    diag("%s", hvd_last_error());
  zgather(&m, path, st, rcs, msgs, &took);
  ok(rcs[0] == HVD_SUCCESS && rcs[1] == HVD_SUCCESS && rcs[2] == HVD_SUCCESS,
     "%s: without the limit the three work (%s%s%s)", what, msgs[0], msgs[1],
     msgs[2]);
  hvd_state_destroy(st);
  zmodel_free(&m);
  hvdt_remove_tmpdir(dir);
  stop(what);
}

int main(int argc, char **argv) {
  dev = standin_gpu_each(&argc, &argv, &rank, &size);
  last = size - 1;
  cuda_ok(cudaMalloc((void **)&dbuf, 4 * sizeof *dbuf), "cudaMalloc");
  case_none();
  case_init_hang();
  case_init_fail();
  case_async_error();
  case_hang();
  case_alloc_fail();
  case_zero_alloc_fail();
  cuda_ok(cudaFree(dbuf), "cudaFree");
  return tap_mpi_finish();
}
