/*
 * broadcast.c - the initial state: parameters and optimizer state from one
 * root to every rank, then verified. Ranks first agree on what they
 * broadcast (count and a hash of names and shapes), so that different
 * models fail loudly instead of stalling; after the broadcasts a 64-bit
 * checksum of every tensor is compared across ranks. Device tensors are
 * broadcast by the engine's device executors like any other; their
 * checksums are computed on the host, after a copy (a chunk at a time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/optimizer.h"

#define BOUNCE ((size_t)4 << 20) /* bytes of a device tensor per copy */

/* *out = hvd__sum64 of t's bytes (at memory speed: FNV-1a's chain was
 * ~2 s a GB); a device tensor's are copied to the host first. On a
 * failure *out is the sum of what was read so far. */
static hvd_result_t checksum(const char *fn, const hvd_tensor_t *t,
                             uint64_t *out) {
  size_t bytes = hvd__tensor_bytes(t);
  hvd_result_t rc = HVD_SUCCESS;
  *out = 0;
  if (t->device == HVD_CPU) {
    *out = hvd__sum64(t->data, bytes);
    return HVD_SUCCESS;
  }
  hvd__sum_t sum;
  hvd__sum_init(&sum);
  size_t cap = bytes < BOUNCE ? bytes : BOUNCE;
  unsigned char *b = malloc(cap ? cap : 1);
  if (b == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: checksum buffer", fn);
  for (size_t at = 0; at < bytes && rc == HVD_SUCCESS; at += cap) {
    size_t k = bytes - at < cap ? bytes - at : cap;
    rc = hvd__odev_read(fn, b, t, at, k);
    if (rc == HVD_SUCCESS)
      hvd__sum_add(&sum, b, k);
  }
  free(b);
  *out = hvd__sum_end(&sum);
  return rc;
}

/* No root (hvd_verify_parameters). */
#define NO_ROOT (-1)

/* The arguments, checked on each rank and agreed (hvd__optim_agree):
 * a rank whose are bad fails every rank alike, named, rather than
 * leaving the others in the first collective. */
static hvd_result_t check_args(const char *fn, const hvd_param_t *params, int n,
                               int root) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n < 0 || (n > 0 && params == NULL))
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: params is NULL or n (%d) is negative", fn, n);
  for (int i = 0; rc == HVD_SUCCESS && i < n; i++) {
    if (params[i].name == NULL || params[i].name[0] == '\0')
      rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: parameter %d has no name",
                          fn, i);
    else /* verify reads every byte of it: a shape that overflows, refused */
      rc = hvd__check_tensor(fn, params[i].name, "", &params[i].value);
  }
  if (rc == HVD_SUCCESS && root != NO_ROOT &&
      (root < 0 || root >= hvd__coll_size()))
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: root %d is out of range for %d ranks", fn, root,
                        hvd__coll_size());
  return hvd__optim_agree("hvd.agree.arguments", rc);
}

/* Every rank's (count, hash of what it holds); differences are
 * HVD_ERR_MISMATCH naming the ranks. */
static hvd_result_t agree(const char *fn, const char *what, const char *how,
                          int64_t count, uint64_t hash) {
  int64_t mine[2] = {count, (int64_t)hash};
  int64_t shape[1] = {2};
  hvd_tensor_t t = hvd_tensor_make(mine, HVD_INT64, 1, shape), all;
  char name[128];
  snprintf(name, sizeof name, "hvd.agree.%s", what);
  hvd_result_t rc = hvd_allgather(name, &t, &all);
  if (rc != HVD_SUCCESS)
    return rc;
  const int64_t *v = all.data;
  const int w0 = hvd__coll_world_rank(0); /* messages name world ranks */
  for (int r = 1; r < hvd__coll_size() && rc == HVD_SUCCESS; r++) {
    if (v[2 * r] != v[0])
      rc = hvd__set_error(HVD_ERR_MISMATCH,
                          "%s: ranks disagree on the %s: rank %d has %lld "
                          "entries, rank %d has %lld",
                          fn, what, w0, (long long)v[0],
                          hvd__coll_world_rank(r), (long long)v[2 * r]);
    else if (v[2 * r + 1] != v[1])
      rc = hvd__set_error(HVD_ERR_MISMATCH,
                          "%s: ranks disagree on the %s: rank %d and rank %d "
                          "differ %s",
                          fn, what, w0, hvd__coll_world_rank(r), how);
  }
  hvd_tensor_free(&all);
  return rc;
}

/* The names, dtypes and shapes of params[0..n) into s. */
static void describe_into(hvd__sum_t *s, const hvd_param_t *params, int n) {
  for (int i = 0; i < n; i++) {
    hvd__sum_add(s, params[i].name, strlen(params[i].name) + 1);
    hvd__sum_add(s, &params[i].value.dtype, sizeof params[i].value.dtype);
    hvd__sum_add(s, &params[i].value.ndim, sizeof params[i].value.ndim);
    hvd__sum_add(s, params[i].value.shape,
                 (size_t)params[i].value.ndim * sizeof(int64_t));
  }
}

static uint64_t describe(const hvd_param_t *params, int n) {
  hvd__sum_t s;
  hvd__sum_init(&s);
  describe_into(&s, params, n);
  return hvd__sum_end(&s);
}

/* Compares a checksum of each of tensors[0..n) across ranks: one MAX
 * allreduce of (c, ~c) gives the largest and (as ~max(~c)) the smallest;
 * where they differ, an allgather of that checksum names the ranks. A rank
 * that cannot read a device tensor still takes part (with a wrong
 * checksum, so that the others report it) and returns its own error. */
static hvd_result_t compare(const char *fn, const char *what,
                            const hvd_tensor_t *const *tensors,
                            const char *const *labels, int n) {
  if (n == 0)
    return HVD_SUCCESS;
  hvd_result_t rc = HVD_SUCCESS, local = HVD_SUCCESS;
  char localmsg[HVD__ERRMSG_MAX] = "";
  int64_t *sums = malloc(3 * (size_t)n * sizeof *sums), *own = sums + 2 * n;
  if (sums == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: checksums", fn);
  for (int i = 0; i < n; i++) {
    uint64_t c;
    hvd_result_t r = checksum(fn, tensors[i], &c);
    if (r != HVD_SUCCESS && local == HVD_SUCCESS) {
      local = r;
      snprintf(localmsg, sizeof localmsg, "%s", hvd_last_error());
    }
    own[i] = (int64_t)c;
    sums[i] = own[i];
    sums[n + i] = ~own[i];
  }
  int64_t shape[1] = {2 * (int64_t)n};
  hvd_tensor_t t = hvd_tensor_make(sums, HVD_INT64, 1, shape);
  char name[128];
  snprintf(name, sizeof name, "hvd.verify.%s", what);
  rc = hvd_allreduce(name, &t, &t, HVD_MAX, 1.0, 1.0);
  int first = -1;
  for (int i = 0; i < n && rc == HVD_SUCCESS && first < 0; i++)
    if (sums[i] != ~sums[n + i])
      first = i;
  if (first >= 0) {
    int64_t one[1] = {1};
    hvd_tensor_t c = hvd_tensor_make(&own[first], HVD_INT64, 1, one), all;
    snprintf(name, sizeof name, "hvd.verify.%s.who", what);
    rc = hvd_allgather(name, &c, &all);
    if (rc == HVD_SUCCESS) {
      const int64_t *v = all.data;
      char ranks[512] = "";
      size_t at = 0;
      for (int r = 1; r < hvd__coll_size() && at < sizeof ranks - 16; r++)
        if (v[r] != v[0])
          at += (size_t)snprintf(ranks + at, sizeof ranks - at, "%s%d",
                                 at ? ", " : "", hvd__coll_world_rank(r));
      hvd_tensor_free(&all);
      rc = hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: %s '%s' is not identical on every rank: "
                          "rank(s) %s differ from rank %d",
                          fn, what, labels[first], ranks,
                          hvd__coll_world_rank(0));
    }
  }
  free(sums);
  return local != HVD_SUCCESS ? hvd__set_error_msg(local, localmsg) : rc;
}

static hvd_result_t verify(const char *fn, const hvd_param_t *params, int n) {
  hvd_result_t rc = agree(fn, "parameter list", "in names, shapes or types", n,
                          describe(params, n));
  if (rc != HVD_SUCCESS)
    return rc;
  const hvd_tensor_t **ts = malloc((size_t)(n + 1) * sizeof *ts);
  const char **labels = malloc((size_t)(n + 1) * sizeof *labels);
  if (ts == NULL || labels == NULL) {
    free(ts);
    free(labels);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: verification", fn);
  }
  for (int i = 0; i < n; i++) {
    ts[i] = &params[i].value;
    labels[i] = params[i].name;
  }
  rc = compare(fn, "parameter", ts, labels, n);
  free(ts);
  free(labels);
  return rc;
}

/* hvd_verify_parameters on the collectives' current set. */
static hvd_result_t verify_parameters(const char *fn, const hvd_param_t *params,
                                      int n) {
  hvd_result_t rc = check_args(fn, params, n, NO_ROOT);
  return rc != HVD_SUCCESS ? rc : verify(fn, params, n);
}

hvd_result_t hvd_verify_parameters(const hvd_param_t *params, int n) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(__func__);
  return verify_parameters(__func__, params, n);
}

hvd_result_t hvd_ps_verify_parameters(const hvd_process_set_t *ps,
                                      const hvd_param_t *params, int n) {
  hvd_result_t rc = hvd__optim_check_set(__func__, ps);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(ps, rc, verify_parameters(__func__, params, n));
  return rc;
}

/* Broadcasts tensors[0..n) named "<prefix><label>" from root, async, then
 * waits for all of them. */
static hvd_result_t broadcast_all(const char *prefix, hvd_tensor_t *const *ts,
                                  const char *const *labels, int n, int root) {
  hvd_result_t rc = HVD_SUCCESS, first = HVD_SUCCESS;
  char firstmsg[HVD__ERRMSG_MAX] = "";
  hvd_request_t **q = calloc((size_t)(n > 0 ? n : 1), sizeof *q);
  if (q == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "broadcast requests");
  for (int i = 0; i < n; i++) {
    char name[1024];
    snprintf(name, sizeof name, "%s%s", prefix, labels[i]);
    rc = hvd_broadcast_async(name, ts[i], root, &q[i]);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(firstmsg, sizeof firstmsg, "%s", hvd_last_error());
    }
  }
  for (int i = 0; i < n; i++) /* wait for everything submitted */
    if (q[i] != NULL && (rc = hvd_wait(q[i])) != HVD_SUCCESS &&
        first == HVD_SUCCESS) {
      first = rc;
      snprintf(firstmsg, sizeof firstmsg, "%s", hvd_last_error());
    }
  free(q);
  return first == HVD_SUCCESS ? HVD_SUCCESS
                              : hvd__set_error_msg(first, firstmsg);
}

/* hvd_broadcast_parameters on the collectives' current set. */
static hvd_result_t broadcast_parameters(const char *fn, hvd_param_t *params,
                                         int n, int root) {
  hvd_result_t rc = check_args(fn, params, n, root);
  if (rc != HVD_SUCCESS)
    return rc;
  rc = agree(fn, "parameter list", "in names, shapes or types", n,
             describe(params, n));
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_tensor_t **ts = malloc((size_t)(n + 1) * sizeof *ts);
  const char **labels = malloc((size_t)(n + 1) * sizeof *labels);
  if (ts == NULL || labels == NULL) {
    free(ts);
    free(labels);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: broadcast", fn);
  }
  for (int i = 0; i < n; i++) {
    ts[i] = &params[i].value;
    labels[i] = params[i].name;
  }
  rc = broadcast_all("hvd.param.", ts, labels, n, root);
  free(ts);
  free(labels);
  if (rc == HVD_SUCCESS)
    rc = verify(fn, params, n);
  /* mixed precision: a master whose value changed follows it (after the
   * last collective, so that a local failure cannot strand the others) */
  return rc == HVD_SUCCESS ? hvd__mixed_refresh(params, n, fn) : rc;
}

hvd_result_t hvd_broadcast_parameters(hvd_param_t *params, int n, int root) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(__func__);
  return broadcast_parameters(__func__, params, n, root);
}

hvd_result_t hvd_ps_broadcast_parameters(const hvd_process_set_t *ps,
                                         hvd_param_t *params, int n, int root) {
  hvd_result_t rc = hvd__optim_check_set(__func__, ps);
  if (rc == HVD_SUCCESS)
    HVD__ON_SET(ps, rc, broadcast_parameters(__func__, params, n, root));
  return rc;
}

/* "<a>.<b>", or NULL when out of memory. */
static char *join(const char *a, const char *b) {
  size_t len = strlen(a) + strlen(b) + 2;
  char *s = malloc(len);
  if (s != NULL)
    snprintf(s, len, "%s.%s", a, b);
  return s;
}

/* What hvd_broadcast_optimizer_state sends, with its labels: the scalars,
 * every state tensor ("<param>.<state>"; none when sharded), and with
 * mixed precision every whole float32 master ("<param>.master", from
 * views). *count: how many; free both arrays and the labels. */
static hvd_result_t state_list(const char *fn, hvd_optimizer_t *c, int sharded,
                               hvd_tensor_t *scalars, hvd_param_t *views,
                               hvd_tensor_t ***ts_out, char ***labels_out,
                               int *count) {
  int ns = sharded ? 0 : c->ops.nstate, cap = 1 + c->n * ns + c->n, k = 0;
  hvd_tensor_t **ts = calloc((size_t)cap, sizeof *ts);
  char **labels = calloc((size_t)cap, sizeof *labels);
  *ts_out = ts;
  *labels_out = labels;
  *count = 0;
  if (ts == NULL || labels == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: broadcast", fn);
  ts[k] = scalars;
  labels[k++] = strdup("scalars");
  for (int i = 0; i < c->n; i++)
    for (int j = 0; j < ns; j++) {
      ts[k] = &c->state[i * c->ops.nstate + j];
      labels[k++] = join(c->params[i].name, c->ops.state_names[j]);
    }
  for (int i = 0; views != NULL && i < c->n; i++)
    if (views[i].value.data != c->params[i].value.data) {
      ts[k] = &views[i].value;
      labels[k++] = join(c->params[i].name, "master");
    }
  *count = k;
  for (int j = 0; j < k; j++)
    if (labels[j] == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: names", fn);
  return HVD_SUCCESS;
}

/* Root's scalars and tensors to every rank, verified by checksums. The
 * scalars (hvd__hp_save's: the hyperparameters, the learning rate and
 * update count among them, and each parameter's settings) travel first;
 * root's are made this rank's (hvd__hp_restore: the shapes of the lists
 * agreed). */
static hvd_result_t send_state(const char *fn, hvd_optimizer_t *opt,
                               hvd_tensor_t **ts, char **labels, int count,
                               const double *scalars, int root) {
  hvd_result_t rc =
      broadcast_all("hvd.opt.", ts, (const char *const *)labels, count, root);
  if (rc == HVD_SUCCESS)
    rc = hvd__optim_agree("hvd.bcast_state.scalars",
                          hvd__hp_restore(hvd__optim_core(opt), scalars));
  if (rc == HVD_SUCCESS) /* root's state: no step of it here yet */
    hvd__optim_forget_step(hvd__optim_core(opt));
  if (rc != HVD_SUCCESS)
    return rc;
  return compare(fn, "optimizer state", (const hvd_tensor_t *const *)ts,
                 (const char *const *)labels, count);
}

/* hvd_broadcast_optimizer_state on the collectives' current set (the
 * optimizer's). */
static hvd_result_t broadcast_optimizer_state(const char *fn,
                                              hvd_optimizer_t *opt, int root) {
  hvd_result_t rc = check_args(fn, NULL, 0, root);
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_optimizer_t *c = hvd__optim_core(opt);
  int ns = c->ops.nstate, total = c->n * ns, count = 0;
  unsigned char sharded = (unsigned char)hvd__optim_sharded(opt);
  hvd__sum_t s;
  hvd__sum_init(&s);
  describe_into(&s, c->params, c->n);
  hvd__sum_add(&s, &sharded, 1);
  hvd__sum_add(&s, c->ops.name ? c->ops.name : "",
               strlen(c->ops.name ? c->ops.name : "") + 1);
  hvd__hp_t hp[HVD__HP_MAX];
  (void)hvd__hp_list(c, hp);
  for (int k = 0; k < HVD__HP_SHAPE; k++) {
    double x = hvd__hp_get(&hp[k]);
    hvd__sum_add(&s, &x, sizeof x);
  }
  for (int k = 0; k < ns; k++)
    hvd__sum_add(&s, c->ops.state_names[k], strlen(c->ops.state_names[k]) + 1);
  rc = agree(fn,
             "optimizer (type, parameters, state, loss scaling "
             "and clipping on or off)",
             "in one of them", total, hvd__sum_end(&s));
  if (rc != HVD_SUCCESS)
    return rc;
  /* A sharded optimizer's state and masters are one set of blocks, each
   * kept by one rank: root's whole is every rank's already, and only the
   * scalars travel (gathering it would unshard every rank). Otherwise,
   * with mixed precision, the whole masters too. */
  hvd_param_t *views = NULL;
  rc = hvd__optim_agree(
      "hvd.bcast_state.masters",
      sharded ? HVD_SUCCESS
              : hvd__mixed_ckpt_params(c, c->params, c->n, &views));
  if (rc != HVD_SUCCESS) {
    free(views);
    return rc;
  }
  int64_t nscalars = (int64_t)HVD__HP_VALUES(c->n);
  double *scalars = calloc((size_t)nscalars, sizeof *scalars);
  if (scalars != NULL)
    hvd__hp_save(c, scalars);
  hvd_tensor_t st = hvd_tensor_make(scalars, HVD_FLOAT64, 1, &nscalars);
  hvd_tensor_t **ts = NULL;
  char **labels = NULL;
  rc = hvd__optim_agree(
      "hvd.bcast_state.pack",
      scalars != NULL
          ? HVD_SUCCESS
          : hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn));
  if (rc == HVD_SUCCESS)
    rc = state_list(fn, c, sharded, &st, views, &ts, &labels, &count);
  if (rc == HVD_SUCCESS)
    rc = send_state(fn, opt, ts, labels, count, scalars, root);
  free(scalars);
  for (int j = 0; labels != NULL && j < count; j++)
    free(labels[j]);
  free(labels);
  free(ts);
  free(views);
  return rc;
}

hvd_result_t hvd_broadcast_optimizer_state(hvd_optimizer_t *opt, int root) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(__func__);
  if (opt == NULL) /* still in the world's agreement, as check_args */
    return hvd__optim_agree(
        "hvd.agree.arguments",
        hvd__set_error(HVD_ERR_INVALID_ARG, "%s: opt is NULL", __func__));
  hvd_result_t rc;
  HVD__ON_SET(opt->ps, rc, broadcast_optimizer_state(__func__, opt, root));
  return rc;
}
