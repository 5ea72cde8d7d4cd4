/*
 * clip.c - gradient clipping by the global norm (lib/optim/clip.c,
 * hvd_optimizer_set_grad_clipping) on host parameters, at np 1..4.
 *
 * The model: parameters "a" (5 elements), "b" (20000: two of the norm's
 * chunks of 16384) and "c" (7), float32, distributed SGD with lr 1 and no
 * momentum. Rank r's gradient element i of parameter p is
 * ((i * 7 + r * 3 + p * 11) % 13 - 6) / 8, so the ranks differ and the
 * averages are not round. Each case runs a clipped optimizer beside an
 * unclipped one on the same values and gradients; after a step the
 * unclipped one's grads are the averaged gradients G:
 *  - L2, max_norm half the norm: hvd_optimizer_grad_norm is the norm of G
 *    (a sum in double here: within 1e-12), the same bits on every rank;
 *    the clipped grads are G times (float)(max_norm / (norm + 1e-6)) bit
 *    for bit, and the values moved by them (not by G);
 *  - L2, max_norm twice the norm, and infinite (torch's idiom to measure
 *    the norm only): nothing clipped, the values equal the unclipped
 *    run's bit for bit, the norm reported;
 *  - the infinity norm: exactly the largest |G|;
 *  - ZeRO-1 (shard_optimizer_state): three steps, L2 and infinity, equal
 *    to the unsharded clipped run bit for bit (values and norm), also
 *    with clipping set on the base before the wrapper sharded it;
 *  - a step that fails before clipping (no new gradients): norm NaN;
 *  - a NaN in the last rank's gradient of "b" (its last element): the
 *    step fails on every rank with the exact message (sharded: " (on rank
 *    R)", R the owner of that element's block), nothing updated, the
 *    step count unchanged, the norm NaN;
 *  - loss scaling: an inf on the last rank skips the step on every rank
 *    (no clipping error), the norm NaN and the scale halved; the next
 *    step clips;
 *  - bfloat16 "b": its master gradient is clipped, its grad left as the
 *    reduction made it; the norm is that of the reduced bfloat16 grads;
 *  - a plain (not distributed) optimizer: the norm of its own gradients;
 *  - refusals with their messages, clipping turned off by max_norm 0.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
static const int64_t len[NP] = {5, 20000, 7};
static const char *const names[NP] = {"a", "b", "c"};
static int rank, size;

typedef struct model {
  hvd_dtype_t dt[NP];
  void *w[NP], *g[NP];
  hvd_param_t p[NP];
} model_t;

static void make(model_t *m, hvd_dtype_t b_dtype) {
  for (int k = 0; k < NP; k++) {
    m->dt[k] = k == 1 ? b_dtype : HVD_FLOAT32;
    m->w[k] = hvdt_calloc((size_t)len[k], hvdt_size(m->dt[k]));
    m->g[k] = hvdt_calloc((size_t)len[k], hvdt_size(m->dt[k]));
    for (int64_t i = 0; i < len[k]; i++)
      hvdt_put(m->dt[k], m->w[k], i, (double)((i % 5) - 2) / 4);
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], m->dt[k], 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], m->dt[k], 1, &len[k]);
  }
}

static void drop(model_t *m) {
  for (int k = 0; k < NP; k++)
    free(m->w[k]), free(m->g[k]);
}

/* This rank's gradients times scale; a `bad` value at b's last element on
 * the last rank when bad is not 0. */
static void backward(model_t *m, double scale, double bad) {
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++)
      hvdt_put(m->dt[k], m->g[k], i,
               scale * (double)((i * 7 + rank * 3 + k * 11) % 13 - 6) / 8);
  if (bad != 0 && rank == size - 1)
    hvdt_put(m->dt[1], m->g[1], len[1] - 1, bad);
}

/* With clip_first > 0, clipping to that L2 norm is set on the base
 * before it is wrapped (the wrapper then shards what clips). */
static hvd_optimizer_t *sgd_clipped(model_t *m, int distributed, int shard,
                                    double clip_first) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1.0;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(m->p, NP, &so, &base) != HVD_SUCCESS)
    bail("hvd_sgd_create: %s", hvd_last_error());
  if (clip_first > 0 &&
      hvd_optimizer_set_grad_clipping(base, clip_first, 2) != HVD_SUCCESS)
    bail("clipping: %s", hvd_last_error());
  if (!distributed)
    return base;
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.shard_optimizer_state = shard;
  if (hvd_distributed_optimizer(base, &o, &opt) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  return opt;
}

static hvd_optimizer_t *sgd(model_t *m, int distributed, int shard) {
  return sgd_clipped(m, distributed, shard, 0);
}

static void clip(hvd_optimizer_t *opt, double max_norm, double type) {
  if (hvd_optimizer_set_grad_clipping(opt, max_norm, type) != HVD_SUCCESS)
    bail("hvd_optimizer_set_grad_clipping: %s", hvd_last_error());
}

static hvd_result_t step(model_t *m, hvd_optimizer_t *opt, double bad) {
  if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
    bail("zero_grad: %s", hvd_last_error());
  backward(m, hvd_optimizer_loss_scale(opt), bad);
  return hvd_optimizer_step(opt);
}

static void step_ok(model_t *m, hvd_optimizer_t *opt) {
  if (step(m, opt, 0) != HVD_SUCCESS)
    bail("step: %s", hvd_last_error());
}

/* The norm of m's float32 grads, in double: L2 or the largest. */
static double norm_of(const model_t *m, double type) {
  double sq = 0, mx = 0;
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++) {
      double v = hvdt_get(m->dt[k], m->g[k], i);
      sq += v * v;
      mx = fmax(mx, fabs(v));
    }
  return type == 2 ? sqrt(sq) : mx;
}

/* Every rank's bits of x are rank 0's. */
static int same_everywhere(double x) {
  double *all = hvdt_calloc((size_t)size, sizeof *all);
  MPI_Allgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
  int same = 1;
  for (int r = 0; r < size; r++)
    same &= memcmp(&all[r], &all[0], sizeof x) == 0;
  free(all);
  return same;
}

static int same_values(const model_t *a, const model_t *b) {
  int same = 1;
  for (int k = 0; k < NP; k++)
    same &= memcmp(a->w[k], b->w[k], (size_t)len[k] * hvdt_size(a->dt[k])) == 0;
  return same;
}

/* The clipped run (c) against the unclipped (u) after one step each. */
static void test_l2(double ratio) {
  const int active = ratio < 1;
  char what[64];
  snprintf(what, sizeof what, "L2, max_norm %g x the norm", ratio);
  model_t u, c;
  make(&u, HVD_FLOAT32);
  make(&c, HVD_FLOAT32);
  hvd_optimizer_t *ou = sgd(&u, 1, 0), *oc = sgd(&c, 1, 0);
  step_ok(&u, ou);
  const double want = norm_of(&u, 2);
  clip(oc, ratio * want, 2);
  ok(isnan(hvd_optimizer_grad_norm(oc)), "%s: no norm before a step", what);
  step_ok(&c, oc);
  const double got = hvd_optimizer_grad_norm(oc);
  ok(fabs(got - want) <= 1e-12 * want,
     "%s: the norm of the averaged gradients (%.17g, here %.17g)", what, got,
     want);
  ok(same_everywhere(got), "%s: the same norm on every rank", what);
  const float f = active ? (float)(ratio * want / (got + 1e-6)) : 1.0f;
  int grads = 1, moved = 0;
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++) {
      const float gu = ((float *)u.g[k])[i], gc = ((float *)c.g[k])[i];
      grads &= gc == (active ? gu * f : gu);
    }
  ok(grads, "%s: the grads %s", what,
     active ? "times (float)(max_norm / (norm + 1e-6)), bit for bit"
            : "unchanged");
  moved = !same_values(&u, &c);
  ok(moved == active, "%s: the values %s the unclipped run's", what,
     active ? "differ from" : "equal");
  /* a step that fails before clipping (no new gradients) has no norm */
  ok(hvd_optimizer_step(oc) != HVD_SUCCESS &&
         isnan(hvd_optimizer_grad_norm(oc)),
     "%s: a failed step after it: the norm is NaN", what);
  hvd_optimizer_destroy(ou);
  hvd_optimizer_destroy(oc);
  drop(&u);
  drop(&c);
}

static void test_inf(void) {
  model_t u, c;
  make(&u, HVD_FLOAT32);
  make(&c, HVD_FLOAT32);
  hvd_optimizer_t *ou = sgd(&u, 1, 0), *oc = sgd(&c, 1, 0);
  step_ok(&u, ou);
  const double want = norm_of(&u, INFINITY);
  clip(oc, want / 3, INFINITY);
  step_ok(&c, oc);
  is_double(want, hvd_optimizer_grad_norm(oc), 0,
            "infinity norm: exactly the largest |averaged gradient|");
  const float f = (float)(want / 3 / (want + 1e-6));
  ok(((float *)c.g[1])[3] == ((float *)u.g[1])[3] * f,
     "infinity norm: b[3] clipped by (float)(max_norm / (norm + 1e-6))");
  hvd_optimizer_destroy(ou);
  hvd_optimizer_destroy(oc);
  drop(&u);
  drop(&c);
}

static void test_zero(double type) {
  const char *tn = type == 2 ? "L2" : "infinity";
  model_t a, b;
  make(&a, HVD_FLOAT32);
  make(&b, HVD_FLOAT32);
  hvd_optimizer_t *oa = sgd(&a, 1, 0), *ob = sgd(&b, 1, 1);
  const double max_norm = type == 2 ? 2.0 : 0.1; /* both below the norm */
  clip(oa, max_norm, type);
  clip(ob, max_norm, type);
  int norms = 1;
  for (int s = 0; s < 3; s++) {
    step_ok(&a, oa);
    step_ok(&b, ob);
    double na = hvd_optimizer_grad_norm(oa), nb = hvd_optimizer_grad_norm(ob);
    norms &= fabs(na - nb) <= 1e-14 * na && na > max_norm;
    if (!norms)
      tap_note("step %d: norms %.17g unsharded, %.17g sharded", s, na, nb);
  }
  ok(norms,
     "ZeRO-1, %s: 3 clipped steps, the norms the unsharded ones to 1e-14", tn);
  ok(same_values(&a, &b),
     "ZeRO-1, %s: the values equal the unsharded run's bit for bit", tn);
  if (type == 2) { /* clipping set on the base, then sharded by its wrapper */
    model_t e;
    make(&e, HVD_FLOAT32);
    hvd_optimizer_t *oe = sgd_clipped(&e, 1, 1, max_norm);
    for (int s = 0; s < 3; s++)
      step_ok(&e, oe);
    ok(same_values(&a, &e),
       "ZeRO-1, L2: clipping set before the wrapper sharded: the same bits");
    hvd_optimizer_destroy(oe);
    drop(&e);
  }
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  drop(&a);
  drop(&b);
}

/* b's last element's owner under ZeRO-1: n / P each, one more below n % P */
static int owner_of_last(void) {
  int64_t at = 0, n = len[1];
  for (int r = 0; r < size; r++) {
    at += n / size + (r < n % size);
    if (len[1] - 1 < at)
      return r;
  }
  return size - 1;
}

static void test_nonfinite(int shard) {
  const char *how = shard ? "sharded" : "unsharded";
  model_t m, before;
  make(&m, HVD_FLOAT32);
  make(&before, HVD_FLOAT32);
  hvd_optimizer_t *o = sgd(&m, 1, shard);
  clip(o, 1.0, 2);
  step_ok(&m, o);
  for (int k = 0; k < NP; k++)
    memcpy(before.w[k], m.w[k], (size_t)len[k] * sizeof(float));
  hvd_result_t rc = step(&m, o, NAN);
  char want[300];
  int r = shard ? owner_of_last() : 0;
  snprintf(want, sizeof want,
           "hvd_optimizer_step: gradient clipping: the gradient norm is not "
           "finite (parameter 'b' holds an inf or a NaN); nothing was "
           "updated%s",
           "");
  if (r > 0)
    snprintf(want + strlen(want), sizeof want - strlen(want), " (on rank %d)",
             r);
  is_int(HVD_ERR_INVALID_ARG, rc, "a NaN, %s: the step fails on every rank",
         how);
  is_string(want, hvd_last_error(), "a NaN, %s: its message", how);
  ok(same_values(&m, &before), "a NaN, %s: nothing updated", how);
  is_int(1, (int)hvd_optimizer_steps(o), "a NaN, %s: the step not counted",
         how);
  ok(isnan(hvd_optimizer_grad_norm(o)), "a NaN, %s: the norm is NaN", how);
  is_int(HVD_SUCCESS, step(&m, o, 0), "a NaN, %s: the next step runs", how);
  hvd_optimizer_destroy(o);
  drop(&m);
  drop(&before);
}

static void test_scaling(void) {
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *o = sgd(&m, 1, 0);
  if (hvd_optimizer_set_loss_scaling(o, NULL) != HVD_SUCCESS)
    bail("loss scaling: %s", hvd_last_error());
  clip(o, 1.0, 2);
  is_int(HVD_SUCCESS, step(&m, o, INFINITY),
         "loss scaling: an inf on the last rank: the step returns success");
  ok(hvd_optimizer_step_skipped(o) && hvd_optimizer_steps(o) == 0,
     "loss scaling: skipped on every rank, not clipped");
  ok(isnan(hvd_optimizer_grad_norm(o)), "loss scaling: no norm (skipped)");
  is_double(32768, hvd_optimizer_loss_scale(o), 0,
            "loss scaling: the scale halved");
  step_ok(&m, o);
  const double n = hvd_optimizer_grad_norm(o);
  ok(!hvd_optimizer_step_skipped(o) && n > 1 && isfinite(n),
     "loss scaling: the next step clips the unscaled gradients (norm %g)", n);
  hvd_optimizer_destroy(o);
  drop(&m);
}

static void test_bf16(void) {
  model_t u, c;
  make(&u, HVD_BFLOAT16);
  make(&c, HVD_BFLOAT16);
  hvd_optimizer_t *ou = sgd(&u, 1, 0), *oc = sgd(&c, 1, 0);
  step_ok(&u, ou);
  const double want = norm_of(&u, 2);
  clip(oc, want / 2, 2);
  step_ok(&c, oc);
  const double got = hvd_optimizer_grad_norm(oc);
  ok(fabs(got - want) <= 1e-12 * want,
     "bfloat16 b: the norm of the reduced gradients (%.17g, here %.17g)", got,
     want);
  ok(memcmp(u.g[1], c.g[1], (size_t)len[1] * 2) == 0,
     "bfloat16 b: its grad left as reduced (the master gradient clipped)");
  ok(!same_values(&u, &c), "bfloat16 b: the values moved less");
  hvd_optimizer_destroy(ou);
  hvd_optimizer_destroy(oc);
  drop(&u);
  drop(&c);
}

static void test_plain(void) {
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *o = sgd(&m, 0, 0);
  clip(o, 1.0, 2);
  step_ok(&m, o);
  model_t mine;
  make(&mine, HVD_FLOAT32);
  backward(&mine, 1.0, 0);
  const double want = norm_of(&mine, 2);
  ok(fabs(hvd_optimizer_grad_norm(o) - want) <= 1e-12 * want,
     "a plain optimizer: the norm of this rank's own gradients");
  hvd_optimizer_destroy(o);
  drop(&m);
  drop(&mine);
}

static void test_refusals(void) {
  static const char fn[] = "hvd_optimizer_set_grad_clipping";
  char want[200];
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *o = sgd(&m, 1, 0);
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_set_grad_clipping(NULL, 1, 2),
               "hvd_optimizer_set_grad_clipping: opt is NULL", "opt NULL");
  static const double bad[2] = {-1, NAN};
  for (int i = 0; i < 2; i++) {
    snprintf(want, sizeof want,
             "%s: max_norm %g is out of range [0, inf] (0 turns clipping "
             "off, inf measures the norm only)",
             fn, bad[i]);
    hvdt_refused(HVD_ERR_INVALID_ARG,
                 hvd_optimizer_set_grad_clipping(o, bad[i], 2), want,
                 i == 0 ? "max_norm -1" : "max_norm NaN");
  }
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_optimizer_set_grad_clipping(o, 1, 1),
      "hvd_optimizer_set_grad_clipping: norm_type 1 is not 2 or INFINITY",
      "norm_type 1");
  ok(isnan(hvd_optimizer_grad_norm(NULL)), "grad_norm(NULL) is NaN");
  clip(o, 1.0, 2);
  clip(o, 0, 2);
  step_ok(&m, o);
  ok(isnan(hvd_optimizer_grad_norm(o)), "max_norm 0: clipping off, no norm");
  hvd_optimizer_destroy(o);
  drop(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_l2(0.5);
  test_l2(2.0);
  test_l2(INFINITY); /* the norm measured, nothing clipped */
  test_inf();
  test_zero(2);
  test_zero(INFINITY);
  test_nonfinite(0);
  test_nonfinite(1);
  test_scaling();
  test_bf16();
  test_plain();
  test_refusals();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
