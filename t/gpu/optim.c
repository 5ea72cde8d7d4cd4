/*
 * optim.c - the optimizer stack on device parameters (lib/optim), against
 * the same stack on host parameters:
 *
 *  - parity (every rank, no collectives): SGD with every valid combination
 *    of momentum, dampening, weight decay and nesterov, Adam, Adam with L2
 *    weight decay and AdamW, four steps with a learning-rate change, on
 *    all-device and on mixed host/device parameter lists: values and
 *    state identical bit for bit to the host optimizer's (within 1e-6
 *    relative where the host compiler contracts into fused multiply-adds,
 *    as t/gpu/kernels); state tensors on the parameter's device;
 *  - a custom optimizer's state tensors are zeroed device memory on the
 *    parameter's device (host memory for host parameters);
 *  - zero_grad on device and host gradients;
 *  - per-parameter weight decay (p1 0, p3 0.3, the others the options')
 *    and learning rate (p0 and p4 2, p3 0.5 times the optimizer's): SGD,
 *    AdamW, Adam+L2 and LAMB on all-device and mixed lists, device equal
 *    to host bit for bit, state too (a batched launch per group of decay
 *    and rate);
 *  - LAMB (default options with lr 0.01; with per-parameter decay, p1
 *    without: no trust ratio; always_adapt without bias correction;
 *    clipped): device equal to host bit for bit, its two passes (the
 *    norms by chunks, then the update) against the host's loops; after
 *    hvd_init sharded on a mixed list ("zero LAMB, mixed": its blocks'
 *    norms summed over the ranks), equal to the host's;
 *  - gradient clipping before a custom optimizer's step, which reads the
 *    device gradients on the legacy stream: scaled before it runs;
 *  - gradient clipping (L2 on all-device and mixed lists, infinity): the
 *    norm of every step the host's bit for bit (the batched norm kernel
 *    against the host's chunk loops), the values too; after hvd_init the
 *    sharded "zero SGD, mixed" run clips too (its blocks' norms agreed
 *    over the ranks), equal to the host's;
 *  - mixed precision: float16 and bfloat16 parameters with loss scaling,
 *    device against host bit for bit, a step with an inf skipped on both
 *    (after hvd_init also distributed and sharded, the values set by
 *    hvd_broadcast_parameters);
 *  - refusals: a parameter on another GPU ("hvd_sgd_create: param 'p0'
 *    value is on cuda:1 but this rank uses cuda:0"), a grad on the host
 *    with its value on the GPU, a device grad on pageable host memory
 *    (where the GPU cannot reach it);
 * then, once per device executor (HVD_GPU_OPERATIONS=nccl at np 1 and at
 * np N with N GPUs; mpi, host-staged, at every np), after hvd_init:
 *  - the distributed optimizer on device (and mixed) parameters against
 *    the host distributed optimizer: average; backward_passes_per_step 2
 *    started by grad_ready with a predivide factor; float16 compression;
 *    sum with a no-sync step (local division by the passes); op
 *    HVD_ADASUM on a mixed list (device gradients staged through host
 *    memory into the host's Adasum); post-local SGD, period 2 from step 1
 *    without a group, on a mixed list (the device values averaged after
 *    the update, on the optimizer's stream). Gradients are
 *    small dyadic numbers, so every summation order gives the same sums;
 *  - PowerSGD (psgd_run) on device against host, with a checkpoint of
 *    its state after step 2 (the device file the host's but for the
 *    names), loaded back after step 3 so that step 3 repeats; on a
 *    float32 wire, then on a float16 one (powersgd.wire);
 *  - hvd_broadcast_parameters from the last rank on device parameters,
 *    hvd_verify_parameters finding a difference on rank 1 (np >= 2),
 *    hvd_broadcast_optimizer_state with device state and rank 0's lr and
 *    per-parameter lr scale and weight decay;
 *  - checkpoints (mpi pass): a file saved from device parameters and
 *    state (in the background: hvd_checkpoint_save_async, its copy
 *    taken through the host) is byte for byte the file saved from the
 *    same host ones; it
 *    loads into host parameters and the host file into device ones,
 *    identical bit for bit.
 *
 * Runs with HVD_NO_BIND=1 (t/mpirun-test): each rank makes its device
 * current first. Skips ("no CUDA device: ...") in a build without CUDA
 * and when cudaGetDeviceCount finds no device or fails. Registered at
 * np 1, 2 and 4 (t/gpu/local.mk); doc/gpu-testing.md.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hvd.h"
#include "tap/tap.h"

#include "gputest.h"
#include "hvdtest.h"

#ifndef HVD_HAVE_CUDA

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  skip_all("%s", GPU_TEST_NO_CUDA);
}

#else /* HVD_HAVE_CUDA */

#include <cuda_runtime_api.h>
#include <mpi.h>

#include "base/half.h"
#include "optim/optimizer.h" /* the state tensors */
#ifdef HVD_T_STANDIN
#include "standin.h" /* standin_malloc_calls */
#endif

static int rank, size, dev;
static const char *pass_name = "local";

/* ---- device memory ------------------------------------------------------ */

static void *xcalloc(size_t n, size_t s) {
  void *p = calloc(n ? n : 1, s);
  if (p == NULL)
    bail("out of memory");
  return p;
}

/* ---- models -------------------------------------------------------------- */

#define NP 5
static const int64_t counts[NP] = {1, 17, 0, 1000, 65537};
#define MAXC 65537

/* NP float32 parameters "<prefix>.p<i>" of shape [counts[i]], parameter i
 * on the GPU when bit i of mask is set. */
typedef struct model {
  hvd_param_t p[NP];
  char names[NP][32];
} model_t;

/* param p: a float32 value and gradient of ndim dims shape, zeroed, on
 * device d (HVD_CPU: the host), named name. */
static void param_make(hvd_param_t *p, const char *name, int d, int ndim,
                       const int64_t *shape) {
  int64_t n = 1;
  for (int k = 0; k < ndim; k++)
    n *= shape[k];
  size_t bytes = (size_t)n * sizeof(float);
  void *v, *g;
  if (d == HVD_CPU) {
    v = xcalloc(bytes, 1);
    g = xcalloc(bytes, 1);
  } else {
    cuda_ok(cudaMalloc(&v, bytes ? bytes : 1), "cudaMalloc");
    cuda_ok(cudaMalloc(&g, bytes ? bytes : 1), "cudaMalloc");
    cuda_ok(cudaMemset(v, 0, bytes ? bytes : 1), "cudaMemset");
    cuda_ok(cudaMemset(g, 0, bytes ? bytes : 1), "cudaMemset");
  }
  p->name = name;
  p->value = hvd_tensor_make(v, HVD_FLOAT32, ndim, shape);
  p->grad = hvd_tensor_make(g, HVD_FLOAT32, ndim, shape);
  p->value.device = p->grad.device = d;
}

static void model_make(model_t *m, const char *prefix, unsigned mask) {
  for (int i = 0; i < NP; i++) {
    snprintf(m->names[i], sizeof m->names[i], "%s.p%d", prefix, i);
    param_make(&m->p[i], m->names[i], (mask >> i) & 1 ? dev : HVD_CPU, 1,
               &counts[i]);
  }
}

/* Frees param_make's value and gradient. */
static void param_free(hvd_param_t *p) {
  if (p->value.device == HVD_CPU) {
    free(p->value.data);
    free(p->grad.data);
  } else {
    cudaFree(p->value.data);
    cudaFree(p->grad.data);
  }
}

static void model_free(model_t *m) {
  for (int i = 0; i < NP; i++)
    param_free(&m->p[i]);
}

/* Copies between host memory and any tensor. */
/* Complete when it returns: cudaMemcpy from pageable memory may return
 * before its DMA has landed, and hvd's streams wait for no other (the
 * contract: values and gradients complete when an optimizer or collective
 * call starts). Without the synchronisation the distributed no-sync case
 * read half-written gradients on an H100. */
static void h2d(void *d, const void *h, size_t bytes) {
  if (bytes > 0) {
    cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

static void tput(hvd_tensor_t *t, const float *h) {
  size_t bytes = (size_t)hvd_tensor_numel(t) * sizeof(float);
  if (t->device == HVD_CPU)
    memcpy(t->data, h, bytes);
  else
    h2d(t->data, h, bytes);
}

static void tget(float *h, const hvd_tensor_t *t) {
  size_t bytes = (size_t)hvd_tensor_numel(t) * sizeof(float);
  if (t->device == HVD_CPU)
    memcpy(h, t->data, bytes);
  else if (bytes > 0)
    cuda_ok(cudaMemcpy(h, t->data, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* [-1, 1) */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-52 - 1.0;
}

/* Random values for parameter i (which 0: value, 1: grad), into h. */
static void draw(float *h, int i, int which) {
  for (int64_t j = 0; j < counts[i]; j++)
    h[j] = (float)(uniform() * (which ? 0.5 : 2.0));
}

/* The same random values into parameter i of both models. */
static void set_both(model_t *a, model_t *b, int i, int which) {
  static float h[MAXC];
  draw(h, i, which);
  tput(which ? &a->p[i].grad : &a->p[i].value, h);
  tput(which ? &b->p[i].grad : &b->p[i].value, h);
}

/* 1 if tensors x and y (host or device) hold the same floats: the same
 * bits, or within 1e-6 relative when the host contracts into FMAs. */
static int same_tensor(const hvd_tensor_t *x, const hvd_tensor_t *y, char *why,
                       size_t len) {
  static float a[MAXC], b[MAXC];
  int64_t n = hvd_tensor_numel(x);
  if (n != hvd_tensor_numel(y)) {
    snprintf(why, len, "%lld vs %lld elements", (long long)n,
             (long long)hvd_tensor_numel(y));
    return 0;
  }
  tget(a, x);
  tget(b, y);
  for (int64_t j = 0; j < n; j++) {
    int same = memcmp(&a[j], &b[j], sizeof a[j]) == 0;
#ifdef __FP_FAST_FMAF
    same = same || fabs((double)a[j] - b[j]) <= 1e-6 * fabs((double)a[j]);
#endif
    if (!same) {
      snprintf(why, len, "element %lld: %.9g vs %.9g", (long long)j, a[j],
               b[j]);
      return 0;
    }
  }
  return 1;
}

/* Every value (and, with both optimizers, every state tensor) of model d
 * equals model h's; state tensors live on their parameter's device. */
static void check_same(const char *what, model_t *h, model_t *d,
                       hvd_optimizer_t *oh, hvd_optimizer_t *od) {
  char why[256] = "";
  int good = 1;
  for (int i = 0; i < NP && good; i++)
    if (!same_tensor(&h->p[i].value, &d->p[i].value, why, sizeof why)) {
      good = 0;
      tap_note("%s: '%s' value %s", what, d->p[i].name, why);
    }
  if (oh != NULL && od != NULL) {
    /* the plain optimizers that hold the state */
    const hvd_optimizer_t *ch = oh->base ? oh->base : oh;
    const hvd_optimizer_t *cd = od->base ? od->base : od;
    int ns = cd->ops.nstate;
    for (int s = 0; s < NP * ns && good; s++) {
      if (cd->state[s].device != d->p[s / ns].value.device) {
        good = 0;
        tap_note("%s: state %d is on device %d, its parameter on %d", what, s,
                 cd->state[s].device, d->p[s / ns].value.device);
      } else if (!same_tensor(&ch->state[s], &cd->state[s], why, sizeof why)) {
        good = 0;
        tap_note("%s: state %d (%s) %s", what, s, cd->ops.state_names[s % ns],
                 why);
      }
    }
  }
  ok(good, "%s: %s: device equals host", pass_name, what);
}

/* ---- parity of the plain optimizers ---------------------------------------
 */

/* kind 0: SGD (o an hvd_sgd_options_t), 1: Adam, 2: LAMB. */
static hvd_result_t make_opt(int kind, const void *o, hvd_param_t *p,
                             hvd_optimizer_t **out) {
  return kind == 2   ? hvd_lamb_create(p, NP, o, out)
         : kind == 1 ? hvd_adam_create(p, NP, o, out)
                     : hvd_sgd_create(p, NP, o, out);
}

/* Gradient clipping in parity(): 0 (off), 2 or INFINITY; max_norm 0.5 or
 * 0.25 (below the random gradients' norms: every step clips). */
static double parity_clip;
/* Per-parameter settings in parity(): decay p1 0 and p3 0.3, learning
 * rate p0 and p4 2 times the optimizer's and p3 0.5 times (four groups of
 * decay and rate: {p0, p4}, {p1}, {p2}, {p3}; a batched launch each on
 * the device). */
static int parity_groups;

static void parity(const char *what, int kind, const void *o, unsigned mask) {
  model_t h, d;
  hvd_optimizer_t *oh = NULL, *od = NULL;
  char label[160];
  int good = 1;
  model_make(&h, "p", 0);
  model_make(&d, "p", mask);
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 0);
  good &=
      is_int(HVD_SUCCESS, make_opt(kind, o, h.p, &oh), "%s: host create", what);
  tap_note("%s", hvd_last_error());
  good &= is_int(HVD_SUCCESS, make_opt(kind, o, d.p, &od),
                 "%s: device create (mask %#x)", what, mask);
  for (int k = 1; good && parity_groups && k <= 3; k += 2) {
    good &= hvd_optimizer_set_param_weight_decay(oh, k, k == 1 ? 0 : 0.3) ==
            HVD_SUCCESS;
    good &= hvd_optimizer_set_param_weight_decay(od, k, k == 1 ? 0 : 0.3) ==
            HVD_SUCCESS;
  }
  for (int k = 0; good && parity_groups && k <= 4; k++) {
    const double scale = k == 0 || k == 4 ? 2 : k == 3 ? 0.5 : NAN;
    good &= hvd_optimizer_set_param_lr_scale(oh, k, scale) == HVD_SUCCESS;
    good &= hvd_optimizer_set_param_lr_scale(od, k, scale) == HVD_SUCCESS;
  }
  const double max_norm = parity_clip == 2 ? 0.5 : 0.25;
  if (good && parity_clip != 0) {
    good &= hvd_optimizer_set_grad_clipping(oh, max_norm, parity_clip) ==
            HVD_SUCCESS;
    good &= hvd_optimizer_set_grad_clipping(od, max_norm, parity_clip) ==
            HVD_SUCCESS;
  }
  int norms = 1;
  for (int step = 1; good && step <= 4; step++) {
    if (step > 1) {
      good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS;
      good &= hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
    }
    if (step == 3) {
      hvd_optimizer_set_lr(oh, hvd_optimizer_lr(oh) * 0.5);
      hvd_optimizer_set_lr(od, hvd_optimizer_lr(od) * 0.5);
    }
    for (int i = 0; i < NP; i++)
      set_both(&h, &d, i, 1);
    good &= hvd_optimizer_step(oh) == HVD_SUCCESS;
    tap_note("%s", hvd_last_error());
    good &= hvd_optimizer_step(od) == HVD_SUCCESS;
    if (parity_clip != 0) { /* the same bits, and each step clipped */
      double nh = hvd_optimizer_grad_norm(oh), nd = hvd_optimizer_grad_norm(od);
      norms &= memcmp(&nh, &nd, sizeof nh) == 0 && nh > max_norm;
      if (!norms)
        tap_note("%s: step %d: norm %.17g on the host, %.17g on the device",
                 what, step, nh, nd);
    }
  }
  ok(good, "%s: four steps", what);
  if (parity_clip != 0)
    ok(norms,
       "%s (mask %#x): every step's clipping norm the host's bit for bit", what,
       mask);
  snprintf(label, sizeof label, "%s (mask %#x)", what, mask);
  check_same(label, &h, &d, oh, od);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  model_free(&h);
  model_free(&d);
}

/* Plain Adam, two steps; the second's device gradients are written on
 * the legacy stream and not waited for (the step's update waits for them
 * on the device: hvd.h, "Device ordering"; the first step's allocations
 * would order them anyway): equal to the host's. */
/* Every byte of m's device values (grads 0) or gradients (1) set to
 * byte by a cudaMemsetAsync enqueued on s, not waited for. */
static void fill_on(model_t *m, int grads, int byte, cudaStream_t s) {
  for (int i = 0; i < NP; i++) {
    const hvd_tensor_t *t = grads ? &m->p[i].grad : &m->p[i].value;
    if (t->device != HVD_CPU)
      cuda_ok(cudaMemsetAsync(t->data, byte,
                              (size_t)hvd_tensor_numel(t) * sizeof(float), s),
              "cudaMemsetAsync");
  }
}

/* hvd_optimizer_zero_grad follows "Device ordering" too: gradients that
 * a cudaStreamNonBlocking stream set by hvd_cuda_set_stream is still to
 * write (a cudaMemsetAsync of 0x41 bytes enqueued there) are written
 * before the zeroing, so they read 0 after it. */
static void zero_grad_on_stream(model_t *dm, hvd_optimizer_t *od) {
  static float h[MAXC];
  cudaStream_t us;
  int good = 1;
  cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
  hvd_cuda_set_stream(us);
  fill_on(dm, 1, 0x41, us);
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(od),
         "zero_grad right after gradients enqueued on the caller's stream");
  hvd_cuda_set_stream(NULL);
  cuda_ok(cudaStreamSynchronize(us), "sync");
  for (int i = 0; i < NP; i++) {
    cuda_ok(cudaMemcpy(h, dm->p[i].grad.data, (size_t)counts[i] * sizeof(float),
                       cudaMemcpyDeviceToHost),
            "D2H");
    for (int64_t j = 0; j < counts[i]; j++)
      good &= h[j] == 0.0f;
  }
  ok(good, "... every gradient is 0: the zeroing came after them");
  cuda_ok(cudaStreamDestroy(us), "cudaStreamDestroy");
}

static void test_step_order(void) {
  static float h[MAXC];
  model_t hm, dm;
  hvd_optimizer_t *oh = NULL, *od = NULL;
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  model_make(&hm, "order.h", 0);
  model_make(&dm, "order.d", 0x1f);
  rng = 777;
  int good = make_opt(1, &ao, hm.p, &oh) == HVD_SUCCESS &&
             make_opt(1, &ao, dm.p, &od) == HVD_SUCCESS;
  for (int step = 0; good && step < 2; step++) {
    if (step > 0)
      good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS &&
              hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
    for (int i = 0; i < NP; i++) {
      if (step == 0)
        set_both(&hm, &dm, i, 0);
      draw(h, i, 1);
      tput(&hm.p[i].grad, h);
      if (step == 0)
        tput(&dm.p[i].grad, h);
      else if (counts[i] > 0)
        cuda_ok(cudaMemcpyAsync(dm.p[i].grad.data, h,
                                (size_t)counts[i] * sizeof(float),
                                cudaMemcpyHostToDevice, 0),
                "cudaMemcpyAsync H2D");
    }
    good &= hvd_optimizer_step(oh) == HVD_SUCCESS &&
            hvd_optimizer_step(od) == HVD_SUCCESS;
  }
  tap_note("%s", hvd_last_error());
  ok(good, "unsynchronised gradients: both Adam steps ran");
  check_same("Adam on unsynchronised gradients", &hm, &dm, oh, od);
  zero_grad_on_stream(&dm, od);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  model_free(&hm);
  model_free(&dm);
}

static void test_parity(void) {
  static const double mom[] = {0, 0.9}, damp[] = {0, 0.25}, wd[] = {0, 0.01};
  char what[160];
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      for (int c = 0; c < 2; c++)
        for (int nest = 0; nest < 2; nest++) {
          hvd_sgd_options_t o;
          hvd_sgd_options_init(&o);
          o.lr = 0.1;
          o.momentum = mom[a];
          o.dampening = damp[b];
          o.weight_decay = wd[c];
          o.nesterov = nest;
          if (nest && (o.momentum == 0 || o.dampening != 0))
            continue; /* refused by hvd_sgd_create */
          snprintf(what, sizeof what,
                   "SGD momentum %g dampening %g weight_decay %g%s", o.momentum,
                   o.dampening, o.weight_decay, nest ? " nesterov" : "");
          parity(what, 0, &o, 0x1f);
          if (a == 1 && c == 1)
            parity(what, 0, &o, 0x0a); /* mixed: p1 and p3 on the GPU */
        }
  for (int k = 0; k < 3; k++) {
    hvd_adam_options_t o;
    hvd_adam_options_init(&o);
    o.lr = 0.01;
    o.weight_decay = k == 0 ? 0 : 0.01;
    o.decoupled = k == 2;
    const char *name = k == 0 ? "Adam" : k == 1 ? "Adam+L2" : "AdamW";
    parity(name, 1, &o, 0x1f);
    parity(name, 1, &o, 0x15); /* mixed: p0, p2, p4 on the GPU */
  }
  /* gradient clipping: the norms' chunks on the device (65537 elements:
   * 5 chunks, the last of one element) against the host's loops */
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.1;
  so.momentum = 0.9;
  parity_clip = 2;
  parity("SGD momentum 0.9, clipped (L2)", 0, &so, 0x1f);
  parity("SGD momentum 0.9, clipped (L2)", 0, &so, 0x0a);
  parity_clip = INFINITY;
  parity("SGD momentum 0.9, clipped (infinity)", 0, &so, 0x1f);
  parity_clip = 0;
  /* per-parameter weight decay: a launch per decay group */
  parity_groups = 1;
  so.weight_decay = 0.01;
  parity("SGD momentum 0.9 weight_decay 0.01, groups", 0, &so, 0x1f);
  parity("SGD momentum 0.9 weight_decay 0.01, groups", 0, &so, 0x0a);
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  ao.lr = 0.01;
  ao.weight_decay = 0.01;
  ao.decoupled = 1;
  parity("AdamW weight_decay 0.01, groups", 1, &ao, 0x1f);
  ao.decoupled = 0;
  parity("Adam+L2 weight_decay 0.01, groups", 1, &ao, 0x15);
  parity_groups = 0;
  /* LAMB: the first pass's norms (65537 elements: 5 chunks) and the
   * second's update on the device against the host's loops; p1 without
   * decay takes lr alone unless always_adapt */
  hvd_lamb_options_t lo;
  hvd_lamb_options_init(&lo);
  lo.lr = 0.01;
  parity("LAMB", 2, &lo, 0x1f);
  parity("LAMB", 2, &lo, 0x15);
  parity_groups = 1;
  parity("LAMB, groups", 2, &lo, 0x1f);
  lo.always_adapt = 1;
  lo.bias_correction = 0;
  parity("LAMB always_adapt, no bias correction, groups", 2, &lo, 0x0a);
  parity_groups = 0;
  parity_clip = 2;
  parity("LAMB always_adapt, no bias correction, clipped (L2)", 2, &lo, 0x1f);
  parity_clip = 0;
}

/* ---- custom optimizers, zero_grad, refusals ------------------------------ */

static const char *const cstate[] = {"a", "b"};

/* value -= lr * grad; a += grad; b counts steps. Checks where its state
 * is and that it starts zeroed. */
static hvd_result_t custom_step(void *ctx, hvd_param_t *params, int n,
                                hvd_tensor_t *state, int64_t step, double lr) {
  int *bad = ctx;
  static float v[MAXC], g[MAXC], a[MAXC], b[MAXC];
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 2; k++) {
      hvd_tensor_t *s = &state[2 * i + k];
      struct cudaPointerAttributes at;
      int on_dev = s->device != HVD_CPU;
      *bad |= s->device != params[i].value.device;
      if (on_dev && (cudaPointerGetAttributes(&at, s->data) != cudaSuccess ||
                     at.type != cudaMemoryTypeDevice || at.device != dev))
        *bad |= 2;
    }
    int64_t m = hvd_tensor_numel(&params[i].value);
    tget(v, &params[i].value);
    tget(g, &params[i].grad);
    tget(a, &state[2 * i]);
    tget(b, &state[2 * i + 1]);
    for (int64_t j = 0; j < m; j++) {
      if (step == 1 && (a[j] != 0 || b[j] != 0))
        *bad |= 4;
      v[j] -= (float)lr * g[j];
      a[j] += g[j];
      b[j] += 1;
    }
    tput(&params[i].value, v);
    tput(&state[2 * i], a);
    tput(&state[2 * i + 1], b);
  }
  return HVD_SUCCESS;
}

static void test_custom(void) {
  static const hvd_optimizer_ops_t ops = {"custom", 2, cstate, custom_step,
                                          NULL};
  model_t h, d;
  hvd_optimizer_t *oh = NULL, *od = NULL;
  int bad = 0, good = 1;
  model_make(&h, "c", 0);
  model_make(&d, "c", 0x1b); /* p2 on the host */
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 0);
  good &= hvd_optimizer_custom(h.p, NP, &ops, &bad, &oh) == HVD_SUCCESS;
  good &= hvd_optimizer_custom(d.p, NP, &ops, &bad, &od) == HVD_SUCCESS;
  hvd_optimizer_set_lr(oh, 0.125);
  hvd_optimizer_set_lr(od, 0.125);
  for (int step = 1; good && step <= 2; step++) {
    for (int i = 0; i < NP; i++)
      set_both(&h, &d, i, 1);
    good &= hvd_optimizer_step(oh) == HVD_SUCCESS;
    good &= hvd_optimizer_step(od) == HVD_SUCCESS;
    if (step == 1) {
      good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS;
      good &= hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
    }
  }
  ok(good, "custom: two steps");
  is_int(0, bad,
         "custom: state on the parameter's device, device memory, zeroed "
         "(bits 1, 2, 4)");
  check_same("custom", &h, &d, oh, od);

  /* clipped: the device gradients' scaling is done when step() reads
   * them (here on the legacy stream, which waits for no other) */
  good = hvd_optimizer_set_grad_clipping(oh, 0.5, 2) == HVD_SUCCESS &&
         hvd_optimizer_set_grad_clipping(od, 0.5, 2) == HVD_SUCCESS &&
         hvd_optimizer_zero_grad(oh) == HVD_SUCCESS &&
         hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 1);
  good &= hvd_optimizer_step(oh) == HVD_SUCCESS;
  good &= hvd_optimizer_step(od) == HVD_SUCCESS;
  ok(good && hvd_optimizer_grad_norm(od) > 0.5,
     "custom, clipped: a step (norm %g)", hvd_optimizer_grad_norm(od));
  check_same("custom, clipped", &h, &d, oh, od);

  /* zero_grad on a mixed list */
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(od), "zero_grad: mixed list");
  static float g[MAXC];
  int zero = 1;
  for (int i = 0; i < NP; i++) {
    tget(g, &d.p[i].grad);
    for (int64_t j = 0; j < counts[i]; j++)
      zero &= g[j] == 0.0f && !signbit(g[j]);
  }
  ok(zero, "zero_grad: every gradient, host and device, is +0");
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  model_free(&h);
  model_free(&d);
}

/* Creation fails with rc and exactly msg, leaving *out NULL. */
static void refused(hvd_result_t rc_want, hvd_result_t rc, hvd_optimizer_t *opt,
                    const char *msg) {
  is_int(rc_want, rc, "%s: refused: %s", pass_name, msg);
  is_string(msg, hvd_last_error(), "%s: message", pass_name);
  ok(opt == NULL, "%s: no optimizer", pass_name);
}

/* Creation (SGD, or Adam with adam) over d with param i's grad swapped
 * for zeroed host memory whose descriptor says `device`: refused with
 * exactly msg; the grad restored. */
static void refused_host_grad(model_t *d, int i, int device, int adam,
                              const char *msg) {
  hvd_sgd_options_t so;
  hvd_adam_options_t ao;
  hvd_sgd_options_init(&so);
  hvd_adam_options_init(&ao);
  hvd_optimizer_t *opt = (hvd_optimizer_t *)&opt;
  hvd_tensor_t keep = d->p[i].grad;
  d->p[i].grad.data = xcalloc((size_t)counts[i], sizeof(float));
  d->p[i].grad.device = device;
  hvd_result_t rc = adam ? hvd_adam_create(d->p, NP, &ao, &opt)
                         : hvd_sgd_create(d->p, NP, &so, &opt);
  refused(HVD_ERR_INVALID_ARG, rc, opt, msg);
  free(d->p[i].grad.data);
  d->p[i].grad = keep;
}

static void test_refusals(void) {
  model_t d;
  hvd_optimizer_t *opt = (hvd_optimizer_t *)&opt;
  hvd_sgd_options_t so;
  char msg[256];
  hvd_sgd_options_init(&so);
  model_make(&d, "r", 0x1f);
  d.p[0].value.device = dev + 1;
  snprintf(msg, sizeof msg,
           "hvd_sgd_create: param 'r.p0' value is on cuda:%d but this rank "
           "uses cuda:%d",
           dev + 1, dev);
  hvd_result_t rc = hvd_sgd_create(d.p, NP, &so, &opt);
  refused(HVD_ERR_INVALID_ARG, rc, opt, msg);
  d.p[0].value.device = dev;
  snprintf(msg, sizeof msg,
           "hvd_adam_create: param 'r.p3' grad is on cpu but value is on "
           "cuda:%d",
           dev);
  refused_host_grad(&d, 3, HVD_CPU, 1, msg);
  /* a device grad on pageable host memory (where the GPU cannot reach it) */
  if (gpu_reaches_pageable(dev)) {
    skip(3, "cuda:%d reaches pageable host memory (HMM or ATS)", dev);
  } else {
    snprintf(msg, sizeof msg,
             "hvd_sgd_create: param 'r.p1' grad is on cuda:%d but its data is "
             "pageable host memory, which this GPU cannot reach (cudaMalloc "
             "it, or pin it)",
             dev);
    refused_host_grad(&d, 1, dev, 0, msg);
  }
  model_free(&d);
}

/* ---- the distributed optimizer --------------------------------------------
 */

/* Rank r's contribution to element j of parameter i in pass q: a small
 * dyadic number, exact in float16 and in every partial sum. */
static float dyadic(int i, int64_t j, int q, int step) {
  return (float)((int)((j * 7 + i * 3 + q * 5 + step) % 9) - 4) * 0.125f *
         (float)(rank + 1);
}

struct dcfg {
  const char *what;
  int adam;
  unsigned mask;
  hvd_op_t op;
  hvd_compression_t comp;
  int k;
  double predivide;
  int nosync_step; /* this step runs without reduction, 0: none */
  int lsgd_period; /* post-local SGD from step 1, no group; 0: off */
};

/* acc into the host and the device gradient, then grad_ready(i) on both
 * optimizers; 1 if both succeeded. async: a device gradient is written
 * by cudaMemcpyAsync on the legacy stream, not waited for (a backward
 * still running when its gradient is handed over). */
static int both_ready(hvd_optimizer_t *oh, hvd_optimizer_t *od,
                      hvd_tensor_t *gh, hvd_tensor_t *gd, const float *acc,
                      int i, int async) {
  tput(gh, acc);
  if (async && gd->device != HVD_CPU)
    cuda_ok(cudaMemcpyAsync(gd->data, acc,
                            (size_t)hvd_tensor_numel(gd) * sizeof(float),
                            cudaMemcpyHostToDevice, 0),
            "cudaMemcpyAsync H2D");
  else
    tput(gd, acc);
  int good = hvd_optimizer_grad_ready(oh, i) == HVD_SUCCESS;
  return hvd_optimizer_grad_ready(od, i) == HVD_SUCCESS && good;
}

/* A step of both optimizers, each one's error noted; 1 if both
 * succeeded. */
static int both_step(hvd_optimizer_t *oh, hvd_optimizer_t *od, int step) {
  int good = hvd_optimizer_step(oh) == HVD_SUCCESS;
  tap_note("host step %d: %s", step, hvd_last_error());
  good &= hvd_optimizer_step(od) == HVD_SUCCESS;
  tap_note("device step %d: %s", step, hvd_last_error());
  return good;
}

static void dist_run(const struct dcfg *c) {
  static float acc[MAXC];
  model_t h, d;
  hvd_optimizer_t *bh = NULL, *bd = NULL, *oh = NULL, *od = NULL;
  hvd_distributed_options_t o;
  hvd_sgd_options_t so;
  hvd_adam_options_t ao;
  char hp[64], dp[64], what[160];
  int good = 1;
  hvd_sgd_options_init(&so);
  so.lr = 0.25;
  so.momentum = 0.5;
  hvd_adam_options_init(&ao);
  ao.lr = 0.125;
  ao.decoupled = 1;
  ao.weight_decay = 0.01;
  snprintf(hp, sizeof hp, "%s.%s.h", pass_name, c->what);
  snprintf(dp, sizeof dp, "%s.%s.d", pass_name, c->what);
  model_make(&h, hp, 0);
  model_make(&d, dp, c->mask);
  rng = 12345; /* the same values on every rank */
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 0);
  good &= make_opt(c->adam, c->adam ? (void *)&ao : (void *)&so, h.p, &bh) ==
          HVD_SUCCESS;
  good &= make_opt(c->adam, c->adam ? (void *)&ao : (void *)&so, d.p, &bd) ==
          HVD_SUCCESS;
  hvd_distributed_options_init(&o);
  o.op = c->op;
  o.compression = c->comp;
  o.backward_passes_per_step = c->k;
  o.gradient_predivide_factor = c->predivide;
  o.local_sgd.period = c->lsgd_period;
  o.local_sgd.start_step = 1;
  good &= hvd_distributed_optimizer(bh, &o, &oh) == HVD_SUCCESS;
  good &= hvd_distributed_optimizer(bd, &o, &od) == HVD_SUCCESS;
  tap_note("%s", hvd_last_error());
  for (int step = 1; good && step <= 3; step++) {
    int sync = step != c->nosync_step;
    good &= hvd_optimizer_set_sync(oh, sync) == HVD_SUCCESS;
    good &= hvd_optimizer_set_sync(od, sync) == HVD_SUCCESS;
    for (int q = 0; q < c->k; q++) /* backward passes accumulate */
      for (int i = NP - 1; i >= 0; i--) {
        tget(acc, &h.p[i].grad);
        for (int64_t j = 0; j < counts[i]; j++)
          acc[j] += dyadic(i, j, q, step);
        good &= both_ready(oh, od, &h.p[i].grad, &d.p[i].grad, acc, i, 0);
      }
    good &= both_step(oh, od, step);
    snprintf(what, sizeof what, "distributed %s step %d", c->what, step);
    check_same(what, &h, &d, oh, od);
    good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS;
    good &= hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
  }
  ok(good, "%s: distributed %s: every call succeeded", pass_name, c->what);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  model_free(&h);
  model_free(&d);
}

static void test_distributed(void) {
  static const struct dcfg cfgs[] = {
      {"avg", 0, 0x1f, HVD_AVERAGE, HVD_COMPRESS_NONE, 1, 1.0, 0, 0},
      {"k2", 1, 0x0d, HVD_AVERAGE, HVD_COMPRESS_NONE, 2, 2.0, 0, 0},
      {"fp16", 1, 0x1f, HVD_AVERAGE, HVD_COMPRESS_FP16, 1, 1.0, 0, 0},
      {"bf16", 0, 0x1f, HVD_SUM, HVD_COMPRESS_BF16, 1, 1.0, 0, 0},
      {"nosync", 0, 0x16, HVD_SUM, HVD_COMPRESS_NONE, 2, 1.0, 2, 0},
      {"adasum", 1, 0x0d, HVD_ADASUM, HVD_COMPRESS_NONE, 1, 1.0, 0, 0},
      {"local-sgd", 1, 0x0d, HVD_AVERAGE, HVD_COMPRESS_NONE, 1, 1.0, 0, 2},
  };
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
    dist_run(&cfgs[c]);
}

/* ---- PowerSGD ------------------------------------------------------------ */

#define PN 3
static const int64_t pshape[PN][2] = {{130, 24}, {24, 30}, {40, 1}};
#define PMAX (130 * 24)
static const int pndim[PN] = {2, 2, 1};

/* The PowerSGD run's model: "w" 130 x 24 (Q^T in three chunks of rows) and "x"
 * 24 x 30 (compressed at rank 2), "b" [40] (whole); with dev, w and b on the
 * GPU, x on the host. */
typedef struct psgd_model {
  hvd_param_t p[PN];
  char names[PN][48];
} psgd_model_t;

static void psgd_make(psgd_model_t *m, const char *prefix, int on_dev) {
  for (int i = 0; i < PN; i++) {
    snprintf(m->names[i], sizeof m->names[i], "%s.%c", prefix, "wxb"[i]);
    param_make(&m->p[i], m->names[i], on_dev && i != 1 ? dev : HVD_CPU,
               pndim[i], pshape[i]);
  }
}

static void psgd_free(psgd_model_t *m) {
  for (int i = 0; i < PN; i++)
    param_free(&m->p[i]);
}

/* Every value of d equals h's (tol 0: bit for bit; else relative to the
 * largest magnitude); NaNs must match NaNs. */
static int psgd_same(psgd_model_t *h, psgd_model_t *d, double tol, char *why,
                     size_t len) {
  static float a[PMAX], b[PMAX];
  for (int i = 0; i < PN; i++) {
    int64_t n = hvd_tensor_numel(&h->p[i].value);
    double big = 0, worst = 0;
    tget(a, &h->p[i].value);
    tget(b, &d->p[i].value);
    for (int64_t j = 0; j < n; j++) {
      if (isnan(a[j]) != isnan(b[j]) ||
          (tol == 0 && !isnan(a[j]) && memcmp(&a[j], &b[j], 4) != 0)) {
        snprintf(why, len, "'%s' element %lld: %.9g vs %.9g", h->names[i],
                 (long long)j, a[j], b[j]);
        return 0;
      }
      if (!isnan(a[j])) {
        big = fmax(big, fabs(a[j]));
        worst = fmax(worst, fabs((double)a[j] - b[j]));
      }
    }
    if (worst > tol * big) {
      snprintf(why, len, "'%s': off by %.3g of %.3g", h->names[i], worst, big);
      return 0;
    }
  }
  return 1;
}

/* Step `step` of psgd_run on both models: rank-dependent gradients (a NaN
 * in the last rank's w at step 4), handed over by grad_ready, then the
 * steps and the comparison (its TAP line, labelled lab, says what `what`
 * adds). */
static int psgd_step(const char *lab, hvd_optimizer_t *oh,
                     hvd_optimizer_t *od, psgd_model_t *h, psgd_model_t *d,
                     int step, double tol, const char *what) {
  static float acc[PMAX];
  char why[256] = "";
  int good = 1;
  for (int i = PN - 1; i >= 0; i--) {
    int64_t n = hvd_tensor_numel(&h->p[i].grad);
    for (int64_t j = 0; j < n; j++)
      acc[j] = (float)(sin(0.01 * (double)(j + 1) * (i + 2) + rank) *
                       cos(0.3 * step * (double)(j % 7)));
    if (step == 4 && i == 0 && rank == size - 1)
      acc[5] = NAN;
    good &= both_ready(oh, od, &h->p[i].grad, &d->p[i].grad, acc, i, 1);
  }
  good &= both_step(oh, od, step);
  int same = good && psgd_same(h, d, tol, why, sizeof why);
  if (!same)
    tap_note("%s", why);
  char how[32] = "bit for bit";
  if (tol != 0)
    snprintf(how, sizeof how, "%g", tol);
  ok(same, "%s: powersgd step %d%s: device equals host (%s)", lab, step, what,
     how);
  good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS;
  good &= hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
  return good;
}

/* The device model's values into keep (PN x PMAX floats). */
static void psgd_keep(psgd_model_t *d, float *keep) {
  for (int i = 0; i < PN; i++)
    tget(keep + (size_t)i * PMAX, &d->p[i].value);
}

/* Whether the device model's values are keep's (tol as psgd_same). */
static int psgd_kept(psgd_model_t *d, const float *keep, double tol) {
  static float b[PMAX];
  for (int i = 0; i < PN; i++) {
    int64_t n = hvd_tensor_numel(&d->p[i].value);
    const float *a = keep + (size_t)i * PMAX;
    double big = 0, worst = 0;
    tget(b, &d->p[i].value);
    for (int64_t j = 0; j < n; j++) {
      big = fmax(big, fabs(a[j]));
      worst = fmax(worst, fabs((double)a[j] - b[j]));
    }
    if (tol == 0 ? memcmp(a, b, (size_t)n * 4) != 0 : !(worst <= tol * big))
      return 0;
  }
  return 1;
}

static long file_bytes(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Rank 0: whether the files are the same but for the models' names (".h"
 * and ".d", of one length) and so the checksum. */
static int psgd_same_files(const char *hp, const char *dp, const char *hn,
                           const char *dn) {
  size_t na = 0, nb = 0, k = strlen(hn);
  unsigned char *a = hvdt_read_bytes(hp, &na), *b = hvdt_read_bytes(dp, &nb);
  int same = na == nb && na > 8;
  for (size_t at = 0; same && at + k <= nb; at++)
    if (memcmp(b + at, dn, k) == 0)
      memcpy(b + at, hn, k);
  same = same && memcmp(a, b, na - 8) == 0;
  free(a);
  free(b);
  return same;
}

/* PowerSGD (rank 2, from the optimizer's second step) on the device model
 * against the host model, SGD with momentum: steps of rank-dependent
 * gradients, the last with a NaN in the last rank's w (both all NaN
 * there). The device gradients are written on the legacy stream and
 * handed over unsynchronised: PowerSGD's first kernels, at grad_ready,
 * must wait for them on the device. Bit for bit where both sides sum P and
 * Q in one order (np <= 2, or the host-staged executor); else to 1e-4
 * (NCCL's order). After step 2 both save a checkpoint (PowerSGD's state:
 * the device file is the host's but for the names); after step 3 both
 * load theirs and take step 3 again: the device's first step 3 again (bit
 * for bit at np 1; 1e-5 at np >= 2, where each rank's error feedback came
 * back as the ranks' mean). */
static void psgd_run(hvd_dtype_t wire) {
  static float kept[PN * PMAX];
  psgd_model_t h, d;
  hvd_optimizer_t *bh = NULL, *bd = NULL, *oh = NULL, *od = NULL;
  hvd_sgd_options_t so;
  hvd_distributed_options_t o;
  char hp[64], dp[64], dir[256], fh[512], fd[512];
  int good = 1, same = 0;
  const double tol = size <= 2 || strcmp(pass_name, "mpi") == 0 ? 0
                     : wire == HVD_FLOAT32                      ? 1e-4
                                                                : 1e-2;
  const char *wn = wire == HVD_FLOAT32 ? "" : ".w16";
  char lab[48];
  snprintf(lab, sizeof lab, "%s%s", pass_name,
           wire == HVD_FLOAT32 ? "" : ", float16 wire");
  snprintf(hp, sizeof hp, "%s%s.psgd.h", pass_name, wn);
  snprintf(dp, sizeof dp, "%s%s.psgd.d", pass_name, wn);
  hvdt_shared_tmpdir(dir, sizeof dir, "gpu_psgd");
  snprintf(fh, sizeof fh, "%s/h.ckpt", dir);
  snprintf(fd, sizeof fd, "%s/d.ckpt", dir);
  psgd_make(&h, hp, 0);
  psgd_make(&d, dp, 1);
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  so.momentum = 0.5;
  hvd_distributed_options_init(&o);
  o.compression = HVD_COMPRESS_POWERSGD;
  o.powersgd.rank = 2;
  o.powersgd.start_step = 1;
  o.powersgd.wire = wire;
  good &= hvd_sgd_create(h.p, PN, &so, &bh) == HVD_SUCCESS &&
          hvd_distributed_optimizer(bh, &o, &oh) == HVD_SUCCESS;
  good &= hvd_sgd_create(d.p, PN, &so, &bd) == HVD_SUCCESS &&
          hvd_distributed_optimizer(bd, &o, &od) == HVD_SUCCESS;
  tap_note("%s", hvd_last_error());
  good = good && psgd_step(lab, oh, od, &h, &d, 1, tol, " (plain)");
  good = good && psgd_step(lab, oh, od, &h, &d, 2, tol, "");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(fh, h.p, PN, oh, 2),
         "%s: powersgd: save from host", lab);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(fd, d.p, PN, od, 2),
         "%s: powersgd: save from the device", lab);
  tap_note("%s", hvd_last_error());
  if (rank == 0) /* NCCL's order of the sums (tol 1e-4): the size alone */
    same = tol == 0 ? psgd_same_files(fh, fd, hp, dp)
                    : file_bytes(fh) == file_bytes(fd);
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ok(same, "%s: powersgd: the device file is the host file %s", lab,
     tol == 0 ? "but for the names (PowerSGD's state: the same bits)"
              : "in size (NCCL's sums: not the same bits)");
  good = good && psgd_step(lab, oh, od, &h, &d, 3, tol, "");
  psgd_keep(&d, kept);
  good &= hvd_checkpoint_load(fh, h.p, PN, oh, NULL) == HVD_SUCCESS;
  good &= hvd_checkpoint_load(fd, d.p, PN, od, NULL) == HVD_SUCCESS;
  tap_note("%s", hvd_last_error());
  good = good && psgd_step(lab, oh, od, &h, &d, 3, tol, " (after the loads)");
  /* np >= 2: each rank's error feedback came back as the ranks' mean,
   * which changes the rounding of M and so of P (float16's on its wire) */
  const double again = size == 1 ? 0 : wire == HVD_FLOAT32 ? 1e-5 : 1e-2;
  char how[32] = "bit for bit";
  if (again != 0)
    snprintf(how, sizeof how, "%g", again);
  ok(good && psgd_kept(&d, kept, again),
     "%s: powersgd: step 3 after the loads is the first step 3 (%s)", lab,
     how);
  good = good && psgd_step(lab, oh, od, &h, &d, 4, tol, " (a NaN)");
  tget(kept, &d.p[0].value);
  ok(good && isnan(kept[0]) && isnan(kept[PMAX - 1]),
     "%s: powersgd: every call succeeded; the NaN step left w all NaN", lab);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  psgd_free(&h);
  psgd_free(&d);
  hvdt_remove_tmpdir(dir);
}

/* ---- the sharded optimizer (ZeRO stage 1) ------------------------------- */

/* kind 0: Adam on every device parameter; 1: SGD, p1 and p3 on the GPU.
 * A host model and a device one of the same names, one after the other
 * (the same collective names), each sharded: three steps of dyadic
 * gradients, then a checkpoint each. The device model's values equal the
 * host's, its state bytes too, its file is the host's byte for byte; the
 * host file loaded into the device optimizer (the blocks taken back on the
 * GPU) and one more step on both: equal again. */
static void zero_train(model_t *m, hvd_optimizer_t *o, int first, int last) {
  static float acc[MAXC];
  int good = 1;
  for (int step = first; step <= last; step++) {
    good &= hvd_optimizer_zero_grad(o) == HVD_SUCCESS;
    for (int i = NP - 1; i >= 0; i--) {
      for (int64_t j = 0; j < counts[i]; j++)
        acc[j] = dyadic(i, j, 0, step);
      tput(&m->p[i].grad, acc);
      good &= hvd_optimizer_grad_ready(o, i) == HVD_SUCCESS;
    }
    good &= hvd_optimizer_step(o) == HVD_SUCCESS;
  }
  if (!good)
    diag("%s", hvd_last_error());
  ok(good, "%s: sharded, steps %d to %d", pass_name, first, last);
}

/* kind 0: AdamW on device parameters; 1: SGD on a mixed list, clipped;
 * 2: LAMB on a mixed list (its blocks' norms summed over the ranks). */
static void zero_run(int kind) {
  const char *what = kind == 0   ? "zero Adam"
                     : kind == 1 ? "zero SGD, mixed"
                                 : "zero LAMB, mixed";
  unsigned mask = kind == 0 ? 0x1f : kind == 1 ? 0x0a : 0x19;
  char dir[1024], ph[1100], pd[1100], prefix[64];
  model_t h, d;
  hvd_optimizer_t *oh = NULL, *od = NULL;
  hvd_distributed_options_t o;
  int same = 0;
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-gpu-zero");
  snprintf(ph, sizeof ph, "%s/host.ckpt", dir);
  snprintf(pd, sizeof pd, "%s/device.ckpt", dir);
  snprintf(prefix, sizeof prefix, "%s.z%d", pass_name, kind);
  model_make(&h, prefix, 0);
  model_make(&d, prefix, mask);
  rng = 31337; /* the same values on every rank */
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 0);
  hvd_distributed_options_init(&o);
  o.op = kind == 1 ? HVD_SUM : HVD_AVERAGE;
  o.shard_optimizer_state = 1;
  model_t *ms[2] = {&h, &d};
  hvd_optimizer_t **os[2] = {&oh, &od};
  for (int k = 0; k < 2; k++) {
    hvd_optimizer_t *base = NULL;
    hvd_adam_options_t ao;
    hvd_sgd_options_t so;
    hvd_lamb_options_t lo;
    hvd_adam_options_init(&ao);
    ao.lr = 0.125;
    ao.decoupled = 1;
    ao.weight_decay = 0.01;
    hvd_sgd_options_init(&so);
    so.lr = 0.25;
    so.momentum = 0.5;
    hvd_lamb_options_init(&lo);
    lo.lr = 0.125;
    const void *opts = kind == 0 ? (void *)&ao : kind == 1 ? (void *)&so : &lo;
    int good = make_opt(kind == 1   ? 0
                        : kind == 0 ? 1
                                    : 2,
                        opts, ms[k]->p, &base) == HVD_SUCCESS &&
               hvd_distributed_optimizer(base, &o, os[k]) == HVD_SUCCESS;
    if (!ok(good, "%s: %s: a sharded optimizer on %s parameters", pass_name,
            what, k ? "device" : "host"))
      bail("%s", hvd_last_error());
    /* the mixed list clips: its blocks' norms agreed over the ranks */
    if (kind == 1 &&
        hvd_optimizer_set_grad_clipping(*os[k], 1e-3, 2) != HVD_SUCCESS)
      bail("clipping: %s", hvd_last_error());
    zero_train(ms[k], *os[k], 1, 3);
  }
  check_same(what, &h, &d, NULL, NULL);
  if (kind == 1) {
    double nh = hvd_optimizer_grad_norm(oh), nd = hvd_optimizer_grad_norm(od);
    ok(memcmp(&nh, &nd, sizeof nh) == 0 && nh > 1e-3,
       "%s: %s: clipped, the last norm the host's bit for bit (%.17g)",
       pass_name, what, nd);
  }
  ok(hvd_optimizer_state_bytes(od) == hvd_optimizer_state_bytes(oh) &&
         hvd_optimizer_state_bytes(od) > 0,
     "%s: %s: %lld bytes of state on this rank, as on the host", pass_name,
     what, (long long)hvd_optimizer_state_bytes(od));
  is_int(HVD_SUCCESS, hvd_checkpoint_save(ph, h.p, NP, oh, 3),
         "%s: %s: save from host", pass_name, what);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(pd, d.p, NP, od, 3),
         "%s: %s: save from the device", pass_name, what);
  tap_note("%s", hvd_last_error());
  if (rank == 0) {
    size_t na, nb;
    unsigned char *a = hvdt_read_bytes(ph, &na), *b = hvdt_read_bytes(pd, &nb);
    same = na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
  }
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ok(same, "%s: %s: the device file is the host file, byte for byte", pass_name,
     what);
  /* the host's file into the device optimizer; the host goes on too */
  zero_train(&h, oh, 4, 4);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(ph, d.p, NP, od, NULL),
         "%s: %s: the host file into the device optimizer", pass_name, what);
  tap_note("%s", hvd_last_error());
  zero_train(&d, od, 4, 4);
  check_same("zero, after the reload and a step", &h, &d, NULL, NULL);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  model_free(&h);
  model_free(&d);
  hvdt_remove_tmpdir(dir);
}

/* ---- initial state ------------------------------------------------------ */

static void test_broadcast(void) {
  model_t d, want;
  hvd_optimizer_t *opt = NULL;
  hvd_adam_options_t ao;
  char name[64], msg[256];
  int root = size - 1;
  snprintf(name, sizeof name, "%s.b", pass_name);
  model_make(&d, name, 0x1b); /* p2 on the host */
  model_make(&want, "want", 0);
  for (int i = 0; i < NP; i++) { /* mine, and the root's */
    static float hv[MAXC];
    rng = 777 + (uint64_t)rank * 31 + (uint64_t)i;
    draw(hv, i, 0);
    tput(&d.p[i].value, hv);
    rng = 777 + (uint64_t)root * 31 + (uint64_t)i;
    draw(hv, i, 0);
    tput(&want.p[i].value, hv);
  }
  is_int(HVD_SUCCESS, hvd_broadcast_parameters(d.p, NP, root),
         "%s: hvd_broadcast_parameters from rank %d", pass_name, root);
  tap_note("%s", hvd_last_error());
  check_same("broadcast_parameters", &want, &d, NULL, NULL);
  if (size > 1) {
    float one = 1.0f;
    if (rank == 1 && d.p[3].value.data != NULL)
      h2d((float *)d.p[3].value.data + 999, &one, sizeof one);
    snprintf(msg, sizeof msg,
             "hvd_verify_parameters: parameter '%s' is not identical on "
             "every rank: rank(s) 1 differ from rank 0",
             d.p[3].name);
    is_int(HVD_ERR_CORRUPT, hvd_verify_parameters(d.p, NP),
           "%s: verify finds rank 1's device value", pass_name);
    is_string(msg, hvd_last_error(), "%s: verify's message", pass_name);
  } else {
    skip(2, "a difference between ranks needs 2 ranks");
  }
  /* optimizer state from rank 0, after a step on each rank's own data */
  hvd_adam_options_init(&ao);
  is_int(HVD_SUCCESS, hvd_adam_create(d.p, NP, &ao, &opt), "%s: adam on %s",
         pass_name, name);
  rng = 99 + (uint64_t)rank;
  for (int i = 0; i < NP; i++)
    set_both(&d, &want, i, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "%s: a local step", pass_name);
  if (rank != 0) { /* root's hyperparameters too (include/hvd.h) */
    hvd_optimizer_set_lr(opt, 0.5);
    hvd_optimizer_set_param_lr_scale(opt, 0, 2);
  } else {
    hvd_optimizer_set_param_weight_decay(opt, 1, 0.25);
  }
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(opt, 0),
         "%s: hvd_broadcast_optimizer_state with device state (verified)",
         pass_name);
  tap_note("%s", hvd_last_error());
  is_double(0.001, hvd_optimizer_lr(opt), 0, "%s: rank 0's lr", pass_name);
  ok(hvd_optimizer_param_lr_scale(opt, 0) == 1 &&
         hvd_optimizer_param_weight_decay(opt, 1) == 0.25,
     "%s: rank 0's lr scale and weight decay of each parameter", pass_name);
  hvd_optimizer_destroy(opt);
  model_free(&d);
  model_free(&want);
}

/* ---- checkpoints ----------------------------------------------------------
 */

/* Checkpoints follow the collectives' "Device ordering": with a
 * cudaStreamNonBlocking stream set (hvd_cuda_set_stream), work enqueued
 * on it before the call is done first. A load right after a zeroing of
 * d's device values enqueued there leaves the file's values (host file
 * ph, model h: the zeros would land after the load's writes otherwise);
 * a save right after such a zeroing saves the zeros (loaded back into
 * the host model h: its device-placed parameters read 0). */
static void checkpoint_on_stream(const char *ph, const char *dir, model_t *h,
                                 model_t *d, hvd_optimizer_t *od) {
  cudaStream_t us;
  char pz[1100];
  int good = 1;
  snprintf(pz, sizeof pz, "%s/zeros.ckpt", dir);
  cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
  hvd_cuda_set_stream(us);
  fill_on(d, 0, 0, us);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(ph, d->p, NP, od, NULL),
         "checkpoint on the caller's stream: a load after a zeroing there");
  cuda_ok(cudaStreamSynchronize(us), "sync");
  check_same("checkpoint on the caller's stream: the file's values, not "
             "the zeros",
             h, d, NULL, NULL);
  fill_on(d, 0, 0, us);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(pz, d->p, NP, od, 8),
         "checkpoint on the caller's stream: a save after a zeroing there");
  hvd_cuda_set_stream(NULL);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(pz, h->p, NP, NULL, NULL),
         "... loaded into the host model");
  for (int i = 0; i < NP; i++)
    for (int64_t j = 0; d->p[i].value.device != HVD_CPU &&
                        j < hvd_tensor_numel(&h->p[i].value);
         j++)
      good &= ((float *)h->p[i].value.data)[j] == 0.0f;
  ok(good, "... the zeros were saved: the save came after them");
  cuda_ok(cudaStreamDestroy(us), "cudaStreamDestroy");
}

static void test_checkpoint(void) {
  char dir[1024], ph[1100], pd[1100];
  model_t h, d, h2, d2;
  hvd_optimizer_t *oh = NULL, *od = NULL, *oh2 = NULL, *od2 = NULL;
  hvd_adam_options_t ao;
  int64_t step = 0;
  int good = 1, same = 0;
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-gpu-optim");
  snprintf(ph, sizeof ph, "%s/host.ckpt", dir);
  snprintf(pd, sizeof pd, "%s/device.ckpt", dir);
  hvd_adam_options_init(&ao);
  ao.decoupled = 1;
  ao.weight_decay = 0.01;
  model_make(&h, "k", 0);
  model_make(&d, "k", 0x1d); /* p1 on the host */
  model_make(&h2, "k", 0);
  model_make(&d2, "k", 0x1f);
  rng = 4242; /* every rank the same */
  for (int i = 0; i < NP; i++)
    set_both(&h, &d, i, 0);
  good &= hvd_adam_create(h.p, NP, &ao, &oh) == HVD_SUCCESS;
  good &= hvd_adam_create(d.p, NP, &ao, &od) == HVD_SUCCESS;
  good &= hvd_adam_create(h2.p, NP, &ao, &oh2) == HVD_SUCCESS;
  good &= hvd_adam_create(d2.p, NP, &ao, &od2) == HVD_SUCCESS;
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < NP; i++)
      set_both(&h, &d, i, 1);
    good &= hvd_optimizer_step(oh) == HVD_SUCCESS;
    good &= hvd_optimizer_step(od) == HVD_SUCCESS;
    good &= hvd_optimizer_zero_grad(oh) == HVD_SUCCESS;
    good &= hvd_optimizer_zero_grad(od) == HVD_SUCCESS;
  }
  ok(good, "checkpoint: two Adam steps on host and device models");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(ph, h.p, NP, oh, 7),
         "checkpoint: save from host");
  hvd_checkpoint_request_t *q = NULL;
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(pd, d.p, NP, od, 7, &q),
         "checkpoint: save from device, in the background");
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(q), "... written");
  if (rank == 0) {
    size_t na, nb;
    unsigned char *a = hvdt_read_bytes(ph, &na), *b = hvdt_read_bytes(pd, &nb);
    same = na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
  }
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ok(same, "checkpoint: the device file is the host file, byte for byte");
  is_int(HVD_SUCCESS, hvd_checkpoint_load(pd, h2.p, NP, oh2, &step),
         "checkpoint: device file into host parameters");
  is_int(7, step, "checkpoint: step");
  check_same("checkpoint device -> host", &d, &h2, od, oh2);
  is_int(2, hvd_optimizer_steps(oh2), "checkpoint: optimizer steps");
  is_int(HVD_SUCCESS, hvd_checkpoint_load(ph, d2.p, NP, od2, NULL),
         "checkpoint: host file into device parameters");
  tap_note("%s", hvd_last_error());
  check_same("checkpoint host -> device", &h, &d2, oh, od2);
  checkpoint_on_stream(ph, dir, &h, &d2, od2);
  hvd_optimizer_destroy(oh);
  hvd_optimizer_destroy(od);
  hvd_optimizer_destroy(oh2);
  hvd_optimizer_destroy(od2);
  model_free(&h);
  model_free(&d);
  model_free(&h2);
  model_free(&d2);
  hvdt_remove_tmpdir(dir);
}

/* ---- synchronized batch norm on device tensors ------------------------- */

/* A device copy of n bytes at h (n may be 0). */
static void *dup_dev(const void *h, size_t n) {
  void *d = NULL;
  cuda_ok(cudaMalloc(&d, n ? n : 1), "cudaMalloc");
  h2d(d, h, n);
  return d;
}

static void get_dev(void *h, const void *d, size_t n) {
  if (n)
    cuda_ok(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

/* n elements of dtype t at a and b agree to tol (relative above 1). */
static int bn_close(hvd_dtype_t t, const void *a, const void *b, int64_t n,
                    double tol, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double u = hvdt_get(t, a, i), v = hvdt_get(t, b, i);
    if (fabs(u - v) > tol * fmax(1.0, fabs(u))) {
      diag("%s[%lld]: host %.8g, device %.8g", what, (long long)i, u, v);
      return 0;
    }
  }
  return 1;
}

/* The same forward and backward on host and on device tensors (rank r:
 * 2 + r images, none on the last of 3 or more), compared: the host's
 * against one process's batch norm is t/mpi/sync_bn's. */
/* Sync batch norm on device tensors against the host's: float32, float16,
 * then float32 again with a cudaStreamNonBlocking stream set
 * (hvd_cuda_set_stream) on which x and dy are still being copied when
 * the calls are made: the calls follow that stream. On the stand-in, the
 * last calls make no cudaMalloc or cudaFree (the scratch is kept: each
 * would wait for the whole device, mid-backward). */
static void test_sync_bn(void) {
  static const hvd_dtype_t types[3] = {HVD_FLOAT32, HVD_FLOAT16, HVD_FLOAT32};
  for (int k = 0; k < 3; k++) {
    hvd_dtype_t t = types[k];
    cudaStream_t us = NULL;
    if (k == 2) {
      cuda_ok(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking), "stream");
      hvd_cuda_set_stream(us);
    }
    const int C = 3, S = 4;
    int N = size > 2 && rank == size - 1 ? 0 : 2 + rank;
    int64_t shape[4] = {N, C, 2, 2}, cnt = (int64_t)N * C * S;
    size_t es = hvdt_size(t), bytes = (size_t)cnt * es, cb = sizeof(float) * 3;
    unsigned char *x = xcalloc((size_t)cnt + 1, es),
                  *dy = xcalloc((size_t)cnt + 1, es);
    unsigned char *y = xcalloc((size_t)cnt + 1, es),
                  *dx = xcalloc((size_t)cnt + 1, es);
    unsigned char *y2 = xcalloc((size_t)cnt + 1, es),
                  *dx2 = xcalloc((size_t)cnt + 1, es);
    for (int64_t i = 0; i < cnt; i++) {
      hvdt_put(t, x, i, 2 * sin(0.3 * i + rank) + (double)(i / S % C));
      hvdt_put(t, dy, i, cos(0.7 * i - rank));
    }
    float w[3] = {1.0f, 1.5f, 0.5f}, b[3] = {0.1f, -0.2f, 0.3f};
    float rm[3] = {0}, rv[3] = {1, 1, 1}, sm[3], si[3], dw[3] = {0},
          db[3] = {0};
    float rm2[3], rv2[3], sm2[3], si2[3], dw2[3], db2[3];
    hvd_tensor_t tx = hvd_tensor_make(x, t, 4, shape),
                 ty = hvd_tensor_make(y, t, 4, shape);
    hvd_tensor_t tdy = hvd_tensor_make(dy, t, 4, shape),
                 tdx = hvd_tensor_make(dx, t, 4, shape);
    int ok_host =
        hvd_sync_batch_norm_forward("bn.host", &tx, w, b, rm, rv, 0.1, 1e-5,
                                    &ty, sm, si) == HVD_SUCCESS &&
        hvd_sync_batch_norm_backward("bn.host", &tx, &tdy, w, sm, si, &tdx, dw,
                                     db) == HVD_SUCCESS;
    /* the device's, from the same inputs */
    float zero3[3] = {0}, one3[3] = {1, 1, 1};
    void *Dx = dup_dev(x, bytes), *Dy = dup_dev(y, bytes),
         *Ddy = dup_dev(dy, bytes);
    void *Ddx = dup_dev(dx, bytes), *Dw = dup_dev(w, cb), *Db = dup_dev(b, cb);
    void *Drm = dup_dev(zero3, cb), *Drv = dup_dev(one3, cb),
         *Dsm = dup_dev(zero3, cb);
    void *Dsi = dup_dev(zero3, cb), *Ddw = dup_dev(zero3, cb),
         *Ddb = dup_dev(zero3, cb);
    hvd_tensor_t ux = hvd_tensor_make(Dx, t, 4, shape),
                 uy = hvd_tensor_make(Dy, t, 4, shape);
    hvd_tensor_t udy = hvd_tensor_make(Ddy, t, 4, shape),
                 udx = hvd_tensor_make(Ddx, t, 4, shape);
    ux.device = uy.device = udy.device = udx.device = dev;
    void *sx = NULL, *sdy = NULL;
    if (us != NULL) { /* x and dy zeroed, then copied in on us: in flight */
      sx = dup_dev(x, bytes);
      sdy = dup_dev(dy, bytes);
      cuda_ok(cudaMemset(Dx, 0, bytes), "cudaMemset");
      cuda_ok(cudaMemset(Ddy, 0, bytes), "cudaMemset");
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      cuda_ok(cudaMemcpyAsync(Dx, sx, bytes, cudaMemcpyDeviceToDevice, us),
              "cudaMemcpyAsync");
      cuda_ok(cudaMemcpyAsync(Ddy, sdy, bytes, cudaMemcpyDeviceToDevice, us),
              "cudaMemcpyAsync");
    }
#ifdef HVD_T_STANDIN
    long allocs = standin_malloc_calls();
#endif
    hvd_result_t rf = hvd_sync_batch_norm_forward(
        "bn.dev", &ux, Dw, Db, Drm, Drv, 0.1, 1e-5, &uy, Dsm, Dsi);
    if (rf != HVD_SUCCESS)
      diag("device forward: %s", hvd_last_error());
    hvd_result_t rb = hvd_sync_batch_norm_backward("bn.dev", &ux, &udy, Dw, Dsm,
                                                   Dsi, &udx, Ddw, Ddb);
    if (rb != HVD_SUCCESS)
      diag("device backward: %s", hvd_last_error());
#ifdef HVD_T_STANDIN
    if (k == 2)
      is_int(0, (int)(standin_malloc_calls() - allocs),
             "%s: sync batch norm's second device calls: no cudaMalloc or "
             "cudaFree",
             pass_name);
#endif
    hvd_cuda_set_stream(NULL);
    get_dev(y2, Dy, bytes);
    get_dev(dx2, Ddx, bytes);
    get_dev(rm2, Drm, cb), get_dev(rv2, Drv, cb), get_dev(sm2, Dsm, cb);
    get_dev(si2, Dsi, cb), get_dev(dw2, Ddw, cb), get_dev(db2, Ddb, cb);
    double tol = t == HVD_FLOAT32 ? 1e-5 : 4e-3;
    int same = ok_host && rf == HVD_SUCCESS && rb == HVD_SUCCESS &&
               bn_close(t, y, y2, cnt, tol, "y") &&
               bn_close(t, dx, dx2, cnt, tol, "dx") &&
               bn_close(HVD_FLOAT32, rm, rm2, 3, 1e-6, "running_mean") &&
               bn_close(HVD_FLOAT32, rv, rv2, 3, 1e-6, "running_var") &&
               bn_close(HVD_FLOAT32, sm, sm2, 3, 1e-6, "save_mean") &&
               bn_close(HVD_FLOAT32, si, si2, 3, 1e-6, "save_invstd") &&
               bn_close(HVD_FLOAT32, dw, dw2, 3, 1e-4, "dweight") &&
               bn_close(HVD_FLOAT32, db, db2, 3, 1e-4, "dbias");
    ok(same,
       "%s: sync batch norm on %s device tensors = on host tensors "
       "(%d images here)%s",
       pass_name, hvd_dtype_name(t), N,
       us ? ", x and dy still being copied on the caller's stream" : "");
    if (us != NULL)
      cuda_ok(cudaStreamDestroy(us), "cudaStreamDestroy");
    void *all[] = {Dx, Dy,  Ddy, Ddx, Dw,  Db, Drm,
                   Drv, Dsm, Dsi, Ddw, Ddb, sx, sdy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      cudaFree(all[i]);
    free(x), free(dy), free(y), free(dx), free(y2), free(dx2);
  }
}

/* ---- passes -------------------------------------------------------------- */

static void test_mixed(int dist, int shard, int r32);

static void run_pass(const char *ops, int last) {
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
  test_refusals();
  test_distributed();
  psgd_run(HVD_FLOAT32);
  psgd_run(HVD_FLOAT16);
  zero_run(0);
  zero_run(1);
  zero_run(2);
  test_mixed(1, 0, 0);
  test_mixed(1, 1, 0);
  test_mixed(1, 0, 1);
  test_broadcast();
  test_sync_bn();
  if (last)
    test_checkpoint();
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", ops);
  unsetenv("HVD_GPU_OPERATIONS");
}

/* ---- mixed precision --------------------------------------------------- */

#define MN 1031

/* AdamW (lr 0.01) on the two parameters ps, float16 loss scaling from
 * 1024 growing every 2 clean steps, in a distributed optimizer when dist
 * (shard: ZeRO-1; r32: reduce_fp32). 1 when made. */
static int mixed_opt(hvd_param_t *ps, int dist, int shard, int r32,
                     hvd_optimizer_t **opt) {
  hvd_adam_options_t ao;
  hvd_loss_scale_options_t lo;
  hvd_distributed_options_t dopt;
  hvd_adam_options_init(&ao);
  ao.lr = 0.01;
  ao.decoupled = 1;
  hvd_loss_scale_options_init(&lo);
  lo.init_scale = 1024;
  lo.growth_interval = 2;
  hvd_distributed_options_init(&dopt);
  dopt.shard_optimizer_state = shard;
  dopt.reduce_fp32 = r32;
  hvd_optimizer_t *base = NULL;
  int good = hvd_adam_create(ps, 2, &ao, &base) == HVD_SUCCESS;
  *opt = base;
  if (good && dist)
    good = hvd_distributed_optimizer(base, &dopt, opt) == HVD_SUCCESS;
  return good &&
         hvd_optimizer_set_loss_scaling(*opt, &lo) == HVD_SUCCESS;
}

/* test_mixed's checkpoint (dist): both sides save, and the files are
 * the same byte for byte (the float32 masters: with shard, gathered on
 * rank 0 from every rank's blocks); then the device side's values are
 * zeroed and a fresh device optimizer (masters from the zeros) loads the
 * host's file: the values are the host's bit for bit (with shard, each
 * rank rounded every piece of each master into its value as it came, a
 * piece at a time, keeping its own block), and so is a step after it,
 * which needs the masters' extra precision back. */
static void mixed_checkpoint(const char *what, hvd_param_t ps[2][2],
                             hvd_optimizer_t *opt[2], int shard, int r32,
                             void *dv[2], void *dg[2], uint16_t *hv[2][2],
                             uint16_t *hg[2][2]) {
  char dir[1024], ph[1100], pd[1100];
  int same = 0, good = 1;
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-gpu-mixed");
  snprintf(ph, sizeof ph, "%s/host.ckpt", dir);
  snprintf(pd, sizeof pd, "%s/device.ckpt", dir);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(ph, ps[0], 2, opt[0], 5),
         "%s: checkpoint: save from the host", what);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(pd, ps[1], 2, opt[1], 5),
         "%s: checkpoint: save from the device", what);
  if (rank == 0)
    same = hvdt_same_file(ph, pd);
  MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ok(same, "%s: checkpoint: the device file is the host's, byte for byte",
     what);
  hvd_optimizer_destroy(opt[1]);
  for (int j = 0; j < 2; j++)
    cuda_ok(cudaMemset(dv[j], 0, 2 * MN), "cudaMemset");
  good = mixed_opt(ps[1], 1, shard, r32, &opt[1]);
  good = good && hvd_checkpoint_load(ph, ps[1], 2, opt[1], NULL) == HVD_SUCCESS;
  if (!good)
    tap_note("%s", hvd_last_error());
  for (int j = 0; j < 2; j++) {
    cuda_ok(cudaMemcpy(hv[0][j], dv[j], 2 * MN, cudaMemcpyDeviceToHost), "D2H");
    good &= memcmp(hv[0][j], hv[1][j], 2 * MN) == 0;
  }
  ok(good, "%s: checkpoint: the host's file into a fresh device optimizer: "
           "the host's values bit for bit",
     what);
  for (int side = 0; side < 2; side++)
    good &= hvd_optimizer_zero_grad(opt[side]) == HVD_SUCCESS;
  for (int j = 0; j < 2; j++) {
    for (int i = 0; i < MN; i++) {
      float g = (float)(floor(uniform() * 32) / 32 * 0x1p-7 *
                        hvd_optimizer_loss_scale(opt[0]));
      hg[1][j][i] = ps[0][j].value.dtype == HVD_FLOAT16 ? hvd__f32_to_f16(g)
                                                        : hvd__f32_to_bf16(g);
    }
    h2d(dg[j], hg[1][j], 2 * MN);
  }
  for (int side = 0; side < 2; side++)
    good &= hvd_optimizer_step(opt[side]) == HVD_SUCCESS;
  for (int j = 0; j < 2; j++) {
    cuda_ok(cudaMemcpy(hv[0][j], dv[j], 2 * MN, cudaMemcpyDeviceToHost), "D2H");
    good &= memcmp(hv[0][j], hv[1][j], 2 * MN) == 0;
  }
  ok(good && hvd_optimizer_step_skipped(opt[1]) == 0,
     "%s: checkpoint: a step after it equals the host's bit for bit (the "
     "masters loaded)",
     what);
  hvdt_remove_tmpdir(dir);
}

/* Mixed precision on the device against the host (lib/optim/mixed.c): a
 * float16 and a bfloat16 parameter per side, AdamW, float16 loss scaling
 * from 2^10 with growth every 2 steps; 5 steps of the same gradients on
 * both sides, the third with an inf in element 7 (skipped on both). Values
 * identical bit for bit after every step, and the scale and step counts
 * equal. With dist (after hvd_init), both sides are distributed
 * optimizers (shard: ZeRO-1, the masters in blocks), the ranks' values
 * differ at creation and hvd_broadcast_parameters from rank 0 sets them
 * (each master follows its value: the refresh kernel on the device), and
 * the gradients are dyadic, so that every summation order agrees. With
 * r32 (distributed, not sharded) both reduce in float32 (reduce_fp32) and
 * the device gradients are written on the legacy stream and not waited
 * for: the conversion to float32 must wait for them on the device. */
static void test_mixed(int dist, int shard, int r32) {
  const char *what = !dist   ? "mixed"
                     : shard ? "mixed, sharded"
                     : r32   ? "mixed, dist, reduce_fp32, unsynchronised"
                             : "mixed, dist";
  static const hvd_dtype_t dts[2] = {HVD_FLOAT16, HVD_BFLOAT16};
  uint16_t *hv[2][2], *hg[2][2]; /* [side][param]; side 1: host mirrors */
  void *dv[2], *dg[2];
  hvd_param_t ps[2][2];
  hvd_optimizer_t *opt[2];
  int64_t n = MN;
  int good = 1, skipped_ok = 1;
  for (int j = 0; j < 2; j++) {
    for (int side = 0; side < 2; side++) {
      hv[side][j] = xcalloc(MN, 2);
      hg[side][j] = xcalloc(MN, 2);
    }
    for (int i = 0; i < MN; i++) {
      float v = (float)uniform() + (dist ? 0.125f * (float)rank : 0.0f);
      hv[0][j][i] =
          dts[j] == HVD_FLOAT16 ? hvd__f32_to_f16(v) : hvd__f32_to_bf16(v);
    }
    memcpy(hv[1][j], hv[0][j], 2 * MN);
    cuda_ok(cudaMalloc(&dv[j], 2 * MN), "cudaMalloc");
    cuda_ok(cudaMalloc(&dg[j], 2 * MN), "cudaMalloc");
    h2d(dv[j], hv[0][j], 2 * MN);
    for (int side = 0; side < 2; side++) {
      ps[side][j].name = j ? "m.bf16" : "m.f16";
      ps[side][j].value =
          hvd_tensor_make(side ? dv[j] : hv[1][j], dts[j], 1, &n);
      ps[side][j].grad =
          hvd_tensor_make(side ? dg[j] : hg[1][j], dts[j], 1, &n);
      ps[side][j].value.device = ps[side][j].grad.device = side ? dev : HVD_CPU;
    }
  }
  for (int side = 0; side < 2; side++) {
    good &= mixed_opt(ps[side], dist, shard, r32, &opt[side]);
    if (dist)
      good &= hvd_broadcast_parameters(ps[side], 2, 0) == HVD_SUCCESS;
  }
  if (!ok(good, "%s: host and device optimizers over float16 and bfloat16",
          what)) {
    tap_note("%s", hvd_last_error());
    return;
  }
  for (int step = 0; step < 5; step++) {
    double scale = hvd_optimizer_loss_scale(opt[0]);
    for (int side = 0; side < 2; side++)
      good &= hvd_optimizer_zero_grad(opt[side]) == HVD_SUCCESS;
    for (int j = 0; j < 2; j++) {
      for (int i = 0; i < MN; i++) {
        float g = dist ? (float)(floor(uniform() * 32) / 32 * scale * 0x1p-7)
                       : (float)(uniform() * scale * 0.01);
        if (step == 2 && i == 7)
          g = INFINITY;
        hg[1][j][i] =
            dts[j] == HVD_FLOAT16 ? hvd__f32_to_f16(g) : hvd__f32_to_bf16(g);
      }
      if (r32) /* on the legacy stream, not waited for (backward running) */
        cuda_ok(
            cudaMemcpyAsync(dg[j], hg[1][j], 2 * MN, cudaMemcpyHostToDevice, 0),
            "cudaMemcpyAsync H2D");
      else
        h2d(dg[j], hg[1][j], 2 * MN);
    }
    for (int side = 0; side < 2; side++)
      if (hvd_optimizer_step(opt[side]) != HVD_SUCCESS) {
        tap_note("step %d, side %d: %s", step, side, hvd_last_error());
        good = 0;
      }
    skipped_ok &= hvd_optimizer_step_skipped(opt[0]) == (step == 2) &&
                  hvd_optimizer_step_skipped(opt[1]) == (step == 2);
    for (int j = 0; j < 2; j++) {
      cuda_ok(cudaMemcpy(hv[0][j], dv[j], 2 * MN, cudaMemcpyDeviceToHost),
              "D2H");
      good &= memcmp(hv[0][j], hv[1][j], 2 * MN) == 0;
    }
  }
  ok(good, "%s: device values equal the host's bit for bit, every step", what);
  ok(skipped_ok, "%s: the step with an inf skipped on both", what);
  ok(hvd_optimizer_loss_scale(opt[0]) == hvd_optimizer_loss_scale(opt[1]) &&
         hvd_optimizer_steps(opt[0]) == 4 && hvd_optimizer_steps(opt[1]) == 4,
     "%s: scale %g and 4 updates on both", what,
     hvd_optimizer_loss_scale(opt[1]));
  if (dist)
    is_int(HVD_SUCCESS, hvd_verify_parameters(ps[1], 2),
           "%s: every rank holds the same device values", what);
  if (dist)
    mixed_checkpoint(what, ps, opt, shard, r32, dv, dg, hv, hg);
  for (int side = 0; side < 2; side++)
    hvd_optimizer_destroy(opt[side]);
  for (int j = 0; j < 2; j++) {
    cudaFree(dv[j]);
    cudaFree(dg[j]);
    for (int side = 0; side < 2; side++) {
      free(hv[side][j]);
      free(hg[side][j]);
    }
  }
}

int main(int argc, char **argv) {
  int count = 0;
  /* a GPU each when there are enough, else all on the first */
  dev = gpu_mpi_begin(&argc, &argv, &rank, &size, &count);
  test_parity();
  test_step_order();
  test_mixed(0, 0, 0);
  test_custom();
  test_refusals();
  if (!hvd_nccl_built())
    skip(1, "nccl: this build has no NCCL");
  else if (!gpu_nccl_fits(size, count))
    skip(1,
         "nccl at np %d needs %d GPUs (NCCL refuses two ranks on one); "
         "%d visible",
         size, size, count);
  else
    run_pass("nccl", 0);
  run_pass("mpi", 1);
  return tap_mpi_finish();
}

#endif /* HVD_HAVE_CUDA */
