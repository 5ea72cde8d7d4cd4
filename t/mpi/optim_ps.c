/*
 * optim_ps.c - the distributed optimizer on a process set
 * (hvd_distributed_options_t.process_set, Horovod's
 * DistributedOptimizer(process_set=...)), at np 1..4.
 *
 * The job is a model split in two stages, pipeline style: the ranks of
 * one parity hold stage rank % 2 (np 4: {0, 2} and {1, 3}; np 3: {0, 2}
 * and {1}), each stage its own parameters ("s0.w", "s0.b"; stage 1's one
 * element longer) and one process set (hvd_process_set_split(rank % 2)).
 * Each rank's gradients are its own, multiples of 1/8, so every average
 * is exact. Both stages run every case at the same time, on their own:
 *  - SGD: each stage's values move by exactly its own ranks' average
 *    (the set's size divides), not the world's;
 *  - ZeRO-1 Adam (blocks by the set's size and rank), with loss scaling
 *    and clipping (their found_inf and norm collectives within the set):
 *    bit for bit a plain Adam fed the set's average by hand; then an inf
 *    in one rank's gradient skips the step on its set only;
 *  - the hyperparameter check: the second rank of each set has its own
 *    lr, the step fails naming the set's world ranks, and
 *    hvd_broadcast_optimizer_state from root 1 (counted in the set) makes
 *    them agree; a root outside the set is refused;
 *  - checkpoints and hvd_state per stage (the set's first rank writes the
 *    stage's own file): values and state saved, scrambled and loaded;
 *  - hvd_ps_broadcast_parameters from the set's rank 1 and
 *    hvd_ps_verify_parameters naming the world rank that differs;
 *  - refusals: a rank outside the set (the optimizer, the parameter
 *    calls) and a local_sgd.group that reaches outside it.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NP 2
#define MAXLEN 8
static int rank, size, stage, srank, ssize;
static int members[4]; /* the stage's world ranks */
static hvd_process_set_t *set;

typedef struct model {
  float w[NP][MAXLEN], g[NP][MAXLEN];
  char names[NP][16];
  int64_t len[NP];
  hvd_param_t p[NP];
} model_t;

/* The stage's parameters, the same values on every rank. */
static void make(model_t *m) {
  memset(m, 0, sizeof *m);
  for (int k = 0; k < NP; k++) {
    m->len[k] = (k == 0 ? 5 : 3) + stage;
    snprintf(m->names[k], sizeof m->names[k], "s%d.%s", stage,
             k == 0 ? "w" : "b");
    for (int64_t i = 0; i < m->len[k]; i++)
      m->w[k][i] = (float)((i * 3 + k + stage) % 7 - 3) / 4;
    m->p[k].name = m->names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], HVD_FLOAT32, 1, &m->len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], HVD_FLOAT32, 1, &m->len[k]);
  }
}

/* World rank r's gradient element i of parameter k at step t. */
static float grad_of(int r, int k, int64_t i, int t) {
  return (float)((i + k + 3 * r + t) % 7 - 3) / 8;
}

/* This rank's gradients of step t, after o's zero_grad (a step wants
 * new ones). */
static void grads(hvd_optimizer_t *o, model_t *m, int t) {
  if (hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < m->len[k]; i++)
      m->g[k][i] = grad_of(rank, k, i, t);
}

/* The stage's average gradient, as the reference's gradients (ref:
 * its optimizer, or NULL). */
static void set_average(hvd_optimizer_t *ref, model_t *m, int t) {
  if (ref != NULL && hvd_optimizer_zero_grad(ref) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < m->len[k]; i++) {
      double s = 0;
      for (int j = 0; j < ssize; j++)
        s += grad_of(members[j], k, i, t);
      m->g[k][i] = (float)(s / ssize);
    }
}

static hvd_optimizer_t *sgd(model_t *m, double lr) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = lr;
  hvd_optimizer_t *o = NULL;
  if (hvd_sgd_create(m->p, NP, &so, &o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return o;
}

static hvd_optimizer_t *adam(model_t *m) {
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  ao.lr = 0.01;
  hvd_optimizer_t *o = NULL;
  if (hvd_adam_create(m->p, NP, &ao, &o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return o;
}

static hvd_optimizer_t *on_set(hvd_optimizer_t *b, int shard) {
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.process_set = set;
  d.shard_optimizer_state = shard;
  hvd_optimizer_t *o = NULL;
  if (hvd_distributed_optimizer(b, &d, &o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return o;
}

static int same_values(const model_t *a, const model_t *b) {
  return memcmp(a->w, b->w, sizeof a->w) == 0;
}

/* Each stage's values move by its own ranks' average. */
static void test_sgd(void) {
  model_t m, want;
  make(&m);
  make(&want);
  hvd_optimizer_t *o = on_set(sgd(&m, 1.0), 0);
  for (int t = 0; t < 3; t++) {
    grads(o, &m, t);
    is_int(HVD_SUCCESS, hvd_optimizer_step(o), "sgd: step %d", t);
    set_average(NULL, &want, t);
    for (int k = 0; k < NP; k++)
      for (int64_t i = 0; i < want.len[k]; i++)
        want.w[k][i] -= want.g[k][i];
  }
  ok(same_values(&m, &want), "sgd: the stage's average, exactly");
  is_int(HVD_SUCCESS, hvd_ps_verify_parameters(set, m.p, NP),
         "sgd: the same values on the stage's ranks");
  /* the world's collectives go on beside the sets' */
  float x = (float)rank;
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&x, HVD_FLOAT32, 1, &one);
  is_int(HVD_SUCCESS, hvd_allreduce("world.after", &t, &t, HVD_SUM, 1, 1),
         "sgd: a world allreduce after");
  is_double(size * (size - 1) / 2.0, x, 0, "sgd: the world's sum");
  hvd_optimizer_destroy(o);
}

/* ZeRO-1 Adam with loss scaling and clipping against a plain one fed
 * the stage's average; then an inf on one rank skips its set's step. */
static void test_zero(void) {
  model_t m, rm;
  make(&m);
  make(&rm);
  hvd_optimizer_t *o = on_set(adam(&m), 1), *ref = adam(&rm);
  hvd_loss_scale_options_t l;
  hvd_loss_scale_options_init(&l);
  l.init_scale = 1;
  hvd_optimizer_set_loss_scaling(o, &l);
  hvd_optimizer_set_loss_scaling(ref, &l);
  hvd_optimizer_set_grad_clipping(o, 0.25, 2);
  hvd_optimizer_set_grad_clipping(ref, 0.25, 2);
  int same = 1;
  for (int t = 0; t < 3; t++) {
    grads(o, &m, t);
    same &= hvd_optimizer_step(o) == HVD_SUCCESS;
    set_average(ref, &rm, t);
    same &= hvd_optimizer_step(ref) == HVD_SUCCESS;
  }
  ok(same && same_values(&m, &rm),
     "zero: the set's blocks, bit for bit a plain Adam on its average");
  /* an inf on the last rank of stage 0: stage 0 skips, stage 1 steps */
  grads(o, &m, 3);
  if (stage == 0 && srank == ssize - 1)
    m.g[1][0] = INFINITY;
  is_int(HVD_SUCCESS, hvd_optimizer_step(o), "zero: the step with an inf");
  is_int(stage == 0, hvd_optimizer_step_skipped(o),
         "zero: skipped on stage 0's ranks only");
  is_int(stage == 0 ? 3 : 4, hvd_optimizer_steps(o),
         "zero: the updates counted");
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ref);
}

/* The hyperparameter check and the optimizer's broadcast, in the set. */
static void test_hparams(void) {
  model_t m;
  make(&m);
  hvd_optimizer_t *o = on_set(sgd(&m, 0.125 * (srank + 1)), 0);
  grads(o, &m, 0);
  model_t before = m;
  /* (checks are collective: a set of one checks its success alike) */
  hvd_result_t rc = hvd_optimizer_step(o);
  char want[512] = "";
  if (ssize > 1)
    snprintf(want, sizeof want,
             "hvd_optimizer_step: the ranks' optimizers differ in lr: "
             "rank %d 0.125 vs rank %d 0.25; nothing was updated (each "
             "rank must set the same; hvd_broadcast_optimizer_state gives "
             "every rank root's, the update count included)",
             members[0], members[1]);
  is_int(ssize > 1 ? HVD_ERR_MISMATCH : HVD_SUCCESS, rc,
         "hparams: the step fails where the set's lrs differ");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "hparams: naming the set's world ranks");
  ok(ssize == 1 || (same_values(&m, &before) && hvd_optimizer_steps(o) == 0),
     "hparams: nothing updated");
  char out[128];
  snprintf(out, sizeof out,
           "hvd_broadcast_optimizer_state: root %d is out of range for %d "
           "ranks",
           ssize, ssize);
  if (members[0] != 0) /* agreed: the first failing rank's, named */
    snprintf(out + strlen(out), sizeof out - strlen(out), " (on rank %d)",
             members[0]);
  is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_optimizer_state(o, ssize),
         "hparams: a root outside the set is refused");
  is_string(out, hvd_last_error(), "hparams: its message");
  int root = ssize - 1; /* the set's last rank, counted in the set */
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(o, root),
         "hparams: broadcast from the set's rank %d", root);
  is_double(0.125 * ssize, hvd_optimizer_lr(o), 0,
            "hparams: the set's root's lr");
  grads(o, &m, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(o), "hparams: then the step works");
  hvd_optimizer_destroy(o);
}

/* Per stage, its own file: saved, scrambled, loaded. */
static void test_checkpoint(const char *dir) {
  char path[1100], spath[1100];
  snprintf(path, sizeof path, "%s/stage%d.ckpt", dir, stage);
  snprintf(spath, sizeof spath, "%s/stage%d.state", dir, stage);
  model_t m, saved;
  make(&m);
  hvd_optimizer_t *o = on_set(adam(&m), 1);
  grads(o, &m, 0);
  hvd_optimizer_step(o);
  saved = m;
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, m.p, NP, o, 7),
         "checkpoint: the stage saves");
  struct stat sb;
  is_int(0, stat(path, &sb), "checkpoint: its own file");
  for (int k = 0; k < NP; k++)
    m.w[k][0] += 1;
  grads(o, &m, 1);
  hvd_optimizer_step(o); /* the state moves on too */
  int64_t step = 0;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, m.p, NP, o, &step),
         "checkpoint: the stage loads");
  ok(step == 7 && same_values(&m, &saved) && hvd_optimizer_steps(o) == 1,
     "checkpoint: values, step and update count back");
  hvd_checkpoint_request_t *q = NULL;
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(path, m.p, NP, o, 8, &q),
         "checkpoint: a background save");
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(q), "checkpoint: its wait");

  hvd_state_t *st = NULL;
  hvd_state_create(spath, 1, &st);
  hvd_state_add_params(st, m.p, NP, o);
  is_int(HVD_SUCCESS, hvd_state_commit(st), "state: a commit (and its file)");
  is_int(0, stat(spath, &sb), "state: the stage's own file");
  hvd_state_destroy(st);
  for (int k = 0; k < NP; k++)
    m.w[k][1] -= 1;
  hvd_state_create(spath, 1, &st); /* as a relaunch: the file's */
  hvd_state_add_params(st, m.p, NP, o);
  int restored = 0;
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored),
         "state: a restore from the file");
  ok(restored && same_values(&m, &saved), "state: the values back");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(o);
}

/* The parameters' broadcast and check within the set. */
static void test_params(void) {
  model_t m;
  make(&m);
  for (int k = 0; k < NP; k++)
    m.w[k][0] = (float)rank;
  int root = ssize - 1;
  is_int(HVD_SUCCESS, hvd_ps_broadcast_parameters(set, m.p, NP, root),
         "params: broadcast from the set's rank %d", root);
  is_double(members[root], m.w[1][0], 0, "params: world rank %d's value",
            members[root]);
  if (srank == 1)
    m.w[0][2] += 1;
  hvd_result_t rc = hvd_ps_verify_parameters(set, m.p, NP);
  char want[256] = "";
  if (ssize > 1)
    snprintf(want, sizeof want,
             "hvd_ps_verify_parameters: parameter 's%d.w' is not identical "
             "on every rank: rank(s) %d differ from rank %d",
             stage, members[1], members[0]);
  is_int(ssize > 1 ? HVD_ERR_CORRUPT : HVD_SUCCESS, rc,
         "params: a difference within the set found");
  is_string(want, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "params: naming world ranks");
  is_int(HVD_ERR_INVALID_ARG, hvd_ps_broadcast_parameters(NULL, m.p, NP, 0),
         "params: ps NULL");
  is_string("hvd_ps_broadcast_parameters: ps is NULL", hvd_last_error(),
            "params: its message");
}

/* A rank outside the set; a local SGD group reaching outside it. */
static void test_refusals(void) {
  int zero = 0;
  hvd_process_set_t *only0 = NULL, *pair = NULL;
  if (hvd_process_set_create(&zero, 1, &only0) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  model_t m;
  make(&m);
  hvd_optimizer_t *b = sgd(&m, 0.5), *o = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.process_set = only0;
  hvd_result_t rc = hvd_distributed_optimizer(b, &d, &o);
  char want[256];
  snprintf(want, sizeof want,
           "hvd_distributed_optimizer: process_set: rank %d is not in "
           "process set %d",
           rank, hvd_process_set_id(only0));
  is_int(rank == 0 ? HVD_SUCCESS : HVD_ERR_INVALID_ARG, rc,
         "refusals: only the set's members make it");
  is_string(rank == 0 ? "" : want, rank == 0 ? "" : hvd_last_error(),
            "refusals: the message");
  hvd_optimizer_destroy(rc == HVD_SUCCESS ? o : b);
  snprintf(want, sizeof want,
           "hvd_ps_verify_parameters: rank %d is not in process set %d", rank,
           hvd_process_set_id(only0));
  rc = hvd_ps_verify_parameters(only0, m.p, NP);
  is_int(rank == 0 ? HVD_SUCCESS : HVD_ERR_INVALID_ARG, rc,
         "refusals: the parameter check on a set of rank 0");
  is_string(rank == 0 ? "" : want, rank == 0 ? "" : hvd_last_error(),
            "refusals: outside it, the message");
  hvd_process_set_destroy(only0);

  if (size < 2) {
    skip(2, "refusals: local_sgd.group needs 2 ranks");
    return;
  }
  int both[2] = {0, 1};
  if (hvd_process_set_create(both, 2, &pair) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  b = sgd(&m, 0.5);
  o = NULL;
  d.process_set = set;
  d.local_sgd.period = 2;
  d.local_sgd.group = rank < 2 ? pair : NULL;
  rc = hvd_distributed_optimizer(b, &d, &o);
  /* ranks 0 and 1 are in different stages: each sees the other's rank */
  snprintf(want, sizeof want,
           "hvd_distributed_optimizer: local_sgd.group: process set %d has "
           "rank %d, which is not in process_set %d",
           hvd_process_set_id(pair), 1 - rank, hvd_process_set_id(set));
  is_int(rank < 2 ? HVD_ERR_INVALID_ARG : HVD_SUCCESS, rc,
         "refusals: a local SGD group outside the set");
  is_string(rank < 2 ? want : "", rank < 2 ? hvd_last_error() : "",
            "refusals: its message");
  hvd_optimizer_destroy(rc == HVD_SUCCESS ? o : b);
  hvd_process_set_destroy(pair);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  size = hvd_size();
  stage = rank % 2;
  if (hvd_process_set_split(stage, &set) != HVD_SUCCESS)
    bail("split: %s", hvd_last_error());
  srank = hvd_process_set_rank(set);
  ssize = hvd_process_set_size(set);
  for (int r = 0, j = 0; r < size; r++)
    if (r % 2 == stage)
      members[j++] = r;
  char dir[1024];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-optim-ps");

  test_sgd();
  test_zero();
  test_hparams();
  test_checkpoint(dir);
  test_params();
  test_refusals();

  hvdt_remove_tmpdir(dir);
  hvd_process_set_destroy(set);
  hvd_shutdown();
  return tap_mpi_finish();
}
