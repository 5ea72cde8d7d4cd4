/*
 * weight_decay.c - per-parameter weight decay and learning rate in the
 * built-in optimizers (hvd_optimizer_set_param_weight_decay,
 * hvd_optimizer_set_param_lr_scale), torch's parameter groups, on host
 * parameters at np 1..4.
 *
 * The model: parameters "w0" (300 elements), "w1" (7), "w2" (1000),
 * float32. Each optimizer gives w1 its own decay 0 and w2 0.2, w0 keeps
 * the options' (0.1 for SGD, 0.05 for Adam, AdamW and LAMB); w0 and w1
 * learn at 0.5 times the optimizer's rate, w2 at 3 times. Cases:
 *  - SGD (momentum 0.9), Adam (L2), AdamW and LAMB, plain, 3 steps with a
 *    learning-rate change before the third: every parameter's values
 *    equal, bit for bit, those of an optimizer made with that parameter
 *    alone, that weight_decay and lr times its scale;
 *  - NAN puts the options' back (decay and scale): then the whole model
 *    equals one optimizer made with the options;
 *  - distributed AdamW, sharded (ZeRO-1) and not, 3 steps: the same
 *    values bit for bit, and they differ from a run without the groups;
 *  - hvd_optimizer_param_weight_decay and _lr_scale read each back (the
 *    options' decay and 1 where none was set);
 *  - refusals: NULL, a parameter out of range, a decay or a scale out of
 *    range, a custom optimizer; each with its exact message.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
static const int64_t len[NP] = {300, 7, 1000};
static const char *const names[NP] = {"w0", "w1", "w2"};
static const double own[NP] = {NAN, 0.0, 0.2}; /* NAN: the options' */
static const double own_lr[NP] = {0.5, 0.5, 3.0}; /* learning-rate scales */
static int rank;

typedef struct model {
  float *w[NP], *g[NP];
  hvd_param_t p[NP];
} model_t;

static void make(model_t *m) {
  for (int k = 0; k < NP; k++) {
    m->w[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    m->g[k] = hvdt_calloc((size_t)len[k], sizeof(float));
    for (int64_t i = 0; i < len[k]; i++)
      m->w[k][i] = (float)((i * 5 + k) % 11 - 5) / 4;
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], HVD_FLOAT32, 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], HVD_FLOAT32, 1, &len[k]);
  }
}

static void drop(model_t *m) {
  for (int k = 0; k < NP; k++)
    free(m->w[k]), free(m->g[k]);
}

/* Parameter k's gradient at step s on this rank. */
static void grads(model_t *m, int k, int s) {
  for (int64_t i = 0; i < len[k]; i++)
    m->g[k][i] = (float)((i * 3 + k * 7 + s * 5 + rank) % 13 - 6) / 16;
}

enum { SGD, ADAM, ADAMW, LAMB };
static const char *const kind_name[4] = {"SGD", "Adam", "AdamW", "LAMB"};

static double base_lr(int kind) { return kind == SGD ? 0.05 : 0.01; }

/* A plain optimizer of `kind` over n parameters with weight_decay wd and
 * learning rate lr. */
static hvd_optimizer_t *make_opt_lr(int kind, hvd_param_t *p, int n, double wd,
                                    double lr) {
  hvd_optimizer_t *o = NULL;
  hvd_result_t rc;
  if (kind == SGD) {
    hvd_sgd_options_t so;
    hvd_sgd_options_init(&so);
    so.lr = lr;
    so.momentum = 0.9;
    so.weight_decay = wd;
    rc = hvd_sgd_create(p, n, &so, &o);
  } else if (kind == LAMB) {
    hvd_lamb_options_t lo;
    hvd_lamb_options_init(&lo);
    lo.lr = lr;
    lo.weight_decay = wd;
    rc = hvd_lamb_create(p, n, &lo, &o);
  } else {
    hvd_adam_options_t ao;
    hvd_adam_options_init(&ao);
    ao.lr = lr;
    ao.weight_decay = wd;
    ao.decoupled = kind == ADAMW;
    rc = hvd_adam_create(p, n, &ao, &o);
  }
  if (rc != HVD_SUCCESS)
    bail("create: %s", hvd_last_error());
  return o;
}

static hvd_optimizer_t *make_opt(int kind, hvd_param_t *p, int n, double wd) {
  return make_opt_lr(kind, p, n, wd, base_lr(kind));
}

static double dflt(int kind) { return kind == SGD ? 0.1 : 0.05; }

static void set_groups(hvd_optimizer_t *o) {
  for (int k = 1; k < NP; k++)
    if (hvd_optimizer_set_param_weight_decay(o, k, own[k]) != HVD_SUCCESS)
      bail("set_param_weight_decay: %s", hvd_last_error());
  for (int k = 0; k < NP; k++)
    if (hvd_optimizer_set_param_lr_scale(o, k, own_lr[k]) != HVD_SUCCESS)
      bail("set_param_lr_scale: %s", hvd_last_error());
}

/* Steps first..last; before step 3 the optimizer's rate halves (each
 * group's with it). */
static void steps(model_t *m, hvd_optimizer_t *o, int first, int last) {
  for (int s = first; s <= last; s++) {
    if (s == 3 && hvd_optimizer_set_lr(o, hvd_optimizer_lr(o) / 2) !=
                      HVD_SUCCESS)
      bail("set_lr: %s", hvd_last_error());
    if (hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
      bail("zero_grad: %s", hvd_last_error());
    for (int k = NP - 1; k >= 0; k--)
      grads(m, k, s);
    if (hvd_optimizer_step(o) != HVD_SUCCESS)
      bail("step: %s", hvd_last_error());
  }
}

/* Each parameter alone under an optimizer made with its decay. */
static void test_groups(int kind) {
  const char *kn = kind_name[kind];
  model_t g, alone;
  make(&g);
  make(&alone);
  hvd_optimizer_t *o = make_opt(kind, g.p, NP, dflt(kind));
  set_groups(o);
  steps(&g, o, 1, 3);
  int same = 1;
  for (int k = 0; k < NP; k++) {
    double wd = isnan(own[k]) ? dflt(kind) : own[k];
    hvd_optimizer_t *a =
        make_opt_lr(kind, &alone.p[k], 1, wd, base_lr(kind) * own_lr[k]);
    for (int s = 1; s <= 3; s++) {
      if (s == 3) /* (lr / 2) * scale: the grouped run's product */
        hvd_optimizer_set_lr(a, base_lr(kind) / 2 * own_lr[k]);
      hvd_optimizer_zero_grad(a);
      grads(&alone, k, s);
      if (hvd_optimizer_step(a) != HVD_SUCCESS)
        bail("step: %s", hvd_last_error());
    }
    int sk = memcmp(g.w[k], alone.w[k], (size_t)len[k] * sizeof(float)) == 0;
    if (!sk)
      tap_note("%s: %s differs from its own optimizer's", kn, names[k]);
    same &= sk;
    hvd_optimizer_destroy(a);
  }
  ok(same,
     "%s: each parameter as an optimizer made with its decay (0.1/0.05, 0, "
     "0.2) and lr times its scale (0.5, 0.5, 3), bit for bit",
     kn);
  for (int k = 0; k < NP; k++) {
    is_double(isnan(own[k]) ? dflt(kind) : own[k],
              hvd_optimizer_param_weight_decay(o, k), 0,
              "%s: %s's decay reads back", kn, names[k]);
    is_double(own_lr[k], hvd_optimizer_param_lr_scale(o, k), 0,
              "%s: %s's learning-rate scale reads back", kn, names[k]);
  }
  /* NAN: the options' again, for the whole model */
  model_t r, one;
  make(&r);
  make(&one);
  hvd_optimizer_t *ro = make_opt(kind, r.p, NP, dflt(kind));
  hvd_optimizer_t *oo = make_opt(kind, one.p, NP, dflt(kind));
  set_groups(ro);
  for (int k = 0; k < NP; k++)
    hvd_optimizer_set_param_weight_decay(ro, k, NAN),
        hvd_optimizer_set_param_lr_scale(ro, k, NAN);
  steps(&r, ro, 1, 3);
  steps(&one, oo, 1, 3);
  int back = 1;
  for (int k = 0; k < NP; k++)
    back &= memcmp(r.w[k], one.w[k], (size_t)len[k] * sizeof(float)) == 0;
  ok(back && hvd_optimizer_param_lr_scale(ro, 2) == 1,
     "%s: NAN puts the options' decay and rate back (bit for bit)", kn);
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ro);
  hvd_optimizer_destroy(oo);
  drop(&g);
  drop(&alone);
  drop(&r);
  drop(&one);
}

static hvd_optimizer_t *dist(model_t *m, int shard, int groups) {
  hvd_optimizer_t *base = make_opt(ADAMW, m->p, NP, dflt(ADAMW)), *o = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  if (hvd_distributed_optimizer(base, &d, &o) != HVD_SUCCESS)
    bail("distributed: %s", hvd_last_error());
  if (groups)
    set_groups(o);
  return o;
}

static void test_zero(void) {
  model_t a, b, c;
  make(&a);
  make(&b);
  make(&c);
  hvd_optimizer_t *oa = dist(&a, 0, 1), *ob = dist(&b, 1, 1),
                  *oc = dist(&c, 0, 0);
  steps(&a, oa, 1, 3);
  steps(&b, ob, 1, 3);
  steps(&c, oc, 1, 3);
  int same = 1, differ = 0;
  for (int k = 0; k < NP; k++) {
    same &= memcmp(a.w[k], b.w[k], (size_t)len[k] * sizeof(float)) == 0;
    differ |= memcmp(a.w[k], c.w[k], (size_t)len[k] * sizeof(float)) != 0;
  }
  ok(same, "distributed AdamW: sharded equals unsharded with the groups, bit "
           "for bit");
  ok(differ, "distributed AdamW: the groups changed the values");
  is_double(0.2, hvd_optimizer_param_weight_decay(ob, 2), 0,
            "distributed: w2's decay reads back through the wrapper");
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  hvd_optimizer_destroy(oc);
  drop(&a);
  drop(&b);
  drop(&c);
}

static hvd_result_t noop_step(void *ctx, hvd_param_t *params, int n,
                              hvd_tensor_t *state, int64_t step, double lr) {
  (void)ctx, (void)params, (void)n, (void)state, (void)step, (void)lr;
  return HVD_SUCCESS;
}

static void test_refusals(void) {
  model_t m;
  make(&m);
  hvd_optimizer_t *o = make_opt(SGD, m.p, NP, 0.1);
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_optimizer_set_param_weight_decay(NULL, 0, 0),
               "hvd_optimizer_set_param_weight_decay: opt is NULL", "opt NULL");
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_weight_decay(o, 3, 0),
      "hvd_optimizer_set_param_weight_decay: parameter 3 is out of range "
      "0..2",
      "parameter 3");
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_weight_decay(o, -1, 0),
      "hvd_optimizer_set_param_weight_decay: parameter -1 is out of range "
      "0..2",
      "parameter -1");
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_weight_decay(o, 0, -1),
      "hvd_optimizer_set_param_weight_decay: weight_decay -1 is out of "
      "range [0, inf) (NAN: the optimizer's own)",
      "weight_decay -1");
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_weight_decay(o, 0, INFINITY),
      "hvd_optimizer_set_param_weight_decay: weight_decay inf is out of "
      "range [0, inf) (NAN: the optimizer's own)",
      "weight_decay inf");
  ok(isnan(hvd_optimizer_param_weight_decay(o, 3)) &&
         isnan(hvd_optimizer_param_weight_decay(NULL, 0)),
     "param_weight_decay: NAN out of range and for NULL");
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_lr_scale(NULL, 0, 1),
               "hvd_optimizer_set_param_lr_scale: opt is NULL", "lr: opt NULL");
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_lr_scale(o, 3, 1),
               "hvd_optimizer_set_param_lr_scale: parameter 3 is out of range "
               "0..2",
               "lr: parameter 3");
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_param_lr_scale(o, 0, -1),
               "hvd_optimizer_set_param_lr_scale: scale -1 is out of range [0, "
               "inf) (NAN: 1, the optimizer's learning rate)",
               "scale -1");
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_optimizer_set_param_lr_scale(o, 0, INFINITY),
               "hvd_optimizer_set_param_lr_scale: scale inf is out of range "
               "[0, inf) (NAN: 1, the optimizer's learning rate)",
               "scale inf");
  ok(hvd_optimizer_param_lr_scale(o, 0) == 1 &&
         isnan(hvd_optimizer_param_lr_scale(o, 3)) &&
         isnan(hvd_optimizer_param_lr_scale(NULL, 0)),
     "param_lr_scale: 1 where none was set, NAN out of range and for NULL");
  hvd_optimizer_ops_t ops = {"mine", 0, NULL, noop_step, NULL};
  hvd_optimizer_t *c = NULL;
  if (hvd_optimizer_custom(m.p, NP, &ops, NULL, &c) != HVD_SUCCESS)
    bail("custom: %s", hvd_last_error());
  hvdt_refused(
      HVD_ERR_UNSUPPORTED, hvd_optimizer_set_param_weight_decay(c, 0, 0),
      "hvd_optimizer_set_param_weight_decay: optimizer 'mine' is a custom "
      "one: its step reads its own options",
      "a custom optimizer");
  ok(isnan(hvd_optimizer_param_weight_decay(c, 0)),
     "param_weight_decay: NAN for a custom optimizer");
  hvdt_refused(HVD_ERR_UNSUPPORTED, hvd_optimizer_set_param_lr_scale(c, 0, 2),
               "hvd_optimizer_set_param_lr_scale: optimizer 'mine' is a "
               "custom one: its step reads its own options",
               "lr: a custom optimizer");
  ok(isnan(hvd_optimizer_param_lr_scale(c, 0)),
     "param_lr_scale: NAN for a custom optimizer");
  hvd_optimizer_destroy(c);
  hvd_optimizer_destroy(o);
  drop(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_groups(SGD);
  test_groups(ADAM);
  test_groups(ADAMW);
  test_groups(LAMB);
  test_zero();
  test_refusals();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
