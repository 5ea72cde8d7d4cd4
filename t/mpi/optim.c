/*
 * optim.c - the distributed optimizer gives, at every world size, the
 * parameters a single process gets from the whole batch.
 *
 * The model is a small MLP (8 -> 16 tanh -> 4, mean squared error) with
 * the same deterministic start on every rank; each step's global batch of
 * B = 24 samples (divisible by 1..4 ranks and, halved, by 2 passes) is a
 * function of the step. Each rank takes its B / size samples, computes the
 * gradient of the mean loss over them, calling grad_ready for each
 * parameter as backward produces it (in reverse order), then steps. The
 * reference is computed here: one process, the full batch, the plain
 * optimizer. Also: accumulation over passes, the predivide factor, HVD_SUM,
 * no-sync mode, fp16/bf16 compression, and every error path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "hvd.h"
#include "tap/tap.h"

#define IN 8
#define HID 16
#define OUT 4
#define B 24
#define STEPS 20
#define NP 4 /* parameters */
#define TOL 1e-5

static int rank, size;

typedef struct model {
  float w1[HID * IN], b1[HID], w2[OUT * HID], b2[OUT];
  float g1[HID * IN], gb1[HID], g2[OUT * HID], gb2[OUT];
  hvd_param_t p[NP];
} model_t;

static const char *const pnames[NP] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                       "fc2.bias"};

static void model_init(model_t *m) {
  static const int64_t shapes[NP][2] = {
      {HID, IN}, {HID, 0}, {OUT, HID}, {OUT, 0}};
  float *v[NP] = {m->w1, m->b1, m->w2, m->b2};
  float *g[NP] = {m->g1, m->gb1, m->g2, m->gb2};
  memset(m, 0, sizeof *m);
  for (int j = 0; j < HID * IN; j++)
    m->w1[j] = (float)(0.5 * sin(1.3 * j + 0.2));
  for (int j = 0; j < HID; j++)
    m->b1[j] = (float)(0.1 * cos(0.7 * j));
  for (int j = 0; j < OUT * HID; j++)
    m->w2[j] = (float)(0.4 * cos(0.9 * j + 0.3));
  for (int j = 0; j < OUT; j++)
    m->b2[j] = (float)(0.05 * j);
  for (int i = 0; i < NP; i++) {
    int nd = shapes[i][1] ? 2 : 1;
    m->p[i].name = pnames[i];
    m->p[i].value = hvd_tensor_make(v[i], HVD_FLOAT32, nd, shapes[i]);
    m->p[i].grad = hvd_tensor_make(g[i], HVD_FLOAT32, nd, shapes[i]);
  }
}

/* Sample s of step t's global batch: input and target. */
static double x_of(int t, int s, int j) {
  return sin(0.37 * (t * B + s) + 0.11 * j * j + 0.5);
}
static double y_of(int t, int s, int o) {
  return 0.8 * cos(0.23 * (t * B + s) * (o + 1) + 0.4 * o);
}

static void must(hvd_result_t rc, const char *what) {
  if (rc != HVD_SUCCESS)
    bail("rank %d: %s: %s: %s", rank, what, hvd_strerror(rc), hvd_last_error());
}

/* Adds the gradient of the mean loss over samples [first, first + count)
 * of step t into m's grads (in double, then rounded once). With opt
 * distributed, calls grad_ready as each gradient is complete: fc2's
 * first, as backward produces them. */
static void backward(model_t *m, int t, int first, int count,
                     hvd_optimizer_t *opt) {
  double h[B][HID], dy[B][OUT], dh[B][HID], x[B][IN];
  double g1[HID * IN] = {0}, gb1[HID] = {0}, g2[OUT * HID] = {0},
                  gb2[OUT] = {0};
  for (int s = 0; s < count; s++) {
    for (int j = 0; j < IN; j++)
      x[s][j] = x_of(t, first + s, j);
    for (int k = 0; k < HID; k++) {
      double a = m->b1[k];
      for (int j = 0; j < IN; j++)
        a += (double)m->w1[k * IN + j] * x[s][j];
      h[s][k] = tanh(a);
    }
    for (int o = 0; o < OUT; o++) {
      double y = m->b2[o];
      for (int k = 0; k < HID; k++)
        y += (double)m->w2[o * HID + k] * h[s][k];
      dy[s][o] = 2.0 * (y - y_of(t, first + s, o)) / (count * OUT);
    }
  }
  /* fc2 */
  for (int s = 0; s < count; s++)
    for (int o = 0; o < OUT; o++) {
      gb2[o] += dy[s][o];
      for (int k = 0; k < HID; k++)
        g2[o * HID + k] += dy[s][o] * h[s][k];
    }
  for (int o = 0; o < OUT; o++)
    m->gb2[o] += (float)gb2[o];
  for (int j = 0; j < OUT * HID; j++)
    m->g2[j] += (float)g2[j];
  if (opt != NULL) {
    must(hvd_optimizer_grad_ready(opt, 3), "grad_ready fc2.bias");
    must(hvd_optimizer_grad_ready(opt, 2), "grad_ready fc2.weight");
  }
  /* fc1 */
  for (int s = 0; s < count; s++)
    for (int k = 0; k < HID; k++) {
      double d = 0;
      for (int o = 0; o < OUT; o++)
        d += dy[s][o] * m->w2[o * HID + k];
      dh[s][k] = d * (1 - h[s][k] * h[s][k]);
      gb1[k] += dh[s][k];
      for (int j = 0; j < IN; j++)
        g1[k * IN + j] += dh[s][k] * x[s][j];
    }
  for (int k = 0; k < HID; k++)
    m->gb1[k] += (float)gb1[k];
  for (int j = 0; j < HID * IN; j++)
    m->g1[j] += (float)g1[j];
  if (opt != NULL) {
    must(hvd_optimizer_grad_ready(opt, 1), "grad_ready fc1.bias");
    must(hvd_optimizer_grad_ready(opt, 0), "grad_ready fc1.weight");
  }
}

/* steps steps of zero_grad, `passes` backward passes over equal parts of
 * samples [first, first + count), step. ready: call grad_ready. */
static void train(model_t *m, hvd_optimizer_t *opt, int steps, int first,
                  int count, int passes, int ready) {
  for (int t = 0; t < steps; t++) {
    must(hvd_optimizer_zero_grad(opt), "zero_grad");
    for (int p = 0; p < passes; p++)
      backward(m, t, first + p * (count / passes), count / passes,
               ready ? opt : NULL);
    must(hvd_optimizer_step(opt), "step");
  }
}

enum kind { SGD_MOMENTUM, ADAMW, SGD_PLAIN };
static const char *const kind_names[] = {"SGD momentum", "AdamW", "SGD"};

static hvd_optimizer_t *make_opt(model_t *m, enum kind k, double lr_mult) {
  hvd_optimizer_t *opt = NULL;
  if (k == ADAMW) {
    hvd_adam_options_t o;
    hvd_adam_options_init(&o);
    o.lr = 0.01 * lr_mult;
    o.decoupled = 1;
    o.weight_decay = 0.01;
    must(hvd_adam_create(m->p, NP, &o, &opt), "adam_create");
  } else {
    hvd_sgd_options_t o;
    hvd_sgd_options_init(&o);
    o.lr = 0.05 * lr_mult;
    if (k == SGD_MOMENTUM) {
      o.momentum = 0.9;
      o.weight_decay = 1e-4;
    }
    must(hvd_sgd_create(m->p, NP, &o, &opt), "sgd_create");
  }
  return opt;
}

static hvd_optimizer_t *make_dist(model_t *m, enum kind k,
                                  const hvd_distributed_options_t *o) {
  hvd_optimizer_t *d = NULL;
  must(hvd_distributed_optimizer(make_opt(m, k, 1.0), o, &d), "distributed");
  return d;
}

/* The single-process reference: plain optimizer over samples
 * [first, first + count) of each step, one pass. */
static void reference(model_t *ref, enum kind k, double lr_mult, int first,
                      int count) {
  model_init(ref);
  hvd_optimizer_t *opt = make_opt(ref, k, lr_mult);
  train(ref, opt, STEPS, first, count, 1, 0);
  hvd_optimizer_destroy(opt);
}

/* Largest |a - b| / max(|b|, 0.1) over every parameter; tol 0 asks for
 * identical values. */
static int same_params(const model_t *a, const model_t *b, double tol,
                       const char *what) {
  double worst = 0;
  const char *where = "";
  for (int i = 0; i < NP; i++) {
    const float *x = a->p[i].value.data, *y = b->p[i].value.data;
    for (int64_t j = 0; j < hvd_tensor_numel(&a->p[i].value); j++) {
      double e = fabs((double)x[j] - y[j]) / fmax(fabs((double)y[j]), 0.1);
      if (e > worst || isnan(e)) {
        worst = e;
        where = pnames[i];
      }
    }
  }
  tap_note("largest relative difference %.3g (%s)", worst, where);
  return ok(worst <= tol, "%s: parameters match the reference (rel %g)", what,
            tol);
}

/* Distributed training of kind k with options o against a reference. */
static void check_dist(enum kind k, const hvd_distributed_options_t *o,
                       double ref_lr_mult, const char *what) {
  static model_t m, ref;
  int shard = B / size;
  model_init(&m);
  hvd_optimizer_t *d = make_dist(&m, k, o);
  train(&m, d, STEPS, rank * shard, shard, o->backward_passes_per_step, 1);
  is_int(STEPS, hvd_optimizer_steps(d), "%s: %d updates", what, STEPS);
  hvd_optimizer_destroy(d);
  reference(&ref, k, ref_lr_mult, 0, B);
  same_params(&m, &ref, TOL, what);
}

static void test_equivalence(void) {
  hvd_distributed_options_t o;
  char what[128];
  for (int k = SGD_MOMENTUM; k <= ADAMW; k++) {
    hvd_distributed_options_init(&o);
    snprintf(what, sizeof what, "%s, np %d", kind_names[k], size);
    check_dist(k, &o, 1.0, what);

    o.backward_passes_per_step = 2;
    snprintf(what, sizeof what, "%s, 2 passes of B/2", kind_names[k]);
    check_dist(k, &o, 1.0, what);
  }

  /* passes summed, not averaged: twice the gradient */
  hvd_distributed_options_init(&o);
  o.backward_passes_per_step = 2;
  o.average_passes = 0;
  check_dist(SGD_PLAIN, &o, 2.0, "SGD, 2 passes summed = lr x 2");

  hvd_distributed_options_init(&o);
  o.gradient_predivide_factor = 2.0;
  check_dist(SGD_MOMENTUM, &o, 1.0, "SGD momentum, predivide factor 2");
  o.backward_passes_per_step = 2;
  check_dist(ADAMW, &o, 1.0, "AdamW, predivide factor 2, 2 passes");

  /* SUM: size x the average gradient */
  hvd_distributed_options_init(&o);
  o.op = HVD_SUM;
  snprintf(what, sizeof what, "SGD, op sum = lr x %d", size);
  check_dist(SGD_PLAIN, &o, (double)size, what);
  o.gradient_predivide_factor = 4.0;
  snprintf(what, sizeof what, "SGD, op sum, predivide 4 = lr x %d", size);
  check_dist(SGD_PLAIN, &o, (double)size, what);

  /* o == NULL: the defaults */
  static model_t m, ref;
  model_init(&m);
  hvd_optimizer_t *d = NULL;
  must(hvd_distributed_optimizer(make_opt(&m, SGD_MOMENTUM, 1.0), NULL, &d),
       "distributed (defaults)");
  train(&m, d, STEPS, rank * (B / size), B / size, 1, 1);
  hvd_optimizer_destroy(d);
  reference(&ref, SGD_MOMENTUM, 1.0, 0, B);
  same_params(&m, &ref, TOL, "options NULL: the defaults");
}

/* no-sync: each rank's own gradients, no communication. */
static void test_no_sync(void) {
  static model_t m, ref;
  hvd_distributed_options_t o;
  int shard = B / size;

  hvd_distributed_options_init(&o);
  model_init(&m);
  hvd_optimizer_t *d = make_dist(&m, SGD_MOMENTUM, &o);
  is_int(HVD_SUCCESS, hvd_optimizer_set_sync(d, 0), "set_sync(0)");
  train(&m, d, STEPS, rank * shard, shard, 1, 1);
  reference(&ref, SGD_MOMENTUM, 1.0, rank * shard, shard);
  same_params(&m, &ref, 0, "no-sync: this rank's local reference, exactly");

  /* the ranks really differ (each its own shard) */
  float mine = m.w1[0], first = mine;
  MPI_Bcast(&first, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
  ok(size == 1 || rank == 0 || mine != first,
     "no-sync: results are rank-dependent");

  /* back to sync for one more step: it works and reduces */
  is_int(HVD_SUCCESS, hvd_optimizer_set_sync(d, 1), "set_sync(1)");
  must(hvd_optimizer_zero_grad(d), "zero_grad");
  backward(&m, STEPS, rank * shard, shard, d);
  is_int(HVD_SUCCESS, hvd_optimizer_step(d), "sync step after no-sync");
  is_int(STEPS + 1, hvd_optimizer_steps(d), "no-sync steps counted");
  hvd_optimizer_destroy(d);

  /* no-sync with 2 averaged passes = one pass over the shard */
  hvd_distributed_options_init(&o);
  o.backward_passes_per_step = 2;
  model_init(&m);
  d = make_dist(&m, ADAMW, &o);
  is_int(HVD_SUCCESS, hvd_optimizer_set_sync(d, 0), "set_sync(0), 2 passes");
  train(&m, d, STEPS, rank * shard, shard, 2, 1);
  hvd_optimizer_destroy(d);
  reference(&ref, ADAMW, 1.0, rank * shard, shard);
  same_params(&m, &ref, TOL, "no-sync, AdamW, 2 passes averaged");
}

/* x rounded to nearest-even with `bits` significand bits (f16: 11,
 * bf16: 8); f16's subnormals have the quantum 2^-24. */
static double round_bits(double x, int bits, int min_exp) {
  int e;
  if (x == 0)
    return 0;
  frexp(x, &e);
  double q = ldexp(1.0, e - bits > min_exp ? e - bits : min_exp);
  return nearbyint(x / q) * q;
}

/* One SGD step (lr 1, no momentum) from the start with compression c. */
static hvd_result_t one_step(model_t *m, hvd_compression_t c) {
  hvd_distributed_options_t o;
  hvd_sgd_options_t so;
  hvd_optimizer_t *base = NULL, *d = NULL;
  hvd_distributed_options_init(&o);
  o.compression = c;
  hvd_sgd_options_init(&so);
  so.lr = 1.0;
  model_init(m);
  must(hvd_sgd_create(m->p, NP, &so, &base), "sgd_create");
  must(hvd_distributed_optimizer(base, &o, &d), "distributed");
  must(hvd_optimizer_zero_grad(d), "zero_grad");
  backward(m, 0, rank * (B / size), B / size, d);
  hvd_result_t rc = hvd_optimizer_step(d);
  tap_note("%s", hvd_last_error());
  hvd_optimizer_destroy(d);
  return rc;
}

/* Compressed gradients: each element within the casts' error of the
 * averaged gradient rounded to the wire type, and not the uncompressed
 * update. */
static void test_compression(hvd_compression_t c, const char *cname) {
  static model_t m, plain, shards;
  static float gavg[NP][HID * IN], gabs[NP][HID * IN];
  int bits = c == HVD_COMPRESS_FP16 ? 11 : 8;
  int min_exp = c == HVD_COMPRESS_FP16 ? -24 : -133;
  double eps = ldexp(1.0, -bits);

  is_int(HVD_SUCCESS, one_step(&m, c), "%s: step", cname);
  must(one_step(&plain, HVD_COMPRESS_NONE), "uncompressed step");

  /* every shard's gradient, here: g_avg and mean |g_r| per element */
  memset(gavg, 0, sizeof gavg);
  memset(gabs, 0, sizeof gabs);
  for (int r = 0; r < size; r++) {
    model_init(&shards);
    backward(&shards, 0, r * (B / size), B / size, NULL);
    for (int i = 0; i < NP; i++) {
      const float *g = shards.p[i].grad.data;
      for (int64_t j = 0; j < hvd_tensor_numel(&shards.p[i].grad); j++) {
        gavg[i][j] += g[j] / (float)size;
        gabs[i][j] += fabsf(g[j]) / (float)size;
      }
    }
  }
  model_init(&shards); /* the starting values */
  double worst = 0;
  int changed = 0;
  for (int i = 0; i < NP; i++) {
    const float *v = m.p[i].value.data, *v0 = shards.p[i].value.data;
    const float *vu = plain.p[i].value.data;
    for (int64_t j = 0; j < hvd_tensor_numel(&m.p[i].value); j++) {
      double want = v0[j] - round_bits(gavg[i][j], bits, min_exp);
      /* each rank's cast, a rounding per partial sum between ranks,
       * ours and the cast back; float sums */
      double tol = eps * ((size + 1) * gabs[i][j] + 2 * fabs(gavg[i][j])) +
                   ldexp(1.0, min_exp) + 1e-6 * fabs(want);
      double e = fabs(v[j] - want) / tol;
      if (e > worst || isnan(e))
        worst = e;
      if (v[j] != vu[j])
        changed++;
    }
  }
  tap_note("largest error %.3g of the tolerance", worst);
  ok(worst <= 1.0, "%s: the averaged gradient rounded to the wire type", cname);
  tap_note("no element differs from the uncompressed update");
  ok(changed > 0, "%s: the gradient went over the wire compressed", cname);
}

/* Ranks disagree on a parameter's shape: every rank's step fails with the
 * engine's message, and no parameter changes. */
static void test_mismatch(void) {
  if (size < 2) {
    skip(6, "a mismatch needs 2 ranks");
    return;
  }
  float a[3] = {1, 2, 3}, ga[3] = {0}, w[5] = {4, 5, 6, 7, 8}, gw[5] = {0};
  int64_t sa[1] = {3}, sw[1] = {rank == 1 ? 5 : 4};
  hvd_param_t p[2] = {
      {"a", hvd_tensor_make(a, HVD_FLOAT32, 1, sa),
       hvd_tensor_make(ga, HVD_FLOAT32, 1, sa)},
      {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, sw),
       hvd_tensor_make(gw, HVD_FLOAT32, 1, sw)},
  };
  hvd_sgd_options_t so;
  hvd_optimizer_t *base = NULL, *d = NULL;
  hvd_sgd_options_init(&so);
  so.momentum = 0.9;
  must(hvd_sgd_create(p, 2, &so, &base), "sgd_create");
  must(hvd_distributed_optimizer(base, NULL, &d), "distributed");

  must(hvd_optimizer_zero_grad(d), "zero_grad");
  for (int j = 0; j < 3; j++)
    ga[j] = (float)(rank + j);
  for (int j = 0; j < 5; j++)
    gw[j] = (float)(rank - j);
  must(hvd_optimizer_grad_ready(d, 1), "grad_ready w");
  float a0[3], w0[5];
  memcpy(a0, a, sizeof a);
  memcpy(w0, w, sizeof w);
  hvd_result_t rc = hvd_optimizer_step(d);
  is_int(HVD_ERR_MISMATCH, rc, "mismatched shape: HVD_ERR_MISMATCH");
  is_string("allreduce 'hvd.grad.w': rank 0 shape [4] vs rank 1 shape [5]",
            hvd_last_error(), "mismatched shape: the engine's message");
  ok(memcmp(a, a0, sizeof a) == 0 && memcmp(w, w0, sizeof w) == 0,
     "mismatch: parameters bit-identical to before the step");
  is_int(0, hvd_optimizer_steps(d), "mismatch: no update counted");
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(d),
         "mismatch: nothing left in flight (zero_grad works)");
  rc = hvd_optimizer_step(d);
  is_int(HVD_ERR_MISMATCH, rc, "mismatch again on the next step");
  hvd_optimizer_destroy(d);
}

/* Ranks whose distributed optimizers compress differently (rank 1 float16
 * on the wire, the others none), or (passes) backward_passes_per_step 2
 * on rank 1 alone: every rank's step fails with the engine's message
 * naming each rank's value and the options that differ, and no parameter
 * changes. */
static void test_wire_mismatch(int passes) {
  if (size < 2) {
    skip(3, "a mismatch needs 2 ranks");
    return;
  }
  float a[3] = {1, 2, 3}, ga[3] = {0};
  int64_t sa[1] = {3};
  hvd_param_t p = {"a", hvd_tensor_make(a, HVD_FLOAT32, 1, sa),
                   hvd_tensor_make(ga, HVD_FLOAT32, 1, sa)};
  hvd_sgd_options_t so;
  hvd_distributed_options_t o;
  hvd_optimizer_t *base = NULL, *d = NULL;
  hvd_sgd_options_init(&so);
  hvd_distributed_options_init(&o);
  if (passes)
    o.backward_passes_per_step = rank == 1 ? 2 : 1;
  else
    o.compression = rank == 1 ? HVD_COMPRESS_FP16 : HVD_COMPRESS_NONE;
  must(hvd_sgd_create(&p, 1, &so, &base), "sgd_create");
  must(hvd_distributed_optimizer(base, &o, &d), "distributed");
  must(hvd_optimizer_zero_grad(d), "zero_grad");
  for (int j = 0; j < 3; j++)
    ga[j] = (float)(rank + j);
  const char *what = passes ? "backward_passes_per_step 2 on rank 1 alone"
                            : "compression on rank 1 alone";
  is_int(HVD_ERR_MISMATCH, hvd_optimizer_step(d), "%s: HVD_ERR_MISMATCH", what);
  is_string(passes ? "allreduce 'hvd.grad.a': rank 0 prescale 1 vs rank 1 "
                     "prescale 0.5 (the ranks' distributed optimizers differ "
                     "in backward_passes_per_step, average_passes or "
                     "gradient_predivide_factor)"
                   : "allreduce 'hvd.grad.a': rank 0 wire dtype float32 vs "
                     "rank 1 wire dtype float16 (the ranks' distributed "
                     "optimizers differ in compression)",
            hvd_last_error(),
            "%s: the message names the values and the options", what);
  ok(a[0] == 1 && a[1] == 2 && a[2] == 3, "the parameter is unchanged");
  hvd_optimizer_destroy(d);
}

static void test_errors(void) {
  static model_t m;
  hvd_distributed_options_t o;
  hvd_optimizer_t *plain, *d, *out = NULL;
  char plain_msg[1024];
  hvd_result_t rc;

  /* the plain optimizer's message for a second step */
  model_init(&m);
  plain = make_opt(&m, SGD_MOMENTUM, 1.0);
  must(hvd_optimizer_zero_grad(plain), "zero_grad");
  backward(&m, 0, 0, B, NULL);
  must(hvd_optimizer_step(plain), "plain step");
  rc = hvd_optimizer_step(plain);
  snprintf(plain_msg, sizeof plain_msg, "%s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, rc, "plain: second step without new gradients");

  rc = hvd_optimizer_grad_ready(plain, 0);
  is_int(HVD_ERR_INVALID_ARG, rc, "grad_ready on a plain optimizer");
  is_string("hvd_optimizer_grad_ready: not a distributed optimizer (see "
            "hvd_distributed_optimizer)",
            hvd_last_error(), "grad_ready on a plain optimizer: message");
  rc = hvd_optimizer_set_sync(plain, 0);
  is_int(HVD_ERR_INVALID_ARG, rc, "set_sync on a plain optimizer");

  /* options */
  struct {
    const char *what, *msg;
    hvd_distributed_options_t o;
  } bad[7];
  for (int i = 0; i < 7; i++)
    hvd_distributed_options_init(&bad[i].o);
  bad[0].o.op = HVD_MIN;
  bad[0].what = "op min";
  bad[0].msg = "hvd_distributed_optimizer: op min is not supported (average, "
               "sum or adasum)";
  bad[1].o.backward_passes_per_step = 0;
  bad[1].what = "0 passes";
  bad[1].msg = "hvd_distributed_optimizer: backward_passes_per_step 0 is "
               "below 1";
  bad[2].o.gradient_predivide_factor = 0;
  bad[2].what = "predivide 0";
  bad[2].msg = "hvd_distributed_optimizer: gradient_predivide_factor 0 is "
               "not a positive finite number";
  bad[3].o.gradient_predivide_factor = INFINITY;
  bad[3].what = "predivide inf";
  bad[3].msg = "hvd_distributed_optimizer: gradient_predivide_factor inf is "
               "not a positive finite number";
  bad[4].o.compression = (hvd_compression_t)7;
  bad[4].what = "compression 7";
  bad[4].msg = "hvd_distributed_optimizer: unknown compression 7";
  bad[5].o.average_passes = 2;
  bad[5].what = "average_passes 2";
  bad[5].msg = "hvd_distributed_optimizer: average_passes 2 is not 0 or 1";
  bad[6].o.reduce_fp32 = 2;
  bad[6].what = "reduce_fp32 2";
  bad[6].msg = "hvd_distributed_optimizer: reduce_fp32 2 is not 0 or 1";
  for (int i = 0; i < 7; i++) {
    rc = hvd_distributed_optimizer(plain, &bad[i].o, &out);
    is_int(HVD_ERR_INVALID_ARG, rc, "%s: HVD_ERR_INVALID_ARG", bad[i].what);
    is_string(bad[i].msg, hvd_last_error(), "%s: message", bad[i].what);
  }
  rc = hvd_distributed_optimizer(NULL, NULL, &out);
  is_int(HVD_ERR_INVALID_ARG, rc, "base NULL");
  rc = hvd_distributed_optimizer(plain, NULL, NULL);
  is_int(HVD_ERR_INVALID_ARG, rc, "out NULL");
  ok(out == NULL, "failures leave *out alone");

  /* plain stays the caller's after those failures */
  hvd_distributed_options_init(&o);
  must(hvd_distributed_optimizer(plain, &o, &d), "distributed");
  rc = hvd_distributed_optimizer(d, &o, &out);
  is_int(HVD_ERR_INVALID_ARG, rc, "base already distributed");
  is_string("hvd_distributed_optimizer: base is already a distributed "
            "optimizer",
            hvd_last_error(), "base already distributed: message");

  /* index out of range */
  rc = hvd_optimizer_grad_ready(d, NP);
  is_int(HVD_ERR_INVALID_ARG, rc, "grad_ready(%d)", NP);
  is_string("hvd_optimizer_grad_ready: index 4 is out of range for 4 "
            "parameters",
            hvd_last_error(), "grad_ready(%d): message", NP);
  rc = hvd_optimizer_grad_ready(d, -1);
  is_int(HVD_ERR_INVALID_ARG, rc, "grad_ready(-1)");
  rc = hvd_optimizer_set_sync(d, 2);
  is_int(HVD_ERR_INVALID_ARG, rc, "set_sync(2)");

  /* reductions in flight */
  must(hvd_optimizer_zero_grad(d), "zero_grad");
  backward(&m, 1, rank * (B / size), B / size, d);
  rc = hvd_optimizer_zero_grad(d);
  is_int(HVD_ERR_INVALID_ARG, rc, "zero_grad while reductions are in flight");
  is_string("hvd_optimizer_zero_grad: gradient reductions are in flight (call "
            "hvd_optimizer_step first)",
            hvd_last_error(), "zero_grad in flight: message");
  rc = hvd_optimizer_set_sync(d, 0);
  is_int(HVD_ERR_INVALID_ARG, rc, "set_sync(0) while reductions are in flight");
  is_int(HVD_SUCCESS, hvd_optimizer_set_sync(d, 1),
         "set_sync(1) in flight: no change, fine");
  rc = hvd_optimizer_grad_ready(d, 2);
  is_int(HVD_ERR_INVALID_ARG, rc, "grad_ready twice in one step (k = 1)");
  is_string("hvd_optimizer_grad_ready: the gradient of parameter 2 "
            "('fc2.weight') is already being reduced "
            "(backward_passes_per_step 1; call hvd_optimizer_step first)",
            hvd_last_error(), "grad_ready twice: message");
  rc = hvd_optimizer_step(d);
  is_int(HVD_SUCCESS, rc, "step completes the reductions");

  /* second step without new gradients: the plain step's message */
  rc = hvd_optimizer_step(d);
  is_int(HVD_ERR_INVALID_ARG, rc,
         "distributed: second step without new "
         "gradients");
  is_string(plain_msg, hvd_last_error(),
            "second step: the plain optimizer's message");
  is_int(2, hvd_optimizer_steps(d), "steps of the wrapped optimizer");

  /* destroy with reductions in flight waits for them */
  must(hvd_optimizer_zero_grad(d), "zero_grad");
  backward(&m, 2, rank * (B / size), B / size, d);
  hvd_optimizer_destroy(d);
  float x = 1, y = 0;
  int64_t one = 1;
  hvd_tensor_t tx = hvd_tensor_make(&x, HVD_FLOAT32, 1, &one);
  hvd_tensor_t ty = hvd_tensor_make(&y, HVD_FLOAT32, 1, &one);
  rc = hvd_allreduce("after.destroy", &tx, &ty, HVD_SUM, 1.0, 1.0);
  is_int(HVD_SUCCESS, rc, "destroy in flight: the engine goes on");
  is_double(size, y, 0, "destroy in flight: next allreduce right");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();

  /* before hvd_init */
  {
    static model_t m;
    hvd_optimizer_t *base = NULL, *d = NULL;
    model_init(&m);
    base = make_opt(&m, SGD_MOMENTUM, 1.0);
    hvd_result_t rc = hvd_distributed_optimizer(base, NULL, &d);
    is_int(HVD_ERR_NOT_INITIALIZED, rc, "before hvd_init: not initialized");
    is_string("hvd_distributed_optimizer: hvd_init() has not been called",
              hvd_last_error(), "before hvd_init: message");
    hvd_optimizer_destroy(base);
  }

  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  if (B % (2 * size) != 0)
    bail("B = %d does not split into 2 passes on %d ranks", B, size);

  test_equivalence();
  test_no_sync();
  test_errors();
  test_mismatch();
  test_wire_mismatch(0);
  test_wire_mismatch(1);
  test_compression(HVD_COMPRESS_FP16, "fp16");
  test_compression(HVD_COMPRESS_BF16, "bf16");

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
