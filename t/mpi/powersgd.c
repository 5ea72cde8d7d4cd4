/*
 * powersgd.c - the distributed optimizer's PowerSGD compression
 * (HVD_COMPRESS_POWERSGD, lib/optim/powersgd.c) at np 1..4.
 *
 * The model, float32, trained by SGD at lr 1 from zeros (so -w after a
 * step is the reduced gradient): "w" 12 x 20 and "x" 4 x 5 x 6 (a 4 x 30
 * matrix), whose gradients on every rank are of rank 2 with common left
 * factors, so that the ranks' mean A is of rank 2 too; "b" [12] and "s"
 * 3 x 4, general data. Which parameters are compressed follows the
 * documented rule (r (n + m) * 2 < n m): at rank 1 w and x, at rank 2 w
 * alone. Cases:
 *  - the defaults (DDP's: rank 1, start 1000, rate 2, error feedback,
 *    warm start, seed 0);
 *  - rank 2 recovers A (to 1e-5 of its largest value): PowerSGD is exact
 *    on a mean of rank <= r; the uncompressed parameters equal, bit for
 *    bit, an uncompressed optimizer's; the same bits on every rank;
 *  - rank 1 on rank-2 gradients: the first step's w is off A (by more
 *    than 1e-2), and a second step with zero gradients adds exactly what
 *    was left (error feedback: the two together are A to 1e-5), with and
 *    without warm start; without error feedback the second step moves
 *    nothing, bit for bit;
 *  - start_step 2: the first two steps are the uncompressed optimizer's
 *    bit for bit, the third is not;
 *  - op HVD_SUM with gradient_predivide_factor 2 recovers the sum;
 *    backward_passes_per_step 2 (the gradient holds two passes) the mean
 *    of one;
 *  - a NaN in the last rank's gradient: every rank's w is NaN after that
 *    step, and the error feedback of the step before survives it (a step
 *    with zero gradients then adds what the step before left);
 *  - a bfloat16 parameter with reduce_fp32: the rounded mean, to 3e-2;
 *  - powersgd.wire float16 and bfloat16: the mean to the wire's precision,
 *    the whole gradients a cast optimizer's bits;
 *  - hvd_optimizer_compression_stats: the values per step, exactly;
 *  - refusals with their messages: rank 0, start_step -1, a rate NAN,
 *    error_feedback 2, sharding, op adasum, a bfloat16 gradient without
 *    reduce_fp32, compression 4.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "psgd_model.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

/* Rank q's gradient of parameter k, element i, in double: for w and x a
 * sum of two outer products u_j v_jq^T with u_j the same on every rank. */
static double grad(int k, int q, int64_t i) {
  if (k == 1 || k == 2)
    return sin(0.37 * (double)(i + 1) * (q + 1)) + 0.2 * (q % 3) - 0.1 * k;
  int64_t m = psgd_shapes[k][1] * (psgd_ndims[k] > 2 ? psgd_shapes[k][2] : 1);
  int64_t a = i / m, b = i % m;
  double s = 0;
  for (int j = 0; j < 2; j++) {
    double u = sin(0.7 * (double)(a + 1) * (j + 1)) + 0.1 * j;
    double v = cos(0.3 * (double)(b + 1) * (j + 2) + q) * (1 + 0.5 * j);
    s += u * v;
  }
  return s;
}

/* The ranks' mean (or sum) of parameter k's gradient, element i. */
static double mean(int k, int64_t i, int sum) {
  double s = 0;
  for (int q = 0; q < size; q++)
    s += grad(k, q, i);
  return sum ? s : s / size;
}

static void set_grads(model_t *m, double times) {
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < m->len[k]; i++)
      m->g[k][i] = (float)(times * grad(k, rank, i));
}

static void zero_grads(model_t *m) {
  for (int k = 0; k < NP; k++)
    memset(m->g[k], 0, (size_t)m->len[k] * sizeof(float));
}

/* The largest |-w - want| over parameter k, relative to the largest
 * |want| (want: the mean, or the sum, times scale). */
static double off(const model_t *m, int k, int sum) {
  double worst = 0, big = 0;
  int nan = 0;
  for (int64_t i = 0; i < m->len[k]; i++) {
    double want = mean(k, i, sum), d = fabs(-(double)m->w[k][i] - want);
    nan |= isnan(d) != 0; /* fmax would drop it */
    worst = fmax(worst, d);
    big = fmax(big, fabs(want));
  }
  return nan ? NAN : worst / big;
}

static hvd_optimizer_t *make_opt(model_t *m,
                                 const hvd_distributed_options_t *d) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(m->p, NP, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, d, &opt) != HVD_SUCCESS)
    bail("powersgd optimizer: %s", hvd_last_error());
  return opt;
}

static hvd_distributed_options_t psgd(int r, int64_t start) {
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.compression = HVD_COMPRESS_POWERSGD;
  d.powersgd.rank = r;
  d.powersgd.start_step = start;
  return d;
}

/* A step, then hvd_optimizer_zero_grad for the next. */
static void step(hvd_optimizer_t *opt, const char *what) {
  if (hvd_optimizer_step(opt) != HVD_SUCCESS ||
      hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
    bail("%s: step: %s", what, hvd_last_error());
}

/* Rank 0's values of every parameter on every rank, bit for bit. */
static int same_everywhere(const model_t *m) {
  int same = 1;
  for (int k = 0; k < NP; k++) {
    const size_t bytes = (size_t)m->len[k] * sizeof(float);
    float *r0 = hvdt_calloc(bytes, 1);
    memcpy(r0, m->w[k], bytes);
    MPI_Bcast(r0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    same &= memcmp(r0, m->w[k], bytes) == 0;
    free(r0);
  }
  int all;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static int same_param(const model_t *a, const model_t *b, int k) {
  return memcmp(a->w[k], b->w[k], (size_t)a->len[k] * sizeof(float)) == 0;
}

/* An uncompressed optimizer's model after the given steps of gradients
 * times 1 (the reference for bits). */
static void reference(model_t *ref, int steps) {
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  psgd_model_make(ref, 0);
  hvd_optimizer_t *opt = make_opt(ref, &d);
  for (int s = 0; s < steps; s++) {
    set_grads(ref, 1);
    step(opt, "reference");
  }
  hvd_optimizer_destroy(opt);
}

static void test_defaults(void) {
  hvd_distributed_options_t d;
  memset(&d, 0x5a, sizeof d);
  hvd_distributed_options_init(&d);
  ok(d.powersgd.rank == 1 && d.powersgd.start_step == 1000 &&
         d.powersgd.min_compression_rate == 2.0 &&
         d.powersgd.error_feedback == 1 && d.powersgd.warm_start == 1 &&
         d.powersgd.seed == 0 && d.powersgd.wire == HVD_FLOAT32 &&
         d.compression == HVD_COMPRESS_NONE,
     "defaults: rank 1, start_step 1000, rate 2, error feedback, warm start, "
     "seed 0, a float32 wire (compression off)");
}

static void test_rank2(void) {
  model_t m, ref;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(2, 0);
  hvd_optimizer_t *opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "rank 2");
  double e = off(&m, 0, 0);
  ok(e <= 1e-5,
     "rank 2: w (12 x 20, compressed) is the ranks' mean of rank "
     "2 to 1e-5 (%.2g)",
     e);
  reference(&ref, 1);
  ok(same_param(&m, &ref, 1) && same_param(&m, &ref, 2) &&
         same_param(&m, &ref, 3),
     "rank 2: b, s and x (uncompressed: 4 x 30 at rank 2 saves too little) "
     "are an uncompressed optimizer's, bit for bit");
  ok(!same_param(&m, &ref, 0), "rank 2: w's bits are not the uncompressed "
                               "optimizer's (it was compressed)");
  ok(same_everywhere(&m), "rank 2: the same bits on every rank");
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
  psgd_model_drop(&ref);
}

/* Rank 1 on rank-2 gradients: step 1 leaves a residual that step 2 (zero
 * gradients) adds back through the error feedback. */
static void test_feedback(int warm) {
  model_t m;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(1, 0);
  d.powersgd.warm_start = warm;
  hvd_optimizer_t *opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "feedback");
  double e1w = off(&m, 0, 0), e1x = off(&m, 3, 0);
  ok(e1w > 1e-2 && e1x > 1e-2,
     "rank 1%s: step 1's w and x are low-rank approximations, off the mean "
     "by more than 1e-2 (%.2g, %.2g)",
     warm ? "" : ", no warm start", e1w, e1x);
  zero_grads(&m);
  step(opt, "feedback, step 2");
  double e2w = off(&m, 0, 0), e2x = off(&m, 3, 0);
  ok(e2w <= 1e-5 && e2x <= 1e-5,
     "rank 1%s: step 2 (zero gradients) adds what step 1 left: together the "
     "mean to 1e-5 (w %.2g, x %.2g)",
     warm ? "" : ", no warm start", e2w, e2x);
  ok(same_everywhere(&m), "rank 1%s: the same bits on every rank",
     warm ? "" : ", no warm start");
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

static void test_no_feedback(void) {
  model_t m;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(1, 0);
  d.powersgd.error_feedback = 0;
  hvd_optimizer_t *opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "no feedback");
  float *before = hvdt_calloc((size_t)m.len[0], sizeof(float));
  memcpy(before, m.w[0], (size_t)m.len[0] * sizeof(float));
  zero_grads(&m);
  step(opt, "no feedback, step 2");
  ok(memcmp(before, m.w[0], (size_t)m.len[0] * sizeof(float)) == 0,
     "no error feedback: a step of zero gradients leaves w as it was, bit "
     "for bit");
  free(before);
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

static void test_start_step(void) {
  model_t m, ref;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(1, 2);
  hvd_optimizer_t *opt = make_opt(&m, &d);
  for (int s = 1; s <= 3; s++) {
    set_grads(&m, 1);
    step(opt, "start_step");
    reference(&ref, s);
    int same = 1;
    for (int k = 0; k < NP; k++)
      same &= same_param(&m, &ref, k);
    if (s < 3)
      ok(same,
         "start_step 2: step %d is the uncompressed optimizer's, bit "
         "for bit",
         s);
    else
      ok(!same_param(&m, &ref, 0) && same_param(&m, &ref, 1),
         "start_step 2: step 3 compresses w (its bits differ), b is still "
         "the uncompressed one's");
    psgd_model_drop(&ref);
  }
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

static void test_scaling(void) {
  model_t m;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(2, 0);
  d.op = HVD_SUM;
  d.gradient_predivide_factor = 2;
  hvd_optimizer_t *opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "sum");
  double e = off(&m, 0, 1);
  ok(e <= 1e-5, "op sum, predivide 2: w is the ranks' sum to 1e-5 (%.2g)", e);
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);

  psgd_model_make(&m, 0);
  d = psgd(2, 0);
  d.backward_passes_per_step = 2;
  opt = make_opt(&m, &d);
  set_grads(&m, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_grad_ready(opt, 0), "two passes: pass 1");
  set_grads(&m, 2); /* the second pass accumulated */
  is_int(HVD_SUCCESS, hvd_optimizer_grad_ready(opt, 0), "two passes: pass 2");
  step(opt, "two passes");
  e = off(&m, 0, 0);
  ok(e <= 1e-5,
     "backward_passes_per_step 2: w is the mean of one pass to 1e-5 (%.2g)", e);
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

static void test_nonfinite(void) {
  model_t m;
  psgd_model_make(&m, 0);
  hvd_distributed_options_t d = psgd(1, 0);
  hvd_optimizer_t *opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "non-finite, step 1");
  float *w1 = hvdt_calloc((size_t)m.len[0], sizeof(float));
  memcpy(w1, m.w[0], (size_t)m.len[0] * sizeof(float));
  zero_grads(&m);
  if (rank == size - 1)
    m.g[0][17] = NAN;
  step(opt, "non-finite, step 2");
  int nan = 1;
  for (int64_t i = 0; i < m.len[0]; i++)
    nan &= isnan(m.w[0][i]) != 0;
  int all;
  MPI_Allreduce(&nan, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  ok(all,
     "a NaN in rank %d's gradient: every value of w is NaN on every "
     "rank",
     size - 1);
  memcpy(m.w[0], w1, (size_t)m.len[0] * sizeof(float));
  zero_grads(&m);
  step(opt, "non-finite, step 3");
  double e = off(&m, 0, 0);
  ok(e <= 1e-5,
     "after the NaN step, a step of zero gradients adds what step 1 left "
     "(the error feedback survived; a new Q): the mean to 1e-5 (%.2g)",
     e);
  free(w1);
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

/* bfloat16 parameter and gradient w (12 x 20) with reduce_fp32: the
 * float32 copy is what PowerSGD compresses, and the parameter is the
 * master rounded; rank 2 recovers the mean of the rounded gradients
 * (which are of rank 2 only to bfloat16's precision). */
static void test_bf16(void) {
  enum { L = 12 * 20 };
  uint16_t wb[L] = {0}, gb[L];
  hvd_param_t p = {"wb", hvd_tensor_make(wb, HVD_BFLOAT16, 2, psgd_shapes[0]),
                   hvd_tensor_make(gb, HVD_BFLOAT16, 2, psgd_shapes[0])};
  for (int64_t i = 0; i < L; i++)
    gb[i] = hvdt_f32_to_bf16((float)grad(0, rank, i));
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_distributed_options_t d = psgd(2, 0);
  d.reduce_fp32 = 1;
  if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("bfloat16: %s", hvd_last_error());
  step(opt, "bfloat16");
  double worst = 0, big = 0;
  for (int64_t i = 0; i < L; i++) {
    double want = 0;
    for (int q = 0; q < size; q++)
      want += hvdt_bf16_to_f32(hvdt_f32_to_bf16((float)grad(0, q, i)));
    want /= size;
    double diff = fabs(-(double)hvdt_bf16_to_f32(wb[i]) - want);
    worst = isnan(diff) ? INFINITY : fmax(worst, diff);
    big = fmax(big, fabs(want));
  }
  ok(worst / big <= 3e-2,
     "bfloat16 with reduce_fp32, rank 2: the parameter is the mean of the "
     "rounded gradients to 3e-2 (%.2g)",
     worst / big);
  hvd_optimizer_destroy(opt);
}

/* hvd_optimizer_compression_stats: 384 values in all (w 240, b 12, s 12,
 * x 120); at rank 2 w sends 2 (12 + 20) = 64 and x goes whole: 208; at
 * rank 1 (from step 1: the same before and after it) w 32 and x
 * 1 (4 + 30) = 34: 90; uncompressed 384; refusals. The state bytes: 4
 * per value of the error feedbacks (n m) and Qs (r m). */
/* powersgd.wire float16 and bfloat16 (DDP's fp16_compress_wrapper and
 * bf16_compress_wrapper around powerSGD_hook): at rank 2, w (compressed)
 * is the mean to the wire's precision, and not the float32 wire's bits;
 * b, s and x (whole) are an HVD_COMPRESS_FP16 / BF16 optimizer's, bit for
 * bit. */
static void test_wire(hvd_dtype_t wire, double tol) {
  model_t m, ref, f32;
  const char *wn = hvd_dtype_name(wire);
  hvd_distributed_options_t d = psgd(2, 0);
  psgd_model_make(&m, 0);
  psgd_model_make(&ref, 0);
  psgd_model_make(&f32, 0);
  hvd_optimizer_t *opt = make_opt(&f32, &d);
  set_grads(&f32, 1);
  step(opt, "wire float32");
  hvd_optimizer_destroy(opt);
  d.powersgd.wire = wire;
  opt = make_opt(&m, &d);
  set_grads(&m, 1);
  step(opt, "wire");
  hvd_optimizer_destroy(opt);
  hvd_distributed_options_init(&d);
  d.compression = wire == HVD_FLOAT16 ? HVD_COMPRESS_FP16 : HVD_COMPRESS_BF16;
  opt = make_opt(&ref, &d);
  set_grads(&ref, 1);
  step(opt, "wire reference");
  hvd_optimizer_destroy(opt);
  double e = off(&m, 0, 0);
  ok(e <= tol, "wire %s: w is the ranks' mean to %g (%.2g)", wn, tol, e);
  ok(size == 1 || !same_param(&m, &f32, 0),
     "wire %s: w's bits are not the float32 wire's", wn);
  ok(same_param(&m, &ref, 1) && same_param(&m, &ref, 2) &&
         same_param(&m, &ref, 3),
     "wire %s: b, s and x (whole) are the %s-compressed optimizer's, bit for "
     "bit",
     wn, wn);
  ok(same_everywhere(&m), "wire %s: the same bits on every rank", wn);
  psgd_model_drop(&m);
  psgd_model_drop(&ref);
  psgd_model_drop(&f32);
}

static void test_stats(void) {
  model_t m;
  psgd_model_make(&m, 0);
  int64_t before = -1, after = -1;
  hvd_distributed_options_t d = psgd(2, 0);
  hvd_optimizer_t *opt = make_opt(&m, &d);
  is_int(HVD_SUCCESS, hvd_optimizer_compression_stats(opt, &before, &after),
         "stats: rank 2");
  ok(before == 384 && after == 208,
     "stats: rank 2: 208 of 384 values a step (%lld, %lld)", (long long)after,
     (long long)before);
  is_int(4 * (240 + 2 * 20), hvd_optimizer_state_bytes(opt),
         "state bytes: rank 2: w's error feedback and Q (SGD has none)");
  hvd_optimizer_destroy(opt);
  d = psgd(1, 1);
  opt = make_opt(&m, &d);
  (void)hvd_optimizer_compression_stats(opt, &before, &after);
  ok(before == 384 && after == 90,
     "stats: rank 1 from step 1: 90 of 384 (w 32, x 34, b and s whole) "
     "(%lld)",
     (long long)after);
  set_grads(&m, 1);
  step(opt, "stats");
  (void)hvd_optimizer_compression_stats(opt, NULL, &after);
  is_int(90, (int)after, "stats: the same after its first step");
  is_int(4 * (240 + 20 + 120 + 30), hvd_optimizer_state_bytes(opt),
         "state bytes: rank 1: w's and x's error feedback and Q");
  hvd_optimizer_destroy(opt);
  d.powersgd.error_feedback = 0;
  opt = make_opt(&m, &d);
  is_int(4 * (20 + 30), hvd_optimizer_state_bytes(opt),
         "state bytes: rank 1 without error feedback: the Qs");
  hvd_optimizer_destroy(opt);
  hvd_distributed_options_init(&d);
  opt = make_opt(&m, &d);
  (void)hvd_optimizer_compression_stats(opt, &before, &after);
  ok(before == 384 && after == 384, "stats: uncompressed: 384 of 384");
  hvd_optimizer_destroy(opt);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  if (hvd_sgd_create(m.p, NP, &so, &opt) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_optimizer_compression_stats(opt, &before, &after),
               "hvd_optimizer_compression_stats: not a distributed optimizer",
               "stats of a plain optimizer");
  hvd_optimizer_destroy(opt);
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_optimizer_compression_stats(NULL, &before, &after),
               "hvd_optimizer_compression_stats: opt is NULL", "stats of NULL");
  psgd_model_drop(&m);
}

static void test_refusals(void) {
  static const char fn[] = "hvd_distributed_optimizer: ";
  static const struct {
    const char *what, *msg;
    hvd_result_t rc;
  } bad[] = {
      {"rank 0", "powersgd.rank 0 is below 1", HVD_ERR_INVALID_ARG},
      {"start_step -1", "powersgd.start_step -1 is negative",
       HVD_ERR_INVALID_ARG},
      {"rate NAN",
       "powersgd.min_compression_rate nan is not a finite number "
       ">= 0",
       HVD_ERR_INVALID_ARG},
      {"error_feedback 2", "powersgd.error_feedback 2 is not 0 or 1",
       HVD_ERR_INVALID_ARG},
      {"sharded",
       "shard_optimizer_state reduce-scatters float32 gradients: "
       "no compression",
       HVD_ERR_UNSUPPORTED},
      {"adasum",
       "op adasum combines whole gradients as they are: no "
       "compression",
       HVD_ERR_UNSUPPORTED},
      {"compression 4", "unknown compression 4", HVD_ERR_INVALID_ARG},
      {"wire int32", "powersgd.wire int32 is not float32, float16 or bfloat16",
       HVD_ERR_INVALID_ARG},
  };
  model_t m;
  psgd_model_make(&m, 0);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  for (int k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
    hvd_distributed_options_t d = psgd(1, 0);
    if (k == 0)
      d.powersgd.rank = 0;
    if (k == 1)
      d.powersgd.start_step = -1;
    if (k == 2)
      d.powersgd.min_compression_rate = NAN;
    if (k == 3)
      d.powersgd.error_feedback = 2;
    if (k == 4)
      d.shard_optimizer_state = 1;
    if (k == 5)
      d.op = HVD_ADASUM;
    if (k == 6)
      d.compression = (hvd_compression_t)4;
    if (k == 7)
      d.powersgd.wire = HVD_INT32;
    hvd_optimizer_t *base = NULL, *opt = NULL;
    if (hvd_sgd_create(m.p, NP, &so, &base) != HVD_SUCCESS)
      bail("sgd: %s", hvd_last_error());
    char want[256];
    snprintf(want, sizeof want, "%s%s", fn, bad[k].msg);
    hvdt_refused(bad[k].rc, hvd_distributed_optimizer(base, &d, &opt), want,
                 bad[k].what);
    hvd_optimizer_destroy(base);
  }
  /* a bfloat16 gradient of a compressed shape */
  uint16_t wb[240] = {0}, gb[240] = {0};
  hvd_param_t p = {"wb", hvd_tensor_make(wb, HVD_BFLOAT16, 2, psgd_shapes[0]),
                   hvd_tensor_make(gb, HVD_BFLOAT16, 2, psgd_shapes[0])};
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS)
    bail("sgd bf16: %s", hvd_last_error());
  hvd_distributed_options_t d = psgd(1, 0);
  hvdt_refused(HVD_ERR_UNSUPPORTED, hvd_distributed_optimizer(base, &d, &opt),
               "hvd_distributed_optimizer: compression powersgd compresses "
               "float32 gradients (set reduce_fp32 for float16/bfloat16 "
               "ones); parameter 'wb' has bfloat16",
               "bfloat16 gradient");
  d.reduce_fp32 = 1;
  is_int(HVD_SUCCESS, hvd_distributed_optimizer(base, &d, &opt),
         "bfloat16 gradient with reduce_fp32: accepted");
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_defaults();
  test_rank2();
  test_feedback(1);
  test_feedback(0);
  test_no_feedback();
  test_start_step();
  test_scaling();
  test_nonfinite();
  test_bf16();
  test_wire(HVD_FLOAT16, 4e-3);
  test_wire(HVD_BFLOAT16, 3e-2);
  test_stats();
  test_refusals();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
