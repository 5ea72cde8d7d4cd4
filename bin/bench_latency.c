/*
 * bench_latency.c - latency mode.
 *
 * One float32 (4 bytes) reduced with hvd_allreduce (blocking: submit to
 * completion; sum, in place), --iters samples back to back after --warmup,
 * then the same with MPI_Allreduce on MPI_COMM_WORLD. A sample's time is
 * the slowest rank's; p50/p90/p99/min/max over the samples. Every sample's
 * result is checked (each rank adds rank + 1).
 *
 * The `small` sub-report: --small-count tensors of 4 bytes with distinct
 * names submitted with hvd_allreduce_async, then all waited for, against
 * as many sequential MPI_Allreduce calls; median of --small-iters
 * iterations (2 warmup), a barrier before each.
 *
 * The `idle` sub-report: every rank sleeps IDLE_S on its main thread,
 * IDLE_REPEATS times; the CPU the process spent meanwhile (hvd's engine
 * thread, mostly), per second of sleep and the most of any rank, and the
 * first 4-byte hvd_allreduce after each sleep (the slowest rank's, median
 * over the repeats), then the same sleeps followed by MPI_Allreduce for
 * the latency alone (the engine runs during those too): what a job that
 * pauses (data loading, evaluation, a checkpoint on rank 0) pays.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { L_HVD, L_MPI, L_COUNT };

#define IDLE_S 1.0
#define IDLE_REPEATS 3

static float expected_sum(void) {
  return (float)(bench_size * (bench_size + 1) / 2);
}

/* One sample set: warmup + iters single-float allreduces; times in us in
 * t[0..iters). Returns 1 if every result was right on this rank. */
static int sample(int method, int warmup, int iters, double *t) {
  float v;
  int64_t one = 1;
  hvd_tensor_t x = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  int ok = 1;

  for (int k = -warmup; k < iters; k++) {
    v = (float)(bench_rank + 1);
    double t0 = bench_now();
    if (method == L_HVD)
      BENCH_HVD(hvd_allreduce("bench.latency", &x, &x, HVD_SUM, 1.0, 1.0));
    else
      BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD));
    double dt = bench_now() - t0;
    if (k >= 0)
      t[k] = dt * 1e6;
    if (v != expected_sum()) {
      if (ok)
        fprintf(stderr,
                "[rank %d] latency %s: sample %d is %g, expected "
                "%g\n",
                bench_rank, method == L_HVD ? "hvd" : "MPI", k, (double)v,
                (double)expected_sum());
      ok = 0;
    }
  }
  return ok;
}

/* The small sub-report for one method: median etc. in us. */
static int small(int method, const bench_opts_t *o, float *vals,
                 hvd_request_t **req, char (*names)[32], bench_stats_t *st) {
  int n = o->small_count, iters = o->small_iters, ok = 1;
  double *t = bench_alloc(sizeof *t * (size_t)iters);
  int64_t one = 1;

  for (int k = -2; k < iters; k++) {
    for (int i = 0; i < n; i++)
      vals[i] = (float)(bench_rank + 1 + i % 5);
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = bench_now();
    if (method == L_HVD) {
      for (int i = 0; i < n; i++) {
        hvd_tensor_t x = hvd_tensor_make(&vals[i], HVD_FLOAT32, 1, &one);
        BENCH_HVD(
            hvd_allreduce_async(names[i], &x, &x, HVD_SUM, 1.0, 1.0, &req[i]));
      }
      for (int i = 0; i < n; i++)
        BENCH_HVD(hvd_wait(req[i]));
    } else {
      for (int i = 0; i < n; i++)
        BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &vals[i], 1, MPI_FLOAT, MPI_SUM,
                                MPI_COMM_WORLD));
    }
    double dt = bench_now() - t0;
    if (k >= 0)
      t[k] = dt * 1e6;
    for (int i = 0; i < n; i++) {
      float want = expected_sum() + (float)(bench_size * (i % 5));
      if (vals[i] != want) {
        if (ok)
          fprintf(stderr,
                  "[rank %d] small %s: tensor %d is %g, expected "
                  "%g\n",
                  bench_rank, method == L_HVD ? "hvd" : "MPI", i,
                  (double)vals[i], (double)want);
        ok = 0;
      }
    }
  }
  bench_max_over_ranks(t, iters);
  *st = bench_stats(t, iters);
  free(t);
  return bench_all_ok(ok);
}

static double process_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The idle sub-report for one method: CPU ms per second asleep (the most
 * of any rank) into *cpu, the first allreduce after (us, median of the
 * slowest rank's) into *first. Returns 1 if every result was right. */
static int idle(int method, double *cpu, double *first) {
  double t[IDLE_REPEATS], c = 0;
  int64_t one = 1;
  float v;
  hvd_tensor_t x = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  int ok = 1;
  for (int k = 0; k < IDLE_REPEATS; k++) {
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    double c0 = process_cpu();
    struct timespec nap = {(time_t)IDLE_S,
                           (long)((IDLE_S - (double)(time_t)IDLE_S) * 1e9)};
    while (nanosleep(&nap, &nap) != 0)
      ;
    c += process_cpu() - c0;
    v = (float)(bench_rank + 1);
    double t0 = bench_now();
    if (method == L_HVD)
      BENCH_HVD(hvd_allreduce("bench.idle", &x, &x, HVD_SUM, 1.0, 1.0));
    else
      BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD));
    t[k] = (bench_now() - t0) * 1e6;
    ok &= v == expected_sum();
  }
  bench_max_over_ranks(t, IDLE_REPEATS);
  *first = bench_stats(t, IDLE_REPEATS).median;
  c = c / (IDLE_S * IDLE_REPEATS) * 1e3;
  BENCH_MPI(MPI_Allreduce(&c, cpu, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return bench_all_ok(ok);
}

static const char *const labels[L_COUNT] = {"hvd_allreduce (blocking)",
                                            "MPI_Allreduce"};
static const char *const keys[L_COUNT] = {"hvd", "mpi"};

/* Every method's results: the latency samples, the small sub-report, the
 * idle one. */
typedef struct latency {
  int iters, warmup, n; /* n: the small sub-report's tensors */
  bench_stats_t lat[L_COUNT], sm[L_COUNT];
  int ok[L_COUNT], sok[L_COUNT], iok[L_COUNT];
  double icpu[L_COUNT], ifirst[L_COUNT];
} latency_t;

/* The samples of each method, a barrier before each set. */
static void run_samples(latency_t *l) {
  int iters = l->iters;
  double *t = bench_alloc(sizeof *t * (size_t)iters);
  for (int m = 0; m < L_COUNT; m++) {
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    l->ok[m] = bench_all_ok(sample(m, l->warmup, iters, t));
    bench_max_over_ranks(t, iters);
    l->lat[m] = bench_stats(t, iters);
  }
  free(t);
}

/* The small sub-report of each method, over the same tensors. */
static void run_small(const bench_opts_t *o, latency_t *l) {
  int n = l->n;
  float *vals = bench_alloc(sizeof *vals * (size_t)n);
  hvd_request_t **req = bench_alloc(sizeof *req * (size_t)n);
  char(*names)[32] = bench_alloc(sizeof *names * (size_t)n);
  for (int i = 0; i < n; i++)
    snprintf(names[i], sizeof names[i], "bench.small.%d", i);
  for (int m = 0; m < L_COUNT; m++)
    l->sok[m] = small(m, o, vals, req, names, &l->sm[m]);
  free(vals);
  free(req);
  free(names);
}

static void latency_json(const bench_opts_t *o, const latency_t *l) {
  const bench_stats_t *lat = l->lat, *sm = l->sm;
  bench_json_header("latency");
  bench_json_int("iters", l->iters);
  bench_json_int("warmup", l->warmup);
  bench_json_open("latency", '[');
  for (int m = 0; m < L_COUNT; m++) {
    bench_json_open(NULL, '{');
    bench_json_str("method", keys[m]);
    bench_json_num("p50_us", lat[m].median);
    bench_json_num("p90_us", lat[m].p90);
    bench_json_num("p99_us", lat[m].p99);
    bench_json_num("min_us", lat[m].min);
    bench_json_num("max_us", lat[m].max);
    bench_json_bool("correct", l->ok[m]);
    bench_json_close('}');
  }
  bench_json_close(']');
  bench_json_num("hvd_over_mpi_p50", lat[L_HVD].median / lat[L_MPI].median);
  bench_json_open("small", '{');
  bench_json_int("tensors", l->n);
  bench_json_int("iters", o->small_iters);
  bench_json_int("warmup", 2);
  bench_json_open("results", '[');
  for (int m = 0; m < L_COUNT; m++) {
    bench_json_open(NULL, '{');
    bench_json_str("method", keys[m]);
    bench_json_num("median_us", sm[m].median);
    bench_json_num("min_us", sm[m].min);
    bench_json_num("max_us", sm[m].max);
    bench_json_num("per_tensor_us", sm[m].median / l->n);
    bench_json_bool("correct", l->sok[m]);
    bench_json_close('}');
  }
  bench_json_close(']');
  bench_json_num("hvd_over_mpi", sm[L_HVD].median / sm[L_MPI].median);
  bench_json_close('}');
  bench_json_open("idle", '{');
  bench_json_num("seconds", IDLE_S);
  bench_json_int("repeats", IDLE_REPEATS);
  bench_json_num("cpu_ms_per_s", l->icpu[L_HVD]);
  bench_json_num("first_us", l->ifirst[L_HVD]);
  bench_json_num("mpi_first_us", l->ifirst[L_MPI]);
  bench_json_bool("correct", l->iok[L_HVD] && l->iok[L_MPI]);
  bench_json_close('}');
  bench_json_close('}');
}

static void latency_text(const bench_opts_t *o, const latency_t *l) {
  const bench_stats_t *lat = l->lat, *sm = l->sm;
  const int *sok = l->sok, *iok = l->iok;
  int n = l->n;
  char env[512];
  printf("# hvd-bench latency: %d rank%s, hvd %s; env: %s\n", bench_size,
         bench_size == 1 ? "" : "s", hvd_version(),
         bench_env_line(env, sizeof env));
  printf("# one float32 (4 B) allreduce, sum in place: %d samples after %d "
         "warmup, back to back; each the slowest rank's time\n",
         l->iters, l->warmup);
  printf("%-26s %9s %9s %9s %9s %9s %5s\n", "method", "p50_us", "p90_us",
         "p99_us", "min_us", "max_us", "check");
  for (int m = 0; m < L_COUNT; m++)
    printf("%-26s %9.2f %9.2f %9.2f %9.2f %9.2f %5s\n", labels[m],
           lat[m].median, lat[m].p90, lat[m].p99, lat[m].min, lat[m].max,
           l->ok[m] ? "ok" : "WRONG");
  printf("hvd / MPI (p50): %.2f\n", lat[L_HVD].median / lat[L_MPI].median);
  printf("# small: %d tensors of 4 B; median of %d iters after 2 warmup, "
         "barrier before each\n",
         n, o->small_iters);
  printf("%-36s %11s %11s %11s %9s %5s\n", "method", "median_us", "min_us",
         "max_us", "per_tensor", "check");
  printf("%-36s %11.1f %11.1f %11.1f %9.2f %5s\n",
         "hvd: allreduce_async each + wait all", sm[L_HVD].median,
         sm[L_HVD].min, sm[L_HVD].max, sm[L_HVD].median / n,
         sok[L_HVD] ? "ok" : "WRONG");
  printf("%-36s %11.1f %11.1f %11.1f %9.2f %5s\n",
         "MPI_Allreduce each (sequential)", sm[L_MPI].median, sm[L_MPI].min,
         sm[L_MPI].max, sm[L_MPI].median / n, sok[L_MPI] ? "ok" : "WRONG");
  printf("hvd / MPI (small): %.2f\n", sm[L_HVD].median / sm[L_MPI].median);
  printf("# idle: every rank sleeps %.0f s, %d times; the CPU its process "
         "spent asleep (the most of any rank), and the first 4-byte "
         "allreduce after (median; MPI's after the same sleeps)\n",
         IDLE_S, IDLE_REPEATS);
  printf("%-12s %13s %11s %15s %5s\n", "idle", "cpu_ms_per_s", "first_us",
         "mpi_first_us", "check");
  printf("%-12s %13.2f %11.1f %15.1f %5s\n", "hvd", l->icpu[L_HVD],
         l->ifirst[L_HVD], l->ifirst[L_MPI],
         iok[L_HVD] && iok[L_MPI] ? "ok" : "WRONG");
  fflush(stdout);
}

int bench_latency(const bench_opts_t *o) {
  latency_t l;
  memset(&l, 0, sizeof l);
  l.iters = o->iters > 0 ? o->iters : 5000;
  l.warmup = o->warmup >= 0 ? o->warmup : 100;
  l.n = o->small_count;

  run_samples(&l);
  run_small(o, &l);
  for (int m = 0; m < L_COUNT; m++)
    l.iok[m] = idle(m, &l.icpu[m], &l.ifirst[m]);

  if (bench_rank == 0 && o->json)
    latency_json(o, &l);
  else if (bench_rank == 0)
    latency_text(o, &l);
  return l.ok[L_HVD] && l.ok[L_MPI] && l.sok[L_HVD] && l.sok[L_MPI] &&
                 l.iok[L_HVD] && l.iok[L_MPI]
             ? 0
             : 1;
}
