/*
 * bench_overlap.c - overlap mode: does hvd's background engine leave the
 * core to the compute that shares it?
 *
 *   compute   a fixed amount of arithmetic on the main thread (an
 *             L2-resident array, calibrated to take about --compute-ms)
 *   comm      every tensor of --tensors submitted asynchronously (reverse
 *             order, average, in place) then waited for: hvd alone
 *   both      submit everything, run the same compute while hvd reduces in
 *             the background, then wait
 *
 * Reported (medians over --iters, slowest rank): the compute's time alone
 * and under communication, the speed it keeps (alone / under comm), and
 * the step time against compute + comm run one after the other.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY 65536 /* floats: 256 KiB, stays in L2 */

static volatile float sink;

/* reps passes of arithmetic over a; returns a value so it is not elided. */
static float compute(float *a, long reps) {
  float acc = 0;
  for (long r = 0; r < reps; r++) {
    for (int i = 0; i < ARRAY; i++) {
      a[i] = a[i] * 0.999f + 0.001f;
      acc += a[i];
    }
  }
  return acc;
}

static void submit_all(workload_t *w, hvd_request_t **req) {
  for (int t = w->count - 1; t >= 0; t--) {
    hvd_tensor_t x =
        hvd_tensor_make(w->t[t].data, HVD_FLOAT32, w->t[t].ndim, w->t[t].shape);
    BENCH_HVD(hvd_allreduce_async(w->t[t].name, &x, &x, HVD_AVERAGE, 1.0, 1.0,
                                  &req[t]));
  }
}

static void wait_all(workload_t *w, hvd_request_t **req) {
  for (int t = w->count - 1; t >= 0; t--)
    BENCH_HVD(hvd_wait(req[t]));
}

/* Calibrated on rank 0 and sent to all: the passes of compute() that take
 * about --compute-ms. */
static long calibrate(const bench_opts_t *o, float *a) {
  long reps = 1;
  if (bench_rank == 0) {
    double t0 = bench_now();
    sink = compute(a, 20);
    double per = (bench_now() - t0) / 20;
    reps = (long)(o->compute_ms / 1e3 / per) + 1;
  }
  BENCH_MPI(MPI_Bcast(&reps, 1, MPI_LONG, 0, MPI_COMM_WORLD));
  return reps;
}

/* overlap's state: the workload, the compute's array, every iteration's
 * times (seconds) and their statistics. */
typedef struct overlap {
  workload_t *w;
  hvd_request_t **req;
  float *a;
  long reps;
  int iters;
  double *alone, *comm, *under, *step;
  bench_stats_t sa, sc, su, ss;
} overlap_t;

/* compute alone, hvd alone, then both at once; after a barrier each. */
static void overlap_time(overlap_t *v) {
  workload_t *w = v->w;
  hvd_request_t **req = v->req;
  float *a = v->a;
  long reps = v->reps;
  for (int it = -1; it < v->iters; it++) { /* it == -1: warmup */
    double t0;
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t0 = bench_now();
    sink = compute(a, reps);
    double c0 = bench_now() - t0;

    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t0 = bench_now();
    submit_all(w, req);
    wait_all(w, req);
    double m0 = bench_now() - t0;

    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t0 = bench_now();
    submit_all(w, req);
    double c1s = bench_now();
    sink = compute(a, reps);
    double c1 = bench_now() - c1s;
    wait_all(w, req);
    double s1 = bench_now() - t0;
    if (it >= 0) {
      v->alone[it] = c0;
      v->comm[it] = m0;
      v->under[it] = c1;
      v->step[it] = s1;
    }
  }
}

/* The slowest rank's times and their statistics (collective). */
static void overlap_stats(overlap_t *v) {
  int iters = v->iters;
  bench_max_over_ranks(v->alone, iters);
  bench_max_over_ranks(v->comm, iters);
  bench_max_over_ranks(v->under, iters);
  bench_max_over_ranks(v->step, iters);
  v->sa = bench_stats(v->alone, iters);
  v->sc = bench_stats(v->comm, iters);
  v->su = bench_stats(v->under, iters);
  v->ss = bench_stats(v->step, iters);
}

static void overlap_json(const bench_opts_t *o, const overlap_t *v) {
  const bench_stats_t *sa = &v->sa, *sc = &v->sc, *su = &v->su, *ss = &v->ss;
  bench_json_header("overlap");
  bench_json_str("tensors", o->tensors);
  bench_json_num("compute_alone_ms", sa->median * 1e3);
  bench_json_num("comm_alone_ms", sc->median * 1e3);
  bench_json_num("compute_under_comm_ms", su->median * 1e3);
  bench_json_num("step_ms", ss->median * 1e3);
  bench_json_num("compute_speed_kept", sa->median / su->median);
  bench_json_num("step_vs_sequential", ss->median / (sa->median + sc->median));
  bench_json_close('}');
  printf("\n");
}

static void overlap_text(const bench_opts_t *o, const overlap_t *v) {
  const bench_stats_t *sa = &v->sa, *sc = &v->sc, *su = &v->su, *ss = &v->ss;
  char env[512];
  printf("# hvd-bench overlap: %s: %d tensors, %.1f MiB; %d ranks; "
         "median of %d; %s\n",
         o->tensors, v->w->count, (double)v->w->elems * 4 / (1 << 20),
         bench_size, v->iters, bench_env_line(env, sizeof env));
  printf("%-44s %10.2f ms\n", "compute alone", sa->median * 1e3);
  printf("%-44s %10.2f ms\n", "hvd reduction alone (submit + wait)",
         sc->median * 1e3);
  printf("%-44s %10.2f ms\n", "compute while hvd reduces in background",
         su->median * 1e3);
  printf("%-44s %10.2f ms\n", "step: submit, compute, wait", ss->median * 1e3);
  printf("compute speed kept under communication: %.3f\n",
         sa->median / su->median);
  printf("step / (compute + reduction one after the other): %.3f\n",
         ss->median / (sa->median + sc->median));
}

int bench_overlap(const bench_opts_t *o) {
  workload_t w;
  overlap_t v;
  if (!bench_load_workload(o->tensors, &w, o->alloc))
    return 2;
  memset(&v, 0, sizeof v);
  v.w = &w;
  v.iters = o->iters > 0 ? o->iters : 5;
  v.req = bench_alloc(sizeof *v.req * (size_t)w.count);
  v.a = bench_alloc(sizeof *v.a * ARRAY);
  for (int i = 0; i < ARRAY; i++)
    v.a[i] = (float)i / ARRAY;
  for (int t = 0; t < w.count; t++)
    memset(w.t[t].data, 0, sizeof(float) * (size_t)w.t[t].n);
  v.reps = calibrate(o, v.a);

  v.alone = bench_alloc(sizeof(double) * (size_t)v.iters);
  v.comm = bench_alloc(sizeof(double) * (size_t)v.iters);
  v.under = bench_alloc(sizeof(double) * (size_t)v.iters);
  v.step = bench_alloc(sizeof(double) * (size_t)v.iters);
  overlap_time(&v);
  overlap_stats(&v);
  if (bench_rank == 0) {
    if (o->json)
      overlap_json(o, &v);
    else
      overlap_text(o, &v);
    fflush(stdout);
  }
  free(v.alone);
  free(v.comm);
  free(v.under);
  free(v.step);
  free(v.a);
  free(v.req);
  bench_free_workload(&w);
  return 0;
}
