/*
 * optim_soak.c - the distributed optimizer under random combinations of
 * what a user may set, each against a plain optimizer fed the average by
 * hand. Every feature has its own exact tests; this one looks for the
 * combinations nobody wrote down.
 *
 *   mpirun -np P t/soak/optim_soak [--configs C] [--seed S] [--steps K]
 *       [--device] [--save-dir DIR] [--resume-dir DIR]
 *
 * Each configuration is drawn from (seed, its index), the same on every
 * rank: 1-5 host parameters of 1-3000 elements, float32, bfloat16 or
 * float16; SGD (momentum, nesterov, weight decay), Adam, AdamW, LAMB or a
 * custom optimizer (hvd_optimizer_custom, host parameters) with a random
 * learning rate; per-parameter learning-rate scales and
 * weight decays; op average or sum, 1-3 backward passes (averaged or
 * summed), a predivide factor, ZeRO-1, reduce_fp32, a float16/bfloat16
 * wire, explicit gradient groups (num_groups, or ids with some parameters
 * in none; not with ZeRO-1); gradient clipping; loss scaling (with an inf injected on one rank
 * at one pass of one step); sparse rows (hvd_optimizer_sparse_grad) on
 * float32 host parameters, each rank its own, handed over before the
 * parameter's reduction starts or after (allgathered at the step); a
 * checkpoint saved, the model scribbled over and loaded back in the
 * middle, or an hvd_state committed, a step of other gradients taken
 * and the commit restored; at np >= 2 (not with --save-dir or
 * --resume-dir), the optimizer on a process set: the ranks of each
 * parity form one (hvd_distributed_options_t.process_set), both train
 * the configuration at once, each against its own ranks' average, its
 * inf skipping its own step, its checkpoint its own file. A combination the
 * library refuses at creation is counted and skipped (every rank refuses
 * alike).
 *
 * Each rank's gradients are its own (a hash of rank, step, pass,
 * parameter and element, times the loss scale), accumulated over the
 * passes in the parameter's dtype, grad_ready'd in reverse order. The
 * reference, a plain optimizer made alike on a copy of the values, gets
 * the sum over every rank and pass computed in double, divided as the
 * options say, rounded once to the dtype. Per step: both succeed, skip
 * alike and count alike; every rank holds the same bits
 * (hvd_verify_parameters); each value is within tol * max(1, max
 * |reference|) of the reference's (1: the initial values' range, so that
 * a 16-bit value one unit in the last place off, and shrinking since,
 * stays within), tol by what rounds on the way (float32 2e-5 a step, a
 * 16-bit wire or dtype 2e-2, see tolerance()). One TAP check per
 * configuration; the drawn options are printed with a failure.
 *
 * --save-dir DIR saves each configuration's end as DIR/cfg<k>;
 * --resume-dir DIR starts each from that file, loaded into both sides
 * (which must then hold the same bits), so that a run at another world
 * size (t/mpi/optim_soak.sh: written at np 3, resumed at np 2 and 4)
 * checks that a checkpoint of every combination loads at any size and
 * trains on as the reference does.
 *
 * Built with SOAK_CUDA (t/standin/optim_soak against the stand-in,
 * t/gpu/optim_soak on a real GPU, which skips without one), with
 * --device about half of each configuration's parameters are on the
 * rank's GPU (the reference's stay on the host): gradients written on the
 * host and copied before their grad_ready, values copied back after the
 * device is synchronised, as a user's program would.
 */
#ifdef SOAK_CUDA
#include <config.h>
#ifndef HVD_HAVE_CUDA /* t/gpu/optim_soak in a build without CUDA: skips */
#undef SOAK_CUDA
#define SOAK_NO_CUDA 1
#endif
#endif
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#if defined(SOAK_CUDA) || defined(SOAK_NO_CUDA)
#include "gputest.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXP 5

typedef struct cfg {
  int n;
  int64_t len[MAXP];
  hvd_dtype_t dt[MAXP];
  int kind; /* 0 SGD, 1 Adam, 2 AdamW, 3 LAMB, 4 custom (host only) */
  double lr, momentum, wd;
  int nesterov;
  double lr_scale[MAXP], pwd[MAXP]; /* NAN: none */
  hvd_distributed_options_t d;
  double max_norm;
  int scaling, inject_step, inject_rank, ckpt_step, steps;
  int on_dev[MAXP]; /* --device: the distributed side's parameter on the GPU */
  int sparse[MAXP]; /* sparse rows each step: 1 before grad_ready, 2 after */
  int by_state;     /* at ckpt_step an hvd_state commit, a step, a restore */
  int split;        /* on the parity set (d.process_set = parity) */
  int gids[MAXP];   /* d.groups, when it points here */
} cfg_t;

/* The ranks of this rank's parity (np >= 2), and their world ranks. */
static hvd_process_set_t *parity;
static int nmembers, members[64];
static const char *save_dir, *resume_dir; /* --save-dir, --resume-dir */

static int device_mode;   /* --device */
static int dev = HVD_CPU; /* the rank's GPU with --device */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t rng_state;
static uint64_t draw(uint64_t n) { return mix(rng_state++) % n; }
static int coin(int percent) { return (int)draw(100) < percent; }

static const char *const kinds[] = {"SGD", "Adam", "AdamW", "LAMB", "custom"};
static int n_skipped, n_ckpt, n_steps, n_sparse, n_resumed,
    n_split, n_groups; /* the summary */

static void draw_cfg(cfg_t *c, uint64_t seed, int index, int steps) {
  static const hvd_dtype_t dts[] = {HVD_FLOAT32, HVD_FLOAT32, HVD_BFLOAT16,
                                    HVD_FLOAT16};
  memset(c, 0, sizeof *c);
  rng_state = mix(seed * 1000003u + (uint64_t)index);
  c->n = 1 + (int)draw(MAXP);
  int low = coin(40);
  for (int p = 0; p < c->n; p++) {
    c->len[p] = 1 + (int64_t)draw(coin(30) ? 3000 : 40);
    c->dt[p] = low ? dts[draw(4)] : HVD_FLOAT32;
    c->lr_scale[p] = coin(20) ? 0.5 * (double)(1 + draw(4)) : NAN;
    c->pwd[p] = coin(20) ? 0.01 * (double)draw(3) : NAN;
  }
  c->kind = (int)draw(5);
  c->lr = c->kind == 0 ? 0.05 * (double)(1 + draw(4))
                       : 0.001 * (double)(1 + draw(5));
  c->momentum = coin(60) ? 0.9 : 0;
  c->nesterov = c->momentum != 0 && coin(30);
  c->wd = coin(40) ? 0.01 : 0;
  hvd_distributed_options_init(&c->d);
  c->d.op = coin(20) ? HVD_SUM : HVD_AVERAGE;
  c->d.backward_passes_per_step = 1 + (int)draw(3);
  c->d.average_passes = coin(80);
  c->d.gradient_predivide_factor = coin(20) ? 2.0 : 1.0;
  c->d.shard_optimizer_state = coin(30);
  c->d.reduce_fp32 = coin(50);
  c->d.compression = coin(15)   ? HVD_COMPRESS_FP16
                     : coin(15) ? HVD_COMPRESS_BF16
                                : HVD_COMPRESS_NONE;
  c->max_norm = coin(25) ? 0.05 * (double)(1 + draw(10)) : 0;
  int has16 = 0;
  for (int p = 0; p < c->n; p++)
    has16 |= c->dt[p] == HVD_FLOAT16;
  c->scaling = has16 || coin(15);
  c->steps = steps;
  c->inject_step = c->scaling && coin(60) ? (int)draw((uint64_t)steps) : -1;
  c->inject_rank = (int)draw((uint64_t)hvd_size());
  c->ckpt_step = coin(40) ? (int)draw((uint64_t)steps) : -1;
  for (int p = 0; device_mode && p < c->n; p++)
    c->on_dev[p] = coin(50);
  for (int p = 0; p < c->n; p++) /* float32 host parameters only */
    if (c->dt[p] == HVD_FLOAT32 && !c->on_dev[p] && coin(25))
      c->sparse[p] = c->d.shard_optimizer_state ? 1 : 1 + (int)draw(2);
  c->by_state = coin(50);
  for (int p = 0; c->kind == 4 && p < c->n; p++) { /* its step is ours */
    c->on_dev[p] = 0;
    c->lr_scale[p] = c->pwd[p] = NAN;
  }
  c->split = coin(25) && parity != NULL && !save_dir && !resume_dir;
  c->d.process_set = c->split ? parity : NULL;
  int low16 = 0; /* explicit gradient groups, where they may be */
  for (int p = 0; p < c->n; p++)
    low16 |= c->dt[p] != HVD_FLOAT32 && !c->d.reduce_fp32;
  if (!c->d.shard_optimizer_state && coin(30) &&
      !(low16 && c->d.compression != HVD_COMPRESS_NONE)) {
    if (coin(50)) {
      c->d.num_groups = 1 + (int)draw((uint64_t)c->n + 1);
    } else {
      for (int p = 0; p < c->n; p++)
        c->gids[p] = (int)draw(3) - 1;
      c->d.groups = c->gids;
    }
  }
}

/* The ranks whose gradients this rank's optimizer averages: its parity
 * set's, or every rank. */
static int nranks(const cfg_t *c) { return c->split ? nmembers : hvd_size(); }
static int rank_at(const cfg_t *c, int j) { return c->split ? members[j] : j; }
static int in_mine(const cfg_t *c, int r) {
  return !c->split || r % 2 == hvd_rank() % 2;
}

static void describe(const cfg_t *c, char *s, size_t cap) {
  size_t at = (size_t)snprintf(
      s, cap,
      "%s lr %g momentum %g nesterov %d wd %g; op %s passes %d average %d "
      "predivide %g shard %d fp32 %d wire %s groups %s; clip %g scaling %d "
      "inject step %d rank %d; %s step %d; %s; params",
      kinds[c->kind], c->lr, c->momentum, c->nesterov, c->wd,
      c->d.op == HVD_SUM ? "sum" : "average", c->d.backward_passes_per_step,
      c->d.average_passes, c->d.gradient_predivide_factor,
      c->d.shard_optimizer_state, c->d.reduce_fp32,
      c->d.compression == HVD_COMPRESS_FP16   ? "fp16"
      : c->d.compression == HVD_COMPRESS_BF16 ? "bf16"
                                              : "none",
      c->d.num_groups ? "num" : c->d.groups ? "ids" : "none", c->max_norm, c->scaling, c->inject_step, c->inject_rank,
      c->by_state ? "state commit" : "ckpt", c->ckpt_step,
      c->split ? "on the parity set" : "on the world");
  for (int p = 0; p < c->n && at < cap; p++)
    at += (size_t)snprintf(s + at, cap - at, " [%lld %s%s%s lrs %g wd %g]",
                           (long long)c->len[p], hvd_dtype_name(c->dt[p]),
                           c->on_dev[p] ? " gpu" : "",
                           c->sparse[p] == 1   ? " sparse-before"
                           : c->sparse[p] == 2 ? " sparse-after"
                                               : "",
                           c->lr_scale[p], c->pwd[p]);
}

typedef struct side {
  void *v[MAXP], *g[MAXP];   /* on the host; with a device side the copies */
  void *dv[MAXP], *dg[MAXP]; /* the device's, where the parameter is there */
  hvd_param_t p[MAXP];
  hvd_optimizer_t *opt;
} side_t;

static const char *const pnames[MAXP] = {"p0", "p1", "p2", "p3", "p4"};

/* Device buffers: a no-op without SOAK_CUDA (never on_dev then). */
static void *dev_alloc(const void *host, size_t bytes) {
  void *d = NULL;
#ifdef SOAK_CUDA
  cuda_ok(cudaMalloc(&d, bytes), "cudaMalloc");
  cuda_ok(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "to the device");
#else
  (void)host, (void)bytes;
#endif
  return d;
}

static void dev_copy(void *dst, const void *src, size_t bytes, int to_dev) {
#ifdef SOAK_CUDA
  cuda_ok(cudaMemcpy(dst, src, bytes,
                     to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
          "cudaMemcpy");
#else
  (void)dst, (void)src, (void)bytes, (void)to_dev;
#endif
}

static void dev_free(void *d) {
#ifdef SOAK_CUDA
  if (d != NULL)
    cuda_ok(cudaFree(d), "cudaFree");
#else
  (void)d;
#endif
}

static size_t bytes_of(const cfg_t *c, int p) {
  return (size_t)c->len[p] * hvdt_size(c->dt[p]);
}

/* The device's values into the host copies (after the device is done). */
static void pull(const cfg_t *c, side_t *s) {
#ifdef SOAK_CUDA
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  for (int p = 0; p < c->n; p++)
    if (s->dv[p] != NULL)
      dev_copy(s->v[p], s->dv[p], bytes_of(c, p), 0);
}

/* Parameter p's host gradient to the device, where it is there. */
static void push_grad(const cfg_t *c, side_t *s, int p) {
  if (s->dg[p] != NULL)
    dev_copy(s->dg[p], s->g[p], bytes_of(c, p), 1);
}

static void make_side(const cfg_t *c, side_t *s, int on_device) {
  memset(s, 0, sizeof *s);
  for (int p = 0; p < c->n; p++) {
    size_t es = hvdt_size(c->dt[p]);
    s->v[p] = hvdt_calloc((size_t)c->len[p], es);
    s->g[p] = hvdt_calloc((size_t)c->len[p], es);
    for (int64_t i = 0; i < c->len[p]; i++)
      hvdt_put(
          c->dt[p], s->v[p], i,
          (double)((int64_t)(mix((uint64_t)(p * 7919 + i)) % 2001) - 1000) /
              1000.0);
    s->p[p].name = pnames[p];
    s->p[p].value = hvd_tensor_make(s->v[p], c->dt[p], 1, &c->len[p]);
    s->p[p].grad = hvd_tensor_make(s->g[p], c->dt[p], 1, &c->len[p]);
    if (on_device && c->on_dev[p]) {
      s->dv[p] = dev_alloc(s->v[p], bytes_of(c, p));
      s->dg[p] = dev_alloc(s->g[p], bytes_of(c, p));
      s->p[p].value.data = s->dv[p];
      s->p[p].grad.data = s->dg[p];
      s->p[p].value.device = s->p[p].grad.device = dev;
    }
  }
}

static void drop_side(const cfg_t *c, side_t *s) {
  hvd_optimizer_destroy(s->opt);
  for (int p = 0; p < c->n; p++)
    free(s->v[p]), free(s->g[p]), dev_free(s->dv[p]), dev_free(s->dg[p]);
}

/* The custom optimizer (hvd_optimizer_custom): heavy-ball SGD of our own,
 * velocity = 0.5 velocity + grad, value -= lr velocity, on the float32
 * views hvd hands it (a low-precision parameter's master). */
static const char *const custom_state[] = {"velocity"};

static hvd_result_t custom_step(void *ctx, hvd_param_t *params, int n,
                                hvd_tensor_t *state, int64_t step, double lr) {
  (void)ctx, (void)step;
  for (int p = 0; p < n; p++) {
    float *w = params[p].value.data, *g = params[p].grad.data;
    float *v = state[p].data;
    for (int64_t i = 0; i < hvd_tensor_numel(&params[p].value); i++) {
      v[i] = 0.5f * v[i] + g[i];
      w[i] -= (float)lr * v[i];
    }
  }
  return HVD_SUCCESS;
}

/* The plain optimizer of c on s's parameters (NULL, with the message in
 * hvd_last_error, when refused). */
static hvd_optimizer_t *plain(const cfg_t *c, side_t *s) {
  hvd_optimizer_t *o = NULL;
  hvd_result_t rc;
  if (c->kind == 0) {
    hvd_sgd_options_t so;
    hvd_sgd_options_init(&so);
    so.lr = c->lr, so.momentum = c->momentum, so.nesterov = c->nesterov;
    so.weight_decay = c->wd;
    rc = hvd_sgd_create(s->p, c->n, &so, &o);
  } else if (c->kind <= 2) {
    hvd_adam_options_t ao;
    hvd_adam_options_init(&ao);
    ao.lr = c->lr, ao.weight_decay = c->wd, ao.decoupled = c->kind == 2;
    rc = hvd_adam_create(s->p, c->n, &ao, &o);
  } else if (c->kind == 3) {
    hvd_lamb_options_t lo;
    hvd_lamb_options_init(&lo);
    lo.lr = c->lr, lo.weight_decay = c->wd;
    rc = hvd_lamb_create(s->p, c->n, &lo, &o);
  } else {
    const hvd_optimizer_ops_t ops = {"soak-heavy-ball", 1, custom_state,
                                     custom_step, NULL};
    rc = hvd_optimizer_custom(s->p, c->n, &ops, NULL, &o);
    if (rc == HVD_SUCCESS)
      rc = hvd_optimizer_set_lr(o, c->lr);
  }
  for (int p = 0; rc == HVD_SUCCESS && p < c->n; p++) {
    if (c->lr_scale[p] == c->lr_scale[p])
      rc = hvd_optimizer_set_param_lr_scale(o, p, c->lr_scale[p]);
    if (rc == HVD_SUCCESS && c->pwd[p] == c->pwd[p])
      rc = hvd_optimizer_set_param_weight_decay(o, p, c->pwd[p]);
  }
  if (rc == HVD_SUCCESS && c->max_norm > 0)
    rc = hvd_optimizer_set_grad_clipping(o, c->max_norm, 2);
  if (rc == HVD_SUCCESS && c->scaling) {
    /* 2^10: every rank's and pass's sum stays within float16's range */
    hvd_loss_scale_options_t l;
    hvd_loss_scale_options_init(&l);
    l.init_scale = 1024;
    rc = hvd_optimizer_set_loss_scaling(o, &l);
  }
  if (rc != HVD_SUCCESS) {
    hvd_optimizer_destroy(o);
    return NULL;
  }
  return o;
}

/* Rank r's gradient element before the loss scale: a multiple of 1/64
 * of magnitude 1/8 to 1/4, its sign the element's and the step's alone,
 * so that the ranks' and passes' sum never cancels to about 0: Adam's
 * first step divides a gradient by its own magnitude, and would make the
 * rounding noise of a near-zero sum (1/3 applied before or after it) a
 * whole step. */
static double sign_of(int step, int p, int64_t i) {
  return mix(((uint64_t)step << 36) ^ ((uint64_t)p << 28) ^ (uint64_t)i) & 1
             ? -1.0
             : 1.0;
}

static double grad_of(int r, int step, int pass, int p, int64_t i) {
  uint64_t h = mix(((uint64_t)r << 48) ^ ((uint64_t)step << 36) ^
                   ((uint64_t)pass << 32) ^ ((uint64_t)p << 28) ^ (uint64_t)i);
  return sign_of(step, p, i) * (double)(8 + h % 9) / 64.0;
}

/* Rank r's sparse rows of parameter p at a step (c->sparse[p]): 1 to
 * SPARSE_MAX rows (a row may repeat), each value 1/64 to 4/64 of its
 * element's sign, times the loss scale. Their count. */
#define SPARSE_MAX 4
static int sparse_of(const cfg_t *c, int r, int step, int p, double scale,
                     int64_t *rows, float *vals) {
  uint64_t h =
      mix(((uint64_t)r << 40) ^ ((uint64_t)step << 20) ^ (uint64_t)(p + 77));
  int n = 1 + (int)(h % SPARSE_MAX);
  for (int k = 0; k < n; k++) {
    uint64_t x = mix(h + (uint64_t)k + 1);
    rows[k] = (int64_t)(x % (uint64_t)c->len[p]);
    vals[k] = (float)(sign_of(step, p, rows[k]) * (double)(1 + (x >> 32) % 4) /
                      64.0 * scale);
  }
  return n;
}

static hvd_result_t sparse_call(const cfg_t *c, side_t *s, int step, int p,
                                double scale) {
  int64_t rows[SPARSE_MAX];
  float vals[SPARSE_MAX];
  int n = sparse_of(c, hvd_rank(), step, p, scale, rows, vals);
  n_sparse++;
  return hvd_optimizer_sparse_grad(s->opt, p, rows, n, vals);
}

static int injected(const cfg_t *c, int r, int step, int pass, int p,
                    int64_t i) {
  return step == c->inject_step && r == c->inject_rank &&
         pass == c->d.backward_passes_per_step - 1 && p == 0 && i == 0;
}

/* One step's passes on this rank's side. */
static hvd_result_t dist_passes(const cfg_t *c, side_t *s, int step,
                                double scale) {
  const int rank = hvd_rank();
  for (int pass = 0; pass < c->d.backward_passes_per_step; pass++)
    for (int p = c->n - 1; p >= 0; p--) {
      for (int64_t i = 0; i < c->len[p]; i++) {
        double g = injected(c, rank, step, pass, p, i)
                       ? INFINITY
                       : grad_of(rank, step, pass, p, i) * scale;
        hvdt_put(c->dt[p], s->g[p], i, hvdt_get(c->dt[p], s->g[p], i) + g);
      }
      hvd_result_t rc = HVD_SUCCESS;
      if (pass == 0 && c->sparse[p] == 1)
        rc = sparse_call(c, s, step, p, scale);
      push_grad(c, s, p);
      if (rc == HVD_SUCCESS)
        rc = hvd_optimizer_grad_ready(s->opt, p);
      if (rc == HVD_SUCCESS && c->sparse[p] == 2 &&
          pass == c->d.backward_passes_per_step - 1)
        rc = sparse_call(c, s, step, p, scale);
      if (rc != HVD_SUCCESS)
        return rc;
    }
  return HVD_SUCCESS;
}

/* The reference's gradients: every rank's (of the set), every pass,
 * divided. */
static void ref_grads(const cfg_t *c, side_t *s, int step, double scale) {
  const int size = nranks(c), k = c->d.backward_passes_per_step;
  double div =
      (c->d.op == HVD_AVERAGE ? size : 1) * (c->d.average_passes ? k : 1);
  for (int p = 0; p < c->n; p++) {
    double *t = hvdt_calloc((size_t)c->len[p], sizeof *t);
    for (int64_t i = 0; i < c->len[p]; i++)
      for (int j = 0; j < size; j++)
        for (int pass = 0; pass < k; pass++)
          t[i] += injected(c, rank_at(c, j), step, pass, p, i)
                      ? INFINITY
                      : grad_of(rank_at(c, j), step, pass, p, i) * scale;
    for (int j = 0; j < size && c->sparse[p]; j++) {
      const int r = rank_at(c, j);
      int64_t rows[SPARSE_MAX];
      float vals[SPARSE_MAX];
      int n = sparse_of(c, r, step, p, scale, rows, vals);
      for (int q = 0; q < n; q++)
        t[rows[q]] += vals[q];
    }
    for (int64_t i = 0; i < c->len[p]; i++)
      hvdt_put(c->dt[p], s->g[p], i, t[i] / div);
    free(t);
  }
}

/* How far the distributed values may be from the reference's, relative
 * to the parameter's largest value: what rounds on the way. */
static double tolerance(const cfg_t *c, int p) {
  double tol = 2e-5 * c->steps;
  if (c->d.compression != HVD_COMPRESS_NONE || c->dt[p] != HVD_FLOAT32)
    tol = 2e-2;
  return tol;
}

static double worst(const cfg_t *c, const side_t *d, const side_t *r,
                    int *p_out) {
  double w = 0;
  for (int p = 0; p < c->n; p++) {
    double big = 1, e = 0; /* at least the initial values' range */
    for (int64_t i = 0; i < c->len[p]; i++) {
      double a = hvdt_get(c->dt[p], d->v[p], i);
      double b = hvdt_get(c->dt[p], r->v[p], i);
      big = fmax(big, fabs(b));
      e = fmax(e, a == a ? fabs(a - b) : INFINITY);
    }
    if (e / big / tolerance(c, p) > w) {
      w = e / big / tolerance(c, p);
      *p_out = p;
    }
  }
  return w;
}

/* The values now (after the device's work), copied into copy. */
static void keep_values(const cfg_t *c, side_t *d, void *copy[MAXP]) {
  pull(c, d);
  for (int p = 0; p < c->n; p++) {
    copy[p] = hvdt_calloc(bytes_of(c, p), 1);
    memcpy(copy[p], d->v[p], bytes_of(c, p));
  }
}

/* Whether the values are keep_values' copy again, bit for bit; frees it. */
static int values_back(const cfg_t *c, side_t *d, void *copy[MAXP]) {
  int same = 1;
  pull(c, d);
  for (int p = 0; p < c->n; p++) {
    same &= memcmp(copy[p], d->v[p], bytes_of(c, p)) == 0;
    free(copy[p]);
  }
  return same;
}

/* hvd_optimizer_zero_grad, and the host copies of device gradients. */
static hvd_result_t zero_grads(const cfg_t *c, side_t *d) {
  for (int p = 0; p < c->n; p++)
    if (d->dg[p] != NULL)
      memset(d->g[p], 0, bytes_of(c, p));
  return hvd_optimizer_zero_grad(d->opt);
}

/* Save, scribble over the values, load: the same bits back. */
static int round_trip(const cfg_t *c, side_t *d, const char *dir, int step) {
  char path[512];
  void *copy[MAXP];
  int64_t got = -1;
  snprintf(path, sizeof path, "%s/ckpt%d", dir,
           c->split ? hvd_rank() % 2 : 0); /* a set's own file */
  if (hvd_checkpoint_save(path, d->p, c->n, d->opt, step) != HVD_SUCCESS) {
    diag("save: %s", hvd_last_error());
    return 0;
  }
  keep_values(c, d, copy);
  for (int p = 0; p < c->n; p++) {
    memset(d->v[p], 0x7f, bytes_of(c, p));
    if (d->dv[p] != NULL)
      dev_copy(d->dv[p], d->v[p], bytes_of(c, p), 1);
  }
  hvd_result_t rc = hvd_checkpoint_load(path, d->p, c->n, d->opt, &got);
  if (rc != HVD_SUCCESS)
    diag("load: %s", hvd_last_error());
  int same = values_back(c, d, copy);
  return rc == HVD_SUCCESS && same && got == step;
}

/* An hvd_state commit, then a step of other gradients, then the restore:
 * the values, update count and loss scale of the commit back (the state
 * the next steps show against the reference). */
static int state_trip(const cfg_t *c, side_t *d, int step) {
  hvd_state_t *st = NULL;
  void *copy[MAXP];
  int restored = 0;
  int64_t steps = hvd_optimizer_steps(d->opt);
  double scale = hvd_optimizer_loss_scale(d->opt);
  hvd_result_t rc = hvd_state_create(NULL, 1, &st);
  if (rc == HVD_SUCCESS)
    rc = hvd_state_add_params(st, d->p, c->n, d->opt);
  if (rc == HVD_SUCCESS)
    rc = hvd_state_commit(st);
  keep_values(c, d, copy);
  if (rc == HVD_SUCCESS)
    rc = dist_passes(c, d, step + 1000, scale);
  if (rc == HVD_SUCCESS)
    rc = hvd_optimizer_step(d->opt);
  if (rc == HVD_SUCCESS)
    rc = hvd_state_restore(st, &restored);
  if (rc == HVD_SUCCESS)
    rc = zero_grads(c, d);
  if (rc != HVD_SUCCESS)
    diag("hvd_state: %s", hvd_last_error());
  int same = values_back(c, d, copy);
  hvd_state_destroy(st);
  return rc == HVD_SUCCESS && restored && same &&
         hvd_optimizer_steps(d->opt) == steps &&
         hvd_optimizer_loss_scale(d->opt) == scale;
}

/* One step of both sides; 0 and a reason in why on any difference. */
static int one_step(const cfg_t *c, side_t *d, side_t *r, int step, char *why,
                    size_t cap) {
  double ds = hvd_optimizer_loss_scale(d->opt);
  double rs = hvd_optimizer_loss_scale(r->opt);
  if (ds != rs) {
    snprintf(why, cap, "step %d: loss scale %g vs the reference's %g", step, ds,
             rs);
    return 0;
  }
  hvd_result_t rc = dist_passes(c, d, step, ds);
  if (rc == HVD_SUCCESS)
    rc = hvd_optimizer_step(d->opt);
  ref_grads(c, r, step, rs);
  hvd_result_t rr = hvd_optimizer_step(r->opt);
  if (rc != HVD_SUCCESS || rr != HVD_SUCCESS) {
    snprintf(why, cap, "step %d: %d %d: %s", step, rc, rr, hvd_last_error());
    return 0;
  }
  int sk = hvd_optimizer_step_skipped(d->opt);
  int want = step == c->inject_step && in_mine(c, c->inject_rank);
  n_skipped += sk;
  n_steps++;
  if (sk != hvd_optimizer_step_skipped(r->opt) ||
      hvd_optimizer_steps(d->opt) != hvd_optimizer_steps(r->opt) ||
      sk != want) {
    snprintf(why, cap,
             "step %d: skipped %d vs %d (want %d), steps %lld vs %lld", step,
             sk, hvd_optimizer_step_skipped(r->opt), want,
             (long long)hvd_optimizer_steps(d->opt),
             (long long)hvd_optimizer_steps(r->opt));
    return 0;
  }
  rc = c->split ? hvd_ps_verify_parameters(parity, d->p, c->n)
                : hvd_verify_parameters(d->p, c->n);
  if (rc != HVD_SUCCESS) {
    snprintf(why, cap, "step %d: %s", step, hvd_last_error());
    return 0;
  }
  int p = 0;
  pull(c, d);
  double w = worst(c, d, r, &p);
  if (!(w <= 1)) {
    snprintf(why, cap, "step %d: parameter %d is %g tolerances away", step, p,
             w);
    return 0;
  }
  if (zero_grads(c, d) != HVD_SUCCESS ||
      hvd_optimizer_zero_grad(r->opt) != HVD_SUCCESS) {
    snprintf(why, cap, "step %d: zero_grad: %s", step, hvd_last_error());
    return 0;
  }
  return 1;
}

/* Every rank's verdict: the worst. */
static int all_ok(int mine) {
  int32_t v = mine;
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&v, HVD_INT32, 1, &one);
  if (hvd_allreduce("soak.verdict", &t, &t, HVD_MIN, 1, 1) != HVD_SUCCESS)
    bail("verdict: %s", hvd_last_error());
  return v;
}

/* --save-dir: each configuration's end saved as DIR/cfg<k>; --resume-dir:
 * each starts from DIR/cfg<k> (both sides load it), e.g. one written at
 * another world size. */

/* Both sides from resume_dir's file of configuration k: 1 when both load
 * it and hold the same bits, 0 when not, -1 when there is no such file
 * (its configuration was refused where it was written). */
static int resume(const cfg_t *c, side_t *d, side_t *r, int k, char *why,
                  size_t cap) {
  char path[512];
  int64_t sd = -1, sr = -1;
  snprintf(path, sizeof path, "%s/cfg%d", resume_dir, k);
  if (access(path, R_OK) != 0)
    return -1;
  hvd_result_t rc = hvd_checkpoint_load(path, d->p, c->n, d->opt, &sd);
  if (rc == HVD_SUCCESS)
    rc = hvd_checkpoint_load(path, r->p, c->n, r->opt, &sr);
  if (rc != HVD_SUCCESS) {
    snprintf(why, cap, "resume: %s", hvd_last_error());
    return 0;
  }
  pull(c, d);
  int same =
      sd == sr && hvd_optimizer_steps(d->opt) == hvd_optimizer_steps(r->opt);
  for (int p = 0; p < c->n; p++)
    same &= memcmp(d->v[p], r->v[p], bytes_of(c, p)) == 0;
  if (!same)
    snprintf(why, cap, "resume: the two sides loaded different values");
  return same;
}

/* 1: passed, 0: failed, -1: refused at creation. */
static int run(const cfg_t *c, int k, const char *dir, char *why, size_t cap) {
  side_t d, r;
  make_side(c, &d, 1);
  make_side(c, &r, 0);
  r.opt = plain(c, &r);
  hvd_optimizer_t *b = plain(c, &d);
  int res = -1;
  if (r.opt == NULL || b == NULL ||
      hvd_distributed_optimizer(b, &c->d, &d.opt) != HVD_SUCCESS) {
    snprintf(why, cap, "%s", hvd_last_error());
    if (d.opt == NULL)
      hvd_optimizer_destroy(b);
    goto out;
  }
  res = 1;
  if (resume_dir != NULL && (res = resume(c, &d, &r, k, why, cap)) == 1)
    n_resumed++;
  if (res >= 0)
    res = all_ok(res);
  for (int step = 0; step < c->steps && res == 1; step++) {
    res = all_ok(one_step(c, &d, &r, step, why, cap));
    n_ckpt += res == 1 && step == c->ckpt_step;
    if (res == 1 && step == c->ckpt_step &&
        !all_ok(c->by_state ? state_trip(c, &d, step)
                            : round_trip(c, &d, dir, step))) {
      snprintf(why, cap, "step %d: the %s round trip", step,
               c->by_state ? "hvd_state" : "checkpoint");
      res = 0;
    }
  }
  if (res == 1 && save_dir != NULL) {
    char path[512];
    snprintf(path, sizeof path, "%s/cfg%d", save_dir, k);
    if (!all_ok(hvd_checkpoint_save(path, d.p, c->n, d.opt, c->steps) ==
                HVD_SUCCESS)) {
      snprintf(why, cap, "save to %s: %s", path, hvd_last_error());
      res = 0;
    }
  }
out:
  drop_side(c, &d);
  drop_side(c, &r);
  return res;
}

int main(int argc, char **argv) {
  int configs = 50, steps = 6;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i++)
    device_mode |= strcmp(argv[i], "--device") == 0;
#ifdef SOAK_CUDA
  int ndev = 0;
  cudaError_t dev_err = cudaGetDeviceCount(&ndev); /* before MPI starts */
#endif
  tap_mpi_init(&argc, &argv);
#ifdef SOAK_CUDA
  if (device_mode) { /* a GPU each, else all on the first */
    gpu_devices_or_skip(dev_err, ndev);
    dev = ndev >= tap_size() ? tap_rank() % ndev : 0;
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  }
#elif defined(SOAK_NO_CUDA)
  if (device_mode)
    skip_all("%s", GPU_TEST_NO_CUDA);
#else
  if (device_mode)
    bail("--device: this soak was built without CUDA (t/standin/optim_soak "
         "and t/gpu/optim_soak have it)");
#endif
  for (int i = 1; i + 1 < argc; i++) {
    if (strcmp(argv[i], "--device") == 0)
      continue; /* a flag: no value */
    if (strcmp(argv[i], "--configs") == 0)
      configs = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--seed") == 0)
      seed = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--steps") == 0)
      steps = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--save-dir") == 0)
      save_dir = argv[i + 1];
    else if (strcmp(argv[i], "--resume-dir") == 0)
      resume_dir = argv[i + 1];
    i++;
  }
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  if (hvd_size() >= 2 && hvd_size() <= 64) {
    if (hvd_process_set_split(hvd_rank() % 2, &parity) != HVD_SUCCESS)
      bail("split: %s", hvd_last_error());
    for (int r = hvd_rank() % 2; r < hvd_size(); r += 2)
      members[nmembers++] = r;
  }
  char dir[256];
  hvdt_shared_tmpdir(dir, sizeof dir, "optim_soak");
  int refused = 0, passed = 0;
  for (int k = 0; k < configs; k++) {
    cfg_t c;
    char why[1024] = "", what[1024];
    draw_cfg(&c, seed, k, steps);
    describe(&c, what, sizeof what);
    int res = run(&c, k, dir, why, sizeof why);
    if (res < 0) {
      refused++;
      if (getenv("HVD_SOAK_VERBOSE") != NULL)
        diag("config %d refused: %s", k, why);
      continue;
    }
    if (!ok(res == 1, "config %d: %d steps against the reference", k, steps)) {
      diag("config %d (seed %llu): %s", k, (unsigned long long)seed, what);
      if (why[0] != '\0')
        diag_all("%s", why);
    }
    passed += res == 1;
    n_split += res == 1 && c.split;
    n_groups += res == 1 && (c.d.num_groups > 0 || c.d.groups != NULL);
  }
  diag("%d configurations: %d passed, %d refused at creation; %d steps, %d "
       "skipped for an inf, %d checkpoint round trips, %d sparse handovers, "
       "%d resumed from another run's checkpoint, %d on a process set, %d "
       "with gradient groups",
       configs, passed, refused, n_steps, n_skipped, n_ckpt, n_sparse,
       n_resumed, n_split, n_groups);
  hvdt_remove_tmpdir(dir);
  hvd_process_set_destroy(parity);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
