/*
 * bench_list.c - list mode: one training step's gradients (a .tensors
 * workload) reduced by hvd and by three raw MPI baselines, in one run.
 *
 *   hvd     every tensor submitted with hvd_allreduce_async (average, in
 *           place) in the file's reverse order, as a backward pass
 *           produces them, then every request waited for
 *   mpi     per tensor, blocking MPI_Allreduce (sum, in place)
 *   imp     per tensor, MPI_Iallreduce; one MPI_Waitall
 *   pack    every tensor copied into one buffer, one MPI_Allreduce, copied
 *           back (all three timed); and `packed` the MPI_Allreduce of that
 *           buffer alone, the floor of what fusion can reach
 *
 * Every method reduces the same tensors (one malloc each, re-filled before
 * each method) in the same order, on MPI_COMM_WORLD for the baselines and
 * on hvd's own communicator for hvd. Each iteration follows a barrier and
 * takes the slowest rank's time; a method reports the median (and min,
 * max) over --iters after --warmup, whose first run is checked: every
 * element must be the exact average (hvd) or sum (MPI). Inputs are small
 * integers whose sum over the ranks is P times a base value.
 *
 * Memory: peak RSS (getrusage) minus the tensors' bytes, before hvd runs,
 * after it, and at the end (also minus the packed buffer), per rank.
 */
#include "bench.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { M_HVD, M_MPI, M_IMPI, M_PACK, M_PACKED, M_COUNT };
static const char *const method_keys[M_COUNT] = {
    "hvd", "mpi_allreduce", "mpi_iallreduce", "pack", "packed_allreduce_only"};

/* ---- the workload file --------------------------------------------------- */

/* ---- values -------------------------------------------------------------- */

static void fill(workload_t *w) {
  for (int t = 0; t < w->count; t++)
    for (int64_t i = 0; i < w->t[t].n; i++)
      w->t[t].data[i] = bench_input_value(t, i, bench_rank);
}

/* Tensor t (or, with packed, the packed buffer: tensors in reverse order)
 * holds factor * base everywhere? Says on stderr where not. */
static int verify(const workload_t *w, const char *method, float factor,
                  int packed) {
  const float *p = w->packed;
  int64_t wrong = 0;
  for (int t = w->count - 1; t >= 0; t--) {
    const float *d = packed ? p : w->t[t].data;
    for (int64_t i = 0; i < w->t[t].n; i++) {
      float want = factor * bench_base_value(t, i);
      if (d[i] != want && wrong++ == 0)
        fprintf(stderr, "[rank %d] %s: %s[%lld] is %g, expected %g\n",
                bench_rank, method, w->t[t].name, (long long)i, (double)d[i],
                (double)want);
    }
    p += w->t[t].n;
  }
  if (wrong > 0)
    fprintf(stderr, "[rank %d] %s: %lld elements wrong\n", bench_rank, method,
            (long long)wrong);
  return wrong == 0;
}

/* ---- the methods --------------------------------------------------------- */

static void run_hvd(workload_t *w, hvd_request_t **req) {
  int k = 0;
  for (int t = w->count - 1; t >= 0; t--) {
    hvd_tensor_t x =
        hvd_tensor_make(w->t[t].data, HVD_FLOAT32, w->t[t].ndim, w->t[t].shape);
    BENCH_HVD(hvd_allreduce_async(w->t[t].name, &x, &x, HVD_AVERAGE, 1.0, 1.0,
                                  &req[k++]));
  }
  for (int i = 0; i < k; i++)
    BENCH_HVD(hvd_wait(req[i]));
}

/* MPI_Allreduce (sum, in place) of n floats, in chunks that fit an int. */
static void allreduce_floats(float *p, int64_t n) {
  while (n > 0) {
    int c = n > (INT_MAX / 2) ? INT_MAX / 2 : (int)n;
    BENCH_MPI(
        MPI_Allreduce(MPI_IN_PLACE, p, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    p += c;
    n -= c;
  }
}

static void pack(workload_t *w) {
  float *p = w->packed;
  for (int t = w->count - 1; t >= 0; t--) {
    memcpy(p, w->t[t].data, sizeof(float) * (size_t)w->t[t].n);
    p += w->t[t].n;
  }
}

static void unpack(workload_t *w) {
  const float *p = w->packed;
  for (int t = w->count - 1; t >= 0; t--) {
    memcpy(w->t[t].data, p, sizeof(float) * (size_t)w->t[t].n);
    p += w->t[t].n;
  }
}

static void run_method(int m, workload_t *w, hvd_request_t **hreq,
                       MPI_Request *mreq) {
  switch (m) {
  case M_HVD:
    run_hvd(w, hreq);
    break;
  case M_MPI:
    for (int t = w->count - 1; t >= 0; t--)
      allreduce_floats(w->t[t].data, w->t[t].n);
    break;
  case M_IMPI: {
    int k = 0;
    for (int t = w->count - 1; t >= 0; t--)
      BENCH_MPI(MPI_Iallreduce(MPI_IN_PLACE, w->t[t].data, (int)w->t[t].n,
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &mreq[k++]));
    BENCH_MPI(MPI_Waitall(k, mreq, MPI_STATUSES_IGNORE));
    break;
  }
  case M_PACK:
    pack(w);
    allreduce_floats(w->packed, w->elems);
    unpack(w);
    break;
  case M_PACKED:
  default:
    allreduce_floats(w->packed, w->elems);
    break;
  }
}

typedef struct lresult {
  bench_stats_t ms;
  int ok;
} lresult_t;

static lresult_t time_method(int m, workload_t *w, const bench_opts_t *o,
                             hvd_request_t **hreq, MPI_Request *mreq) {
  int iters = o->iters > 0 ? o->iters : 10;
  int warmup = o->warmup >= 0 ? o->warmup : 2;
  double *t = bench_alloc(sizeof *t * (size_t)iters);
  lresult_t r;

  fill(w);
  if (m == M_PACKED)
    pack(w);
  BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
  run_method(m, w, hreq, mreq); /* checked, and the first warmup */
  r.ok = verify(w, method_keys[m], m == M_HVD ? 1.0f : (float)bench_size,
                m == M_PACKED);
  r.ok = bench_all_ok(r.ok);
  for (int k = 1; k < warmup; k++)
    run_method(m, w, hreq, mreq);
  for (int k = 0; k < iters; k++) {
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = bench_now();
    run_method(m, w, hreq, mreq);
    t[k] = (bench_now() - t0) * 1e3;
  }
  bench_max_over_ranks(t, iters);
  r.ms = bench_stats(t, iters);
  free(t);
  return r;
}

static int64_t peak_rss_bytes(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0)
    return -1;
  return (int64_t)ru.ru_maxrss * 1024; /* Linux: KiB */
}

/* ---- output -------------------------------------------------------------- */

static const char *const method_labels[M_COUNT] = {
    "hvd: allreduce_async each + wait all", "MPI_Allreduce each (blocking)",
    "MPI_Iallreduce each + MPI_Waitall",    "pack + MPI_Allreduce + unpack",
    "MPI_Allreduce of packed buffer only",
};

enum { RSS_TENSORS, RSS_BEFORE, RSS_HVD, RSS_END, RSS_N };

static void report(const bench_opts_t *o, const workload_t *w,
                   const lresult_t *res, const int64_t *rss) {
  int iters = o->iters > 0 ? o->iters : 10;
  int warmup = o->warmup >= 0 ? o->warmup : 2;
  double bytes = (double)w->elems * sizeof(float);
  double hvd = res[M_HVD].ms.median;
  int best = M_MPI;
  char sz[32], env[512];
  const double mib = 1024.0 * 1024.0;

  for (int m = M_MPI; m <= M_PACK; m++)
    if (res[m].ms.median < res[best].ms.median)
      best = m;
  if (o->json) {
    bench_json_header("list");
    bench_json_open("workload", '{');
    bench_json_str("file", o->tensors);
    bench_json_int("tensors", w->count);
    bench_json_int("elements", w->elems);
    bench_json_int("bytes", (int64_t)bytes);
    bench_json_str("dtype", "float32");
    bench_json_close('}');
    bench_json_int("iters", iters);
    bench_json_int("warmup", warmup);
    bench_json_open("results", '[');
    for (int m = 0; m < M_COUNT; m++) {
      double alg = bytes / (res[m].ms.median * 1e-3) / 1e9;
      bench_json_open(NULL, '{');
      bench_json_str("method", method_keys[m]);
      bench_json_str("description", method_labels[m]);
      bench_json_num("median_ms", res[m].ms.median);
      bench_json_num("min_ms", res[m].ms.min);
      bench_json_num("max_ms", res[m].ms.max);
      bench_json_num("algbw_gbps", alg);
      bench_json_num("busbw_gbps", alg * 2.0 * (bench_size - 1) / bench_size);
      bench_json_num("hvd_over_this", hvd / res[m].ms.median);
      bench_json_bool("correct", res[m].ok);
      bench_json_close('}');
    }
    bench_json_close(']');
    bench_json_str("best_baseline", method_keys[best]);
    bench_json_num("hvd_over_best_baseline", hvd / res[best].ms.median);
    bench_json_open("memory", '[');
    for (int r = 0; r < bench_size; r++) {
      const int64_t *x = rss + RSS_N * r;
      bench_json_open(NULL, '{');
      bench_json_int("rank", r);
      bench_json_int("tensor_bytes", x[RSS_TENSORS]);
      bench_json_int("peak_rss_before_hvd", x[RSS_BEFORE]);
      bench_json_int("peak_rss_after_hvd", x[RSS_HVD]);
      bench_json_int("peak_rss_end", x[RSS_END]);
      bench_json_int("overhead_before_hvd", x[RSS_BEFORE] - x[RSS_TENSORS]);
      bench_json_int("overhead_after_hvd", x[RSS_HVD] - x[RSS_TENSORS]);
      bench_json_int("hvd_added", x[RSS_HVD] - x[RSS_BEFORE]);
      bench_json_close('}');
    }
    bench_json_close(']');
    bench_json_close('}');
    return;
  }

  printf("# hvd-bench list: %s: %d tensors, %s float32 (%lld elements); "
         "%d rank%s; hvd %s\n",
         o->tensors, w->count, bench_bytes_str(bytes, sz, sizeof sz),
         (long long)w->elems, bench_size, bench_size == 1 ? "" : "s",
         hvd_version());
  printf("# median of %d iters after %d warmup, barrier before each, "
         "slowest rank's time; env: %s\n",
         iters, warmup, bench_env_line(env, sizeof env));
  printf("%-38s %10s %10s %10s %8s %8s %8s %5s\n", "method", "median_ms",
         "min_ms", "max_ms", "algbw", "busbw", "hvd/this", "check");
  for (int m = 0; m < M_COUNT; m++) {
    double alg = bytes / (res[m].ms.median * 1e-3) / 1e9;
    printf("%-38s %10.3f %10.3f %10.3f %8.3f %8.3f %8.3f %5s\n",
           method_labels[m], res[m].ms.median, res[m].ms.min, res[m].ms.max,
           alg, alg * 2.0 * (bench_size - 1) / bench_size,
           hvd / res[m].ms.median, res[m].ok ? "ok" : "WRONG");
  }
  printf("hvd / best baseline (%s): %.3f\n", method_labels[best],
         hvd / res[best].ms.median);
  printf("# memory per rank, MiB: peak RSS minus the tensors' %.1f MiB "
         "(end: minus the packed buffer too)\n",
         (double)rss[RSS_TENSORS] / mib);
  printf("%4s %12s %12s %12s %12s\n", "rank", "before_hvd", "after_hvd",
         "hvd_added", "end");
  for (int r = 0; r < bench_size; r++) {
    const int64_t *x = rss + RSS_N * r;
    printf("%4d %12.1f %12.1f %12.1f %12.1f\n", r,
           (double)(x[RSS_BEFORE] - x[RSS_TENSORS]) / mib,
           (double)(x[RSS_HVD] - x[RSS_TENSORS]) / mib,
           (double)(x[RSS_HVD] - x[RSS_BEFORE]) / mib,
           (double)(x[RSS_END] - 2 * x[RSS_TENSORS]) / mib);
  }
  fflush(stdout);
}

int bench_list(const bench_opts_t *o) {
  workload_t w;
  lresult_t res[M_COUNT];
  int64_t mine[RSS_N], *rss = NULL;
  int ok = 1;

  if (o->device_gpu)
    return bench_list_gpu(o);

  if (!bench_load_workload(o->tensors, &w, 1))
    return 2;
  hvd_request_t **hreq = bench_alloc(sizeof *hreq * (size_t)w.count);
  MPI_Request *mreq = bench_alloc(sizeof *mreq * (size_t)w.count);

  fill(&w); /* touches every tensor page before measuring */
  mine[RSS_TENSORS] = w.elems * (int64_t)sizeof(float);
  mine[RSS_BEFORE] = peak_rss_bytes();
  res[M_HVD] = time_method(M_HVD, &w, o, hreq, mreq);
  mine[RSS_HVD] = peak_rss_bytes();

  w.packed = bench_alloc(sizeof(float) * (size_t)w.elems);
  for (int m = M_MPI; m < M_COUNT; m++)
    res[m] = time_method(m, &w, o, hreq, mreq);
  mine[RSS_END] = peak_rss_bytes();

  if (bench_rank == 0)
    rss = bench_alloc(sizeof *rss * RSS_N * (size_t)bench_size);
  BENCH_MPI(MPI_Gather(mine, RSS_N, MPI_INT64_T, rss, RSS_N, MPI_INT64_T, 0,
                       MPI_COMM_WORLD));
  if (bench_rank == 0)
    report(o, &w, res, rss);
  for (int m = 0; m < M_COUNT; m++)
    ok &= res[m].ok;
  free(rss);
  free(hreq);
  free(mreq);
  bench_free_workload(&w);
  return ok ? 0 : 1;
}
