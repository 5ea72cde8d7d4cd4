/*
 * flight.c - asynchronous completion of device groups (lib/core/execute.c
 * keeps them, lib/ops/nccl_ops.c's nccl_reap completes them) on the host
 * stand-in, with HVD_STANDIN_POLLS=40: each event answers
 * cudaErrorNotReady 40 times, so a group stays in flight for many engine
 * cycles. HVD_GPU_OPERATIONS=nccl, a GPU per rank.
 *
 *  1. eight device allreduces that cannot fuse (float32 and int32, sum,
 *     min, max and product: eight groups), submitted together: each exact,
 *     read back on the host through cudaMemcpy (the stand-in's stream
 *     order ends the process if hvd completed one before the host saw its
 *     event); the stand-in saw exactly HVD__GPU_SLOTS = 4 groups in flight
 *     at once on hvd's stream (an engine that waits for each group before
 *     the next, as hvd's did, keeps 1);
 *  2. while three such groups are in flight, a burst that fuses into one
 *     group of 8 MB, larger than the fusion buffer: the buffer grows after
 *     the three complete (the stand-in ends the process on a cudaMalloc or
 *     cudaFree on hvd's thread while its groups are in flight), every
 *     result exact;
 *  3. (np >= 2) a process set of ranks {0, 1} whose device allreduces are
 *     submitted with the world's, from a second thread: both exact; the
 *     set's first collective creates its NCCL communicator while the
 *     world's groups are in flight (after they complete: NCCL's setup
 *     allocates device memory); then the set is destroyed;
 *  4. hvd_cuda_stream_wait returns while the group is still in flight
 *     (hvd_test says not done): the host did not wait for the device; a
 *     copy on the waiting stream reads the exact sums;
 *  5. a grouped device allgather and a grouped device reducescatter of 4
 *     each ran as one group (the NCCL executor fuses them: in rank 0's
 *     timeline each member's span starts at one time and says
 *     "tensors":4), with exact results, each through one NCCL call at
 *     P > 1 (the stand-in counts them) and none at one rank;
 *  6. a grouped allgather of a large even member (an NCCL call of its
 *     own), an uneven one and a small one (packed together into one call,
 *     no ncclBroadcast per rank): exact rows;
 *  7. ZeRO-1's step on device parameters makes one cudaStreamWaitEvent
 *     per gradient, as the unsharded one: its allgather of the values,
 *     settled by the synchronised update, waits for no ready event;
 * then hvd_shutdown, and hvd has freed every device and pinned allocation,
 * stream and event it made.
 *
 * Registered at np 1, 2, 3 and 4 (t/standin/local.mk).
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gputest.h"
#include "hvd.h"
#include "hvdtest.h"
#include "standin.h"
#include "tap/tap.h"

static int rank, size, dev;

/* A device tensor of n elements of dt holding value(i) + rank's salt. */
typedef struct job {
  char name[64];
  hvd_dtype_t dt;
  hvd_op_t op;
  int64_t n;
  void *d;
  hvd_request_t *req;
} job_t;

/* Rank k's element i: small integers whose sums, minima, maxima and
 * products every dtype here holds exactly. */
static double val(int k, int64_t i) {
  double v = (double)((i + k) % 3) - 1.0; /* -1, 0, 1 */
  return v == 0 ? 2.0 : v;
}

static double want(hvd_op_t op, int64_t i, int np) {
  double r = val(0, i);
  for (int k = 1; k < np; k++) {
    double v = val(k, i);
    r = op == HVD_SUM       ? r + v
        : op == HVD_MIN     ? (v < r ? v : r)
        : op == HVD_MAX     ? (v > r ? v : r)
        : op == HVD_PRODUCT ? r * v
                            : r;
  }
  return r;
}

static void job_make(job_t *j, const char *prefix, int q, hvd_dtype_t dt,
                     hvd_op_t op, int64_t n) {
  snprintf(j->name, sizeof j->name, "%s.%d", prefix, q);
  j->dt = dt;
  j->op = op;
  j->n = n;
  size_t es = hvd_dtype_size(dt), bytes = (size_t)n * es;
  void *h = malloc(bytes);
  if (h == NULL)
    bail("malloc");
  for (int64_t i = 0; i < n; i++) {
    double v = val(rank, i);
    if (dt == HVD_FLOAT32)
      ((float *)h)[i] = (float)v;
    else
      ((int32_t *)h)[i] = (int32_t)v;
  }
  cuda_ok(cudaMalloc(&j->d, bytes), "cudaMalloc");
  cuda_ok(cudaMemcpy(j->d, h, bytes, cudaMemcpyHostToDevice), "H2D");
  free(h);
}

static hvd_tensor_t job_tensor(const job_t *j) {
  int64_t shape[1] = {j->n};
  hvd_tensor_t t = hvd_tensor_make(j->d, j->dt, 1, shape);
  t.device = dev;
  return t;
}

static void job_submit(job_t *j, const hvd_process_set_t *ps) {
  hvd_tensor_t t = job_tensor(j);
  hvd_result_t rc =
      ps != NULL
          ? hvd_ps_allreduce_async(ps, j->name, &t, &t, j->op, 1, 1, &j->req)
          : hvd_allreduce_async(j->name, &t, &t, j->op, 1, 1, &j->req);
  if (rc != HVD_SUCCESS)
    bail("submit %s: %s", j->name, hvd_last_error());
}

/* Waits for j and checks every element on the host; frees it. */
static int job_check(job_t *j, int np) {
  hvd_result_t rc = hvd_wait(j->req);
  size_t es = hvd_dtype_size(j->dt), bytes = (size_t)j->n * es;
  void *h = malloc(bytes);
  int good = rc == HVD_SUCCESS && h != NULL;
  if (rc != HVD_SUCCESS)
    tap_note("%s: %s", j->name, hvd_last_error());
  if (good)
    cuda_ok(cudaMemcpy(h, j->d, bytes, cudaMemcpyDeviceToHost), "D2H");
  for (int64_t i = 0; good && i < j->n; i++) {
    double got = j->dt == HVD_FLOAT32 ? ((float *)h)[i] : ((int32_t *)h)[i];
    if (got != want(j->op, i, np)) {
      tap_note("%s[%lld] = %g, want %g", j->name, (long long)i, got,
               want(j->op, i, np));
      good = 0;
    }
  }
  free(h);
  cuda_ok(cudaFree(j->d), "cudaFree");
  return good;
}

static const hvd_op_t ops[4] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT};

static void test_eight_groups(void) {
  job_t jobs[8];
  for (int q = 0; q < 8; q++)
    job_make(&jobs[q], "eight", q, q < 4 ? HVD_FLOAT32 : HVD_INT32, ops[q % 4],
             1000 + q);
  for (int q = 0; q < 8; q++)
    job_submit(&jobs[q], NULL);
  int good = 1;
  for (int q = 0; q < 8; q++)
    good &= job_check(&jobs[q], size);
  ok(good, "eight unfusable device allreduces: every element exact");
  is_int(4, standin_peak_in_flight(),
         "4 groups (HVD__GPU_SLOTS) were in flight at once on hvd's stream");
}

static void test_growth(void) {
  job_t small[3], big[16];
  for (int q = 0; q < 3; q++)
    job_make(&small[q], "small", q, HVD_FLOAT32, ops[q + 1], 100);
  for (int q = 0; q < 16; q++) /* 16 x 128 Ki float32: one group of 8 MB */
    job_make(&big[q], "big", q, HVD_FLOAT32, HVD_SUM, 128 * 1024);
  for (int q = 0; q < 3; q++)
    job_submit(&small[q], NULL);
  for (int q = 0; q < 16; q++)
    job_submit(&big[q], NULL);
  int good = 1;
  for (int q = 0; q < 3; q++)
    good &= job_check(&small[q], size);
  for (int q = 0; q < 16; q++)
    good &= job_check(&big[q], size);
  ok(good, "a fused group that grows the fusion buffer while three groups "
           "are in flight: every element exact");
}

typedef struct side {
  const hvd_process_set_t *ps;
  job_t jobs[4];
  int good;
} side_t;

static void *side_run(void *arg) {
  side_t *s = arg;
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice (second thread)");
  for (int q = 0; q < 4; q++)
    job_submit(&s->jobs[q], s->ps);
  s->good = 1;
  for (int q = 0; q < 4; q++)
    s->good &= job_check(&s->jobs[q], 2);
  return NULL;
}

static void test_process_set(void) {
  if (size < 2) {
    skip(2, "a process set of two needs 2 ranks");
    return;
  }
  int members[2] = {0, 1};
  hvd_process_set_t *ps = NULL;
  if (hvd_process_set_create(members, 2, &ps) != HVD_SUCCESS)
    bail("hvd_process_set_create: %s", hvd_last_error());
  job_t world[4];
  side_t side;
  memset(&side, 0, sizeof side);
  side.ps = ps;
  for (int q = 0; q < 4; q++) {
    job_make(&world[q], "world", q, HVD_FLOAT32, ops[q], 500);
    if (rank < 2)
      job_make(&side.jobs[q], "set", q, HVD_INT32, ops[q], 300);
  }
  pthread_t th;
  for (int q = 0; q < 4; q++)
    job_submit(&world[q], NULL);
  if (rank < 2 && pthread_create(&th, NULL, side_run, &side) != 0)
    bail("pthread_create");
  int good = 1;
  for (int q = 0; q < 4; q++)
    good &= job_check(&world[q], size);
  if (rank < 2)
    pthread_join(th, NULL);
  ok(good, "world allreduces beside a set's: every element exact");
  ok(rank >= 2 || side.good,
     "the set's allreduces (from a second thread): every element exact");
  if (hvd_process_set_destroy(ps) != HVD_SUCCESS)
    bail("hvd_process_set_destroy: %s", hvd_last_error());
}

static void test_stream_wait(void) {
  job_t j;
  cudaStream_t us;
  cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
  job_make(&j, "wait", 0, HVD_FLOAT32, HVD_SUM, 777);
  float *copy = NULL, h[777];
  cuda_ok(cudaMalloc((void **)&copy, sizeof h), "cudaMalloc");
  job_submit(&j, NULL);
  is_int(HVD_SUCCESS, hvd_cuda_stream_wait(j.req, us),
         "hvd_cuda_stream_wait on a group in flight");
  int done = 1;
  is_int(HVD_SUCCESS, hvd_test(j.req, &done), "hvd_test after it");
  is_int(0, done,
         "the group was still in flight: the host did not wait for "
         "the device");
  cuda_ok(cudaMemcpyAsync(copy, j.d, sizeof h, cudaMemcpyDeviceToDevice, us),
          "D2D on the waiting stream");
  cuda_ok(cudaMemcpyAsync(h, copy, sizeof h, cudaMemcpyDeviceToHost, us),
          "D2H");
  cuda_ok(cudaStreamSynchronize(us), "cudaStreamSynchronize");
  int good = 1;
  for (int i = 0; i < 777; i++)
    good &= h[i] == want(HVD_SUM, i, size);
  ok(good, "the waiting stream read the exact sums");
  if (!done)
    ok(job_check(&j, size), "hvd_wait then: exact");
  else
    skip(1, "the request completed already");
  cudaFree(copy);
  cudaStreamDestroy(us);
}

#define NF 4
static const char *ag_names[NF] = {"fused.ag.0", "fused.ag.1", "fused.ag.2",
                                   "fused.ag.3"};
static const char *rs_names[NF] = {"fused.rs.0", "fused.rs.1", "fused.rs.2",
                                   "fused.rs.3"};

/* Grouped allgather (member j: j + 1 rows of 2 per rank) and reducescatter
 * (member j: 3P + j rows of 1, summed) of float32, checked exactly. */
static void test_fused(void) {
  hvd_tensor_t sends[NF], outs[NF];
  float *bufs[NF];
  int good = 1;
  for (int j = 0; j < NF; j++) {
    int64_t shape[2] = {j + 1, 2};
    float h[8];
    for (int i = 0; i < (j + 1) * 2; i++)
      h[i] = (float)(10 * rank + i + j);
    cuda_ok(cudaMalloc((void **)&bufs[j], sizeof h), "cudaMalloc");
    cuda_ok(cudaMemcpy(bufs[j], h, sizeof h, cudaMemcpyHostToDevice), "H2D");
    sends[j] = hvd_tensor_make(bufs[j], HVD_FLOAT32, 2, shape);
    sends[j].device = dev;
    memset(&outs[j], 0, sizeof outs[j]);
  }
  long ag0 = standin_nccl_calls("ncclAllGather"),
       bc0 = standin_nccl_calls("ncclBroadcast");
  is_int(HVD_SUCCESS, hvd_grouped_allgather(NF, ag_names, sends, outs),
         "grouped device allgather of %d", NF);
  is_int(size > 1, standin_nccl_calls("ncclAllGather") - ag0,
         "its small members packed into one ncclAllGather (none at one rank)");
  is_int(0, standin_nccl_calls("ncclBroadcast") - bc0, "and no ncclBroadcast");
  for (int j = 0; j < NF; j++) {
    int64_t n = (int64_t)size * (j + 1) * 2;
    float h[64];
    cuda_ok(cudaMemcpy(h, outs[j].data, (size_t)n * sizeof *h,
                       cudaMemcpyDeviceToHost),
            "D2H");
    for (int64_t i = 0; i < n; i++)
      good &= h[i] == (float)(10 * (i / ((j + 1) * 2)) + i % ((j + 1) * 2) + j);
    hvd_tensor_free(&outs[j]);
    cudaFree(bufs[j]);
  }
  ok(good, "its results exact");
  good = 1;
  for (int j = 0; j < NF; j++) {
    int64_t shape[1] = {3 * size + j};
    float h[32];
    for (int i = 0; i < shape[0]; i++)
      h[i] = (float)(rank + i);
    cuda_ok(cudaMalloc((void **)&bufs[j], sizeof h), "cudaMalloc");
    cuda_ok(cudaMemcpy(bufs[j], h, sizeof h, cudaMemcpyHostToDevice), "H2D");
    sends[j] = hvd_tensor_make(bufs[j], HVD_FLOAT32, 1, shape);
    sends[j].device = dev;
    memset(&outs[j], 0, sizeof outs[j]);
  }
  long rs0 = standin_nccl_calls("ncclReduceScatter");
  is_int(HVD_SUCCESS,
         hvd_grouped_reducescatter(NF, rs_names, sends, outs, HVD_SUM, 1, 1),
         "grouped device reducescatter of %d", NF);
  is_int(size > 1, standin_nccl_calls("ncclReduceScatter") - rs0,
         "one ncclReduceScatter for the group (none at one rank)");
  for (int j = 0; j < NF; j++) {
    int64_t rows = 3 * size + j, q = rows / size, m = rows % size;
    int64_t mine = q + (rank < m), first = rank * q + (rank < m ? rank : m);
    float h[32];
    cuda_ok(cudaMemcpy(h, outs[j].data, (size_t)mine * sizeof *h,
                       cudaMemcpyDeviceToHost),
            "D2H");
    for (int64_t i = 0; i < mine; i++)
      good &= h[i] == (float)(size * (size - 1) / 2 + size * (first + i));
    hvd_tensor_free(&outs[j]);
    cudaFree(bufs[j]);
  }
  ok(good, "its blocks exact");
}

/* A grouped allgather of a large member with as many rows on every rank
 * (its own ncclAllGather: 20000 floats, 80000 bytes, past the 64 KiB
 * where packing stops paying), a member with rank q's q + 1 rows (uneven:
 * packed, padded to the largest share) and one of 3 rows (packed with
 * it): two ncclAllGather calls at P > 1, none at one rank, no
 * ncclBroadcast; every row exact. */
#define BIG 20000
static void test_direct_and_packed(void) {
  static const char *names[3] = {"mix.big", "mix.uneven", "mix.small"};
  int64_t rows[3] = {BIG, rank + 1, 3};
  hvd_tensor_t sends[3], outs[3];
  float *bufs[3], *h = malloc(BIG * sizeof *h);
  if (h == NULL)
    bail("malloc");
  for (int j = 0; j < 3; j++) {
    for (int64_t i = 0; i < rows[j]; i++)
      h[i] = (float)(1000 * j + 100 * rank + i % 97);
    cuda_ok(cudaMalloc((void **)&bufs[j], (size_t)rows[j] * sizeof *h),
            "cudaMalloc");
    cuda_ok(cudaMemcpy(bufs[j], h, (size_t)rows[j] * sizeof *h,
                       cudaMemcpyHostToDevice),
            "H2D");
    sends[j] = hvd_tensor_make(bufs[j], HVD_FLOAT32, 1, &rows[j]);
    sends[j].device = dev;
    memset(&outs[j], 0, sizeof outs[j]);
  }
  long ag0 = standin_nccl_calls("ncclAllGather"),
       bc0 = standin_nccl_calls("ncclBroadcast");
  is_int(HVD_SUCCESS, hvd_grouped_allgather(3, names, sends, outs),
         "grouped allgather: a large member, an uneven one, a small one");
  is_int(size > 1 ? 2 : 0, standin_nccl_calls("ncclAllGather") - ag0,
         "the large one's ncclAllGather and one for the packed two");
  is_int(0, standin_nccl_calls("ncclBroadcast") - bc0,
         "no ncclBroadcast for the uneven one");
  int good = 1;
  char why[200] = "";
  float *g = malloc((size_t)size * BIG * sizeof *g);
  if (g == NULL)
    bail("malloc");
  for (int j = 0; j < 3; j++) {
    int64_t total = 0, at = 0;
    for (int q = 0; q < size; q++)
      total += j == 0 ? BIG : j == 1 ? q + 1 : 3;
    good &= outs[j].shape[0] == total;
    if (!good)
      break;
    cuda_ok(cudaMemcpy(g, outs[j].data, (size_t)total * sizeof *g,
                       cudaMemcpyDeviceToHost),
            "D2H");
    for (int q = 0; q < size; q++) {
      int64_t r = j == 0 ? BIG : j == 1 ? q + 1 : 3;
      for (int64_t i = 0; i < r; i++, at++)
        if (good && g[at] != (float)(1000 * j + 100 * q + i % 97)) {
          good = 0;
          snprintf(why, sizeof why, "%s row %lld = %g", names[j], (long long)at,
                   (double)g[at]);
        }
    }
  }
  tap_note("%s", why);
  ok(good, "every rank's rows of each, in rank order");
  for (int j = 0; j < 3; j++) {
    hvd_tensor_free(&outs[j]);
    cudaFree(bufs[j]);
  }
  free(g);
  free(h);
}

/* ZeRO-1's allgather of the values waits for no ready event: they are
 * settled by the synchronised update before it (hvd__device_settled).
 * NZ device parameters (uneven sizes) under SGD, distributed unsharded
 * and sharded: one step of each makes exactly NZ + 1 cudaStreamWaitEvent
 * calls, one per gradient's reduction and the step's own (its stream
 * waits for the caller's; an allgather that waited too made 2 NZ + 1),
 * and both leave the same values. Their tensors' placement is
 * asked of the runtime once per in-place allreduce and three times per
 * sharded parameter (an in-place recv, or a block within the output it
 * is gathered into, is not asked again: 2 NZ and 4 NZ before), less
 * one per empty block (a parameter of 3 elements at np 4). */
#define NZ 5
static void test_zero_waits(void) {
  static const char *names[NZ] = {"z.0", "z.1", "z.2", "z.3", "z.4"};
  hvd_param_t ps[2][NZ];
  hvd_optimizer_t *opt[2] = {NULL, NULL};
  long waits[2] = {-1, -1}, queries[2] = {-1, -1};
  float h[64];
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < NZ; i++) {
      int64_t n = 7 * i + 3;
      void *v, *g;
      for (int64_t e = 0; e < n; e++)
        h[e] = (float)(i + e);
      cuda_ok(cudaMalloc(&v, sizeof h), "cudaMalloc");
      cuda_ok(cudaMalloc(&g, sizeof h), "cudaMalloc");
      cuda_ok(cudaMemcpy(v, h, sizeof h, cudaMemcpyHostToDevice), "H2D");
      for (int64_t e = 0; e < n; e++)
        h[e] = (float)(rank + 1) / 4;
      cuda_ok(cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice), "H2D");
      ps[k][i].name = names[i];
      ps[k][i].value = hvd_tensor_make(v, HVD_FLOAT32, 1, &n);
      ps[k][i].grad = hvd_tensor_make(g, HVD_FLOAT32, 1, &n);
      ps[k][i].value.device = ps[k][i].grad.device = dev;
    }
    hvd_sgd_options_t so;
    hvd_sgd_options_init(&so);
    hvd_optimizer_t *base = NULL;
    hvd_distributed_options_t o;
    hvd_distributed_options_init(&o);
    o.shard_optimizer_state = k;
    if (hvd_sgd_create(ps[k], NZ, &so, &base) != HVD_SUCCESS ||
        hvd_distributed_optimizer(base, &o, &opt[k]) != HVD_SUCCESS)
      bail("optimizer: %s", hvd_last_error());
    long w0 = standin_stream_waits(), q0 = standin_pointer_queries();
    for (int i = NZ - 1; i >= 0; i--)
      if (hvd_optimizer_grad_ready(opt[k], i) != HVD_SUCCESS)
        bail("grad_ready: %s", hvd_last_error());
    if (hvd_optimizer_step(opt[k]) != HVD_SUCCESS)
      bail("step: %s", hvd_last_error());
    waits[k] = standin_stream_waits() - w0;
    queries[k] = standin_pointer_queries() - q0;
  }
  is_int(NZ + 1, waits[0],
         "an unsharded step: one stream wait per gradient, one for the step");
  is_int(NZ + 1, waits[1],
         "a sharded step too: the values' allgather waits for no event");
  /* Each submission asks where its tensors are, but an in-place recv or a
   * block gathered into its own value is not asked again. */
  is_int(NZ, queries[0],
         "an unsharded step: one pointer query per gradient (in place)");
  long want = 2 * NZ; /* a block of no elements is not asked of at all */
  for (int i = 0; i < NZ; i++)
    want += (7 * i + 3) / size + (rank < (7 * i + 3) % size) > 0;
  is_int(want, queries[1],
         "a sharded step: three per parameter (gradient and block of the "
         "reduce-scatter, the value of the allgather)");
  int same = 1;
  float a[64], b[64];
  for (int i = 0; i < NZ; i++) {
    size_t bytes = (size_t)(7 * i + 3) * sizeof(float);
    cuda_ok(cudaMemcpy(a, ps[0][i].value.data, bytes, cudaMemcpyDeviceToHost),
            "D2H");
    cuda_ok(cudaMemcpy(b, ps[1][i].value.data, bytes, cudaMemcpyDeviceToHost),
            "D2H");
    same &= memcmp(a, b, bytes) == 0;
  }
  ok(same, "and both steps leave the same values");
  for (int k = 0; k < 2; k++) {
    hvd_optimizer_destroy(opt[k]);
    for (int i = 0; i < NZ; i++) {
      cudaFree(ps[k][i].value.data);
      cudaFree(ps[k][i].grad.data);
    }
  }
}

int main(int argc, char **argv) {
  dev = standin_gpu_each(&argc, &argv, &rank, &size);
  setenv("HVD_GPU_OPERATIONS", "nccl", 1);
  setenv("HVD_STANDIN_POLLS", "40", 1);
  char dir[512], tl[600];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-flight");
  snprintf(tl, sizeof tl, "%s/timeline.json", dir);
  setenv("HVD_TIMELINE", tl, 1);
  long allocs0 = standin_device_allocations();
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  test_eight_groups();
  test_growth();
  test_process_set();
  test_stream_wait();
  test_fused();
  test_direct_and_packed();
  test_zero_waits();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  char *text = rank == 0 ? hvdt_slurp(tl) : NULL;
  ok(rank != 0 || hvdt_timeline_fused(text, ag_names, NF, "ALLGATHER"),
     "the allgathers ran as one group (rank 0's timeline)");
  ok(rank != 0 || hvdt_timeline_fused(text, rs_names, NF, "REDUCESCATTER"),
     "the reducescatters ran as one group (rank 0's timeline)");
  free(text);
  hvdt_remove_tmpdir(dir);
  is_int(allocs0, standin_device_allocations(), "hvd freed its device memory");
  is_int(0, standin_pinned_allocations(), "and its pinned memory");
  is_int(0, standin_streams() + standin_events(), "and its streams and events");
  return tap_mpi_finish();
}
