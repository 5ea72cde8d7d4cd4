/*
 * clip.c - gradient clipping by the global norm in the optimizer (hvd.h,
 * "Gradient clipping"): torch.nn.utils.clip_grad_norm_, which DDP and
 * Horovod users call between backward and step, done by the step itself
 * where the gradients are final: after the reductions, after loss
 * scaling's unscale and its agreed inf/NaN check, on the float32
 * gradients the update reads (hvd__optim_apply_on: a float32 parameter's
 * grad, a low-precision one's master gradient, a sharded optimizer's
 * blocks).
 *
 * The norm: each gradient's sum of squares (double) and largest
 * magnitude by optim_math.h's chunks, on the host (a loop) or the GPU
 * (one batched launch and one copy back, hvd__odev_norm_batch: the same
 * bits), folded in parameter order. A sharded optimizer's ranks hold
 * blocks: one allreduce of a double ("hvd.clip.norm.<first parameter's
 * name>", the optimizer's own, core->names: the sum of
 * squares, or the largest magnitude) makes the total. Over coefficient
 * max_norm / (norm + 1e-6), every gradient times it rounded to float32,
 * in place (host loop; one batched launch for the device ones).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "optim/optim_math.h"
#include "optim/optimizer.h"

#define WHO "hvd_optimizer_step"

struct hvd__clip {
  double max_norm;
  double norm_type; /* 2 or INFINITY */
  double last;      /* the last clipped step's norm (NAN: none) */
  int n;            /* the core's parameters */
  double *parts;    /* [n][2]: each gradient's sum of squares, largest */
  const float **x;  /* the device gradients of a step, */
  int64_t *count;   /* their elements, */
  int *which;       /* parameters */
  double *dparts;   /* and parts (as parts, in their order) */
  hvd__odev_convert_t *conv; /* the device gradients' scaling */
};

void hvd__clip_free(hvd__clip_t *c) {
  if (c == NULL)
    return;
  free(c->parts);
  free(c->x);
  free(c->count);
  free(c->which);
  free(c->dparts);
  free(c->conv);
  free(c);
}

/* Each gradient's parts: the host's in a loop, the device's in one batch. */
static hvd_result_t grad_parts(hvd__clip_t *c, hvd_optimizer_t *core,
                               const hvd_param_t *params) {
  int m = 0;
  for (int i = 0; i < c->n; i++) {
    const hvd_tensor_t *g = &params[i].grad;
    const int64_t count = hvd_tensor_numel(g);
    if (g->device == HVD_CPU || count == 0) {
      hvd__km_norm_span(g->data, count, c->parts + 2 * i);
    } else {
      c->x[m] = g->data;
      c->count[m] = count;
      c->which[m++] = i;
    }
  }
  if (m == 0)
    return HVD_SUCCESS;
  hvd_result_t rc =
      hvd__odev_norm_batch(WHO, core->odev, c->x, c->count, m, c->dparts);
  for (int k = 0; k < m && rc == HVD_SUCCESS; k++) {
    c->parts[2 * c->which[k]] = c->dparts[2 * k];
    c->parts[2 * c->which[k] + 1] = c->dparts[2 * k + 1];
  }
  return rc;
}

/* The first parameter whose part is not finite (-1: none). */
static int first_nonfinite(const hvd__clip_t *c) {
  for (int i = 0; i < c->n; i++)
    if (!isfinite(c->parts[2 * i]))
      return i;
  return -1;
}

/* The error of a non-finite norm, the same on every rank: this rank's
 * own failure (local: its parts could not be made; they were NaN in the
 * total), else the first parameter whose part is not finite; sharded,
 * the lowest failing rank's message on every rank. */
static hvd_result_t nonfinite(const hvd__clip_t *c, const hvd_optimizer_t *core,
                              const hvd_param_t *params, hvd_result_t local,
                              const char *local_msg) {
  const int bad = first_nonfinite(c);
  hvd_result_t rc = HVD_SUCCESS;
  if (local != HVD_SUCCESS)
    rc = hvd__set_error_msg(local, local_msg);
  else if (bad >= 0)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        WHO ": gradient clipping: the gradient norm is not "
                            "finite (parameter '%s' holds an inf or a NaN); "
                            "nothing was updated",
                        params[bad].name);
  if (core->sharded)
    rc = hvd__optim_agree(core->names.clip_nonfinite, rc);
  if (rc == HVD_SUCCESS) /* not reached: some part holds what the total did */
    rc = hvd__set_error_msg(HVD_ERR_INVALID_ARG,
                            WHO ": gradient clipping: the gradient norm is not "
                                "finite; nothing was updated");
  return rc;
}

/* The total over this rank's parts, and over the ranks when core is
 * sharded. */
static hvd_result_t total(const hvd__clip_t *c, const hvd_optimizer_t *core,
                          double *out) {
  double sq = 0, mx = 0;
  for (int i = 0; i < c->n; i++) {
    sq += c->parts[2 * i];
    mx = hvd__km_max(c->parts[2 * i + 1], mx);
  }
  const int l2 = c->norm_type == 2;
  /* the largest magnitudes skip NaNs: a sum of squares that is not
   * finite makes the total infinite */
  double v = l2 ? sq : isfinite(sq) ? mx : INFINITY;
  if (core->sharded) {
    int64_t one = 1;
    hvd_tensor_t t = hvd_tensor_make(&v, HVD_FLOAT64, 1, &one);
    hvd_result_t rc = hvd_allreduce(core->names.clip_norm, &t, &t,
                                    l2 ? HVD_SUM : HVD_MAX, 1.0, 1.0);
    if (rc != HVD_SUCCESS)
      return rc;
  }
  *out = l2 ? sqrt(v) : v;
  return HVD_SUCCESS;
}

/* Every gradient times f (float32), in place; the device's done on
 * return, so that any step() reads them scaled (a custom one's kernels
 * on a stream of their own too). */
static hvd_result_t scale_grads(hvd__clip_t *c, hvd_optimizer_t *core,
                                hvd_param_t *params, double coef) {
  const float f = (float)coef;
  int m = 0;
  for (int i = 0; i < c->n; i++) {
    hvd_tensor_t *g = &params[i].grad;
    const int64_t count = hvd_tensor_numel(g);
    if (g->device == HVD_CPU || count == 0) {
      float *x = g->data;
      for (int64_t j = 0; j < count; j++)
        x[j] = x[j] * f;
    } else {
      c->conv[m++] =
          (hvd__odev_convert_t){g->data, g->data, HVD_FLOAT32, count};
    }
  }
  if (m == 0)
    return HVD_SUCCESS;
  /* the conversion kernel's found-inf flag (mixed precision's, read
   * already this step), made if there is none: nothing here overflows */
  hvd_result_t rc = hvd__odev_flag_reset(WHO, core->odev);
  if (rc == HVD_SUCCESS)
    rc = hvd__odev_to_master_batch(WHO, core->odev, c->conv, m, coef);
  if (rc == HVD_SUCCESS)
    rc = hvd__odev_sync(WHO, core->odev);
  return rc;
}

hvd_result_t hvd__clip_apply(hvd_optimizer_t *core, hvd_param_t *params) {
  hvd__clip_t *c = core->clip;
  hvd_result_t rc;
  char msg[HVD__ERRMSG_MAX] = "";
  double norm = NAN;
  c->last = NAN;
  /* a sharded rank that cannot make its parts still joins the total (as
   * NaN), so that no peer waits in it for ever */
  hvd_result_t local = grad_parts(c, core, params);
  if (local != HVD_SUCCESS && !core->sharded)
    return local;
  if (local != HVD_SUCCESS) {
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
    for (int i = 0; i < 2 * c->n; i++)
      c->parts[i] = NAN;
  }
  HVD__CHECK(total(c, core, &norm));
  if (!isfinite(norm))
    return nonfinite(c, core, params, local, msg);
  c->last = norm;
  const double coef = c->max_norm / (norm + 1e-6);
  if (coef < 1)
    rc = scale_grads(c, core, params, coef);
fail:
  return rc;
}

void hvd__clip_forget(hvd__clip_t *c) {
  if (c != NULL)
    c->last = NAN;
}

int hvd__clip_hparams(hvd__clip_t *c, hvd__hp_t *hp) {
  if (c == NULL)
    return 0;
  hp[0] = (hvd__hp_t){"max_norm", 'd', &c->max_norm, 0, HVD__HP_MAXNORM};
  hp[1] = (hvd__hp_t){"norm_type", 'd', &c->norm_type, 0, HVD__HP_NORMTYPE};
  return 2;
}

hvd_result_t hvd_optimizer_set_grad_clipping(hvd_optimizer_t *opt,
                                             double max_norm,
                                             double norm_type) {
  static const char who[] = "hvd_optimizer_set_grad_clipping";
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", who);
  if (!(max_norm >= 0)) /* NaN too */
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: max_norm %g is out of range [0, inf] (0 turns "
                          "clipping off, inf measures the norm only)",
                          who, max_norm);
  if (norm_type != 2 && norm_type != INFINITY)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: norm_type %g is not 2 or INFINITY", who,
                          norm_type);
  hvd_optimizer_t *core = hvd__optim_core(opt);
  if (max_norm == 0) {
    hvd__clip_free(core->clip);
    core->clip = NULL;
    return HVD_SUCCESS;
  }
  hvd__clip_t *c = core->clip;
  if (c == NULL) {
    const size_t n = core->n > 0 ? (size_t)core->n : 1;
    c = calloc(1, sizeof *c);
    if (c == NULL || (c->parts = malloc(2 * n * sizeof *c->parts)) == NULL ||
        (c->x = malloc(n * sizeof *c->x)) == NULL ||
        (c->count = malloc(n * sizeof *c->count)) == NULL ||
        (c->which = malloc(n * sizeof *c->which)) == NULL ||
        (c->dparts = malloc(2 * n * sizeof *c->dparts)) == NULL ||
        (c->conv = malloc(n * sizeof *c->conv)) == NULL) {
      hvd__clip_free(c);
      return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
    }
    c->n = core->n;
    c->last = NAN;
    core->clip = c;
  }
  c->max_norm = max_norm;
  c->norm_type = norm_type;
  return HVD_SUCCESS;
}

double hvd_optimizer_grad_norm(const hvd_optimizer_t *opt) {
  if (opt == NULL || hvd_optimizer_step_skipped(opt))
    return NAN;
  const hvd__clip_t *c = hvd__optim_core_const(opt)->clip;
  return c != NULL ? c->last : NAN;
}
