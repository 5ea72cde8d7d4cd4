/*
 * lamb.c - the built-in LAMB (hvd_lamb_create) on host parameters at np
 * 1..4.
 *
 * The model: float32 parameters "w0" (300 elements), "w1" (7), "w2"
 * (40000: three norm chunks) and "z" (5, all zero: a norm of 0). Cases:
 *  - the defaults of hvd_lamb_options_init (apex's FusedLAMB);
 *  - plain, three steps with lr 0.01 and w1's decay 0, against a
 *    reference written here from apex's formulas (norms summed in plain
 *    order): w1 (no decay, so no trust ratio) bit for bit, the others
 *    within 1e-6 relative; z takes lr alone on its first step;
 *  - the trust ratio: with always_adapt and decay 0, each parameter's
 *    step has norm lr * |w| (1e-6 relative); without always_adapt, the
 *    first step of a parameter without decay is lr * g / (|g| + eps);
 *  - distributed, sharded (ZeRO-1) and not, three steps: the values the
 *    same bits on every rank, sharded equal to unsharded within 1e-6
 *    (counted bit for bit), both equal to the reference on the averaged
 *    gradients within 1e-6;
 *  - a NaN gradient on the last rank: every rank's step fails, nothing
 *    updated, with "the update of parameter 'w1' is not finite" (sharded:
 *    " (on rank R)", the rank that holds the NaN's block); the next steps
 *    equal a run that never met the NaN, bit for bit (values and state
 *    untouched); an infinite value fails with "parameter 'w0' holds an
 *    inf";
 *  - bfloat16 parameters, sharded (dyadic data, exact in bfloat16;
 *    gradients reduced in float32): their values are the float32 run's
 *    rounded, bit for bit;
 *  - a sharded checkpoint after two steps, loaded into a fresh
 *    optimizer: two more steps equal the uninterrupted run bit for bit;
 *  - refusals of options out of range, with their messages.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 4
static const int64_t len[NP] = {300, 7, 40000, 5};
static const char *const names[NP] = {"w0", "w1", "w2", "z"};
static int rank, size;

typedef struct model {
  hvd_dtype_t dtype;
  void *w[NP], *g[NP];
  hvd_param_t p[NP];
} model_t;

static float init_value(int k, int64_t i) {
  return k == 3 ? 0.0f : (float)((i * 5 + k) % 11 - 5) / 4;
}

/* Parameter k's gradient element i at step s on rank r. */
static float grad_value(int k, int64_t i, int s, int r) {
  return (float)((i * 3 + k * 7 + s * 5 + r) % 13 - 6) / 16;
}

static void make(model_t *m, hvd_dtype_t dtype) {
  const size_t es = hvd_dtype_size(dtype);
  m->dtype = dtype;
  for (int k = 0; k < NP; k++) {
    m->w[k] = hvdt_calloc((size_t)len[k], es);
    m->g[k] = hvdt_calloc((size_t)len[k], es);
    for (int64_t i = 0; i < len[k]; i++)
      if (dtype == HVD_FLOAT32)
        ((float *)m->w[k])[i] = init_value(k, i);
      else
        ((uint16_t *)m->w[k])[i] = hvdt_f32_to_bf16(init_value(k, i));
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], dtype, 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], dtype, 1, &len[k]);
  }
}

static void drop(model_t *m) {
  for (int k = 0; k < NP; k++)
    free(m->w[k]), free(m->g[k]);
}

static void grads(model_t *m, int s) {
  for (int k = NP - 1; k >= 0; k--)
    for (int64_t i = 0; i < len[k]; i++)
      if (m->dtype == HVD_FLOAT32)
        ((float *)m->g[k])[i] = grad_value(k, i, s, rank);
      else
        ((uint16_t *)m->g[k])[i] = hvdt_f32_to_bf16(grad_value(k, i, s, rank));
}

static hvd_lamb_options_t opts(void) {
  hvd_lamb_options_t o;
  hvd_lamb_options_init(&o);
  o.lr = 0.01;
  return o;
}

static hvd_optimizer_t *lamb(model_t *m, const hvd_lamb_options_t *o) {
  hvd_optimizer_t *opt = NULL;
  if (hvd_lamb_create(m->p, NP, o, &opt) != HVD_SUCCESS)
    bail("hvd_lamb_create: %s", hvd_last_error());
  return opt;
}

static hvd_optimizer_t *dist(model_t *m, const hvd_lamb_options_t *o,
                             int shard) {
  hvd_optimizer_t *out = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  d.reduce_fp32 = m->dtype != HVD_FLOAT32; /* the float32 run's sums */
  if (hvd_distributed_optimizer(lamb(m, o), &d, &out) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  return out;
}

static void steps(model_t *m, hvd_optimizer_t *o, int first, int last) {
  for (int s = first; s <= last; s++) {
    if (s > 1 && hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
      bail("zero_grad: %s", hvd_last_error());
    grads(m, s);
    if (hvd_optimizer_step(o) != HVD_SUCCESS)
      bail("step %d: %s", s, hvd_last_error());
  }
}

/* ---- the reference ------------------------------------------------------ */

typedef struct ref {
  float *w[NP], *m[NP], *v[NP];
} ref_t;

static void ref_make(ref_t *r) {
  for (int k = 0; k < NP; k++) {
    r->w[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    r->m[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    r->v[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    for (int64_t i = 0; i < len[k]; i++)
      r->w[k][i] = init_value(k, i);
  }
}

static void ref_drop(ref_t *r) {
  for (int k = 0; k < NP; k++)
    free(r->w[k]), free(r->m[k]), free(r->v[k]);
}

/* One step of parameter k from gradient g, apex's multi_tensor_lamb in
 * float, the norms summed in element order. */
static void ref_param(ref_t *r, int k, const float *g,
                      const hvd_lamb_options_t *o, double wd, int t) {
  const float b1 = (float)o->beta1, b2 = (float)o->beta2;
  const float bc1 = o->bias_correction ? (float)(1 - pow(o->beta1, t)) : 1;
  const float bc2 = o->bias_correction ? (float)(1 - pow(o->beta2, t)) : 1;
  float *u = hvdt_calloc((size_t)len[k], sizeof(float));
  double w2 = 0, u2 = 0;
  for (int64_t i = 0; i < len[k]; i++) {
    float m = b1 * r->m[k][i] + (float)(1 - o->beta1) * g[i];
    float v = b2 * r->v[k][i] + (float)(1 - o->beta2) * g[i] * g[i];
    r->m[k][i] = m;
    r->v[k][i] = v;
    u[i] = (m / bc1) / (sqrtf(v / bc2) + (float)o->eps) +
           (float)wd * r->w[k][i];
    w2 += (double)r->w[k][i] * r->w[k][i];
    u2 += (double)u[i] * u[i];
  }
  const int adapt = o->always_adapt || wd != 0;
  const float ratio = adapt && w2 > 0 && u2 > 0
                          ? (float)(o->lr * (sqrt(w2) / sqrt(u2)))
                          : (float)o->lr;
  for (int64_t i = 0; i < len[k]; i++)
    r->w[k][i] = r->w[k][i] - ratio * u[i];
  free(u);
}

/* Steps first..last of the reference; averaged: the ranks' mean
 * gradient (exact: dyadic), else this rank's. wd1: w1's decay. */
static void ref_steps(ref_t *r, const hvd_lamb_options_t *o, double wd1,
                      int averaged, int first, int last) {
  for (int s = first; s <= last; s++)
    for (int k = 0; k < NP; k++) {
      float *g = hvdt_calloc((size_t)len[k], sizeof(float));
      for (int64_t i = 0; i < len[k]; i++) {
        double sum = 0;
        for (int q = 0; q < (averaged ? size : 1); q++)
          sum += grad_value(k, i, s, averaged ? q : rank);
        g[i] = (float)(sum / (averaged ? size : 1));
      }
      ref_param(r, k, g, o, k == 1 ? wd1 : o->weight_decay, s);
      free(g);
    }
}

/* The largest relative difference of m's values (float32) from r's,
 * over parameters k with bit k of mask; *same: all bit for bit. */
static double rel_diff(const model_t *m, const ref_t *r, unsigned mask,
                       int *same) {
  double worst = 0;
  *same = 1;
  for (int k = 0; k < NP; k++) {
    if (!((mask >> k) & 1))
      continue;
    const float *w = m->w[k];
    for (int64_t i = 0; i < len[k]; i++) {
      double d = fabs((double)w[i] - r->w[k][i]) /
                 fmax(fabs((double)r->w[k][i]), 1e-3);
      worst = fmax(worst, d);
      *same &= memcmp(&w[i], &r->w[k][i], sizeof(float)) == 0;
    }
  }
  return worst;
}

/* ---- cases --------------------------------------------------------------- */

static void test_defaults(void) {
  hvd_lamb_options_t o;
  memset(&o, 0xff, sizeof o);
  hvd_lamb_options_init(&o);
  ok(o.lr == 0.001 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-6 &&
         o.weight_decay == 0.01 && o.bias_correction == 1 &&
         o.always_adapt == 0,
     "defaults: lr 0.001, betas 0.9/0.999, eps 1e-6, weight decay 0.01, "
     "bias correction, no adaptation without decay");
}

static void test_plain(void) {
  hvd_lamb_options_t o = opts();
  model_t m;
  ref_t r;
  make(&m, HVD_FLOAT32);
  ref_make(&r);
  hvd_optimizer_t *opt = lamb(&m, &o);
  is_int(HVD_SUCCESS, hvd_optimizer_set_param_weight_decay(opt, 1, 0),
         "plain: w1's decay 0");
  steps(&m, opt, 1, 1);
  ref_steps(&r, &o, 0, 0, 1, 1);
  int same;
  double d = rel_diff(&m, &r, 1u << 3, &same);
  ok(d <= 1e-6, "plain: z (all zero, |w| 0) takes lr alone on step 1 (%.3g)",
     d);
  steps(&m, opt, 2, 3);
  ref_steps(&r, &o, 0, 0, 2, 3);
  d = rel_diff(&m, &r, 1u << 1, &same);
  ok(same, "plain: w1 (decay 0, no trust ratio) the reference's bit for bit "
           "after 3 steps");
  d = rel_diff(&m, &r, 0xd, &same);
  ok(d <= 1e-6, "plain: w0, w2, z within 1e-6 of the reference (%.3g)", d);
  is_int(3, (int)hvd_optimizer_steps(opt), "plain: 3 steps counted");
  is_int(2 * 4 * (300 + 7 + 40000 + 5), (int)hvd_optimizer_state_bytes(opt),
         "plain: exp_avg and exp_avg_sq of every element");
  hvd_optimizer_destroy(opt);
  drop(&m);
  ref_drop(&r);
}

static double norm2(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++)
    s += ((double)a[i] - (b ? b[i] : 0)) * ((double)a[i] - (b ? b[i] : 0));
  return sqrt(s);
}

static void test_trust(void) {
  hvd_lamb_options_t o = opts();
  o.weight_decay = 0;
  o.always_adapt = 1;
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = lamb(&m, &o);
  float *before = hvdt_calloc((size_t)len[2], sizeof(float));
  int good = 1;
  for (int s = 1; s <= 3; s++) {
    memcpy(before, m.w[2], (size_t)len[2] * sizeof(float));
    steps(&m, opt, s, s);
    double step = norm2(m.w[2], before, len[2]);
    double want = o.lr * norm2(before, NULL, len[2]);
    if (fabs(step - want) > 1e-6 * want) {
      good = 0;
      tap_note("step %d: |dw| %.9g, lr |w| %.9g", s, step, want);
    }
  }
  ok(good, "trust ratio (always_adapt, decay 0): every step of w2 has norm "
           "lr * |w| (1e-6)");
  hvd_optimizer_destroy(opt);
  /* without always_adapt and decay 0, step 1: lr * g / (|g| + eps) */
  o.always_adapt = 0;
  drop(&m);
  make(&m, HVD_FLOAT32);
  opt = lamb(&m, &o);
  steps(&m, opt, 1, 1);
  int exact = 1;
  for (int64_t i = 0; i < len[0]; i++) {
    float g = grad_value(0, i, 1, rank);
    float want = init_value(0, i) -
                 (float)o.lr * (g / (fabsf(g) + (float)o.eps));
    exact &= fabsf(((float *)m.w[0])[i] - want) <= 1e-7f;
  }
  ok(exact, "no adaptation without decay: step 1 moves w0 by lr * g / (|g| "
            "+ eps)");
  hvd_optimizer_destroy(opt);
  drop(&m);
  free(before);
}

/* Rank 0's values on every rank, bit for bit. */
static int same_everywhere(const model_t *m) {
  int same = 1;
  for (int k = 0; k < NP; k++) {
    const size_t bytes = (size_t)len[k] * hvd_dtype_size(m->dtype);
    void *r0 = hvdt_calloc(bytes, 1);
    memcpy(r0, m->w[k], bytes);
    MPI_Bcast(r0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    same &= memcmp(r0, m->w[k], bytes) == 0;
    free(r0);
  }
  int all;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static void test_dist(void) {
  hvd_lamb_options_t o = opts();
  model_t u, s;
  ref_t r;
  make(&u, HVD_FLOAT32);
  make(&s, HVD_FLOAT32);
  ref_make(&r);
  hvd_optimizer_t *ou = dist(&u, &o, 0), *os = dist(&s, &o, 1);
  steps(&u, ou, 1, 3);
  steps(&s, os, 1, 3);
  ref_steps(&r, &o, o.weight_decay, 1, 1, 3);
  ok(same_everywhere(&u), "distributed: the values the same bits on every "
                          "rank");
  ok(same_everywhere(&s), "sharded: the values the same bits on every rank");
  int same;
  double d = rel_diff(&u, &r, 0xf, &same);
  ok(d <= 1e-6, "distributed: the reference on the mean gradients (%.3g)", d);
  double worst = 0;
  int64_t equal = 0, all = 0;
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++, all++) {
      float a = ((float *)u.w[k])[i], b = ((float *)s.w[k])[i];
      equal += memcmp(&a, &b, sizeof a) == 0;
      worst = fmax(worst, fabs((double)a - b) / fmax(fabs((double)a), 1e-3));
    }
  ok(worst <= 1e-6,
     "sharded equals unsharded within 1e-6 (%.3g; %lld of %lld values bit "
     "for bit)",
     worst, (long long)equal, (long long)all);
  ok(size == 1 ? hvd_optimizer_state_bytes(os) ==
                     hvd_optimizer_state_bytes(ou)
               : hvd_optimizer_state_bytes(os) <
                     hvd_optimizer_state_bytes(ou),
     "sharded: %lld bytes of state here, unsharded %lld",
     (long long)hvd_optimizer_state_bytes(os),
     (long long)hvd_optimizer_state_bytes(ou));
  hvd_optimizer_destroy(ou);
  hvd_optimizer_destroy(os);
  drop(&u);
  drop(&s);
  ref_drop(&r);
}

/* A step with a NaN in w1's last gradient element on the last rank: it
 * fails on every rank with want (suffixed as sharded says), and nothing
 * changes; the next step runs. */
static void nan_case(int shard) {
  hvd_lamb_options_t o = opts();
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = dist(&m, &o, shard);
  steps(&m, opt, 1, 1);
  float *keep[NP];
  for (int k = 0; k < NP; k++) {
    keep[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    memcpy(keep[k], m.w[k], (size_t)len[k] * sizeof(float));
  }
  const int64_t bytes = hvd_optimizer_state_bytes(opt);
  hvd_optimizer_zero_grad(opt);
  grads(&m, 2);
  if (rank == size - 1)
    ((float *)m.g[1])[6] = NAN;
  char want[256];
  /* w1's 7 elements in blocks: element 6 is the last rank's at np <= 4 */
  snprintf(want, sizeof want,
           "hvd_optimizer_step: LAMB: the update of parameter 'w1' is not "
           "finite (an inf or a NaN in its gradient); nothing was "
           "updated");
  if (shard && size > 1)
    snprintf(want + strlen(want), sizeof want - strlen(want), " (on rank %d)",
             size - 1);
  const char *what = shard ? "sharded" : "distributed";
  hvd_result_t rc = hvd_optimizer_step(opt);
  char label[64];
  snprintf(label, sizeof label, "%s: a NaN gradient", what);
  hvdt_refused(HVD_ERR_INVALID_ARG, rc, want, label);
  int kept = 1;
  for (int k = 0; k < NP; k++)
    kept &= memcmp(keep[k], m.w[k], (size_t)len[k] * sizeof(float)) == 0;
  ok(kept && hvd_optimizer_steps(opt) == 1 &&
         hvd_optimizer_state_bytes(opt) == bytes,
     "%s: nothing updated (values, step count)", what);
  steps(&m, opt, 2, 3);
  /* the state too: a run that never met the NaN */
  model_t t;
  make(&t, HVD_FLOAT32);
  hvd_optimizer_t *ot = dist(&t, &o, shard);
  steps(&t, ot, 1, 3);
  int same = 1;
  for (int k = 0; k < NP; k++)
    same &= memcmp(t.w[k], m.w[k], (size_t)len[k] * sizeof(float)) == 0;
  ok(same && memcmp(keep[0], m.w[0], (size_t)len[0] * sizeof(float)) != 0,
     "%s: the next steps run, equal to a run without the failed one (the "
     "state untouched), bit for bit",
     what);
  for (int k = 0; k < NP; k++)
    free(keep[k]);
  hvd_optimizer_destroy(opt);
  hvd_optimizer_destroy(ot);
  drop(&m);
  drop(&t);
}

static void test_nonfinite(void) {
  nan_case(0);
  nan_case(1);
  hvd_lamb_options_t o = opts();
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = lamb(&m, &o);
  ((float *)m.w[0])[3] = INFINITY;
  grads(&m, 1);
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_step(opt),
               "hvd_optimizer_step: LAMB: parameter 'w0' holds an inf or a "
               "NaN; nothing was updated",
               "an infinite value");
  is_int(0, (int)hvd_optimizer_steps(opt), "an infinite value: no step");
  hvd_optimizer_destroy(opt);
  drop(&m);
}

static void test_bf16(void) {
  hvd_lamb_options_t o = opts();
  model_t f, b;
  make(&f, HVD_FLOAT32);
  make(&b, HVD_BFLOAT16);
  hvd_optimizer_t *of = dist(&f, &o, 0), *ob = dist(&b, &o, 1);
  steps(&f, of, 1, 3);
  steps(&b, ob, 1, 3);
  int same = 1;
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++)
      same &= ((uint16_t *)b.w[k])[i] ==
              hvdt_f32_to_bf16(((float *)f.w[k])[i]);
  ok(same, "bfloat16, sharded: the values are the float32 run's rounded, bit "
           "for bit (float32 masters)");
  hvd_optimizer_destroy(of);
  hvd_optimizer_destroy(ob);
  drop(&f);
  drop(&b);
}

static void test_checkpoint(void) {
  hvd_lamb_options_t o = opts();
  char dir[1024], path[1100];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-lamb");
  snprintf(path, sizeof path, "%s/lamb.ckpt", dir);
  model_t a, b;
  make(&a, HVD_FLOAT32);
  make(&b, HVD_FLOAT32);
  hvd_optimizer_t *oa = dist(&a, &o, 1), *ob = dist(&b, &o, 1);
  steps(&a, oa, 1, 2);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, a.p, NP, oa, 2),
         "checkpoint: saved after 2 sharded steps");
  steps(&a, oa, 3, 4);
  int64_t step = -1;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, b.p, NP, ob, &step),
         "checkpoint: loaded into a fresh sharded LAMB");
  steps(&b, ob, 3, 4);
  int same = step == 2 && hvd_optimizer_steps(ob) == 4;
  for (int k = 0; k < NP; k++)
    same &= memcmp(a.w[k], b.w[k], (size_t)len[k] * sizeof(float)) == 0;
  ok(same, "checkpoint: steps 3-4 after the load equal the uninterrupted "
           "run, bit for bit");
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  drop(&a);
  drop(&b);
  hvdt_remove_tmpdir(dir);
}

static void test_refusals(void) {
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = NULL;
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_lamb_create(m.p, NP, NULL, &opt),
               "hvd_lamb_create: options are NULL", "options NULL");
  static const struct {
    const char *field, *msg;
    double value;
  } bad[] = {
      {"lr", "hvd_lamb_create: lr -1 is out of range [0, inf)", -1},
      {"beta1", "hvd_lamb_create: beta1 1 is out of range [0, 1)", 1},
      {"beta2", "hvd_lamb_create: beta2 -0.5 is out of range [0, 1)", -0.5},
      {"eps", "hvd_lamb_create: eps 0 is out of range (0, inf)", 0},
      {"weight_decay",
       "hvd_lamb_create: weight_decay nan is out of range [0, inf)", NAN},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hvd_lamb_options_t o = opts();
    if (strcmp(bad[i].field, "lr") == 0)
      o.lr = bad[i].value;
    else if (strcmp(bad[i].field, "beta1") == 0)
      o.beta1 = bad[i].value;
    else if (strcmp(bad[i].field, "beta2") == 0)
      o.beta2 = bad[i].value;
    else if (strcmp(bad[i].field, "eps") == 0)
      o.eps = bad[i].value;
    else
      o.weight_decay = bad[i].value;
    hvdt_refused(HVD_ERR_INVALID_ARG, hvd_lamb_create(m.p, NP, &o, &opt),
                 bad[i].msg, bad[i].field);
    ok(opt == NULL, "%s: no optimizer made", bad[i].field);
  }
  drop(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_defaults();
  test_plain();
  test_trust();
  test_dist();
  test_nonfinite();
  test_bf16();
  test_checkpoint();
  test_refusals();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
