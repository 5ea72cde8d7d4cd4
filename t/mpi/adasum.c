/*
 * adasum.c - HVD_ADASUM (Horovod's Adasum, lib/ops/adasum.c) at np 1..4.
 *
 *  - orthogonal tensors (rank r holds e_r) add up: every rank gets 1 at
 *    indices 0..size-1, exactly;
 *  - equal tensors give themselves back, exactly;
 *  - general float32 and float64 data against a reference written here
 *    from the paper's formula over the documented tree (2e-6 and 1e-13
 *    relative), the same bits on every rank and in a second run;
 *  - a grouped allreduce of three tensors: each combined on its own (the
 *    bits of three single allreduces);
 *  - prescale 2 and postscale 0.5 give the plain result's bits (Adasum is
 *    homogeneous of degree 1);
 *  - a rank with zeros, and a rank that joined (hvd_join: zeros too);
 *  - a process set of ranks 1..size-1 (its own tree, set ranks);
 *  - the distributed optimizer with op HVD_ADASUM: plain SGD (lr 1) on
 *    orthogonal gradients moves the weights by their sum; sparse rows
 *    after grad_ready are refused;
 *  - refusals with their messages: int32 and float16 tensors, a
 *    reducescatter, and the distributed optimizer with sharding,
 *    compression, a predivide factor or a bfloat16 gradient without
 *    reduce_fp32 (accepted with it).
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

/* Rank q's general data, element i. */
static double gen(int q, int64_t i) {
  return sin(0.37 * (double)(i + 1) * (q + 1)) + 0.25 * (double)(q % 3) -
         (i % 5 == q % 5 ? 0.5 : 0);
}

/* The paper's adasum(a, b) into a, in double: (1 - a.b / 2|a|^2) a +
 * (1 - a.b / 2|b|^2) b (a zero side's coefficient 1). */
static void ref_combine(double *a, const double *b, int64_t n) {
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; i++)
    dot += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1;
  const double cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
  for (int64_t i = 0; i < n; i++)
    a[i] = ca * a[i] + cb * b[i];
}

/* The documented tree over every rank's vector v[q] (n elements), in
 * double; the result in v[0]. */
static void ref_tree(double **v, int64_t n) {
  int p2 = 1;
  while (p2 * 2 <= size)
    p2 *= 2;
  for (int r = p2; r < size; r++)
    ref_combine(v[r - p2], v[r], n);
  for (int d = 1; d < p2; d *= 2)
    for (int r = 0; r < p2; r++)
      if ((r & d) == 0) { /* the pair (r, r + d): both get the result */
        ref_combine(v[r], v[r + d], n);
        memcpy(v[r + d], v[r], (size_t)n * sizeof(double));
      }
}

/* 1 when every rank's bytes equal rank 0's. */
static int same_everywhere(const void *p, size_t bytes) {
  void *r0 = hvdt_calloc(bytes, 1);
  memcpy(r0, p, bytes);
  MPI_Bcast(r0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = memcmp(r0, p, bytes) == 0, all;
  free(r0);
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

static hvd_result_t adasum(const char *name, void *x, hvd_dtype_t dt, int64_t n,
                           double pre, double post) {
  hvd_tensor_t t = hvd_tensor_make(x, dt, 1, &n);
  return hvd_allreduce(name, &t, &t, HVD_ADASUM, pre, post);
}

static void test_exact(void) {
  float e[8] = {0}, v[8];
  e[rank] = 1;
  is_int(HVD_SUCCESS, adasum("ortho", e, HVD_FLOAT32, 8, 1, 1),
         "orthogonal: allreduce");
  int good = 1;
  for (int i = 0; i < 8; i++)
    good &= e[i] == (i < size ? 1.0f : 0.0f);
  ok(good, "orthogonal tensors add up: 1 at 0..%d, exactly", size - 1);
  for (int i = 0; i < 8; i++)
    v[i] = (float)(i % 7 - 3) / 4;
  is_int(HVD_SUCCESS, adasum("equal", v, HVD_FLOAT32, 8, 1, 1),
         "equal: allreduce");
  good = 1;
  for (int i = 0; i < 8; i++)
    good &= v[i] == (float)(i % 7 - 3) / 4;
  ok(good, "equal tensors give themselves back, exactly");
}

/* n elements of general data in dtype dt against the reference. */
static void test_general(hvd_dtype_t dt, int64_t n, double tol) {
  const char *dn = hvd_dtype_name(dt);
  const size_t es = hvd_dtype_size(dt);
  double **v = hvdt_calloc((size_t)size, sizeof *v);
  for (int q = 0; q < size; q++) {
    v[q] = hvdt_calloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++)
      v[q][i] = dt == HVD_FLOAT32 ? (double)(float)gen(q, i) : gen(q, i);
  }
  ref_tree(v, n);
  void *x = hvdt_calloc((size_t)n, es), *y = hvdt_calloc((size_t)n, es);
  for (int64_t i = 0; i < n; i++)
    if (dt == HVD_FLOAT32)
      ((float *)x)[i] = (float)gen(rank, i);
    else
      ((double *)x)[i] = gen(rank, i);
  memcpy(y, x, (size_t)n * es);
  char name[64];
  snprintf(name, sizeof name, "general.%s", dn);
  is_int(HVD_SUCCESS, adasum(name, x, dt, n, 1, 1), "%s: allreduce", dn);
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(v[0][i]));
  for (int64_t i = 0; i < n; i++) {
    double got = dt == HVD_FLOAT32 ? ((float *)x)[i] : ((double *)x)[i];
    worst = fmax(worst, fabs(got - v[0][i]) / scale);
  }
  ok(worst <= tol, "%s, %lld elements: the reference's within %g (%.3g)", dn,
     (long long)n, tol, worst);
  ok(same_everywhere(x, (size_t)n * es), "%s: the same bits on every rank", dn);
  snprintf(name, sizeof name, "general.%s.again", dn);
  adasum(name, y, dt, n, 1, 1);
  ok(memcmp(x, y, (size_t)n * es) == 0, "%s: a second run, the same bits", dn);
  for (int q = 0; q < size; q++)
    free(v[q]);
  free(v);
  free(x);
  free(y);
}

static void test_group_and_scale(void) {
  enum { G = 3 };
  static const int64_t n[G] = {5, 300, 17};
  const char *names[G] = {"grp.a", "grp.b", "grp.c"};
  float *a[G], *b[G];
  hvd_tensor_t ta[G];
  for (int k = 0; k < G; k++) {
    a[k] = hvdt_calloc((size_t)n[k], sizeof(float));
    b[k] = hvdt_calloc((size_t)n[k], sizeof(float));
    for (int64_t i = 0; i < n[k]; i++)
      a[k][i] = b[k][i] = (float)gen(rank + k, i);
    ta[k] = hvd_tensor_make(a[k], HVD_FLOAT32, 1, &n[k]);
  }
  is_int(HVD_SUCCESS,
         hvd_grouped_allreduce(G, names, ta, ta, HVD_ADASUM, 1.0, 1.0),
         "grouped: three tensors");
  int same = 1;
  for (int k = 0; k < G; k++) {
    char name[32];
    snprintf(name, sizeof name, "one.%d", k);
    adasum(name, b[k], HVD_FLOAT32, n[k], 1, 1);
    same &= memcmp(a[k], b[k], (size_t)n[k] * sizeof(float)) == 0;
  }
  ok(same, "grouped: each tensor combined on its own (single calls' bits)");
  /* prescale 2, postscale 0.5: the same bits */
  for (int64_t i = 0; i < n[1]; i++)
    a[1][i] = (float)gen(rank + 1, i);
  is_int(HVD_SUCCESS, adasum("scaled", a[1], HVD_FLOAT32, n[1], 2.0, 0.5),
         "prescale 2, postscale 0.5");
  ok(memcmp(a[1], b[1], (size_t)n[1] * sizeof(float)) == 0,
     "prescale 2, postscale 0.5: the unscaled result's bits");
  for (int k = 0; k < G; k++)
    free(a[k]), free(b[k]);
}

static void test_zeros_and_join(void) {
  /* rank 0 holds zeros: it adds nothing to the others' tree */
  enum { Z = 64 };
  double **v = hvdt_calloc((size_t)size, sizeof *v);
  for (int q = 0; q < size; q++) {
    v[q] = hvdt_calloc(Z, sizeof(double));
    for (int i = 0; q > 0 && i < Z; i++)
      v[q][i] = (float)gen(q, i);
  }
  ref_tree(v, Z);
  float x[Z];
  for (int i = 0; i < Z; i++)
    x[i] = rank == 0 ? 0.0f : (float)gen(rank, i);
  is_int(HVD_SUCCESS, adasum("zeros", x, HVD_FLOAT32, Z, 1, 1),
         "a rank of zeros: allreduce");
  double worst = 0;
  for (int i = 0; i < Z; i++)
    worst = fmax(worst, fabs(x[i] - v[0][i]));
  ok(worst <= 2e-6 && (size != 2 || x[5] == (float)gen(1, 5)),
     "a rank of zeros: the reference's (%.3g; at np 2 rank 1's, exactly)",
     worst);
  ok(same_everywhere(x, sizeof x), "a rank of zeros: the same bits everywhere");
  for (int q = 0; q < size; q++)
    free(v[q]);
  free(v);
  if (size < 2) {
    skip(1, "a joined rank needs np >= 2");
    return;
  }
  /* the checks are collective (tap): recorded, and made after the join */
  int last = -1, good = 1;
  hvd_result_t rc = HVD_SUCCESS, jrc;
  if (rank < size - 1) {
    float e[4] = {0};
    e[rank % 4] = 1;
    rc = adasum("joined", e, HVD_FLOAT32, 4, 1, 1);
    for (int i = 0; i < 4; i++)
      good &= e[i] == (i < size - 1 ? 1.0f : 0.0f);
  }
  jrc = hvd_join(&last);
  is_int(HVD_SUCCESS, rc, "with a joined rank: allreduce");
  ok(good, "with a joined rank: its zeros add nothing (1 at 0..%d)", size - 2);
  is_int(HVD_SUCCESS, jrc, "then hvd_join");
  /* ranks 0..size-2 join after their allreduce, in an order of their own
   * (rank size-1 joined at once): the last is one of them, on every rank */
  ok(last >= 0 && last <= size - 2, "the last to join: rank %d of 0..%d",
     last, size - 2);
  ok(hvdt_same_on_all_ranks(&last, sizeof last),
     "... the same rank on every rank");
}

/* A process set of ranks 1..size-1: its own tree (at np 4 three ranks,
 * one folded in), ranks counted within the set. */
static void test_process_set(void) {
  if (size < 2) {
    skip(2, "a process set of ranks 1.. needs np >= 2");
    return;
  }
  int ranks[4], n = 0;
  for (int q = 1; q < size; q++)
    ranks[n++] = q;
  hvd_process_set_t *ps = NULL;
  if (hvd_process_set_create(ranks, n, &ps) != HVD_SUCCESS)
    bail("process set: %s", hvd_last_error());
  int good = 1;
  hvd_result_t rc = HVD_SUCCESS;
  if (rank > 0) {
    float e[4] = {0};
    int64_t four = 4;
    e[hvd_process_set_rank(ps)] = 1;
    hvd_tensor_t t = hvd_tensor_make(e, HVD_FLOAT32, 1, &four);
    rc = hvd_ps_allreduce(ps, "set", &t, &t, HVD_ADASUM, 1, 1);
    for (int i = 0; i < 4; i++)
      good &= e[i] == (i < n ? 1.0f : 0.0f);
  }
  is_int(HVD_SUCCESS, rc, "process set of %d: allreduce", n);
  ok(good, "process set of %d: orthogonal tensors add up (1 at 0..%d)", n,
     n - 1);
  hvd_process_set_destroy(ps);
}

static void test_optimizer(void) {
  int64_t n = 8;
  float w[8], g[8];
  for (int i = 0; i < 8; i++)
    w[i] = (float)i;
  hvd_param_t p = {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &n),
                   hvd_tensor_make(g, HVD_FLOAT32, 1, &n)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.op = HVD_ADASUM;
  if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("adasum optimizer: %s", hvd_last_error());
  memset(g, 0, sizeof g);
  g[rank] = 1;
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "optimizer: a step");
  int good = 1;
  for (int i = 0; i < 8; i++)
    good &= w[i] == (float)i - (i < size ? 1.0f : 0.0f);
  ok(good, "optimizer: SGD lr 1 moved w by the sum of orthogonal gradients");
  /* sparse rows after the reduction started cannot join a combination */
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "optimizer: zero_grad");
  is_int(HVD_SUCCESS, hvd_optimizer_grad_ready(opt, 0),
         "optimizer: grad_ready");
  const int64_t row = 1;
  const float one = 1;
  hvdt_refused(HVD_ERR_UNSUPPORTED,
               hvd_optimizer_sparse_grad(opt, 0, &row, 1, &one),
               "hvd_optimizer_sparse_grad: parameter 'w': its reduction "
               "started, and op adasum (whole gradients) takes no rows after "
               "that (hand them over before hvd_optimizer_grad_ready)",
               "optimizer: sparse rows after grad_ready");
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "optimizer: the step after");
  hvd_optimizer_destroy(opt);
  static const struct {
    const char *what, *msg;
  } bad[] = {
      {"sharded", "hvd_distributed_optimizer: op adasum combines whole "
                  "gradients as they are: no shard_optimizer_state"},
      {"compressed", "hvd_distributed_optimizer: op adasum combines whole "
                     "gradients as they are: no compression"},
      {"predivided", "hvd_distributed_optimizer: op adasum combines whole "
                     "gradients as they are: no gradient_predivide_factor "
                     "other than 1"},
  };
  for (int k = 0; k < 3; k++) {
    hvd_distributed_options_init(&d);
    d.op = HVD_ADASUM;
    d.shard_optimizer_state = k == 0;
    d.compression = k == 1 ? HVD_COMPRESS_FP16 : HVD_COMPRESS_NONE;
    d.gradient_predivide_factor = k == 2 ? 2.0 : 1.0;
    if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS)
      bail("sgd: %s", hvd_last_error());
    opt = NULL;
    hvdt_refused(HVD_ERR_UNSUPPORTED, hvd_distributed_optimizer(base, &d, &opt),
                 bad[k].msg, bad[k].what);
    hvd_optimizer_destroy(base);
  }
  /* a bfloat16 gradient without reduce_fp32 */
  uint16_t hv[4] = {0}, hg[4] = {0};
  const int64_t four = 4;
  hvd_param_t hp = {"h", hvd_tensor_make(hv, HVD_BFLOAT16, 1, &four),
                    hvd_tensor_make(hg, HVD_BFLOAT16, 1, &four)};
  hvd_distributed_options_init(&d);
  d.op = HVD_ADASUM;
  if (hvd_sgd_create(&hp, 1, &so, &base) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  opt = NULL;
  hvdt_refused(HVD_ERR_UNSUPPORTED, hvd_distributed_optimizer(base, &d, &opt),
               "hvd_distributed_optimizer: op adasum needs float32 gradients "
               "(set reduce_fp32 for float16/bfloat16 ones); parameter 'h' "
               "has bfloat16",
               "a bfloat16 gradient without reduce_fp32");
  d.reduce_fp32 = 1;
  is_int(HVD_SUCCESS, hvd_distributed_optimizer(base, &d, &opt),
         "... with reduce_fp32: accepted");
  hvd_optimizer_destroy(opt);
}

static void test_refusals(void) {
  int32_t i4[4] = {0};
  int64_t n = 4;
  hvd_tensor_t ti = hvd_tensor_make(i4, HVD_INT32, 1, &n);
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_allreduce("ints", &ti, &ti, HVD_ADASUM, 1, 1),
               "allreduce 'ints': HVD_ADASUM needs float32 or float64, not "
               "int32",
               "int32");
  uint16_t h[4] = {0};
  hvd_tensor_t th = hvd_tensor_make(h, HVD_FLOAT16, 1, &n);
  hvdt_refused(HVD_ERR_INVALID_ARG,
               hvd_allreduce("halves", &th, &th, HVD_ADASUM, 1, 1),
               "allreduce 'halves': HVD_ADASUM needs float32 or float64, not "
               "float16",
               "float16");
  float f[4] = {0};
  hvd_tensor_t tf = hvd_tensor_make(f, HVD_FLOAT32, 1, &n), out;
  memset(&out, 0, sizeof out);
  hvdt_refused(
      HVD_ERR_INVALID_ARG, hvd_reducescatter("rs", &tf, &out, HVD_ADASUM, 1, 1),
      "reducescatter 'rs': HVD_ADASUM is an allreduce op", "reducescatter");
  is_string("adasum", hvd_op_name(HVD_ADASUM), "hvd_op_name");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_exact();
  test_general(HVD_FLOAT32, 1000, 2e-6);
  test_general(HVD_FLOAT64, 333, 1e-13);
  test_group_and_scale();
  test_zeros_and_join();
  test_process_set();
  test_optimizer();
  test_refusals();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
