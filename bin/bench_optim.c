/*
 * bench_optim.c - optim mode: what the distributed optimizer costs over
 * doing its work by hand, for one workload (--tensors), in one run.
 *
 *   dist    the distributed optimizer (SGD, momentum 0.9) over the
 *           workload's tensors as parameters: hvd_optimizer_grad_ready for
 *           every tensor in the file's reverse order (as backward produces
 *           them), then hvd_optimizer_step
 *   bare    the same gradients through hvd directly: hvd_allreduce_async
 *           (average, in place) for every tensor in reverse order, every
 *           request waited for, then the same SGD-momentum update as a
 *           plain loop written here
 *
 * Both run in every iteration, in alternating order, on the same
 * parameters and gradients (each with its own momentum buffers). Each run
 * follows a barrier and takes the slowest rank's time; a method reports
 * the median (min, max) over --iters after --warmup. Reported: both, the
 * ratio dist / bare of the medians (the wrapper's overhead; the goal is
 * below 1.05), the median of each iteration's own ratio (steadier on a
 * busy machine), and bare's two parts (reduction, update). The first run
 * of each is checked: every parameter must have taken exactly the first
 * SGD step, v - lr * g. --check-hparams 0 turns the distributed
 * optimizer's hyperparameter check off (what it costs a step);
 * --num-groups N gives it that many explicit gradient groups.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LR 0.01f
#define MOMENTUM 0.9f
#define V0 1.0f

/* The gradient of element i of tensor t: identical on every rank, so the
 * average leaves it as it is; a multiple of 1/1024 (exact). */
static float grad_value(int t, int64_t i) {
  return (float)((t * 7 + i) % 16) / 1024.0f;
}

static void reset(workload_t *w, float **val) {
  for (int t = 0; t < w->count; t++)
    for (int64_t i = 0; i < w->t[t].n; i++) {
      val[t][i] = V0;
      w->t[t].data[i] = grad_value(t, i);
    }
}

/* After one step from reset(): v == V0 - LR * g everywhere? */
static int verify(const workload_t *w, float **val, const char *method) {
  int64_t wrong = 0;
  for (int t = 0; t < w->count; t++)
    for (int64_t i = 0; i < w->t[t].n; i++) {
      float want = V0 - LR * grad_value(t, i);
      if (fabsf(val[t][i] - want) > 1e-6f && wrong++ == 0)
        fprintf(stderr, "[rank %d] %s: %s[%lld] is %.9g, expected %.9g\n",
                bench_rank, method, w->t[t].name, (long long)i,
                (double)val[t][i], (double)want);
    }
  if (wrong > 0)
    fprintf(stderr, "[rank %d] %s: %lld elements wrong\n", bench_rank, method,
            (long long)wrong);
  return wrong == 0;
}

static void run_dist(workload_t *w, hvd_optimizer_t *opt) {
  for (int t = w->count - 1; t >= 0; t--)
    BENCH_HVD(hvd_optimizer_grad_ready(opt, t));
  BENCH_HVD(hvd_optimizer_step(opt));
}

/* Reduction, then the update; *t_update: when the update began. */
static void run_bare(workload_t *w, float **val, float **buf, char **names,
                     hvd_request_t **req, int first, double *t_update) {
  for (int t = w->count - 1; t >= 0; t--) {
    hvd_tensor_t x =
        hvd_tensor_make(w->t[t].data, HVD_FLOAT32, w->t[t].ndim, w->t[t].shape);
    BENCH_HVD(
        hvd_allreduce_async(names[t], &x, &x, HVD_AVERAGE, 1.0, 1.0, &req[t]));
  }
  for (int t = w->count - 1; t >= 0; t--)
    BENCH_HVD(hvd_wait(req[t]));
  *t_update = bench_now();
  for (int t = 0; t < w->count; t++) {
    float *v = val[t], *b = buf[t];
    const float *g = w->t[t].data;
    int64_t n = w->t[t].n;
    if (first)
      for (int64_t i = 0; i < n; i++) {
        b[i] = g[i];
        v[i] -= LR * b[i];
      }
    else
      for (int64_t i = 0; i < n; i++) {
        b[i] = MOMENTUM * b[i] + g[i];
        v[i] -= LR * b[i];
      }
  }
}

/* optim's state: the workload as parameters, both methods' buffers, and
 * the times of every iteration (seconds) with their statistics. */
typedef struct optim {
  workload_t *w; /* its tensors' data are the gradients */
  int iters, warmup;
  float **val, **buf; /* values; bare's momentum buffers */
  char **names;       /* bare's allreduce names */
  hvd_param_t *params;
  hvd_request_t **req;
  hvd_optimizer_t *opt;
  double *dist, *bare, *comm, *upd, *pair;
  bench_stats_t sd, sb, sc, su, sp;
  double ratio;
  int good;
} optim_t;

/* Each tensor's values, momentum buffer and name, and the parameters the
 * distributed optimizer sees; the time arrays. */
static void optim_alloc(optim_t *b) {
  const workload_t *w = b->w;
  size_t iters = (size_t)b->iters;
  b->val = bench_alloc(sizeof *b->val * (size_t)w->count);
  b->buf = bench_alloc(sizeof *b->buf * (size_t)w->count);
  b->names = bench_alloc(sizeof *b->names * (size_t)w->count);
  b->params = bench_alloc(sizeof *b->params * (size_t)w->count);
  b->req = bench_alloc(sizeof *b->req * (size_t)w->count);
  for (int t = 0; t < w->count; t++) {
    size_t len = strlen(w->t[t].name) + sizeof "bench.optim.";
    b->val[t] = bench_alloc(sizeof(float) * (size_t)w->t[t].n);
    b->buf[t] = bench_alloc(sizeof(float) * (size_t)w->t[t].n);
    b->names[t] = bench_alloc(len);
    snprintf(b->names[t], len, "bench.optim.%s", w->t[t].name);
    b->params[t].name = w->t[t].name;
    b->params[t].value =
        hvd_tensor_make(b->val[t], HVD_FLOAT32, w->t[t].ndim, w->t[t].shape);
    b->params[t].grad =
        hvd_tensor_make(w->t[t].data, HVD_FLOAT32, w->t[t].ndim, w->t[t].shape);
  }
  b->dist = bench_alloc(sizeof(double) * iters);
  b->bare = bench_alloc(sizeof(double) * iters);
  b->comm = bench_alloc(sizeof(double) * iters);
  b->upd = bench_alloc(sizeof(double) * iters);
  b->pair = bench_alloc(sizeof(double) * iters);
}

/* Both methods in every iteration; b->good: the checked runs were right
 * on every rank. */
static void optim_time(optim_t *b) {
  workload_t *w = b->w;
  int good = 1;
  for (int it = -b->warmup; it < b->iters; it++) {
    /* the first run of each is checked, from the same start; later the
     * order alternates, so neither always runs after the other */
    int first = it == -b->warmup;
    for (int turn = 0; turn < 2; turn++) {
      int is_dist = (turn == 0) == (first || (it & 1) == 0);
      double t0, t1, tu = 0;
      if (first)
        reset(w, b->val);
      BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
      t0 = bench_now();
      if (is_dist)
        run_dist(w, b->opt);
      else
        run_bare(w, b->val, b->buf, b->names, b->req, first, &tu);
      t1 = bench_now();
      if (first)
        good &= verify(w, b->val, is_dist ? "dist" : "bare");
      if (it < 0)
        continue;
      if (is_dist) {
        b->dist[it] = t1 - t0;
      } else {
        b->bare[it] = t1 - t0;
        b->comm[it] = tu - t0;
        b->upd[it] = t1 - tu;
      }
    }
  }
  b->good = bench_all_ok(good);
}

/* The slowest rank's times, their statistics and the ratios (on every
 * rank: the maxima are collective). */
static void optim_stats(optim_t *b) {
  int iters = b->iters;
  bench_max_over_ranks(b->dist, iters);
  bench_max_over_ranks(b->bare, iters);
  bench_max_over_ranks(b->comm, iters);
  bench_max_over_ranks(b->upd, iters);
  for (int it = 0; it < iters; it++)
    b->pair[it] = b->dist[it] / b->bare[it];
  b->sd = bench_stats(b->dist, iters);
  b->sb = bench_stats(b->bare, iters);
  b->sc = bench_stats(b->comm, iters);
  b->su = bench_stats(b->upd, iters);
  b->sp = bench_stats(b->pair, iters);
  b->ratio = b->sd.median / b->sb.median;
}

static void optim_json(const bench_opts_t *o, const optim_t *b) {
  bench_json_header("optim");
  bench_json_str("tensors", o->tensors);
  bench_json_int("tensor_count", b->w->count);
  bench_json_int("elements", b->w->elems);
  bench_json_int("iters", b->iters);
  bench_json_num("dist_step_ms", b->sd.median * 1e3);
  bench_json_num("dist_step_min_ms", b->sd.min * 1e3);
  bench_json_num("dist_step_max_ms", b->sd.max * 1e3);
  bench_json_num("bare_step_ms", b->sb.median * 1e3);
  bench_json_num("bare_step_min_ms", b->sb.min * 1e3);
  bench_json_num("bare_step_max_ms", b->sb.max * 1e3);
  bench_json_num("bare_allreduce_ms", b->sc.median * 1e3);
  bench_json_num("bare_update_ms", b->su.median * 1e3);
  bench_json_num("ratio", b->ratio);
  bench_json_num("paired_ratio_median", b->sp.median);
  bench_json_bool("check_hparams", o->check_hparams);
  bench_json_int("num_groups", o->num_groups);
  bench_json_bool("correct", b->good);
  bench_json_close('}');
  printf("\n");
}

static void optim_text(const bench_opts_t *o, const optim_t *b) {
  const bench_stats_t *sd = &b->sd, *sb = &b->sb;
  char env[512], groups[48] = "";
  if (o->num_groups > 0)
    snprintf(groups, sizeof groups, "; num_groups %d", o->num_groups);
  printf("# hvd-bench optim: %s: %d tensors, %.1f MiB; %d ranks; SGD "
         "momentum %g, lr %g%s%s; median of %d (min, max); %s\n",
         o->tensors, b->w->count, (double)b->w->elems * 4 / (1 << 20),
         bench_size, (double)MOMENTUM, (double)LR,
         o->check_hparams ? "" : "; no hyperparameter check", groups, b->iters,
         bench_env_line(env, sizeof env));
  printf("%-52s %10.2f ms (%.2f, %.2f)\n",
         "(a) distributed optimizer: grad_ready x n + step", sd->median * 1e3,
         sd->min * 1e3, sd->max * 1e3);
  printf("%-52s %10.2f ms (%.2f, %.2f)\n",
         "(b) bare: hvd allreduce (average) + inline update", sb->median * 1e3,
         sb->min * 1e3, sb->max * 1e3);
  printf("%-52s %10.2f ms\n", "    of which the allreduce (submit + wait)",
         b->sc.median * 1e3);
  printf("%-52s %10.2f ms\n", "    of which the update loop",
         b->su.median * 1e3);
  printf("ratio (a) / (b): %.3f (goal: below 1.05); median of the "
         "iterations' own ratios %.3f\n",
         b->ratio, b->sp.median);
  if (!b->good)
    printf("WRONG RESULTS (see stderr)\n");
}

static void optim_free(optim_t *b) {
  hvd_optimizer_destroy(b->opt);
  for (int t = 0; t < b->w->count; t++) {
    free(b->val[t]);
    free(b->buf[t]);
    free(b->names[t]);
  }
  free(b->val);
  free(b->buf);
  free(b->names);
  free(b->params);
  free(b->req);
  free(b->dist);
  free(b->bare);
  free(b->comm);
  free(b->upd);
  free(b->pair);
  bench_free_workload(b->w);
}

int bench_optim(const bench_opts_t *o) {
  workload_t w;
  optim_t b;
  if (!bench_load_workload(o->tensors, &w, o->alloc))
    return 2;
  memset(&b, 0, sizeof b);
  b.w = &w;
  b.iters = o->iters > 0 ? o->iters : 10;
  b.warmup = o->warmup >= 0 ? o->warmup : 2;
  if (b.warmup < 1)
    b.warmup = 1; /* the first run is the checked one */
  optim_alloc(&b);

  hvd_param_t *params = b.params;
  hvd_sgd_options_t so;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_sgd_options_init(&so);
  so.lr = LR;
  so.momentum = MOMENTUM;
  BENCH_HVD(hvd_sgd_create(params, w.count, &so, &base));
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.check_hparams = o->check_hparams;
  d.num_groups = o->num_groups;
  BENCH_HVD(hvd_distributed_optimizer(base, &d, &opt));
  b.opt = opt;

  optim_time(&b);
  optim_stats(&b);
  if (bench_rank == 0) {
    if (o->json)
      optim_json(o, &b);
    else
      optim_text(o, &b);
    fflush(stdout);
  }
  optim_free(&b);
  return b.good ? 0 : 1;
}
