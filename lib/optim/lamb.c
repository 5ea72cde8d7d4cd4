/*
 * lamb.c - the built-in LAMB (hvd_lamb_create): apex's FusedLAMB
 * (adam_w_mode) as an ops table, the large-batch optimizer of BERT's
 * pretraining recipes. Its update of a parameter is scaled by a trust
 * ratio |w| / |u| of norms over the whole parameter, so a step takes two
 * passes (optim_math.h, "LAMB"):
 * 1. one that writes nothing: each parameter's sums of w^2 and u^2, in
 *    double, by gradient clipping's chunks (host loops, and one batched
 *    device launch and one copy back for the device parameters: the same
 *    bits); a sharded optimizer's blocks give parts, and one allreduce of
 *    2 n doubles ("hvd.lamb.norms.<first parameter's name>", the
 *    optimizer's own) makes the totals;
 * 2. the update with each parameter's step size, m and s recomputed as
 *    in the first (the same bits) and stored.
 * A non-finite norm fails between them, so nothing is updated.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "optim/optim_math.h"
#include "optim/optimizer.h"

static const char *const lamb_state[] = {"exp_avg", "exp_avg_sq"};

void hvd_lamb_options_init(hvd_lamb_options_t *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->lr = 0.001;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-6;
  o->weight_decay = 0.01;
  o->bias_correction = 1;
}

/* The first pass: b->lamb->part[2 i], [2 i + 1] this rank's sums of
 * parameter i's w^2 and u^2 (host ones in loops, device ones in one
 * batch). */
static hvd_result_t first_pass(const hvd__optim_builtin_t *b,
                               const hvd_param_t *params, int n,
                               const hvd_tensor_t *state, int64_t step) {
  const hvd_lamb_options_t *o = &b->o.lamb;
  hvd__optim_lamb_t *l = b->lamb;
  const hvd__km_lamb_t a = hvd__km_lamb_args(o, step);
  int m = 0;
  for (int i = 0; i < n; i++) {
    const hvd_param_t *p = &params[i];
    const int64_t count = hvd_tensor_numel(&p->value);
    const float wd = (float)hvd__optim_wd(b, i, o->weight_decay);
    float *mo = state[2 * i].data, *so = state[2 * i + 1].data;
    if (p->value.device == HVD_CPU || count == 0) {
      hvd__km_lamb_span(a, wd, p->value.data, p->grad.data, mo, so, count,
                        l->part + 2 * i);
      continue;
    }
    l->span[m] =
        (hvd__odev_lamb_t){p->value.data, p->grad.data, mo, so, count, wd, 0};
    l->which[m++] = i;
  }
  if (m == 0)
    return HVD_SUCCESS;
  hvd_result_t rc =
      hvd__odev_lamb_norms(HVD__STEP_WHO, b->odev, l->span, m, o, step, l->dev);
  for (int k = 0; k < m && rc == HVD_SUCCESS; k++) {
    l->part[2 * l->which[k]] = l->dev[2 * k];
    l->part[2 * l->which[k] + 1] = l->dev[2 * k + 1];
  }
  return rc;
}

/* The error of a non-finite total, the same on every rank: this rank's
 * own failure (local), else the first parameter whose part is not
 * finite here; sharded, the lowest failing rank's on every rank. */
static hvd_result_t nonfinite(const hvd__optim_builtin_t *b,
                              const hvd_param_t *params, int n,
                              hvd_result_t local, const char *local_msg) {
  const hvd__optim_lamb_t *l = b->lamb;
  hvd_result_t rc = HVD_SUCCESS;
  if (local != HVD_SUCCESS)
    rc = hvd__set_error_msg(local, local_msg);
  for (int i = 0; i < n && rc == HVD_SUCCESS; i++)
    if (!isfinite(l->part[2 * i]))
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          HVD__STEP_WHO ": LAMB: parameter '%s' holds an inf "
                                        "or a NaN; nothing was updated",
                          params[i].name);
    else if (!isfinite(l->part[2 * i + 1]))
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          HVD__STEP_WHO ": LAMB: the update of parameter '%s' "
                                        "is not finite (an inf or a NaN in "
                                        "its gradient); nothing was updated",
                          params[i].name);
  if (*b->sharded)
    rc = hvd__optim_agree(b->names->lamb_nonfinite, rc);
  if (rc == HVD_SUCCESS) /* not reached: some part holds what a total did */
    rc = hvd__set_error_msg(HVD_ERR_INVALID_ARG,
                            HVD__STEP_WHO ": LAMB: a norm is not finite; "
                                          "nothing was updated");
  return rc;
}

/* The totals (l->total): the parts, summed over the ranks when sharded.
 * A sharded rank whose first pass failed still joins the sum (its parts
 * NaN), so that no peer waits in it for ever; then every rank fails. */
static hvd_result_t totals(const hvd__optim_builtin_t *b,
                           const hvd_param_t *params, int n,
                           hvd_result_t local) {
  hvd__optim_lamb_t *l = b->lamb;
  const int sharded = *b->sharded;
  char msg[HVD__ERRMSG_MAX] = "";
  if (local != HVD_SUCCESS) {
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
    for (int i = 0; i < 2 * n; i++)
      l->part[i] = NAN;
  }
  memcpy(l->total, l->part, 2 * (size_t)n * sizeof *l->total);
  if (sharded && n > 0) {
    int64_t len = 2 * (int64_t)n;
    hvd_tensor_t t = hvd_tensor_make(l->total, HVD_FLOAT64, 1, &len);
    hvd_result_t rc =
        hvd_allreduce(b->names->lamb_norms, &t, &t, HVD_SUM, 1.0, 1.0);
    if (rc != HVD_SUCCESS)
      return rc;
  }
  int bad = local != HVD_SUCCESS;
  for (int i = 0; i < 2 * n && !bad; i++)
    bad = !isfinite(l->total[i]);
  return bad ? nonfinite(b, params, n, local, msg) : HVD_SUCCESS;
}

/* Parameter i's step size from its totals. */
static float ratio_of(const hvd__optim_builtin_t *b, int i, double lr) {
  const hvd_lamb_options_t *o = &b->o.lamb;
  const double wdi = hvd__optim_wd(b, i, o->weight_decay);
  return hvd__km_lamb_ratio(b->lamb->total[2 * i], b->lamb->total[2 * i + 1],
                            o->always_adapt || wdi != 0,
                            hvd__optim_lr(b, i, lr));
}

/* The second pass: each parameter's step size from its totals; the
 * device ones in one batch, launched first (a launch that fails leaves
 * the host ones as they were), then the host ones in loops while it
 * runs; the device's done on return. */
static hvd_result_t second_pass(const hvd__optim_builtin_t *b,
                                hvd_param_t *params, int n, hvd_tensor_t *state,
                                int64_t step, double lr) {
  const hvd_lamb_options_t *o = &b->o.lamb;
  hvd__optim_lamb_t *l = b->lamb;
  const hvd__km_lamb_t a = hvd__km_lamb_args(o, step);
  int m = 0;
  for (int i = 0; i < n; i++) {
    hvd_param_t *p = &params[i];
    const int64_t count = hvd_tensor_numel(&p->value);
    if (count > 0 && p->value.device != HVD_CPU)
      l->span[m++] =
          (hvd__odev_lamb_t){p->value.data,
                             p->grad.data,
                             state[2 * i].data,
                             state[2 * i + 1].data,
                             count,
                             (float)hvd__optim_wd(b, i, o->weight_decay),
                             ratio_of(b, i, lr)};
  }
  hvd_result_t rc = hvd__odev_lamb_apply(HVD__STEP_WHO, b->odev, l->span, m, o,
                                         step); /* m 0: nothing */
  if (rc != HVD_SUCCESS)
    return rc;
  for (int i = 0; i < n; i++) {
    hvd_param_t *p = &params[i];
    const int64_t count = hvd_tensor_numel(&p->value);
    if (count == 0 || p->value.device != HVD_CPU)
      continue;
    const float wd = (float)hvd__optim_wd(b, i, o->weight_decay);
    const float ratio = ratio_of(b, i, lr);
    float *v = p->value.data, *mo = state[2 * i].data,
          *so = state[2 * i + 1].data;
    const float *g = p->grad.data;
    for (int64_t j = 0; j < count; j++)
      hvd__km_lamb_apply_elem(a, wd, ratio, v, g, mo, so, j);
  }
  return m > 0 ? hvd__odev_sync(HVD__STEP_WHO, b->odev) : HVD_SUCCESS;
}

static hvd_result_t lamb_step(void *ctx, hvd_param_t *params, int n,
                              hvd_tensor_t *state, int64_t step, double lr) {
  const hvd__optim_builtin_t *b = ctx;
  const int sharded = *b->sharded;
  hvd_result_t local = first_pass(b, params, n, state, step);
  if (local != HVD_SUCCESS && !sharded)
    return local;
  hvd_result_t rc = totals(b, params, n, local);
  if (rc != HVD_SUCCESS)
    return rc;
  return second_pass(b, params, n, state, step, lr);
}

static hvd_result_t check_lamb(const char *who, const hvd_lamb_options_t *o) {
  if (o == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  return hvd__optim_check_adam_like(who, o->lr, o->beta1, o->beta2, o->eps,
                                    o->weight_decay);
}

hvd_result_t hvd_lamb_create(hvd_param_t *params, int n,
                             const hvd_lamb_options_t *o,
                             hvd_optimizer_t **out) {
  static const char who[] = "hvd_lamb_create";
  hvd_result_t rc = hvd__optim_check_out(who, out);
  if (rc == HVD_SUCCESS)
    rc = check_lamb(who, o);
  if (rc != HVD_SUCCESS)
    return rc;
  const hvd_optimizer_ops_t ops = {"LAMB", 2, lamb_state, lamb_step,
                                   hvd__optim_builtin_free};
  HVD__CHECK(hvd__optim_create_builtin(
      who, params, n, o, sizeof *o, &ops, o->lr,
      offsetof(hvd_lamb_options_t, weight_decay), out));
  hvd__optim_builtin_t *b = (*out)->ctx;
  const size_t k = n > 0 ? (size_t)n : 1;
  hvd__optim_lamb_t *l = calloc(1, sizeof *l);
  if (l == NULL || (l->part = malloc(2 * k * sizeof *l->part)) == NULL ||
      (l->total = malloc(2 * k * sizeof *l->total)) == NULL ||
      (l->dev = malloc(2 * k * sizeof *l->dev)) == NULL ||
      (l->span = malloc(k * sizeof *l->span)) == NULL ||
      (l->which = malloc(k * sizeof *l->which)) == NULL) {
    hvd__optim_lamb_free(l);
    hvd_optimizer_destroy(*out);
    *out = NULL;
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  }
  b->lamb = l;
fail:
  return rc;
}

void hvd__optim_lamb_free(hvd__optim_lamb_t *l) {
  if (l == NULL)
    return;
  free(l->part);
  free(l->total);
  free(l->dev);
  free(l->span);
  free(l->which);
  free(l);
}
