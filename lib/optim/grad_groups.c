/*
 * grad_groups.c - the distributed optimizer's explicit gradient groups
 * (hvd_distributed_options_t's num_groups and groups; Horovod's
 * DistributedOptimizer(groups=...)): which parameters form a group, and
 * how many of a group's gradients are ready this step. distributed.c
 * submits a group's gradients as one grouped allreduce once every one is
 * ready (or at the step), so that they are negotiated and fused as one.
 */
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "optim/optimizer.h"

struct hvd__ggroups {
  int n, ng;
  int *of;    /* n: parameter i's group, -1 none */
  int *first; /* ng + 1: group k's members are idx[first[k] .. first[k+1]) */
  int *idx;   /* the members, group by group, in parameter order */
  int *ready; /* ng: members ready this step */
  /* a group's submission: its names, tensors and requests */
  const char **names;
  hvd_tensor_t *t;
  hvd_request_t **reqs;
};

void hvd__ggroups_free(hvd__ggroups_t *g) {
  if (g == NULL)
    return;
  free(g->of);
  free(g->first);
  free(g->idx);
  free(g->ready);
  free(g->names);
  free(g->t);
  free(g->reqs);
  free(g);
}

/* What a group cannot go with, or NULL. */
static const char *conflict(const hvd_distributed_options_t *o) {
  return o->shard_optimizer_state ? "shard_optimizer_state (ZeRO-1 "
                                    "reduce-scatters each gradient)"
         : o->compression == HVD_COMPRESS_POWERSGD
             ? "compression powersgd (its own two rounds)"
         : o->op == HVD_ADASUM ? "op adasum (whole gradients, one by one)"
                               : NULL;
}

static hvd_result_t check(const char *fn, const hvd_distributed_options_t *o,
                          const hvd_optimizer_t *base) {
  if (o->num_groups < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: num_groups %d is below 0",
                          fn, o->num_groups);
  if (o->num_groups > 0 && o->groups != NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: num_groups and groups are both set; set one",
                          fn);
  if (o->num_groups == 0 && o->groups == NULL)
    return HVD_SUCCESS; /* none asked for */
  for (int i = 0; o->groups != NULL && i < base->n; i++)
    if (o->groups[i] < -1)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: groups[%d] (parameter '%s') is %d; a group "
                            "is 0 or more, or -1 for none",
                            fn, i, base->params[i].name, o->groups[i]);
  const char *no = conflict(o);
  if (no != NULL)
    return hvd__set_error(HVD_ERR_UNSUPPORTED, "%s: groups: not with %s", fn,
                          no);
  for (int i = 0; o->compression != HVD_COMPRESS_NONE && i < base->n; i++) {
    hvd_dtype_t dt = base->params[i].grad.dtype;
    if (dt != HVD_FLOAT32 && !o->reduce_fp32)
      return hvd__set_error(HVD_ERR_UNSUPPORTED,
                            "%s: groups with compression need float32 "
                            "gradients (set reduce_fp32); parameter '%s' has "
                            "%s",
                            fn, base->params[i].name, hvd_dtype_name(dt));
  }
  return HVD_SUCCESS;
}

/* of[i] from the options: num_groups splits the parameters in order into
 * that many runs (as Horovod's split_list: the first n % k one longer),
 * at most one per parameter; groups' ids are numbered in order of first
 * appearance. Returns the number of groups. */
static int assign(const hvd_distributed_options_t *o, int n, int *of) {
  if (o->num_groups > 0) {
    int k = o->num_groups < n ? o->num_groups : n;
    for (int g = 0, i = 0; g < k; g++)
      for (int m = n / k + (g < n % k); m > 0; m--)
        of[i++] = g;
    return k;
  }
  int ng = 0;
  for (int i = 0; i < n; i++) {
    of[i] = -1;
    if (o->groups[i] < 0)
      continue;
    for (int j = 0; j < i && of[i] < 0; j++)
      if (o->groups[j] == o->groups[i])
        of[i] = of[j];
    if (of[i] < 0)
      of[i] = ng++;
  }
  return ng;
}

hvd_result_t hvd__ggroups_create(const char *fn,
                                 const hvd_distributed_options_t *o,
                                 const hvd_optimizer_t *base,
                                 hvd__ggroups_t **out) {
  *out = NULL;
  hvd_result_t rc = check(fn, o, base);
  int n = base->n;
  if (rc != HVD_SUCCESS || (o->num_groups == 0 && o->groups == NULL) || n == 0)
    return rc;
  hvd__ggroups_t *g = calloc(1, sizeof *g);
  size_t sz = (size_t)n;
  if (g == NULL || !(g->of = malloc(sz * sizeof *g->of)) ||
      !(g->first = calloc(sz + 1, sizeof *g->first)) ||
      !(g->idx = malloc(sz * sizeof *g->idx)) ||
      !(g->ready = calloc(sz, sizeof *g->ready)) ||
      !(g->names = malloc(sz * sizeof *g->names)) ||
      !(g->t = malloc(sz * sizeof *g->t)) ||
      !(g->reqs = malloc(sz * sizeof *g->reqs))) {
    hvd__ggroups_free(g);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: groups: out of memory", fn);
  }
  g->n = n;
  g->ng = assign(o, n, g->of);
  for (int i = 0; i < n; i++) /* counts, then starts */
    if (g->of[i] >= 0)
      g->first[g->of[i] + 1]++;
  for (int k = 0; k < g->ng; k++)
    g->first[k + 1] += g->first[k];
  for (int i = 0, *at = g->ready; i < n; i++) /* ready[] as cursors */
    if (g->of[i] >= 0)
      g->idx[g->first[g->of[i]] + at[g->of[i]]++] = i;
  hvd__ggroups_reset(g);
  *out = g;
  return HVD_SUCCESS;
}

int hvd__ggroups_of(const hvd__ggroups_t *g, int i) {
  return g != NULL ? g->of[i] : -1;
}

int hvd__ggroups_ready(hvd__ggroups_t *g, int k) {
  return ++g->ready[k] == g->first[k + 1] - g->first[k];
}

void hvd__ggroups_reset(hvd__ggroups_t *g) {
  if (g != NULL)
    memset(g->ready, 0, (size_t)g->n * sizeof *g->ready);
}

int hvd__ggroups_members(const hvd__ggroups_t *g, int k, const int **idx) {
  *idx = &g->idx[g->first[k]];
  return g->first[k + 1] - g->first[k];
}

void hvd__ggroups_scratch(hvd__ggroups_t *g, const char ***names,
                          hvd_tensor_t **t, hvd_request_t ***reqs) {
  *names = g->names;
  *t = g->t;
  *reqs = g->reqs;
}
