/*
 * powersgd_ckpt.c - PowerSGD's state (error feedback, warm Q, draws) in
 * checkpoints and in hvd_state's commits (lib/optim/powersgd.c,
 * doc/checkpoint-format.md versions 3 and 4).
 *
 * The model of t/mpi/powersgd (w 12 x 20 and x 4 x 30 compressed at rank
 * 1, b and s whole), SGD at lr 1, PowerSGD at rank 1 from the second
 * step; rank q's gradient at step t is a rank-2 matrix whose right factors
 * depend on q + t, so the error feedback and the warm Q matter at every
 * step. With no argument (np 1..4, TAP):
 *  - resume: 3 steps, hvd_checkpoint_save, a new model and optimizer (one
 *    step of other gradients first, so that its PowerSGD state is stale),
 *    hvd_checkpoint_load, 2 steps: the uninterrupted 5 steps' values, bit
 *    for bit at np 1, to 2e-6 of the largest value at np >= 2 (the file
 *    holds the ranks' mean error feedback, which each rank gets back);
 *    the same bits on every rank;
 *  - the same resume from a file without the optimizer (PowerSGD afresh)
 *    ends off by more than 1e-3: the state matters;
 *  - the file is version 5; a plain distributed optimizer's too, with no
 *    PowerSGD record, and a file with records loads into one (the
 *    section is skipped);
 *  - hvd_state: a commit after 3 steps, 2 steps, a restore, the same 2
 *    steps: the same bits (this rank's own error feedback, exactly);
 *  - a record whose matrix view is not the program's: HVD_ERR_CORRUPT,
 *    its message, nothing changed.
 * "save FILE" (np 2) and "load FILE" (any np) are t/mpi/powersgd_ckpt.sh's
 * halves: every rank's gradient is the same there, so the training does
 * not depend on the world size, and a file saved at np 2 resumes at np N
 * as the uninterrupted run at np N does, to 2e-6.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "psgd_model.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 5
#define SAVE_AT 3
static int rank, size;
static int same_grads; /* every rank's gradient that of rank 0 */

/* Rank q's gradient of parameter k at step t, element i: for w and x a
 * sum of two outer products whose right factors move with q + t. */
static double grad(int k, int q, int t, int64_t i) {
  if (k == 1 || k == 2)
    return sin(0.37 * (double)(i + 1) * (q + 1) + t) - 0.1 * k;
  int64_t m = psgd_shapes[k][1] * (psgd_ndims[k] > 2 ? psgd_shapes[k][2] : 1);
  int64_t a = i / m, b = i % m;
  double s = 0;
  for (int j = 0; j < 2; j++) {
    double u = sin(0.7 * (double)(a + 1) * (j + 1)) + 0.1 * j;
    double v = cos(0.3 * (double)(b + 1) * (j + 2) + q + 0.6 * t);
    s += u * v * (1 + 0.5 * j);
  }
  return s;
}

static void set_grads(model_t *m, int t, double times) {
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < m->len[k]; i++)
      m->g[k][i] = (float)(times * grad(k, same_grads ? 0 : rank, t, i));
}

static hvd_optimizer_t *make_opt(model_t *m, int powersgd) {
  hvd_sgd_options_t so;
  hvd_distributed_options_t d;
  hvd_sgd_options_init(&so);
  so.lr = 1;
  hvd_distributed_options_init(&d);
  if (powersgd) {
    d.compression = HVD_COMPRESS_POWERSGD;
    d.powersgd.rank = 1;
    d.powersgd.start_step = 1;
  }
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(m->p, NP, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("optimizer: %s", hvd_last_error());
  return opt;
}

/* Steps t0..t1-1 (gradients of step t times `times`). */
static void run(model_t *m, hvd_optimizer_t *opt, int t0, int t1,
                double times) {
  for (int t = t0; t < t1; t++) {
    set_grads(m, t, times);
    if (hvd_optimizer_step(opt) != HVD_SUCCESS ||
        hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      bail("step %d: %s", t, hvd_last_error());
  }
}

/* The largest |a - b| over the model, over the largest |b|. */
static double rel_off(const model_t *a, const model_t *b) {
  double worst = 0, big = 0;
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < a->len[k]; i++) {
      double d = fabs((double)a->w[k][i] - b->w[k][i]);
      if (isnan(d))
        return NAN;
      worst = fmax(worst, d);
      big = fmax(big, fabs((double)b->w[k][i]));
    }
  return worst / big;
}

static int same_bits(const model_t *a, const model_t *b) {
  for (int k = 0; k < NP; k++)
    if (memcmp(a->w[k], b->w[k], (size_t)a->len[k] * sizeof(float)) != 0)
      return 0;
  return 1;
}

/* Rank 0's values on every rank, bit for bit. */
static int same_everywhere(const model_t *m) {
  int same = 1;
  for (int k = 0; k < NP; k++)
    same &= hvdt_same_on_all_ranks(m->w[k], (size_t)m->len[k] * sizeof(float));
  return same;
}

/* The uninterrupted run. */
static void straight(model_t *m) {
  psgd_model_make(m, 0);
  hvd_optimizer_t *opt = make_opt(m, 1);
  run(m, opt, 0, STEPS, 1);
  hvd_optimizer_destroy(opt);
}

/* SAVE_AT steps saved to path (with the optimizer, or without). */
static void save_after(const char *path, int with_opt) {
  model_t m;
  psgd_model_make(&m, 0);
  hvd_optimizer_t *opt = make_opt(&m, 1);
  run(&m, opt, 0, SAVE_AT, 1);
  if (hvd_checkpoint_save(path, m.p, NP, with_opt ? opt : NULL, SAVE_AT) !=
      HVD_SUCCESS)
    bail("save %s: %s", path, hvd_last_error());
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
}

/* How resume() makes its optimizer before the load. */
enum {
  STALE, /* two steps of other gradients, the second compressed: a
            PowerSGD state that the load must replace; path loaded with
            the optimizer */
  FRESH, /* none: path loaded with the optimizer */
  NO_OPT /* one step of zero gradients (to the step count where PowerSGD
            starts, afresh); path loaded without the optimizer */
};

/* A new model and optimizer, path loaded into them, then the remaining
 * steps. */
static void resume(model_t *m, const char *path, int how) {
  int64_t step = -1;
  psgd_model_make(m, 7);
  hvd_optimizer_t *opt = make_opt(m, 1);
  if (how != FRESH)
    run(m, opt, 0, how == STALE ? 2 : 1, how == STALE ? 5 : 0);
  if (hvd_checkpoint_load(path, m->p, NP, how != NO_OPT ? opt : NULL, &step) !=
          HVD_SUCCESS ||
      step != SAVE_AT)
    bail("load %s: %s (step %lld)", path, hvd_last_error(), (long long)step);
  run(m, opt, SAVE_AT, STEPS, 1);
  hvd_optimizer_destroy(opt);
}

static uint32_t file_version(const char *path) {
  unsigned char head[12] = {0};
  uint32_t v = 0;
  FILE *f = fopen(path, "rb");
  if (f != NULL) {
    if (fread(head, 1, sizeof head, f) == sizeof head)
      v = head[8] | head[9] << 8 | (uint32_t)head[10] << 16 |
          (uint32_t)head[11] << 24;
    fclose(f);
  }
  return v;
}

static void test_resume(const char *dir) {
  char path[512], bare[512];
  model_t want, got, lost;
  snprintf(path, sizeof path, "%s/psgd.ckpt", dir);
  snprintf(bare, sizeof bare, "%s/bare.ckpt", dir);
  straight(&want);
  save_after(path, 1);
  save_after(bare, 0);
  resume(&got, path, STALE);
  double off = rel_off(&got, &want);
  if (size == 1)
    ok(same_bits(&got, &want),
       "resume at np 1: the uninterrupted run's values, bit for bit");
  else
    ok(off <= 2e-6,
       "resume at np %d: the uninterrupted run's values to 2e-6 (%.2g)", size,
       off);
  ok(same_everywhere(&got), "resume: the same bits on every rank");
  resume(&lost, bare, NO_OPT);
  double lo = rel_off(&lost, &want);
  ok(lo > 1e-3,
     "resume from a file without PowerSGD's state: off by more than 1e-3 "
     "(%.2g): the state matters",
     lo);
  is_int(5, file_version(path), "the file is version 5");
  psgd_model_drop(&want);
  psgd_model_drop(&got);
  psgd_model_drop(&lost);
}

/* A file with PowerSGD's records loaded by an optimizer without PowerSGD:
 * the section is skipped; its own files have no record, and one loaded
 * by a PowerSGD
 * optimizer starts its state afresh. */
static void test_plain(const char *dir) {
  char path[512], plain[512];
  model_t m, ref, fresh, stale;
  int64_t step = 0;
  snprintf(path, sizeof path, "%s/psgd.ckpt", dir);
  snprintf(plain, sizeof plain, "%s/plain.ckpt", dir);
  psgd_model_make(&m, 0);
  psgd_model_make(&ref, 0);
  hvd_optimizer_t *opt = make_opt(&m, 0);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, m.p, NP, opt, &step),
         "a file with records into an optimizer without PowerSGD: loaded");
  if (hvd_checkpoint_load(path, ref.p, NP, NULL, NULL) != HVD_SUCCESS)
    bail("load: %s", hvd_last_error());
  ok(same_bits(&m, &ref) && step == SAVE_AT && hvd_optimizer_steps(opt) == 3,
     "... the saved values, step and step count");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(plain, m.p, NP, opt, step),
         "saved by the plain optimizer");
  is_int(5, file_version(plain), "... as version 5, with no record");
  resume(&fresh, plain, FRESH);
  resume(&stale, plain, STALE);
  ok(same_bits(&fresh, &stale),
     "a file without records into a PowerSGD optimizer with a state: its "
     "state "
     "starts afresh, as a new optimizer's");
  hvd_optimizer_destroy(opt);
  /* Ranks that disagree: the last one's optimizer compresses, the others'
   * do not; every rank fails with the last one's message. */
  int last = size - 1;
  if (last > 0) {
    opt = make_opt(&m, rank == last);
    char want[200];
    snprintf(want, sizeof want,
             "hvd_checkpoint_load: opt compresses with PowerSGD here but does "
             "not on rank 0 (on rank %d)",
             last);
    is_int(HVD_ERR_INVALID_ARG, hvd_checkpoint_load(path, m.p, NP, opt, NULL),
           "PowerSGD on the last rank only: every rank fails");
    is_string(want, hvd_last_error(), "... with that rank's message");
    hvd_optimizer_destroy(opt);
  } else
    skip(2, "ranks that disagree on PowerSGD need 2 ranks");
  psgd_model_drop(&m);
  psgd_model_drop(&ref);
  psgd_model_drop(&fresh);
  psgd_model_drop(&stale);
}

static void copy_model(model_t *dst, const model_t *src) {
  psgd_model_make(dst, 0);
  for (int k = 0; k < NP; k++)
    memcpy(dst->w[k], src->w[k], (size_t)src->len[k] * sizeof(float));
}

static void test_commit(void) {
  model_t m, first;
  hvd_state_t *st = NULL;
  int restored = 0;
  psgd_model_make(&m, 0);
  hvd_optimizer_t *opt = make_opt(&m, 1);
  if (hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, m.p, NP, opt) != HVD_SUCCESS)
    bail("state: %s", hvd_last_error());
  run(&m, opt, 0, SAVE_AT, 1);
  is_int(HVD_SUCCESS, hvd_state_commit(st), "hvd_state_commit after 3 steps");
  run(&m, opt, SAVE_AT, STEPS, 1);
  copy_model(&first, &m);
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored), "hvd_state_restore");
  run(&m, opt, SAVE_AT, STEPS, 1);
  ok(restored && same_bits(&m, &first),
     "the 2 steps after the restore repeat the first 2, bit for bit (each "
     "rank's own error feedback and the warm Q restored)");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
  psgd_model_drop(&first);
}

static void put64(unsigned char *p, uint64_t v) {
  for (int b = 0; b < 8; b++)
    p[b] = (unsigned char)(v >> (8 * b));
}

/* A file saved before any compression (two records without data: w's,
 * then x's) with w's view turned to 20 x 12 and the checksum made good. */
static void test_corrupt(const char *dir) {
  char path[512], want[1024];
  model_t m, before;
  snprintf(path, sizeof path, "%s/view.ckpt", dir);
  psgd_model_make(&m, 0);
  hvd_optimizer_t *opt = make_opt(&m, 1);
  if (hvd_checkpoint_save(path, m.p, NP, opt, 0) != HVD_SUCCESS)
    bail("save: %s", hvd_last_error());
  if (rank == 0) {
    char *img = NULL;
    FILE *f = fopen(path, "r+b");
    long len = 0;
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 100 ||
        (img = malloc((size_t)len)) == NULL || fseek(f, 0, SEEK_SET) != 0 ||
        fread(img, 1, (size_t)len, f) != (size_t)len)
      bail("read %s", path);
    const long rec = 4 + 1 + 4 + 8 + 8 + 8 + 4, w = len - 8 - 2 * rec;
    unsigned char *u = (unsigned char *)img;
    if (u[w + 4] != 'w' || u[w + 9] != 12 || u[w + 17] != 20)
      bail("w's record is not where it should be");
    put64(u + w + 9, 20);
    put64(u + w + 17, 12);
    put64(u + len - 8, hvdt_sum64(u, (size_t)len - 8));
    if (fseek(f, 0, SEEK_SET) != 0 ||
        fwrite(img, 1, (size_t)len, f) != (size_t)len)
      bail("write %s", path);
    fclose(f);
    free(img);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int k = 0; k < NP; k++)
    for (int64_t i = 0; i < m.len[k]; i++)
      m.w[k][i] = 3;
  copy_model(&before, &m);
  is_int(HVD_ERR_CORRUPT, hvd_checkpoint_load(path, m.p, NP, opt, NULL),
         "a record of w as 20 x 12: HVD_ERR_CORRUPT");
  snprintf(want, sizeof want,
           "hvd_checkpoint_load: '%s': the PowerSGD state of 'w' is 20 x 12 "
           "in the file but the program views it as 12 x 20",
           path);
  is_string(want, hvd_last_error(), "... its message");
  ok(same_bits(&m, &before) && hvd_optimizer_steps(opt) == 0,
     "... and nothing changed");
  hvd_optimizer_destroy(opt);
  psgd_model_drop(&m);
  psgd_model_drop(&before);
}

/* t/mpi/powersgd_ckpt.sh's halves (every rank's gradient the same). */
static int cross(const char *mode, const char *path) {
  model_t want, got;
  same_grads = 1;
  if (strcmp(mode, "save") == 0) {
    save_after(path, 1);
    return 0;
  }
  straight(&want);
  resume(&got, path, STALE);
  double off = rel_off(&got, &want);
  int good = off <= 2e-6;
  if (rank == 0)
    printf("%s: the resumed run is off the uninterrupted one at np %d by "
           "%.3g\n",
           good ? "ok" : "not ok", size, off);
  psgd_model_drop(&want);
  psgd_model_drop(&got);
  return good ? 0 : 1;
}

int main(int argc, char **argv) {
  char dir[256];
  if (argc == 3) { /* MPI the program's own, as hvd needs it */
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (hvd_init() != HVD_SUCCESS)
      bail("hvd_init: %s", hvd_last_error());
    int rc = cross(argv[1], argv[2]);
    hvd_shutdown();
    MPI_Finalize();
    return rc;
  }
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  hvdt_shared_tmpdir(dir, sizeof dir, "psgd_ckpt");
  test_resume(dir);
  test_plain(dir);
  test_commit();
  test_corrupt(dir);
  hvdt_remove_tmpdir(dir);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
