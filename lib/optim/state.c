/*
 * state.c - committed training state for elastic jobs (Horovod Elastic's
 * state.commit() / restore()), include/hvd.h "Elastic training".
 *
 * A state is one model's parameters, their optimizer (may be NULL) and
 * named int64 progress counters (epoch, step, samples of the epoch...).
 *
 *   commit:  a copy of all of it in this process's memory (every rank: the
 *            parameters and the optimizer's full state are the same on
 *            every rank; a sharded optimizer's copy is this rank's blocks
 *            of the state and of mixed precision's masters, taken with no
 *            collective and no full state; PowerSGD's error feedback is
 *            each rank's own; then one small agreement, so that every
 *            rank keeps the commit or none does), and
 *            every save_every-th commit the same as a checkpoint file
 *            (hvd__checkpoint_save_ex: rank 0 writes a temporary file,
 *            fsyncs and renames it over path, so a failure during the save
 *            leaves the previous file whole), its counters section filled.
 *   restore: one small agreement on the arguments first (a rank with a
 *            NULL one takes part); then the newest commit of this process
 *            if it made one (its outcome agreed: every rank restores it
 *            or fails), else the file (every rank learns from rank 0
 *            whether it is there; the load agrees each step), else
 *            nothing (*restored 0: a fresh start).
 *
 * A job that hvdrun relaunched after a failure (--max-restarts) starts in
 * new processes: only the file survives. HVD_ELASTIC_RESTARTS and
 * HVD_ELASTIC_PREVIOUS_SIZE, set by hvdrun, tell the program which launch
 * it is.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/device.h"
#include "optim/optimizer.h"

#define MAX_COUNTERS 16

/* One tensor's host copy: cap bytes allocated, used at the last commit
 * (a restore puts back exactly that many: the program may have reshaped
 * its parameters since). */
typedef struct copy_buf {
  void *p;
  size_t cap, used;
} copy_buf_t;

struct hvd_state {
  char *path; /* NULL: memory only */
  int every;
  hvd_param_t *params;
  int n;
  hvd_optimizer_t *opt;
  const char *names[MAX_COUNTERS];
  char *owned[MAX_COUNTERS];
  int64_t *live[MAX_COUNTERS];
  int nc;
  int64_t commits;
  /* the last commit (have: one was made in this process) */
  int have;
  copy_buf_t *values;  /* n host copies */
  copy_buf_t *states;  /* n * nstate host copies (sharded: of the blocks) */
  copy_buf_t *masters; /* sharded and mixed: n host copies of master blocks */
  double lr;
  int64_t steps;
  double *hp; /* the optimizer's hyperparameters (hvd__hp_save) */
  int64_t saved[MAX_COUNTERS];
  hvd__psgd_copy_t *psgd; /* PowerSGD's state, this rank's own, or NULL */
  int background;         /* file commits written in the background */
  hvd_checkpoint_request_t *pending; /* the one not waited for, or NULL */
};

static const char create_fn[] = "hvd_state_create";
static const char commit_fn[] = "hvd_state_commit";
static const char restore_fn[] = "hvd_state_restore";

static int env_int(const char *name) {
  const char *v = getenv(name);
  char *end;
  if (v == NULL || *v == '\0')
    return 0;
  errno = 0;
  long x = strtol(v, &end, 10);
  return errno == 0 && *end == '\0' && x >= 0 && x < 1 << 30 ? (int)x : 0;
}

int hvd_elastic_restarts(void) { return env_int("HVD_ELASTIC_RESTARTS"); }

int hvd_elastic_previous_size(void) {
  return env_int("HVD_ELASTIC_PREVIOUS_SIZE");
}

hvd_result_t hvd_state_create(const char *path, int save_every,
                              hvd_state_t **out) {
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", create_fn);
  *out = NULL;
  if (save_every < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: save_every %d is below 1",
                          create_fn, save_every);
  if (path != NULL && path[0] == '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: path is empty", create_fn);
  hvd_state_t *st = calloc(1, sizeof *st);
  if (st == NULL || (path != NULL && (st->path = strdup(path)) == NULL)) {
    free(st);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", create_fn);
  }
  st->every = save_every;
  *out = st;
  return HVD_SUCCESS;
}

hvd_result_t hvd_state_add_params(hvd_state_t *st, hvd_param_t *params, int n,
                                  hvd_optimizer_t *opt) {
  static const char fn[] = "hvd_state_add_params";
  if (st == NULL || (params == NULL && n > 0) || n < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %s", fn,
                          st == NULL ? "state is NULL"
                          : n < 0    ? "n is negative"
                                     : "params is NULL");
  if (st->params != NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: the state has its parameters already (one "
                          "model per state)",
                          fn);
  if (opt != NULL && hvd__optim_core_const(opt)->n != n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: the optimizer has %d parameters but n is %d", fn,
                          hvd__optim_core_const(opt)->n, n);
  st->params = params;
  st->n = n;
  st->opt = opt;
  return HVD_SUCCESS;
}

hvd_result_t hvd_state_add_counter(hvd_state_t *st, const char *name,
                                   int64_t *value) {
  static const char fn[] = "hvd_state_add_counter";
  if (st == NULL || name == NULL || name[0] == '\0' || value == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %s", fn,
                          st == NULL      ? "state is NULL"
                          : value == NULL ? "value is NULL"
                                          : "the name is empty or NULL");
  /* a file holds hvd's own counters beside the program's (the loss
   * scaler's "hvd.loss_scale"): one of the program's of that name would
   * be read back as hvd's, or hvd's as the program's */
  if (strncmp(name, "hvd.", 4) == 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: counter '%s': names starting with 'hvd.' are "
                          "hvd's own (the loss scaler's counters)",
                          fn, name);
  for (int k = 0; k < st->nc; k++)
    if (strcmp(st->names[k], name) == 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: counter '%s' is there already", fn, name);
  if (st->nc == MAX_COUNTERS)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: '%s': at most %d counters",
                          fn, name, MAX_COUNTERS);
  if ((st->owned[st->nc] = strdup(name)) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  st->names[st->nc] = st->owned[st->nc];
  st->live[st->nc++] = value;
  return HVD_SUCCESS;
}

int64_t hvd_state_commits(const hvd_state_t *st) {
  return st != NULL ? st->commits : -1;
}

/* ---- the in-memory copy ------------------------------------------------- */

/* What copy_tensor does: into the copy (a commit), back out of it (a
 * restore), or only check that it can go back (before a restore). */
enum { TO_COPY, TO_LIVE, CHECK };

/* Tensor t of parameter `name` into its copy b (grown as needed), or
 * back out of it, which holds as many bytes as t only while t has the
 * size it had at the commit. */
static hvd_result_t copy_tensor(const char *who, const char *name,
                                hvd_tensor_t *t, copy_buf_t *b, int mode) {
  size_t bytes = hvd__tensor_bytes(t);
  if (mode != TO_COPY && bytes != b->used)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: parameter '%s' has %zu bytes but %zu at the "
                          "commit",
                          who, name, bytes, b->used);
  if (mode == TO_COPY && bytes > b->cap) {
    void *p = realloc(b->p, bytes);
    if (p == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY,
                            "%s: out of memory for the committed copy", who);
    b->p = p;
    b->cap = bytes;
  }
  if (mode == TO_COPY && bytes == 0)
    b->used = 0;
  if (mode == CHECK || bytes == 0)
    return HVD_SUCCESS;
  hvd_result_t rc = HVD_SUCCESS;
  if (t->device != HVD_CPU)
    rc = mode == TO_LIVE ? hvd__odev_write(who, t, 0, b->p, bytes)
                         : hvd__odev_read(who, b->p, t, 0, bytes);
  else if (mode == TO_LIVE)
    memcpy(t->data, b->p, bytes);
  else
    memcpy(b->p, t->data, bytes);
  if (mode == TO_COPY)
    b->used = rc == HVD_SUCCESS ? bytes : 0;
  return rc;
}

/* Frees the copy's buffers (st->values NULL again: none made). */
static void free_copy(hvd_state_t *st) {
  const hvd_optimizer_t *c = st->opt ? hvd__optim_core_const(st->opt) : NULL;
  int ns = c != NULL ? c->ops.nstate : 0;
  for (int i = 0; st->values != NULL && i < st->n; i++)
    free(st->values[i].p);
  for (int s = 0; st->states != NULL && s < st->n * ns; s++)
    free(st->states[s].p);
  for (int i = 0; st->masters != NULL && i < st->n; i++)
    free(st->masters[i].p);
  free(st->values);
  free(st->states);
  free(st->masters);
  free(st->hp);
  st->values = NULL;
  st->states = NULL;
  st->masters = NULL;
  st->hp = NULL;
}

/* The copy's lists, made at the first commit (each tensor's buffer is
 * made, or grown, as a commit copies it: copy_tensor); none when one
 * cannot be made (the next commit tries again). */
static hvd_result_t alloc_copy(hvd_state_t *st) {
  const hvd_optimizer_t *c = st->opt ? hvd__optim_core_const(st->opt) : NULL;
  size_t n = (size_t)st->n, ns = c != NULL ? (size_t)c->ops.nstate : 0;
  if (st->values != NULL)
    return HVD_SUCCESS;
  st->values = calloc(n + 1, sizeof *st->values);
  st->states = calloc(n * ns + 1, sizeof *st->states);
  st->masters = calloc(n + 1, sizeof *st->masters);
  st->hp = calloc(HVD__HP_VALUES(st->n), sizeof *st->hp);
  if (st->values != NULL && st->states != NULL && st->masters != NULL &&
      st->hp != NULL)
    return HVD_SUCCESS;
  free_copy(st);
  return hvd__set_error(HVD_ERR_NO_MEMORY,
                        "%s: out of memory for the committed copy", commit_fn);
}

/* The optimizer's hyperparameters (as a file keeps them, and torch's
 * state_dict its param_groups): the list past its shape, each
 * parameter's settings, then lr and the update count exactly. */
static hvd_result_t transfer_hparams(hvd_state_t *st, hvd_optimizer_t *c,
                                     int to_live) {
  if (!to_live) {
    hvd__hp_save(c, st->hp);
    st->lr = c->lr, st->steps = c->steps;
    return HVD_SUCCESS;
  }
  hvd_result_t rc = hvd__hp_restore(c, st->hp);
  c->lr = st->lr, c->steps = st->steps; /* exactly, not through doubles */
  hvd__optim_forget_step(c); /* no step of the commit's state has run */
  return rc;
}

/* The scalars: the hyperparameters (lr and the update count among them),
 * PowerSGD's state, the counters. */
static hvd_result_t transfer_scalars(hvd_state_t *st, hvd_optimizer_t *c,
                                     int to_live, const char *who) {
  hvd_result_t rc = HVD_SUCCESS;
  if (c != NULL) {
    rc = transfer_hparams(st, c, to_live);
    if (rc == HVD_SUCCESS)
      rc = hvd__psgd_keep(hvd__optim_psgd(st->opt), who, &st->psgd, to_live);
  }
  for (int k = 0; k < st->nc && rc == HVD_SUCCESS; k++)
    if (to_live)
      *st->live[k] = st->saved[k];
    else
      st->saved[k] = *st->live[k];
  return rc;
}

/* The scalars after the tensors: none to check (mode CHECK). */
static hvd_result_t scalars_after(hvd_state_t *st, hvd_optimizer_t *c, int mode,
                                  const char *who) {
  return mode == CHECK ? HVD_SUCCESS
                       : transfer_scalars(st, c, mode == TO_LIVE, who);
}

/* transfer() for a sharded optimizer: the values as they are (the same
 * on every rank), this rank's blocks of the state and of the masters:
 * no collective, no full state (the restore of a commit in memory is in
 * the same process, with the same optimizer and blocks). */
static hvd_result_t transfer_blocks(hvd_state_t *st, int mode,
                                    const char *who) {
  hvd_optimizer_t *c = hvd__optim_core(st->opt);
  int ns = c->ops.nstate;
  int64_t lo, hi;
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < st->n && rc == HVD_SUCCESS; i++) {
    const char *name = st->params[i].name;
    hvd_tensor_t *m = c->mixed != NULL ? hvd__mixed_master(c, i) : NULL;
    rc = copy_tensor(who, name, &st->params[i].value, &st->values[i], mode);
    if (m != NULL && rc == HVD_SUCCESS)
      rc = copy_tensor(who, name, m, &st->masters[i], mode);
    for (int k = 0; k < ns && rc == HVD_SUCCESS; k++)
      rc = copy_tensor(who, name,
                       hvd__optim_state_target(st->opt, i * ns + k, &lo, &hi),
                       &st->states[i * ns + k], mode);
  }
  return rc == HVD_SUCCESS ? scalars_after(st, c, mode, who) : rc;
}

/* The model, optimizer and counters into the copy (TO_COPY), or the copy
 * back into them (TO_LIVE), or only whether they can go back (CHECK).
 * The optimizer's full state is there: a sharded optimizer's blocks are
 * copied instead (transfer_blocks). */
static hvd_result_t transfer(hvd_state_t *st, int mode, const char *who) {
  if (st->opt != NULL && hvd__optim_sharded(st->opt))
    return transfer_blocks(st, mode, who);
  hvd_optimizer_t *c = st->opt ? hvd__optim_core(st->opt) : NULL;
  int ns = c != NULL ? c->ops.nstate : 0;
  hvd_param_t *views = NULL; /* mixed precision: the masters */
  hvd_result_t rc = hvd__mixed_ckpt_params(c, st->params, st->n, &views);
  hvd_param_t *ps = views != NULL ? views : st->params;
  for (int i = 0; i < st->n && rc == HVD_SUCCESS; i++) {
    rc = copy_tensor(who, ps[i].name, &ps[i].value, &st->values[i], mode);
    for (int k = 0; k < ns && rc == HVD_SUCCESS; k++)
      rc = copy_tensor(who, ps[i].name, &c->state[i * ns + k],
                       &st->states[i * ns + k], mode);
  }
  free(views);
  if (c != NULL && rc == HVD_SUCCESS && mode == TO_LIVE && c->mixed != NULL)
    rc = hvd__mixed_values_from_masters(c);
  return rc == HVD_SUCCESS ? scalars_after(st, c, mode, who) : rc;
}

/* ---- commit and restore ---------------------------------------------------
 */

static hvd__counters_t counters(hvd_state_t *st) {
  return (hvd__counters_t){st->nc, st->names, NULL};
}

hvd_result_t hvd_state_set_background(hvd_state_t *st, int on) {
  if (st == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_state_set_background: state is NULL");
  st->background = on != 0;
  return HVD_SUCCESS;
}

hvd_result_t hvd_state_wait(hvd_state_t *st) {
  if (st == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "hvd_state_wait: state is NULL");
  hvd_checkpoint_request_t *q = st->pending;
  st->pending = NULL;
  return hvd_checkpoint_wait(q); /* NULL: HVD_SUCCESS */
}

/* A commit's file: written now, or in the background after the previous
 * background write was waited for (whose failure, if any, is the result:
 * the new write starts all the same). */
static hvd_result_t commit_file(hvd_state_t *st) {
  hvd__counters_t ctr = counters(st);
  ctr.values = st->saved;
  hvd_result_t before = hvd_state_wait(st);
  char msg[HVD__ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", hvd_last_error());
  hvd_result_t rc = st->background
                        ? hvd__checkpoint_save_async_ex(
                              commit_fn, st->path, st->params, st->n, st->opt,
                              st->commits, &ctr, &st->pending)
                        : hvd__checkpoint_save_ex(st->path, st->params, st->n,
                                                  st->opt, st->commits, &ctr);
  return before != HVD_SUCCESS ? hvd__set_error_msg(before, msg) : rc;
}

/* hvd_state_commit and _restore run on the optimizer's process set (the
 * world without one): its first rank writes and reads the file. */
static hvd_result_t commit(hvd_state_t *st) {
  if (st == NULL) { /* in the world's agreement still: the others wait */
    hvd_result_t rc =
        hvd__set_error(HVD_ERR_INVALID_ARG, "%s: state is NULL", commit_fn);
    return hvd_is_initialized() ? hvd__optim_agree("hvd.state.commit", rc) : rc;
  }
  if (!hvd_is_initialized())
    return hvd__not_initialized(commit_fn);
  hvd_result_t rc = alloc_copy(st);
  if (rc == HVD_SUCCESS)
    rc = transfer(st, TO_COPY, commit_fn);
  /* every rank counts the commit, or none: a copy made on some ranks
   * only would be restored there alone, in memory as from a file */
  rc = hvd__optim_agree("hvd.state.commit", rc);
  if (rc != HVD_SUCCESS) {
    st->have = 0; /* the copy may be torn: a restore reads the file */
    return rc;
  }
  st->have = 1;
  st->commits++;
  if (st->path == NULL || st->commits % st->every != 0)
    return HVD_SUCCESS;
  return commit_file(st);
}

/* This rank's checks before a restore: its arguments, and that the
 * parameters have the sizes of the commit it would put back (so that a
 * parameter reshaped since on one rank changes nothing on any rank). */
static hvd_result_t restore_check(hvd_state_t *st, int *restored) {
  if (st == NULL || restored == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %s is NULL", restore_fn,
                          st == NULL ? "state" : "restored");
  *restored = 0;
  return st->have ? transfer(st, CHECK, restore_fn) : HVD_SUCCESS;
}

static hvd_result_t restore(hvd_state_t *st, int *restored) {
  hvd_result_t rc = restore_check(st, restored);
  if (!hvd_is_initialized())
    return rc != HVD_SUCCESS ? rc : hvd__not_initialized(restore_fn);
  /* agreed before any other collective, a rank with a NULL argument
   * included (on the world, which a NULL state names): the others would
   * wait for it in the file's or the background write's collectives */
  rc = hvd__optim_agree("hvd.state.restore.check", rc);
  if (rc != HVD_SUCCESS)
    return rc;
  rc = hvd_state_wait(st); /* the file whole, or its failure */
  if (rc != HVD_SUCCESS)
    return rc;
  /* a commit's copy back agreed, as a file's load is: one that fails on
   * one rank (a device tensor's copy) fails on every rank */
  if (st->have) {
    rc = hvd__optim_agree("hvd.state.restore",
                          transfer(st, TO_LIVE, restore_fn));
    *restored = rc == HVD_SUCCESS;
    return rc;
  }
  if (st->path == NULL)
    return HVD_SUCCESS;
  /* whether rank 0 sees the file, for every rank */
  struct stat sb;
  int64_t there = hvd__coll_rank() == 0 ? stat(st->path, &sb) == 0 : 0;
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&there, HVD_INT64, 1, &one);
  rc = hvd_broadcast("hvd.state.exists", &t, 0);
  if (rc != HVD_SUCCESS || !there)
    return rc;
  int64_t values[MAX_COUNTERS], commits = 0;
  hvd__counters_t ctr = counters(st);
  ctr.values = values;
  rc = hvd__checkpoint_load_ex(st->path, st->params, st->n, st->opt, &commits,
                               &ctr);
  if (rc != HVD_SUCCESS)
    return rc;
  for (int k = 0; k < st->nc; k++)
    *st->live[k] = values[k];
  st->commits = commits;
  *restored = 1;
  return HVD_SUCCESS;
}

hvd_result_t hvd_state_commit(hvd_state_t *st) {
  hvd_result_t rc;
  HVD__ON_SET(st != NULL ? hvd__optim_set(st->opt) : NULL, rc, commit(st));
  return rc;
}

hvd_result_t hvd_state_restore(hvd_state_t *st, int *restored) {
  hvd_result_t rc;
  HVD__ON_SET(st != NULL ? hvd__optim_set(st->opt) : NULL, rc,
              restore(st, restored));
  return rc;
}

void hvd_state_destroy(hvd_state_t *st) {
  if (st == NULL)
    return;
  /* the file finished first; not collective: rank 0 alone knows */
  if (hvd__checkpoint_wait_here(st->pending) != HVD_SUCCESS)
    HVD__LOG(HVD__LOG_WARNING,
             "hvd_state_destroy: the last background file "
             "commit failed: %s",
             hvd_last_error());
  free_copy(st);
  hvd__psgd_copy_free(st->psgd);
  for (int k = 0; k < st->nc; k++)
    free(st->owned[k]);
  free(st->path);
  free(st);
}
