/*
 * bench_list.c - list and mpi-list modes: one training step's gradients (a
 * .tensors workload) reduced by hvd, and by the raw MPI ways a user would
 * pick instead, each in a process of its own.
 *
 * list (hvd_init'ed; hvd's engine thread alive):
 *   hvd     every tensor submitted with hvd_allreduce_async (average, in
 *           place) in the file's reverse order, as a backward pass
 *           produces them, then every request waited for
 *   copy    every rank at once copies the workload's N bytes, packed in
 *           one buffer, into another with one memcpy (glibc streams a
 *           copy that large with non-temporal stores: N read, N written):
 *           the memory system's speed in this run, from which the floor
 *           of an allreduce's memory traffic is worked out (floor_ms)
 *
 * mpi-list (a plain MPI program: MPI_Init at the default thread level, no
 * hvd_init, no engine thread), the baselines, on MPI_COMM_WORLD:
 *   copy    as above
 *   mpi     per tensor, blocking MPI_Allreduce (sum, in place)
 *   imp     per tensor, MPI_Iallreduce; one MPI_Waitall
 *   pack    every tensor copied into one buffer, one MPI_Allreduce, copied
 *           back (all three timed)
 *   bucket  DDP's way: tensors in reverse order packed into buckets of at
 *           most --bucket-bytes (25 MiB), each MPI_Iallreduce'd as soon as
 *           it is full, then all waited for and unpacked
 *   packed  the MPI_Allreduce of the packed buffer alone: the floor of
 *           what fusion can reach, not a method
 *
 * Baselines measured inside hvd's process run at MPI_THREAD_MULTIPLE next
 * to the engine thread and were up to 7x slower than the same calls in a
 * plain program; hence two processes. bench/allreduce-ratio.sh runs them
 * alternately and prints the ratios (doc/bench.md, "list").
 *
 * Every method reduces the same tensors (one malloc or hvd_alloc_host
 * each, --alloc, re-filled before each method) in the same order; list
 * without --alloc runs twice, malloc then hvd_alloc_host. Each
 * iteration follows a barrier and takes the slowest rank's time; a method
 * reports the median (and min, max) over --iters after --warmup, whose
 * first run is checked: every element must be the exact average (hvd) or
 * sum (MPI). Inputs are small integers whose sum over the ranks is P times
 * a base value.
 *
 * Memory (list): peak RSS (getrusage) minus the tensors' bytes, before hvd
 * runs, after it, and at the end (also minus the packed buffer), per rank.
 */
#include "bench.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { M_HVD, M_COPY, M_MPI, M_IMPI, M_PACK, M_BUCKET, M_PACKED, M_COUNT };
static const char *const method_keys[M_COUNT] = {
    "hvd",  "copy",   "mpi_allreduce",        "mpi_iallreduce",
    "pack", "bucket", "packed_allreduce_only"};

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

/* The copy's destination: N bytes, allocated as the tensors are. */
static float *copy_dst;

/* DDP's buckets: tensors in reverse order, each bucket at most
 * bucket_bytes (a larger tensor alone), reduced with MPI_Iallreduce as soon
 * as it is packed; then all waited for and unpacked. */
static void run_buckets(workload_t *w, int64_t bucket_bytes,
                        MPI_Request *mreq) {
  int64_t cap = bucket_bytes / (int64_t)sizeof(float), start = 0, used = 0;
  int k = 0;
  float *p = w->packed;
  for (int t = w->count - 1; t >= 0; t--) {
    if (used > 0 && used + w->t[t].n > cap) { /* close the bucket */
      BENCH_MPI(MPI_Iallreduce(MPI_IN_PLACE, w->packed + start, (int)used,
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &mreq[k++]));
      start += used;
      used = 0;
    }
    memcpy(p, w->t[t].data, sizeof(float) * (size_t)w->t[t].n);
    p += w->t[t].n;
    used += w->t[t].n;
  }
  if (used > 0)
    BENCH_MPI(MPI_Iallreduce(MPI_IN_PLACE, w->packed + start, (int)used,
                             MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &mreq[k++]));
  BENCH_MPI(MPI_Waitall(k, mreq, MPI_STATUSES_IGNORE));
  unpack(w);
}

static void run_method(int m, workload_t *w, const bench_opts_t *o,
                       hvd_request_t **hreq, MPI_Request *mreq) {
  switch (m) {
  case M_HVD:
    run_hvd(w, hreq);
    break;
  case M_COPY:
    memcpy(copy_dst, w->packed, sizeof(float) * (size_t)w->elems);
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
  case M_BUCKET:
    run_buckets(w, o->bucket_bytes, mreq);
    break;
  case M_PACKED:
  default:
    allreduce_floats(w->packed, w->elems);
    break;
  }
}

/* The copy left every rank's own inputs in its destination? */
static int verify_copy(const workload_t *w) {
  const float *p = copy_dst;
  for (int t = w->count - 1; t >= 0; t--) {
    for (int64_t i = 0; i < w->t[t].n; i++)
      if (p[i] != bench_input_value(t, i, bench_rank)) {
        fprintf(stderr, "[rank %d] copy: %s[%lld] is %g, expected %g\n",
                bench_rank, w->t[t].name, (long long)i, (double)p[i],
                (double)bench_input_value(t, i, bench_rank));
        return 0;
      }
    p += w->t[t].n;
  }
  return 1;
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
  if (m == M_PACKED || m == M_COPY)
    pack(w);
  BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
  run_method(m, w, o, hreq, mreq); /* checked, and the first warmup */
  r.ok = m == M_COPY
             ? verify_copy(w)
             : verify(w, method_keys[m], m == M_HVD ? 1.0f : (float)bench_size,
                      m == M_PACKED);
  r.ok = bench_all_ok(r.ok);
  for (int k = 1; k < warmup; k++)
    run_method(m, w, o, hreq, mreq);
  for (int k = 0; k < iters; k++) {
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = bench_now();
    run_method(m, w, o, hreq, mreq);
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
    "hvd: allreduce_async each + wait all",
    "memcpy of all the bytes (all ranks)",
    "MPI_Allreduce each (blocking)",
    "MPI_Iallreduce each + MPI_Waitall",
    "pack + MPI_Allreduce + unpack",
    "buckets: pack + MPI_Iallreduce each",
    "MPI_Allreduce of packed buffer only",
};

enum { RSS_TENSORS, RSS_BEFORE, RSS_HVD, RSS_END, RSS_N };

/* The floor of an allreduce's memory traffic on this machine, in this
 * run: each rank reads its own tensors (N bytes), reads the peers' share
 * of the reduction ((P-1)/P N) and writes its result (N); the copy moved
 * 2N bytes (read and written) in copy_ms. */
static double floor_ms(double copy_ms) {
  return copy_ms * (2.0 + (double)(bench_size - 1) / bench_size) / 2.0;
}

static const char *alloc_name(int alloc) {
  return alloc == BENCH_DATA_HVD ? "hvd_alloc_host" : "malloc";
}

/* The methods ms[0..n) as rows (text or JSON); ref >= 0 adds a column of
 * res[ref]'s median over each row's. */
static void rows(const bench_opts_t *o, const workload_t *w,
                 const lresult_t *res, const int *ms, int n, int ref) {
  double bytes = (double)w->elems * sizeof(float);
  if (!o->json) {
    printf("%-38s %10s %10s %10s %8s %8s %8s %5s\n", "method", "median_ms",
           "min_ms", "max_ms", "algbw", "busbw", ref == M_HVD ? "hvd/this" : "",
           "check");
  }
  for (int k = 0; k < n; k++) {
    const lresult_t *r = &res[ms[k]];
    double alg = bytes / (r->ms.median * 1e-3) / 1e9;
    double bus = alg * 2.0 * (bench_size - 1) / bench_size;
    if (o->json) {
      bench_json_open(NULL, '{');
      bench_json_str("method", method_keys[ms[k]]);
      bench_json_str("description", method_labels[ms[k]]);
      bench_json_num("median_ms", r->ms.median);
      bench_json_num("min_ms", r->ms.min);
      bench_json_num("max_ms", r->ms.max);
      bench_json_num("algbw_gbps", alg);
      bench_json_num("busbw_gbps", bus);
      bench_json_bool("correct", r->ok);
      bench_json_close('}');
    } else {
      char ratio[16] = "";
      if (ref >= 0)
        snprintf(ratio, sizeof ratio, "%8.3f",
                 res[ref].ms.median / r->ms.median);
      printf("%-38s %10.3f %10.3f %10.3f %8.3f %8.3f %8s %5s\n",
             method_labels[ms[k]], r->ms.median, r->ms.min, r->ms.max, alg, bus,
             ratio, r->ok ? "ok" : "WRONG");
    }
  }
}

static void header(const bench_opts_t *o, const workload_t *w, const char *mode,
                   const char *what) {
  int iters = o->iters > 0 ? o->iters : 10;
  int warmup = o->warmup >= 0 ? o->warmup : 2;
  char sz[32], env[512];
  if (o->json) {
    bench_json_header(mode);
    bench_json_open("workload", '{');
    bench_json_str("file", o->tensors);
    bench_json_int("tensors", w->count);
    bench_json_int("elements", w->elems);
    bench_json_int("bytes", w->elems * (int64_t)sizeof(float));
    bench_json_str("dtype", "float32");
    bench_json_str("alloc", alloc_name(o->alloc));
    bench_json_close('}');
    bench_json_int("iters", iters);
    bench_json_int("warmup", warmup);
    return;
  }
  printf("# hvd-bench %s: %s: %d tensors, %s float32 (%lld elements, %s); "
         "%d rank%s; %s\n",
         mode, o->tensors, w->count,
         bench_bytes_str((double)w->elems * sizeof(float), sz, sizeof sz),
         (long long)w->elems, alloc_name(o->alloc), bench_size,
         bench_size == 1 ? "" : "s", what);
  printf("# median of %d iters after %d warmup, barrier before each, "
         "slowest rank's time; env: %s\n",
         iters, warmup, bench_env_line(env, sizeof env));
}

static void report_memory(const bench_opts_t *o, const int64_t *rss) {
  const double mib = 1024.0 * 1024.0;
  if (o->json) {
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
    return;
  }
  printf("# memory per rank, MiB: peak RSS minus the tensors' %.1f MiB "
         "(end: minus the two copy buffers too)\n",
         (double)rss[RSS_TENSORS] / mib);
  printf("%4s %12s %12s %12s %12s\n", "rank", "before_hvd", "after_hvd",
         "hvd_added", "end");
  for (int r = 0; r < bench_size; r++) {
    const int64_t *x = rss + RSS_N * r;
    printf("%4d %12.1f %12.1f %12.1f %12.1f\n", r,
           (double)(x[RSS_BEFORE] - x[RSS_TENSORS]) / mib,
           (double)(x[RSS_HVD] - x[RSS_TENSORS]) / mib,
           (double)(x[RSS_HVD] - x[RSS_BEFORE]) / mib,
           (double)(x[RSS_END] - 3 * x[RSS_TENSORS]) / mib);
  }
}

static void report_list(const bench_opts_t *o, const workload_t *w,
                        const lresult_t *res, const int64_t *rss) {
  static const int ms[] = {M_HVD, M_COPY};
  double hvd = res[M_HVD].ms.median, copy = res[M_COPY].ms.median;
  char what[64];
  snprintf(what, sizeof what, "hvd %s", hvd_version());
  header(o, w, "list", what);
  if (o->json)
    bench_json_open("results", '[');
  rows(o, w, res, ms, BENCH_COUNT(ms), M_HVD);
  if (o->json) {
    bench_json_close(']');
    bench_json_num("copy_ms", copy);
    bench_json_num("floor_ms", floor_ms(copy));
    bench_json_num("hvd_over_copy", hvd / copy);
    bench_json_num("hvd_over_floor", hvd / floor_ms(copy));
    report_memory(o, rss);
    bench_json_close('}');
    return;
  }
  printf("memory-traffic floor: %.3f ms (the copy's bandwidth; each rank "
         "reads its N bytes and the peers' (P-1)/P N, writes N)\n",
         floor_ms(copy));
  printf("summary: hvd_ms=%.3f copy_ms=%.3f floor_ms=%.3f "
         "hvd/floor=%.3f\n",
         hvd, copy, floor_ms(copy), hvd / floor_ms(copy));
  printf("# raw MPI baselines: hvd-bench mpi-list in a process of its own "
         "(bench/allreduce-ratio.sh alternates the two)\n");
  report_memory(o, rss);
  fflush(stdout);
}

static void report_mpi(const bench_opts_t *o, const workload_t *w,
                       const lresult_t *res) {
  static const int ms[] = {M_COPY, M_MPI, M_IMPI, M_PACK, M_BUCKET, M_PACKED};
  double copy = res[M_COPY].ms.median;
  char what[128], sz[32];
  int best = M_MPI;
  for (int m = M_MPI; m <= M_BUCKET; m++)
    if (res[m].ms.median < res[best].ms.median)
      best = m;
  snprintf(what, sizeof what, "plain MPI process (no hvd_init); buckets of %s",
           bench_bytes_str((double)o->bucket_bytes, sz, sizeof sz));
  header(o, w, "mpi-list", what);
  if (o->json) {
    bench_json_int("bucket_bytes", o->bucket_bytes);
    bench_json_open("results", '[');
  }
  rows(o, w, res, ms, BENCH_COUNT(ms), -1);
  if (o->json) {
    bench_json_close(']');
    bench_json_str("best", method_keys[best]);
    bench_json_num("best_ms", res[best].ms.median);
    bench_json_num("copy_ms", copy);
    bench_json_num("floor_ms", floor_ms(copy));
    bench_json_close('}');
    return;
  }
  printf("best raw MPI way: %s, %.3f ms\n", method_labels[best],
         res[best].ms.median);
  printf("summary: best=%s best_ms=%.3f copy_ms=%.3f floor_ms=%.3f\n",
         method_keys[best], res[best].ms.median, copy, floor_ms(copy));
  fflush(stdout);
}

static int all_ok(const lresult_t *res, const int *ms, int n) {
  int ok = 1;
  for (int k = 0; k < n; k++)
    ok &= res[ms[k]].ok;
  return ok;
}

/* list with one memory, o->alloc */
static int list_one(const bench_opts_t *o) {
  workload_t w;
  lresult_t res[M_COUNT];
  int64_t mine[RSS_N], *rss = NULL;
  static const int ms[] = {M_HVD, M_COPY};

  if (!bench_load_workload(o->tensors, &w, o->alloc))
    return 2;
  hvd_request_t **hreq = bench_alloc(sizeof *hreq * (size_t)w.count);

  fill(&w); /* touches every tensor page before measuring */
  mine[RSS_TENSORS] = w.elems * (int64_t)sizeof(float);
  mine[RSS_BEFORE] = peak_rss_bytes();
  res[M_HVD] = time_method(M_HVD, &w, o, hreq, NULL);
  mine[RSS_HVD] = peak_rss_bytes();
  w.packed = bench_alloc_as(o->alloc, sizeof(float) * (size_t)w.elems);
  copy_dst = bench_alloc_as(o->alloc, sizeof(float) * (size_t)w.elems);
  res[M_COPY] = time_method(M_COPY, &w, o, hreq, NULL);
  mine[RSS_END] = peak_rss_bytes();

  if (bench_rank == 0)
    rss = bench_alloc(sizeof *rss * RSS_N * (size_t)bench_size);
  BENCH_MPI(MPI_Gather(mine, RSS_N, MPI_INT64_T, rss, RSS_N, MPI_INT64_T, 0,
                       MPI_COMM_WORLD));
  if (bench_rank == 0)
    report_list(o, &w, res, rss);
  free(rss);
  free(hreq);
  bench_free_as(o->alloc, copy_dst);
  bench_free_workload(&w);
  return all_ok(res, ms, BENCH_COUNT(ms)) ? 0 : 1;
}

/* Without --alloc, both memories, malloc first (what most programs pass),
 * each reported whole, so that nobody takes the arena's number for the
 * general one; with --json, one document whose "runs" holds the two. */
int bench_list(const bench_opts_t *o) {
  if (o->device_gpu)
    return bench_list_gpu(o);
  if (o->alloc_given)
    return list_one(o);
  bench_opts_t one = *o;
  if (o->json && bench_rank == 0) {
    bench_json_open(NULL, '{');
    bench_json_str("mode", "list");
    bench_json_open("runs", '[');
  }
  one.alloc = BENCH_DATA_MALLOC;
  int rc = list_one(&one);
  one.alloc = BENCH_DATA_HVD;
  int rc2 = list_one(&one);
  if (o->json && bench_rank == 0) {
    bench_json_close(']');
    bench_json_close('}');
  }
  return rc > rc2 ? rc : rc2;
}

int bench_mpi_list(const bench_opts_t *o) {
  workload_t w;
  lresult_t res[M_COUNT];
  static const int ms[] = {M_COPY, M_MPI, M_IMPI, M_PACK, M_BUCKET, M_PACKED};

  if (!bench_load_workload(o->tensors, &w, o->alloc))
    return 2;
  MPI_Request *mreq = bench_alloc(sizeof *mreq * (size_t)w.count);
  w.packed = bench_alloc_as(o->alloc, sizeof(float) * (size_t)w.elems);
  copy_dst = bench_alloc_as(o->alloc, sizeof(float) * (size_t)w.elems);
  fill(&w);
  for (int k = 0; k < BENCH_COUNT(ms); k++)
    res[ms[k]] = time_method(ms[k], &w, o, NULL, mreq);
  if (bench_rank == 0)
    report_mpi(o, &w, res);
  free(mreq);
  bench_free_as(o->alloc, copy_dst);
  bench_free_workload(&w);
  return all_ok(res, ms, BENCH_COUNT(ms)) ? 0 : 1;
}
