/*
 * hparams.c - the ranks' optimizers agree on their hyperparameters
 * (lib/optim/hparams.c), at np 1..4.
 *
 * The model: float32 host parameters "w" (5 elements) and "b" (3), every
 * rank the same values and gradients. Each case makes the ranks differ in
 * one thing, steps the distributed optimizer, and wants HVD_ERR_MISMATCH
 * on every rank with the exact message (the thing, rank 0's value, then
 * the ranks that differ and theirs), nothing updated and no update
 * counted; then hvd_broadcast_optimizer_state from a root gives every rank
 * root's, and a step succeeds with every value equal, bit for bit, to a
 * plain optimizer made as root's stepping on the same reduced gradients:
 *  - lr (every rank its own: the list of ranks), the update count (a base
 *    stepped once before it was wrapped), SGD's momentum, Adam's beta2,
 *    AdamW's weight decay (every parameter's follows the broadcast);
 *  - a parameter's learning-rate scale and one's weight decay (set on
 *    root only: the broadcast sets them everywhere; set on another rank:
 *    the broadcast puts the options' back);
 *  - loss scaling's scale, clipping's max_norm; loss scaling on one rank
 *    only (the step names it; the broadcast refuses, naming what differs);
 *  - a ZeRO-1 optimizer (sharded) with different learning rates;
 *  - a rank that joined (hvd_join) early: the others' step succeeds with
 *    it joined (or, their lrs differing, fails naming them, the joined
 *    rank left out), the next step of all names the update count, and the
 *    pattern documented in include/hvd.h (broadcast the parameters and
 *    the optimizer state from the last rank to join) makes them agree.
 *  - check_hparams 0: the step with different learning rates succeeds and
 *    the ranks' values differ (hvd_verify_parameters says so); 2 is
 *    refused.
 * At np 1 there is nothing to differ: those cases are skipped.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 2
static const int64_t len[NP] = {5, 3};
static const char *const names[NP] = {"w", "b"};
static int rank, size;

#define TAIL                                                                   \
  "; nothing was updated (each rank must set the same; "                       \
  "hvd_broadcast_optimizer_state gives every rank root's, the update count "   \
  "included)"

typedef struct model {
  float w[NP][8], g[NP][8];
  hvd_param_t p[NP];
} model_t;

typedef enum kind { SGD, ADAM, ADAMW } kind_t; /* a: momentum, beta2, decay */

/* Every rank the same values; gradients set by grads(). */
static void make(model_t *m) {
  memset(m, 0, sizeof *m);
  for (int k = 0; k < NP; k++) {
    for (int64_t i = 0; i < len[k]; i++)
      m->w[k][i] = (float)((i * 3 + k) % 7 - 3) / 4;
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], HVD_FLOAT32, 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], HVD_FLOAT32, 1, &len[k]);
  }
}

static void grads(model_t *m, int step) {
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++)
      m->g[k][i] = (float)((i + k + step) % 5 - 2) / 8;
}

static hvd_optimizer_t *base(kind_t kind, model_t *m, double lr, double a) {
  hvd_optimizer_t *o = NULL;
  if (kind == SGD) {
    hvd_sgd_options_t so;
    hvd_sgd_options_init(&so);
    so.lr = lr;
    so.momentum = a;
    hvd_sgd_create(m->p, NP, &so, &o);
  } else {
    hvd_adam_options_t ao;
    hvd_adam_options_init(&ao);
    ao.lr = lr;
    if (kind == ADAM)
      ao.beta2 = a;
    else
      ao.decoupled = 1, ao.weight_decay = a;
    hvd_adam_create(m->p, NP, &ao, &o);
  }
  if (o == NULL)
    bail("%s", hvd_last_error());
  return o;
}

static hvd_optimizer_t *dist_checked(hvd_optimizer_t *b, int shard, int check) {
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  d.check_hparams = check;
  hvd_optimizer_t *o = NULL;
  if (hvd_distributed_optimizer(b, &d, &o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return o;
}

static hvd_optimizer_t *dist(hvd_optimizer_t *b, int shard) {
  return dist_checked(b, shard, 1);
}

static int values_are(const model_t *m, const model_t *want) {
  return memcmp(m->w, want->w, sizeof m->w) == 0;
}

/* A failed step: the message, nothing updated, no update counted. */
static void refused(hvd_optimizer_t *o, model_t *m, const char *want,
                    const char *what) {
  model_t before = *m;
  int64_t steps = hvd_optimizer_steps(o);
  grads(m, 0);
  is_int(HVD_ERR_MISMATCH, hvd_optimizer_step(o), "%s: the step fails", what);
  is_string(want, hvd_last_error(), "%s: message", what);
  ok(values_are(m, &before) && hvd_optimizer_steps(o) == steps,
     "%s: nothing updated, no update counted", what);
}

/* After hvd_broadcast_optimizer_state: a step, bit for bit a plain
 * optimizer ref's on a copy of the values and the reduced gradients. */
static void agrees(hvd_optimizer_t *o, model_t *m, hvd_optimizer_t *ref,
                   model_t *rm, const char *what) {
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(o), "%s: zero_grad", what);
  grads(m, 1);
  memcpy(rm->w, m->w, sizeof m->w);
  is_int(HVD_SUCCESS, hvd_optimizer_step(o), "%s: then a step succeeds", what);
  memcpy(rm->g, m->g, sizeof m->g); /* the reduced gradients */
  hvd_result_t rc = hvd_optimizer_step(ref);
  ok(rc == HVD_SUCCESS && values_are(m, rm), "%s: root's update, bit for bit",
     what);
  is_int(HVD_SUCCESS, hvd_verify_parameters(m->p, NP),
         "%s: the same values on every rank", what);
}

/* "rank 1 V, rank 2 V, ..." for every rank but 0. */
static const char *others_are(const char *v) {
  static char s[512];
  size_t at = 0;
  s[0] = '\0';
  for (int r = 1; r < size; r++)
    at += (size_t)snprintf(s + at, sizeof s - at, "%srank %d %s",
                           r > 1 ? ", " : "", r, v);
  return s;
}

static char *lr_list(void) {
  static char s[512];
  size_t at = (size_t)snprintf(s, sizeof s, "lr: rank 0 0.125 vs ");
  for (int r = 1; r < size; r++)
    at += (size_t)snprintf(s + at, sizeof s - at, "%srank %d %g",
                           r > 1 ? ", " : "", r, 0.125 * (r + 1));
  return s;
}

/* Every rank its own lr, then the last rank's for all. */
static void test_lr(void) {
  const int last = size - 1;
  char want[1024];
  model_t m, rm;
  make(&m);
  make(&rm);
  hvd_optimizer_t *o = dist(base(SGD, &m, 0.125 * (rank + 1), 0.5), 0);
  hvd_optimizer_t *ref = base(SGD, &rm, 0.125 * size, 0.5);
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in %s" TAIL,
           lr_list());
  refused(o, &m, want, "lr");
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, last),
         "lr: broadcast from rank %d", last);
  is_double(0.125 * size, hvd_optimizer_lr(o), 0, "lr: root's everywhere");
  agrees(o, &m, ref, &rm, "lr");
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ref);
}

/* One case of a difference made by differ() on the last rank (after
 * same() on every rank), root 0's settings then made everyone's. */
typedef struct diff_case {
  const char *what, *want; /* the message after "differ in " */
  kind_t kind;
  double a; /* momentum or beta2 on every rank but the last */
  double a_last;
  void (*same)(hvd_optimizer_t *o); /* and on the reference, unless */
  int same_on_ref_not; /* it rewrites the gradients in place, which the
                          reference then gets rewritten */
  void (*differ)(hvd_optimizer_t *o);
  void (*check)(hvd_optimizer_t *o); /* after the broadcast */
} diff_case_t;

static void run_case(const diff_case_t *c) {
  const int last = rank == size - 1;
  char want[1024];
  model_t m, rm;
  make(&m);
  make(&rm);
  hvd_optimizer_t *b = base(c->kind, &m, 0.25, last ? c->a_last : c->a);
  hvd_optimizer_t *ref = base(c->kind, &rm, 0.25, c->a);
  if (c->same != NULL)
    c->same(b);
  if (c->same != NULL && !c->same_on_ref_not)
    c->same(ref);
  if (c->differ != NULL && last)
    c->differ(b);
  hvd_optimizer_t *o = dist(b, 0);
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in %s" TAIL,
           c->want);
  refused(o, &m, want, c->what);
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, 0),
         "%s: broadcast from rank 0", c->what);
  if (c->check != NULL)
    c->check(o);
  agrees(o, &m, ref, &rm, c->what);
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ref);
}

static void stepped(hvd_optimizer_t *o) { /* a plain step: count 1 */
  if (hvd_optimizer_step(o) != HVD_SUCCESS ||
      hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
}
static void b_scale(hvd_optimizer_t *o) {
  hvd_optimizer_set_param_lr_scale(o, 1, 0.5);
}
static void scale_back(hvd_optimizer_t *o) {
  ok(hvd_optimizer_param_lr_scale(o, 1) == 1,
     "lr scale: root's (none) on every rank");
}
static void root_groups(hvd_optimizer_t *o) {
  hvd_optimizer_set_param_lr_scale(o, 0, 3);
  hvd_optimizer_set_param_weight_decay(o, 1, 0.25);
}
static void w_decay(hvd_optimizer_t *o) {
  hvd_optimizer_set_param_weight_decay(o, 0, 0.125);
}
static void groups_everywhere(hvd_optimizer_t *o) {
  ok(hvd_optimizer_param_lr_scale(o, 0) == 3 &&
         hvd_optimizer_param_weight_decay(o, 1) == 0.25 &&
         hvd_optimizer_param_weight_decay(o, 0) == 0,
     "groups: root's scale and decays on every rank");
}
static void decay_everywhere(hvd_optimizer_t *o) {
  ok(hvd_optimizer_param_weight_decay(o, 0) == 0.01 &&
         hvd_optimizer_param_weight_decay(o, 1) == 0.01,
     "weight_decay: root's on every rank, each parameter's too");
}
static void scaling(hvd_optimizer_t *o) {
  hvd_optimizer_set_loss_scaling(o, NULL);
}
static void small_scale(hvd_optimizer_t *o) {
  hvd_loss_scale_options_t l;
  hvd_loss_scale_options_init(&l);
  l.init_scale = 1024;
  hvd_optimizer_set_loss_scaling(o, &l);
}
static void scale_everywhere(hvd_optimizer_t *o) {
  is_double(65536, hvd_optimizer_loss_scale(o), 0,
            "loss scale: root's on every rank");
}
static void clip1(hvd_optimizer_t *o) {
  hvd_optimizer_set_grad_clipping(o, 1, 2);
}
static void clip2(hvd_optimizer_t *o) {
  hvd_optimizer_set_grad_clipping(o, 2, 2);
}

static void test_cases(void) {
  static const diff_case_t cases[] = {
      {"update count", "update count: rank 0 0 vs rank %d 1", SGD, 0.5, 0.5,
       NULL, 0, stepped, NULL},
      {"momentum", "momentum: rank 0 0.5 vs rank %d 0.75", SGD, 0.5, 0.75, NULL,
       0, NULL, NULL},
      {"beta2", "beta2: rank 0 0.999 vs rank %d 0.99", ADAM, 0.999, 0.99, NULL,
       0, NULL, NULL},
      {"weight_decay", "weight_decay: rank 0 0.01 vs rank %d 0.125", ADAMW,
       0.01, 0.125, NULL, 0, NULL, decay_everywhere},
      {"lr scale",
       "the learning-rate scale of parameter 'b': rank 0 1 vs rank %d 0.5", SGD,
       0.5, 0.5, NULL, 0, b_scale, scale_back},
      {"weight decay",
       "the weight decay of parameter 'w': rank 0 0 vs rank %d 0.125", ADAM,
       0.999, 0.999, NULL, 0, w_decay, NULL},
      {"loss scale", "loss scale: rank 0 65536 vs rank %d 1024", ADAM, 0.999,
       0.999, scaling, 1, small_scale, scale_everywhere},
      {"max_norm", "max_norm: rank 0 1 vs rank %d 2", SGD, 0.5, 0.5, clip1, 1,
       clip2, NULL},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    diff_case_t c = cases[k];
    char want[512];
    snprintf(want, sizeof want, c.want, size - 1);
    c.want = want;
    run_case(&c);
  }
}

/* Groups set on root only: the step names the first; the broadcast makes
 * them everyone's. The reference has them too. */
static void test_root_groups(void) {
  model_t m, rm;
  char want[1024];
  make(&m);
  make(&rm);
  hvd_optimizer_t *b = base(ADAM, &m, 0.25, 0.999);
  hvd_optimizer_t *ref = base(ADAM, &rm, 0.25, 0.999);
  if (rank == 0)
    root_groups(b);
  root_groups(ref);
  hvd_optimizer_t *o = dist(b, 0);
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in the "
           "learning-rate scale of parameter 'w': rank 0 3 vs %s" TAIL,
           others_are("1"));
  refused(o, &m, want, "groups");
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, 0),
         "groups: broadcast from rank 0");
  groups_everywhere(o);
  agrees(o, &m, ref, &rm, "groups");
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ref);
}

/* Loss scaling on rank 0 only: the step names it; the broadcast cannot
 * switch it on and refuses, naming what differs. */
static void test_shape(void) {
  model_t m;
  char want[1024];
  make(&m);
  hvd_optimizer_t *b = base(SGD, &m, 0.25, 0.5);
  if (rank == 0)
    scaling(b);
  hvd_optimizer_t *o = dist(b, 0);
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in loss "
           "scaling: rank 0 on vs %s" TAIL,
           others_are("off"));
  refused(o, &m, want, "loss scaling on rank 0 only");
  is_int(HVD_ERR_MISMATCH, hvd_broadcast_optimizer_state(o, 0),
         "loss scaling on rank 0 only: the broadcast refuses");
  is_string("hvd_broadcast_optimizer_state: ranks disagree on the optimizer "
            "(type, parameters, state, loss scaling and clipping on or off): "
            "rank 0 and rank 1 differ in one of them",
            hvd_last_error(), "... naming it");
  hvd_optimizer_destroy(o);
}

/* ZeRO-1: each rank updates its own blocks, with its own lr if let. */
static void test_sharded(void) {
  model_t m;
  char want[1024];
  make(&m);
  hvd_optimizer_t *o = dist(base(ADAM, &m, 0.125 * (rank + 1), 0.999), 1);
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in %s" TAIL,
           lr_list());
  refused(o, &m, want, "sharded");
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, size - 1),
         "sharded: broadcast from rank %d", size - 1);
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(o), "sharded: zero_grad");
  grads(&m, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(o), "sharded: then a step succeeds");
  is_int(HVD_SUCCESS, hvd_verify_parameters(m.p, NP),
         "sharded: the same values on every rank");
  hvd_optimizer_destroy(o);
}

/* The last rank joins at once and the others' learning rates differ:
 * their step names them, the joined rank left out (its gathers are
 * allreduces, which go on while a rank has joined). At np 2 the one
 * rank left agrees with itself. */
static void test_join_differ(void) {
  model_t m;
  char want[1024] = "";
  int last = -1;
  make(&m);
  hvd_optimizer_t *o = dist(base(SGD, &m, 0.125 * (rank + 1), 0.5), 0);
  hvd_result_t rc = HVD_SUCCESS;
  if (rank < size - 1) {
    grads(&m, 0);
    rc = hvd_optimizer_step(o);
  }
  if (rc != HVD_SUCCESS)
    snprintf(want, sizeof want, "%s", hvd_last_error());
  hvd_result_t jrc = hvd_join(&last);
  char expect[1024] = "";
  if (rank < size - 1 && size > 2) {
    size_t at = (size_t)snprintf(expect, sizeof expect,
                                 "hvd_optimizer_step: the ranks' optimizers "
                                 "differ in lr: rank 0 0.125 vs ");
    for (int r = 1; r < size - 1; r++)
      at += (size_t)snprintf(expect + at, sizeof expect - at, "%srank %d %g",
                             r > 1 ? ", " : "", r, 0.125 * (r + 1));
    snprintf(expect + at, sizeof expect - at, TAIL);
  }
  is_int(rank < size - 1 && size > 2 ? HVD_ERR_MISMATCH : HVD_SUCCESS, rc,
         "join, lrs differ: the others' step fails where two of them differ");
  is_string(expect, want, "join, lrs differ: naming them, not the joined rank");
  is_int(HVD_SUCCESS, jrc, "join, lrs differ: every rank joined");
  hvd_optimizer_destroy(o);
}

/* The last rank joins at once; the others step with it joined. */
static void test_join(void) {
  model_t m;
  char want[1024];
  int last = -1;
  make(&m);
  hvd_optimizer_t *o = dist(base(ADAM, &m, 0.25, 0.999), 0);
  hvd_result_t rc = HVD_SUCCESS;
  if (rank < size - 1) {
    grads(&m, 0);
    rc = hvd_optimizer_step(o);
  }
  hvd_result_t jrc = hvd_join(&last);
  is_int(HVD_SUCCESS, rc, "join: the others step, the last rank joined");
  is_int(HVD_SUCCESS, jrc, "join: every rank joined");
  snprintf(want, sizeof want,
           "hvd_optimizer_step: the ranks' optimizers differ in update "
           "count: rank 0 1 vs rank %d 0" TAIL,
           size - 1);
  hvd_optimizer_zero_grad(o);
  refused(o, &m, want, "join: then all step");
  is_int(HVD_SUCCESS, hvd_broadcast_parameters(m.p, NP, last),
         "join: the parameters from the last to join (%d)", last);
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, last),
         "join: and the optimizer state");
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(o), "join: zero_grad");
  grads(&m, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(o), "join: then a step succeeds");
  is_int(2, (int)hvd_optimizer_steps(o), "join: two updates on every rank");
  is_int(HVD_SUCCESS, hvd_verify_parameters(m.p, NP),
         "join: the same values on every rank");
  hvd_optimizer_destroy(o);
}

/* check_hparams 0: nothing stops the drift but hvd_verify_parameters. */
static void test_off(void) {
  model_t m;
  make(&m);
  hvd_optimizer_t *o = dist_checked(base(SGD, &m, 0.125 * (rank + 1), 0), 0, 0);
  grads(&m, 0);
  is_int(HVD_SUCCESS, hvd_optimizer_step(o),
         "check_hparams 0: different learning rates step");
  is_int(HVD_ERR_CORRUPT, hvd_verify_parameters(m.p, NP),
         "check_hparams 0: and the values differ");
  hvd_optimizer_destroy(o);
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  is_int(1, d.check_hparams, "check_hparams: 1 by default");
  d.check_hparams = 2;
  hvd_optimizer_t *b = base(SGD, &m, 0.1, 0);
  is_int(HVD_ERR_INVALID_ARG, hvd_distributed_optimizer(b, &d, &o),
         "check_hparams 2: refused");
  is_string("hvd_distributed_optimizer: check_hparams 2 is not 0 or 1",
            hvd_last_error(), "check_hparams 2: message");
  hvd_optimizer_destroy(b);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  rank = hvd_rank();
  size = hvd_size();
  if (size < 2) {
    skip(116, "one rank: nothing to differ");
  } else {
    test_lr();
    test_cases();
    test_root_groups();
    test_shape();
    test_sharded();
    test_join();
    test_join_differ();
    test_off();
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
