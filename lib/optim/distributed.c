/*
 * distributed.c - the distributed optimizer: a wrapper around a plain
 * optimizer that all-reduces each gradient through hvd's engine before
 * the base update.
 *
 * Every gradient is reduced in place, asynchronously, under the name
 * "hvd.grad.<param name>", as one HVD_SUM whose prescale and postscale
 * carry every division (passes, predivide factor, world size). All
 * parameters thus share one op and one pair of factors, so the engine
 * fuses whatever is ready in the same cycle into one buffer:
 *
 *   prescale  = 1 / (k if average_passes else 1) / f
 *   postscale = f / size (HVD_AVERAGE)  or  f (HVD_SUM)
 *
 * With op HVD_ADASUM the reductions are HVD_ADASUM allreduces (whole
 * float32 host gradients, f 1: lib/ops/adasum.c), prescale 1 / k.
 *
 * With compression HVD_COMPRESS_POWERSGD (powersgd.c) a compressed
 * parameter's reduction is PowerSGD's: grad_ready applies the prescale
 * and submits P's allreduce in place of the gradient's; the step, once
 * every first-round request is back, runs the second round (Q) and
 * writes the approximation, times the postscale, into the gradient.
 *
 * Device gradients (parameters on the rank's GPU) go through the engine's
 * device executors like any device tensor; the only gradient arithmetic
 * done here, the no-sync division by the passes, runs as a kernel.
 *
 * Per parameter the wrapper counts backward passes since the last step;
 * the k-th hvd_optimizer_grad_ready() starts the reduction at once, so it
 * overlaps the rest of backward. hvd_optimizer_step() starts the ones not
 * started yet, waits for every one of them (even after a failure, so none
 * is left in flight on the caller's buffers) and applies the base update
 * only if all succeeded.
 *
 * Sparse rows (hvd_optimizer_sparse_grad: an embedding lookup's share of
 * a gradient) that arrive before their parameter's reduction starts are
 * added into the gradient and reduced with it. Those that arrive after,
 * while the dense share is in flight, are kept here and allgathered at
 * the step ("hvd.sparse.<name>.rows" and ".values", every rank's rows in
 * rank order, as Horovod gathers IndexedSlices); once the dense sum is
 * back, each gathered row is added to it times prescale * postscale. A
 * parameter with sparse calls this step takes both allgathers on every
 * rank, with zero rows where they all went into the dense share, so that
 * ranks agree whatever the order of their calls.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

#define GRAD_PREFIX "hvd.grad."
#define SPARSE_PREFIX "hvd.sparse."
#define HPARAMS_PREFIX "hvd.hparams."

/* The rows that wait for the step's allgather, and its two requests
 * (rows as int64 [nrows], values as float32 [nrows, row_len]). */
typedef struct sparse_rows {
  int calls;      /* hvd_optimizer_sparse_grad calls this step */
  int64_t n, cap; /* rows kept, rows allocated */
  int64_t *rows;  /* n */
  float *values;  /* n * row_len */
  hvd_request_t *req[2];
  hvd_tensor_t got[2]; /* the gathered rows and values */
} sparse_rows_t;

typedef struct dist_param {
  const char *name;   /* "hvd.grad.<param name>", in dist.names */
  int passes;         /* backward passes since the last step */
  int started;        /* its reduction was submitted this step */
  hvd_request_t *req; /* in flight (started and not waited), else NULL */
  sparse_rows_t sp;
} dist_param_t;

struct hvd__dist {
  hvd_distributed_options_t o;
  hvd_dtype_t wire; /* HVD_FLOAT32, or the compressed wire dtype */
  hvd_op_t op;      /* the reductions': HVD_SUM, or HVD_ADASUM */
  double prescale, postscale;
  int sync;     /* 1: reduce (default); 0: local gradients */
  int inflight; /* requests started and not waited */
  int n;
  dist_param_t *p;   /* n entries */
  char *names;       /* the reduction names, one block */
  hvd__zero_t *zero; /* shard_optimizer_state: ZeRO-1 (zero.c), else NULL */
  hvd__psgd_t *psgd; /* compression powersgd (powersgd.c), else NULL */
  hvd__ggroups_t *groups; /* num_groups/groups (grad_groups.c), else NULL */
  double gpost;           /* local SGD: the postscale within its group */
  /* the hyperparameters' check of a reducing step (hparams.c) */
  char *hp_name;         /* "hvd.hparams.<first parameter's name>" */
  int64_t hp[2];         /* the digest and its negation, MAX-reduced */
  hvd_request_t *hp_req; /* in flight during reduce_all */
};

void hvd_distributed_options_init(hvd_distributed_options_t *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->op = HVD_AVERAGE;
  o->compression = HVD_COMPRESS_NONE;
  o->backward_passes_per_step = 1;
  o->average_passes = 1;
  o->gradient_predivide_factor = 1.0;
  o->check_hparams = 1;
  o->powersgd.rank = 1;
  o->powersgd.start_step = 1000;
  o->powersgd.min_compression_rate = 2.0;
  o->powersgd.error_feedback = 1;
  o->powersgd.warm_start = 1;
  o->powersgd.wire = HVD_FLOAT32;
}

/* ---- creation ----------------------------------------------------------- */

/* Post-local SGD (local_sgd.period >= 1): a group this rank is in; whole
 * uncompressed gradients, summed or averaged. */
static hvd_result_t check_local_sgd(const char *fn,
                                    const hvd_distributed_options_t *o) {
  const hvd_local_sgd_options_t *l = &o->local_sgd;
  if (l->period < 0 || l->start_step < 0)
    return hvd__set_error(
        HVD_ERR_INVALID_ARG, "%s: local_sgd.%s %lld is %s", fn,
        l->period < 0 ? "period" : "start_step",
        (long long)(l->period < 0 ? l->period : l->start_step), "negative");
  if (l->period == 0)
    return HVD_SUCCESS;
  const char *no = o->shard_optimizer_state ? "shard_optimizer_state"
                   : o->compression != HVD_COMPRESS_NONE ? "compression"
                   : o->op == HVD_ADASUM                 ? "op adasum"
                                                         : NULL;
  if (no != NULL)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: local_sgd averages whole gradients within its "
                          "group: no %s",
                          fn, no);
  if (l->group != NULL && hvd_process_set_rank(l->group) < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: local_sgd.group: rank %d is not in process set "
                          "%d",
                          fn, hvd_rank(), hvd_process_set_id(l->group));
  return HVD_SUCCESS;
}

/* process_set: a set this rank is in. Local SGD's group, within it. */
static hvd_result_t check_process_set(const char *fn,
                                      const hvd_distributed_options_t *o) {
  const hvd_process_set_t *ps = o->process_set, *g = o->local_sgd.group;
  if (ps != NULL && hvd_process_set_rank(ps) < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: process_set: rank %d is not in process set %d",
                          fn, hvd_rank(), hvd_process_set_id(ps));
  for (int r = 0; ps != NULL && g != NULL && o->local_sgd.period > 0 &&
                  r < hvd_process_set_size(g);
       r++) {
    int w = hvd__process_set_world_rank(g, r);
    if (!hvd__process_set_has(ps, w))
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: local_sgd.group: process set %d has rank %d, "
                            "which is not in process_set %d",
                            fn, hvd_process_set_id(g), w,
                            hvd_process_set_id(ps));
  }
  return HVD_SUCCESS;
}

/* HVD_ADASUM combines whole float32 gradients as they are, host or
 * device: the parameters' (or reduce_fp32's copies), with no compression,
 * no sharding (a reduce-scatter), no predivision. */
static hvd_result_t check_adasum(const char *fn,
                                 const hvd_distributed_options_t *o,
                                 const hvd_optimizer_t *base) {
  const char *no = o->compression != HVD_COMPRESS_NONE ? "compression"
                   : o->shard_optimizer_state          ? "shard_optimizer_state"
                   : o->gradient_predivide_factor != 1.0
                       ? "gradient_predivide_factor other than 1"
                       : NULL;
  if (no != NULL)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: op adasum combines whole gradients as they "
                          "are: no %s",
                          fn, no);
  for (int i = 0; i < base->n; i++) {
    const hvd_tensor_t *g = &base->params[i].grad;
    if (g->dtype != HVD_FLOAT32 && !o->reduce_fp32)
      return hvd__set_error(HVD_ERR_UNSUPPORTED,
                            "%s: op adasum needs float32 gradients (set "
                            "reduce_fp32 for float16/bfloat16 ones); "
                            "parameter '%s' has %s",
                            fn, base->params[i].name, hvd_dtype_name(g->dtype));
  }
  return HVD_SUCCESS;
}

static hvd_result_t check_options(const char *fn,
                                  const hvd_distributed_options_t *o) {
  if (o->op != HVD_AVERAGE && o->op != HVD_SUM && o->op != HVD_ADASUM)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: op %s is not supported (average, sum or "
                          "adasum)",
                          fn, hvd_op_name(o->op));
  if (o->compression != HVD_COMPRESS_NONE &&
      o->compression != HVD_COMPRESS_FP16 &&
      o->compression != HVD_COMPRESS_BF16 &&
      o->compression != HVD_COMPRESS_POWERSGD)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: unknown compression %d", fn,
                          (int)o->compression);
  if (o->backward_passes_per_step < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: backward_passes_per_step %d is below 1", fn,
                          o->backward_passes_per_step);
  if (o->average_passes != 0 && o->average_passes != 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: average_passes %d is not 0 or 1", fn,
                          o->average_passes);
  if (o->shard_optimizer_state != 0 && o->shard_optimizer_state != 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: shard_optimizer_state %d is not 0 or 1", fn,
                          o->shard_optimizer_state);
  if (o->reduce_fp32 != 0 && o->reduce_fp32 != 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: reduce_fp32 %d is not 0 or 1", fn,
                          o->reduce_fp32);
  if (o->check_hparams != 0 && o->check_hparams != 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: check_hparams %d is not 0 or 1", fn,
                          o->check_hparams);
  if (o->shard_optimizer_state && o->compression != HVD_COMPRESS_NONE)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: shard_optimizer_state reduce-scatters float32 "
                          "gradients: no compression",
                          fn);
  if (!isfinite(o->gradient_predivide_factor) ||
      o->gradient_predivide_factor <= 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: gradient_predivide_factor %g is not a positive "
                          "finite number",
                          fn, o->gradient_predivide_factor);
  return HVD_SUCCESS;
}

/* Every option against base; then the groups (*groups, NULL without). */
static hvd_result_t check_all(const char *fn,
                              const hvd_distributed_options_t *o,
                              const hvd_optimizer_t *base,
                              hvd__ggroups_t **groups) {
  hvd_result_t rc;
  HVD__CHECK(check_options(fn, o));
  HVD__CHECK(check_process_set(fn, o));
  HVD__CHECK(check_local_sgd(fn, o));
  if (o->op == HVD_ADASUM)
    HVD__CHECK(check_adasum(fn, o, base));
  return hvd__ggroups_create(fn, o, base, groups);
fail:
  return rc;
}

/* The reduction names, "hvd.grad.<name>", in one allocation. */
static hvd_result_t make_names(const char *fn, hvd__dist_t *d,
                               const hvd_optimizer_t *base) {
  size_t total = 0;
  for (int i = 0; i < base->n; i++) {
    if (base->params[i].name == NULL || base->params[i].name[0] == '\0')
      return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: parameter %d has no name",
                            fn, i);
    total += sizeof GRAD_PREFIX + strlen(base->params[i].name);
  }
  d->names = malloc(total > 0 ? total : 1);
  if (d->names == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: %zu bytes of names", fn,
                          total);
  char *s = d->names;
  for (int i = 0; i < base->n; i++) {
    size_t len = strlen(base->params[i].name);
    memcpy(s, GRAD_PREFIX, sizeof GRAD_PREFIX - 1);
    memcpy(s + sizeof GRAD_PREFIX - 1, base->params[i].name, len + 1);
    d->p[i].name = s;
    s += sizeof GRAD_PREFIX + len;
  }
  const char *first = base->n > 0 ? base->params[0].name : "";
  d->hp_name = malloc(sizeof HPARAMS_PREFIX + strlen(first));
  if (d->hp_name == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: names", fn);
  memcpy(d->hp_name, HPARAMS_PREFIX, sizeof HPARAMS_PREFIX);
  strcat(d->hp_name, first);
  return HVD_SUCCESS;
}

/* Waits for reductions still in flight (the buffers are the caller's),
 * then frees d. */
static void dist_free(hvd__dist_t *d) {
  if (d == NULL)
    return;
  if (d->p != NULL)
    for (int i = 0; i < d->n; i++) {
      sparse_rows_t *sp = &d->p[i].sp;
      if (d->p[i].req != NULL)
        (void)hvd_wait(d->p[i].req); /* the buffers are the caller's */
      for (int j = 0; j < 2; j++)
        if (sp->req[j] != NULL && hvd_wait(sp->req[j]) == HVD_SUCCESS)
          hvd_tensor_free(&sp->got[j]);
      free(sp->rows);
      free(sp->values);
    }
  hvd__zero_free(d->zero);
  hvd__psgd_free(d->psgd);
  hvd__ggroups_free(d->groups);
  free(d->p);
  free(d->names);
  free(d->hp_name);
  free(d);
}

hvd_result_t hvd_distributed_optimizer(hvd_optimizer_t *base,
                                       const hvd_distributed_options_t *o,
                                       hvd_optimizer_t **out) {
  static const char fn[] = "hvd_distributed_optimizer";
  hvd_distributed_options_t defaults;
  hvd_optimizer_t *opt = NULL;
  hvd__dist_t *d = NULL;
  hvd_result_t rc;

  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", fn);
  if (base == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: base is NULL", fn);
  if (base->cls == &hvd__dist_class)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: base is already a distributed optimizer", fn);
  if (o == NULL) {
    hvd_distributed_options_init(&defaults);
    o = &defaults;
  }
  /* sizes, ranks and blocks below are the process set's */
  const hvd_process_set_t *was = hvd__coll_set(o->process_set);
  hvd__ggroups_t *groups = NULL;
  HVD__CHECK(check_all(fn, o, base, &groups));

  opt = calloc(1, sizeof *opt);
  d = calloc(1, sizeof *d);
  if (opt == NULL || d == NULL) {
    hvd__ggroups_free(groups);
    goto oom;
  }
  d->groups = groups;
  d->p = calloc(base->n > 0 ? (size_t)base->n : 1, sizeof *d->p);
  if (d->p == NULL)
    goto oom;
  d->n = base->n;
  HVD__CHECK(make_names(fn, d, base));

  d->o = *o;
  d->sync = 1;
  d->wire = o->compression == HVD_COMPRESS_FP16   ? HVD_FLOAT16
            : o->compression == HVD_COMPRESS_BF16 ? HVD_BFLOAT16
                                                  : HVD_FLOAT32;
  double f = o->gradient_predivide_factor;
  double k = o->average_passes ? (double)o->backward_passes_per_step : 1.0;
  d->prescale = 1.0 / k / f;
  d->postscale = o->op == HVD_AVERAGE ? f / hvd__coll_size() : f;
  d->gpost = o->op != HVD_AVERAGE ? f
             : o->local_sgd.group != NULL
                 ? f / hvd_process_set_size(o->local_sgd.group)
                 : d->postscale;
  d->op = o->op == HVD_ADASUM ? HVD_ADASUM : HVD_SUM;
  if (o->compression == HVD_COMPRESS_POWERSGD) {
    d->wire = o->powersgd.wire; /* what it does not compress goes whole */
    HVD__CHECK(
        hvd__psgd_create(fn, &o->powersgd, base, o->reduce_fp32, &d->psgd));
  }
  /* loss scaling's, clipping's and LAMB's collectives in the step */
  HVD__CHECK(hvd__optim_name_steps(fn, base));
  if (o->shard_optimizer_state) /* last: it drops the base's full state */
    HVD__CHECK(hvd__zero_create(fn, base, o->reduce_fp32, &d->zero));
  base->agree_inf = 1;
  base->sharded = o->shard_optimizer_state != 0;

  opt->cls = &hvd__dist_class;
  opt->lr = NAN; /* the base holds lr, steps, params and state */
  opt->fresh = base->fresh;
  opt->base = base;
  opt->dist = d;
  opt->ps = base->ps = o->process_set;
  hvd__coll_set(was);
  *out = opt;
  return HVD_SUCCESS;

oom:
  rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
fail:
  dist_free(d);
  free(opt);
  hvd__coll_set(was);
  return rc;
}

/* ---- reductions --------------------------------------------------------- */

/* Whether this step is a local one (local SGD from its start_step). */
static int local_step(const hvd_optimizer_t *opt) {
  const hvd_local_sgd_options_t *l = &opt->dist->o.local_sgd;
  return l->period > 0 && opt->base->steps >= l->start_step;
}

/* Whether this step reduces gradients: sync, and not a local step
 * without a group. */
static int reduces(const hvd_optimizer_t *opt) {
  return opt->dist->sync &&
         !(local_step(opt) && opt->dist->o.local_sgd.group == NULL);
}

/* The group of a local step, else NULL (the world). */
static const hvd_process_set_t *group_of(const hvd_optimizer_t *opt) {
  return local_step(opt) ? opt->dist->o.local_sgd.group : NULL;
}

/* Submits parameter i's reduction (in place). */
static hvd_result_t start(hvd_optimizer_t *opt, int i) {
  hvd__dist_t *d = opt->dist;
  hvd_param_t *p = &opt->base->params[i];
  hvd_tensor_t *g = &p->grad; /* float16/bfloat16: reduced so, unless */
  hvd_result_t rc = HVD_SUCCESS;
  if (d->o.reduce_fp32) /* its float32 copy, made now */
    rc = hvd__mixed_grad32(opt->base, i, &g);
  if (rc != HVD_SUCCESS)
    return rc;
  if (group_of(opt) != NULL)
    rc = hvd_ps_allreduce_async(group_of(opt), d->p[i].name, g, g, d->op,
                                d->prescale, d->gpost, &d->p[i].req);
  else if (d->zero != NULL)
    rc = hvd__zero_reduce_async(d->zero, g, i, d->p[i].name, d->prescale,
                                d->postscale, &d->p[i].req);
  else if (hvd__psgd_takes(d->psgd, i, opt->base->steps))
    rc = hvd__psgd_start(d->psgd, i, g, d->prescale, &d->p[i].req);
  else if (d->wire == HVD_FLOAT32 || g->dtype != HVD_FLOAT32)
    rc = hvd_allreduce_async(d->p[i].name, g, g, d->op, d->prescale,
                             d->postscale, &d->p[i].req);
  else
    rc = hvd__allreduce_wire_async(d->p[i].name, g, g, HVD_SUM, d->prescale,
                                   d->postscale, d->wire, &d->p[i].req);
  if (rc == HVD_SUCCESS) {
    d->p[i].started = 1;
    d->inflight++;
  }
  return rc;
}

/* Submits group k's reductions as one grouped allreduce (in place), as
 * start's for one parameter: every member's request its own. */
static hvd_result_t start_group(hvd_optimizer_t *opt, int k) {
  hvd__dist_t *d = opt->dist;
  const int *idx;
  const char **names;
  hvd_tensor_t *t;
  hvd_request_t **reqs;
  int m = hvd__ggroups_members(d->groups, k, &idx);
  hvd_result_t rc = HVD_SUCCESS;
  hvd__ggroups_scratch(d->groups, &names, &t, &reqs);
  for (int j = 0; j < m && rc == HVD_SUCCESS; j++) {
    hvd_tensor_t *g = &opt->base->params[idx[j]].grad;
    if (d->o.reduce_fp32)
      rc = hvd__mixed_grad32(opt->base, idx[j], &g);
    names[j] = d->p[idx[j]].name;
    t[j] = *g; /* the request keeps its own copy */
  }
  if (rc != HVD_SUCCESS)
    return rc;
  if (group_of(opt) != NULL)
    rc = hvd_ps_grouped_allreduce_async(group_of(opt), m, names, t, t, d->op,
                                        d->prescale, d->gpost, reqs);
  else if (d->wire == HVD_FLOAT32)
    rc = hvd_grouped_allreduce_async(m, names, t, t, d->op, d->prescale,
                                     d->postscale, reqs);
  else
    rc = hvd__grouped_allreduce_wire_async(m, names, t, t, HVD_SUM, d->prescale,
                                           d->postscale, d->wire, reqs);
  for (int j = 0; j < m && rc == HVD_SUCCESS; j++) {
    d->p[idx[j]].req = reqs[j];
    d->p[idx[j]].started = 1;
    d->inflight++;
  }
  return rc;
}

/* Parameter i's reduction, or its group's once i was the last of it. */
static hvd_result_t start_ready(hvd_optimizer_t *opt, int i) {
  int k = hvd__ggroups_of(opt->dist->groups, i);
  if (k < 0)
    return start(opt, i);
  return hvd__ggroups_ready(opt->dist->groups, k) ? start_group(opt, k)
                                                  : HVD_SUCCESS;
}

static hvd_result_t dist_grad_ready(hvd_optimizer_t *opt, int i) {
  static const char fn[] = "hvd_optimizer_grad_ready";
  hvd__dist_t *d = opt->dist;
  if (i < 0 || i >= d->n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: index %d is out of range for %d parameters", fn,
                          i, d->n);
  dist_param_t *p = &d->p[i];
  if (reduces(opt) &&
      (p->started || (hvd__ggroups_of(d->groups, i) >= 0 &&
                      p->passes == d->o.backward_passes_per_step)))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: the gradient of parameter %d ('%s') is already "
                          "being reduced (backward_passes_per_step %d; call "
                          "hvd_optimizer_step first)",
                          fn, i, opt->base->params[i].name,
                          d->o.backward_passes_per_step);
  opt->fresh = 1;
  if (p->passes < d->o.backward_passes_per_step)
    p->passes++;
  if (reduces(opt) && p->passes == d->o.backward_passes_per_step)
    return start_ready(opt, i);
  return HVD_SUCCESS;
}

/* Elements per row of parameter i's gradient. */
static int64_t row_len(const hvd_optimizer_t *opt, int i) {
  const hvd_tensor_t *g = &opt->base->params[i].grad;
  return hvd_tensor_numel(g) / g->shape[0];
}

static hvd_result_t dist_sparse_grad(hvd_optimizer_t *opt, int i,
                                     const int64_t *rows, int64_t nrows,
                                     const float *values) {
  hvd__dist_t *d = opt->dist;
  dist_param_t *p = &d->p[i];
  sparse_rows_t *sp = &p->sp;
  /* rows after the dense share's reduction started are allgathered and
   * added to the sum; neither a block nor Adasum's combination is one */
  const char *whole = d->zero != NULL ? "a sharded optimizer takes"
                      : d->op == HVD_ADASUM
                          ? "op adasum (whole gradients) takes"
                          : NULL;
  if (whole != NULL && reduces(opt) && p->started)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "hvd_optimizer_sparse_grad: parameter '%s': its "
                          "reduction started, and %s no rows after that (hand "
                          "them over before hvd_optimizer_grad_ready)",
                          opt->base->params[i].name, whole);
  opt->fresh = 1;
  if (reduces(opt))
    sp->calls++;
  if (!reduces(opt) || !p->started) { /* not in flight: into the dense share */
    hvd__optim_sparse_add(&opt->base->params[i].grad, rows, nrows, values,
                          1.0f);
    return HVD_SUCCESS;
  }
  int64_t len = row_len(opt, i);
  if (sp->n + nrows > sp->cap) {
    int64_t cap = sp->cap > 0 ? sp->cap : 256;
    while (cap < sp->n + nrows)
      cap *= 2;
    int64_t *r = realloc(sp->rows, (size_t)cap * sizeof *r);
    if (r != NULL)
      sp->rows = r;
    float *v = realloc(sp->values, (size_t)(cap * len) * sizeof *v);
    if (v != NULL)
      sp->values = v;
    if (r == NULL || v == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY,
                            "hvd_optimizer_sparse_grad: parameter '%s': out "
                            "of memory for %lld rows of %lld",
                            opt->base->params[i].name, (long long)cap,
                            (long long)len);
    sp->cap = cap;
  }
  if (nrows == 0) /* the call still counts (sp->calls): ranks agree */
    return HVD_SUCCESS;
  memcpy(sp->rows + sp->n, rows, (size_t)nrows * sizeof *rows);
  memcpy(sp->values + sp->n * len, values,
         (size_t)(nrows * len) * sizeof *values);
  sp->n += nrows;
  return HVD_SUCCESS;
}

/* Submits parameter i's two allgathers of its kept rows. */
static hvd_result_t sparse_start(hvd_optimizer_t *opt, int i) {
  static const char *const part[2] = {".rows", ".values"};
  static const int64_t none = 0; /* the data of zero rows */
  static const float nothing = 0;
  sparse_rows_t *sp = &opt->dist->p[i].sp;
  const char *pname = opt->base->params[i].name;
  size_t len = sizeof SPARSE_PREFIX + strlen(pname) + sizeof ".values";
  char *name = malloc(len);
  if (name == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "hvd_optimizer_step: out of memory");
  hvd_tensor_t t[2] = {
      {.data = sp->n > 0 ? (void *)sp->rows : (void *)&none,
       .dtype = HVD_INT64,
       .ndim = 1,
       .shape = {sp->n},
       .device = HVD_CPU},
      {.data = sp->n > 0 ? (void *)sp->values : (void *)&nothing,
       .dtype = HVD_FLOAT32,
       .ndim = 2,
       .shape = {sp->n, row_len(opt, i)},
       .device = HVD_CPU},
  };
  hvd_result_t rc = HVD_SUCCESS;
  for (int j = 0; j < 2 && rc == HVD_SUCCESS; j++) {
    snprintf(name, len, "%s%s%s", SPARSE_PREFIX, pname, part[j]);
    rc = group_of(opt) != NULL
             ? hvd_ps_allgather_async(group_of(opt), name, &t[j], &sp->got[j],
                                      &sp->req[j])
             : hvd_allgather_async(name, &t[j], &sp->got[j], &sp->req[j]);
    if (rc == HVD_SUCCESS)
      opt->dist->inflight++;
  }
  free(name);
  return rc;
}

/* Waits for parameter i's allgathers; if they and everything before
 * succeeded (keep), adds the gathered rows to the reduced gradient. */
static hvd_result_t sparse_finish(hvd_optimizer_t *opt, int i, int keep) {
  hvd__dist_t *d = opt->dist;
  sparse_rows_t *sp = &d->p[i].sp;
  hvd_result_t first = HVD_SUCCESS;
  int ok[2] = {0, 0};
  for (int j = 0; j < 2; j++) {
    if (sp->req[j] == NULL)
      continue;
    hvd_result_t rc = hvd_wait(sp->req[j]);
    sp->req[j] = NULL;
    d->inflight--;
    ok[j] = rc == HVD_SUCCESS;
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS)
      first = rc;
  }
  if (ok[0] && ok[1] && keep)
    hvd__optim_sparse_add(
        &opt->base->params[i].grad, sp->got[0].data, sp->got[0].shape[0],
        sp->got[1].data,
        (float)(d->prescale * (group_of(opt) ? d->gpost : d->postscale)));
  for (int j = 0; j < 2; j++)
    if (ok[j])
      hvd_tensor_free(&sp->got[j]);
  return first;
}

/* Forgets the passes of the step that ends (or is discarded). */
static void reset_passes(hvd__dist_t *d) {
  hvd__ggroups_reset(d->groups);
  for (int i = 0; i < d->n; i++) {
    d->p[i].passes = 0;
    d->p[i].started = 0;
    d->p[i].sp.calls = 0;
    d->p[i].sp.n = 0;
  }
}

/* A mismatch of a gradient's reduction in a field that this optimizer's
 * options set ("allreduce 'hvd.grad.w': rank 0 prescale 1 vs rank 1
 * prescale 0.5") names the options that differ between the ranks, in the
 * user's words: appended to msg. */
static void mismatch_hint(char *msg, size_t cap) {
  static const struct {
    const char *field, *options;
  } hints[] = {{" prescale ", "backward_passes_per_step, average_passes or "
                              "gradient_predivide_factor"},
               {" postscale ", "backward_passes_per_step, average_passes or "
                               "gradient_predivide_factor"},
               {" op ", "op"},
               {" group ", "num_groups or groups"},
               {" wire dtype ", "compression"}};
  const char *name = strstr(msg, " '" GRAD_PREFIX);
  const char *label_end = name != NULL ? strstr(name, "': rank ") : NULL;
  if (label_end == NULL)
    return;
  for (size_t k = 0; k < sizeof hints / sizeof hints[0]; k++)
    if (strstr(label_end, hints[k].field) != NULL) {
      size_t n = strlen(msg);
      snprintf(msg + n, cap - n,
               " (the ranks' distributed optimizers differ in %s)",
               hints[k].options);
      return;
    }
}

/* The hyperparameters' check (hparams.c): every member of the step's
 * group (the world, or a local step's group) all-reduces (digest,
 * -digest) as MAX beside the gradients, so that the step costs no round
 * of its own: the two come back as (max, -min). */
static hvd_result_t hp_start(hvd_optimizer_t *opt) {
  hvd__dist_t *d = opt->dist;
  int64_t two = 2;
  if (!d->o.check_hparams)
    return HVD_SUCCESS;
  d->hp[0] = hvd__hp_digest(opt->base);
  d->hp[1] = -d->hp[0];
  hvd_tensor_t t = hvd_tensor_make(d->hp, HVD_INT64, 1, &two);
  hvd_result_t rc =
      group_of(opt) != NULL
          ? hvd_ps_allreduce_async(group_of(opt), d->hp_name, &t, &t, HVD_MAX,
                                   1, 1, &d->hp_req)
          : hvd_allreduce_async(d->hp_name, &t, &t, HVD_MAX, 1, 1, &d->hp_req);
  if (rc == HVD_SUCCESS)
    d->inflight++;
  return rc;
}

/* Its end: a difference between the ranks fails the step on every one of
 * them alike, naming what differs (decided by the reduced pair, the same
 * on every rank, whatever else failed: its gathers are collective). */
static hvd_result_t hp_finish(hvd_optimizer_t *opt) {
  hvd__dist_t *d = opt->dist;
  if (d->hp_req == NULL)
    return HVD_SUCCESS;
  hvd_result_t rc = hvd_wait(d->hp_req);
  d->hp_req = NULL;
  d->inflight--;
  if (rc != HVD_SUCCESS || d->hp[0] == -d->hp[1])
    return rc;
  return hvd__hp_mismatch(opt->base, group_of(opt), d->hp_name);
}

/* Sync step: start the rest, wait for all, keep the first failure. */
static hvd_result_t reduce_all(hvd_optimizer_t *opt) {
  hvd__dist_t *d = opt->dist;
  hvd_result_t first = hp_start(opt);
  char msg[HVD__ERRMSG_MAX];

  if (first != HVD_SUCCESS)
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  for (int i = d->n - 1; i >= 0; i--) {
    if (d->p[i].started)
      continue;
    int k = hvd__ggroups_of(d->groups, i); /* a group whole, where it is */
    hvd_result_t rc = k >= 0 ? start_group(opt, k) : start(opt, i);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  for (int i = 0; i < d->n; i++) {
    if (d->p[i].sp.calls == 0)
      continue;
    hvd_result_t rc = sparse_start(opt, i);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  for (int i = d->n - 1; i >= 0; i--) {
    if (d->p[i].req == NULL)
      continue;
    hvd_result_t rc = hvd_wait(d->p[i].req);
    d->p[i].req = NULL;
    d->inflight--;
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  { /* PowerSGD's second round, then its approximations */
    hvd_result_t rc =
        hvd__psgd_finish(d->psgd, first == HVD_SUCCESS, d->postscale);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  for (int i = 0; i < d->n; i++) { /* the dense sums are back */
    hvd_result_t rc = sparse_finish(opt, i, first == HVD_SUCCESS);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  if (first == HVD_ERR_MISMATCH)
    mismatch_hint(msg, sizeof msg);
  { /* last: its mismatch needs every other request back */
    hvd_result_t rc = hp_finish(opt);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  return first == HVD_SUCCESS ? HVD_SUCCESS : hvd__set_error_msg(first, msg);
}

/* No-sync step: the local gradients, averaged over the passes; device
 * gradients by a kernel on the base's stream (the same float multiply),
 * complete before the base update, which may be a custom one. */
static hvd_result_t scale_local(hvd_optimizer_t *opt) {
  static const char who[] = "hvd_optimizer_step";
  hvd__dist_t *d = opt->dist;
  hvd__odev_t *odev = opt->base->odev;
  hvd_result_t rc = HVD_SUCCESS;
  if (!d->o.average_passes || d->o.backward_passes_per_step == 1 ||
      opt->base->mixed != NULL) /* mixed: divided as they become float32 */
    return HVD_SUCCESS;
  double f = 1.0 / d->o.backward_passes_per_step;
  float s = (float)f;
  for (int i = 0; i < d->n && rc == HVD_SUCCESS; i++) {
    hvd_tensor_t *g = &opt->base->params[i].grad;
    float *x = g->data;
    int64_t m = hvd_tensor_numel(g);
    if (g->device != HVD_CPU) {
      rc = hvd__odev_scale(who, odev, x, m, f);
      continue;
    }
    for (int64_t j = 0; j < m; j++)
      x[j] *= s;
  }
  if (odev != NULL) {
    hvd_result_t sync = hvd__odev_sync(who, odev);
    if (rc == HVD_SUCCESS)
      rc = sync;
  }
  return rc;
}

static hvd_result_t dist_step(hvd_optimizer_t *opt) {
  hvd__dist_t *d = opt->dist;
  hvd_result_t rc;
  if (!opt->fresh)
    return hvd__set_error_msg(HVD_ERR_INVALID_ARG, HVD__NO_NEW_GRADS);
  /* local SGD: after this step's update, maybe the average (c: its count) */
  const int red = reduces(opt), local = local_step(opt);
  const int64_t c = opt->base->steps;
  if (red) {
    rc = reduce_all(opt);
  } else {
    rc = scale_local(opt);
  }
  /* Either way these gradients are spent: reduced in place, or failed
   * part way (a retry would reduce some twice). */
  reset_passes(d);
  opt->fresh = 0;
  if (rc == HVD_SUCCESS && d->zero != NULL)
    rc = hvd__zero_apply(d->zero, opt->base);
  else if (rc == HVD_SUCCESS && opt->base->mixed != NULL && !red &&
           d->o.average_passes)
    rc = hvd__mixed_apply(opt->base, 1.0 / d->o.backward_passes_per_step);
  else if (rc == HVD_SUCCESS)
    rc = hvd__optim_apply(opt->base);
  else /* spent: reduce_fp32's float32 copies too, for the next step */
    hvd__mixed_forget_grads(opt->base);
  /* a step skipped for an inf (every rank alike) is no step: its count
   * stays, and the average waits for it, as DDP's averager is not called
   * when GradScaler skips optimizer.step() */
  if (rc == HVD_SUCCESS && d->zero == NULL && local && d->sync &&
      !hvd_optimizer_step_skipped(opt) &&
      (c - d->o.local_sgd.start_step) % d->o.local_sgd.period == 0)
    rc = hvd__lsgd_average(opt->base);
  return rc;
}

static hvd_result_t dist_zero_grad(hvd_optimizer_t *opt) {
  hvd__dist_t *d = opt->dist;
  if (d->inflight > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_optimizer_zero_grad: gradient reductions are "
                          "in flight (call hvd_optimizer_step first)");
  hvd_result_t rc = hvd_optimizer_zero_grad(opt->base);
  if (rc != HVD_SUCCESS)
    return rc;
  reset_passes(d);
  opt->fresh = 1;
  return HVD_SUCCESS;
}

static hvd_result_t dist_set_sync(hvd_optimizer_t *opt, int sync) {
  static const char fn[] = "hvd_optimizer_set_sync";
  hvd__dist_t *d = opt->dist;
  if (sync != 0 && sync != 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: sync %d is not 0 or 1", fn,
                          sync);
  if (d->zero != NULL && sync == 0)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: a sharded optimizer has no no-sync mode (each "
                          "rank updates only its shard)",
                          fn);
  if (d->inflight > 0 && sync != d->sync)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: gradient reductions are in flight (call "
                          "hvd_optimizer_step first)",
                          fn);
  d->sync = sync;
  return HVD_SUCCESS;
}

hvd__psgd_t *hvd__optim_psgd(const hvd_optimizer_t *opt) {
  return opt != NULL && opt->dist != NULL ? opt->dist->psgd : NULL;
}

int hvd__optim_sharded(const hvd_optimizer_t *opt) {
  return opt->dist != NULL && opt->dist->zero != NULL;
}

hvd_result_t hvd__optim_root_param(hvd_optimizer_t *opt, int i,
                                   const hvd_param_t *p,
                                   hvd_tensor_t **master) {
  *master = NULL;
  if (opt->dist == NULL || opt->dist->zero == NULL)
    return HVD_SUCCESS;
  int m = hvd__mixed_index(opt->base, i, p);
  if (m >= 0)
    *master = hvd__mixed_full(opt->base, m);
  return hvd__zero_root_param(opt->dist->zero, opt->base, i, m);
}

void hvd__optim_drop_param(hvd_optimizer_t *opt, int i, const hvd_param_t *p) {
  if (opt->dist != NULL && opt->dist->zero != NULL)
    hvd__zero_release_param(opt->dist->zero, opt->base, i,
                            hvd__mixed_index(opt->base, i, p));
}

hvd_tensor_t *hvd__optim_state_target(hvd_optimizer_t *opt, int s, int64_t *lo,
                                      int64_t *hi) {
  if (opt->dist != NULL && opt->dist->zero != NULL)
    return hvd__zero_state_block(opt->dist->zero, s, lo, hi);
  hvd_optimizer_t *c = hvd__optim_core(opt);
  *lo = 0;
  *hi = hvd_tensor_numel(&c->state[s]);
  return &c->state[s];
}

hvd_result_t hvd_optimizer_compression_stats(const hvd_optimizer_t *opt,
                                             int64_t *before, int64_t *after) {
  if (opt == NULL || opt->dist == NULL)
    return hvd__set_error(
        HVD_ERR_INVALID_ARG, "hvd_optimizer_compression_stats: %s",
        opt == NULL ? "opt is NULL" : "not a distributed optimizer");
  const hvd_optimizer_t *core = opt->base;
  int64_t b = 0, a = 0;
  for (int i = 0; i < core->n; i++) {
    int64_t numel = hvd_tensor_numel(&core->params[i].grad);
    b += numel;
    a += hvd__psgd_values(opt->dist->psgd, i, numel);
  }
  if (before != NULL)
    *before = b;
  if (after != NULL)
    *after = a;
  return HVD_SUCCESS;
}

int64_t hvd_optimizer_state_bytes(const hvd_optimizer_t *opt) {
  if (opt == NULL)
    return -1;
  const hvd_optimizer_t *c = hvd__optim_core_const(opt);
  /* the float32 masters; PowerSGD's error feedback and Q */
  int64_t b = hvd__mixed_bytes(c) + hvd__psgd_state_bytes(hvd__optim_psgd(opt));
  if (opt->dist != NULL && opt->dist->zero != NULL)
    return b + hvd__zero_state_bytes(opt->dist->zero);
  for (int s = 0; c->state != NULL && s < c->n * c->ops.nstate; s++)
    b += (int64_t)hvd__tensor_bytes(&c->state[s]);
  return b;
}

static void dist_destroy(hvd_optimizer_t *opt) {
  dist_free(opt->dist);
  hvd_optimizer_destroy(opt->base);
  free(opt);
}

const hvd__optim_class_t hvd__dist_class = {
    dist_step,        dist_zero_grad, dist_grad_ready,
    dist_sparse_grad, dist_set_sync,  dist_destroy,
};
