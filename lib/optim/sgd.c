/*
 * sgd.c - the built-in SGD (hvd_sgd_create): torch.optim.SGD's numerics
 * as an ops table (optimizer.h's built-in helpers). Device parameters are
 * updated by one batched kernel (optim_kernels.cu, the same formulas)
 * while the host loops run.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "optim/optimizer.h"

static const char *const sgd_state[] = {"momentum_buffer"};

void hvd_sgd_options_init(hvd_sgd_options_t *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->lr = 0.01;
}

/* torch.optim.SGD (foreach=False, maximize=False), per element:
 * d = g + wd * v; buf = step 1 ? d : momentum * buf + (1 - dampening) * d;
 * d = nesterov ? d + momentum * buf : buf; v -= lr * d.
 * sgd_loop is inlined with constant flags, so each combination is its own
 * branch-free loop that GCC vectorizes (the per-element tests kept the
 * loop scalar: twice as slow as a hand-written update on BERT-base). */
static inline __attribute__((always_inline)) void
sgd_loop(float *v, const float *g, float *buf, int64_t m, float wd, float mom,
         float keep, float neg_lr, const int has_wd, const int has_buf,
         const int first, const int nesterov) {
  for (int64_t j = 0; j < m; j++) {
    float d = has_wd ? g[j] + wd * v[j] : g[j];
    if (has_buf) {
      float b = first ? d : mom * buf[j] + keep * d;
      buf[j] = b;
      d = nesterov ? d + mom * b : b;
    }
    v[j] += neg_lr * d;
  }
}

static hvd_result_t sgd_step(void *ctx, hvd_param_t *params, int n,
                             hvd_tensor_t *state, int64_t step, double lr) {
  const hvd__optim_builtin_t *b = ctx;
  hvd_sgd_options_t o0 = b->o.sgd; /* a copy: each decay group's own */
  const hvd_sgd_options_t *o = &o0;
  hvd_result_t rc;
  /* the device parameters' batch first: it runs while the host loops do */
  if ((rc = hvd__optim_update_device(b, 0, &o0, &o0.weight_decay, params, n,
                                     state, o->momentum != 0 ? 1 : 0, step,
                                     lr)) != HVD_SUCCESS)
    return rc;
  const float mom = (float)o->momentum;
  const float keep = (float)(1.0 - o->dampening);
  const int nest = o->nesterov != 0;
  const int first = step == 1;
  for (int i = 0; i < n; i++) {
    if (params[i].value.device != HVD_CPU)
      continue;
    const double wdi = hvd__optim_wd(b, i, o->weight_decay);
    const float wd = (float)wdi, neg_lr = (float)-hvd__optim_lr(b, i, lr);
    const int has_wd = wdi != 0;
    float *v = params[i].value.data;
    const float *g = params[i].grad.data;
    float *buf = o->momentum != 0 ? state[i].data : NULL; /* nstate 1 */
    int64_t m = hvd_tensor_numel(&params[i].value);
#define LOOP(w, b, f, nv)                                                      \
  sgd_loop(v, g, buf, m, wd, mom, keep, neg_lr, w, b, f, nv)
    if (buf == NULL) {
      if (has_wd)
        LOOP(1, 0, 0, 0);
      else
        LOOP(0, 0, 0, 0);
    } else if (nest) {
      if (has_wd)
        first ? LOOP(1, 1, 1, 1) : LOOP(1, 1, 0, 1);
      else
        first ? LOOP(0, 1, 1, 1) : LOOP(0, 1, 0, 1);
    } else {
      if (has_wd)
        first ? LOOP(1, 1, 1, 0) : LOOP(1, 1, 0, 0);
      else
        first ? LOOP(0, 1, 1, 0) : LOOP(0, 1, 0, 0);
    }
#undef LOOP
  }
  return b->odev != NULL ? hvd__odev_sync(HVD__STEP_WHO, b->odev) : HVD_SUCCESS;
}

static hvd_result_t check_sgd(const char *who, const hvd_sgd_options_t *o) {
  hvd_result_t rc;
  if (o == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  HVD__CHECK(hvd__optim_check_range(who, "lr", o->lr, 0, 0, INFINITY));
  HVD__CHECK(
      hvd__optim_check_range(who, "momentum", o->momentum, 0, 0, INFINITY));
  HVD__CHECK(hvd__optim_check_range(who, "dampening", o->dampening, -INFINITY,
                                    1, INFINITY));
  HVD__CHECK(hvd__optim_check_range(who, "weight_decay", o->weight_decay, 0, 0,
                                    INFINITY));
  if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: nesterov needs momentum > 0 and dampening 0 "
                        "(momentum %g, dampening %g)",
                        who, o->momentum, o->dampening);
fail:
  return rc;
}

hvd_result_t hvd_sgd_create(hvd_param_t *params, int n,
                            const hvd_sgd_options_t *o, hvd_optimizer_t **out) {
  static const char who[] = "hvd_sgd_create";
  hvd_result_t rc = hvd__optim_check_out(who, out);
  if (rc == HVD_SUCCESS)
    rc = check_sgd(who, o);
  if (rc != HVD_SUCCESS)
    return rc;
  const hvd_optimizer_ops_t ops = {"SGD", o->momentum != 0 ? 1 : 0, sgd_state,
                                   sgd_step, hvd__optim_builtin_free};
  return hvd__optim_create_builtin(who, params, n, o, sizeof *o, &ops, o->lr,
                                   offsetof(hvd_sgd_options_t, weight_decay),
                                   out);
}
