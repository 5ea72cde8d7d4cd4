/*
 * ckpt_range.c - a checkpoint's numbers are checked against the ranges
 * their setters take before a load changes anything; np 1..4.
 *
 * Files saved from SGD (momentum, dampening, weight decay, nesterov off,
 * per-parameter rate scale and decay, loss scaling, clipping), Adam and
 * LAMB each get one value out of its range (the checksum redone, so the
 * file is well formed): every hyperparameter of the version 5 section
 * (lr, update count, momentum, dampening, weight_decay, nesterov, loss
 * scaling's and clipping's, beta1, beta2, eps, LAMB's flags), the
 * optimizer section's lr and update count, the loss scaler's counter,
 * each parameter's rate scale and decay. A load into another optimizer
 * of the kind fails on every rank with HVD_ERR_CORRUPT
 * "hvd_checkpoint_load: '<path>': <what> <value> is out of range
 * <range>", the setter's range, and changes nothing: the values, lr,
 * update count, rate scales and loss scale are the program's still.
 * Before, most loaded (lr nan, then a NaN model), and a bad rate scale
 * failed with a setter's message after the model was overwritten.
 * SGD's nesterov turned on in a file whose dampening is not 0 is refused
 * as hvd_sgd_create refuses it. A LAMB with always_adapt 5 (any int
 * turns it on) saves 1 and loads; a file with bias_correction 2 (an
 * earlier build's) loads, and so does a loss scale of 0, which backoffs
 * without a floor reach.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
static const int64_t len[NP] = {6, 3, 4};
static const char *const names[NP] = {"w", "b", "c"};
static int rank;
static char dir[1024], good[1100], bad[1100];

typedef struct model {
  float v[NP][8], g[NP][8];
  hvd_param_t p[NP];
} model_t;

static void make(model_t *m, float base) {
  memset(m, 0, sizeof *m);
  for (int k = 0; k < NP; k++) {
    for (int64_t i = 0; i < len[k]; i++)
      m->v[k][i] = base + (float)((i * 5 + k) % 9 - 4) / 8;
    m->p[k].name = names[k];
    m->p[k].value = hvd_tensor_make(m->v[k], HVD_FLOAT32, 1, &len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], HVD_FLOAT32, 1, &len[k]);
  }
}

enum { SGD, ADAM, LAMB };

/* A distributed optimizer of kind over m; alt: other options. */
static hvd_optimizer_t *make_opt(model_t *m, int kind, int alt) {
  hvd_sgd_options_t so;
  hvd_adam_options_t ao;
  hvd_lamb_options_t lo;
  hvd_optimizer_t *b = NULL, *o = NULL;
  hvd_result_t rc;
  hvd_sgd_options_init(&so);
  hvd_adam_options_init(&ao);
  hvd_lamb_options_init(&lo);
  so.lr = ao.lr = lo.lr = alt ? 0.5 : 0.25;
  so.momentum = 0.9;
  so.dampening = 0.1;
  so.weight_decay = 0.01;
  lo.always_adapt = alt ? 0 : 5;
  rc = kind == SGD    ? hvd_sgd_create(m->p, NP, &so, &b)
       : kind == ADAM ? hvd_adam_create(m->p, NP, &ao, &b)
                      : hvd_lamb_create(m->p, NP, &lo, &b);
  if (rc != HVD_SUCCESS || hvd_distributed_optimizer(b, NULL, &o) != 0 ||
      hvd_optimizer_set_param_lr_scale(o, 1, alt ? 2 : 3) != HVD_SUCCESS ||
      hvd_optimizer_set_param_weight_decay(o, 2, 0.5) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(o, NULL) != HVD_SUCCESS ||
      hvd_optimizer_set_grad_clipping(o, alt ? 9 : 2.5, 2) != HVD_SUCCESS)
    bail("the optimizer: %s", hvd_last_error());
  return o;
}

/* One step with gradients the same on every rank (times the scale). */
static void step(hvd_optimizer_t *o, model_t *m) {
  double s = hvd_optimizer_loss_scale(o);
  if (hvd_optimizer_zero_grad(o) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < len[k]; i++)
      m->g[k][i] = (float)(((i + 2 * k) % 7 - 3) * s / 4);
  if (hvd_optimizer_step(o) != HVD_SUCCESS)
    bail("step: %s", hvd_last_error());
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

static void put_f64(unsigned char *p, double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  put_le(p, bits, 8);
}

/* Past a string at *at. */
static void skip_str(const unsigned char *img, size_t *at) {
  *at += 4 + le(img + *at, 4);
}

static int is_str(const unsigned char *img, size_t at, const char *s) {
  return le(img + at, 4) == strlen(s) && memcmp(img + at + 4, s, strlen(s)) == 0;
}

/* Where a value lives in a file (doc/checkpoint-format.md): "@lr" and
 * "@steps" the optimizer section's, "#name" a counter's, "lrs:i" and
 * "wd:i" parameter i's, else the hyperparameter labelled so. */
static size_t where(const unsigned char *img, const char *what) {
  size_t at = 32 + 4, opt = at;
  skip_str(img, &at);
  if (strcmp(what, "@lr") == 0 || strcmp(what, "@steps") == 0)
    return at + (what[1] == 's' ? 8 : 0);
  at += 16;
  uint64_t ns = le(img + at, 4);
  at += 4;
  for (uint64_t k = 0; k < ns; k++)
    skip_str(img, &at);
  uint64_t nc = le(img + at, 4);
  at += 4;
  for (uint64_t k = 0; k < nc; k++, at += 8) {
    if (what[0] == '#' && is_str(img, at, what + 1)) {
      skip_str(img, &at);
      return at;
    }
    skip_str(img, &at);
  }
  uint64_t nh = le(img + at, 4);
  at += 4;
  for (uint64_t k = 0; k < nh; k++, at += 8) {
    int hit = is_str(img, at, what);
    skip_str(img, &at);
    if (hit)
      return at;
  }
  at += 4; /* the parameters' count */
  if (strncmp(what, "lrs:", 4) == 0 || strncmp(what, "wd:", 3) == 0)
    return at + 16 * (size_t)atoi(strchr(what, ':') + 1) +
           (what[0] == 'w' ? 8 : 0);
  bail("no %s in the file (%zu)", what, opt);
}

/* The good file with what's value x (an int64 for "@steps"), resealed. */
static void spoil(const char *what, double x) {
  if (rank != 0)
    return;
  size_t n = 0;
  unsigned char *img = hvdt_read_bytes(good, &n);
  size_t at = where(img, what);
  if (strcmp(what, "@steps") == 0)
    put_le(img + at, (uint64_t)(int64_t)x, 8);
  else
    put_f64(img + at, x);
  put_le(img + n - 8, hvdt_sum64(img, n - 8), 8);
  hvdt_write_bytes(bad, img, n);
  free(img);
}

typedef struct scalars {
  double lr, lrs, wd, scale;
  int64_t steps;
} scalars_t;

static scalars_t scalars_of(const hvd_optimizer_t *o) {
  return (scalars_t){hvd_optimizer_lr(o), hvd_optimizer_param_lr_scale(o, 1),
                     hvd_optimizer_param_weight_decay(o, 2),
                     hvd_optimizer_loss_scale(o), hvd_optimizer_steps(o)};
}

/* bad (what made x) loads into (m, o) of kind on no rank, with the
 * message want; nothing changed. */
static void refused_with(int kind, const char *what, double x,
                         const char *want) {
  model_t m;
  make(&m, 3);
  hvd_optimizer_t *o = make_opt(&m, kind, 1);
  model_t m0 = m;
  scalars_t s0 = scalars_of(o);
  spoil(what, x);
  int64_t step = -7;
  is_int(HVD_ERR_CORRUPT, hvd_checkpoint_load(bad, m.p, NP, o, &step),
         "%s %g is refused", what, x);
  is_string(want, hvd_last_error(), "... naming it and its range");
  scalars_t s = scalars_of(o);
  ok(memcmp(m.v, m0.v, sizeof m.v) == 0 && memcmp(&s, &s0, sizeof s) == 0 &&
         step == -7,
     "... nothing changed");
  hvd_optimizer_destroy(o);
}

/* refused_with, the message naming what ("<words> <x as %g>") and its
 * range. */
static void refused(int kind, const char *what, double x, const char *words,
                    const char *range) {
  char want[3000];
  snprintf(want, sizeof want,
           "hvd_checkpoint_load: '%s': %s %g is out of range %s", bad, words,
           x, range);
  refused_with(kind, what, x, want);
}

/* bad (what made x) loads into an optimizer of kind: a value the
 * optimizer can reach, or one an earlier build wrote. *scale: the loss
 * scale after it. */
static void loads(int kind, const char *what, double x, double *scale) {
  model_t m;
  make(&m, 3);
  hvd_optimizer_t *o = make_opt(&m, kind, 1);
  spoil(what, x);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(bad, m.p, NP, o, NULL),
         "%s %g loads", what, x);
  *scale = hvd_optimizer_loss_scale(o);
  hvd_optimizer_destroy(o);
}

/* The good file of kind: saved after one step. */
static void save_good(int kind) {
  model_t m;
  make(&m, 1);
  hvd_optimizer_t *o = make_opt(&m, kind, 0);
  step(o, &m);
  if (hvd_checkpoint_save(good, m.p, NP, o, 1) != HVD_SUCCESS)
    bail("save: %s", hvd_last_error());
  hvd_optimizer_destroy(o);
}

static void sgd_cases(void) {
  save_good(SGD);
  refused(SGD, "lr", NAN, "lr", "[0, inf)");
  refused(SGD, "@lr", -1, "lr", "[0, inf)");
  refused(SGD, "update count", -1, "update count", "[0, inf)");
  refused(SGD, "@steps", -3, "update count", "[0, inf)");
  refused(SGD, "momentum", -0.5, "momentum", "[0, inf)");
  refused(SGD, "dampening", INFINITY, "dampening", "(-inf, inf)");
  refused(SGD, "weight_decay", NAN, "weight_decay", "[0, inf)");
  { /* each value in range, but nesterov with the file's dampening 0.1:
       what hvd_sgd_create refuses, refused here too */
    char want[3000];
    snprintf(want, sizeof want,
             "hvd_checkpoint_load: '%s': nesterov needs momentum > 0 and "
             "dampening 0 (momentum 0.9, dampening 0.1)",
             bad);
    refused_with(SGD, "nesterov", 1, want);
  }
  refused(SGD, "loss scale", -1, "loss scale", "[0, inf)");
  double scale = -1; /* backoffs without a floor reach 0, as torch's */
  loads(SGD, "#hvd.loss_scale", 0, &scale);
  is_double(0, scale, 0, "... a loss scale of 0 (backed off that far)");
  refused(SGD, "loss scale's clean steps", -1, "loss scale's clean steps",
          "[0, inf)");
  refused(SGD, "init_scale", INFINITY, "init_scale", "(0, inf)");
  refused(SGD, "growth_factor", 0.5, "growth_factor", "[1, inf)");
  refused(SGD, "backoff_factor", 1.5, "backoff_factor", "(0, 1]");
  refused(SGD, "backoff_factor", 0, "backoff_factor", "(0, 1]");
  refused(SGD, "growth_interval", 0, "growth_interval", "[1, inf)");
  refused(SGD, "growth_interval", -5, "growth_interval", "[1, inf)");
  refused(SGD, "max_norm", -5, "max_norm", "(0, inf]");
  refused(SGD, "max_norm", 0, "max_norm", "(0, inf]");
  refused(SGD, "norm_type", 1, "norm_type", "{2, inf}");
  refused(SGD, "#hvd.loss_scale", -1, "loss scale", "[0, inf)");
  refused(SGD, "lrs:1", -3, "the learning-rate scale of parameter 'b'",
          "[0, inf) (NaN: none set)");
  refused(SGD, "wd:2", INFINITY, "the weight decay of parameter 'c'",
          "[0, inf) (NaN: none set)");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-ckpt-range");
  snprintf(good, sizeof good, "%s/good.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
  sgd_cases();
  save_good(ADAM);
  refused(ADAM, "beta1", 2, "beta1", "[0, 1)");
  refused(ADAM, "beta2", -0.1, "beta2", "[0, 1)");
  refused(ADAM, "eps", -1, "eps", "(0, inf)");
  refused(ADAM, "eps", 0, "eps", "(0, inf)");
  save_good(LAMB);
  double scale = -1; /* an earlier build wrote the options' int */
  loads(LAMB, "bias_correction", 2, &scale);
  /* always_adapt 5 was saved as 1: it loads */
  model_t m;
  make(&m, 3);
  hvd_optimizer_t *o = make_opt(&m, LAMB, 1);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(good, m.p, NP, o, NULL),
         "LAMB's always_adapt 5 saved as 1: the file loads");
  double one = -1;
  if (rank == 0) {
    size_t n = 0;
    unsigned char *img = hvdt_read_bytes(good, &n);
    uint64_t bits = le(img + where(img, "always_adapt"), 8);
    memcpy(&one, &bits, sizeof one);
    free(img);
  }
  int64_t nv = 1;
  hvd_tensor_t t = hvd_tensor_make(&one, HVD_FLOAT64, 1, &nv);
  if (hvd_broadcast("one", &t, 0) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  is_double(1, one, 0, "... its always_adapt is 1");
  hvd_optimizer_destroy(o);
  hvdt_remove_tmpdir(dir);
  hvd_shutdown();
  return tap_mpi_finish();
}
