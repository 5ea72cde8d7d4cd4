/*
 * selftest.c - the host stand-in itself (standin.h), called directly as a
 * program would call CUDA and NCCL, for what libhvd's code may not reach:
 *
 *  - CUDA: devices with distinct bus ids; cudaErrorInvalidDevice and the
 *    per-thread last error; new device memory is 0xa5, not zero; pointer
 *    attributes; an event says cudaErrorNotReady HVD_STANDIN_POLLS times
 *    (2) and then cudaSuccess; cudaEventElapsedTime's answers as CUDA's
 *    (an event never recorded or made with cudaEventDisableTiming, one
 *    not yet complete; the time between two, an earlier event of a
 *    stream complete once a later one was synchronised; an event behind
 *    standin_stream_busy's device time, and one on a stream waiting for
 *    it, fire after that time); the allocation counts;
 *  - NCCL, blocking and non-blocking communicators: init (ncclInProgress,
 *    then HVD_STANDIN_POLLS answers of ncclInProgress before ncclSuccess
 *    for a non-blocking one), allreduce of float32, float16, bfloat16 and
 *    int32 with sum, max, min and product, reducescatter, allgather, a
 *    group of broadcasts and one of send/recv around the ring
 *    (ncclGroupEnd says ncclInProgress for a non-blocking one), finalize
 *    (polled) and destroy;
 *  - faults, non-blocking: the last rank's init never finishes (still
 *    ncclInProgress after 50 polls) while the others' does, and
 *    ncclCommAbort ends it; the last rank's second allreduce gets
 *    ncclRemoteError with the stand-in's ncclGetLastError, its stream
 *    never finishes, the others' works; after the last rank aborts, the
 *    others' next allreduce never finishes until they abort too.
 *
 * Registered at np 1, 2 and 3 (t/standin/local.mk).
 *
 * `selftest race|war|pinned|perthread MODE` (t/standin/stream_order.sh)
 * break the stream order, or keep it, one way each (the comment above
 * each function says how).
 *
 * `selftest overlap CALL WHERE` (t/standin/overlap.sh) overlaps a call's
 * buffers other than in place; `selftest order` (2 ranks;
 * t/standin/order.sh) breaks NCCL's order rule
 * from two threads per rank: rank 0 issues an allreduce on communicator A
 * at once and one on B 0.2 s later, rank 1 the same the other way round.
 * Neither deadlocks, but the ranks disagree on the order; with
 * HVD_STANDIN_NCCL_ORDER=1 the stand-in ends the process naming both
 * communicators, without it the program prints "order: done" and exits 0.
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/half.h"
#include "gputest.h"
#include "hvd.h"
#include "standin.h"
#include "tap/tap.h"

static int rank, size, last;

/* Polls until the state is not ncclInProgress (at most 1000 polls);
 * *polls: the ncclInProgress answers. */
static ncclResult_t settle(ncclComm_t c, int *polls) {
  ncclResult_t st = ncclInProgress;
  *polls = 0;
  for (int i = 0; i < 1000; i++) {
    if (ncclCommGetAsyncError(c, &st) != ncclSuccess)
      bail("ncclCommGetAsyncError failed");
    if (st != ncclInProgress)
      break;
    (*polls)++;
  }
  return st;
}

/* What a call returns: ncclSuccess on a blocking communicator,
 * ncclInProgress on a non-blocking one, then ncclSuccess after 2 polls. */
static void returned(ncclComm_t c, int blocking, ncclResult_t r,
                     const char *what) {
  int polls;
  is_int(blocking ? ncclSuccess : ncclInProgress, r, "%s returns %s", what,
         blocking ? "ncclSuccess" : "ncclInProgress");
  ncclResult_t st = settle(c, &polls);
  is_int(ncclSuccess, st, "%s: then the state is ncclSuccess", what);
  is_int(blocking ? 0 : 2, polls, "%s: after %d polls", what, blocking ? 0 : 2);
}

static ncclComm_t make_comm(int blocking, const char *what, ncclResult_t *r) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking;
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    bail("ncclGetUniqueId");
  MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  *r = ncclCommInitRankConfig(&c, size, id, rank, &config);
  (void)what;
  return c;
}

/* cudaEventElapsedTime on stream s: CUDA's answers, exactly. */
static void test_elapsed(cudaStream_t s) {
  cudaEvent_t a, b, c, off;
  float ms = -1;
  cuda_ok(cudaEventCreate(&a), "timed event a");
  cuda_ok(cudaEventCreateWithFlags(&b, cudaEventDefault), "timed event b");
  cuda_ok(cudaEventCreate(&c), "timed event c");
  cuda_ok(cudaEventCreateWithFlags(&off, cudaEventDisableTiming), "untimed");
  is_int(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, a, b),
         "elapsed time of events never recorded: invalid resource handle");
  is_int(cudaErrorInvalidResourceHandle, cudaGetLastError(),
         "is the last error");
  cuda_ok(cudaEventRecord(a, s), "record a");
  nanosleep(&(struct timespec){0, 20000000}, NULL);
  cuda_ok(cudaEventRecord(b, s), "record b, 20 ms later");
  is_int(cudaErrorNotReady, cudaEventElapsedTime(&ms, a, b),
         "a and b not yet complete: not ready");
  is_int(cudaSuccess, cudaGetLastError(), "which is not an error");
  cuda_ok(cudaEventSynchronize(b), "synchronize b");
  is_int(cudaSuccess, cudaEventElapsedTime(&ms, a, b),
         "b synchronised: a, before it on the stream, is complete too");
  ok(ms >= 20.0f, "a to b: %g ms, at least the 20 ms slept", ms);
  cuda_ok(cudaEventRecord(c, s), "record c");
  is_int(cudaErrorNotReady, cudaEventElapsedTime(&ms, b, c),
         "c not yet complete: not ready");
  cuda_ok(cudaEventRecord(off, s), "record the untimed event");
  cuda_ok(cudaStreamSynchronize(s), "synchronize the stream");
  is_int(cudaSuccess, cudaEventElapsedTime(&ms, b, c), "then b to c works");
  is_int(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, off, c),
         "from an event made with cudaEventDisableTiming: invalid resource "
         "handle");
  is_int(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, c, off),
         "to one: the same");
  is_int(cudaErrorInvalidResourceHandle, cudaGetLastError(),
         "is the last error");
  is_int(cudaErrorInvalidValue, cudaEventElapsedTime(NULL, a, b),
         "ms NULL: invalid value");
  (void)cudaGetLastError();
  /* device time: a stream kept busy, and one that waits for its event */
  cudaStream_t s2;
  cuda_ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "stream 2");
  cuda_ok(cudaEventRecord(b, s), "record b");
  standin_stream_busy(s, 0.03);
  cuda_ok(cudaEventRecord(c, s), "record c behind 30 ms of device time");
  cuda_ok(cudaStreamWaitEvent(s2, c, 0), "stream 2 waits for c");
  cuda_ok(cudaEventRecord(a, s2), "record a on stream 2");
  cuda_ok(cudaEventSynchronize(a), "synchronize a");
  is_int(cudaSuccess, cudaEventElapsedTime(&ms, b, c), "b to c");
  ok(ms >= 30.0f, "b to c: %g ms, at least the 30 ms the stream was busy",
     ms);
  is_int(cudaSuccess, cudaEventElapsedTime(&ms, c, a), "c to a");
  ok(ms >= 0, "a, on the stream that waited for c, fired after it (%g ms)",
     ms);
  cudaStreamDestroy(s2);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(c);
  cudaEventDestroy(off);
}

static void test_cuda(void) {
  int count = 0, dev = -1;
  char a[32], b[32];
  is_int(cudaSuccess, cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  is_int(4, count, "4 devices (HVD_STANDIN_DEVICES's default)");
  cudaDeviceGetPCIBusId(a, sizeof a, 0);
  cudaDeviceGetPCIBusId(b, sizeof b, 1);
  ok(strcmp(a, b) != 0, "devices 0 and 1 have their own bus ids (%s, %s)", a,
     b);
  is_int(cudaErrorInvalidDevice, cudaSetDevice(count), "cudaSetDevice(%d)",
         count);
  is_int(cudaErrorInvalidDevice, cudaGetLastError(), "is the last error");
  is_int(cudaSuccess, cudaGetLastError(), "which cudaGetLastError clears");
  cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
  cudaGetDevice(&dev);
  is_int(rank, dev, "cudaGetDevice");

  long d0 = standin_device_allocations(), p0 = standin_pinned_allocations();
  unsigned char *d = dalloc(16), h[16], *pin = NULL;
  cuda_ok(cudaHostAlloc((void **)&pin, 16, cudaHostAllocDefault), "pinned");
  cuda_ok(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost), "D2H");
  int junk = 1;
  for (int i = 0; i < 16; i++)
    junk &= h[i] == 0xa5;
  ok(junk, "new device memory is 0xa5, not zero");
  struct cudaPointerAttributes at;
  cudaPointerGetAttributes(&at, d + 3);
  ok(at.type == cudaMemoryTypeDevice && at.device == rank,
     "a device pointer's attributes: device memory of cuda:%d", rank);
  cudaPointerGetAttributes(&at, pin);
  is_int(cudaMemoryTypeHost, at.type, "a pinned pointer's: host memory");
  cudaPointerGetAttributes(&at, h);
  is_int(cudaMemoryTypeUnregistered, at.type, "a stack pointer's: none");
  is_int(d0 + 1, standin_device_allocations(), "one more device allocation");
  is_int(p0 + 1, standin_pinned_allocations(), "one more pinned");

  cudaStream_t s;
  cudaEvent_t e;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  cuda_ok(cudaMemcpyAsync(d, pin, 16, cudaMemcpyHostToDevice, s), "H2D");
  cuda_ok(cudaEventRecord(e, s), "record");
  is_int(cudaErrorNotReady, cudaEventQuery(e), "an event: not ready");
  is_int(cudaErrorNotReady, cudaEventQuery(e), "not ready again");
  is_int(cudaSuccess, cudaEventQuery(e), "then done");
  is_int(cudaSuccess, cudaEventQuery(e), "and done it stays");
  cudaEventDestroy(e);
  test_elapsed(s);
  cudaStreamDestroy(s);
  cudaFree(d);
  cudaFreeHost(pin);
  is_int(d0, standin_device_allocations(), "freed");
  is_int(0, standin_streams() + standin_events(), "no stream or event left");
}

/* x's element i on rank q (small integers, exact in every type). */
static float xval(int q, int i) { return (float)((q * 3 + i) % 5 - 2); }

static void test_nccl(int blocking) {
  const char *kind = blocking ? "blocking" : "non-blocking";
  char what[128];
  ncclResult_t r;
  cudaStream_t s;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  ncclComm_t c = make_comm(blocking, kind, &r);
  snprintf(what, sizeof what, "%s: init", kind);
  returned(c, blocking, r, what);
  is_int(blocking, standin_nccl_last_blocking(), "%s: the stand-in knows",
         kind);

  /* allreduce: every type with one op each */
  static const struct {
    ncclDataType_t t;
    ncclRedOp_t op;
    const char *name;
  } cases[] = {{ncclFloat32, ncclSum, "float32 sum"},
               {ncclFloat16, ncclMax, "float16 max"},
               {ncclBfloat16, ncclMin, "bfloat16 min"},
               {ncclInt32, ncclProd, "int32 product"}};
  enum { N = 7 };
  for (int k = 0; k < 4; k++) {
    size_t es = cases[k].t == ncclFloat32 || cases[k].t == ncclInt32 ? 4 : 2;
    unsigned char h[N * 4];
    double want[N];
    for (int i = 0; i < N; i++) {
      double acc = 0;
      for (int q = 0; q < size; q++) {
        double v = xval(q, i);
        if (cases[k].op == ncclProd)
          v = v == 0 ? 1 : v;
        acc = q == 0                   ? v
              : cases[k].op == ncclSum ? acc + v
              : cases[k].op == ncclMax ? (v > acc ? v : acc)
              : cases[k].op == ncclMin ? (v < acc ? v : acc)
                                       : acc * v;
      }
      want[i] = acc;
      float mine = xval(rank, i);
      if (cases[k].op == ncclProd)
        mine = mine == 0 ? 1 : mine;
      if (cases[k].t == ncclFloat32)
        ((float *)h)[i] = mine;
      else if (cases[k].t == ncclInt32)
        ((int32_t *)h)[i] = (int32_t)mine;
      else if (cases[k].t == ncclFloat16)
        ((uint16_t *)h)[i] = hvd__f32_to_f16(mine);
      else
        ((uint16_t *)h)[i] = hvd__f32_to_bf16(mine);
    }
    void *d = dalloc(N * es);
    cuda_ok(cudaMemcpy(d, h, N * es, cudaMemcpyHostToDevice), "H2D");
    snprintf(what, sizeof what, "%s: allreduce %s", kind, cases[k].name);
    returned(c, blocking, ncclAllReduce(d, d, N, cases[k].t, cases[k].op, c, s),
             what);
    cuda_ok(cudaStreamSynchronize(s), "the stream (a GPU's order)");
    cuda_ok(cudaMemcpy(h, d, N * es, cudaMemcpyDeviceToHost), "D2H");
    int good = 1;
    for (int i = 0; i < N; i++) {
      double got = cases[k].t == ncclFloat32 ? ((float *)h)[i]
                   : cases[k].t == ncclInt32 ? ((int32_t *)h)[i]
                   : cases[k].t == ncclFloat16
                       ? hvd__f16_to_f32(((uint16_t *)h)[i])
                       : hvd__bf16_to_f32(((uint16_t *)h)[i]);
      if (got != want[i]) {
        tap_note("element %d: %g, expected %g", i, got, want[i]);
        good = 0;
        break;
      }
    }
    ok(good, "%s: values", what);
    cudaFree(d);
  }

  /* reducescatter (2 per rank) and allgather (3 per rank) of float32 */
  float *in = dalloc((size_t)size * 3 * sizeof *in), hin[64], hout[64];
  float *out = dalloc((size_t)size * 3 * sizeof *out);
  for (int i = 0; i < size * 3; i++)
    hin[i] = xval(rank, i);
  cuda_ok(cudaMemcpy(in, hin, (size_t)size * 3 * sizeof *in,
                     cudaMemcpyHostToDevice),
          "H2D");
  snprintf(what, sizeof what, "%s: reducescatter", kind);
  returned(c, blocking,
           ncclReduceScatter(in, out, 2, ncclFloat32, ncclSum, c, s), what);
  cuda_ok(cudaStreamSynchronize(s), "the stream (a GPU's order)");
  cuda_ok(cudaMemcpy(hout, out, 2 * sizeof *out, cudaMemcpyDeviceToHost),
          "D2H");
  int good = 1;
  for (int i = 0; i < 2; i++) {
    float want = 0;
    for (int q = 0; q < size; q++)
      want += xval(q, rank * 2 + i);
    good &= hout[i] == want;
  }
  ok(good, "%s: values", what);
  snprintf(what, sizeof what, "%s: allgather", kind);
  returned(c, blocking, ncclAllGather(in, out, 3, ncclFloat32, c, s), what);
  cuda_ok(cudaStreamSynchronize(s), "the stream (a GPU's order)");
  cuda_ok(cudaMemcpy(hout, out, (size_t)size * 3 * sizeof *out,
                     cudaMemcpyDeviceToHost),
          "D2H");
  good = 1;
  for (int q = 0; q < size; q++)
    for (int i = 0; i < 3; i++)
      good &= hout[q * 3 + i] == xval(q, i);
  ok(good, "%s: values", what);

  /* a group: each rank broadcasts one float32, then a ring of send/recv */
  float mine = (float)(10 + rank);
  cuda_ok(cudaMemcpy(out + rank, &mine, sizeof mine, cudaMemcpyHostToDevice),
          "H2D");
  ncclGroupStart();
  for (int q = 0; q < size; q++)
    ncclBroadcast(out + q, out + q, 1, ncclFloat32, q, c, s);
  snprintf(what, sizeof what, "%s: a group of broadcasts", kind);
  returned(c, blocking, ncclGroupEnd(), what);
  cuda_ok(cudaStreamSynchronize(s), "the stream (a GPU's order)");
  cuda_ok(
      cudaMemcpy(hout, out, (size_t)size * sizeof *out, cudaMemcpyDeviceToHost),
      "D2H");
  good = 1;
  for (int q = 0; q < size; q++)
    good &= hout[q] == (float)(10 + q);
  ok(good, "%s: values", what);
  ncclGroupStart();
  ncclSend(out + rank, 1, ncclFloat32, (rank + 1) % size, c, s);
  ncclRecv(in, 1, ncclFloat32, (rank + size - 1) % size, c, s);
  snprintf(what, sizeof what, "%s: a ring of send/recv", kind);
  returned(c, blocking, ncclGroupEnd(), what);
  cuda_ok(cudaStreamSynchronize(s), "the stream (a GPU's order)");
  cuda_ok(cudaMemcpy(hout, in, sizeof *in, cudaMemcpyDeviceToHost), "D2H");
  is_int(10 + (rank + size - 1) % size, (long long)hout[0], "%s: values", what);

  snprintf(what, sizeof what, "%s: ncclCommFinalize", kind);
  returned(c, blocking, ncclCommFinalize(c), what);
  is_int(ncclSuccess, ncclCommDestroy(c), "%s: ncclCommDestroy", kind);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(s);
}

static void test_faults(void) {
  char v[32];
  int polls;
  ncclResult_t r;
  /* the last rank's init never finishes */
  snprintf(v, sizeof v, "%d", last);
  setenv("HVD_STANDIN_NCCL_INIT_HANG", v, 1);
  ncclComm_t c = make_comm(0, "hang", &r);
  unsetenv("HVD_STANDIN_NCCL_INIT_HANG");
  is_int(ncclInProgress, r, "init hang: init returns ncclInProgress");
  ncclResult_t st = ncclSuccess;
  for (int i = 0; i < 50; i++)
    ncclCommGetAsyncError(c, &st);
  is_int(rank == last ? ncclInProgress : ncclSuccess, st,
         "init hang: after 50 polls, %s on the last rank only",
         ncclGetErrorString(ncclInProgress));
  is_int(ncclSuccess, ncclCommAbort(c), "init hang: ncclCommAbort ends it");

  /* the last rank's second call gets an asynchronous error */
  snprintf(v, sizeof v, "%d:1", last);
  setenv("HVD_STANDIN_NCCL_ASYNC_ERROR", v, 1);
  c = make_comm(0, "async", &r);
  unsetenv("HVD_STANDIN_NCCL_ASYNC_ERROR");
  settle(c, &polls);
  cudaStream_t s;
  cudaEvent_t e;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  float *d = dalloc(sizeof *d);
  for (int k = 1; k <= 2; k++) {
    r = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
    st = settle(c, &polls);
    is_int(k == 2 && rank == last ? ncclRemoteError : ncclSuccess, st,
           "async error: call %d: the state on rank %d", k, rank);
  }
  char want[256];
  snprintf(want, sizeof want,
           "stand-in: asynchronous ncclRemoteError on rank %d after 1 calls "
           "as asked (HVD_STANDIN_NCCL_ASYNC_ERROR)",
           last);
  if (rank == last)
    is_string(want, ncclGetLastError(c), "async error: ncclGetLastError");
  else
    is_string("", "", "async error: ncclGetLastError (the last rank's)");
  cuda_ok(cudaEventRecord(e, s), "record");
  int ready = 0;
  for (int i = 0; i < 20; i++)
    ready |= cudaEventQuery(e) == cudaSuccess;
  is_int(rank != last, ready,
         "async error: the stream finishes on the healthy ranks only");
  if (rank == last)
    ncclCommAbort(c);
  MPI_Barrier(MPI_COMM_WORLD); /* the abort notice is out */
  if (rank != last) {
    ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
    settle(c, &polls);
    cuda_ok(cudaEventRecord(e, s), "record");
    ready = 0;
    for (int i = 0; i < 20; i++)
      ready |= cudaEventQuery(e) == cudaSuccess;
  }
  is_int(0, rank != last ? ready : 0,
         "peer gone: the others' next allreduce never finishes");
  if (rank != last) {
    ncclCommAbort(c);
    ready = 0;
    for (int i = 0; i < 20; i++)
      ready |= cudaEventQuery(e) == cudaSuccess;
  }
  is_int(1, rank != last ? ready : 1, "peer gone: until they abort too");
  cudaFree(d);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

/* A rank that did its part of a collective, then aborted: a peer that
 * comes to that collective after the abort notice still finishes it (the
 * notice says how many messages the aborted rank had sent), whichever
 * came first; one that needs more of it never finishes. */
static void test_did_its_part(void) {
  char v[32];
  int polls;
  ncclResult_t r;
  if (size < 2)
    return;
  snprintf(v, sizeof v, "%d:0", last);
  setenv("HVD_STANDIN_NCCL_ASYNC_ERROR", v, 1);
  ncclComm_t c = make_comm(0, "part", &r);
  unsetenv("HVD_STANDIN_NCCL_ASYNC_ERROR");
  settle(c, &polls);
  cudaStream_t s;
  cudaEvent_t e;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  float *d = dalloc(2 * sizeof *d), x[2] = {(float)rank, -1};
  cuda_ok(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice), "copy");
  ncclResult_t st = ncclRemoteError;
  if (rank == last) {
    ncclBroadcast(d, d, 1, ncclFloat32, last, c, s);
    st = settle(c, &polls);
    ncclCommAbort(c);
  }
  is_int(ncclRemoteError, st, "did its part: the root fails after its part");
  MPI_Barrier(MPI_COMM_WORLD); /* the abort notice is out first */
  int ready = 0;
  if (rank != last) {
    ncclBroadcast(d, d, 1, ncclFloat32, last, c, s);
    settle(c, &polls);
    cuda_ok(cudaEventRecord(e, s), "record");
    for (int i = 0; i < 20; i++)
      ready |= cudaEventQuery(e) == cudaSuccess;
    if (ready) /* (else the copy would wait for the stream forever) */
      cuda_ok(cudaMemcpy(x, d, sizeof x, cudaMemcpyDeviceToHost), "copy");
  } else {
    ready = 1;
    x[0] = (float)last;
  }
  is_int(1, ready, "did its part: a peer's broadcast after the notice ends");
  ok(x[0] == (float)last, "did its part: with the root's value (%g)", x[0]);
  ready = 0;
  if (rank != last) { /* more than the root sent: never */
    ncclBroadcast(d + 1, d + 1, 1, ncclFloat32, last, c, s);
    settle(c, &polls);
    cuda_ok(cudaEventRecord(e, s), "record");
    for (int i = 0; i < 20; i++)
      ready |= cudaEventQuery(e) == cudaSuccess;
    ncclCommAbort(c);
  }
  is_int(0, ready, "did its part: the next broadcast from it never ends");
  cudaFree(d);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

/* One allreduce of 4 floats on c, after `delay` seconds, on a thread's
 * own stream. */
typedef struct order_job {
  ncclComm_t c;
  double delay;
} order_job_t;

static void *order_run(void *arg) {
  const order_job_t *j = arg;
  float *d = NULL;
  cudaStream_t s;
  cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
  cuda_ok(cudaMalloc((void **)&d, 4 * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMemset(d, 0, 4 * sizeof *d), "cudaMemset");
  cuda_ok(cudaStreamCreate(&s), "cudaStreamCreate");
  struct timespec ts = {0, (long)(j->delay * 1e9)};
  nanosleep(&ts, NULL);
  if (ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, j->c, s) != ncclSuccess)
    bail("ncclAllReduce: %s", ncclGetLastError(j->c));
  cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cudaStreamDestroy(s);
  cudaFree(d);
  return NULL;
}

static int order_main(void) {
  ncclResult_t r;
  cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
  ncclComm_t a = make_comm(1, "A", &r), b = make_comm(1, "B", &r);
  order_job_t ja = {a, rank == 0 ? 0.0 : 0.2}, jb = {b, rank == 0 ? 0.2 : 0.0};
  pthread_t t;
  if (pthread_create(&t, NULL, order_run, &jb) != 0)
    bail("pthread_create");
  order_run(&ja);
  pthread_join(t, NULL);
  ncclCommDestroy(a);
  ncclCommDestroy(b);
  printf("order: done\n");
  MPI_Finalize();
  return 0;
}

/* `selftest twothreads MODE` (np 2; t/standin/order.sh): on rank 0 a
 * thread starts an allreduce on a communicator and waits in it for rank
 * 1, which comes 0.9 s later. at-once: 0.3 s in, the main thread calls one
 * on the same communicator (the stand-in ends the process); after: the
 * main thread calls it once the thread's has returned (fine). Prints
 * "twothreads: done" at the end. */
static int twothreads_main(const char *mode) {
  ncclResult_t r;
  cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
  ncclComm_t a = make_comm(1, "A", &r);
  order_job_t first = {a, rank == 0 ? 0.0 : 0.9}, second = {a, 0.3};
  pthread_t t;
  if (pthread_create(&t, NULL, order_run, &first) != 0)
    bail("pthread_create");
  if (rank == 0 && strcmp(mode, "at-once") == 0)
    order_run(&second);
  pthread_join(t, NULL);
  if (rank != 0 || strcmp(mode, "at-once") != 0)
    order_run(&second);
  ncclCommDestroy(a);
  printf("twothreads: done\n");
  MPI_Finalize();
  return 0;
}

/* `selftest race MODE` (one process; t/standin/stream_order.sh): stream
 * A writes 64 bytes, then other work reads them. unordered: stream B,
 * nothing between (the stand-in ends the process naming both streams);
 * event: B waits for an event recorded after the write; legacy: a
 * synchronous cudaMemcpy (the legacy stream, which does not wait for a
 * non-blocking stream); blocking: the same after a write on a blocking
 * stream, which the legacy stream waits for; synced: B after
 * cudaStreamSynchronize(A). Prints "race: done" when the read passes. */
static int race_main(const char *mode) {
  int blocking = strcmp(mode, "blocking") == 0;
  cudaStream_t a, b;
  cudaEvent_t e;
  char *d = NULL, h[64];
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&a, blocking ? cudaStreamDefault
                                                 : cudaStreamNonBlocking),
          "stream a");
  cuda_ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream b");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  cuda_ok(cudaMalloc((void **)&d, sizeof h), "cudaMalloc");
  cuda_ok(cudaMemsetAsync(d, 7, sizeof h, a), "write on a");
  if (strcmp(mode, "event") == 0) {
    cuda_ok(cudaEventRecord(e, a), "record on a");
    cuda_ok(cudaStreamWaitEvent(b, e, 0), "b waits");
  }
  if (strcmp(mode, "synced") == 0)
    cuda_ok(cudaStreamSynchronize(a), "sync a");
  if (strcmp(mode, "legacy") == 0 || blocking) {
    cuda_ok(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), "read");
  } else {
    cuda_ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, b),
            "read on b");
    cuda_ok(cudaStreamSynchronize(b), "sync b");
  }
  printf("race: done (%d)\n", h[63]);
  cudaFree(d);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return 0;
}

/* `selftest war MODE` (t/standin/stream_order.sh): stream A reads 64
 * bytes of x, then other work overwrites x. copy: A copies x to y, stream
 * B memsets x with nothing between (the stand-in ends the process naming
 * both streams); event: B first waits for an event recorded after the
 * copy; host: a synchronous cudaMemcpy into x (the legacy stream, which
 * does not wait for non-blocking A); nccl: A's ncclAllReduce sends x, B
 * memsets x; nccl-event: B waits for an event after the allreduce. Prints
 * "war: done" when the program ran to its end. */
static int war_main(const char *mode) {
  int nccl = strncmp(mode, "nccl", 4) == 0;
  cudaStream_t a, b;
  cudaEvent_t e;
  char *x = NULL, *y = NULL, h[64] = {0};
  ncclComm_t c = NULL;
  ncclResult_t r = ncclSuccess;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  if (nccl)
    c = make_comm(1, "war", &r);
  if (r != ncclSuccess)
    bail("ncclCommInitRankConfig: %d", (int)r);
  cuda_ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream a");
  cuda_ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream b");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  cuda_ok(cudaMalloc((void **)&x, sizeof h), "cudaMalloc x");
  cuda_ok(cudaMalloc((void **)&y, sizeof h), "cudaMalloc y");
  cuda_ok(cudaMemset(x, 1, sizeof h), "cudaMemset x");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (nccl && ncclAllReduce(x, y, sizeof h, ncclInt8, ncclSum, c, a) != 0)
    bail("ncclAllReduce failed");
  if (!nccl)
    cuda_ok(cudaMemcpyAsync(y, x, sizeof h, cudaMemcpyDeviceToDevice, a),
            "read on a");
  if (strcmp(mode, "event") == 0 || strcmp(mode, "nccl-event") == 0) {
    cuda_ok(cudaEventRecord(e, a), "record on a");
    cuda_ok(cudaStreamWaitEvent(b, e, 0), "b waits");
  }
  if (strcmp(mode, "host") == 0)
    cuda_ok(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice), "host write");
  else
    cuda_ok(cudaMemsetAsync(x, 2, sizeof h, b), "write on b");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_ok(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost), "read y");
  printf("war: done (%d)\n", h[63]);
  if (nccl)
    ncclCommDestroy(c);
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return 0;
}

/* `selftest pinned MODE` (t/standin/stream_order.sh): asynchronous copies
 * between device memory d and pinned memory h on non-blocking stream A.
 * early: d -> h, the host reads h at once (the stand-in's poison, 0xa5,
 * as the copy is deferred), again after cudaStreamSynchronize (the
 * bytes); rewrite: h -> d, the host rewrites h before it synchronises (the
 * process ends); rewrite-synced: the same after synchronising; write: d
 * -> h, the host writes h before it synchronises (the process ends);
 * chain: d -> h -> d2 on A, then h -> d2 again on stream B with nothing
 * between (the process ends: B reads what A writes); chain-event: B waits
 * for an event first. Prints "pinned: ..." when it ran to its end. */
static int pinned_main(const char *mode) {
  cudaStream_t a, b;
  cudaEvent_t e;
  unsigned char *d = NULL, *d2 = NULL, *h = NULL, early = 0, late, back;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream a");
  cuda_ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream b");
  cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  cuda_ok(cudaMalloc((void **)&d, 64), "cudaMalloc d");
  cuda_ok(cudaMalloc((void **)&d2, 64), "cudaMalloc d2");
  cuda_ok(cudaMallocHost((void **)&h, 64), "cudaMallocHost");
  memset(h, 0, 64);
  cuda_ok(cudaMemsetAsync(d, 0x11, 64, a), "memset d on a");
  if (strncmp(mode, "rewrite", 7) == 0) {
    memset(h, 1, 64);
    cuda_ok(cudaMemcpyAsync(d, h, 64, cudaMemcpyHostToDevice, a), "h -> d");
    if (strcmp(mode, "rewrite-synced") == 0)
      cuda_ok(cudaStreamSynchronize(a), "sync a");
    memset(h, 2, 64); /* the copy may not have run yet */
  } else {
    cuda_ok(cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, a), "d -> h");
    early = h[5];
    if (strcmp(mode, "write") == 0)
      h[5] = 3;
  }
  if (strncmp(mode, "chain", 5) == 0) {
    cuda_ok(cudaMemcpyAsync(d2, h, 64, cudaMemcpyHostToDevice, a), "h -> d2");
    cuda_ok(cudaEventRecord(e, a), "record on a");
    if (strcmp(mode, "chain-event") == 0)
      cuda_ok(cudaStreamWaitEvent(b, e, 0), "b waits");
    cuda_ok(cudaMemcpyAsync(d2, h, 64, cudaMemcpyHostToDevice, b), "on b");
    cuda_ok(cudaStreamSynchronize(b), "sync b");
  }
  cuda_ok(cudaStreamSynchronize(a), "sync a");
  late = h[5];
  cuda_ok(cudaMemcpy(&back, strncmp(mode, "chain", 5) == 0 ? d2 : d, 1,
                     cudaMemcpyDeviceToHost),
          "read back");
  printf("pinned: early 0x%02x, late 0x%02x, device 0x%02x\n", early, late,
         back);
  cudaFreeHost(h);
  cudaFree(d);
  cudaFree(d2);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return 0;
}

/* `selftest perthread MODE` (t/standin/stream_order.sh): a write on a
 * stream, then cudaStreamPerThread reads it, nothing between. blocking:
 * the write on a blocking stream (the per-thread stream waits only for
 * the legacy one: the process ends); legacy: on the legacy stream (it
 * waits for it); thread: on another thread's per-thread stream (the
 * process ends). Prints "perthread: done" when it ran to its end. */
static void *perthread_write(void *d) {
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaMemsetAsync(d, 4, 64, cudaStreamPerThread), "write");
  return NULL;
}

static int perthread_main(const char *mode) {
  cudaStream_t blk;
  char *d = NULL, *d2 = NULL;
  pthread_t t;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaStreamCreate(&blk), "blocking stream");
  cuda_ok(cudaMalloc((void **)&d, 64), "cudaMalloc d");
  cuda_ok(cudaMalloc((void **)&d2, 64), "cudaMalloc d2");
  if (strcmp(mode, "thread") == 0) {
    if (pthread_create(&t, NULL, perthread_write, d) != 0 ||
        pthread_join(t, NULL) != 0)
      bail("pthread_create");
  } else {
    cuda_ok(cudaMemsetAsync(d, 4, 64,
                            strcmp(mode, "legacy") == 0 ? NULL : blk),
            "write");
  }
  cuda_ok(cudaMemcpyAsync(d2, d, 64, cudaMemcpyDeviceToDevice,
                          cudaStreamPerThread),
          "read on the per-thread stream");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  printf("perthread: done\n");
  cudaFree(d);
  cudaFree(d2);
  cudaStreamDestroy(blk);
  return 0;
}

/* `selftest overlap CALL WHERE` (one rank; t/standin/overlap.sh): CALL
 * (allgather, reducescatter or allreduce) of 4 floats on a one-rank
 * communicator, its receive buffer in place (the same address at one
 * rank), apart (32 floats on), or shifted (one float on: overlapping, not
 * in place, which the stand-in ends the process for). Prints
 * "overlap: done" when the call ran. */
static int overlap_main(const char *call, const char *where) {
  ncclResult_t r;
  float *d = NULL;
  cudaStream_t s;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t c = make_comm(1, "overlap", &r);
  if (r != ncclSuccess)
    bail("ncclCommInitRankConfig: %d", (int)r);
  cuda_ok(cudaMalloc((void **)&d, 64 * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMemset(d, 0, 64 * sizeof *d), "cudaMemset");
  cuda_ok(cudaStreamCreate(&s), "cudaStreamCreate");
  float *recv = strcmp(where, "inplace") == 0 ? d
                : strcmp(where, "apart") == 0 ? d + 32
                                              : d + 1;
  r = strcmp(call, "allgather") == 0
          ? ncclAllGather(d, recv, 4, ncclFloat32, c, s)
      : strcmp(call, "reducescatter") == 0
          ? ncclReduceScatter(d, recv, 4, ncclFloat32, ncclSum, c, s)
          : ncclAllReduce(d, recv, 4, ncclFloat32, ncclSum, c, s);
  if (r != ncclSuccess)
    bail("%s: %d", call, (int)r);
  cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  printf("overlap: done\n");
  ncclCommDestroy(c);
  cudaStreamDestroy(s);
  cudaFree(d);
  MPI_Finalize();
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "kill") == 0) { /* a GPU per rank */
    const char *env = getenv("OMPI_COMM_WORLD_RANK");
    return gpu_kill_main(atoi(argv[2]), env != NULL ? atoi(env) : 0);
  }
  if (argc > 2 && strcmp(argv[1], "race") == 0)
    return race_main(argv[2]);
  if (argc > 2 && strcmp(argv[1], "pinned") == 0)
    return pinned_main(argv[2]);
  if (argc > 2 && strcmp(argv[1], "perthread") == 0)
    return perthread_main(argv[2]);
  if (argc > 2 && strcmp(argv[1], "war") == 0) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = war_main(argv[2]);
    MPI_Finalize();
    return rc;
  }
  if (argc > 3 && strcmp(argv[1], "overlap") == 0) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return overlap_main(argv[2], argv[3]);
  }
  if (argc > 2 && strcmp(argv[1], "twothreads") == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return twothreads_main(argv[2]);
  }
  if (argc > 1 && strcmp(argv[1], "order") == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return order_main();
  }
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  last = size - 1;
  setenv("HVD_STANDIN_POLLS", "2", 1);
  test_cuda();
  test_nccl(1);
  test_nccl(0);
  test_faults();
  test_did_its_part();
  is_int(0, standin_device_allocations(), "every device allocation freed");
  return tap_mpi_finish();
}
