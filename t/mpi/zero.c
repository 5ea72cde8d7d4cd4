/*
 * zero.c - the sharded distributed optimizer (shard_optimizer_state, ZeRO
 * stage 1) gives the parameters the unsharded one gives, keeps 1/size of
 * the state on each rank, and writes and reads the same checkpoints.
 *
 * Five parameters of awkward sizes (35, 5, 21, 3 and 1 elements: blocks of
 * unequal length, and empty ones at np > 1) get gradients that depend on
 * the rank and the step. Both optimizers run side by side in one program
 * on the same gradients: AdamW and SGD with momentum, 20 steps, also
 * accumulating 2 passes; then checkpoints crossed between them (a sharded
 * save loaded unsharded and the reverse, training on), the state
 * broadcast, and the errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "hvd.h"
#include "tap/tap.h"

#define NP 5
#define STEPS 20
static const int64_t numel[NP] = {35, 5, 21, 3, 1};
static const char *const pnames[NP] = {"a", "b", "c", "d", "e"};
static int rank, size;

typedef struct model {
  float v[NP][35], g[NP][35];
  hvd_param_t p[NP];
} model_t;

static void model_init(model_t *m) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < NP; i++) {
    for (int j = 0; j < numel[i]; j++)
      m->v[i][j] = (float)(0.1 * sin(1.0 + i + 0.37 * j));
    m->p[i].name = pnames[i];
    m->p[i].value = hvd_tensor_make(m->v[i], HVD_FLOAT32, 1, &numel[i]);
    m->p[i].grad = hvd_tensor_make(m->g[i], HVD_FLOAT32, 1, &numel[i]);
  }
}

enum kind { ADAMW, SGDM };

static hvd_optimizer_t *make(model_t *m, enum kind k, int shard, int passes) {
  hvd_optimizer_t *base = NULL, *d = NULL;
  hvd_result_t rc;
  if (k == ADAMW) {
    hvd_adam_options_t o;
    hvd_adam_options_init(&o);
    o.lr = 0.01, o.weight_decay = 0.01, o.decoupled = 1;
    rc = hvd_adam_create(m->p, NP, &o, &base);
  } else {
    hvd_sgd_options_t o;
    hvd_sgd_options_init(&o);
    o.lr = 0.05, o.momentum = 0.9;
    rc = hvd_sgd_create(m->p, NP, &o, &base);
  }
  if (rc != HVD_SUCCESS)
    bail("create: %s", hvd_last_error());
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.shard_optimizer_state = shard;
  o.backward_passes_per_step = passes;
  if (hvd_distributed_optimizer(base, &o, &d) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  return d;
}

/* One backward pass of step s, pass q: gradients added, grad_ready for
 * each parameter in reverse order. */
static void backward(model_t *m, hvd_optimizer_t *opt, int s, int q) {
  for (int i = NP - 1; i >= 0; i--) {
    for (int j = 0; j < numel[i]; j++)
      m->g[i][j] +=
          (float)(cos(0.3 * s + 0.7 * rank + 0.11 * j + i + 0.5 * q) +
                  0.01 * m->v[i][j]);
    if (hvd_optimizer_grad_ready(opt, i) != HVD_SUCCESS)
      bail("grad_ready: %s", hvd_last_error());
  }
}

static void train(model_t *m, hvd_optimizer_t *opt, int from, int steps,
                  int passes) {
  for (int s = from; s < from + steps; s++) {
    if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      bail("zero_grad: %s", hvd_last_error());
    for (int q = 0; q < passes; q++)
      backward(m, opt, s, q);
    if (hvd_optimizer_step(opt) != HVD_SUCCESS)
      bail("step %d: %s", s, hvd_last_error());
  }
}

static double max_diff(const model_t *a, const model_t *b) {
  double worst = 0;
  for (int i = 0; i < NP; i++)
    for (int j = 0; j < numel[i]; j++)
      worst = fmax(worst, fabs(a->v[i][j] - b->v[i][j]));
  return worst;
}

static void test_equivalence(enum kind k, int passes) {
  static model_t ms, mu;
  const char *what = k == ADAMW ? "AdamW" : "SGD momentum";
  model_init(&ms);
  model_init(&mu);
  hvd_optimizer_t *s = make(&ms, k, 1, passes), *u = make(&mu, k, 0, passes);
  train(&ms, s, 0, STEPS, passes);
  train(&mu, u, 0, STEPS, passes);
  double d = max_diff(&ms, &mu);
  ok(d <= 1e-6, "%s, %d pass%s, %d steps: sharded = unsharded (max diff %.1e)",
     what, passes, passes > 1 ? "es" : "", STEPS, d);
  /* every rank holds the same parameters */
  float first[35];
  memcpy(first, ms.v[0], sizeof first);
  MPI_Bcast(first, 35, MPI_FLOAT, 0, MPI_COMM_WORLD);
  ok(memcmp(first, ms.v[0], sizeof first) == 0,
     "%s: the allgathered parameters are the same on every rank", what);
  is_int(STEPS, hvd_optimizer_steps(s), "%s: steps counted", what);

  /* the state: this rank's blocks, about 1/size of the whole */
  int64_t mine = 0, whole = 0, ns = k == ADAMW ? 2 : 1;
  for (int i = 0; i < NP; i++) {
    int64_t q = numel[i] / size, r = numel[i] % size;
    mine += (q + (rank < r)) * 4 * ns;
    whole += numel[i] * 4 * ns;
  }
  is_int(mine, hvd_optimizer_state_bytes(s), "%s: sharded state bytes",
         what);
  is_int(whole, hvd_optimizer_state_bytes(u), "%s: unsharded state bytes",
         what);
  long long sum = 0, one = hvd_optimizer_state_bytes(s);
  MPI_Allreduce(&one, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  is_int(whole, sum, "%s: the ranks' blocks add up to the whole state", what);
  if (rank == 0)
    tap_note("%s: optimizer state per rank %lld bytes sharded, %lld unsharded",
             what, (long long)mine, (long long)whole);
  hvd_optimizer_destroy(s);
  hvd_optimizer_destroy(u);
}

static void test_checkpoints(void) {
  static model_t ms, mu, ms2, mu2;
  char a[256], b[256];
  int id = 0;
  if (rank == 0)
    id = (int)getpid();
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  snprintf(a, sizeof a, "/tmp/hvd-zero-%d-sharded.ckpt", id);
  snprintf(b, sizeof b, "/tmp/hvd-zero-%d-unsharded.ckpt", id);
  model_init(&ms);
  model_init(&mu);
  hvd_optimizer_t *s = make(&ms, ADAMW, 1, 1), *u = make(&mu, ADAMW, 0, 1);
  train(&ms, s, 0, 10, 1);
  train(&mu, u, 0, 10, 1);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(a, ms.p, NP, s, 10),
         "save from the sharded optimizer");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(b, mu.p, NP, u, 10),
         "save from the unsharded one");
  ok(hvd_optimizer_state_bytes(s) < hvd_optimizer_state_bytes(u) ||
         size == 1,
     "after the save the sharded optimizer holds its blocks only again");

  /* crossed: the sharded file into an unsharded optimizer, and back */
  model_init(&ms2);
  model_init(&mu2);
  hvd_optimizer_t *u2 = make(&mu2, ADAMW, 0, 1), *s2 = make(&ms2, ADAMW, 1, 1);
  int64_t step = -1;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(a, mu2.p, NP, u2, &step),
         "the sharded save loads into an unsharded optimizer");
  is_int(10, step, "  at its step");
  is_int(HVD_SUCCESS, hvd_checkpoint_load(b, ms2.p, NP, s2, &step),
         "the unsharded save loads into a sharded optimizer");
  train(&ms, s, 10, 10, 1);
  train(&mu, u, 10, 10, 1);
  train(&mu2, u2, 10, 10, 1);
  train(&ms2, s2, 10, 10, 1);
  double d1 = max_diff(&mu2, &mu), d2 = max_diff(&ms2, &mu),
         d3 = max_diff(&ms, &mu);
  ok(d1 <= 1e-6 && d2 <= 1e-6 && d3 <= 1e-6,
     "10 more steps from either file, sharded or not, agree (%.1e, %.1e, "
     "%.1e)",
     d1, d2, d3);
  is_int(hvd_optimizer_state_bytes(s), hvd_optimizer_state_bytes(s2),
         "the sharded optimizer that loaded holds its blocks only");

  /* the state broadcast: root's scalars reach every rank */
  hvd_optimizer_set_lr(s, rank == 0 ? 0.25 : 0.5);
  is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(s, 0),
         "broadcast of a sharded optimizer's state");
  ok(hvd_optimizer_lr(s) == 0.25, "  rank 0's learning rate everywhere");
  hvd_optimizer_destroy(s);
  hvd_optimizer_destroy(u);
  hvd_optimizer_destroy(s2);
  hvd_optimizer_destroy(u2);
  if (rank == 0) {
    unlink(a);
    unlink(b);
  }
}

static void test_errors(void) {
  static model_t m;
  model_init(&m);
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  hvd_optimizer_t *base = NULL, *d = NULL;
  hvd_distributed_options_t o;
  if (hvd_adam_create(m.p, NP, &ao, &base) != HVD_SUCCESS)
    bail("create: %s", hvd_last_error());
  hvd_distributed_options_init(&o);
  o.shard_optimizer_state = 1;
  o.compression = HVD_COMPRESS_FP16;
  is_int(HVD_ERR_UNSUPPORTED, hvd_distributed_optimizer(base, &o, &d),
         "sharded with fp16 compression: code");
  is_string("hvd_distributed_optimizer: shard_optimizer_state reduce-scatters "
            "float32 gradients: no compression",
            hvd_last_error(), "sharded with fp16 compression: message");
  o.compression = HVD_COMPRESS_NONE;
  o.shard_optimizer_state = 2;
  is_int(HVD_ERR_INVALID_ARG, hvd_distributed_optimizer(base, &o, &d),
         "shard_optimizer_state 2: code");
  is_string("hvd_distributed_optimizer: shard_optimizer_state 2 is not 0 or 1",
            hvd_last_error(), "shard_optimizer_state 2: message");
  o.shard_optimizer_state = 1;
  is_int(HVD_SUCCESS, hvd_distributed_optimizer(base, &o, &d),
         "the base is still whole after the refusals");
  is_int(HVD_ERR_UNSUPPORTED, hvd_optimizer_set_sync(d, 0), "no-sync: code");
  is_string("hvd_optimizer_set_sync: a sharded optimizer has no no-sync mode "
            "(each rank updates only its shard)",
            hvd_last_error(), "no-sync: message");
  int64_t row = 0;
  float v = 1;
  hvd_optimizer_zero_grad(d);
  is_int(HVD_SUCCESS, hvd_optimizer_sparse_grad(d, 4, &row, 1, &v),
         "sparse rows before grad_ready are taken");
  for (int i = NP - 1; i >= 0; i--)
    hvd_optimizer_grad_ready(d, i);
  is_int(HVD_ERR_UNSUPPORTED, hvd_optimizer_sparse_grad(d, 4, &row, 1, &v),
         "sparse rows after grad_ready: code");
  is_string("hvd_optimizer_sparse_grad: parameter 'e': its reduction started, "
            "and a sharded optimizer takes no rows after that (hand them over "
            "before hvd_optimizer_grad_ready)",
            hvd_last_error(), "sparse rows after grad_ready: message");
  is_int(HVD_SUCCESS, hvd_optimizer_step(d), "the step still runs");
  hvd_optimizer_destroy(d);
  is_int(-1, hvd_optimizer_state_bytes(NULL), "state bytes of NULL: -1");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_equivalence(ADAMW, 1);
  test_equivalence(SGDM, 1);
  test_equivalence(ADAMW, 2);
  test_checkpoints();
  test_errors();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
