/*
 * hparams.c - an optimizer's hyperparameters as the ranks compare and
 * share them: what makes two ranks' updates of the same averaged
 * gradient differ. Ranks that disagree on any of them drift apart in
 * silence, which no reduction can see: a learning-rate schedule fed a
 * rank's own count, a configuration read differently, a restore on one
 * rank only, a rank that joined early and missed updates.
 *
 * The list (hvd__hp_list), in a fixed order: first its shape (which
 * optimizer, how many parameters, loss scaling and clipping on or off),
 * then the learning rate and the update count, a built-in's options
 * (not its lr: the optimizer's own is the one a step uses), loss
 * scaling's options and state, clipping's options. Each parameter's
 * learning-rate scale and weight decay (their values in effect: 1 and
 * the options' where none was set) follow outside it.
 *
 * The distributed optimizer's reducing step all-reduces a digest of all
 * of it (hvd__hp_digest, as MAX of (d, -d): equal iff every rank's is)
 * beside the gradients, and only when it differs gathers the values to
 * name the first that differs, the ranks and their values
 * (hvd__hp_mismatch). hvd_broadcast_optimizer_state sends root's values
 * and hvd_state's commits keep them (hvd__hp_save/restore); a checkpoint
 * writes them by label (checkpoint_save.c, checkpoint.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

/* The built-ins by their ops.name; index 0 is any other (custom). */
static const char *const kinds[] = {"custom", "SGD", "Adam", "AdamW", "LAMB"};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

static int kind_of(const hvd_optimizer_t *core) {
  const int builtin = hvd__optim_builtin(core) != NULL;
  for (int k = 1; builtin && core->ops.name != NULL && k < NKINDS; k++)
    if (strcmp(core->ops.name, kinds[k]) == 0)
      return k;
  return 0;
}

#define CONST(l, value)                                                        \
  ((hvd__hp_t){l, 'c', NULL, (double)(value), HVD__HP_ANY})
#define DBL(l, p, r) ((hvd__hp_t){l, 'd', (p), 0, HVD__HP_##r})
#define INT(l, p, r) ((hvd__hp_t){l, 'i', (p), 0, HVD__HP_##r})
#define I64(l, p, r) ((hvd__hp_t){l, 'l', (p), 0, HVD__HP_##r})

/* A built-in's options after its lr, by kind, with their creators'
 * ranges (optimizer.c's hvd__optim_check_adam_like, sgd.c's check). */
static int builtin_list(hvd__optim_builtin_t *b, int kind, hvd__hp_t *hp) {
  int k = 0;
  if (kind == 1) {
    hvd_sgd_options_t *o = &b->o.sgd;
    hp[k++] = DBL("momentum", &o->momentum, NONNEG);
    hp[k++] = DBL("dampening", &o->dampening, FINITE);
    hp[k++] = DBL("weight_decay", &o->weight_decay, NONNEG);
    hp[k++] = INT("nesterov", &o->nesterov, FLAG);
  } else if (kind == 2 || kind == 3) {
    hvd_adam_options_t *o = &b->o.adam;
    hp[k++] = DBL("beta1", &o->beta1, UNIT);
    hp[k++] = DBL("beta2", &o->beta2, UNIT);
    hp[k++] = DBL("eps", &o->eps, POS);
    hp[k++] = DBL("weight_decay", &o->weight_decay, NONNEG);
  } else if (kind == 4) {
    hvd_lamb_options_t *o = &b->o.lamb;
    hp[k++] = DBL("beta1", &o->beta1, UNIT);
    hp[k++] = DBL("beta2", &o->beta2, UNIT);
    hp[k++] = DBL("eps", &o->eps, POS);
    hp[k++] = DBL("weight_decay", &o->weight_decay, NONNEG);
    hp[k++] = INT("bias_correction", &o->bias_correction, FLAG);
    hp[k++] = INT("always_adapt", &o->always_adapt, FLAG);
  }
  return k;
}

int hvd__hp_list(hvd_optimizer_t *core, hvd__hp_t hp[HVD__HP_MAX]) {
  int k = 0;
  const int kind = kind_of(core);
  hp[k++] = CONST("optimizer", kind);
  hp[k++] = CONST("parameter count", core->n);
  hp[k++] = CONST("loss scaling", hvd__mixed_scaling(core));
  hp[k++] = CONST("gradient clipping", core->clip != NULL);
  /* HVD__HP_SHAPE fields above: what follows depends on them alone */
  hp[k++] = DBL("lr", &core->lr, NONNEG);
  hp[k++] = I64("update count", &core->steps, NONNEG);
  if (kind != 0)
    k += builtin_list(core->ctx, kind, &hp[k]);
  k += hvd__mixed_hparams(core, &hp[k]);
  k += hvd__clip_hparams(core->clip, &hp[k]);
  return k;
}

int hvd__hp_in_range(hvd__hp_range_t r, double x) {
  switch (r) {
  case HVD__HP_NONNEG:
    return x >= 0 && x < INFINITY;
  case HVD__HP_FINITE:
    return x > -INFINITY && x < INFINITY;
  case HVD__HP_POS:
    return x > 0 && x < INFINITY;
  case HVD__HP_UNIT:
    return x >= 0 && x < 1;
  case HVD__HP_FLAG: /* any int (fits): the options take one; on if not 0 */
    return x == x;
  case HVD__HP_GE1:
    return x >= 1 && x < INFINITY;
  case HVD__HP_BACKOFF:
    return x > 0 && x <= 1;
  case HVD__HP_MAXNORM:
    return x > 0; /* inf: the norm measured only */
  case HVD__HP_NORMTYPE:
    return x == 2 || x == INFINITY;
  default:
    return 1;
  }
}

const char *hvd__hp_range_words(hvd__hp_range_t r) {
  static const char *const words[] = {
      "(any)",  "[0, inf)", "(-inf, inf)", "(0, inf)", "[0, 1)",
      "{0, 1}", "[1, inf)", "(0, 1]",      "(0, inf]", "{2, inf}"};
  return (unsigned)r < sizeof words / sizeof words[0] ? words[r] : "(any)";
}

double hvd__hp_get(const hvd__hp_t *h) {
  switch (h->type) {
  case 'd':
    return *(const double *)h->at;
  case 'i':
    return *(const int *)h->at;
  case 'l':
    return (double)*(const int64_t *)h->at;
  default:
    return h->v;
  }
}

void hvd__hp_set(const hvd__hp_t *h, double v) {
  if (h->type == 'd')
    *(double *)h->at = v;
  else if (h->type == 'i')
    *(int *)h->at = (int)v;
  else if (h->type == 'l')
    *(int64_t *)h->at = (int64_t)v;
}

/* Parameter i's learning-rate scale and weight decay in effect: the
 * public getters' (1 and the options' decay where none was set; NAN for
 * a custom optimizer, alike on every rank). */
static void param_in_effect(const hvd_optimizer_t *core, int i,
                            double *lr_scale, double *wd) {
  *lr_scale = hvd_optimizer_param_lr_scale(core, i);
  *wd = hvd_optimizer_param_weight_decay(core, i);
}

void hvd__hp_param_raw(const hvd_optimizer_t *core, int i, double *lr_scale,
                       double *wd) {
  const hvd__optim_builtin_t *b = hvd__optim_builtin(core);
  *lr_scale = *wd = NAN;
  if (b == NULL)
    return;
  if (b->lrs != NULL)
    *lr_scale = b->lrs[i];
  if (b->wd != NULL)
    *wd = b->wd[i];
}

hvd_result_t hvd__hp_param_take(hvd_optimizer_t *core, int i,
                                const double v[2]) {
  double mine[2];
  hvd_result_t rc = HVD_SUCCESS;
  hvd__hp_param_raw(core, i, &mine[0], &mine[1]);
  if (v[0] == v[0] || mine[0] == mine[0])
    rc = hvd_optimizer_set_param_lr_scale(core, i, v[0]);
  if (rc == HVD_SUCCESS && (v[1] == v[1] || mine[1] == mine[1]))
    rc = hvd_optimizer_set_param_weight_decay(core, i, v[1]);
  return rc;
}

void hvd__hp_save(hvd_optimizer_t *core, double *v) {
  hvd__hp_t hp[HVD__HP_MAX];
  const int n = hvd__hp_list(core, hp);
  for (int k = 0; k < HVD__HP_MAX; k++)
    v[k] = k < n ? hvd__hp_get(&hp[k]) : 0;
  for (int i = 0; i < core->n; i++)
    hvd__hp_param_raw(core, i, &v[HVD__HP_MAX + 2 * i],
                      &v[HVD__HP_MAX + 2 * i + 1]);
}

hvd_result_t hvd__hp_restore(hvd_optimizer_t *core, const double *v) {
  hvd__hp_t hp[HVD__HP_MAX];
  const int n = hvd__hp_list(core, hp);
  hvd_result_t rc = HVD_SUCCESS;
  for (int k = HVD__HP_SHAPE; k < n; k++)
    hvd__hp_set(&hp[k], v[k]);
  for (int i = 0; i < core->n && rc == HVD_SUCCESS; i++)
    rc = hvd__hp_param_take(core, i, &v[HVD__HP_MAX + 2 * i]);
  return rc;
}

int64_t hvd__hp_digest(hvd_optimizer_t *core) {
  hvd__hp_t hp[HVD__HP_MAX];
  const int n = hvd__hp_list(core, hp);
  hvd__sum_t s;
  hvd__sum_init(&s);
  for (int k = 0; k < n; k++) {
    double v = hvd__hp_get(&hp[k]);
    hvd__sum_add(&s, &v, sizeof v);
  }
  for (int i = 0; i < core->n; i++) {
    double v[2];
    param_in_effect(core, i, &v[0], &v[1]);
    hvd__sum_add(&s, v, sizeof v);
  }
  return (int64_t)(hvd__sum_end(&s) >> 2); /* in [0, 2^62): -d fits */
}

/* ---- the message of a difference ----------------------------------------
 */

/* v in words for field label: an optimizer's name, on or off, an integer,
 * or the shortest decimal that reads back as v. */
static void words(const char *label, double v, char *out, size_t cap) {
  if (strcmp(label, "optimizer") == 0 && v >= 0 && v < NKINDS)
    snprintf(out, cap, "%s", kinds[(int)v]);
  else if (strcmp(label, "loss scaling") == 0 ||
           strcmp(label, "gradient clipping") == 0)
    snprintf(out, cap, "%s", v != 0 ? "on" : "off");
  else if (v == v && fabs(v) < 9e15 && v == (double)(int64_t)v)
    snprintf(out, cap, "%lld", (long long)v);
  else
    for (int digits = 15; digits <= 17; digits++) {
      snprintf(out, cap, "%.*g", digits, v);
      if (strtod(out, NULL) == v)
        break;
    }
}

static int same(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Whether column c of rows (each `width` doubles, the first the world
 * rank) differs from the first row's anywhere; if so, msg says so:
 * "<what>: rank R V" for the first row, then the ranks that differ and
 * their values (in label's words). */
static int column_differs(const double *rows, int nrows, int width, int c,
                          const char *what, const char *label, char *msg,
                          size_t cap) {
  int differs = 0;
  for (int r = 1; r < nrows && !differs; r++)
    differs = !same(rows[r * width + c], rows[c]);
  if (!differs)
    return 0;
  char head[HVD__ERRMSG_MAX], v[64];
  hvd__ranks_t l;
  hvd__ranks_begin(&l);
  words(label, rows[c], v, sizeof v);
  snprintf(head, sizeof head, "%s: rank %d %s", what, (int)rows[0], v);
  for (int r = 1; r < nrows; r++)
    if (!same(rows[r * width + c], rows[c])) {
      words(label, rows[r * width + c], v, sizeof v);
      hvd__ranks_add(&l, (int)rows[r * width], v);
    }
  hvd__ranks_write(&l, head, msg, cap);
  return 1;
}

/* Every member's row (its world rank, then m values) gathered within ps
 * (NULL: the collectives' current set) into *rows (malloc'd), *nrows of
 * them: the members that take part, in rank order. An allreduce, not an
 * allgather, so that it works while some rank has joined (hvd_join,
 * which refuses allgathers): each rank puts its row's bits in its own
 * place of a matrix of INT64_MIN, MAX's identity, which is also what a
 * joined rank contributes; a place still INT64_MIN in its first column
 * (a rank's number is never -0.0's bits) is a joined rank's. */
static hvd_result_t gather_rows(const hvd_process_set_t *ps, const char *name,
                                const double *mine, int m, double **rows,
                                int *nrows) {
  const int size = ps != NULL ? hvd_process_set_size(ps) : hvd__coll_size();
  const int me = ps != NULL ? hvd_process_set_rank(ps) : hvd__coll_rank();
  const size_t w = (size_t)m + 1;
  int64_t *all = malloc((size_t)size * w * sizeof *all);
  double *out = malloc((size_t)size * w * sizeof *out);
  *rows = out;
  *nrows = 0;
  if (all == NULL || out == NULL) {
    free(all);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", name);
  }
  for (size_t k = 0; k < (size_t)size * w; k++)
    all[k] = INT64_MIN;
  const double rank = hvd_rank();
  memcpy(&all[(size_t)me * w], &rank, sizeof rank);
  memcpy(&all[(size_t)me * w + 1], mine, (size_t)m * sizeof *mine);
  int64_t dims[2] = {size, (int64_t)w};
  hvd_tensor_t t = hvd_tensor_make(all, HVD_INT64, 2, dims);
  hvd_result_t rc = ps != NULL
                        ? hvd_ps_allreduce(ps, name, &t, &t, HVD_MAX, 1, 1)
                        : hvd_allreduce(name, &t, &t, HVD_MAX, 1, 1);
  for (int r = 0; rc == HVD_SUCCESS && r < size; r++)
    if (all[(size_t)r * w] != INT64_MIN)
      memcpy(&out[(size_t)(*nrows)++ * w], &all[(size_t)r * w],
             w * sizeof *out);
  free(all);
  return rc;
}

/* The first hyperparameter of hp[n] that differs within ps into msg;
 * *found 0 when none does. The shape's columns come first, alike in
 * every rank's list; the labels of the rest are this rank's, which are
 * everyone's once the shapes agree. */
static hvd_result_t compare_list(const hvd_process_set_t *ps, const char *name,
                                 const hvd__hp_t *hp, int n, char *msg,
                                 size_t cap, int *found) {
  double v[HVD__HP_MAX] = {0}, *rows;
  int nrows;
  for (int k = 0; k < n; k++)
    v[k] = hvd__hp_get(&hp[k]);
  hvd_result_t rc = gather_rows(ps, name, v, HVD__HP_MAX, &rows, &nrows);
  *found = 0;
  for (int k = 0; rc == HVD_SUCCESS && k < n && !*found; k++)
    *found = column_differs(rows, nrows, HVD__HP_MAX + 1, k + 1, hp[k].label,
                            hp[k].label, msg, cap);
  free(rows);
  return rc;
}

/* The first parameter whose learning-rate scale or weight decay differs
 * within ps into msg; *found 0 when none does. */
static hvd_result_t compare_params(hvd_optimizer_t *core,
                                   const hvd_process_set_t *ps,
                                   const char *name, char *msg, size_t cap,
                                   int *found) {
  const int m = 2 * core->n;
  double *v = malloc((size_t)(m > 0 ? m : 1) * sizeof *v), *rows;
  int nrows;
  if (v == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", name);
  for (int i = 0; i < core->n; i++)
    param_in_effect(core, i, &v[2 * i], &v[2 * i + 1]);
  hvd_result_t rc = gather_rows(ps, name, v, m, &rows, &nrows);
  free(v);
  *found = 0;
  for (int c = 1; rc == HVD_SUCCESS && c <= m && !*found; c++) {
    char what[HVD__ERRMSG_MAX];
    snprintf(what, sizeof what, "%s of parameter '%s'",
             c % 2 == 1 ? "the learning-rate scale" : "the weight decay",
             core->params[(c - 1) / 2].name);
    *found = column_differs(rows, nrows, m + 1, c, what, "", msg, cap);
  }
  free(rows);
  return rc;
}

hvd_result_t hvd__hp_mismatch(hvd_optimizer_t *core,
                              const hvd_process_set_t *ps, const char *name) {
  char what[HVD__ERRMSG_MAX] = "their digests", gname[256];
  hvd__hp_t hp[HVD__HP_MAX];
  const int n = hvd__hp_list(core, hp);
  int found = 0;
  snprintf(gname, sizeof gname, "%s.values", name);
  hvd_result_t rc = compare_list(ps, gname, hp, n, what, sizeof what, &found);
  if (rc == HVD_SUCCESS && !found) { /* same shape, so the same n */
    snprintf(gname, sizeof gname, "%s.params", name);
    rc = compare_params(core, ps, gname, what, sizeof what, &found);
  }
  if (rc != HVD_SUCCESS)
    return rc;
  return hvd__set_error(
      HVD_ERR_MISMATCH,
      "hvd_optimizer_step: the ranks' optimizers differ in %s; nothing was "
      "updated (each rank must set the same; hvd_broadcast_optimizer_state "
      "gives every rank root's, the update count included)",
      what);
}
