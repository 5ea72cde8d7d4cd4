/*
 * ckpt_hparams.c - a checkpoint keeps the optimizer's hyperparameters
 * (format version 5's section, doc/checkpoint-format.md), as torch's
 * optimizer.load_state_dict restores its param_groups' options; np 1..4.
 *
 * Optimizer A (distributed SGD: lr 0.25, momentum 0.9, dampening 0.1,
 * weight decay 0.01; parameter "b" at 3 times the rate, "c" with its own
 * decay 0.5; loss scaling from 1024 growing 4x every 2 clean steps;
 * clipping at 2.5) takes three steps and is saved. B, made otherwise
 * (lr 0.1, momentum 0.5, no decay, "w" at 2 times the rate, default loss
 * scaling, clipping at 9 by the max norm), loads the file:
 *  - its getters give A's: lr, update count, loss scale, each
 *    parameter's rate scale (B's own on "w" is gone: the file has none)
 *    and decay; then A and B step alike, bit for bit, three times (the
 *    momentum, dampening, decay, clipping and scaling options are A's);
 *    before that, A committed in memory (hvd_state), its settings
 *    changed and a step taken, is restored: those steps show that the
 *    commit kept them too;
 *  - the same file made version 4 (the section cut out, the header and
 *    checksum redone) still loads into C, made as B: the values, lr,
 *    update count and loss scale are the file's, the rest stays C's (a
 *    step from the same values then differs from A's);
 *  - a label length past the end: HVD_ERR_CORRUPT "malformed at byte N
 *    (hyperparameters)"; nesterov (an int) 0.5: "... (a hyperparameter
 *    out of its range)"; nothing changed by either.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
static const int64_t len[NP] = {6, 3, 4};
static const char *const names[NP] = {"w", "b", "c"};
static int rank;

typedef struct model {
  float v[NP][8], g[NP][8];
  hvd_param_t p[NP];
} model_t;

static void make(model_t *m) {
  memset(m, 0, sizeof *m);
  for (int k = 0; k < NP; k++) {
    for (int64_t i = 0; i < len[k]; i++)
      m->v[k][i] = (float)((i * 5 + k) % 9 - 4) / 8;
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->v[k], HVD_FLOAT32, 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], HVD_FLOAT32, 1, &len[k]);
  }
}

/* Gradients of step t, the same on every rank, times the loss scale. */
static void grads(hvd_optimizer_t *o, model_t *m, int t) {
  double s = hvd_optimizer_loss_scale(o);
  if (hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++)
      m->g[k][i] = (float)(((i + 2 * k + t) % 7 - 3) * s / 4);
}

typedef struct opts {
  double lr, momentum, dampening, wd, lrs_w, lrs_b, wd_c, scale, max_norm,
      norm_type;
  double growth, backoff;
  int64_t interval;
} opts_t;

static hvd_optimizer_t *make_opt(model_t *m, const opts_t *x) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = x->lr;
  so.momentum = x->momentum;
  so.dampening = x->dampening;
  so.weight_decay = x->wd;
  hvd_optimizer_t *b = NULL, *o = NULL;
  hvd_loss_scale_options_t l;
  hvd_loss_scale_options_init(&l);
  l.init_scale = x->scale;
  l.growth_factor = x->growth;
  l.backoff_factor = x->backoff;
  l.growth_interval = x->interval;
  if (hvd_sgd_create(m->p, NP, &so, &b) != HVD_SUCCESS ||
      hvd_distributed_optimizer(b, NULL, &o) != HVD_SUCCESS ||
      hvd_optimizer_set_param_lr_scale(o, 0, x->lrs_w) != HVD_SUCCESS ||
      hvd_optimizer_set_param_lr_scale(o, 1, x->lrs_b) != HVD_SUCCESS ||
      hvd_optimizer_set_param_weight_decay(o, 2, x->wd_c) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(o, &l) != HVD_SUCCESS ||
      hvd_optimizer_set_grad_clipping(o, x->max_norm, x->norm_type) !=
          HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return o;
}

static const opts_t A = {0.25, 0.9, 0.1, 0.01, NAN,  3.0, 0.5,
                         1024, 2.5, 2.0, 4.0,  0.25, 2};
static const opts_t B = {0.1,   0.5, 0,        0,   2.0, NAN, NAN,
                         65536, 9,   INFINITY, 2.0, 0.5, 2000};

static int same_values(const model_t *a, const model_t *b) {
  return memcmp(a->v, b->v, sizeof a->v) == 0;
}

/* Steps both optimizers on the same gradients: 1 when every value is
 * the same after each. */
static int step_alike(hvd_optimizer_t *oa, model_t *a, hvd_optimizer_t *ob,
                      model_t *b, int from) {
  int same = 1;
  for (int t = from; t < from + 3; t++) {
    grads(oa, a, t);
    grads(ob, b, t);
    same &= hvd_optimizer_step(oa) == HVD_SUCCESS;
    same &= hvd_optimizer_step(ob) == HVD_SUCCESS;
    same &= same_values(a, b);
  }
  return same;
}

static uint64_t le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* Past a string at *at. */
static void skip_str(const unsigned char *img, size_t *at) {
  *at += 4 + le(img + *at, 4);
}

/* Where the hyperparameters' section starts (after the optimizer's and
 * the counters', doc/checkpoint-format.md), and its size. */
static size_t hp_section(const unsigned char *img, size_t *size) {
  size_t at = 32;
  if (le(img + at, 4) == 1) {
    at += 4;
    skip_str(img, &at);
    at += 16;
    uint64_t ns = le(img + at, 4);
    at += 4;
    for (uint64_t k = 0; k < ns; k++)
      skip_str(img, &at);
  } else {
    at += 4;
  }
  uint64_t nc = le(img + at, 4);
  at += 4;
  for (uint64_t k = 0; k < nc; k++) {
    skip_str(img, &at);
    at += 8;
  }
  size_t start = at;
  uint64_t nh = le(img + at, 4);
  at += 4;
  for (uint64_t k = 0; k < nh; k++) {
    skip_str(img, &at);
    at += 8;
  }
  at += 4 + 16 * le(img + at, 4);
  *size = at - start;
  return start;
}

/* img (n bytes, version 5) with its header's size and its checksum
 * redone for n bytes. */
static void reseal(unsigned char *img, size_t n) {
  put_le(img + 16, n, 8);
  put_le(img + n - 8, hvdt_sum64(img, n - 8), 8);
}

/* Loading bad into d (B's, untouched) fails on every rank, malformed at
 * byte where (rank 0's) for why; nothing changes. */
static void refused(const char *bad, model_t *d, hvd_optimizer_t *od,
                    int64_t where, const char *why, const char *what) {
  model_t d0 = *d;
  char want[1400];
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&where, HVD_INT64, 1, &one);
  if (hvd_broadcast("where", &t, 0) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  snprintf(want, sizeof want,
           "hvd_checkpoint_load: '%s': malformed at byte %lld (%s)", bad,
           (long long)where, why);
  is_int(HVD_ERR_CORRUPT, hvd_checkpoint_load(bad, d->p, NP, od, NULL),
         "%s is refused", what);
  is_string(want, hvd_last_error(), "... naming the byte");
  ok(same_values(d, &d0) && hvd_optimizer_steps(od) == 0 &&
         hvd_optimizer_lr(od) == 0.1 &&
         hvd_optimizer_param_lr_scale(od, 0) == 2,
     "... nothing changed");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  char dir[1024], path[1100], v4[1100], bad[1100];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-ckpt-hparams");
  snprintf(path, sizeof path, "%s/a.ckpt", dir);
  snprintf(v4, sizeof v4, "%s/v4.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);

  model_t a, b;
  make(&a);
  make(&b);
  hvd_optimizer_t *oa = make_opt(&a, &A), *ob = make_opt(&b, &B);
  for (int t = 0; t < 3; t++) {
    grads(oa, &a, t);
    if (hvd_optimizer_step(oa) != HVD_SUCCESS)
      bail("%s", hvd_last_error());
  }
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, a.p, NP, oa, 3), "save A");
  /* an in-memory commit keeps them as well: changed, a step, restored */
  hvd_state_t *st = NULL;
  hvd_loss_scale_options_t l;
  hvd_loss_scale_options_init(&l);
  int restored = 0;
  if (hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, a.p, NP, oa) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  is_int(HVD_SUCCESS, hvd_state_commit(st), "commit A in memory");
  if (hvd_optimizer_set_param_lr_scale(oa, 1, 7) != HVD_SUCCESS ||
      hvd_optimizer_set_param_weight_decay(oa, 2, NAN) != HVD_SUCCESS ||
      hvd_optimizer_set_grad_clipping(oa, 1, INFINITY) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(oa, &l) != HVD_SUCCESS ||
      hvd_optimizer_set_lr(oa, 1) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  grads(oa, &a, 9);
  hvd_optimizer_step(oa);
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored), "restore A");
  ok(restored && hvd_optimizer_param_lr_scale(oa, 1) == 3 &&
         hvd_optimizer_param_weight_decay(oa, 2) == 0.5 &&
         hvd_optimizer_lr(oa) == 0.25 && hvd_optimizer_steps(oa) == 3,
     "... its settings back (the rest shows in the steps below)");
  hvd_state_destroy(st);
  model_t b0 = b;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, b.p, NP, ob, NULL),
         "load into B");
  is_double(0.25, hvd_optimizer_lr(ob), 0, "B's lr is A's");
  is_int(3, hvd_optimizer_steps(ob), "B's update count is A's");
  is_double(hvd_optimizer_loss_scale(oa), hvd_optimizer_loss_scale(ob), 0,
            "B's loss scale is A's (%g)", hvd_optimizer_loss_scale(oa));
  is_double(1, hvd_optimizer_param_lr_scale(ob, 0), 0,
            "'w' at the optimizer's rate, as in the file (B's 2 gone)");
  is_double(3, hvd_optimizer_param_lr_scale(ob, 1), 0, "'b' at 3 times");
  is_double(0.01, hvd_optimizer_param_weight_decay(ob, 0), 0,
            "'w' decays by A's options' 0.01");
  is_double(0.5, hvd_optimizer_param_weight_decay(ob, 2), 0,
            "'c' by its own 0.5");
  ok(same_values(&a, &b), "B holds A's values");
  ok(step_alike(oa, &a, ob, &b, 3),
     "three more steps of A and B alike, bit for bit (momentum, "
     "dampening, clipping and loss scaling are A's)");

  /* the file as version 4: no section, the program's options stay */
  size_t n = 0, hsize = 0;
  unsigned char *img = NULL;
  if (rank == 0) {
    img = hvdt_read_bytes(path, &n);
    size_t at = hp_section(img, &hsize);
    memmove(img + at, img + at + hsize, n - at - hsize);
    img[8] = 4;
    reseal(img, n - hsize);
    hvdt_write_bytes(v4, img, n - hsize);
  }
  model_t c;
  make(&c);
  hvd_optimizer_t *oc = make_opt(&c, &B);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(v4, c.p, NP, oc, NULL),
         "a version 4 file loads");
  ok(same_values(&c, &b0) == 0 && hvd_optimizer_steps(oc) == 3 &&
         hvd_optimizer_lr(oc) == 0.25,
     "... its values, update count and lr");
  is_double(2, hvd_optimizer_param_lr_scale(oc, 0), 0,
            "... 'w' keeps the program's rate scale");
  is_double(0, hvd_optimizer_param_weight_decay(oc, 0), 0, "... and decay");
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, a.p, NP, oa, NULL),
         "A back to the file");
  ok(same_values(&a, &c), "... the values C holds");
  grads(oa, &a, 6);
  grads(oc, &c, 6);
  is_int(HVD_SUCCESS, hvd_optimizer_step(oa), "A steps");
  is_int(HVD_SUCCESS, hvd_optimizer_step(oc), "C steps");
  ok(!same_values(&a, &c), "... and differ: C kept its own options");

  /* a label's length past the end of the file: the reader stops after
   * the length (the section's start, its count, the length) */
  int64_t where = 0;
  if (rank == 0) {
    free(img);
    img = hvdt_read_bytes(path, &n);
    size_t at = hp_section(img, &hsize);
    put_le(img + at + 4, 0x7fffffff, 4);
    reseal(img, n);
    hvdt_write_bytes(bad, img, n);
    where = (int64_t)at + 8;
  }
  model_t d;
  make(&d);
  hvd_optimizer_t *od = make_opt(&d, &B);
  refused(bad, &d, od, where, "hyperparameters", "a label past the end");

  /* nesterov (an int) 0.5: out of its range */
  if (rank == 0) {
    free(img);
    img = hvdt_read_bytes(path, &n);
    size_t at = hp_section(img, &hsize) + 4;
    while (memcmp(img + at + 4, "nesterov", 8) != 0) {
      skip_str(img, &at);
      at += 8;
    }
    skip_str(img, &at);
    double half = 0.5;
    uint64_t bits;
    memcpy(&bits, &half, sizeof bits);
    put_le(img + at, bits, 8);
    reseal(img, n);
    hvdt_write_bytes(bad, img, n);
    where = (int64_t)at + 8;
  }
  refused(bad, &d, od, where, "a hyperparameter out of its range",
          "nesterov 0.5");
  free(img);

  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  hvd_optimizer_destroy(oc);
  hvd_optimizer_destroy(od);
  hvdt_remove_tmpdir(dir);
  hvd_shutdown();
  return tap_mpi_finish();
}
