/*
 * mixed_shard.c - mixed precision's masters under ZeRO-1 and when the
 * values change behind the optimizer (hvd_broadcast_parameters), on host
 * parameters at np 1..4.
 *
 * The model is t/mpi/mixed.c's: one bfloat16 parameter w of N elements,
 * rank r's loss 0.5 * sum_i (w_i - t_r,i)^2, AdamW lr 0.02. Checks:
 *  - state bytes: a sharded optimizer holds 12 bytes an element of its
 *    block (two Adam moments and the float32 master), 12 * N over the
 *    ranks; an unsharded bfloat16 one 12 * N; a float32 one 8 * N;
 *  - a checkpoint of a sharded run after 6 steps is the unsharded run's
 *    file byte for byte; it loads into a fresh sharded and a fresh
 *    unsharded optimizer, and 4 more steps of each equal the runs that
 *    went on, bit for bit (also float16 with loss scaling);
 *  - hvd_state (memory) of a sharded bfloat16 run: commit, 2 steps,
 *    restore, the same 2 steps give the same values bit for bit; with a
 *    file, a fresh sharded optimizer (a relaunch) restores the commit
 *    and its next 2 steps equal the first run's bit for bit;
 *  - the values differ per rank when the optimizer is made (w = 0.5 +
 *    0.25 r), then hvd_broadcast_parameters from rank 0 and from the last
 *    rank: S steps equal the run that started with root's values on every
 *    rank, bit for bit, sharded and not (each master follows its new
 *    value);
 *  - hvd_broadcast_parameters after 5 steps, when the masters carry more
 *    than the values: 5 more steps equal the run without it, bit for bit
 *    (a master changes only where it no longer rounds to its value);
 *  - hvd_broadcast_optimizer_state sends the masters: rank 0 alone steps
 *    its master to 1 + 2^-10 (its bfloat16 value stays 1), the broadcast,
 *    then a step of -2^-8 gives 1 + 2^-7 on every rank (without rank 0's
 *    master the others would round the tie 1 + 2^-8 down to 1).
 */
#include "hvd.h"
#include "hvdtest.h"
#include "mixed_model.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 257
#define S 12

static int rank, size;
static char dir[512];

static float target(int r, int i) {
  return (float)(0.1 * (r + 1) + 0.001 * (i % 17)) * (i % 2 ? 1.0f : -1.0f);
}

/* k steps: zero, this rank's gradient times the loss scale, step. */
static int steps(model_t *m, hvd_optimizer_t *opt, int k) {
  int good = 1;
  for (int s = 0; s < k && good; s++) {
    good = hvd_optimizer_zero_grad(opt) == HVD_SUCCESS;
    double scale = hvd_optimizer_loss_scale(opt);
    for (int i = 0; i < N; i++) {
      float w = (float)hvdt_get(m->dt, m->w, i);
      hvdt_put(m->dt, m->g, i, (double)((w - target(rank, i)) * (float)scale));
    }
    if (good && hvd_optimizer_step(opt) != HVD_SUCCESS) {
      tap_note("step: %s", hvd_last_error());
      good = 0;
    }
  }
  return good;
}

static int same_values(const model_t *a, const model_t *b) {
  return memcmp(a->w, b->w, (size_t)N * hvdt_size(a->dt)) == 0;
}

static void test_bytes(void) {
  model_t a, b, c;
  model_make(&a, HVD_BFLOAT16, N, 0.5);
  model_make(&b, HVD_BFLOAT16, N, 0.5);
  model_make(&c, HVD_FLOAT32, N, 0.5);
  hvd_optimizer_t *sh = model_adamw(&a, 0, 0, 1), *un = model_adamw(&b, 0, 0, 0),
                  *f32 = model_adamw(&c, 0, 0, 0);
  long long mine = 12LL * (N / size + (rank < N % size));
  is_int(mine, hvd_optimizer_state_bytes(sh),
         "bytes: sharded bfloat16 holds 12 a block element");
  long long one = hvd_optimizer_state_bytes(sh), sum = one;
  int64_t cnt = 1;
  hvd_tensor_t t = hvd_tensor_make(&sum, HVD_INT64, 1, &cnt);
  if (hvd_allreduce("bytes.sum", &t, &t, HVD_SUM, 1, 1) != HVD_SUCCESS)
    bail("allreduce: %s", hvd_last_error());
  is_int(12LL * N, sum, "bytes: the ranks' blocks hold 12 * N");
  is_int(12LL * N, hvd_optimizer_state_bytes(un),
         "bytes: unsharded bfloat16 holds 12 * N (masters counted)");
  is_int(8LL * N, hvd_optimizer_state_bytes(f32),
         "bytes: float32 holds 8 * N (no masters)");
  hvd_optimizer_destroy(sh);
  hvd_optimizer_destroy(un);
  hvd_optimizer_destroy(f32);
  model_free(&a);
  model_free(&b);
  model_free(&c);
}

/* Sharded and unsharded runs of dt, 6 steps, saved; the files equal; each
 * loaded into fresh optimizers of both kinds, 4 steps: all four equal. */
static void test_checkpoint(hvd_dtype_t dt) {
  const char *what = dt == HVD_FLOAT16 ? "float16, scaled" : "bfloat16";
  int sc = dt == HVD_FLOAT16;
  char pa[600], pb[600];
  snprintf(pa, sizeof pa, "%s/sh.ckpt", dir);
  snprintf(pb, sizeof pb, "%s/un.ckpt", dir);
  model_t m[4];
  hvd_optimizer_t *o[4];
  for (int k = 0; k < 4; k++) {
    model_make(&m[k], dt, N, k < 2 ? 0.5 : 0.1);
    o[k] = model_adamw(&m[k], 0, sc, k % 2 == 0);
  }
  int good = steps(&m[0], o[0], 6) && steps(&m[1], o[1], 6) &&
             hvd_checkpoint_save(pa, &m[0].p, 1, o[0], 6) == HVD_SUCCESS &&
             hvd_checkpoint_save(pb, &m[1].p, 1, o[1], 6) == HVD_SUCCESS;
  ok(good, "checkpoint, %s: 6 steps sharded and not, saved", what);
  ok(rank != 0 || hvdt_same_file(pa, pb),
     "checkpoint, %s: the sharded run's file is the unsharded one's", what);
  good = hvd_checkpoint_load(pa, &m[2].p, 1, o[2], NULL) == HVD_SUCCESS &&
         hvd_checkpoint_load(pa, &m[3].p, 1, o[3], NULL) == HVD_SUCCESS;
  ok(good, "checkpoint, %s: loads into fresh sharded and unsharded", what);
  if (!good)
    tap_note("%s", hvd_last_error());
  for (int k = 0; k < 4; k++)
    good &= steps(&m[k], o[k], 4);
  ok(good && same_values(&m[0], &m[1]) && same_values(&m[0], &m[2]) &&
         same_values(&m[0], &m[3]),
     "checkpoint, %s: 4 more steps equal bit for bit (4 runs)", what);
  ok(hvd_optimizer_loss_scale(o[2]) == hvd_optimizer_loss_scale(o[0]) &&
         hvd_optimizer_steps(o[2]) == hvd_optimizer_steps(o[0]),
     "checkpoint, %s: scale %g and steps %lld restored", what,
     hvd_optimizer_loss_scale(o[2]), (long long)hvd_optimizer_steps(o[2]));
  for (int k = 0; k < 4; k++) {
    hvd_optimizer_destroy(o[k]);
    model_free(&m[k]);
  }
}

static void test_state(void) {
  model_t m;
  model_make(&m, HVD_BFLOAT16, N, 0.5);
  hvd_optimizer_t *opt = model_adamw(&m, 0, 0, 1);
  hvd_state_t *st = NULL;
  int good = hvd_state_create(NULL, 1, &st) == HVD_SUCCESS &&
             hvd_state_add_params(st, &m.p, 1, opt) == HVD_SUCCESS &&
             steps(&m, opt, 3) && hvd_state_commit(st) == HVD_SUCCESS &&
             steps(&m, opt, 2);
  char first[2 * N];
  memcpy(first, m.w, sizeof first);
  int restored = 0;
  good &= hvd_state_restore(st, &restored) == HVD_SUCCESS && restored == 1 &&
          steps(&m, opt, 2);
  ok(good, "state, sharded: commit, 2 steps, restore, 2 steps");
  ok(memcmp(first, m.w, sizeof first) == 0,
     "state, sharded: the same values after the restore, bit for bit");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(opt);
  model_free(&m);
}

/* hvd_state with a file (every commit) over a sharded bfloat16 AdamW: 3
 * steps, a commit (the file: each rank's master and state blocks
 * gathered on rank 0 a parameter at a time), 2 more steps; then, as a
 * relaunched job would, a fresh model and sharded optimizer and a fresh
 * state restore from the file: the values are the committed ones, and 2
 * steps from there equal the first run's 2 after its commit, bit for bit
 * (they need the masters' extra precision and the Adam state). */
static void test_state_file(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/state.ckpt", dir);
  model_t a, b;
  model_make(&a, HVD_BFLOAT16, N, 0.5);
  model_make(&b, HVD_BFLOAT16, N, 0.1);
  hvd_optimizer_t *oa = model_adamw(&a, 0, 0, 1), *ob = model_adamw(&b, 0, 0, 1);
  hvd_state_t *sa = NULL, *sb = NULL;
  int good = hvd_state_create(path, 1, &sa) == HVD_SUCCESS &&
             hvd_state_add_params(sa, &a.p, 1, oa) == HVD_SUCCESS &&
             steps(&a, oa, 3) && hvd_state_commit(sa) == HVD_SUCCESS;
  char committed[2 * N], after[2 * N];
  memcpy(committed, a.w, sizeof committed);
  good &= steps(&a, oa, 2);
  memcpy(after, a.w, sizeof after);
  ok(good, "state file, sharded: 3 steps, a commit to the file, 2 steps");
  int restored = 0;
  good = hvd_state_create(path, 1, &sb) == HVD_SUCCESS &&
         hvd_state_add_params(sb, &b.p, 1, ob) == HVD_SUCCESS &&
         hvd_state_restore(sb, &restored) == HVD_SUCCESS && restored == 1;
  if (!good)
    tap_note("%s", hvd_last_error());
  ok(good && memcmp(committed, b.w, sizeof committed) == 0,
     "state file, sharded: a fresh sharded optimizer restores the "
     "committed values from the file");
  ok(steps(&b, ob, 2) && memcmp(after, b.w, sizeof after) == 0,
     "state file, sharded: 2 steps from there equal the first run's, bit "
     "for bit");
  hvd_state_destroy(sa);
  hvd_state_destroy(sb);
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

/* Values that differ per rank at creation, then broadcast from root: the
 * run equals one that started from root's values everywhere. */
static void test_broadcast_values(int shard, int root) {
  const char *what = shard ? "sharded" : "unsharded";
  model_t a, b;
  model_make(&a, HVD_BFLOAT16, N, 0.5 + 0.25 * rank);
  model_make(&b, HVD_BFLOAT16, N, 0.5 + 0.25 * root);
  hvd_optimizer_t *oa = model_adamw(&a, 0, 0, shard), *ob = model_adamw(&b, 0, 0, shard);
  hvd_result_t rc = hvd_broadcast_parameters(&a.p, 1, root);
  is_int(HVD_SUCCESS, rc, "broadcast from %d, %s: parameters", root, what);
  int good = steps(&a, oa, S) && steps(&b, ob, S);
  ok(good && same_values(&a, &b),
     "broadcast from %d, %s: %d steps equal the run that began with rank "
     "%d's values, bit for bit",
     root, what, S, root);
  is_int(HVD_SUCCESS, hvd_verify_parameters(&a.p, 1),
         "broadcast from %d, %s: every rank holds the same values", root,
         what);
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

static void test_broadcast_keeps(int shard) {
  const char *what = shard ? "sharded" : "unsharded";
  model_t a, b;
  model_make(&a, HVD_BFLOAT16, N, 0.5);
  model_make(&b, HVD_BFLOAT16, N, 0.5);
  hvd_optimizer_t *oa = model_adamw(&a, 0, 0, shard), *ob = model_adamw(&b, 0, 0, shard);
  int good = steps(&a, oa, 5) && steps(&b, ob, 5) &&
             hvd_broadcast_parameters(&b.p, 1, 0) == HVD_SUCCESS &&
             steps(&a, oa, 5) && steps(&b, ob, 5);
  ok(good && same_values(&a, &b),
     "broadcast after 5 steps, %s: 5 more equal the run without it, bit for "
     "bit (the masters kept)",
     what);
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

/* One plain SGD step of gradient g (the same on every rank) with sync. */
static int sgd_step(hvd_optimizer_t *opt, uint16_t *g, double gv) {
  hvdt_put(HVD_BFLOAT16, g, 0, gv);
  return hvd_optimizer_step(opt) == HVD_SUCCESS;
}

static void test_broadcast_masters(void) {
  uint16_t w = 0, g = 0;
  int64_t one = 1;
  hvdt_put(HVD_BFLOAT16, &w, 0, 1.0);
  hvd_param_t p = {"w", hvd_tensor_make(&w, HVD_BFLOAT16, 1, &one),
                   hvd_tensor_make(&g, HVD_BFLOAT16, 1, &one)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 1.0;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, NULL, &opt) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  /* no sync: rank 0's master alone becomes 1 + 2^-10 (its value rounds
   * back to 1, as every other rank's) */
  int good = hvd_optimizer_set_sync(opt, 0) == HVD_SUCCESS &&
             sgd_step(opt, &g, rank == 0 ? -ldexp(1, -10) : 0.0) &&
             hvd_optimizer_set_sync(opt, 1) == HVD_SUCCESS;
  ok(good && hvdt_get(HVD_BFLOAT16, &w, 0) == 1.0,
     "masters: rank 0's master moved below a bfloat16 step, values 1");
  good = hvd_broadcast_parameters(&p, 1, 0) == HVD_SUCCESS &&
         hvd_broadcast_optimizer_state(opt, 0) == HVD_SUCCESS &&
         hvd_optimizer_zero_grad(opt) == HVD_SUCCESS &&
         sgd_step(opt, &g, -ldexp(1, -8));
  ok(good, "masters: broadcast, then a synchronised step");
  ok(hvdt_get(HVD_BFLOAT16, &w, 0) == 1.0 + ldexp(1, -7),
     "masters: 1 + 2^-7 on every rank: rank 0's master was broadcast (%.9g)",
     hvdt_get(HVD_BFLOAT16, &w, 0));
  hvd_optimizer_destroy(opt);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-mixed-shard");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_bytes();
  test_checkpoint(HVD_BFLOAT16);
  test_checkpoint(HVD_FLOAT16);
  test_state();
  test_state_file();
  for (int shard = 0; shard <= 1; shard++) {
    test_broadcast_values(shard, 0);
    test_broadcast_values(shard, size - 1);
    test_broadcast_keeps(shard);
  }
  test_broadcast_masters();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  hvdt_remove_tmpdir(dir);
  return tap_mpi_finish();
}
