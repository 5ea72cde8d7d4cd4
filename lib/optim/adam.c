/*
 * adam.c - the built-ins Adam and AdamW (hvd_adam_create, o->decoupled):
 * torch.optim.Adam/AdamW's numerics as an ops table (optimizer.h's
 * built-in helpers). Device parameters are updated by one batched kernel
 * (optim_kernels.cu, the same formulas) while the host loops run.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "optim/optimizer.h"

static const char *const adam_state[] = {"exp_avg", "exp_avg_sq"};

void hvd_adam_options_init(hvd_adam_options_t *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->lr = 0.001;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
}

/* torch.optim.Adam/AdamW (foreach=False, amsgrad=False), per element:
 * AdamW: v *= 1 - lr * wd; Adam: g += wd * v;
 * m = lerp(m, g, 1 - beta1); s = beta2 * s + (1 - beta2) * g * g;
 * v -= lr / (1 - beta1^t) * m / (sqrt(s) / sqrt(1 - beta2^t) + eps).
 * adam_loop is inlined with a constant l2 flag, so both loops are
 * branch-free and vectorize. Without L2 decay (AdamW, or Adam with wd 0)
 * the gradient is used as it is, as torch does: adding 0 * v instead
 * would turn an infinite value into NaN (0 * inf), where torch and the
 * device kernel (adam_kernel) keep it infinite. AdamW scales v by decay,
 * Adam by 1 (as the kernel does: same bits). */
static inline __attribute__((always_inline)) void
adam_loop(float *restrict v, const float *restrict g, float *restrict m,
          float *restrict s, int64_t len, float wd, float decay, float b1c,
          float b2, float b2c, float eps, float step_size, float bc2_sqrt,
          const int l2) {
  for (int64_t j = 0; j < len; j++) {
    float gj = l2 ? g[j] + wd * v[j] : g[j];
    v[j] *= decay;
    m[j] += b1c * (gj - m[j]); /* torch's lerp_ for weights < 0.5 */
    s[j] = b2 * s[j] + b2c * gj * gj;
    float denom = sqrtf(s[j]) / bc2_sqrt + eps;
    v[j] -= step_size * (m[j] / denom);
  }
}

static hvd_result_t adam_step(void *ctx, hvd_param_t *params, int n,
                              hvd_tensor_t *state, int64_t step, double lr) {
  const hvd__optim_builtin_t *b = ctx;
  hvd_adam_options_t o0 = b->o.adam; /* a copy: each decay group's own */
  const hvd_adam_options_t *o = &o0;
  hvd_result_t rc;
  if ((rc = hvd__optim_update_device(b, 1, &o0, &o0.weight_decay, params, n,
                                     state, 2, step, lr)) != HVD_SUCCESS)
    return rc;
  const float b1c = (float)(1.0 - o->beta1), b2 = (float)o->beta2;
  const float b2c = (float)(1.0 - o->beta2), eps = (float)o->eps;
  const double bc1 = 1.0 - pow(o->beta1, (double)step);
  const float bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, (double)step));
  for (int i = 0; i < n; i++) {
    if (params[i].value.device != HVD_CPU)
      continue;
    const double wdi = hvd__optim_wd(b, i, o->weight_decay);
    const double lri = hvd__optim_lr(b, i, lr);
    const int l2 = !o->decoupled && wdi != 0;
    const float wd = (float)wdi, step_size = (float)(lri / bc1);
    const float decay = o->decoupled ? (float)(1.0 - lri * wdi) : 1.0f;
    float *v = params[i].value.data;
    const float *g = params[i].grad.data;
    float *m = state[2 * i].data, *s = state[2 * i + 1].data;
    int64_t len = hvd_tensor_numel(&params[i].value);
    if (l2)
      adam_loop(v, g, m, s, len, wd, decay, b1c, b2, b2c, eps, step_size,
                bc2_sqrt, 1);
    else
      adam_loop(v, g, m, s, len, wd, decay, b1c, b2, b2c, eps, step_size,
                bc2_sqrt, 0);
  }
  return b->odev != NULL ? hvd__odev_sync(HVD__STEP_WHO, b->odev) : HVD_SUCCESS;
}

static hvd_result_t check_adam(const char *who, const hvd_adam_options_t *o) {
  if (o == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: options are NULL", who);
  return hvd__optim_check_adam_like(who, o->lr, o->beta1, o->beta2, o->eps,
                                    o->weight_decay);
}

hvd_result_t hvd_adam_create(hvd_param_t *params, int n,
                             const hvd_adam_options_t *o,
                             hvd_optimizer_t **out) {
  static const char who[] = "hvd_adam_create";
  hvd_result_t rc = hvd__optim_check_out(who, out);
  if (rc == HVD_SUCCESS)
    rc = check_adam(who, o);
  if (rc != HVD_SUCCESS)
    return rc;
  const hvd_optimizer_ops_t ops = {o->decoupled ? "AdamW" : "Adam", 2,
                                   adam_state, adam_step,
                                   hvd__optim_builtin_free};
  return hvd__optim_create_builtin(who, params, n, o, sizeof *o, &ops, o->lr,
                                   offsetof(hvd_adam_options_t, weight_decay),
                                   out);
}
