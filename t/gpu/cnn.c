/*
 * cnn.c - examples/cnn's GPU backend (cnn_cuda.cu) against its CPU model,
 * at np 1 and 2 (TAP, every rank):
 *
 *   - cnn_create_on with a device that does not exist: NULL and "no CUDA
 *     device N (M visible)";
 *   - for synchronized and per-rank batch norm, the same seed on the CPU
 *     and on the rank's GPU, the same uneven batches (rank r: 2 + r
 *     images): initial weights identical; a training forward: loss to
 *     1e-5 relative, the average-pool features and the softmax to 1e-4,
 *     the same number right; the running statistics to 1e-5; a backward:
 *     the ready() calls in the CPU's order, each gradient within 1e-3 of
 *     the CPU's (relative to its largest value, or to 1% of the model's
 *     largest gradient when that is larger), each complete when declared
 *     ready (read then on a stream that does not wait for the model's);
 *     an evaluation's features and softmax to 1e-4;
 *   - three steps of hvd's distributed SGD (momentum, weight decay) on
 *     both models: every parameter within 1e-3 (the same relative rule),
 *     the buffers within 1e-4.
 *
 * One GPU serves every rank when there are fewer GPUs than ranks (with
 * the host-staged device executor: NCCL refuses two ranks on one GPU).
 * Without CUDA or a GPU: "1..0 # SKIP no CUDA device: ...".
 */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

#include "gputest.h"

#if !defined(HVD_HAVE_CUDA)

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  skip_all("%s", GPU_TEST_NO_CUDA);
}

#else /* HVD_HAVE_CUDA */

#include <cuda_runtime_api.h>

#include "cnn.h"
#include "cnn_impl.h" /* white box: gap and prob */

#define W 8
#define B 6
#define MAXF 16384 /* floats of the largest tensor: conv2 8 x 72 */

static int rank, size, dev;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL)
    bail("out of memory");
  return p;
}

/* tensor t (host or device) into h */
static void get(float *h, const hvd_tensor_t *t) {
  size_t bytes = sizeof(float) * (size_t)hvd_tensor_numel(t);
  if (t->device == HVD_CPU)
    memcpy(h, t->data, bytes);
  else
    cuda_ok(cudaMemcpy(h, t->data, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
}

static double max_abs(const float *a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    m = fmax(m, fabs((double)a[i]));
  return m;
}

/* max |a - b| / max(max |a|, floor); NaN: infinite */
static double rel(const float *a, const float *b, int64_t n, double floor) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d))
      return INFINITY;
    e = fmax(e, d);
  }
  double m = fmax(max_abs(a, n), floor);
  return m > 0 ? e / m : e;
}

/* The worst relative error over a list of tensors, CPU's first; floor: 1%
 * of the largest CPU value of them all. */
static double worst_of(hvd_param_t *c, hvd_param_t *g, int n, int grads,
                       int *at) {
  static float a[MAXF], b[MAXF];
  double top = 0, worst = 0;
  for (int i = 0; i < n; i++) {
    get(a, grads ? &c[i].grad : &c[i].value);
    top = fmax(top, max_abs(a, hvd_tensor_numel(&c[i].value)));
  }
  *at = 0;
  for (int i = 0; i < n; i++) {
    int64_t k = hvd_tensor_numel(&c[i].value);
    get(a, grads ? &c[i].grad : &c[i].value);
    get(b, grads ? &g[i].grad : &g[i].value);
    double e = rel(a, b, k, 1e-2 * top);
    if (e > worst)
      worst = e, *at = i;
  }
  return worst;
}

/* rank r's n images and labels, the same on both models */
static void batch(float *x, int32_t *y, int n, int salt) {
  for (int i = 0; i < n; i++) {
    y[i] = (i * 3 + rank + salt) % CNN_CLASSES;
    for (int j = 0; j < CNN_PIXELS; j++)
      x[(size_t)i * CNN_PIXELS + j] =
          (float)(sin(0.013 * j + 0.7 * i + rank + salt) +
                  0.3 * (y[i] - 4.5) / 4.5);
  }
}

/* ready(): the order, and a copy of each gradient as it is declared
 * ready, read on a stream that does not wait for the model's */
typedef struct ready_log {
  cnn_t *m;
  int order[NPARAMS], calls;
  float *snap[NPARAMS];
  cudaStream_t side;
} ready_log_t;

static void on_ready(void *ctx, int i) {
  ready_log_t *r = ctx;
  if (r->calls < NPARAMS)
    r->order[r->calls] = i;
  r->calls++;
  int np;
  hvd_param_t *p = cnn_params(r->m, &np);
  size_t bytes = sizeof(float) * (size_t)hvd_tensor_numel(&p[i].grad);
  if (p[i].grad.device == HVD_CPU) {
    memcpy(r->snap[i], p[i].grad.data, bytes);
    return;
  }
  cuda_ok(cudaMemcpyAsync(r->snap[i], p[i].grad.data, bytes,
                          cudaMemcpyDeviceToHost, r->side),
          "cudaMemcpyAsync (snapshot)");
  cuda_ok(cudaStreamSynchronize(r->side), "cudaStreamSynchronize (snapshot)");
}

static void log_init(ready_log_t *r, cnn_t *m) {
  memset(r, 0, sizeof *r);
  r->m = m;
  for (int i = 0; i < NPARAMS; i++)
    r->snap[i] = xmalloc(sizeof(float) * MAXF);
  cuda_ok(cudaStreamCreateWithFlags(&r->side, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
}

static void log_free(ready_log_t *r) {
  for (int i = 0; i < NPARAMS; i++)
    free(r->snap[i]);
  cudaStreamDestroy(r->side);
}

/* gap and prob of the two models' last pass over n images agree */
static int heads_agree(cnn_t *c, cnn_t *g, int n, double tol) {
  return rel(c->gap, g->gap, (int64_t)n * W, 1e-6) <= tol &&
         rel(c->prob, g->prob, (int64_t)n * CNN_CLASSES, 1e-6) <= tol;
}

static void compare(int sync) {
  const char *bn = sync ? "sync BN" : "local BN";
  char msg[300] = "";
  cnn_t *c = cnn_create(W, B, 7);
  cnn_t *g = cnn_create_on(W, B, 7, dev, msg, sizeof msg);
  if (!ok(c != NULL && g != NULL, "%s: the CPU model and one on cuda:%d", bn,
          dev))
    bail("cnn_create_on: %s", msg);
  cnn_set_sync_bn(c, sync);
  cnn_set_sync_bn(g, sync);
  int np, nb;
  hvd_param_t *pc = cnn_params(c, &np), *pg = cnn_params(g, &np);
  hvd_param_t *bc = cnn_buffers(c, &nb), *bg = cnn_buffers(g, &nb);
  int on = 1, at = 0;
  for (int i = 0; i < np; i++)
    on &= pg[i].value.device == dev && pg[i].grad.device == dev;
  for (int i = 0; i < nb; i++)
    on &= bg[i].value.device == dev;
  ok(on, "%s: parameters and buffers are device tensors on cuda:%d", bn, dev);
  ok(worst_of(pc, pg, np, 0, &at) == 0, "%s: the same initial weights", bn);

  int n = 2 + rank;
  float *x = xmalloc(sizeof(float) * B * CNN_PIXELS);
  int32_t y[B];
  batch(x, y, n, 0);
  double lc = 0, lg = 0;
  int rc_ = 0, rg = 0;
  is_int(HVD_SUCCESS, cnn_forward(c, x, n, y, &lc, &rc_), "%s: CPU forward",
         bn);
  hvd_result_t rc = cnn_forward(g, x, n, y, &lg, &rg);
  if (!is_int(HVD_SUCCESS, rc, "%s: GPU forward", bn))
    diag("%s / %s", cnn_last_error(g), hvd_last_error());
  is_double(lc, lg, 1e-5 * fabs(lc), "%s: loss %.7f on the GPU, %.7f on the CPU",
            bn, lg, lc);
  ok(heads_agree(c, g, n, 1e-4) && rc_ == rg,
     "%s: features and softmax within 1e-4, %d right on both", bn, rg);
  ok(worst_of(bc, bg, nb, 0, &at) <= 1e-5,
     "%s: running statistics within 1e-5 (worst %s)", bn, bg[at].name);

  ready_log_t rlc, rlg;
  log_init(&rlc, c);
  log_init(&rlg, g);
  is_int(HVD_SUCCESS, cnn_backward(c, on_ready, &rlc), "%s: CPU backward", bn);
  rc = cnn_backward(g, on_ready, &rlg);
  if (!is_int(HVD_SUCCESS, rc, "%s: GPU backward", bn))
    diag("%s / %s", cnn_last_error(g), hvd_last_error());
  ok(rlc.calls == NPARAMS && rlg.calls == NPARAMS &&
         memcmp(rlc.order, rlg.order, sizeof rlc.order) == 0,
     "%s: %d ready() calls, in the CPU's order", bn, rlg.calls);
  double e = worst_of(pc, pg, np, 1, &at);
  ok(e <= 1e-3, "%s: every gradient within 1e-3 (worst %.2e, %s)", bn, e,
     pg[at].name);
  static float fin[MAXF];
  int complete = 1;
  for (int i = 0; i < np; i++) {
    get(fin, &pg[i].grad);
    complete &= memcmp(fin, rlg.snap[i],
                       sizeof(float) * (size_t)hvd_tensor_numel(&pg[i].grad)) ==
                0;
  }
  ok(complete, "%s: each gradient was complete when declared ready", bn);
  log_free(&rlc);
  log_free(&rlg);

  int ec = 0, eg = 0;
  batch(x, y, n, 5);
  is_int(HVD_SUCCESS, cnn_eval(c, x, n, y, &ec), "%s: CPU eval", bn);
  is_int(HVD_SUCCESS, cnn_eval(g, x, n, y, &eg), "%s: GPU eval", bn);
  ok(heads_agree(c, g, n, 1e-4),
     "%s: eval features and softmax within 1e-4 (%d and %d right)", bn, ec,
     eg);

  /* three steps of the distributed optimizer on each */
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.05;
  so.momentum = 0.9;
  so.weight_decay = 5e-4;
  hvd_optimizer_t *sc = NULL, *sg = NULL, *oc = NULL, *og = NULL;
  int good = hvd_sgd_create(pc, np, &so, &sc) == HVD_SUCCESS &&
             hvd_sgd_create(pg, np, &so, &sg) == HVD_SUCCESS &&
             hvd_distributed_optimizer(sc, NULL, &oc) == HVD_SUCCESS &&
             hvd_distributed_optimizer(sg, NULL, &og) == HVD_SUCCESS;
  if (!good)
    diag("%s", hvd_last_error());
  for (int s = 0; good && s < 3; s++) {
    double l;
    int k;
    batch(x, y, n, 10 + s);
    good &= hvd_optimizer_zero_grad(oc) == HVD_SUCCESS &&
            hvd_optimizer_zero_grad(og) == HVD_SUCCESS;
    good &= cnn_forward(c, x, n, y, &l, &k) == HVD_SUCCESS &&
            cnn_forward(g, x, n, y, &l, &k) == HVD_SUCCESS;
    /* gradients handed over at the end, as a plain step */
    good &= cnn_backward(c, NULL, NULL) == HVD_SUCCESS &&
            cnn_backward(g, NULL, NULL) == HVD_SUCCESS;
    good &= hvd_optimizer_step(oc) == HVD_SUCCESS &&
            hvd_optimizer_step(og) == HVD_SUCCESS;
    if (!good)
      diag("step %d: %s / %s", s, cnn_last_error(g), hvd_last_error());
  }
  ok(good, "%s: three distributed SGD steps on both", bn);
  e = worst_of(pc, pg, np, 0, &at);
  ok(e <= 1e-3, "%s: after them every parameter within 1e-3 (worst %.2e, %s)",
     bn, e, pg[at].name);
  e = worst_of(bc, bg, nb, 0, &at);
  ok(e <= 1e-4, "%s: and the buffers within 1e-4 (worst %.2e, %s)", bn, e,
     bg[at].name);
  hvd_optimizer_destroy(oc);
  hvd_optimizer_destroy(og);
  free(x);
  cnn_destroy(c);
  cnn_destroy(g);
}

int main(int argc, char **argv) {
  int count = 0;
  /* a GPU each when there are enough, else all on the first */
  dev = gpu_mpi_begin(&argc, &argv, &rank, &size, &count);
  /* NCCL where it can join the ranks (t/gpu/share.sh looks for "nccl:
   * hvd_init"), else device tensors through host-staged MPI */
  const char *ops = hvd_nccl_built() && gpu_nccl_fits(size, count) ? "nccl" : "mpi";
  setenv("HVD_GPU_OPERATIONS", ops, 1);
  hvd_result_t rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", ops))
    bail("hvd_init: %s", hvd_last_error());
  if (hvd_cuda_device() >= 0)
    dev = hvd_cuda_device();

  char msg[300], want[300];
  cnn_t *none = cnn_create_on(W, B, 7, count, msg, sizeof msg);
  snprintf(want, sizeof want, "no CUDA device %d (%d visible)", count, count);
  ok(none == NULL, "cnn_create_on(cuda:%d): NULL", count);
  is_string(want, msg, "cnn_create_on(cuda:%d): the reason", count);

  compare(1);
  compare(0);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}

#endif /* HVD_HAVE_CUDA */
