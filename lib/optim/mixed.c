/*
 * mixed.c - mixed precision in the plain optimizer (hvd.h, "Mixed
 * precision"): float32 master weights for float16/bfloat16 parameters,
 * and dynamic loss scaling with torch.cuda.amp.GradScaler's rules.
 *
 * A plain optimizer has a hvd__mixed_t when some parameter is float16 or
 * bfloat16, or loss scaling is on. It then steps through `views`: per
 * parameter a float32 value and grad that ops->step sees (the master and
 * its float32 gradient for a low-precision parameter, the parameter
 * itself for a float32 one), so every optimizer, built-in or custom, runs
 * its float32 math unchanged. A step:
 *   1. every gradient to float32 times 1/scale (and the no-sync pass
 *      factor): a low-precision one into its master gradient, a float32
 *      one in place when the factor is not 1, noting any inf or NaN (host
 *      loops; one batched kernel for all device parameters, a device
 *      flag);
 *   2. with agree (a distributed optimizer's core), one MAX allreduce of
 *      that finding, so that every rank skips or steps alike;
 *   3. skipped: the scale backs off, nothing else changes; else ops->step
 *      on the views, then every master rounded back into its value (one
 *      batched kernel for the device ones), and the scale grows after
 *      growth_interval clean steps.
 * Host loops and device kernels do the same float math (lib/base/half.h
 * conversions, one float multiply), so host and device agree bit for bit.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

struct hvd__mixed {
  hvd_optimizer_t *core;
  hvd__mixed_t *next; /* the registry (hvd__mixed_refresh) */
  int n;
  hvd_param_t *views;   /* what ops->step sees */
  hvd_tensor_t *master; /* low-precision parameters' float32 values (with
                           off: this rank's block of each) */
  hvd_tensor_t *mgrad;  /* and gradients (data NULL for float32 ones, and
                           for every one when sharded without reduce_fp32) */
  /* sharded (ZeRO-1, hvd__mixed_shard): master[i] is the block of
     len[i] elements at element off[i]; full[i] the whole master's shape,
     with data only on rank 0 during a save (zero.c's, which frees it) */
  int64_t *off, *len;
  hvd_tensor_t *full;
  int *in_master;            /* gradient already in mgrad (reduce_fp32) */
  hvd_tensor_t *srcs;        /* a step's conversions (unscale): what from, */
  float **dsts;              /* and where to */
  hvd__odev_convert_t *conv; /* a batch's device conversions (n entries) */
  /* loss scaling */
  int scaling;
  hvd_loss_scale_options_t o;
  double scale;
  int64_t clean; /* steps in a row without an inf or NaN */
  int skipped;   /* the last step was skipped */
};

static int is_low(hvd_dtype_t t) {
  return t == HVD_FLOAT16 || t == HVD_BFLOAT16;
}

int hvd__mixed_low(hvd_dtype_t t) { return is_low(t); }

/* ---- host element loops (the kernels' twins) ---------------------------- */

static float load(const void *src, hvd_dtype_t t, int64_t i) {
  return t == HVD_FLOAT16    ? hvd__f16_to_f32(((const uint16_t *)src)[i])
         : t == HVD_BFLOAT16 ? hvd__bf16_to_f32(((const uint16_t *)src)[i])
                             : ((const float *)src)[i];
}

/* dst = src * f; 1 when some result is not finite. */
static int host_to_master(const void *src, hvd_dtype_t t, float *dst, int64_t n,
                          float f) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = load(src, t, i) * f;
    dst[i] = v;
    bad |= !isfinite(v);
  }
  return bad;
}

static void host_from_master(const float *src, void *dst, hvd_dtype_t t,
                             int64_t n) {
  uint16_t *d = dst;
  for (int64_t i = 0; i < n; i++)
    d[i] =
        t == HVD_FLOAT16 ? hvd__f32_to_f16(src[i]) : hvd__f32_to_bf16(src[i]);
}

/* ---- life -----------------------------------------------------------------
 */

static void free_tensor(hvd_tensor_t *t) {
  if (t->data == NULL)
    return;
  if (t->device == HVD_CPU)
    (void)hvd_free_host(t->data);
  else
    hvd__odev_free(t->device, t->data);
  t->data = NULL;
}

/* Every live hvd__mixed_t, so that hvd_broadcast_parameters can refresh
 * the masters of the values it overwrote (hvd__mixed_refresh). */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static hvd__mixed_t *registry;

static void unregister(hvd__mixed_t *m) {
  pthread_mutex_lock(&registry_mu);
  for (hvd__mixed_t **pp = &registry; *pp != NULL; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  pthread_mutex_unlock(&registry_mu);
}

void hvd__mixed_free(hvd__mixed_t *m) {
  if (m == NULL)
    return;
  unregister(m);
  for (int i = 0; i < m->n; i++) {
    if (m->master != NULL)
      free_tensor(&m->master[i]);
    if (m->mgrad != NULL)
      free_tensor(&m->mgrad[i]);
  }
  free(m->views);
  free(m->master);
  free(m->mgrad);
  free(m->in_master);
  free(m->srcs);
  free(m->dsts);
  free(m->conv);
  free(m->off);
  free(m->len);
  free(m->full);
  free(m);
}

/* A float32 tensor shaped like v, zeroed, on v's device. */
static hvd_result_t make_f32(const char *who, hvd_optimizer_t *core,
                             const hvd_tensor_t *v, hvd_tensor_t *out) {
  *out = hvd_tensor_make(NULL, HVD_FLOAT32, v->ndim, v->shape);
  out->device = v->device;
  size_t bytes = hvd__tensor_bytes(out);
  if (v->device != HVD_CPU)
    return hvd__odev_calloc(who, core->odev, bytes, &out->data);
  if ((out->data = hvd_alloc_host(bytes > 0 ? bytes : 1)) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  return HVD_SUCCESS;
}

/* The part of parameter i's value that its master holds: the whole, or
 * when sharded the block (*n elements at *at). */
static void value_span(const hvd__mixed_t *m, const hvd_tensor_t *v, int i,
                       void **at, int64_t *n) {
  *at = v->data;
  *n = hvd_tensor_numel(v);
  if (m->off != NULL) {
    *at = v->data != NULL ? (uint16_t *)v->data + m->off[i] : NULL;
    *n = m->len[i];
  }
}

/* Parameter i's master from its value (on its device; complete when the
 * optimizer's stream is synchronised): every element, or with
 * only_changed only those that no longer round to the value (elsewhere
 * the master keeps the precision the value lacks). */
static hvd_result_t master_from_value(const char *who, hvd_optimizer_t *core,
                                      int i, int only_changed) {
  hvd__mixed_t *m = core->mixed;
  const hvd_tensor_t *v = &core->params[i].value;
  float *mst = m->master[i].data;
  void *at;
  int64_t n;
  value_span(m, v, i, &at, &n);
  if (v->device != HVD_CPU)
    return only_changed
               ? hvd__odev_refresh_master(who, core->odev, at, v->dtype, mst, n)
               : hvd__odev_to_master(who, core->odev, at, v->dtype, mst, n,
                                     1.0);
  if (!only_changed) {
    (void)host_to_master(at, v->dtype, mst, n, 1.0f);
    return HVD_SUCCESS;
  }
  const uint16_t *val = at;
  for (int64_t k = 0; k < n; k++) {
    uint16_t r = v->dtype == HVD_FLOAT16 ? hvd__f32_to_f16(mst[k])
                                         : hvd__f32_to_bf16(mst[k]);
    if (r != val[k])
      mst[k] = load(val, v->dtype, k);
  }
  return HVD_SUCCESS;
}

static hvd_result_t sync_odev(const char *who, hvd_optimizer_t *core,
                              hvd_result_t rc) {
  if (core->odev == NULL)
    return rc;
  hvd_result_t s = hvd__odev_sync(who, core->odev);
  return rc != HVD_SUCCESS ? rc : s;
}

hvd_result_t hvd__mixed_create(const char *who, hvd_optimizer_t *core,
                               int force) {
  int n = core->n, low = 0;
  for (int i = 0; i < n; i++)
    low += is_low(core->params[i].value.dtype);
  if (low == 0 && !force)
    return HVD_SUCCESS;
  hvd_result_t rc = HVD_SUCCESS;
  size_t cnt = n > 0 ? (size_t)n : 1;
  hvd__mixed_t *m = calloc(1, sizeof *m);
  if (m == NULL || !(m->views = calloc(cnt, sizeof *m->views)) ||
      !(m->master = calloc(cnt, sizeof *m->master)) ||
      !(m->mgrad = calloc(cnt, sizeof *m->mgrad)) ||
      !(m->in_master = calloc(cnt, sizeof *m->in_master)) ||
      !(m->srcs = calloc(cnt, sizeof *m->srcs)) ||
      !(m->dsts = calloc(cnt, sizeof *m->dsts)) ||
      !(m->conv = calloc(cnt, sizeof *m->conv))) {
    hvd__mixed_free(m);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  }
  m->core = core;
  m->n = n;
  m->scale = 1.0;
  core->mixed = m;
  if (core->odev != NULL && low > 0) {
    HVD__CHECK(hvd__odev_flag_reset(who, core->odev));
    /* the masters read the values after what the caller's stream has
       enqueued (their initialisation, say), as a step reads gradients */
    HVD__CHECK(hvd__odev_after_caller(who, core->odev));
  }
  for (int i = 0; i < n; i++) {
    hvd_param_t *p = &core->params[i];
    m->views[i] = *p;
    if (!is_low(p->value.dtype))
      continue;
    HVD__CHECK(make_f32(who, core, &p->value, &m->master[i]));
    HVD__CHECK(make_f32(who, core, &p->grad, &m->mgrad[i]));
    HVD__CHECK(master_from_value(who, core, i, 0));
    m->views[i].value = m->master[i];
    m->views[i].grad = m->mgrad[i];
  }
  rc = sync_odev(who, core, rc);
fail:
  if (rc != HVD_SUCCESS) {
    hvd__mixed_free(m);
    core->mixed = NULL;
    return rc;
  }
  pthread_mutex_lock(&registry_mu);
  m->next = registry;
  registry = m;
  pthread_mutex_unlock(&registry_mu);
  return rc;
}

/* ---- a step -----------------------------------------------------------------
 */

/* Whether convert_all skips srcs[i]: float32 in place by 1 without
 * scaling, nothing to do or check. */
static int convert_skips(const hvd__mixed_t *m, const hvd_tensor_t *t,
                         const float *dst, double f) {
  return t->dtype == HVD_FLOAT32 && t->data == dst && f == 1.0 && !m->scaling;
}

/* Step 1 over n gradients: srcs[i] (data, dtype, device and numel as its
 * tensor's) into float32 dsts[i] times f (may be srcs[i]'s own data when
 * float32); a float32 one in place with f 1 and no scaling is left alone.
 * The device ones in one batched launch, then the host ones while it
 * runs. *found: an inf or NaN in any (in a device one only with loss
 * scaling, the one use of it). */
static hvd_result_t convert_all(hvd_optimizer_t *core, const hvd_tensor_t *srcs,
                                float *const *dsts, int n, double f,
                                int *found) {
  static const char who[] = HVD__STEP_WHO;
  hvd__mixed_t *m = core->mixed;
  hvd_result_t rc = HVD_SUCCESS;
  int bad = 0, k = 0;
  /* without scaling nothing reads the device's inf flag: no reset, and
   * no wait for the conversions before the update is launched */
  int flag_wanted = m->scaling;
  if (core->odev != NULL && flag_wanted)
    HVD__CHECK(hvd__odev_flag_reset(who, core->odev));
  for (int i = 0; i < n; i++) {
    const hvd_tensor_t *t = &srcs[i];
    if (t->device != HVD_CPU && !convert_skips(m, t, dsts[i], f))
      m->conv[k++] = (hvd__odev_convert_t){t->data, dsts[i], t->dtype,
                                           hvd_tensor_numel(t)};
  }
  if (k > 0)
    HVD__CHECK(hvd__odev_to_master_batch(who, core->odev, m->conv, k, f));
  for (int i = 0; i < n; i++) {
    const hvd_tensor_t *t = &srcs[i];
    if (t->device == HVD_CPU && !convert_skips(m, t, dsts[i], f))
      bad |= host_to_master(t->data, t->dtype, dsts[i], hvd_tensor_numel(t),
                            (float)f);
  }
  if (k > 0 && flag_wanted) {
    int flag = 0;
    HVD__CHECK(hvd__odev_flag_read(who, core->odev, &flag));
    bad |= flag;
  }
  *found = bad;
fail:
  return rc;
}

/* Step 1 for the parameters: each gradient (or its float32 copy already
 * reduced, reduce_fp32) into its master gradient, or in place. */
static hvd_result_t unscale(hvd_optimizer_t *core, double f, int *found) {
  hvd__mixed_t *m = core->mixed;
  for (int i = 0; i < m->n; i++) {
    hvd_param_t *p = &core->params[i];
    int low = is_low(p->value.dtype);
    m->srcs[i] = low && m->in_master[i] ? m->mgrad[i] : p->grad;
    m->dsts[i] = low ? m->mgrad[i].data : p->grad.data;
  }
  hvd_result_t rc = convert_all(core, m->srcs, m->dsts, m->n, f, found);
  memset(m->in_master, 0, (size_t)m->n * sizeof *m->in_master);
  return rc;
}

/* Step 2: the ranks' findings, MAX, under core's own name. Every step
 * takes part, no-sync ones too (hvd.h, hvd_optimizer_set_sync): a
 * failure says so, since the usual cause is a rank that took fewer. */
static hvd_result_t agree_found(const hvd_optimizer_t *core, int *found) {
  int32_t v = *found;
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&v, HVD_INT32, 1, &one);
  hvd_result_t rc = hvd_allreduce(core->names.found_inf, &t, &t, HVD_MAX, 1, 1);
  *found = v != 0;
  if (rc != HVD_SUCCESS) {
    char msg[HVD__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
    rc = hvd__set_error(rc,
                        HVD__STEP_WHO ": loss scaling's inf/NaN agreement, "
                                      "which every rank's step joins (no-sync "
                                      "steps too: every rank must take as "
                                      "many), failed: %s",
                        msg);
  }
  return rc;
}

/* Every master rounded back into its low-precision value (each block
 * into the value's block when sharded): the device ones in one batched
 * launch, then the host ones while it runs. */
static hvd_result_t round_values(hvd_optimizer_t *core, const char *who) {
  hvd__mixed_t *m = core->mixed;
  void *at;
  int64_t n;
  int k = 0;
  for (int i = 0; i < m->n; i++) {
    const hvd_tensor_t *v = &core->params[i].value;
    if (!is_low(v->dtype) || v->device == HVD_CPU)
      continue;
    value_span(m, v, i, &at, &n);
    m->conv[k++] = (hvd__odev_convert_t){m->master[i].data, at, v->dtype, n};
  }
  hvd_result_t rc = hvd__odev_from_master_batch(who, core->odev, m->conv, k);
  for (int i = 0; i < m->n && rc == HVD_SUCCESS; i++) {
    const hvd_tensor_t *v = &core->params[i].value;
    if (!is_low(v->dtype) || v->device != HVD_CPU)
      continue;
    value_span(m, v, i, &at, &n);
    host_from_master(m->master[i].data, at, v->dtype, n);
  }
  return sync_odev(who, core, rc);
}

static void scaler_update(hvd__mixed_t *m, int found) {
  m->skipped = found;
  if (!m->scaling)
    return;
  if (found) {
    m->scale *= m->o.backoff_factor;
    m->clean = 0;
  } else if (++m->clean >= m->o.growth_interval) {
    double grown = m->scale * m->o.growth_factor;
    if (isfinite(grown)) /* as torch's: an infinite scale would skip */
      m->scale = grown;  /* every step after it for ever */
    m->clean = 0;
  }
}

/* Steps 2-3 after a conversion that found `found`: agreement, then skip
 * (*updated 0) or ops->step on views and state (*updated 1). */
static hvd_result_t decide_and_step(hvd_optimizer_t *core, hvd_param_t *views,
                                    hvd_tensor_t *state, int found,
                                    int *updated) {
  hvd__mixed_t *m = core->mixed;
  hvd_result_t rc = HVD_SUCCESS;
  *updated = 0;
  if (core->agree_inf && m->scaling)
    rc = agree_found(core, &found);
  if (rc != HVD_SUCCESS)
    return rc;
  if (found && m->scaling) { /* without scaling, an inf is the user's */
    scaler_update(m, 1);
    return HVD_SUCCESS;
  }
  rc = hvd__optim_apply_on(core, views, state);
  *updated = rc == HVD_SUCCESS;
  return rc;
}

hvd_result_t hvd__mixed_apply(hvd_optimizer_t *core, double factor) {
  static const char who[] = HVD__STEP_WHO;
  hvd__mixed_t *m = core->mixed;
  int found = 0, updated = 0;
  double f = factor / (m->scaling ? m->scale : 1.0);
  hvd_result_t rc = unscale(core, f, &found);
  if (rc == HVD_SUCCESS)
    rc = decide_and_step(core, m->views, core->state, found, &updated);
  if (rc == HVD_SUCCESS && updated)
    rc = round_values(core, who);
  if (rc == HVD_SUCCESS && updated)
    scaler_update(m, 0);
  return rc;
}

hvd_result_t hvd__mixed_step_blocks(hvd_optimizer_t *core,
                                    const hvd_tensor_t *grads,
                                    float *const *dsts, hvd_param_t *views,
                                    hvd_tensor_t *state, int *updated) {
  hvd__mixed_t *m = core->mixed;
  int found = 0;
  double f = 1.0 / (m->scaling ? m->scale : 1.0);
  hvd_result_t rc = convert_all(core, grads, dsts, m->n, f, &found);
  memset(m->in_master, 0, (size_t)m->n * sizeof *m->in_master);
  if (rc == HVD_SUCCESS)
    rc = decide_and_step(core, views, state, found, updated);
  return rc;
}

hvd_result_t hvd__mixed_finish_blocks(hvd_optimizer_t *core) {
  hvd_result_t rc = round_values(core, HVD__STEP_WHO);
  if (rc == HVD_SUCCESS)
    scaler_update(core->mixed, 0);
  return rc;
}

hvd_tensor_t *hvd__mixed_master(hvd_optimizer_t *core, int i) {
  hvd__mixed_t *m = core->mixed;
  return m != NULL && m->master[i].data != NULL ? &m->master[i] : NULL;
}

hvd_result_t hvd__mixed_shard(const char *who, hvd_optimizer_t *core,
                              const int64_t *off, const int64_t *len,
                              int keep_mgrad) {
  hvd__mixed_t *m = core->mixed;
  hvd_result_t rc = HVD_SUCCESS;
  size_t cnt = m->n > 0 ? (size_t)m->n : 1;
  hvd_tensor_t *blk = calloc(cnt, sizeof *blk);
  if (blk == NULL || !(m->off = calloc(cnt, sizeof *m->off)) ||
      !(m->len = calloc(cnt, sizeof *m->len)) ||
      !(m->full = calloc(cnt, sizeof *m->full))) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
    goto fail;
  }
  for (int i = 0; i < m->n; i++) {
    m->off[i] = off[i];
    m->len[i] = len[i];
    if (m->master[i].data == NULL)
      continue;
    m->full[i] = m->master[i]; /* shape and device; no data */
    m->full[i].data = NULL;
    hvd_tensor_t shape = hvd_tensor_make(NULL, HVD_FLOAT32, 1, &m->len[i]);
    shape.device = m->master[i].device;
    HVD__CHECK(make_f32(who, core, &shape, &blk[i]));
    size_t bytes = (size_t)len[i] * sizeof(float);
    const float *src = (const float *)m->master[i].data + off[i];
    if (blk[i].device != HVD_CPU)
      HVD__CHECK(hvd__odev_copy(who, &blk[i], 0, src, bytes));
    else if (bytes > 0)
      memcpy(blk[i].data, src, bytes);
  }
  /* committed: the blocks replace the whole masters */
  for (int i = 0; i < m->n; i++) {
    if (m->master[i].data == NULL)
      continue;
    free_tensor(&m->master[i]);
    m->master[i] = blk[i];
    m->views[i].value = blk[i];
    if (!keep_mgrad) {
      free_tensor(&m->mgrad[i]);
      m->views[i].grad.data = NULL;
    }
  }
  free(blk);
  return HVD_SUCCESS;
fail:
  for (int i = 0; blk != NULL && i < m->n; i++)
    free_tensor(&blk[i]);
  free(blk);
  free(m->off);
  free(m->len);
  free(m->full);
  m->off = m->len = NULL;
  m->full = NULL;
  return rc;
}

/* The masters of core's low-precision parameters whose values are among
 * params[0..n). */
static hvd_result_t refresh_one(hvd_optimizer_t *core,
                                const hvd_param_t *params, int n,
                                const char *who) {
  hvd_result_t rc = HVD_SUCCESS;
  for (int j = 0; j < core->n && rc == HVD_SUCCESS; j++) {
    if (!is_low(core->params[j].value.dtype))
      continue;
    for (int i = 0; i < n; i++) /* empty ones (data NULL): nothing to do */
      if (params[i].value.data != NULL &&
          params[i].value.data == core->params[j].value.data) {
        rc = master_from_value(who, core, j, 1);
        break;
      }
  }
  return sync_odev(who, core, rc);
}

hvd_result_t hvd__mixed_refresh(const hvd_param_t *params, int n,
                                const char *who) {
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&registry_mu);
  for (hvd__mixed_t *m = registry; m != NULL && rc == HVD_SUCCESS; m = m->next)
    rc = refresh_one(m->core, params, n, who);
  pthread_mutex_unlock(&registry_mu);
  return rc;
}

/* ---- reduce_fp32: the distributed wrapper reduces float32 copies -------- */

hvd_result_t hvd__mixed_grad32(hvd_optimizer_t *core, int i,
                               hvd_tensor_t **out) {
  static const char who[] = "hvd_optimizer_grad_ready";
  hvd__mixed_t *m = core->mixed;
  hvd_param_t *p = &core->params[i];
  hvd_result_t rc = HVD_SUCCESS;
  int64_t n = hvd_tensor_numel(&p->grad);
  *out = &p->grad;
  if (m == NULL || !is_low(p->grad.dtype))
    return HVD_SUCCESS;
  if (p->grad.device == HVD_CPU)
    (void)host_to_master(p->grad.data, p->grad.dtype, m->mgrad[i].data, n,
                         1.0f);
  else if ((rc = hvd__odev_after_caller(who, core->odev)) == HVD_SUCCESS)
    rc = /* after the caller's stream: the gradient may be in the making */
        sync_odev(who, core,
                  hvd__odev_to_master(who, core->odev, p->grad.data,
                                      p->grad.dtype, m->mgrad[i].data, n, 1.0));
  if (rc == HVD_SUCCESS) {
    m->in_master[i] = 1;
    *out = &m->mgrad[i];
  }
  return rc;
}

void hvd__mixed_forget_grads(hvd_optimizer_t *core) {
  hvd__mixed_t *m = core->mixed;
  if (m != NULL)
    memset(m->in_master, 0, (size_t)m->n * sizeof *m->in_master);
}

/* ---- checkpoints ----------------------------------------------------------
 */

static int same_name(const hvd_param_t *a, const hvd_param_t *b) {
  return a->name == b->name ||
         (a->name != NULL && b->name != NULL && strcmp(a->name, b->name) == 0);
}

/* Whether core's parameter j, a low-precision one (it has a master), is
 * the caller's p: the same value, and the same name where the value's
 * data cannot tell (an empty one's may be NULL, every empty one's). */
static int is_own(const hvd_optimizer_t *core, int j, const hvd_param_t *p,
                  int by_name) {
  const hvd_param_t *q = &core->params[j];
  return core->mixed->master[j].data != NULL &&
         q->value.data == p->value.data && (!by_name || same_name(q, p));
}

/* The core's own low-precision parameter that the caller's p, the i-th
 * of a list given with the optimizer (its list), is: its i-th when that
 * holds p's value and name; else the one holding p's value, by name
 * too when p's data is NULL. Its index, or -1. */
static int own_low(const hvd_optimizer_t *core, int i, const hvd_param_t *p) {
  const hvd__mixed_t *m = core->mixed;
  if (i >= 0 && i < m->n && is_own(core, i, p, 1))
    return i;
  for (int j = 0; j < m->n; j++)
    if (is_own(core, j, p, p->value.data == NULL))
      return j;
  return -1;
}

hvd_result_t hvd__mixed_ckpt_params(hvd_optimizer_t *core,
                                    const hvd_param_t *params, int n,
                                    hvd_param_t **views) {
  hvd__mixed_t *m = core != NULL ? core->mixed : NULL;
  *views = NULL;
  if (m == NULL)
    return HVD_SUCCESS;
  hvd_param_t *v = malloc((n > 0 ? (size_t)n : 1) * sizeof *v);
  if (v == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "checkpoint: out of memory");
  for (int i = 0; i < n; i++) {
    int j = own_low(core, i, &params[i]);
    v[i] = params[i];
    if (j >= 0)
      v[i].value = m->full != NULL ? m->full[j] : m->master[j];
  }
  *views = v;
  return HVD_SUCCESS;
}

int hvd__mixed_index(const hvd_optimizer_t *core, int i, const hvd_param_t *p) {
  return core != NULL && core->mixed != NULL && core->mixed->full != NULL
             ? own_low(core, i, p)
             : -1;
}

int hvd__mixed_ckpt_target(hvd_optimizer_t *core, int i, const hvd_param_t *p,
                           hvd_tensor_t **blk, int64_t *lo, int64_t *hi) {
  int j = hvd__mixed_index(core, i, p);
  if (j < 0)
    return 0;
  hvd__mixed_t *m = core->mixed;
  *blk = &m->master[j];
  *lo = m->off[j];
  *hi = m->off[j] + m->len[j];
  return 1;
}

int64_t hvd__mixed_bytes(const hvd_optimizer_t *core) {
  const hvd__mixed_t *m = core->mixed;
  int64_t b = 0;
  for (int i = 0; m != NULL && i < m->n; i++)
    if (m->master[i].data != NULL)
      b += (int64_t)hvd__tensor_bytes(&m->master[i]);
  return b;
}

hvd_tensor_t *hvd__mixed_full(hvd_optimizer_t *core, int i) {
  hvd__mixed_t *m = core->mixed;
  return m != NULL && m->full != NULL && m->master[i].data != NULL ? &m->full[i]
                                                                   : NULL;
}

hvd_result_t hvd__mixed_values_from_masters(hvd_optimizer_t *core) {
  return core->mixed != NULL ? round_values(core, "hvd_checkpoint_load")
                             : HVD_SUCCESS;
}

/* The scaler's checkpoint counters: the scale's bits and the clean steps
 * (0 and 0 in *n without loss scaling). */
void hvd__mixed_counters(const hvd_optimizer_t *core, int64_t values[2],
                         int *n) {
  const hvd__mixed_t *m = core != NULL ? core->mixed : NULL;
  *n = 0;
  if (m == NULL || !m->scaling)
    return;
  memcpy(&values[0], &m->scale, sizeof m->scale);
  values[1] = m->clean;
  *n = 2;
}

void hvd__mixed_set_counters(hvd_optimizer_t *core, const int64_t values[2]) {
  hvd__mixed_t *m = core->mixed;
  if (m == NULL || !m->scaling)
    return;
  memcpy(&m->scale, &values[0], sizeof m->scale);
  m->clean = values[1];
}

void hvd__mixed_forget_skip(hvd_optimizer_t *core) {
  if (core->mixed != NULL)
    core->mixed->skipped = 0;
}

int hvd__mixed_scaling(const hvd_optimizer_t *core) {
  return core->mixed != NULL && core->mixed->scaling;
}

int hvd__mixed_hparams(hvd_optimizer_t *core, hvd__hp_t *hp) {
  hvd__mixed_t *m = core->mixed;
  if (m == NULL || !m->scaling)
    return 0;
  /* the running scale: backoffs without a floor can reach 0 (as torch's) */
  hp[0] = (hvd__hp_t){"loss scale", 'd', &m->scale, 0, HVD__HP_NONNEG};
  hp[1] = (hvd__hp_t){"loss scale's clean steps", 'l', &m->clean, 0,
                      HVD__HP_NONNEG};
  hp[2] = (hvd__hp_t){"init_scale", 'd', &m->o.init_scale, 0, HVD__HP_POS};
  hp[3] =
      (hvd__hp_t){"growth_factor", 'd', &m->o.growth_factor, 0, HVD__HP_GE1};
  hp[4] = (hvd__hp_t){"backoff_factor", 'd', &m->o.backoff_factor, 0,
                      HVD__HP_BACKOFF};
  hp[5] = (hvd__hp_t){"growth_interval", 'l', &m->o.growth_interval, 0,
                      HVD__HP_GE1};
  return 6;
}

/* ---- the public calls
 * -------------------------------------------------------- */

void hvd_loss_scale_options_init(hvd_loss_scale_options_t *o) {
  if (o == NULL)
    return;
  o->init_scale = 65536.0;
  o->growth_factor = 2.0;
  o->backoff_factor = 0.5;
  o->growth_interval = 2000;
}

hvd_result_t hvd_optimizer_set_loss_scaling(hvd_optimizer_t *opt,
                                            const hvd_loss_scale_options_t *o) {
  static const char who[] = "hvd_optimizer_set_loss_scaling";
  hvd_loss_scale_options_t d;
  hvd_result_t rc;
  if (opt == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", who);
  if (o == NULL) {
    hvd_loss_scale_options_init(&d);
    o = &d;
  }
  HVD__CHECK(
      hvd__optim_check_range(who, "init_scale", o->init_scale, 0, 1, INFINITY));
  HVD__CHECK(hvd__optim_check_range(who, "growth_factor", o->growth_factor, 1,
                                    0, INFINITY));
  if (!(o->backoff_factor > 0 && o->backoff_factor <= 1))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: backoff_factor %g is out of range (0, 1]", who,
                          o->backoff_factor);
  if (o->growth_interval < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: growth_interval %lld is below 1", who,
                          (long long)o->growth_interval);
  hvd_optimizer_t *core = hvd__optim_core(opt);
  if (core->mixed == NULL)
    HVD__CHECK(hvd__mixed_create(who, core, 1));
  core->mixed->scaling = 1;
  core->mixed->o = *o;
  core->mixed->scale = o->init_scale;
  core->mixed->clean = 0;
fail:
  return rc;
}

double hvd_optimizer_loss_scale(const hvd_optimizer_t *opt) {
  if (opt == NULL)
    return NAN;
  const hvd__mixed_t *m = hvd__optim_core_const(opt)->mixed;
  return m != NULL && m->scaling ? m->scale : 1.0;
}

int hvd_optimizer_step_skipped(const hvd_optimizer_t *opt) {
  const hvd__mixed_t *m = opt ? hvd__optim_core_const(opt)->mixed : NULL;
  return m != NULL && m->skipped;
}
