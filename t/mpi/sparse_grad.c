/*
 * sparse_grad.c - hvd_optimizer_sparse_grad: an embedding table's gradient
 * as a dense share plus sparse rows, at every world size.
 *
 * Two parameters: "emb" [R x L] and "dense" [D]. On rank r the dense
 * shares are integers that depend on r, and the sparse rows (with a
 * repeat) are integers too, so that with HVD_SUM every expected gradient
 * is exact; HVD_AVERAGE is checked to 1e-6. The rows reach the optimizer
 * after the dense share was handed over (allgathered at the step), before
 * it (added and reduced with it), in a different order on different ranks,
 * with none on one rank, over two accumulated passes, in no-sync mode and
 * through a plain optimizer. Then every argument error with its message,
 * and nothing added by a refused call.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

#define R 5 /* rows of emb */
#define L 3 /* elements per row */
#define D 4 /* elements of dense */
#define NR 3 /* sparse rows per rank and pass */

static int rank, size;

typedef struct model {
  float emb[R * L], gemb[R * L], w[D], gw[D];
  hvd_param_t p[2];
} model_t;

static void model_init(model_t *m) {
  memset(m, 0, sizeof *m);
  int64_t es[2] = {R, L}, ds[1] = {D};
  m->p[0].name = "emb";
  m->p[0].value = hvd_tensor_make(m->emb, HVD_FLOAT32, 2, es);
  m->p[0].grad = hvd_tensor_make(m->gemb, HVD_FLOAT32, 2, es);
  m->p[1].name = "dense";
  m->p[1].value = hvd_tensor_make(m->w, HVD_FLOAT32, 1, ds);
  m->p[1].grad = hvd_tensor_make(m->gw, HVD_FLOAT32, 1, ds);
}

/* Rank r's pass `pass`: dense shares and sparse rows. */
static float dense_emb(int r, int pass, int i) {
  return (float)((r + 1) * (i + 1) + 100 * pass);
}
static float dense_w(int r, int pass, int i) {
  return (float)(r + i + 7 * pass);
}
static void sparse_rows(int r, int pass, int64_t rows[NR], float v[NR * L]) {
  rows[0] = (r + pass) % R;
  rows[1] = (r + 2) % R;
  rows[2] = (r + pass) % R; /* a repeat: both add */
  for (int k = 0; k < NR; k++)
    for (int j = 0; j < L; j++)
      v[k * L + j] = (float)(10 * (r + 1) + k * L + j + 1000 * pass);
}

#define ALL (-1)
/* The gradients expected after the step: the dense shares of the ranks in
 * mask `dense` and the rows of those in mask `sparse` (ALL: every rank),
 * passes 0..passes-1, times `scale`. */
static void expected(int dense, int sparse, int passes, double scale,
                     double e[R * L], double w[D]) {
  memset(e, 0, sizeof(double) * R * L);
  memset(w, 0, sizeof(double) * D);
  for (int r = 0; r < size; r++) {
    for (int pass = 0; pass < passes; pass++) {
      if (dense & (1 << r)) {
        for (int i = 0; i < R * L; i++)
          e[i] += dense_emb(r, pass, i);
        for (int i = 0; i < D; i++)
          w[i] += dense_w(r, pass, i);
      }
      if (!(sparse & (1 << r)))
        continue;
      int64_t rows[NR];
      float v[NR * L];
      sparse_rows(r, pass, rows, v);
      for (int k = 0; k < NR; k++)
        for (int j = 0; j < L; j++)
          e[rows[k] * L + j] += v[k * L + j];
    }
  }
  for (int i = 0; i < R * L; i++)
    e[i] *= scale;
  for (int i = 0; i < D; i++)
    w[i] *= scale;
}

static int close(double want, float got, double tol) {
  return fabs(want - got) <= tol * fmax(1.0, fabs(want));
}

static void check_grads(const model_t *m, const double e[R * L],
                        const double w[D], double tol, const char *what) {
  int bad = -1;
  for (int i = 0; i < R * L && bad < 0; i++)
    if (!close(e[i], m->gemb[i], tol))
      bad = i;
  if (bad >= 0)
    diag("%s: emb[%d] = %.9g, expected %.9g", what, bad, m->gemb[bad],
         e[bad]);
  ok(bad < 0, "%s: emb gradient", what);
  bad = -1;
  for (int i = 0; i < D && bad < 0; i++)
    if (!close(w[i], m->gw[i], tol))
      bad = i;
  if (bad >= 0)
    diag("%s: dense[%d] = %.9g, expected %.9g", what, bad, m->gw[bad], w[bad]);
  ok(bad < 0, "%s: dense gradient", what);
  /* SGD lr 1 from 0: the values are minus the gradients */
  int same = 1;
  for (int i = 0; i < R * L; i++)
    same &= m->emb[i] == -m->gemb[i];
  for (int i = 0; i < D; i++)
    same &= m->w[i] == -m->gw[i];
  ok(same, "%s: the update used them", what);
}

static hvd_optimizer_t *make(model_t *m, int distributed, hvd_op_t op,
                             int passes, int average_passes) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1.0;
  hvd_optimizer_t *base = NULL, *d = NULL;
  if (hvd_sgd_create(m->p, 2, &so, &base) != HVD_SUCCESS)
    bail("hvd_sgd_create: %s", hvd_last_error());
  if (!distributed)
    return base;
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.op = op;
  o.backward_passes_per_step = passes;
  o.average_passes = average_passes;
  if (hvd_distributed_optimizer(base, &o, &d) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  return d;
}

enum when { AFTER, BEFORE };

/* One backward pass: the dense shares added, then the rows handed over
 * `when` relative to emb's grad_ready (grad_ready only if distributed).
 * Rows: NR of them, or none (empty). */
static void pass_(model_t *m, hvd_optimizer_t *opt, int pass, enum when when,
                  int distributed, int empty, const char *what) {
  for (int i = 0; i < R * L; i++)
    m->gemb[i] += dense_emb(rank, pass, i);
  for (int i = 0; i < D; i++)
    m->gw[i] += dense_w(rank, pass, i);
  int64_t rows[NR];
  float v[NR * L];
  sparse_rows(rank, pass, rows, v);
  int64_t n = empty ? 0 : NR;
  hvd_result_t rc = HVD_SUCCESS, rs = HVD_SUCCESS;
  if (distributed && when == AFTER)
    rc = hvd_optimizer_grad_ready(opt, 0);
  rs = hvd_optimizer_sparse_grad(opt, 0, rows, n, v);
  if (distributed && when == BEFORE)
    rc = hvd_optimizer_grad_ready(opt, 0);
  if (distributed && rc == HVD_SUCCESS)
    rc = hvd_optimizer_grad_ready(opt, 1);
  if (rc != HVD_SUCCESS || rs != HVD_SUCCESS)
    diag("%s: %s", what, hvd_last_error());
  ok(rc == HVD_SUCCESS && rs == HVD_SUCCESS, "%s: pass %d handed over", what,
     pass);
}

static void step(hvd_optimizer_t *opt, const char *what) {
  hvd_result_t rc = hvd_optimizer_step(opt);
  if (rc != HVD_SUCCESS)
    diag("%s: %s", what, hvd_last_error());
  is_int(HVD_SUCCESS, rc, "%s: step", what);
}

static void test_orders(void) {
  static const struct {
    const char *what;
    hvd_op_t op;
    enum when mine; /* rank 0's; the others' is `others` */
    enum when others;
    int empty_rank; /* -1: none */
  } cases[] = {
      {"sum, rows after grad_ready", HVD_SUM, AFTER, AFTER, -1},
      {"sum, rows before grad_ready", HVD_SUM, BEFORE, BEFORE, -1},
      {"sum, rank 0 before, others after", HVD_SUM, BEFORE, AFTER, -1},
      {"sum, rank 0 after, others before", HVD_SUM, AFTER, BEFORE, -1},
      {"sum, no rows on the last rank", HVD_SUM, AFTER, AFTER, 0x7f},
      {"average, rows after grad_ready", HVD_AVERAGE, AFTER, AFTER, -1},
      {"average, rank 0 before, others after", HVD_AVERAGE, BEFORE, AFTER,
       -1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    static model_t m;
    double e[R * L], w[D];
    model_init(&m);
    hvd_optimizer_t *d = make(&m, 1, cases[c].op, 1, 1);
    int empty_rank = cases[c].empty_rank == 0x7f ? size - 1 : -1;
    pass_(&m, d, 0, rank == 0 ? cases[c].mine : cases[c].others, 1,
          rank == empty_rank, cases[c].what);
    step(d, cases[c].what);
    expected(ALL, empty_rank >= 0 ? ALL & ~(1 << empty_rank) : ALL, 1,
             cases[c].op == HVD_SUM ? 1.0 : 1.0 / size, e, w);
    check_grads(&m, e, w, cases[c].op == HVD_SUM ? 0 : 1e-6, cases[c].what);
    hvd_optimizer_destroy(d);
  }
}

static void test_passes(void) {
  static const struct {
    const char *what;
    int average_passes;
  } cases[] = {{"2 passes summed", 0}, {"2 passes averaged", 1}};
  for (int c = 0; c < 2; c++) {
    static model_t m;
    double e[R * L], w[D];
    model_init(&m);
    hvd_optimizer_t *d = make(&m, 1, HVD_SUM, 2, cases[c].average_passes);
    /* pass 0: the reduction has not started, the rows go in at once;
     * pass 1: grad_ready starts it, the rows are allgathered */
    pass_(&m, d, 0, AFTER, 1, 0, cases[c].what);
    pass_(&m, d, 1, AFTER, 1, 0, cases[c].what);
    step(d, cases[c].what);
    expected(ALL, ALL, 2, cases[c].average_passes ? 0.5 : 1.0, e, w);
    check_grads(&m, e, w, 0, cases[c].what);
    hvd_optimizer_destroy(d);
  }
}

static void test_local(void) {
  static model_t m;
  double e[R * L], w[D];
  /* no-sync: this rank's own */
  model_init(&m);
  hvd_optimizer_t *d = make(&m, 1, HVD_SUM, 1, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_set_sync(d, 0), "no-sync: set_sync(0)");
  pass_(&m, d, 0, AFTER, 1, 0, "no-sync");
  step(d, "no-sync");
  expected(1 << rank, 1 << rank, 1, 1.0, e, w);
  check_grads(&m, e, w, 0, "no-sync: this rank's rows only");
  hvd_optimizer_destroy(d);

  /* a plain optimizer adds them at once */
  model_init(&m);
  hvd_optimizer_t *p = make(&m, 0, HVD_SUM, 1, 1);
  pass_(&m, p, 0, AFTER, 0, 0, "plain");
  expected(1 << rank, 1 << rank, 1, 1.0, e, w);
  int same = 1;
  for (int i = 0; i < R * L; i++)
    same &= m.gemb[i] == (float)e[i];
  ok(same, "plain: the rows are in the gradient when the call returns");
  step(p, "plain");
  check_grads(&m, e, w, 0, "plain");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_step(p),
         "plain: no second step without new gradients");
  int64_t row = 1;
  float v[L] = {1, 2, 3};
  is_int(HVD_SUCCESS, hvd_optimizer_sparse_grad(p, 0, &row, 1, v),
         "plain: sparse rows count as new gradients");
  is_int(HVD_SUCCESS, hvd_optimizer_step(p), "plain: so a step may follow");
  hvd_optimizer_destroy(p);
}

static void test_errors(void) {
  static model_t m;
  model_init(&m);
  hvd_optimizer_t *d = make(&m, 1, HVD_SUM, 1, 1);
  int64_t rows[3] = {0, 7, 1};
  float v[3 * L] = {1, 1, 1, 2, 2, 2, 3, 3, 3};
  static const struct {
    const char *what;
    int index;
    int64_t nrows;
    int null_rows, null_values;
    hvd_result_t rc;
    const char *msg;
  } cases[] = {
      {"a row out of range", 0, 3, 0, 0, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: parameter 'emb': rows[1] is 7, outside "
       "0..4"},
      {"index out of range", 2, 1, 0, 0, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: index 2 is out of range for 2 "
       "parameters"},
      {"negative index", -1, 1, 0, 0, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: index -1 is out of range for 2 "
       "parameters"},
      {"negative nrows", 0, -1, 0, 0, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: parameter 'emb': nrows -1 is negative"},
      {"NULL rows", 0, 1, 1, 0, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: parameter 'emb': rows is NULL with 1 "
       "rows"},
      {"NULL values", 0, 1, 0, 1, HVD_ERR_INVALID_ARG,
       "hvd_optimizer_sparse_grad: parameter 'emb': values is NULL with 1 "
       "rows"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hvd_result_t rc = hvd_optimizer_sparse_grad(
        d, cases[c].index, cases[c].null_rows ? NULL : rows, cases[c].nrows,
        cases[c].null_values ? NULL : v);
    is_int(cases[c].rc, rc, "%s: code", cases[c].what);
    is_string(cases[c].msg, hvd_last_error(), "%s: message", cases[c].what);
  }
  int zero = 1;
  for (int i = 0; i < R * L; i++)
    zero &= m.gemb[i] == 0;
  ok(zero, "refused calls added nothing (not even the rows before the bad "
           "one)");
  is_int(HVD_SUCCESS, hvd_optimizer_sparse_grad(d, 0, rows, 0, NULL),
         "zero rows with NULL arrays");
  hvd_optimizer_destroy(d);

  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_sparse_grad(NULL, 0, rows, 1, v),
         "opt NULL: code");
  is_string("hvd_optimizer_sparse_grad: opt is NULL", hvd_last_error(),
            "opt NULL: message");

  /* a scalar has no rows */
  float s = 0, gs = 0;
  hvd_param_t sp = {.name = "scale",
                    .value = hvd_tensor_make(&s, HVD_FLOAT32, 0, NULL),
                    .grad = hvd_tensor_make(&gs, HVD_FLOAT32, 0, NULL)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  hvd_optimizer_t *p = NULL;
  if (hvd_sgd_create(&sp, 1, &so, &p) != HVD_SUCCESS)
    bail("hvd_sgd_create: %s", hvd_last_error());
  int64_t zero_row = 0;
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_sparse_grad(p, 0, &zero_row, 1, v),
         "a scalar parameter: code");
  is_string("hvd_optimizer_sparse_grad: parameter 'scale' has no rows (ndim "
            "0)",
            hvd_last_error(), "a scalar parameter: message");
  hvd_optimizer_destroy(p);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 30)
    bail("the rank masks hold 30 ranks, not %d", size);
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_orders();
  test_passes();
  test_local();
  test_errors();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
