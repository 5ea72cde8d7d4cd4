/*
 * collectives.c - every collective on device tensors against exact host
 * expectations, through each device executor this build has:
 *
 *   nccl  (HVD_GPU_OPERATIONS=nccl) at np 1, and at np N when N GPUs are
 *         visible (each rank on its own); skipped in a build without NCCL;
 *   mpi   (HVD_GPU_OPERATIONS=mpi, host-staged) at every np, every rank on
 *         one GPU when there are fewer GPUs than ranks.
 *
 * Each pass: hvd_init, then
 *  - allreduce of float32, float16, bfloat16 and int32, every op, scalar
 *    and [17], [1000] tensors, in place and out of place, prescale and
 *    postscale on floats, plus [100003] sum/average ones: as one burst
 *    (fused groups through the device fusion buffer) and one by one (lone
 *    tensors reduced in place);
 *  - compression: float32 with float16 and bfloat16 on the wire, every op,
 *    as a burst and one by one;
 *  - broadcast from the first and the last rank; allgather with a first
 *    dimension that differs per rank and one that does not, each twice
 *    (the second time agreed through the cache); alltoall with uneven
 *    splits (some empty); reducescatter of an uneven and an even row
 *    count, several ops and scales: every dtype above;
 *  - errors: a tensor on another GPU than the rank's ("tensor is on cuda:N
 *    but this rank uses cuda:M"), send and recv on different devices, a
 *    device tensor on pageable host memory (where the GPU cannot reach
 *    it: cudaDevAttrPageableMemoryAccess 0), and
 *    (np >= 2) rank 0 on the host while the others are on the GPU: the
 *    coordinator's mismatch "device cpu vs cuda:N";
 *  - (np >= 2) the last rank joins at once while the others reduce device
 *    tensors: its stubs hold the identity on its GPU; first thing after
 *    hvd_init (its first device collective holds only stubs, which must be
 *    on the device current at hvd_init) and again after the rest;
 *  - fused gathers and scatters: grouped allgathers and reducescatters
 *    of mixed shapes (empty ones too) run as one group each; ZeRO's
 *    allgather in place into a given tensor and reducescatter into a given
 *    block, and a given output of the wrong shape refused;
 *  - device ordering: inputs written on the submitting thread's stream
 *    (test_device_order); hvd_cuda_stream_wait ordering a stream after a
 *    result without the host waiting for it, and refusing a host request
 *    (test_stream_wait);
 *  - HVD_ADASUM on device tensors (staged through host memory by every
 *    executor) equal to the host's bit for bit, with a device sum between
 *    them (test_adasum);
 * then hvd_shutdown. Values are small integers (products of +-1 and +-2),
 * so every dtype holds every result exactly (float32 averages within 2
 * ulps, as in the host tests).
 *
 * The tests run with HVD_NO_BIND=1 (t/mpirun-test): each rank makes its
 * device current before hvd_init. Skips ("no CUDA device: ...") in a build
 * without CUDA and when cudaGetDeviceCount finds no device or fails.
 * Registered at np 1, 2 and 4 (t/gpu/local.mk); doc/gpu-testing.md.
 */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include "gputest.h"

#ifndef HVD_HAVE_CUDA

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  skip_all("%s", GPU_TEST_NO_CUDA);
}

#else /* HVD_HAVE_CUDA */

#include <cuda_runtime_api.h>
#include <mpi.h>

#include "core/api.h" /* hvd__allreduce_wire_async: compression */

static int rank, size, dev;
static const char *pass_name;

#define NDT 4
static const hvd_dtype_t dts[NDT] = {HVD_FLOAT32, HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_INT32};
static const double scales[3][2] = {{1, 1}, {2, 0.25}, {0.5, 3}};

/* ---- device memory ------------------------------------------------------ */

/* Complete when it returns: cudaMemcpy from pageable memory may return
 * before its DMA has landed, and hvd's stream waits for no other (the
 * contract: inputs complete at submission). */
static void h2d(void *d, const void *h, size_t bytes) {
  if (bytes > 0) {
    cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

static void d2h(void *h, const void *d, size_t bytes) {
  if (bytes > 0)
    cuda_ok(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

static hvd_tensor_t dtensor(void *data, hvd_dtype_t dt, int ndim,
                            const int64_t *shape) {
  hvd_tensor_t t = hvd_tensor_make(data, dt, ndim, shape);
  t.device = dev;
  return t;
}

/* A device copy of n elements made by fill(i). */
static void *dfill(hvd_dtype_t dt, int64_t n, double (*fill)(int64_t, void *),
                   void *ctx) {
  void *h = hvdt_calloc((size_t)n, hvdt_size(dt));
  for (int64_t i = 0; i < n; i++)
    hvdt_put(dt, h, i, fill(i, ctx));
  void *d = dalloc((size_t)n * hvdt_size(dt));
  h2d(d, h, (size_t)n * hvdt_size(dt));
  free(h);
  return d;
}

/* 1 if the n elements of device buffer d are want[0..n) exactly. */
static int dsame(hvd_dtype_t dt, const void *d, const double *want, int64_t n,
                 char *why, size_t len) {
  void *h = hvdt_calloc((size_t)n, hvdt_size(dt));
  struct hvdt_wrong w;
  d2h(h, d, (size_t)n * hvdt_size(dt));
  int good = hvdt_compare(dt, h, n, hvdt_want_array, want, HVDT_EXACT, &w);
  if (!good)
    snprintf(why, len, "element %lld = %.17g, expected %.17g", (long long)w.at,
             w.got, w.want);
  free(h);
  return good;
}

/* ---- allreduce jobs (hvdt_ar with device buffers) ------------------------ */

struct dj {
  struct hvdt_ar a; /* parameters; host copies of send and of the result */
  hvd_dtype_t wire; /* a.dtype, or float16/bfloat16 for compression */
  void *ds, *dr;    /* device send and recv (dr == ds in place) */
};

static void dj_set(struct dj *j, const char *prefix, hvd_dtype_t dt,
                   hvd_dtype_t wire, hvd_op_t op, int ndim, int64_t n,
                   const double sc[2], int in_place, int salt) {
  memset(j, 0, sizeof *j);
  snprintf(j->a.name, sizeof j->a.name, "%s.%s.%s.%s.%lld.%s", prefix,
           hvd_dtype_name(dt), hvd_dtype_name(wire), hvd_op_name(op),
           (long long)n, in_place ? "in" : "out");
  j->a.dtype = dt;
  j->a.op = op;
  j->a.ndim = ndim;
  j->a.n = n;
  j->a.pre = sc[0];
  j->a.post = sc[1];
  j->a.in_place = in_place;
  j->a.salt = salt;
  j->wire = wire;
}

/* As hvdt_ar_submit, on device copies; active 0: this rank only waits. */
static void dj_submit(struct dj *j, int active) {
  struct hvdt_ar *a = &j->a;
  size_t es = hvdt_size(a->dtype), bytes = (size_t)a->n * es;
  int64_t shape[1] = {a->n};
  hvdt_ar_free(a);
  a->send = hvdt_calloc((size_t)a->n, es);
  a->recv = a->in_place ? a->send : hvdt_calloc((size_t)a->n, es);
  for (int64_t i = 0; i < a->n; i++) {
    hvdt_put(a->dtype, a->send, i, hvdt_burst_value(a, rank, i));
    if (!a->in_place)
      hvdt_put(a->dtype, a->recv, i, -99);
  }
  j->ds = dalloc(bytes);
  j->dr = a->in_place ? j->ds : dalloc(bytes);
  h2d(j->ds, a->send, bytes);
  if (!a->in_place)
    h2d(j->dr, a->recv, bytes);
  a->ts = dtensor(j->ds, a->dtype, a->ndim, shape);
  a->tr = dtensor(j->dr, a->dtype, a->ndim, shape);
  a->req = NULL;
  a->msg[0] = '\0';
  a->rc = HVD_SUCCESS;
  if (!active)
    return;
  if (j->wire == a->dtype)
    a->rc = hvd_allreduce_async(a->name, &a->ts, &a->tr, a->op, a->pre, a->post,
                                &a->req);
  else
    a->rc = hvd__allreduce_wire_async(a->name, &a->ts, &a->tr, a->op, a->pre,
                                      a->post, j->wire, &a->req);
  if (a->rc != HVD_SUCCESS) {
    snprintf(a->msg, sizeof a->msg, "%s", hvd_last_error());
    a->req = NULL;
  }
}

/* Waits, copies the device buffers back into the host copies, checks
 * against ranks 0..active-1 contributing (one TAP line). */
static void dj_check(struct dj *j, int active, const char *what) {
  struct hvdt_ar *a = &j->a;
  size_t bytes = (size_t)a->n * hvdt_size(a->dtype);
  char why[1200] = "";
  hvdt_ar_wait(a);
  d2h(a->recv, j->dr, bytes);
  if (!a->in_place)
    d2h(a->send, j->ds, bytes);
  int good = hvdt_ar_check(a, hvdt_burst_value, active, why, sizeof why);
  tap_note("%s", why);
  ok(good, "%s %s: %s", pass_name, what, a->name);
  if (j->dr != j->ds)
    cudaFree(j->dr);
  cudaFree(j->ds);
  j->ds = j->dr = NULL;
  hvdt_ar_free(a);
}

/* Every dtype and op at three sizes, in and out of place, and big ones
 * (sum in place, average out of place) when big. */
static int plain_jobs(struct dj *out, const char *prefix, int big) {
  static const int64_t sizes[3] = {1, 17, 1000};
  int n = 0;
  for (int d = 0; d < NDT; d++) {
    hvd_dtype_t dt = dts[d];
    for (int o = 0; o <= HVD_PRODUCT; o++) { /* elementwise (no Adasum) */
      const double *sc = scales[dt == HVD_INT32 ? 0 : (d + o) % 3];
      for (int z = 0; z < 3; z++)
        for (int place = 0; place < 2; place++) {
          dj_set(&out[n], prefix, dt, dt, (hvd_op_t)o, z == 0 ? 0 : 1, sizes[z],
                 sc, place, 7 * n + 1);
          n++;
        }
    }
    if (big) {
      const double *sc = scales[dt == HVD_INT32 ? 0 : 1];
      dj_set(&out[n], prefix, dt, dt, HVD_SUM, 1, 100003, sc, 1, 7 * n + 1);
      n++;
      dj_set(&out[n], prefix, dt, dt, HVD_AVERAGE, 1, 100003, sc, 0, 7 * n + 1);
      n++;
    }
  }
  return n;
}

/* float32 with float16 and bfloat16 on the wire. */
static int wire_jobs(struct dj *out, const char *prefix) {
  static const hvd_dtype_t wires[2] = {HVD_FLOAT16, HVD_BFLOAT16};
  static const int64_t sizes[2] = {17, 5000};
  int n = 0;
  for (int wi = 0; wi < 2; wi++)
    for (int o = 0; o <= HVD_PRODUCT; o++)
      for (int z = 0; z < 2; z++)
        for (int place = 0; place < 2; place++) {
          dj_set(&out[n], prefix, HVD_FLOAT32, wires[wi], (hvd_op_t)o, 1,
                 sizes[z], scales[(wi + o + z) % 3], place, 5 * n + 3);
          n++;
        }
  return n;
}

#define MAX_JOBS 160

/* All submitted, then all waited for: consecutive compatible jobs fuse. */
static void burst(struct dj *jobs, int n, const char *what) {
  for (int i = 0; i < n; i++)
    dj_submit(&jobs[i], 1);
  for (int i = 0; i < n; i++)
    dj_check(&jobs[i], size, what);
}

/* One at a time: every job alone in its group. keep(j) chooses. */
static void one_by_one(struct dj *jobs, int n, const char *what,
                       int (*keep)(const struct dj *)) {
  for (int i = 0; i < n; i++)
    if (keep(&jobs[i])) {
      dj_submit(&jobs[i], 1);
      dj_check(&jobs[i], size, what);
    }
}

static int keep_large(const struct dj *j) { return j->a.n >= 1000; }
static int keep_all(const struct dj *j) { return j != NULL; }

static void test_allreduce(void) {
  static struct dj jobs[MAX_JOBS];
  int n = plain_jobs(jobs, "ar", 1);
  burst(jobs, n, "allreduce burst");
  n = plain_jobs(jobs, "ar1", 1);
  one_by_one(jobs, n, "allreduce alone", keep_large);
  n = wire_jobs(jobs, "cw");
  burst(jobs, n, "compressed burst");
  n = wire_jobs(jobs, "cw1");
  one_by_one(jobs, n, "compressed alone", keep_all);
}

/* ---- broadcast, allgather, alltoall, reducescatter ----------------------- */

/* Small integers of every dtype, by (q, i, salt). */
static double val(int q, int64_t i, int salt) {
  return (double)((q * 7 + i * 3 + salt) % 23) - 11;
}

struct qs {
  int q, salt;
};

static double fill_val(int64_t i, void *ctx) {
  const struct qs *c = ctx;
  return val(c->q, i, c->salt);
}

static void test_broadcast(void) {
  int64_t shape[2] = {7, 143}, n = 7 * 143;
  double *want = hvdt_calloc((size_t)n, sizeof *want);
  for (int d = 0; d < NDT; d++)
    for (int k = 0; k < 2; k++) {
      hvd_dtype_t dt = dts[d];
      int root = k ? size - 1 : 0, salt = 3 * d + k;
      char name[64], why[300] = "";
      struct qs c = {rank, salt};
      void *buf = dfill(dt, n, fill_val, &c);
      hvd_tensor_t t = dtensor(buf, dt, 2, shape);
      snprintf(name, sizeof name, "bc.%s.%d", hvd_dtype_name(dt), root);
      hvd_result_t rc = hvd_broadcast(name, &t, root);
      for (int64_t i = 0; i < n; i++)
        want[i] = val(root, i, salt);
      int good = rc == HVD_SUCCESS && dsame(dt, buf, want, n, why, sizeof why);
      tap_note("rc %d (%s) %s", rc, hvd_last_error(), why);
      ok(good, "%s broadcast %s from rank %d", pass_name, hvd_dtype_name(dt),
         root);
      cudaFree(buf);
    }
  free(want);
}

static int64_t rows_uneven(int q) { return q + 1; }
static int64_t rows_even(int q) { return q >= 0 ? 2 : 0; }

/* This rank's rows of (rows_of(rank), cols), gathered; twice under one
 * name: the second time through the cache. */
static void allgather_case(hvd_dtype_t dt, const char *kind,
                           int64_t (*rows_of)(int), int64_t cols) {
  int64_t mine = rows_of(rank), total = 0;
  for (int q = 0; q < size; q++)
    total += rows_of(q);
  double *want = hvdt_calloc((size_t)(total * cols) + 1, sizeof *want);
  for (int q = 0, at = 0; q < size; q++)
    for (int64_t i = 0; i < rows_of(q) * cols; i++)
      want[at++] = val(q, i, 11);
  char name[64];
  snprintf(name, sizeof name, "ag.%s.%s", kind, hvd_dtype_name(dt));
  for (int round = 0; round < 2; round++) {
    struct qs c = {rank, 11};
    int64_t shape[2] = {mine, cols};
    void *buf = dfill(dt, mine * cols, fill_val, &c);
    hvd_tensor_t t = dtensor(buf, dt, 2, shape), out;
    memset(&out, 0, sizeof out);
    char why[300] = "";
    hvd_result_t rc = hvd_allgather(name, &t, &out);
    tap_note("rc %d (%s)", rc, hvd_last_error());
    int good = rc == HVD_SUCCESS && out.device == dev && out.ndim == 2 &&
               out.shape[0] == total && out.shape[1] == cols && out.dtype == dt;
    if (rc == HVD_SUCCESS && !good)
      snprintf(why, sizeof why, "output device %d ndim %d shape [%lld, %lld]",
               out.device, out.ndim, (long long)out.shape[0],
               (long long)out.shape[1]);
    if (good)
      good = dsame(dt, out.data, want, total * cols, why, sizeof why);
    tap_note("%s", why);
    ok(good, "%s allgather %s %s rows%s", pass_name, hvd_dtype_name(dt), kind,
       round ? " (cached)" : "");
    hvd_tensor_free(&out);
    cudaFree(buf);
  }
  free(want);
}

/* Rank q sends (q + k) % 3 rows of cols to rank k; element (row j, col c)
 * of the block from q to k is this. */
static double a2a_val(int q, int k, int64_t j, int64_t c) {
  return (double)((q * 5 + k * 3 + j * 7 + c) % 19) - 9;
}

static void test_alltoall(void) {
  const int64_t cols = 2;
  int64_t *splits = hvdt_calloc((size_t)size, sizeof *splits);
  int64_t *got = hvdt_calloc((size_t)size, sizeof *got);
  int64_t rows = 0, total = 0;
  for (int k = 0; k < size; k++) {
    splits[k] = (rank + k) % 3;
    rows += splits[k];
    total += (k + rank) % 3;
  }
  double *in = hvdt_calloc((size_t)(rows * cols) + 1, sizeof *in);
  double *want = hvdt_calloc((size_t)(total * cols) + 1, sizeof *want);
  for (int k = 0, at = 0; k < size; k++)
    for (int64_t j = 0; j < splits[k]; j++)
      for (int64_t c = 0; c < cols; c++)
        in[at++] = a2a_val(rank, k, j, c);
  for (int q = 0, at = 0; q < size; q++)
    for (int64_t j = 0; j < (q + rank) % 3; j++)
      for (int64_t c = 0; c < cols; c++)
        want[at++] = a2a_val(q, rank, j, c);
  for (int d = 0; d < NDT; d++) {
    hvd_dtype_t dt = dts[d];
    size_t es = hvdt_size(dt);
    void *h = hvdt_calloc((size_t)(rows * cols) + 1, es);
    for (int64_t i = 0; i < rows * cols; i++)
      hvdt_put(dt, h, i, in[i]);
    void *buf = dalloc((size_t)(rows * cols) * es);
    h2d(buf, h, (size_t)(rows * cols) * es);
    int64_t shape[2] = {rows, cols};
    hvd_tensor_t t = dtensor(buf, dt, 2, shape), out;
    memset(&out, 0, sizeof out);
    char name[64], why[300] = "";
    snprintf(name, sizeof name, "a2a.%s", hvd_dtype_name(dt));
    hvd_result_t rc = hvd_alltoall(name, &t, splits, &out, got);
    tap_note("rc %d (%s)", rc, hvd_last_error());
    int good = rc == HVD_SUCCESS && out.device == dev &&
               out.shape[0] == total && out.shape[1] == cols;
    for (int q = 0; good && q < size; q++)
      if (got[q] != (q + rank) % 3) {
        snprintf(why, sizeof why, "recv_splits[%d] = %lld, expected %d", q,
                 (long long)got[q], (q + rank) % 3);
        good = 0;
      }
    if (good)
      good = dsame(dt, out.data, want, total * cols, why, sizeof why);
    tap_note("%s", why);
    ok(good, "%s alltoall %s, uneven splits", pass_name, hvd_dtype_name(dt));
    hvd_tensor_free(&out);
    cudaFree(buf);
    free(h);
  }
  free(in);
  free(want);
  free(splits);
  free(got);
}

/* Rank q's element (row, col) of reducescatter input; {-2,-1,1,2} for a
 * product. */
static double rs_val(hvd_op_t op, int q, int64_t row, int64_t c, int salt) {
  if (op == HVD_PRODUCT)
    return (double)((q + row + c + salt) % 2 + 1) *
           ((q * 3 + row + c + salt) % 5 == 0 ? -1.0 : 1.0);
  return (double)((q * 5 + row * 3 + c + salt) % 13) - 6;
}

static void reducescatter_case(hvd_dtype_t dt, hvd_op_t op, int64_t rows,
                               const double sc[2], int salt) {
  const int64_t cols = 3;
  int64_t mine = rows / size + (rank < rows % size), start = 0;
  for (int k = 0; k < rank; k++)
    start += rows / size + (k < rows % size);
  size_t es = hvdt_size(dt);
  void *h = hvdt_calloc((size_t)(rows * cols) + 1, es);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      hvdt_put(dt, h, r * cols + c, rs_val(op, rank, r, c, salt));
  double *want = hvdt_calloc((size_t)(mine * cols) + 1, sizeof *want);
  for (int64_t r = 0; r < mine; r++)
    for (int64_t c = 0; c < cols; c++) {
      double acc = 0;
      for (int q = 0; q < size; q++) {
        double v = rs_val(op, q, start + r, c, salt) * sc[0];
        acc = q ? hvdt_fold(op, acc, v) : v;
      }
      want[r * cols + c] =
          hvdt_as_dtype(dt, hvdt_finish(op, dt, acc, size, sc[1]));
    }
  void *buf = dalloc((size_t)(rows * cols) * es);
  h2d(buf, h, (size_t)(rows * cols) * es);
  int64_t shape[2] = {rows, cols};
  hvd_tensor_t t = dtensor(buf, dt, 2, shape), out;
  memset(&out, 0, sizeof out);
  char name[80], why[300] = "";
  snprintf(name, sizeof name, "rs.%s.%s.%lld", hvd_dtype_name(dt),
           hvd_op_name(op), (long long)rows);
  hvd_result_t rc = hvd_reducescatter(name, &t, &out, op, sc[0], sc[1]);
  tap_note("rc %d (%s)", rc, hvd_last_error());
  int good = rc == HVD_SUCCESS && out.device == dev && out.ndim == 2 &&
             out.shape[0] == mine && out.shape[1] == cols;
  if (good) {
    void *got = hvdt_calloc((size_t)(mine * cols) + 1, es);
    struct hvdt_wrong w;
    /* float32 averages: within 2 ulps, as the host tests */
    struct hvdt_tol tol = {0, dt == HVD_FLOAT32 && op == HVD_AVERAGE ? 2 : 0};
    d2h(got, out.data, (size_t)(mine * cols) * es);
    good = hvdt_compare(dt, got, mine * cols, hvdt_want_array, want, tol, &w);
    if (!good)
      snprintf(why, sizeof why, "element %lld = %.17g, expected %.17g",
               (long long)w.at, w.got, w.want);
    free(got);
  }
  tap_note("%s", why);
  ok(good, "%s reducescatter %s %s of %lld rows (pre %g, post %g)", pass_name,
     hvd_dtype_name(dt), hvd_op_name(op), (long long)rows, sc[0], sc[1]);
  hvd_tensor_free(&out);
  cudaFree(buf);
  free(h);
  free(want);
}

/* Fused device gathers and scatters: a grouped allgather of NG members
 * (float32 and int32, 0 to 2 rows per rank, 1 or 2 columns, one with no
 * rows anywhere) and a grouped reducescatter of NG float32 members (0 to
 * 2P+2 rows, prescale 0.5, postscale 3, average), each run as one group
 * (the executor's `fuses`); then ZeRO's way: an allgather into a given
 * tensor in place (each rank's rows already where they belong) and a
 * reducescatter into a given block, neither allocating. Exact values. */
#define NG 6
static int64_t fg_rows(int j, int q) { return j == 3 ? 0 : (q + j) % 3; }

static void fused_allgather(void) {
  const char *names[NG];
  char nb[NG][32];
  hvd_tensor_t sends[NG], outs[NG];
  void *bufs[NG];
  for (int j = 0; j < NG; j++) {
    hvd_dtype_t dt = j % 2 ? HVD_INT32 : HVD_FLOAT32;
    int64_t shape[2] = {fg_rows(j, rank), 1 + j % 2};
    struct qs c = {rank, 30 + j};
    snprintf(nb[j], sizeof nb[j], "fag.%d", j);
    names[j] = nb[j];
    bufs[j] = dfill(dt, shape[0] * shape[1], fill_val, &c);
    sends[j] = dtensor(bufs[j], dt, 2, shape);
    memset(&outs[j], 0, sizeof outs[j]);
  }
  hvd_result_t rc = hvd_grouped_allgather(NG, names, sends, outs);
  is_int(HVD_SUCCESS, rc, "%s: grouped device allgather of %d", pass_name, NG);
  int good = rc == HVD_SUCCESS;
  char why[300] = "";
  for (int j = 0; good && j < NG; j++) {
    int64_t cols = 1 + j % 2, total = 0, at = 0;
    for (int q = 0; q < size; q++)
      total += fg_rows(j, q);
    double *want = hvdt_calloc((size_t)(total * cols) + 1, sizeof *want);
    for (int q = 0; q < size; q++)
      for (int64_t i = 0; i < fg_rows(j, q) * cols; i++)
        want[at++] = val(q, i, 30 + j);
    good = outs[j].shape[0] == total && outs[j].device == dev &&
           dsame(sends[j].dtype, outs[j].data, want, total * cols, why,
                 sizeof why);
    free(want);
  }
  tap_note("%s", why);
  ok(good, "%s: every member's rows, in rank order", pass_name);
  for (int j = 0; j < NG; j++) {
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&outs[j]);
    cudaFree(bufs[j]);
  }
}

/* Rank q's row r, column c of reducescatter member j. */
static double frs_val(int j, int q, int64_t r, int64_t c) {
  return rs_val(HVD_SUM, q, r, c, 40 + j);
}

static void fused_reducescatter(void) {
  const char *names[NG];
  char nb[NG][32];
  hvd_tensor_t sends[NG], outs[NG];
  void *bufs[NG];
  const double sc[2] = {0.5, 3};
  for (int j = 0; j < NG; j++) {
    int64_t rows = j == 2 ? 0 : size * (j % 3) + j, cols = 1 + j % 2;
    float *h = hvdt_calloc((size_t)(rows * cols) + 1, sizeof *h);
    for (int64_t i = 0; i < rows * cols; i++)
      h[i] = (float)frs_val(j, rank, i / cols, i % cols);
    bufs[j] = dalloc((size_t)(rows * cols) * sizeof *h + 1);
    h2d(bufs[j], h, (size_t)(rows * cols) * sizeof *h);
    free(h);
    int64_t shape[2] = {rows, cols};
    snprintf(nb[j], sizeof nb[j], "frs.%d", j);
    names[j] = nb[j];
    sends[j] = dtensor(bufs[j], HVD_FLOAT32, 2, shape);
    memset(&outs[j], 0, sizeof outs[j]);
  }
  hvd_result_t rc = hvd_grouped_reducescatter(NG, names, sends, outs,
                                              HVD_AVERAGE, sc[0], sc[1]);
  is_int(HVD_SUCCESS, rc, "%s: grouped device reducescatter of %d", pass_name,
         NG);
  int good = rc == HVD_SUCCESS;
  char why[300] = "";
  for (int j = 0; good && j < NG; j++) {
    int64_t rows = sends[j].shape[0], cols = sends[j].shape[1];
    int64_t mine = rows / size + (rank < rows % size), start = 0;
    for (int k = 0; k < rank; k++)
      start += rows / size + (k < rows % size);
    double *want = hvdt_calloc((size_t)(mine * cols) + 1, sizeof *want);
    for (int64_t i = 0; i < mine * cols; i++) {
      double acc = 0;
      for (int q = 0; q < size; q++)
        acc +=
            (double)(float)(frs_val(j, q, start + i / cols, i % cols) * sc[0]);
      want[i] = (double)(float)(acc / size * sc[1]);
    }
    void *got = hvdt_calloc((size_t)(mine * cols) + 1, sizeof(float));
    struct hvdt_wrong w;
    struct hvdt_tol tol = {0, 2}; /* float32 averages: within 2 ulps */
    good = outs[j].shape[0] == mine;
    if (good && mine > 0) {
      d2h(got, outs[j].data, (size_t)(mine * cols) * sizeof(float));
      good = hvdt_compare(HVD_FLOAT32, got, mine * cols, hvdt_want_array, want,
                          tol, &w);
      if (!good)
        snprintf(why, sizeof why, "member %d element %lld = %.17g, want %.17g",
                 j, (long long)w.at, w.got, w.want);
    }
    free(got);
    free(want);
  }
  tap_note("%s", why);
  ok(good, "%s: every member's block, averaged and scaled", pass_name);
  for (int j = 0; j < NG; j++) {
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&outs[j]);
    cudaFree(bufs[j]);
  }
}

/* ZeRO's calls: allgather in place into a given tensor, reducescatter
 * into a given block; a given output of the wrong shape fails, naming
 * both shapes, and is left alone. */
static void into_calls(void) {
  enum { N = 23 };
  int64_t q = N / size, m = N % size, len = q + (rank < m),
          off = rank * q + (rank < m ? rank : m), n = N;
  float h[N], want[N];
  for (int i = 0; i < N; i++) {
    int owner = 0;
    while (owner + 1 < size &&
           (owner + 1) * q + (owner + 1 < m ? owner + 1 : m) <= i)
      owner++;
    want[i] = (float)(100 * owner + i);
    h[i] = i >= off && i < off + len ? want[i] : -1.0f;
  }
  float *d = dalloc(sizeof h);
  h2d(d, h, sizeof h);
  hvd_tensor_t whole = dtensor(d, HVD_FLOAT32, 1, &n);
  hvd_tensor_t mine = dtensor(d + off, HVD_FLOAT32, 1, &len);
  hvd_request_t *r = NULL;
  hvd_result_t rc = hvd__allgather_into_async("into.ag", &mine, &whole, &r);
  if (rc == HVD_SUCCESS)
    rc = hvd_wait(r);
  is_int(HVD_SUCCESS, rc, "%s: allgather into a given tensor, in place",
         pass_name);
  char why[300] = "";
  double wd[N];
  for (int i = 0; i < N; i++)
    wd[i] = want[i];
  ok(dsame(HVD_FLOAT32, d, wd, N, why, sizeof why),
     "%s: every rank's block in place %s", pass_name, why);
  float *blk = dalloc((size_t)len * sizeof(float) + 1);
  hvd_tensor_t out = dtensor(blk, HVD_FLOAT32, 1, &len);
  rc =
      hvd__reducescatter_into_async("into.rs", &whole, &out, HVD_SUM, 1, 1, &r);
  if (rc == HVD_SUCCESS)
    rc = hvd_wait(r);
  is_int(HVD_SUCCESS, rc, "%s: reducescatter into a given block", pass_name);
  for (int i = 0; i < len; i++)
    wd[i] = (double)size * want[off + i];
  ok(dsame(HVD_FLOAT32, blk, wd, len, why, sizeof why),
     "%s: the summed block %s", pass_name, why);
  int64_t wrong = len + 1;
  hvd_tensor_t bad = dtensor(blk, HVD_FLOAT32, 1, &wrong);
  rc = hvd__reducescatter_into_async("into.bad", &whole, &bad, HVD_SUM, 1, 1,
                                     &r);
  if (rc == HVD_SUCCESS)
    rc = hvd_wait(r);
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: a given output of the wrong shape",
         pass_name);
  /* NCCL agrees on a group's preparation: every rank reports rank 0's
   * words (the first that failed); the host-staged pass its own */
  int nccl = strcmp(pass_name, "nccl") == 0;
  int64_t l0 = nccl ? q + (0 < m) : len;
  char msg[300];
  snprintf(msg, sizeof msg,
           "%sreducescatter 'into.bad': the output given has shape [%lld] but "
           "the result has [%lld]",
           nccl && rank != 0 ? "rank 0 could not prepare the collective on "
                               "its GPU: "
                             : "",
           (long long)l0 + 1, (long long)l0);
  ok(strstr(hvd_last_error(), msg) != NULL, "%s: its message names both shapes",
     pass_name);
  tap_note("%s", hvd_last_error());
  cudaFree(blk);
  cudaFree(d);
}

static void test_fused_gathers(void) {
  fused_allgather();
  fused_reducescatter();
  into_calls();
}

static void test_gathers(void) {
  test_broadcast();
  for (int d = 0; d < NDT; d++) {
    allgather_case(dts[d], "uneven", rows_uneven, 5);
    allgather_case(dts[d], "even", rows_even, 3);
  }
  test_alltoall();
  static const hvd_op_t ops[4] = {HVD_SUM, HVD_AVERAGE, HVD_MAX, HVD_PRODUCT};
  for (int d = 0; d < NDT; d++)
    for (int o = 0; o < 4; o++) {
      const double *sc = scales[dts[d] == HVD_INT32 ? 0 : (d + o) % 3];
      reducescatter_case(dts[d], ops[o], 2 * size + 1, sc, d + o);
      if (o < 2)
        reducescatter_case(dts[d], ops[o], 2 * size, sc, d + o);
    }
}

/* ---- errors -------------------------------------------------------------- */

static void expect(hvd_result_t rc, hvd_result_t want_rc, const char *want,
                   const char *what) {
  char seen[1024];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(want_rc, rc, "%s %s: result", pass_name, what);
  is_string(want, seen, "%s %s: message", pass_name, what);
}

static void test_errors(void) {
  float *d = dalloc(16 * sizeof *d);
  float h[16] = {0};
  int64_t shape[1] = {16};
  char want[300];
  cuda_ok(cudaMemset(d, 0, 16 * sizeof *d), "cudaMemset");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); /* as h2d */

  hvd_tensor_t t = dtensor(d, HVD_FLOAT32, 1, shape);
  t.device = dev + 1;
  snprintf(want, sizeof want,
           "allreduce 'wrong': tensor is on cuda:%d but this rank uses "
           "cuda:%d",
           dev + 1, dev);
  expect(hvd_allreduce("wrong", &t, &t, HVD_SUM, 1, 1), HVD_ERR_INVALID_ARG,
         want, "a tensor on another GPU");

  hvd_tensor_t s = dtensor(d, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(h, HVD_FLOAT32, 1, shape);
  snprintf(want, sizeof want,
           "allreduce 'split': recv is on cpu but send is on cuda:%d", dev);
  expect(hvd_allreduce("split", &s, &r, HVD_SUM, 1, 1), HVD_ERR_INVALID_ARG,
         want, "send on the GPU, recv on the host");

  /* pageable host memory as a device tensor: refused where the GPU cannot
   * reach it (no HMM or ATS), not handed to NCCL to fault on */
  if (gpu_reaches_pageable(dev)) {
    skip(4, "cuda:%d reaches pageable host memory (HMM or ATS)", dev);
  } else {
    hvd_tensor_t ph = dtensor(h, HVD_FLOAT32, 1, shape);
    snprintf(want, sizeof want,
             "allreduce 'pageable': send tensor is on cuda:%d but its data is "
             "pageable host memory, which this GPU cannot reach (cudaMalloc "
             "it, or pin it)",
             dev);
    expect(hvd_allreduce("pageable", &ph, &ph, HVD_SUM, 1, 1),
           HVD_ERR_INVALID_ARG, want,
           "pageable host memory as a device tensor");
    /* a recv apart from send is asked of the runtime too (only one within
     * send's bytes, in place, is not) */
    snprintf(want, sizeof want,
             "allreduce 'pageable recv': recv tensor is on cuda:%d but its "
             "data is pageable host memory, which this GPU cannot reach "
             "(cudaMalloc it, or pin it)",
             dev);
    expect(hvd_allreduce("pageable recv", &s, &ph, HVD_SUM, 1, 1),
           HVD_ERR_INVALID_ARG, want, "a device recv on pageable host memory");
  }

  if (size < 2) {
    skip(2, "host on one rank, device on another needs 2 ranks");
  } else {
    char vals[64][HVDT_VAL_LEN], keys[64][HVDT_VAL_LEN], seen[1024];
    int *devs = hvdt_calloc((size_t)size, sizeof *devs);
    MPI_Allgather(&dev, 1, MPI_INT, devs, 1, MPI_INT, MPI_COMM_WORLD);
    for (int q = 0; q < size && q < 64; q++) {
      snprintf(vals[q], HVDT_VAL_LEN, q == 0 ? "cpu" : "cuda:%d", devs[q]);
      snprintf(keys[q], HVDT_VAL_LEN, "%s", q == 0 ? "cpu" : "cuda");
    }
    hvd_tensor_t m = rank == 0 ? hvd_tensor_make(h, HVD_FLOAT32, 1, shape)
                               : dtensor(d, HVD_FLOAT32, 1, shape);
    hvd_result_t rc = hvd_allreduce("mix", &m, &m, HVD_SUM, 1, 1);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    hvdt_expect_mismatch(rc, seen, "allreduce 'mix'", "device", vals, keys,
                         "host on rank 0, device on the others");
    free(devs);
  }
  cudaFree(d);

  /* and a device allreduce still works */
  struct dj j;
  dj_set(&j, "after", HVD_FLOAT32, HVD_FLOAT32, HVD_SUM, 1, 33, scales[0], 0,
         1);
  dj_submit(&j, 1);
  dj_check(&j, size, "after the errors");
}

/* The last rank joins at once; the others reduce a burst (fused, and one
 * big tensor alone), then join. Its stubs (the identity) are on its GPU. */
static void test_join(void) {
  if (size < 2) {
    skip(1, "join needs 2 ranks");
    return;
  }
  static struct dj jobs[8];
  static const hvd_op_t ops[4] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_PRODUCT};
  int n = 0, active = rank < size - 1;
  for (int o = 0; o < 4; o++) {
    dj_set(&jobs[n], "join", HVD_FLOAT32, HVD_FLOAT32, ops[o], 1, 100,
           scales[0], o % 2, 11 * n + 1);
    n++;
    dj_set(&jobs[n], "join", HVD_INT32, HVD_INT32, ops[o], 1, 40000, scales[0],
           1, 11 * n + 1);
    n++;
  }
  int last = -2;
  if (!active) /* returns when the others have joined too */
    is_int(HVD_SUCCESS, hvd_join(&last), "%s join: every rank joins",
           pass_name);
  for (int i = 0; i < n; i++)
    dj_submit(&jobs[i], active);
  if (active)
    is_int(HVD_SUCCESS, hvd_join(&last), "%s join: every rank joins",
           pass_name);
  tap_note("hvd_join's last rank: %d", last);
  ok(last >= 0 && last < size, "%s join: a rank joined last", pass_name);
  for (int i = 0; i < n; i++) {
    if (!active) { /* nothing was submitted: only keep the checks aligned */
      struct hvdt_ar *a = &jobs[i].a;
      cudaFree(jobs[i].ds);
      if (jobs[i].dr != jobs[i].ds)
        cudaFree(jobs[i].dr);
      hvdt_ar_free(a);
      ok(1, "%s join: %s", pass_name, a->name);
      continue;
    }
    dj_check(&jobs[i], size - 1, "join");
  }
}

/* ---- passes -------------------------------------------------------------- */

/* One thread's side of the interleaved rounds: `n` allreduces of t named
 * "<prefix>.<i % 7>" in ps (NULL: the world), each waited for. */
struct ps_rounds {
  hvd_process_set_t *ps;
  hvd_tensor_t *t;
  const char *prefix;
  int n, good;
};

static void *ps_rounds_run(void *arg) {
  struct ps_rounds *p = arg;
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice"); /* per thread */
  for (int it = 0; it < p->n; it++) {
    char nm[32];
    hvd_request_t *r = NULL;
    snprintf(nm, sizeof nm, "%s.%d", p->prefix, it % 7);
    hvd_result_t rc =
        p->ps != NULL
            ? hvd_ps_allreduce_async(p->ps, nm, p->t, p->t, HVD_SUM, 1, 1, &r)
            : hvd_allreduce_async(nm, p->t, p->t, HVD_SUM, 1, 1, &r);
    if (rc == HVD_SUCCESS)
      rc = hvd_wait(r);
    if (rc != HVD_SUCCESS && p->good)
      fprintf(stderr, "# rank %d: %s: %s\n", rank, nm, hvd_last_error());
    p->good &= rc == HVD_SUCCESS;
  }
  return NULL;
}

/* A process set per parity (hvd_process_set_split(rank % 2): the even
 * ranks' and the odd ranks', each with its own engine, device executors
 * and communicator): an allreduce of a device tensor in each rank's set
 * beside the same name in the world. Exact sums. First rounds of the
 * sets' and the world's allreduces in flight together,
 * submitted from two threads (HVD_TEST_PS_ROUNDS, default 40): the
 * stand-in's HVD_STANDIN_NCCL_ORDER=1 (on in make check) ends the job
 * when ranks launch the two communicators' work in different orders, as
 * one engine thread per set did (issue 27). */
static void test_process_set(void) {
  hvd_process_set_t *ps = NULL;
  hvd_result_t rc = hvd_process_set_split(rank % 2, &ps);
  is_int(HVD_SUCCESS, rc, "%s: a process set per parity (split)", pass_name);
  if (rc != HVD_SUCCESS)
    return;
  float h[5], got[5], w[5];
  int64_t five = 5;
  for (int i = 0; i < 5; i++)
    h[i] = (float)(rank * 10 + i);
  float *d = NULL, *dw = NULL;
  cuda_ok(cudaMalloc((void **)&d, sizeof h), "cudaMalloc");
  cuda_ok(cudaMalloc((void **)&dw, sizeof h), "cudaMalloc");
  h2d(d, h, sizeof h);
  h2d(dw, h, sizeof h);
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &five);
  hvd_tensor_t tw = hvd_tensor_make(dw, HVD_FLOAT32, 1, &five);
  t.device = tw.device = dev;
  int good = 1;
  hvd_request_t *rs = NULL, *rw = NULL;
  const char *rounds = getenv("HVD_TEST_PS_ROUNDS");
  int nrounds = rounds != NULL ? atoi(rounds) : 40;
  struct ps_rounds side = {ps, &t, "ps.set", nrounds, 1};
  struct ps_rounds main_side = {NULL, &tw, "ps.world", nrounds, 1};
  pthread_t th;
  int started = pthread_create(&th, NULL, ps_rounds_run, &side) == 0;
  ps_rounds_run(&main_side);
  if (started)
    pthread_join(th, NULL);
  good &= started && side.good && main_side.good;
  h2d(d, h, sizeof h); /* the inputs again */
  h2d(dw, h, sizeof h);
  good &= hvd_ps_allreduce_async(ps, "ps.x", &t, &t, HVD_SUM, 1, 1, &rs) ==
          HVD_SUCCESS;
  good &=
      hvd_allreduce_async("ps.x", &tw, &tw, HVD_SUM, 1, 1, &rw) == HVD_SUCCESS;
  if (rs != NULL)
    good &= hvd_wait(rs) == HVD_SUCCESS;
  good &= rw != NULL && hvd_wait(rw) == HVD_SUCCESS;
  cuda_ok(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost), "D2H");
  cuda_ok(cudaMemcpy(w, dw, sizeof w, cudaMemcpyDeviceToHost), "D2H");
  for (int i = 0; i < 5; i++) {
    float set = 0, world = 0;
    for (int r = 0; r < size; r++) {
      world += (float)(r * 10 + i);
      if (r % 2 == rank % 2)
        set += (float)(r * 10 + i);
    }
    good &= got[i] == set && w[i] == world;
  }
  if (!good)
    diag("%s", hvd_last_error());
  ok(good, "%s: a device allreduce in each set beside the world's, exact",
     pass_name);
  cudaFree(d);
  cudaFree(dw);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "%s: destroy the set",
         pass_name);
}

/* Device ordering (hvd.h): the input is written by an asynchronous copy
 * that the host never waits for, on a non-blocking stream named with
 * hvd_cuda_set_stream, then on the legacy default stream (the default);
 * the sums must be exact. The stand-in ends the job when hvd's stream
 * reads the tensor before the copy is ordered before it. */
static void test_device_order(void) {
  enum { N = 4099 };
  float *pin = NULL, *d = NULL, want[N], *got = malloc(N * sizeof *got);
  int64_t n = N;
  cudaStream_t us;
  cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaMallocHost((void **)&pin, N * sizeof *pin), "cudaMallocHost");
  cuda_ok(cudaMalloc((void **)&d, N * sizeof *d), "cudaMalloc");
  for (int i = 0; i < N; i++) {
    pin[i] = (float)((rank + 1) * (i % 97));
    want[i] = (float)(size * (size + 1) / 2 * (i % 97));
  }
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &n);
  t.device = dev;
  for (int k = 0; k < 2; k++) {
    const char *how = k == 0 ? "a non-blocking stream set with "
                               "hvd_cuda_set_stream"
                             : "the legacy default stream";
    cudaStream_t s = k == 0 ? us : NULL;
    is_int(HVD_SUCCESS, hvd_cuda_set_stream(s), "%s: hvd_cuda_set_stream",
           pass_name);
    ok(hvd_cuda_stream() == (void *)s, "%s: hvd_cuda_stream gives it back",
       pass_name);
    cuda_ok(cudaMemcpyAsync(d, pin, N * sizeof *pin, cudaMemcpyHostToDevice, s),
            "the input, asynchronously");
    hvd_request_t *r = NULL;
    hvd_result_t rc = hvd_allreduce_async(k == 0 ? "order.set" : "order.legacy",
                                          &t, &t, HVD_SUM, 1, 1, &r);
    if (rc == HVD_SUCCESS)
      rc = hvd_wait(r);
    is_int(HVD_SUCCESS, rc, "%s: allreduce after a copy on %s", pass_name, how);
    cuda_ok(
        cudaMemcpyAsync(got, d, N * sizeof *got, cudaMemcpyDeviceToHost, us),
        "the result");
    cuda_ok(cudaStreamSynchronize(us), "cudaStreamSynchronize");
    ok(memcmp(got, want, sizeof want) == 0,
       "%s: exact sums after a copy on %s, the host never waiting for it",
       pass_name, how);
  }
  hvd_cuda_set_stream(NULL);
  cudaFree(d);
  cudaFreeHost(pin);
  cudaStreamDestroy(us);
  free(got);
}

/* ---- HVD_ADASUM on device tensors ---------------------------------------- */

#define AD_N 5
static const int64_t ad_len[AD_N] = {1, 17, 1000, 4099, 100003};

/* Rank q's value i of tensor k: not small integers (Adasum's coefficients
 * are quotients), the same on the host and device sides. */
static double ad_val(int q, int k, int64_t i) {
  return sin(0.37 * (double)(i + 1) * (k + 1) + 1.3 * q) + 0.05 * (q - k);
}

/* HVD_ADASUM of float32 and float64 tensors on the device against the
 * same on the host (lib/ops/adasum.c's tree: the device tensors are
 * staged through host memory whatever the executor, NCCL having no
 * Adasum): a burst of five sizes per dtype (fused groups), in place and
 * out of place, prescale 2 and postscale 0.5 on the float64 ones, with
 * device sums submitted between them (their own groups, through the
 * pass's executor); the device results are the host's bit for bit, the
 * sums exact. */
static void test_adasum(void) {
  enum { NT = 2 * AD_N };
  void *h[NT], *d[NT], *dout[NT], *back[NT];
  float *sum_d = NULL, sum_h[64], sum_got[64];
  hvd_tensor_t ht[NT], dt_in[NT], dt_out[NT];
  hvd_request_t *hr[NT], *dr[NT], *sr = NULL;
  int good = 1;
  for (int t = 0; t < NT; t++) {
    const hvd_dtype_t dt = t < AD_N ? HVD_FLOAT32 : HVD_FLOAT64;
    const int64_t n = ad_len[t % AD_N];
    const size_t es = dt == HVD_FLOAT32 ? 4 : 8, bytes = (size_t)n * es;
    h[t] = malloc(bytes);
    back[t] = malloc(bytes);
    for (int64_t i = 0; i < n; i++)
      hvdt_put(dt, h[t], i, ad_val(rank, t, i));
    cuda_ok(cudaMalloc(&d[t], bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&dout[t], bytes), "cudaMalloc");
    cuda_ok(cudaMemcpy(d[t], h[t], bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    ht[t] = hvd_tensor_make(h[t], dt, 1, &ad_len[t % AD_N]);
    dt_in[t] = hvd_tensor_make(d[t], dt, 1, &ad_len[t % AD_N]);
    dt_in[t].device = dev;
    dt_out[t] = dt_in[t];
    if (t % 2) /* out of place */
      dt_out[t].data = dout[t];
  }
  const int64_t sn = 64;
  cuda_ok(cudaMalloc((void **)&sum_d, sizeof sum_h), "cudaMalloc");
  for (int i = 0; i < 64; i++)
    sum_h[i] = (float)((rank + 1) * i);
  cuda_ok(cudaMemcpy(sum_d, sum_h, sizeof sum_h, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  hvd_tensor_t st = hvd_tensor_make(sum_d, HVD_FLOAT32, 1, &sn);
  st.device = dev;
  char name[64];
  for (int t = 0; t < NT; t++) {
    const double pre = t >= AD_N ? 2 : 1, post = t >= AD_N ? 0.5 : 1;
    snprintf(name, sizeof name, "%s.ad.h%d", pass_name, t);
    good &= hvd_allreduce_async(name, &ht[t], &ht[t], HVD_ADASUM, pre, post,
                                &hr[t]) == HVD_SUCCESS;
    snprintf(name, sizeof name, "%s.ad.d%d", pass_name, t);
    good &= hvd_allreduce_async(name, &dt_in[t], &dt_out[t], HVD_ADASUM, pre,
                                post, &dr[t]) == HVD_SUCCESS;
    if (t == AD_N) { /* a device sum between them */
      snprintf(name, sizeof name, "%s.ad.sum", pass_name);
      good &= hvd_allreduce_async(name, &st, &st, HVD_SUM, 1, 1, &sr) ==
              HVD_SUCCESS;
    }
  }
  tap_note("%s", hvd_last_error());
  for (int t = 0; t < NT; t++)
    good &= hvd_wait(hr[t]) == HVD_SUCCESS && hvd_wait(dr[t]) == HVD_SUCCESS;
  good &= sr != NULL && hvd_wait(sr) == HVD_SUCCESS;
  tap_note("%s", hvd_last_error());
  ok(good,
     "%s: adasum: float32 and float64 bursts on host and device, a "
     "device sum between them: every call succeeded",
     pass_name);
  int same = good, moved = 0;
  for (int t = 0; t < NT && good; t++) {
    const size_t bytes = (size_t)ad_len[t % AD_N] * hvd_dtype_size(ht[t].dtype);
    cuda_ok(cudaMemcpy(back[t], dt_out[t].data, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    same &= memcmp(back[t], h[t], bytes) == 0;
    moved |= size > 1 && ad_val(rank, t, 0) != hvdt_get(ht[t].dtype, h[t], 0);
  }
  ok(same && (size == 1 || moved),
     "%s: adasum: the device results are the host's, bit for bit (5 sizes "
     "to 100003, float32 and float64, in and out of place, scaled)",
     pass_name);
  cuda_ok(cudaMemcpy(sum_got, sum_d, sizeof sum_got, cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  int exact = 1;
  for (int i = 0; i < 64; i++)
    exact &= sum_got[i] == (float)(size * (size + 1) / 2 * i);
  ok(exact, "%s: adasum: the device sum between them is exact", pass_name);
  for (int t = 0; t < NT; t++) {
    free(h[t]);
    free(back[t]);
    cudaFree(d[t]);
    cudaFree(dout[t]);
  }
  cudaFree(sum_d);
}

/* hvd_cuda_stream_wait: a stream ordered after a result on the device,
 * the host waiting only for the launch (the stand-in ends the process if
 * the copy on `us` could read the sum before hvd's stream wrote it). A
 * host request has no device result. */
static void test_stream_wait(void) {
  enum { N = 2053 };
  float *pin = NULL, *d = NULL, *d2 = NULL, want[N], got[N];
  int64_t n = N;
  cudaStream_t us;
  cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaMallocHost((void **)&pin, N * sizeof *pin), "cudaMallocHost");
  cuda_ok(cudaMalloc((void **)&d, N * sizeof *d), "cudaMalloc");
  cuda_ok(cudaMalloc((void **)&d2, N * sizeof *d2), "cudaMalloc");
  for (int i = 0; i < N; i++) {
    pin[i] = (float)((rank + 2) * (i % 89));
    want[i] = (float)((size * (size + 3) / 2) * (i % 89));
  }
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &n);
  t.device = dev;
  hvd_cuda_set_stream(us);
  cuda_ok(cudaMemcpyAsync(d, pin, N * sizeof *pin, cudaMemcpyHostToDevice, us),
          "the input");
  hvd_request_t *r = NULL;
  hvd_result_t rc =
      hvd_allreduce_async("stream_wait", &t, &t, HVD_SUM, 1, 1, &r);
  is_int(HVD_SUCCESS, rc, "%s: stream_wait: submitted", pass_name);
  is_int(HVD_SUCCESS, hvd_cuda_stream_wait(r, NULL),
         "%s: hvd_cuda_stream_wait on this thread's stream", pass_name);
  cuda_ok(cudaMemcpyAsync(d2, d, N * sizeof *d, cudaMemcpyDeviceToDevice, us),
          "the sum, copied on the waiting stream");
  cuda_ok(cudaMemcpyAsync(got, d2, N * sizeof *got, cudaMemcpyDeviceToHost, us),
          "the copy, to the host");
  cuda_ok(cudaStreamSynchronize(us), "cudaStreamSynchronize");
  ok(memcmp(got, want, sizeof want) == 0,
     "%s: stream_wait: the waiting stream read the exact sums", pass_name);
  is_int(HVD_SUCCESS, hvd_wait(r), "%s: stream_wait: hvd_wait after it",
         pass_name);
  hvd_cuda_set_stream(NULL);
  float h = 1;
  int64_t one = 1;
  hvd_tensor_t ht = hvd_tensor_make(&h, HVD_FLOAT32, 1, &one);
  r = NULL;
  if (hvd_allreduce_async("stream_wait.host", &ht, &ht, HVD_SUM, 1, 1, &r) !=
      HVD_SUCCESS)
    bail("host allreduce: %s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, hvd_cuda_stream_wait(r, NULL),
         "%s: stream_wait on a host request: refused", pass_name);
  is_string("hvd_cuda_stream_wait: allreduce 'stream_wait.host' is on the "
            "host: it has no device result to wait for (hvd_wait it)",
            hvd_last_error(), "%s: stream_wait on a host request: message",
            pass_name);
  is_int(HVD_SUCCESS, hvd_wait(r), "%s: the host request still completes",
         pass_name);
  cudaFree(d2);
  cudaFree(d);
  cudaFreeHost(pin);
  cudaStreamDestroy(us);
}

static void run_pass(const char *ops) {
  pass_name = ops;
  setenv("HVD_GPU_OPERATIONS", ops, 1);
  cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", ops))
    bail("hvd_init: %s", hvd_last_error());
  if (hvd_cuda_device() >= 0)
    dev = hvd_cuda_device(); /* HVD_NO_BIND=0: hvd's choice */
  diag("%s: %d ranks, rank 0 on cuda:%d", ops, size, dev);
  /* first: the joined rank's first device collective holds only stubs
   * (its GPU resources are made for them, on its own device) */
  test_join();
  test_allreduce();
  test_gathers();
  test_fused_gathers();
  test_errors();
  test_join();
  test_device_order();
  test_stream_wait();
  test_adasum();
  test_process_set();
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", ops);
  unsetenv("HVD_GPU_OPERATIONS");
}

int main(int argc, char **argv) {
  int count = 0;
  /* a GPU each when there are enough, else all on the first */
  dev = gpu_mpi_begin(&argc, &argv, &rank, &size, &count);
  if (!hvd_nccl_built())
    skip(1, "nccl: this build has no NCCL");
  else if (!gpu_nccl_fits(size, count))
    skip(1,
         "nccl at np %d needs %d GPUs (NCCL refuses two ranks on one "
         "without HVD_GPU_SHARE=1); %d visible",
         size, size, count);
  else
    run_pass("nccl");
  run_pass("mpi");
  return tap_mpi_finish();
}

#endif /* HVD_HAVE_CUDA */
