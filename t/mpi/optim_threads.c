/*
 * optim_threads.c - two distributed optimizers stepping at once, each
 * driven by its own thread (hvd.h: "one thread drives one optimizer"; a
 * GAN's generator and discriminator), at np 1..4.
 *
 * Every collective an optimizer's step issues must be its own: besides
 * the gradients' ("hvd.grad.<name>") and the hyperparameter check's
 * ("hvd.hparams.<first name>"), loss scaling's inf/NaN agreement, and a
 * sharded step's clipping and LAMB norms. Were two optimizers to share
 * one name, the second submission would be refused as already in flight
 * on some ranks and not on others, and the ranks' models would part.
 * Runs, each T steps per thread, gradient 2^-4 everywhere:
 *  - loss scaling (scale 1, fixed): optimizer a (SGD) finds an inf on the
 *    last rank every third step, b (SGD) never;
 *  - sharded (ZeRO-1) with clipping by the global norm (max_norm below
 *    the norm, so that every step clips) and loss scaling: a is SGD
 *    with the same injected infs, b is LAMB.
 * Each: no step fails, a skips exactly the steps with an inf and b none,
 * the values are the same on every rank, and equal bit for bit those of
 * the same two optimizers stepped one after the other by one thread.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define N 64
#define T 120

static int rank, size;

typedef struct job {
  const char *name; /* its parameter's */
  int inject;       /* an inf on the last rank every third step */
  float w[N], g[N];
  hvd_param_t p;
  hvd_optimizer_t *opt;
  char skips[T + 1]; /* per step: '.' updated, 'S' skipped, 'E' failed */
  int errors;
  char first_error[256];
} job_t;

/* SGD (lr 0.5) or LAMB, distributed (sharded: ZeRO-1 with clipping to
 * max_norm 0.01), with loss scaling at a fixed scale 1. */
static void job_make(job_t *j, const char *name, int inject, int lamb,
                     int shard) {
  memset(j, 0, sizeof *j);
  j->name = name;
  j->inject = inject;
  int64_t n = N;
  for (int i = 0; i < N; i++)
    j->w[i] = 0.5f + 0.25f * (float)(i % 4);
  j->p = (hvd_param_t){name, hvd_tensor_make(j->w, HVD_FLOAT32, 1, &n),
                       hvd_tensor_make(j->g, HVD_FLOAT32, 1, &n)};
  hvd_optimizer_t *base = NULL;
  hvd_result_t rc;
  if (lamb) {
    hvd_lamb_options_t lo;
    hvd_lamb_options_init(&lo);
    rc = hvd_lamb_create(&j->p, 1, &lo, &base);
  } else {
    hvd_sgd_options_t so;
    hvd_sgd_options_init(&so);
    so.lr = 0.5;
    rc = hvd_sgd_create(&j->p, 1, &so, &base);
  }
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  hvd_loss_scale_options_t ls;
  hvd_loss_scale_options_init(&ls);
  ls.init_scale = 1;
  ls.growth_factor = 1;
  ls.backoff_factor = 1;
  if (rc != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &j->opt) != HVD_SUCCESS ||
      hvd_optimizer_set_loss_scaling(j->opt, &ls) != HVD_SUCCESS ||
      (shard && hvd_optimizer_set_grad_clipping(j->opt, 0.01, 2) !=
                    HVD_SUCCESS))
    bail("%s: %s", name, hvd_last_error());
}

/* Step s of job j: its gradient, the step, and what became of it. */
static void job_step(job_t *j, int s) {
  if (hvd_optimizer_zero_grad(j->opt) != HVD_SUCCESS) {
    j->skips[s] = 'E';
    j->errors++;
    return;
  }
  for (int i = 0; i < N; i++)
    j->g[i] = 0.0625f;
  if (j->inject && rank == size - 1 && s % 3 == 0)
    j->g[0] = INFINITY;
  if (hvd_optimizer_step(j->opt) != HVD_SUCCESS) {
    if (j->errors++ == 0)
      snprintf(j->first_error, sizeof j->first_error, "%s", hvd_last_error());
    j->skips[s] = 'E';
    return;
  }
  j->skips[s] = hvd_optimizer_step_skipped(j->opt) ? 'S' : '.';
}

static void *drive(void *arg) {
  job_t *j = arg;
  for (int s = 0; s < T; s++)
    job_step(j, s);
  return NULL;
}

/* The skips a job must see: 'S' every third step when it injects. */
static void expected_skips(const job_t *j, char *want) {
  for (int s = 0; s < T; s++)
    want[s] = j->inject && s % 3 == 0 ? 'S' : '.';
  want[T] = '\0';
}

static void check_job(const char *what, const job_t *j, const job_t *ref) {
  char want[T + 1];
  expected_skips(j, want);
  tap_note("first error: %s", j->first_error);
  is_int(0, j->errors, "%s: optimizer %s: no step failed", what, j->name);
  is_string(want, j->skips, "%s: optimizer %s: the steps skipped", what,
            j->name);
  ok(hvdt_same_on_all_ranks(j->w, sizeof j->w),
     "%s: optimizer %s: the same values on every rank", what, j->name);
  ok(memcmp(j->w, ref->w, sizeof j->w) == 0,
     "%s: optimizer %s: the values of one thread's run, bit for bit (w[1] "
     "%.9g, %.9g)",
     what, j->name, (double)j->w[1], (double)ref->w[1]);
}

/* a and b on two threads at once, then a fresh pair stepped in turn by
 * this thread: the same results. */
static void run(const char *what, int lamb_b, int shard) {
  static job_t a, b, ra, rb;
  job_make(&a, "a", 1, 0, shard);
  job_make(&b, "b", 0, lamb_b, shard);
  pthread_t ta, tb;
  if (pthread_create(&ta, NULL, drive, &a) != 0 ||
      pthread_create(&tb, NULL, drive, &b) != 0)
    bail("pthread_create");
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  job_make(&ra, "a", 1, 0, shard);
  job_make(&rb, "b", 0, lamb_b, shard);
  for (int s = 0; s < T; s++) {
    job_step(&ra, s);
    job_step(&rb, s);
  }
  if (ra.errors + rb.errors > 0)
    bail("%s: the one-thread run failed: %s%s", what, ra.first_error,
         rb.first_error);
  check_job(what, &a, &ra);
  check_job(what, &b, &rb);
  hvd_optimizer_destroy(a.opt);
  hvd_optimizer_destroy(b.opt);
  hvd_optimizer_destroy(ra.opt);
  hvd_optimizer_destroy(rb.opt);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  run("loss scaling", 0, 0);
  run("sharded, clipping and loss scaling, SGD and LAMB", 1, 1);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
