/*
 * mixed.c - mixed precision in the optimizers (lib/optim/mixed.c) on host
 * parameters, through the distributed optimizer, at np 1..4.
 *
 * The model: one parameter w of N elements, rank r's loss
 * 0.5 * sum_i (w_i - t_r,i)^2, so its gradient is w - t_r (computed in
 * float from the parameter's value as stored) and the average over ranks
 * pulls w towards the mean target. AdamW, lr 0.02, S steps. Runs:
 *  - float32: the reference, w recorded after every step;
 *  - bfloat16 values and gradients (reduced in bfloat16): the master
 *    weights within BF16_TOL of the float32 run's after S steps, the value
 *    the master rounded to bfloat16, the optimizer's state float32;
 *  - bfloat16 with reduce_fp32: within BF16_FP32_TOL (closer);
 *  - float16 with dynamic loss scaling (default: 2^16): the scaled
 *    gradients overflow float16 at first, so the first steps are skipped
 *    (on every rank alike) and the scale halves each time, until it fits;
 *    after S steps, with k skipped, the masters are within FP16_TOL of the
 *    float32 run after S - k steps, and the scale is 2^16 / 2^k;
 *  - an injected overflow: at step 5 the last rank's gradient has an inf;
 *    every rank skips that step (hvd_optimizer_step_skipped 1, steps and
 *    masters unchanged, bit for bit) and halves its scale;
 *  - growth: growth_interval 3, so the scale doubles after every 3 clean
 *    steps;
 *  - a checkpoint of the float16 run after 6 steps, then 4 more steps;
 *    loaded into a fresh float16 optimizer, 4 steps give the same masters,
 *    values, scale and step count bit for bit; the same file loads into a
 *    float32 model as its masters, exactly;
 *  - hvd_state with a bfloat16 model: commit, steps, restore, the same
 *    steps again give the same values bit for bit (masters committed);
 *  - ZeRO-1 (shard_optimizer_state): bfloat16, bfloat16 with reduce_fp32
 *    and float16 with loss scaling, each equal to the unsharded run bit
 *    for bit (values, scale, steps);
 *  - a sync step that fails (the ranks' learning rates differ, np >= 2)
 *    after reduce_fp32 made its float32 gradients, then a no-sync step:
 *    that step's own gradient updates, not the failed step's copy;
 *  - the scale stays finite: growth that would overflow leaves it as it
 *    is (torch's GradScaler), so that a backoff brings it down again and
 *    the steps after it update;
 *  - post-local SGD: a step skipped for an inf does not average; the
 *    next one, with the same count, does;
 *  - empty bfloat16 parameters of different shapes (data NULL): their
 *    checkpoint (plain, distributed, sharded) loads into float32 and
 *    back;
 *  - hvd_optimizer_step_skipped 0 after a failed step and after each
 *    restore of the state (hvd_state, a load, a state broadcast);
 *  - a float32 file beyond float16's range loaded into a float16 model:
 *    values +-inf, masters the file's;
 *  - no-sync steps with loss scaling agree on an inf (every rank skips
 *    alike, the synced step after passes the hyperparameter check); a
 *    no-sync step more on one rank fails naming the agreement;
 *  - refusals: a grad of another dtype than its value, sparse rows into a
 *    bfloat16 parameter, loss-scale options out of range; each with its
 *    exact message.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "mixed_model.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 257
#define S 24
#define BF16_TOL 0.05      /* absolute, values of order 1 */
#define BF16_FP32_TOL 0.02 /* reduced in float32 */
#define FP16_TOL 0.01

static int rank, size;
static char dir[512];

static float target(int r, int i) {
  return (float)(((i * 7 + r * 13) % 17) - 8) / 4.0f;
}

/* This rank's gradient times scale, stored in the model's dtype; inf at
 * element 0 when poison. */
static void backward(model_t *m, double scale, int poison) {
  for (int i = 0; i < N; i++) {
    float w = (float)hvdt_get(m->dt, m->w, i);
    hvdt_put(m->dt, m->g, i, (double)((w - target(rank, i)) * (float)scale));
  }
  if (poison)
    hvdt_put(m->dt, m->g, 0, INFINITY);
}

static hvd_optimizer_t *make_opt(model_t *m, int reduce_fp32, int scaling) {
  return model_adamw(m, reduce_fp32, scaling, 0);
}

/* One step: zero, backward (scaled by the optimizer's scale), step. */
static int step(model_t *m, hvd_optimizer_t *opt, int poison) {
  if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
    return 0;
  backward(m, hvd_optimizer_loss_scale(opt), poison);
  hvd_result_t rc = hvd_optimizer_step(opt);
  if (rc != HVD_SUCCESS)
    tap_note("step: %s", hvd_last_error());
  return rc == HVD_SUCCESS;
}

static float ref[S + 1][N]; /* the float32 run's w after each step */

static void test_reference(void) {
  model_t m;
  model_make(&m, HVD_FLOAT32, N, 0.5);
  hvd_optimizer_t *opt = make_opt(&m, 0, 0);
  int good = 1;
  memcpy(ref[0], m.w, sizeof ref[0]);
  for (int s = 1; s <= S; s++) {
    good &= step(&m, opt, 0);
    memcpy(ref[s], m.w, sizeof ref[s]);
  }
  ok(good, "float32: %d steps", S);
  ok(fabsf(ref[S][0] - 0.5f) > 0.1f, "float32: w moved (w[0] %g)",
     (double)ref[S][0]);
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* The masters, read through a checkpoint (which holds them) loaded into a
 * float32 parameter; the largest |master - ref[s]|, and whether every
 * value is its master rounded. */
static double master_diff(const hvd_optimizer_t *opt, const model_t *m, int s,
                          float *master, int *rounded) {
  /* the masters, through a checkpoint-free route: save and read back */
  char path[600];
  snprintf(path, sizeof path, "%s/m.ckpt", dir);
  int64_t n = N;
  if (hvd_checkpoint_save(path, &m->p, 1, opt, 0) != HVD_SUCCESS)
    bail("save: %s", hvd_last_error());
  float g32[N];
  hvd_param_t q = {"w", hvd_tensor_make(master, HVD_FLOAT32, 1, &n),
                   hvd_tensor_make(g32, HVD_FLOAT32, 1, &n)};
  if (hvd_checkpoint_load(path, &q, 1, NULL, NULL) != HVD_SUCCESS)
    bail("load into float32: %s", hvd_last_error());
  double worst = 0;
  *rounded = 1;
  for (int i = 0; i < N; i++) {
    double d = fabs((double)master[i] - (double)ref[s][i]);
    worst = d > worst ? d : worst;
    *rounded &= hvdt_get(m->dt, m->w, i) == hvdt_as_dtype(m->dt, master[i]);
  }
  return worst;
}

static void test_low(hvd_dtype_t dt, int reduce_fp32, double tol) {
  const char *what = dt == HVD_BFLOAT16 && reduce_fp32 ? "bfloat16, reduce_fp32"
                     : dt == HVD_BFLOAT16              ? "bfloat16"
                                                       : "float16, scaled";
  int scaling = dt == HVD_FLOAT16;
  model_t m;
  model_make(&m, dt, N, 0.5);
  hvd_optimizer_t *opt = make_opt(&m, reduce_fp32, scaling);
  int good = 1, skipped = 0;
  for (int s = 1; s <= S; s++) {
    good &= step(&m, opt, 0);
    skipped += hvd_optimizer_step_skipped(opt);
  }
  ok(good, "%s: %d steps", what, S);
  is_int(S - skipped, (int)hvd_optimizer_steps(opt),
         "%s: steps counts the updates (%d skipped)", what, skipped);
  if (scaling) {
    ok(skipped >= 1 && skipped <= 6,
       "%s: the first steps overflowed and were skipped (%d)", what, skipped);
    ok(hvd_optimizer_loss_scale(opt) == ldexp(65536.0, -skipped),
       "%s: the scale halved each time: %g", what,
       hvd_optimizer_loss_scale(opt));
  }
  float master[N];
  int rounded;
  double d = master_diff(opt, &m, S - skipped, master, &rounded);
  ok(d <= tol, "%s: masters within %g of float32's after %d steps (%g)", what,
     tol, S - skipped, d);
  ok(rounded, "%s: every value is its master rounded to %s", what,
     hvd_dtype_name(dt));
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

static void test_injected(void) {
  model_t m;
  model_make(&m, HVD_FLOAT16, N, 0.5);
  hvd_optimizer_t *opt = make_opt(&m, 0, 1);
  hvd_loss_scale_options_t lo;
  hvd_loss_scale_options_init(&lo);
  lo.init_scale = 256; /* no overflow of its own */
  lo.growth_interval = 3;
  if (hvd_optimizer_set_loss_scaling(opt, &lo) != HVD_SUCCESS)
    bail("set_loss_scaling: %s", hvd_last_error());
  int good = 1;
  for (int s = 1; s <= 4; s++)
    good &= step(&m, opt, 0) && !hvd_optimizer_step_skipped(opt);
  ok(good, "injected: 4 clean steps");
  ok(hvd_optimizer_loss_scale(opt) == 512,
     "growth: the scale doubled after 3 clean steps (%g)",
     hvd_optimizer_loss_scale(opt));
  char before[2 * N];
  memcpy(before, m.w, sizeof before);
  int64_t steps = hvd_optimizer_steps(opt);
  good = step(&m, opt, rank == size - 1);
  ok(good, "injected: the step with an inf on rank %d returns", size - 1);
  is_int(1, hvd_optimizer_step_skipped(opt), "injected: skipped on rank %d",
         rank);
  ok(hvd_optimizer_steps(opt) == steps &&
         memcmp(before, m.w, sizeof before) == 0,
     "injected: no update, values unchanged bit for bit");
  ok(hvd_optimizer_loss_scale(opt) == 256, "injected: the scale halved (%g)",
     hvd_optimizer_loss_scale(opt));
  good = step(&m, opt, 0) && !hvd_optimizer_step_skipped(opt);
  ok(good && hvd_optimizer_steps(opt) == steps + 1,
     "injected: the next step updates again");
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

static void test_checkpoint(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/fp16.ckpt", dir);
  model_t a, b;
  model_make(&a, HVD_FLOAT16, N, 0.5);
  model_make(&b, HVD_FLOAT16, N, 0.5);
  hvd_optimizer_t *oa = make_opt(&a, 0, 1), *ob = NULL;
  int good = 1;
  for (int s = 1; s <= 6; s++)
    good &= step(&a, oa, 0);
  good &= hvd_checkpoint_save(path, &a.p, 1, oa, 6) == HVD_SUCCESS;
  for (int s = 1; s <= 4; s++)
    good &= step(&a, oa, 0);
  ok(good, "checkpoint: 6 steps, saved, 4 more");
  ob = make_opt(&b, 0, 1);
  int64_t at = -1;
  hvd_result_t rc = hvd_checkpoint_load(path, &b.p, 1, ob, &at);
  is_int(HVD_SUCCESS, rc, "checkpoint: loads into a fresh float16 optimizer");
  tap_note("%s", hvd_last_error());
  good = at == 6;
  for (int s = 1; s <= 4; s++)
    good &= step(&b, ob, 0);
  ok(good, "checkpoint: 4 steps after it");
  ok(memcmp(a.w, b.w, 2 * N) == 0, "checkpoint: values equal bit for bit");
  ok(hvd_optimizer_loss_scale(oa) == hvd_optimizer_loss_scale(ob) &&
         hvd_optimizer_steps(oa) == hvd_optimizer_steps(ob),
     "checkpoint: scale %g and steps %lld equal", hvd_optimizer_loss_scale(ob),
     (long long)hvd_optimizer_steps(ob));
  char pa[600], pb[600];
  snprintf(pa, sizeof pa, "%s/a.ckpt", dir);
  snprintf(pb, sizeof pb, "%s/b.ckpt", dir);
  good = hvd_checkpoint_save(pa, &a.p, 1, oa, 10) == HVD_SUCCESS &&
         hvd_checkpoint_save(pb, &b.p, 1, ob, 10) == HVD_SUCCESS;
  ok(good && (rank != 0 || hvdt_same_file(pa, pb)),
     "checkpoint: the two optimizers save the same file (masters, state, "
     "scale)");
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

/* hvd_state with a bfloat16 model: commit after 3 steps, 2 more, restore
 * from memory; 2 steps again give the same values as the first time, bit
 * for bit (the masters were committed, not the rounded values). */
static void test_state(void) {
  model_t m;
  model_make(&m, HVD_BFLOAT16, N, 0.5);
  hvd_optimizer_t *opt = make_opt(&m, 0, 0);
  hvd_state_t *st = NULL;
  int good = hvd_state_create(NULL, 1, &st) == HVD_SUCCESS &&
             hvd_state_add_params(st, &m.p, 1, opt) == HVD_SUCCESS;
  for (int s = 1; s <= 3; s++)
    good &= step(&m, opt, 0);
  good &= hvd_state_commit(st) == HVD_SUCCESS;
  char first[2 * N];
  for (int s = 1; s <= 2; s++)
    good &= step(&m, opt, 0);
  memcpy(first, m.w, sizeof first);
  int restored = 0;
  good &= hvd_state_restore(st, &restored) == HVD_SUCCESS && restored == 1;
  for (int s = 1; s <= 2; s++)
    good &= step(&m, opt, 0);
  ok(good, "state: commit, 2 steps, restore, 2 steps");
  ok(memcmp(first, m.w, sizeof first) == 0,
     "state: the same values after the restore, bit for bit");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* ZeRO-1 with low-precision parameters: the sharded optimizer's values,
 * scale and steps equal the unsharded one's bit for bit, S steps of
 * bfloat16, of bfloat16 with reduce_fp32, and of float16 with loss
 * scaling (its skipped first steps included). */
static void test_zero(hvd_dtype_t dt, int reduce_fp32) {
  const char *what = dt == HVD_FLOAT16 ? "float16, scaled"
                     : reduce_fp32     ? "bfloat16, reduce_fp32"
                                       : "bfloat16";
  int scaling = dt == HVD_FLOAT16;
  model_t a, b;
  model_make(&a, dt, N, 0.5);
  model_make(&b, dt, N, 0.5);
  hvd_optimizer_t *oa = model_adamw(&a, reduce_fp32, scaling, 0);
  hvd_optimizer_t *ob = model_adamw(&b, reduce_fp32, scaling, 1);
  int good = 1;
  for (int s = 1; s <= S; s++)
    good &= step(&a, oa, 0) && step(&b, ob, 0);
  ok(good, "ZeRO-1, %s: %d steps sharded and not", what, S);
  for (int i = 0; i < N; i++)
    if (hvdt_get(dt, a.w, i) != hvdt_get(dt, b.w, i)) {
      tap_note("element %d: %.9g unsharded, %.9g sharded", i,
               hvdt_get(dt, a.w, i), hvdt_get(dt, b.w, i));
      break;
    }
  ok(memcmp(a.w, b.w, 2 * N) == 0,
     "ZeRO-1, %s: the values equal the unsharded run's bit for bit", what);
  ok(hvd_optimizer_loss_scale(oa) == hvd_optimizer_loss_scale(ob) &&
         hvd_optimizer_steps(oa) == hvd_optimizer_steps(ob),
     "ZeRO-1, %s: scale %g and steps %lld equal", what,
     hvd_optimizer_loss_scale(ob), (long long)hvd_optimizer_steps(ob));
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

/* SGD, lr 1, on a bfloat16 [4] of zeros with reduce_fp32. */
static void test_failed_step(void) {
  if (size < 2)
    return;
  model_t m;
  model_make(&m, HVD_BFLOAT16, 4, 0.0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1.0;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.reduce_fp32 = 1;
  if (hvd_sgd_create(&m.p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &opt) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  hvd_optimizer_set_lr(opt, rank == 1 ? 0.5 : 1.0);
  for (int i = 0; i < 4; i++)
    hvdt_put(HVD_BFLOAT16, m.g, i, 1.0);
  hvd_optimizer_grad_ready(opt, 0); /* its float32 copy, reduced */
  is_int(HVD_ERR_MISMATCH, hvd_optimizer_step(opt),
         "failed step: the ranks' learning rates differ");
  hvd_optimizer_set_lr(opt, 1.0);
  hvd_optimizer_set_sync(opt, 0);
  hvd_optimizer_zero_grad(opt);
  for (int i = 0; i < 4; i++)
    hvdt_put(HVD_BFLOAT16, m.g, i, 8.0);
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "  then a no-sync step");
  ok(hvdt_get(HVD_BFLOAT16, m.w, 0) == -8.0 &&
         hvdt_get(HVD_BFLOAT16, m.w, 3) == -8.0,
     "  updated by its own gradient 8, not the failed step's 1 (%g)",
     hvdt_get(HVD_BFLOAT16, m.w, 0));
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

static void test_finite_scale(void) {
  model_t m;
  model_make(&m, HVD_FLOAT32, 2, 1.0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_optimizer_t *opt = NULL;
  if (hvd_sgd_create(&m.p, 1, &so, &opt) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  hvd_loss_scale_options_t lo;
  hvd_loss_scale_options_init(&lo);
  lo.init_scale = ldexp(1.0, 1000);
  lo.growth_factor = ldexp(1.0, 20);
  lo.growth_interval = 1;
  lo.backoff_factor = ldexp(1.0, -1000);
  if (hvd_optimizer_set_loss_scaling(opt, &lo) != HVD_SUCCESS)
    bail("set_loss_scaling: %s", hvd_last_error());
  int good = 1;
  for (int s = 0; s < 2; s++) /* clean (zero) gradients: growth */
    good &= hvd_optimizer_zero_grad(opt) == HVD_SUCCESS &&
            hvd_optimizer_step(opt) == HVD_SUCCESS;
  ok(good && hvd_optimizer_loss_scale(opt) == ldexp(1.0, 1020),
     "scale 2^1000, growth 2^20: 2^1020, then no further (%g)",
     hvd_optimizer_loss_scale(opt));
  good = hvd_optimizer_zero_grad(opt) == HVD_SUCCESS;
  for (int i = 0; i < 2; i++) /* 2^1020 in float32: inf */
    hvdt_put(HVD_FLOAT32, m.g, i, 1.0 * hvd_optimizer_loss_scale(opt));
  good = good && hvd_optimizer_step(opt) == HVD_SUCCESS &&
         hvd_optimizer_step_skipped(opt);
  ok(good && hvd_optimizer_loss_scale(opt) == ldexp(1.0, 20),
     "  an overflow: skipped, backoff 2^-1000 to 2^20 (%g)",
     hvd_optimizer_loss_scale(opt));
  hvd_optimizer_zero_grad(opt);
  for (int i = 0; i < 2; i++)
    hvdt_put(HVD_FLOAT32, m.g, i, 1.0 * hvd_optimizer_loss_scale(opt));
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "  a step with gradient 1");
  ok(!hvd_optimizer_step_skipped(opt) && hvdt_get(HVD_FLOAT32, m.w, 0) == 0.5,
     "  not skipped: w 1 - 0.5 (%g)", hvdt_get(HVD_FLOAT32, m.w, 0));
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* The spread of element 0 of w over the ranks (max - min). */
static double spread(const float *w) {
  float lo = w[0], hi = w[0];
  int64_t one = 1;
  hvd_tensor_t a = hvd_tensor_make(&lo, HVD_FLOAT32, 1, &one);
  hvd_tensor_t b = hvd_tensor_make(&hi, HVD_FLOAT32, 1, &one);
  if (hvd_allreduce("spread.min", &a, &a, HVD_MIN, 1, 1) != HVD_SUCCESS ||
      hvd_allreduce("spread.max", &b, &b, HVD_MAX, 1, 1) != HVD_SUCCESS)
    bail("spread: %s", hvd_last_error());
  return (double)hi - (double)lo;
}

/* Post-local SGD (period 2, no group) with loss scaling: a step skipped
 * for an inf (on every rank) is no step, so it does not average either
 * (DDP's averager is not called when GradScaler skips the step); the
 * next step, with the same count, does. np >= 2. */
static void test_local_skip(void) {
  if (size < 2)
    return;
  model_t m;
  model_make(&m, HVD_FLOAT32, 4, 1.0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.local_sgd.period = 2;
  if (hvd_sgd_create(&m.p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &opt) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(opt, NULL) != HVD_SUCCESS)
    bail("local sgd: %s", hvd_last_error());
  double after[4];
  int skipped[4];
  for (int t = 0; t < 4; t++) {
    hvd_optimizer_zero_grad(opt);
    for (int i = 0; i < 4; i++) /* rank r's gradient r + 1, scaled */
      hvdt_put(HVD_FLOAT32, m.g, i,
               (rank + 1) * hvd_optimizer_loss_scale(opt));
    if (t == 2 && rank == size - 1)
      hvdt_put(HVD_FLOAT32, m.g, 0, INFINITY);
    if (hvd_optimizer_step(opt) != HVD_SUCCESS)
      bail("local sgd step %d: %s", t, hvd_last_error());
    skipped[t] = hvd_optimizer_step_skipped(opt);
    after[t] = spread((const float *)m.w);
  }
  ok(after[0] == 0 && after[1] > 0,
     "local SGD, period 2: averaged after step 0, apart after step 1 "
     "(%g, %g)",
     after[0], after[1]);
  ok(skipped[2] && after[2] == after[1],
     "  step 2 skipped for an inf: no average either (spread %g)", after[2]);
  ok(!skipped[3] && after[3] == 0,
     "  the next step (the same count) updates and averages (%g)", after[3]);
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* No-sync steps with loss scaling (np >= 2): each still agrees on an
 * inf (hvd.h, hvd_optimizer_set_sync), so every rank skips the step in
 * which the last rank found one, and the synced step after them passes
 * the hyperparameter check (the scales and counts stayed equal). Then
 * rank 0 takes one no-sync step more while the others shut hvd down:
 * its step fails naming the agreement and why it is there. */
static void test_nosync_scaling(void) {
  if (size < 2)
    return;
  model_t m;
  model_make(&m, HVD_FLOAT32, 4, 1.0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_loss_scale_options_t lo;
  hvd_loss_scale_options_init(&lo);
  lo.init_scale = 4;
  if (hvd_sgd_create(&m.p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, NULL, &opt) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(opt, &lo) != HVD_SUCCESS ||
      hvd_optimizer_set_sync(opt, 0) != HVD_SUCCESS)
    bail("no-sync: %s", hvd_last_error());
  int skipped[3], good = 1;
  for (int t = 0; t < 3; t++) {
    if (t == 2)
      good &= hvd_optimizer_set_sync(opt, 1) == HVD_SUCCESS;
    good &= hvd_optimizer_zero_grad(opt) == HVD_SUCCESS;
    for (int i = 0; i < 4; i++) /* rank r's gradient r + 1, scaled */
      hvdt_put(HVD_FLOAT32, m.g, i,
               (rank + 1) * hvd_optimizer_loss_scale(opt));
    if (t == 0 && rank == size - 1)
      hvdt_put(HVD_FLOAT32, m.g, 0, INFINITY);
    hvd_result_t rc = hvd_optimizer_step(opt);
    if (rc != HVD_SUCCESS)
      tap_note("step %d: %s", t, hvd_last_error());
    good &= rc == HVD_SUCCESS;
    skipped[t] = hvd_optimizer_step_skipped(opt);
  }
  ok(good, "no-sync, scaled: two no-sync steps and a synced one");
  ok(skipped[0] && !skipped[1] && !skipped[2],
     "  the inf on rank %d skipped the first on every rank (%d %d %d)",
     size - 1, skipped[0], skipped[1], skipped[2]);
  /* scale 4 -> 2; w 1 - 0.5 (r + 1) alone, then - 0.5 * mean(r + 1) */
  double want = 1 - 0.5 * (rank + 1) - 0.5 * (size + 1) / 2.0;
  ok(hvd_optimizer_loss_scale(opt) == 2 && hvd_optimizer_steps(opt) == 2 &&
         hvdt_get(HVD_FLOAT32, m.w, 3) == want,
     "  scale 2, 2 updates, w %g (%g)", want, hvdt_get(HVD_FLOAT32, m.w, 3));
  good = hvd_optimizer_set_sync(opt, 0) == HVD_SUCCESS &&
         hvd_optimizer_zero_grad(opt) == HVD_SUCCESS;
  char msg[1024] = "";
  hvd_result_t rc = HVD_SUCCESS;
  if (rank == 0) {
    rc = hvd_optimizer_step(opt);
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  }
  good &= hvd_shutdown() == HVD_SUCCESS;
  static const char head[] =
      "hvd_optimizer_step: loss scaling's inf/NaN agreement, which every "
      "rank's step joins (no-sync steps too: every rank must take as "
      "many), failed: allreduce 'hvd.loss_scale.found_inf.w': hvd was shut "
      "down by rank ";
  tap_note("%s", msg);
  ok(good && (rank != 0 || (rc == HVD_ERR_SHUTDOWN &&
                            strncmp(msg, head, sizeof head - 1) == 0)),
     "  a no-sync step more on rank 0 while the others shut down: "
     "HVD_ERR_SHUTDOWN naming the agreement");
  is_int(HVD_SUCCESS, hvd_init(), "  hvd_init again");
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* Parameters a [0, 4] and b [0, 3] (empty, data NULL) and c [2] of
 * dtype dt; *opt: Adam over them, distributed (shard: ZeRO-1) or, with
 * plain, not. */
static void empty_model(hvd_param_t p[3], void *wc, void *gc, hvd_dtype_t dt,
                        int plain, int shard, hvd_optimizer_t **opt) {
  static int64_t sa[2] = {0, 4}, sb[2] = {0, 3}, sc[1] = {2};
  p[0] = (hvd_param_t){"a", hvd_tensor_make(NULL, dt, 2, sa),
                       hvd_tensor_make(NULL, dt, 2, sa)};
  p[1] = (hvd_param_t){"b", hvd_tensor_make(NULL, dt, 2, sb),
                       hvd_tensor_make(NULL, dt, 2, sb)};
  p[2] = (hvd_param_t){"c", hvd_tensor_make(wc, dt, 1, sc),
                       hvd_tensor_make(gc, dt, 1, sc)};
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  hvd_optimizer_t *base = NULL;
  if (hvd_adam_create(p, 3, &ao, &base) != HVD_SUCCESS ||
      (!plain && hvd_distributed_optimizer(base, &d, opt) != HVD_SUCCESS))
    bail("empty parameters: %s", hvd_last_error());
  if (plain)
    *opt = base;
}

/* Two empty bfloat16 parameters of different shapes (their data NULL
 * alike): each is matched to its own master, so a checkpoint of them
 * (plain, distributed, sharded) holds each one's shape, loads into a
 * float32 model of the same shapes, and back into the bfloat16 one. */
static void test_empty(int plain, int shard) {
  const char *what = plain ? "plain" : shard ? "sharded" : "distributed";
  char path[600];
  snprintf(path, sizeof path, "%s/empty.ckpt", dir);
  hvd_param_t p[3], q[3];
  uint16_t wc[2] = {0}, gc[2] = {0};
  float wf[2] = {0}, gf[2] = {0};
  hvd_optimizer_t *o16 = NULL, *o32 = NULL;
  empty_model(p, wc, gc, HVD_BFLOAT16, plain, shard, &o16);
  empty_model(q, wf, gf, HVD_FLOAT32, plain, shard, &o32);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, p, 3, o16, 1),
         "empty, %s: saved from the bfloat16 model", what);
  hvd_result_t rc = hvd_checkpoint_load(path, q, 3, o32, NULL);
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "  loads into a float32 model of the same shapes");
  rc = hvd_checkpoint_load(path, p, 3, o16, NULL);
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "  and into the bfloat16 one");
  hvd_optimizer_destroy(o16);
  hvd_optimizer_destroy(o32);
}

/* A step of opt whose gradient is 1 on every rank, inf on the last one:
 * HVD_SUCCESS and skipped on every rank. */
static int poisoned_step(model_t *m, hvd_optimizer_t *opt) {
  if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
    return 0;
  for (int i = 0; i < 4; i++)
    hvdt_put(HVD_FLOAT32, m->g, i, hvd_optimizer_loss_scale(opt));
  if (rank == size - 1)
    hvdt_put(HVD_FLOAT32, m->g, 0, INFINITY);
  return hvd_optimizer_step(opt) == HVD_SUCCESS &&
         hvd_optimizer_step_skipped(opt) == 1;
}

/* hvd_optimizer_step_skipped is the last step's: 1 after a skipped one,
 * then 0 after a step that fails (no new gradients; the ranks' learning
 * rates differ, np >= 2) and after each restore of the optimizer's
 * state (hvd_state_restore, hvd_checkpoint_load,
 * hvd_broadcast_optimizer_state). */
static void test_skip_forgotten(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/skip.ckpt", dir);
  model_t m;
  model_make(&m, HVD_FLOAT32, 4, 1.0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_state_t *st = NULL;
  if (hvd_sgd_create(&m.p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, NULL, &opt) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(opt, NULL) != HVD_SUCCESS ||
      hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, &m.p, 1, opt) != HVD_SUCCESS)
    bail("skip: %s", hvd_last_error());
  ok(poisoned_step(&m, opt), "skipped: 1 after a step with an inf");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_step(opt),
         "  a step without new gradients fails");
  is_int(0, hvd_optimizer_step_skipped(opt), "  then skipped is 0");
  if (size >= 2) {
    ok(poisoned_step(&m, opt), "  skipped again");
    hvd_optimizer_set_lr(opt, rank == 1 ? 0.25 : 0.5);
    hvd_optimizer_zero_grad(opt);
    is_int(HVD_ERR_MISMATCH, hvd_optimizer_step(opt),
           "  a step whose learning rates differ fails");
    is_int(0, hvd_optimizer_step_skipped(opt), "  then skipped is 0");
    hvd_optimizer_set_lr(opt, 0.5);
  }
  int restored = 0;
  ok(hvd_state_commit(st) == HVD_SUCCESS && poisoned_step(&m, opt) &&
         hvd_state_restore(st, &restored) == HVD_SUCCESS && restored,
     "  committed, skipped, restored");
  is_int(0, hvd_optimizer_step_skipped(opt), "  after hvd_state_restore: 0");
  ok(hvd_checkpoint_save(path, &m.p, 1, opt, 0) == HVD_SUCCESS &&
         poisoned_step(&m, opt) &&
         hvd_checkpoint_load(path, &m.p, 1, opt, NULL) == HVD_SUCCESS,
     "  saved, skipped, loaded");
  is_int(0, hvd_optimizer_step_skipped(opt), "  after hvd_checkpoint_load: 0");
  ok(poisoned_step(&m, opt) &&
         hvd_broadcast_optimizer_state(opt, 0) == HVD_SUCCESS,
     "  skipped, then the state broadcast");
  is_int(0, hvd_optimizer_step_skipped(opt),
         "  after hvd_broadcast_optimizer_state: 0");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* A float32 file whose values are beyond float16's range, loaded into a
 * float16 model with its optimizer: the masters hold the file's values,
 * the parameter's values are +-inf (hvd.h, "Mixed precision"). */
static void test_fp16_overflow_load(void) {
  char path[600], back[600];
  snprintf(path, sizeof path, "%s/big.ckpt", dir);
  snprintf(back, sizeof back, "%s/big16.ckpt", dir);
  model_t a, b;
  model_make(&a, HVD_FLOAT32, N, 1e5);
  hvdt_put(HVD_FLOAT32, a.w, 1, -1e5);
  hvdt_put(HVD_FLOAT32, a.w, 2, 65504);
  model_make(&b, HVD_FLOAT16, N, 0.5);
  hvd_optimizer_t *oa = make_opt(&a, 0, 0), *ob = make_opt(&b, 0, 1);
  int ok_io = hvd_checkpoint_save(path, &a.p, 1, oa, 0) == HVD_SUCCESS;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, &b.p, 1, ob, NULL),
         "fp16 overflow: a float32 file of 1e5 loads into a float16 model");
  ok(ok_io && hvdt_get(HVD_FLOAT16, b.w, 0) == INFINITY &&
         hvdt_get(HVD_FLOAT16, b.w, 1) == -INFINITY &&
         hvdt_get(HVD_FLOAT16, b.w, 2) == 65504,
     "  the values: inf, -inf, 65504 (%g %g %g)", hvdt_get(HVD_FLOAT16, b.w, 0),
     hvdt_get(HVD_FLOAT16, b.w, 1), hvdt_get(HVD_FLOAT16, b.w, 2));
  float master[N], g32[N];
  int64_t n = N;
  hvd_param_t q = {"w", hvd_tensor_make(master, HVD_FLOAT32, 1, &n),
                   hvd_tensor_make(g32, HVD_FLOAT32, 1, &n)};
  ok(hvd_checkpoint_save(back, &b.p, 1, ob, 0) == HVD_SUCCESS &&
         hvd_checkpoint_load(back, &q, 1, NULL, NULL) == HVD_SUCCESS &&
         master[0] == 1e5f && master[1] == -1e5f,
     "  the masters keep the file's values (%g %g)", (double)master[0],
     (double)master[1]);
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

static void test_refusals(void) {
  model_t m;
  hvd_optimizer_t *o = NULL;
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  model_make(&m, HVD_BFLOAT16, N, 0.5);
  m.p.grad.dtype = HVD_FLOAT32;
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_adam_create(&m.p, 1, &ao, &o),
          "hvd_adam_create: param 'w' grad is float32 but value is bfloat16",
          "a grad of another dtype");
  m.p.grad.dtype = HVD_BFLOAT16;
  if (hvd_adam_create(&m.p, 1, &ao, &o) != HVD_SUCCESS)
    bail("adam: %s", hvd_last_error());
  int64_t row = 0;
  float v[1] = {1};
  hvdt_refused(HVD_ERR_UNSUPPORTED, hvd_optimizer_sparse_grad(o, 0, &row, 1, v),
          "hvd_optimizer_sparse_grad: parameter 'w' is bfloat16; sparse "
          "gradients are for float32 parameters",
          "sparse rows into bfloat16");
  hvd_loss_scale_options_t lo;
  hvd_loss_scale_options_init(&lo);
  lo.backoff_factor = 1.5;
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_loss_scaling(o, &lo),
          "hvd_optimizer_set_loss_scaling: backoff_factor 1.5 is out of range "
          "(0, 1]",
          "backoff_factor 1.5");
  hvd_loss_scale_options_init(&lo);
  lo.growth_interval = 0;
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_loss_scaling(o, &lo),
          "hvd_optimizer_set_loss_scaling: growth_interval 0 is below 1",
          "growth_interval 0");
  ok(hvd_optimizer_loss_scale(o) == 1.0, "no loss scaling: the scale is 1");
  hvd_optimizer_destroy(o);
  model_free(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-mixed");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_reference();
  test_low(HVD_BFLOAT16, 0, BF16_TOL);
  test_low(HVD_BFLOAT16, 1, BF16_FP32_TOL);
  test_low(HVD_FLOAT16, 0, FP16_TOL);
  test_injected();
  test_checkpoint();
  test_state();
  test_zero(HVD_BFLOAT16, 0);
  test_zero(HVD_BFLOAT16, 1);
  test_zero(HVD_FLOAT16, 0);
  test_failed_step();
  test_finite_scale();
  test_local_skip();
  test_refusals();
  test_empty(1, 0);
  test_empty(0, 0);
  test_empty(0, 1);
  test_skip_forgotten();
  test_fp16_overflow_load();
  test_nosync_scaling();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  hvdt_remove_tmpdir(dir);
  return tap_mpi_finish();
}
