/*
 * optimizer.c - plain optimizers: an ops table over borrowed parameters
 * plus hvd-owned state tensors (checked and allocated by create), the
 * plain class, and the public calls, which dispatch through the class
 * table (optimizer.h) to the plain optimizer or the distributed wrapper.
 * The built-ins SGD (sgd.c) and Adam/AdamW (adam.c) are ops tables with
 * torch.optim's numerics: element math in float (the tensors are float32),
 * scalar factors in double, rounded to float once per step.
 *
 * Parameters may be host tensors or tensors on the rank's GPU, each on its
 * own (a list may mix them). A device parameter's state lives on its
 * device, and the built-ins update all device parameters with one batched
 * kernel launch (optim_kernels.cu, the same math) on the
 * optimizer's stream, while the host loops run; every call that touches
 * device memory waits for that stream before it returns (device.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/forked.h"
#include "base/table.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

/* ---- checks ------------------------------------------------------------- */

/* x in [lo, hi), or (lo, hi) when lo_open; NaN is never in range. */
hvd_result_t hvd__optim_check_range(const char *who, const char *what, double x,
                                    double lo, int lo_open, double hi) {
  if ((lo_open ? x > lo : x >= lo) && x < hi)
    return HVD_SUCCESS;
  return hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: %s %g is out of range %c%g, %g)", who, what, x,
                        lo_open ? '(' : '[', lo, hi);
}

hvd_result_t hvd__optim_check_adam_like(const char *who, double lr,
                                        double beta1, double beta2, double eps,
                                        double weight_decay) {
  hvd_result_t rc;
  HVD__CHECK(hvd__optim_check_range(who, "lr", lr, 0, 0, INFINITY));
  HVD__CHECK(hvd__optim_check_range(who, "beta1", beta1, 0, 0, 1));
  HVD__CHECK(hvd__optim_check_range(who, "beta2", beta2, 0, 0, 1));
  HVD__CHECK(hvd__optim_check_range(who, "eps", eps, 0, 1, INFINITY));
  HVD__CHECK(hvd__optim_check_range(who, "weight_decay", weight_decay, 0, 0,
                                    INFINITY));
fail:
  return rc;
}

/* A device tensor must be on the rank's GPU (hvd__cuda_rank_device: the
 * one hvd_init bound, else the calling thread's current device), as for
 * the collectives; a build without CUDA has none. */
static hvd_result_t check_device(const char *who, const char *pname,
                                 const char *which, int device) {
  if (device == HVD_CPU)
    return HVD_SUCCESS;
  if (device < HVD_CPU)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s device %d is neither HVD_CPU "
                          "nor a CUDA ordinal",
                          who, pname, which, device);
  if (!hvd_cuda_built())
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: param '%s' %s is on cuda:%d but this build "
                          "has no CUDA",
                          who, pname, which, device);
  int mine = hvd__cuda_rank_device();
  if (mine < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s is on cuda:%d but this rank has "
                          "no CUDA device",
                          who, pname, which, device);
  if (device != mine)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s is on cuda:%d but this rank "
                          "uses cuda:%d",
                          who, pname, which, device, mine);
  return HVD_SUCCESS;
}

/* A parameter's value or grad: a float32 (or float16/bfloat16: mixed
 * precision) tensor with data, on the host or on the rank's GPU. */
static hvd_result_t check_tensor(const char *who, const char *pname,
                                 const char *which, const hvd_tensor_t *t) {
  char buf[HVD__SHAPE_STR_MAX];
  hvd_result_t rc;
  if (t->dtype != HVD_FLOAT32 && !hvd__mixed_low(t->dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s is %s, not float32, float16 or "
                          "bfloat16",
                          who, pname, which, hvd_dtype_name(t->dtype));
  if ((rc = check_device(who, pname, which, t->device)) != HVD_SUCCESS)
    return rc;
  if (t->ndim < 0 || t->ndim > HVD_MAX_DIMS)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s ndim %d is out of range 0..%d",
                          who, pname, which, t->ndim, HVD_MAX_DIMS);
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] < 0) {
      hvd__shape_str(t->ndim, t->shape, buf, sizeof buf);
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: param '%s' %s shape %s has a negative "
                            "dimension",
                            who, pname, which, buf);
    }
  if (!hvd__tensor_size(t, NULL)) {
    hvd__shape_str(t->ndim, t->shape, buf, sizeof buf);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' %s shape %s of %s is more than "
                          "PTRDIFF_MAX bytes",
                          who, pname, which, buf, hvd_dtype_name(t->dtype));
  }
  if (t->data == NULL && hvd_tensor_numel(t) > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: param '%s' %s data is NULL",
                          who, pname, which);
  char why[160];
  if (hvd__tensor_misplaced(t, why, sizeof why))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: param '%s' %s %s", who,
                          pname, which, why);
  return HVD_SUCCESS;
}

static int same_shape(const hvd_tensor_t *a, const hvd_tensor_t *b) {
  return a->ndim == b->ndim &&
         memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

static hvd_result_t check_params(const char *who, const hvd_param_t *params,
                                 int n) {
  if (n < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: n is negative (%d)", who,
                          n);
  if (params == NULL && n > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: params is NULL (n %d)", who,
                          n);
  hvd_result_t rc = HVD_SUCCESS;
  hvd__table_t *seen = n > 1 ? hvd__table_create_borrowing() : NULL;
  if (n > 1 && seen == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  for (int i = 0; i < n; i++) {
    const hvd_param_t *p = &params[i];
    if (p->name == NULL || p->name[0] == '\0') {
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: params[%d] name is NULL or empty", who, i);
      goto fail;
    }
    void *first = seen ? hvd__table_get(seen, p->name) : NULL;
    if (first != NULL) { /* values are index + 1 */
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: params[%d] name '%s' repeats params[%d]", who, i,
                          p->name, (int)((intptr_t)first - 1));
      goto fail;
    }
    if (seen && hvd__table_put(seen, p->name, (void *)(intptr_t)(i + 1))) {
      rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
      goto fail;
    }
    HVD__CHECK(check_tensor(who, p->name, "value", &p->value));
    HVD__CHECK(check_tensor(who, p->name, "grad", &p->grad));
    if (p->grad.device != p->value.device) {
      char vd[32], gd[32];
      hvd__device_str(p->value.device, vd, sizeof vd);
      hvd__device_str(p->grad.device, gd, sizeof gd);
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' grad is on %s but value is on %s",
                          who, p->name, gd, vd);
      goto fail;
    }
    if (p->grad.dtype != p->value.dtype) {
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' grad is %s but value is %s", who,
                          p->name, hvd_dtype_name(p->grad.dtype),
                          hvd_dtype_name(p->value.dtype));
      goto fail;
    }
    if (!same_shape(&p->value, &p->grad)) {
      char vs[HVD__SHAPE_STR_MAX], gs[HVD__SHAPE_STR_MAX];
      hvd__shape_str(p->value.ndim, p->value.shape, vs, sizeof vs);
      hvd__shape_str(p->grad.ndim, p->grad.shape, gs, sizeof gs);
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: param '%s' grad shape %s differs from value "
                          "shape %s",
                          who, p->name, gs, vs);
      goto fail;
    }
  }
fail:
  hvd__table_destroy(seen);
  return rc;
}

static hvd_result_t check_ops(const char *who, const hvd_optimizer_ops_t *ops) {
  if (ops == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: ops is NULL", who);
  if (ops->step == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: ops->step is NULL", who);
  if (ops->nstate < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: ops->nstate is negative (%d)", who, ops->nstate);
  if (ops->nstate > 0 && ops->state_names == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: ops->state_names is NULL (nstate %d)", who,
                          ops->nstate);
  for (int k = 0; k < ops->nstate; k++) {
    const char *s = ops->state_names[k];
    if (s == NULL || s[0] == '\0')
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: ops->state_names[%d] is NULL or empty", who,
                            k);
    for (int j = 0; j < k; j++)
      if (strcmp(ops->state_names[j], s) == 0)
        return hvd__set_error(HVD_ERR_INVALID_ARG,
                              "%s: ops->state_names[%d] '%s' repeats "
                              "ops->state_names[%d]",
                              who, k, s, j);
  }
  return HVD_SUCCESS;
}

/* ---- the plain optimizer ------------------------------------------------ */

/* Frees state, the device context and opt; ctx is the caller's
 * (ops.destroy) business. */
static void free_plain(hvd_optimizer_t *opt) {
  int ns = opt->state ? opt->n * opt->ops.nstate : 0;
  for (int s = 0; s < ns; s++)
    if (opt->state[s].device == HVD_CPU)
      (void)hvd_free_host(opt->state[s].data);
    else
      hvd__odev_free(opt->state[s].device, opt->state[s].data);
  free(opt->state);
  hvd__mixed_free(opt->mixed);
  hvd__clip_free(opt->clip);
  free(opt->names.block);
  hvd__odev_close(opt->odev);
  free(opt);
}

/* First of every create: out must be there, and is NULL until success. */
hvd_result_t hvd__optim_check_out(const char *who, hvd_optimizer_t **out) {
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", who);
  *out = NULL;
  return HVD_SUCCESS;
}

/* Checks ops and params, then builds the optimizer with zeroed state
 * tensors shaped like each value. ctx stays the caller's on failure. */
static hvd_result_t create(const char *who, hvd_param_t *params, int n,
                           const hvd_optimizer_ops_t *ops, void *ctx, double lr,
                           hvd_optimizer_t **out) {
  hvd_result_t rc = check_ops(who, ops);
  if (rc == HVD_SUCCESS)
    rc = check_params(who, params, n);
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_optimizer_t *opt = calloc(1, sizeof *opt);
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  opt->cls = &hvd__plain_class;
  opt->params = params;
  opt->n = n;
  opt->ops = *ops;
  opt->ctx = ctx;
  opt->lr = lr;
  opt->fresh = 1; /* no step yet: the caller's gradients count as new */
  /* device parameters: every one is on the rank's GPU (checked) */
  for (int i = 0; i < n && opt->odev == NULL; i++)
    if (params[i].value.device != HVD_CPU &&
        (rc = hvd__odev_open(who, params[i].value.device, &opt->odev)) !=
            HVD_SUCCESS)
      goto fail;
  size_t ns = (size_t)n * (size_t)ops->nstate;
  if (ns > 0 && (opt->state = calloc(ns, sizeof *opt->state)) == NULL)
    goto oom;
  for (size_t s = 0; s < ns; s++) /* all host until allocated */
    opt->state[s].device = HVD_CPU;
  for (size_t s = 0; s < ns; s++) {
    const hvd_tensor_t *v = &params[s / (size_t)ops->nstate].value;
    hvd_tensor_t *st = &opt->state[s];
    *st = hvd_tensor_make(NULL, HVD_FLOAT32, v->ndim, v->shape);
    size_t bytes = hvd__tensor_bytes(st); /* float32 state, whatever v is */
    /* never NULL, even for an empty parameter: NULL means "none" */
    if (v->device != HVD_CPU) {
      if ((rc = hvd__odev_calloc(who, opt->odev, bytes, &st->data)) !=
          HVD_SUCCESS)
        goto fail;
      st->device = v->device;
      continue;
    }
    /* zero-filled; huge pages for the large ones (include/hvd.h) */
    if ((st->data = hvd_alloc_host(bytes)) == NULL)
      goto oom;
  }
  if ((rc = hvd__mixed_create(who, opt, 0)) != HVD_SUCCESS)
    goto fail;
  *out = opt;
  return HVD_SUCCESS;
oom:
  rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
fail:
  free_plain(opt);
  return rc;
}

hvd_result_t hvd_optimizer_custom(hvd_param_t *params, int n,
                                  const hvd_optimizer_ops_t *ops, void *ctx,
                                  hvd_optimizer_t **out) {
  static const char who[] = "hvd_optimizer_custom";
  hvd_result_t rc = hvd__optim_check_out(who, out);
  if (rc == HVD_SUCCESS)
    rc = create(who, params, n, ops, ctx, 0.0, out);
  return rc;
}

hvd_result_t hvd__optim_create_builtin(const char *who, hvd_param_t *params,
                                       int n, const void *options, size_t size,
                                       const hvd_optimizer_ops_t *ops,
                                       double lr, size_t wd_offset,
                                       hvd_optimizer_t **out) {
  hvd__optim_builtin_t *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  memcpy(&ctx->o, options, size);
  ctx->n = n;
  ctx->wd0 = (const double *)((const char *)&ctx->o + wd_offset);
  hvd_optimizer_ops_t own = *ops;
  own.destroy = hvd__optim_builtin_free;
  hvd_result_t rc = create(who, params, n, &own, ctx, lr, out);
  if (rc != HVD_SUCCESS) {
    free(ctx);
    return rc;
  }
  ctx->odev = (*out)->odev;
  ctx->sharded = &(*out)->sharded;
  ctx->names = &(*out)->names;
  return HVD_SUCCESS;
}

void hvd__optim_builtin_free(void *ctx) {
  hvd__optim_builtin_t *b = ctx;
  if (b != NULL)
    free(b->wd), free(b->lrs), free(b->only), hvd__optim_lamb_free(b->lamb);
  free(b);
}

hvd_result_t hvd__optim_update_device(const hvd__optim_builtin_t *b, int kind,
                                      void *options, double *wd,
                                      const hvd_param_t *params, int n,
                                      const hvd_tensor_t *state, int nstate,
                                      int64_t step, double lr) {
  if (b->odev == NULL)
    return HVD_SUCCESS;
  if (b->wd == NULL && b->lrs == NULL)
    return hvd__odev_update(HVD__STEP_WHO, b->odev, kind, options, params, n,
                            state, nstate, step, lr, NULL);
  const double dflt = *wd;
  hvd_result_t rc = HVD_SUCCESS;
  unsigned char *only = b->only, *done = b->only + n;
  memset(done, 0, (size_t)n);
  /* a group per device parameter not in an earlier one: it and every later
   * one with its decay and rate */
#define SAME(j) (hvd__optim_wd(b, j, dflt) == v && hvd__optim_lr(b, j, lr) == r)
  for (int i = 0; i < n && rc == HVD_SUCCESS; i++) {
    if (params[i].value.device == HVD_CPU || done[i])
      continue;
    const double v = hvd__optim_wd(b, i, dflt), r = hvd__optim_lr(b, i, lr);
    for (int j = 0; j < n; j++) {
      only[j] =
          j >= i && params[j].value.device != HVD_CPU && !done[j] && SAME(j);
      done[j] |= only[j];
    }
    *wd = v;
    rc = hvd__odev_update(HVD__STEP_WHO, b->odev, kind, options, params, n,
                          state, nstate, step, r, only);
  }
#undef SAME
  *wd = dflt;
  return rc;
}

hvd_result_t hvd__optim_name_steps(const char *fn, hvd_optimizer_t *core) {
  static const char *const kinds[] = {"hvd.loss_scale.found_inf.",
                                      "hvd.clip.norm.", "hvd.clip.nonfinite.",
                                      "hvd.lamb.norms.", "hvd.lamb.nonfinite."};
  enum { NKINDS = sizeof kinds / sizeof kinds[0] };
  const char *first = core->n > 0 ? core->params[0].name : "";
  const char *at[NKINDS];
  size_t total = 0;
  for (int k = 0; k < NKINDS; k++)
    total += strlen(kinds[k]) + strlen(first) + 1;
  char *block = malloc(total), *s = block;
  if (block == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  for (int k = 0; k < NKINDS; k++) {
    at[k] = s;
    s += sprintf(s, "%s%s", kinds[k], first) + 1;
  }
  free(core->names.block);
  core->names = (hvd__step_names_t){block, at[0], at[1], at[2], at[3], at[4]};
  return HVD_SUCCESS;
}

void hvd__optim_forget_step(hvd_optimizer_t *core) {
  hvd__clip_forget(core->clip);
  hvd__mixed_forget_skip(core);
}

hvd_optimizer_t *hvd__optim_core(hvd_optimizer_t *opt) {
  return opt->base ? opt->base : opt;
}

const hvd_optimizer_t *hvd__optim_core_const(const hvd_optimizer_t *opt) {
  return opt->base ? opt->base : opt;
}

hvd_result_t hvd__optim_apply(hvd_optimizer_t *core) {
  if (core->mixed != NULL)
    return hvd__mixed_apply(core, 1.0);
  return hvd__optim_apply_on(core, core->params, core->state);
}

hvd_result_t hvd__optim_apply_on(hvd_optimizer_t *core, hvd_param_t *params,
                                 hvd_tensor_t *state) {
  hvd_result_t rc = HVD_SUCCESS;
  if (core->clip != NULL && (rc = hvd__clip_apply(core, params)) != HVD_SUCCESS)
    return rc;
  hvd__clear_error(); /* so that we can tell whether step() said why */
  rc = core->ops.step(core->ctx, params, core->n, state, core->steps + 1,
                      core->lr);
  if (rc != HVD_SUCCESS) {
    if (hvd_last_error()[0] == '\0')
      hvd__set_error(rc, "hvd_optimizer_step: optimizer '%s' step failed: %s",
                     core->ops.name ? core->ops.name : "(unnamed)",
                     hvd_strerror(rc));
    hvd__clip_forget(core->clip);
    return rc;
  }
  core->steps++;
  return HVD_SUCCESS;
}

/* ---- the plain class ---------------------------------------------------- */

static hvd_result_t plain_step(hvd_optimizer_t *opt) {
  if (!opt->fresh)
    return hvd__set_error_msg(HVD_ERR_INVALID_ARG, HVD__NO_NEW_GRADS);
  hvd_result_t rc = hvd__optim_apply(opt);
  if (rc == HVD_SUCCESS)
    opt->fresh = 0;
  return rc;
}

static hvd_result_t plain_zero_grad(hvd_optimizer_t *opt) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < opt->n && rc == HVD_SUCCESS; i++) {
    hvd_tensor_t *g = &opt->params[i].grad;
    if (g->data == NULL)
      continue;
    if (g->device == HVD_CPU)
      memset(g->data, 0, hvd__tensor_bytes(g));
    else /* cudaMemsetAsync on the optimizer's stream */
      rc = hvd__odev_zero("hvd_optimizer_zero_grad", opt->odev, g->data,
                          hvd__tensor_bytes(g));
  }
  if (opt->odev != NULL) {
    hvd_result_t s = hvd__odev_sync("hvd_optimizer_zero_grad", opt->odev);
    if (rc == HVD_SUCCESS)
      rc = s;
  }
  if (rc == HVD_SUCCESS)
    opt->fresh = 1;
  return rc;
}

/* The plain class's answer to the calls only a distributed optimizer
 * takes. */
static hvd_result_t not_distributed(const char *fn) {
  return hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: not a distributed optimizer (see "
                        "hvd_distributed_optimizer)",
                        fn);
}

static hvd_result_t plain_grad_ready(hvd_optimizer_t *opt, int i) {
  (void)opt;
  (void)i;
  return not_distributed("hvd_optimizer_grad_ready");
}

static hvd_result_t plain_sparse_grad(hvd_optimizer_t *opt, int i,
                                      const int64_t *rows, int64_t nrows,
                                      const float *values) {
  hvd__optim_sparse_add(&opt->params[i].grad, rows, nrows, values, 1.0f);
  opt->fresh = 1;
  return HVD_SUCCESS;
}

static hvd_result_t plain_set_sync(hvd_optimizer_t *opt, int sync) {
  (void)opt;
  (void)sync;
  return not_distributed("hvd_optimizer_set_sync");
}

static void plain_destroy(hvd_optimizer_t *opt) {
  if (opt->ops.destroy != NULL)
    opt->ops.destroy(opt->ctx);
  free_plain(opt);
}

const hvd__optim_class_t hvd__plain_class = {
    plain_step,        plain_zero_grad, plain_grad_ready,
    plain_sparse_grad, plain_set_sync,  plain_destroy,
};

void hvd__optim_sparse_add(hvd_tensor_t *grad, const int64_t *rows,
                           int64_t nrows, const float *values, float scale) {
  float *g = grad->data;
  int64_t len = hvd_tensor_numel(grad) / grad->shape[0];
  for (int64_t k = 0; k < nrows; k++) {
    float *dst = g + rows[k] * len;
    const float *v = values + k * len;
    if (scale == 1.0f)
      for (int64_t j = 0; j < len; j++)
        dst[j] += v[j];
    else
      for (int64_t j = 0; j < len; j++)
        dst[j] += scale * v[j];
  }
}

/* ---- the public calls --------------------------------------------------- */

/* The optimizer's device work of this step waits, on the device, for
 * what the caller's stream has enqueued (gradients still in the making:
 * the collectives' rule, hvd.h "Device ordering"). */
static hvd_result_t after_caller(const char *who, hvd_optimizer_t *opt) {
  hvd__odev_t *odev = hvd__optim_core(opt)->odev;
  return odev != NULL ? hvd__odev_after_caller(who, odev) : HVD_SUCCESS;
}

/* A distributed optimizer's call in a child forked after hvd_init: refused
 * in the public call's own name (its collectives would say theirs). */
static int forked_dist(const hvd_optimizer_t *opt, const char *fn,
                       hvd_result_t *rc) {
  if (opt->dist == NULL || !hvd__forked())
    return 0;
  *rc = hvd__not_initialized(fn);
  return 1;
}

hvd_result_t hvd_optimizer_step(hvd_optimizer_t *opt) {
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_optimizer_step: opt is NULL");
  hvd_result_t rc;
  if (forked_dist(opt, "hvd_optimizer_step", &rc))
    return rc;
  hvd__optim_forget_step(hvd__optim_core(opt)); /* this step's, or none */
  rc = after_caller("hvd_optimizer_step", opt);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(opt->ps, rc, opt->cls->step(opt));
  return rc;
}

hvd_result_t hvd_optimizer_zero_grad(hvd_optimizer_t *opt) {
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_optimizer_zero_grad: opt is NULL");
  /* the zeroing lands after what the caller enqueued on the gradients */
  hvd_result_t rc = after_caller("hvd_optimizer_zero_grad", opt);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(opt->ps, rc, opt->cls->zero_grad(opt));
  return rc;
}

hvd_result_t hvd_optimizer_grad_ready(hvd_optimizer_t *opt, int i) {
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_optimizer_grad_ready: opt is NULL");
  /* a plain reduction orders itself; what reads the gradient on the
   * optimizer's stream first (reduce_fp32's copy, PowerSGD) calls
   * hvd__odev_after_caller itself: one wait per such gradient, none for
   * the others */
  hvd_result_t rc;
  if (forked_dist(opt, "hvd_optimizer_grad_ready", &rc))
    return rc;
  HVD__ON_SET(opt->ps, rc, opt->cls->grad_ready(opt, i));
  return rc;
}

hvd_result_t hvd_optimizer_sparse_grad(hvd_optimizer_t *opt, int i,
                                       const int64_t *rows, int64_t nrows,
                                       const float *values) {
  static const char fn[] = "hvd_optimizer_sparse_grad";
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", fn);
  const hvd_optimizer_t *core = hvd__optim_core_const(opt);
  if (i < 0 || i >= core->n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: index %d is out of range for %d parameters", fn,
                          i, core->n);
  const hvd_param_t *p = &core->params[i];
  const hvd_tensor_t *g = &p->grad;
  if (g->device != HVD_CPU)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: parameter '%s' is on cuda:%d; sparse gradients "
                          "are for host parameters",
                          fn, p->name, g->device);
  if (g->dtype != HVD_FLOAT32)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: parameter '%s' is %s; sparse gradients are for "
                          "float32 parameters",
                          fn, p->name, hvd_dtype_name(g->dtype));
  if (g->ndim < 1 || g->shape[0] < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: parameter '%s' has no rows (ndim %d)", fn,
                          p->name, g->ndim);
  if (nrows < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: parameter '%s': nrows %lld is negative", fn,
                          p->name, (long long)nrows);
  if (nrows > 0 && (rows == NULL || values == NULL))
    return hvd__set_error(
        HVD_ERR_INVALID_ARG, "%s: parameter '%s': %s is NULL with %lld rows",
        fn, p->name, rows == NULL ? "rows" : "values", (long long)nrows);
  for (int64_t k = 0; k < nrows; k++)
    if (rows[k] < 0 || rows[k] >= g->shape[0])
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: parameter '%s': rows[%lld] is %lld, outside "
                            "0..%lld",
                            fn, p->name, (long long)k, (long long)rows[k],
                            (long long)g->shape[0] - 1);
  hvd_result_t rc;
  HVD__ON_SET(opt->ps, rc, opt->cls->sparse_grad(opt, i, rows, nrows, values));
  return rc;
}

hvd_result_t hvd_optimizer_set_sync(hvd_optimizer_t *opt, int sync) {
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_optimizer_set_sync: opt is NULL");
  hvd_result_t rc;
  HVD__ON_SET(opt->ps, rc, opt->cls->set_sync(opt, sync));
  return rc;
}

hvd_result_t hvd_optimizer_set_lr(hvd_optimizer_t *opt, double lr) {
  static const char who[] = "hvd_optimizer_set_lr";
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", who);
  hvd_result_t rc = hvd__optim_check_range(who, "lr", lr, 0, 0, INFINITY);
  if (rc == HVD_SUCCESS)
    hvd__optim_core(opt)->lr = lr;
  return rc;
}

/* The built-in context of opt's core, or NULL (a custom optimizer). */
hvd__optim_builtin_t *hvd__optim_builtin(const hvd_optimizer_t *opt) {
  const hvd_optimizer_t *core = hvd__optim_core_const(opt);
  return core->ops.destroy == hvd__optim_builtin_free ? core->ctx : NULL;
}

/* *arr (n values, NAN each: the default) made if it is not there yet,
 * with the group flags that the device update needs. */
static hvd_result_t per_param(hvd__optim_builtin_t *b, double **arr) {
  if (*arr != NULL)
    return HVD_SUCCESS;
  const size_t n = b->n > 0 ? (size_t)b->n : 1;
  if (b->only == NULL && (b->only = malloc(2 * n)) == NULL)
    return HVD_ERR_NO_MEMORY;
  if ((*arr = malloc(n * sizeof **arr)) == NULL)
    return HVD_ERR_NO_MEMORY; /* only stays: freed with b */
  for (int k = 0; k < b->n; k++)
    (*arr)[k] = NAN;
  return HVD_SUCCESS;
}

/* *out: the built-in context of opt for a per-parameter setting of
 * parameter i; who's error for opt NULL, a custom optimizer or i out of
 * range. */
static hvd_result_t group_target(const char *who, hvd_optimizer_t *opt, int i,
                                 hvd__optim_builtin_t **out) {
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", who);
  hvd__optim_builtin_t *b = hvd__optim_builtin(opt);
  const char *name = hvd__optim_core(opt)->ops.name;
  if (b == NULL)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: optimizer '%s' is a custom one: its step reads "
                          "its own options",
                          who, name ? name : "(unnamed)");
  if (i < 0 || i >= b->n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: parameter %d is out of range 0..%d", who, i,
                          b->n - 1);
  *out = b;
  return HVD_SUCCESS;
}

hvd_result_t hvd_optimizer_set_param_weight_decay(hvd_optimizer_t *opt, int i,
                                                  double weight_decay) {
  static const char who[] = "hvd_optimizer_set_param_weight_decay";
  hvd__optim_builtin_t *b = NULL;
  hvd_result_t rc = group_target(who, opt, i, &b);
  if (rc != HVD_SUCCESS)
    return rc;
  if (!(weight_decay != weight_decay ||
        (weight_decay >= 0 && weight_decay < INFINITY)))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: weight_decay %g is out of range [0, inf) (NAN: "
                          "the optimizer's own)",
                          who, weight_decay);
  if (per_param(b, &b->wd) != HVD_SUCCESS)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  b->wd[i] = weight_decay;
  return HVD_SUCCESS;
}

double hvd_optimizer_param_weight_decay(const hvd_optimizer_t *opt, int i) {
  const hvd__optim_builtin_t *b = opt ? hvd__optim_builtin(opt) : NULL;
  if (b == NULL || i < 0 || i >= b->n)
    return NAN;
  return hvd__optim_wd(b, i, *b->wd0);
}

hvd_result_t hvd_optimizer_set_param_lr_scale(hvd_optimizer_t *opt, int i,
                                              double scale) {
  static const char who[] = "hvd_optimizer_set_param_lr_scale";
  hvd__optim_builtin_t *b = NULL;
  hvd_result_t rc = group_target(who, opt, i, &b);
  if (rc != HVD_SUCCESS)
    return rc;
  if (!(scale != scale || (scale >= 0 && scale < INFINITY)))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: scale %g is out of range [0, inf) (NAN: 1, the "
                          "optimizer's learning rate)",
                          who, scale);
  if (per_param(b, &b->lrs) != HVD_SUCCESS)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  b->lrs[i] = scale;
  return HVD_SUCCESS;
}

double hvd_optimizer_param_lr_scale(const hvd_optimizer_t *opt, int i) {
  const hvd__optim_builtin_t *b = opt ? hvd__optim_builtin(opt) : NULL;
  if (b == NULL || i < 0 || i >= b->n)
    return NAN;
  return b->lrs != NULL && b->lrs[i] == b->lrs[i] ? b->lrs[i] : 1.0;
}

double hvd_optimizer_lr(const hvd_optimizer_t *opt) {
  return opt ? hvd__optim_core_const(opt)->lr : NAN;
}

int64_t hvd_optimizer_steps(const hvd_optimizer_t *opt) {
  return opt ? hvd__optim_core_const(opt)->steps : -1;
}

void hvd_optimizer_destroy(hvd_optimizer_t *opt) {
  if (opt == NULL)
    return;
  const hvd_process_set_t *was = hvd__coll_set(opt->ps);
  opt->cls->destroy(opt); /* may wait for its set's requests */
  hvd__coll_set(was);
}

hvd_result_t hvd__optim_check_set(const char *fn, const hvd_process_set_t *ps) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  if (ps == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: ps is NULL", fn);
  if (hvd_process_set_rank(ps) < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: rank %d is not in process set %d", fn,
                          hvd_rank(), hvd_process_set_id(ps));
  return HVD_SUCCESS;
}

/* ---- agreement ----------------------------------------------------------- */

hvd_result_t hvd__optim_agree(const char *name, hvd_result_t local) {
  char ename[96];
  unsigned char buf[4 + HVD__ERRMSG_MAX];
  int32_t first = local != HVD_SUCCESS ? hvd__coll_rank() : hvd__coll_size();
  int64_t one = 1, len = (int64_t)sizeof buf;
  memset(buf, 0, sizeof buf);
  if (local != HVD_SUCCESS) {
    for (int i = 0; i < 4; i++) /* little-endian, whatever the host */
      buf[i] = (unsigned char)((uint32_t)local >> (8 * i));
    snprintf((char *)buf + 4, sizeof buf - 4, "%s", hvd_last_error());
  }
  hvd_tensor_t t = hvd_tensor_make(&first, HVD_INT32, 1, &one);
  hvd_result_t rc = hvd_allreduce(name, &t, &t, HVD_MIN, 1.0, 1.0);
  if (rc != HVD_SUCCESS || first >= hvd__coll_size())
    return rc;
  hvd_tensor_t b = hvd_tensor_make(buf, HVD_UINT8, 1, &len);
  snprintf(ename, sizeof ename, "%s.error", name);
  if ((rc = hvd_broadcast(ename, &b, first)) != HVD_SUCCESS)
    return rc;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)buf[i] << (8 * i);
  rc = (hvd_result_t)v;
  if (rc == HVD_SUCCESS || rc >= HVD_RESULT_COUNT)
    rc = HVD_ERR_INTERNAL;
  buf[sizeof buf - 1] = '\0';
  int world = hvd__coll_world_rank(first); /* messages name world ranks */
  if (world == 0)
    return hvd__set_error_msg(rc, (const char *)buf + 4);
  return hvd__set_error(rc, "%s (on rank %d)", (const char *)buf + 4, world);
}
