/*
 * bench_sweep.c - sweep mode and the quick self-check.
 *
 * A case is one collective on one dtype (and op, for reductions), in or
 * out of place, on one message size. Each case: fill the inputs, run once
 * and check the result on every rank (this run is also the first warmup),
 * run the rest of the warmup, then time each iteration after a barrier.
 * An iteration's time is the slowest rank's; the row reports the median,
 * min and max over the iterations and, at the median, algbw = bytes /
 * time and busbw = algbw * the nccl-tests factor of the collective. The
 * last iteration's result is checked too (see to_identity for in-place
 * sums and products).
 *
 * Sizes follow nccl-tests: `bytes` is the allreduce/broadcast tensor, the
 * allgather output, the alltoall send buffer (per rank) and the
 * reducescatter input (per rank); the last three are rounded down to a
 * multiple of the world size P in elements.
 *
 * Inputs are small integers that depend on rank and index, so every
 * result is exact in every dtype (float16 and bfloat16 included) at up to
 * 127 ranks: sums within +-96 (+-1 per rank above 32 ranks), products
 * within +-64, float averages from inputs whose sum divides by P (integer
 * averages truncate toward zero, as hvd.h says). The inputs repeat with
 * period PERIOD, so the expected results of a reduction are computed once
 * per case over one period.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PERIOD 5460 /* 2^2 * 3 * 5 * 7 * 13: every input period divides it */
#define POISON 77   /* what an out-of-place output holds before the call */

typedef struct scase {
  enum bench_coll coll;
  hvd_dtype_t dtype;
  hvd_op_t op; /* reductions only */
  int inplace;
  int64_t count; /* elements of the message (see the comment on top) */
  int iters, warmup;
} scase_t;

static int is_reduction(enum bench_coll c) {
  return c == BENCH_ALLREDUCE || c == BENCH_REDUCESCATTER;
}

/* The places a collective supports (BENCH_*_PLACE bits). */
static unsigned places_of(enum bench_coll c) {
  switch (c) {
  case BENCH_ALLREDUCE:
    return BENCH_OUT_OF_PLACE | BENCH_IN_PLACE;
  case BENCH_BROADCAST:
    return BENCH_IN_PLACE;
  default:
    return BENCH_OUT_OF_PLACE;
  }
}

/* nccl-tests' busbw / algbw. */
static double bus_factor(enum bench_coll c, int p) {
  switch (c) {
  case BENCH_ALLREDUCE:
    return 2.0 * (p - 1) / p;
  case BENCH_BROADCAST:
    return 1.0;
  default:
    return (double)(p - 1) / p;
  }
}

/* ---- inputs and expected results ----------------------------------------- */

/* Rank r's input element i of a reduction. */
static int64_t reduce_input(hvd_op_t op, hvd_dtype_t dt, int r, int64_t i) {
  int64_t a = bench_size <= 32 ? 3 : 1; /* amplitude */
  int sgn = dt != HVD_UINT8;
  if (op == HVD_AVERAGE && bench_is_float(dt)) {
    /* a base value shared by all ranks, plus offsets that cancel in pairs
     * of ranks (2k, 2k+1): the sum is exactly P * base */
    int64_t base = i % (2 * a + 1) - a;
    if (r % 2 == 0 && r + 1 < bench_size)
      return base + (i + r) % (a + 1);
    if (r % 2 == 1)
      return base - (i + r - 1) % (a + 1);
    return base;
  }
  switch (op) {
  case HVD_AVERAGE: /* integer averages use the sum's inputs */
  case HVD_SUM:
    return sgn ? (i + 2 * r) % (2 * a + 1) - a : (i + 2 * r) % (a + 1);
  case HVD_MIN:
  case HVD_MAX:
    return sgn ? (i * 7 + r * 3) % (4 * a + 1) - 2 * a
               : (i * 7 + r * 3) % (4 * a + 1);
  case HVD_PRODUCT:
  default:
    switch ((i + r) % 4) {
    case 0:
      return r < 6 ? 2 : 1;
    case 1:
      return sgn ? -1 : 1;
    default:
      return 1;
    }
  }
}

/* The reduction over all ranks of element i. */
static int64_t reduce_expect(hvd_op_t op, hvd_dtype_t dt, int64_t i) {
  int64_t acc = reduce_input(op, dt, 0, i);
  for (int r = 1; r < bench_size; r++) {
    int64_t v = reduce_input(op, dt, r, i);
    switch (op) {
    case HVD_MIN:
      acc = v < acc ? v : acc;
      break;
    case HVD_MAX:
      acc = v > acc ? v : acc;
      break;
    case HVD_PRODUCT:
      acc *= v;
      break;
    default:
      acc += v;
      break;
    }
  }
  return op == HVD_AVERAGE ? acc / bench_size : acc; /* C truncates */
}

static int64_t bcast_value(int r, int64_t i) { return (i * 5 + r * 3) % 11; }
static int64_t gather_value(int r, int64_t j) { return (r * 7 + j * 3) % 17; }
static int64_t a2a_value(int src, int dst, int64_t j) {
  return (src * 5 + dst * 3 + j) % 19;
}

/* Rows of dimension 0 that rank r gets from reducescatter of n rows, and
 * the first of them. */
static int64_t rs_rows(int64_t n, int r) {
  return n / bench_size + (r < n % bench_size);
}
static int64_t rs_first(int64_t n, int r) {
  return r * (n / bench_size) + (r < n % bench_size ? r : n % bench_size);
}

/* ---- one case ------------------------------------------------------------ */

typedef struct sbuf {
  hvd_tensor_t send, recv;  /* recv: allreduce out of place only */
  int64_t *recv_splits;     /* alltoall */
  int64_t per;              /* allgather, alltoall: elements per rank */
  double *in_tab, *out_tab; /* reductions: inputs, results over PERIOD */
  char name[128];
} sbuf_t;

static hvd_tensor_t make_1d(hvd_dtype_t dt, int64_t n) {
  void *data = bench_alloc((size_t)n * hvd_dtype_size(dt));
  return hvd_tensor_make(data, dt, 1, &n);
}

static void setup(const scase_t *c, sbuf_t *b) {
  int64_t n = c->count, send_n = n;
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "bench.%s.%s.%s.%s.%lld",
           bench_coll_name(c->coll), hvd_dtype_name(c->dtype),
           is_reduction(c->coll) ? hvd_op_name(c->op) : "-",
           c->inplace ? "in" : "out", (long long)n);
  b->per = n / bench_size;
  if (c->coll == BENCH_ALLGATHER)
    send_n = b->per;
  b->send = make_1d(c->dtype, send_n);

  if (is_reduction(c->coll)) {
    b->in_tab = bench_alloc(PERIOD * sizeof *b->in_tab);
    b->out_tab = bench_alloc(PERIOD * sizeof *b->out_tab);
    for (int64_t i = 0; i < PERIOD; i++) {
      b->in_tab[i] = (double)reduce_input(c->op, c->dtype, bench_rank, i);
      b->out_tab[i] = (double)reduce_expect(c->op, c->dtype, i);
    }
  }
  for (int64_t i = 0; i < send_n; i++) {
    double v;
    switch (c->coll) {
    case BENCH_BROADCAST:
      v = (double)bcast_value(bench_rank, i);
      break;
    case BENCH_ALLGATHER:
      v = (double)gather_value(bench_rank, i);
      break;
    case BENCH_ALLTOALL:
      v = (double)a2a_value(bench_rank, (int)(i / b->per), i % b->per);
      break;
    default:
      v = b->in_tab[i % PERIOD];
      break;
    }
    bench_put(b->send.data, c->dtype, i, v);
  }
  if (c->coll == BENCH_ALLREDUCE && !c->inplace) {
    b->recv = make_1d(c->dtype, n);
    for (int64_t i = 0; i < n; i++)
      bench_put(b->recv.data, c->dtype, i, POISON);
  }
  if (c->coll == BENCH_ALLTOALL)
    b->recv_splits = bench_alloc(sizeof *b->recv_splits * (size_t)bench_size);
}

static void teardown(sbuf_t *b) {
  free(b->send.data);
  free(b->recv.data);
  free(b->recv_splits);
  free(b->in_tab);
  free(b->out_tab);
}

/* An in-place sum or product would grow its data every iteration (to
 * overflow, inf and nan); after the checked run such a case goes on with
 * the identity of the op in every element and on every rank, which the
 * op keeps as it is, and so the last run is checked against it. */
static void to_identity(const scase_t *c, sbuf_t *b) {
  double id = c->op == HVD_PRODUCT ? 1.0 : 0.0;
  for (int64_t i = 0; i < c->count; i++)
    bench_put(b->send.data, c->dtype, i, id);
  for (int64_t i = 0; i < PERIOD; i++)
    b->out_tab[i] = id;
}

/* Runs the collective once (submit and wait). Outputs that hvd allocates
 * land in *out, which the caller frees with hvd_tensor_free. */
static void run_once(const scase_t *c, const bench_opts_t *o, sbuf_t *b,
                     hvd_tensor_t *out) {
  hvd_request_t *req = NULL;
  switch (c->coll) {
  case BENCH_ALLREDUCE:
    BENCH_HVD(hvd_allreduce_async(b->name, &b->send,
                                  c->inplace ? &b->send : &b->recv, c->op, 1.0,
                                  1.0, &req));
    break;
  case BENCH_BROADCAST:
    BENCH_HVD(hvd_broadcast_async(b->name, &b->send, o->root, &req));
    break;
  case BENCH_ALLGATHER:
    BENCH_HVD(hvd_allgather_async(b->name, &b->send, out, &req));
    break;
  case BENCH_ALLTOALL:
    BENCH_HVD(
        hvd_alltoall_async(b->name, &b->send, NULL, out, b->recv_splits, &req));
    break;
  case BENCH_REDUCESCATTER:
  default:
    BENCH_HVD(
        hvd_reducescatter_async(b->name, &b->send, out, c->op, 1.0, 1.0, &req));
    break;
  }
  BENCH_HVD(hvd_wait(req));
}

static void case_label(const scase_t *c, char *buf, size_t len) {
  char sz[32];
  snprintf(buf, len, "%s %s%s%s %s-place %s", bench_coll_name(c->coll),
           hvd_dtype_name(c->dtype), is_reduction(c->coll) ? " " : "",
           is_reduction(c->coll) ? hvd_op_name(c->op) : "",
           c->inplace ? "in" : "out-of",
           bench_bytes_str((double)c->count * (double)hvd_dtype_size(c->dtype),
                           sz, sizeof sz));
}

/* Checks this rank's result; says on stderr what is wrong. 1 if right. */
static int check(const scase_t *c, const bench_opts_t *o, const sbuf_t *b,
                 const hvd_tensor_t *out, const char *when) {
  const hvd_tensor_t *res = out;
  int64_t n = c->count, first = 0, wrong = 0;
  double got_first = 0, want_first = 0;
  char label[160];

  switch (c->coll) {
  case BENCH_ALLREDUCE:
    res = c->inplace ? &b->send : &b->recv;
    break;
  case BENCH_BROADCAST:
    res = &b->send;
    break;
  case BENCH_REDUCESCATTER:
    n = rs_rows(c->count, bench_rank);
    break;
  default:
    break;
  }
  case_label(c, label, sizeof label);
  if (res->dtype != c->dtype || res->ndim != 1 || res->shape[0] != n ||
      (n > 0 && res->data == NULL)) {
    fprintf(stderr,
            "[rank %d] %s (%s): result is %s, ndim %d, %lld elements; "
            "expected %s, 1, %lld\n",
            bench_rank, label, when, hvd_dtype_name(res->dtype), res->ndim,
            res->ndim > 0 ? (long long)res->shape[0] : -1LL,
            hvd_dtype_name(c->dtype), (long long)n);
    return 0;
  }
  int64_t off =
      c->coll == BENCH_REDUCESCATTER ? rs_first(c->count, bench_rank) : 0;
  for (int64_t k = 0; k < n; k++) {
    double want, got = bench_get(res->data, c->dtype, k);
    switch (c->coll) {
    case BENCH_BROADCAST:
      want = (double)bcast_value(o->root, k);
      break;
    case BENCH_ALLGATHER:
      want = (double)gather_value((int)(k / b->per), k % b->per);
      break;
    case BENCH_ALLTOALL:
      want = (double)a2a_value((int)(k / b->per), bench_rank, k % b->per);
      break;
    default:
      want = b->out_tab[(k + off) % PERIOD];
      break;
    }
    if (got != want && wrong++ == 0) {
      first = k;
      got_first = got;
      want_first = want;
    }
  }
  if (c->coll == BENCH_ALLTOALL)
    for (int r = 0; r < bench_size; r++)
      if (b->recv_splits[r] != b->per) {
        fprintf(stderr,
                "[rank %d] %s (%s): recv_splits[%d] = %lld, "
                "expected %lld\n",
                bench_rank, label, when, r, (long long)b->recv_splits[r],
                (long long)b->per);
        return 0;
      }
  if (wrong > 0)
    fprintf(stderr,
            "[rank %d] %s (%s): %lld of %lld elements wrong; first: [%lld] "
            "is %g, expected %g\n",
            bench_rank, label, when, (long long)wrong, (long long)n,
            (long long)first, got_first, want_first);
  return wrong == 0;
}

typedef struct sresult {
  int ok;
  bench_stats_t us;    /* microseconds */
  double algbw, busbw; /* GB/s at the median */
} sresult_t;

/* Runs one case on every rank: the checked run, warmup, timed iterations
 * (none in quick mode). */
static sresult_t run_case(const scase_t *c, const bench_opts_t *o) {
  sresult_t r;
  sbuf_t b;
  hvd_tensor_t out = {0};
  double *t = NULL;
  int ok;

  memset(&r, 0, sizeof r);
  setup(c, &b);
  run_once(c, o, &b, &out);
  ok = check(c, o, &b, &out, "first run");
  hvd_tensor_free(&out);

  if (c->iters > 0) {
    if (c->inplace && c->coll == BENCH_ALLREDUCE &&
        (c->op == HVD_SUM || c->op == HVD_PRODUCT))
      to_identity(c, &b);
    t = bench_alloc(sizeof *t * (size_t)c->iters);
    for (int w = 1; w < c->warmup; w++) {
      run_once(c, o, &b, &out);
      hvd_tensor_free(&out);
    }
    for (int k = 0; k < c->iters; k++) {
      BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
      double t0 = bench_now();
      run_once(c, o, &b, &out);
      t[k] = bench_now() - t0;
      if (k + 1 < c->iters)
        hvd_tensor_free(&out);
    }
    ok &= check(c, o, &b, &out, "last run");
    hvd_tensor_free(&out);
    bench_max_over_ranks(t, c->iters);
    for (int k = 0; k < c->iters; k++)
      t[k] *= 1e6;
    r.us = bench_stats(t, c->iters);
    double bytes = (double)c->count * (double)hvd_dtype_size(c->dtype);
    r.algbw = bytes / (r.us.median * 1e-6) / 1e9;
    r.busbw = r.algbw * bus_factor(c->coll, bench_size);
    free(t);
  }
  teardown(&b);
  r.ok = bench_all_ok(ok);
  return r;
}

/* ---- output -------------------------------------------------------------- */

static void print_header(const bench_opts_t *o) {
  char env[512];
  if (bench_rank != 0)
    return;
  if (o->json) {
    bench_json_header(o->mode == BENCH_QUICK ? "quick" : "sweep");
    bench_json_open("rows", '[');
    return;
  }
  bench_env_line(env, sizeof env);
  if (o->mode == BENCH_QUICK) {
    printf("# hvd-bench --quick: %d rank%s, hvd %s; env: %s\n", bench_size,
           bench_size == 1 ? "" : "s", hvd_version(), env);
    return;
  }
  printf("# hvd-bench sweep: %d rank%s, hvd %s; env: %s\n", bench_size,
         bench_size == 1 ? "" : "s", hvd_version(), env);
  printf("# time: per iteration the slowest rank's, after a barrier; "
         "median/min/max over iters (us)\n");
  printf("# algbw = bytes / median time; busbw = algbw * nccl-tests factor "
         "(allreduce 2(P-1)/P, broadcast 1, others (P-1)/P); GB/s = 1e9 B/s\n");
  printf("%13s %8s %7s %5s %11s %10s %5s %10s %10s %10s %8s %8s %5s\n", "coll",
         "dtype", "op", "place", "bytes", "count", "iters", "median_us",
         "min_us", "max_us", "algbw", "busbw", "check");
  fflush(stdout);
}

static void print_row(const scase_t *c, const bench_opts_t *o,
                      const sresult_t *r) {
  double bytes = (double)c->count * (double)hvd_dtype_size(c->dtype);
  if (bench_rank != 0)
    return;
  if (o->json) {
    bench_json_open(NULL, '{');
    bench_json_str("coll", bench_coll_name(c->coll));
    bench_json_str("dtype", hvd_dtype_name(c->dtype));
    if (is_reduction(c->coll))
      bench_json_str("op", hvd_op_name(c->op));
    bench_json_bool("inplace", c->inplace);
    bench_json_int("bytes", (int64_t)bytes);
    bench_json_int("count", c->count);
    if (c->iters > 0) {
      bench_json_int("iters", c->iters);
      bench_json_int("warmup", c->warmup);
      bench_json_num("median_us", r->us.median);
      bench_json_num("min_us", r->us.min);
      bench_json_num("max_us", r->us.max);
      bench_json_num("algbw_gbps", r->algbw);
      bench_json_num("busbw_gbps", r->busbw);
    }
    bench_json_bool("correct", r->ok);
    bench_json_close('}');
    return;
  }
  if (c->iters == 0) { /* quick */
    char label[160];
    case_label(c, label, sizeof label);
    printf("%-5s %s (%lld elements)\n", r->ok ? "ok" : "WRONG", label,
           (long long)c->count);
  } else {
    printf("%13s %8s %7s %5s %11.0f %10lld %5d %10.2f %10.2f %10.2f %8.3f "
           "%8.3f %5s\n",
           bench_coll_name(c->coll), hvd_dtype_name(c->dtype),
           is_reduction(c->coll) ? hvd_op_name(c->op) : "-",
           c->inplace ? "in" : "out", bytes, (long long)c->count, c->iters,
           r->us.median, r->us.min, r->us.max, r->algbw, r->busbw,
           r->ok ? "ok" : "WRONG");
  }
  fflush(stdout);
}

/* ---- quick extras -------------------------------------------------------- */

/* What the case loop does not cover: many tensors in flight at once
 * (submitted in reverse order, like a backward pass, then all waited for)
 * and the blocking form of allreduce. 1 if both are right on every rank. */
static int quick_extras(const bench_opts_t *o, int *cases) {
  enum { N = 64 };
  float *data[N];
  int64_t len[N];
  hvd_request_t *req[N];
  int ok_burst = 1, ok_block = 1;
  char name[64];

  for (int t = 0; t < N; t++) {
    len[t] = (t * 997) % 3001 + 1;
    data[t] = bench_alloc(sizeof(float) * (size_t)len[t]);
    for (int64_t i = 0; i < len[t]; i++)
      data[t][i] =
          (float)reduce_input(HVD_AVERAGE, HVD_FLOAT32, bench_rank, i + t);
  }
  for (int t = N - 1; t >= 0; t--) {
    hvd_tensor_t x = hvd_tensor_make(data[t], HVD_FLOAT32, 1, &len[t]);
    snprintf(name, sizeof name, "quick.burst.%d", t);
    BENCH_HVD(hvd_allreduce_async(name, &x, &x, HVD_AVERAGE, 1.0, 1.0,
                                  &req[N - 1 - t]));
  }
  for (int k = 0; k < N; k++)
    BENCH_HVD(hvd_wait(req[k]));
  for (int t = 0; t < N; t++) {
    for (int64_t i = 0; i < len[t]; i++) {
      float want = (float)reduce_expect(HVD_AVERAGE, HVD_FLOAT32, i + t);
      if (data[t][i] != want) {
        if (ok_burst)
          fprintf(stderr,
                  "[rank %d] burst: tensor %d [%lld] is %g, "
                  "expected %g\n",
                  bench_rank, t, (long long)i, (double)data[t][i],
                  (double)want);
        ok_burst = 0;
      }
    }
    free(data[t]);
  }
  ok_burst = bench_all_ok(ok_burst);

  float v = (float)(bench_rank + 1);
  int64_t one = 1;
  hvd_tensor_t x = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  BENCH_HVD(hvd_allreduce("quick.blocking", &x, &x, HVD_SUM, 1.0, 1.0));
  if (v != (float)(bench_size * (bench_size + 1) / 2)) {
    fprintf(stderr, "[rank %d] blocking hvd_allreduce: %g, expected %d\n",
            bench_rank, (double)v, bench_size * (bench_size + 1) / 2);
    ok_block = 0;
  }
  ok_block = bench_all_ok(ok_block);

  *cases += 2;
  if (bench_rank == 0) {
    if (o->json) {
      bench_json_open(NULL, '{');
      bench_json_str("coll", "allreduce_async burst");
      bench_json_int("tensors", N);
      bench_json_bool("correct", ok_burst);
      bench_json_close('}');
      bench_json_open(NULL, '{');
      bench_json_str("coll", "allreduce blocking");
      bench_json_bool("correct", ok_block);
      bench_json_close('}');
    } else {
      printf("%-13s: %d async average tensors in reverse order: %s\n", "burst",
             N, ok_burst ? "ok" : "WRONG");
      printf("%-13s: hvd_allreduce (blocking form): %s\n", "blocking",
             ok_block ? "ok" : "WRONG");
    }
  }
  return (!ok_burst) + (!ok_block);
}

/* ---- the sweep ----------------------------------------------------------- */

/* Elements of a message of `bytes` for collective c (at least 1, and for
 * allgather and alltoall a multiple of P; reducescatter too in a sweep). */
static int64_t count_for(enum bench_coll c, hvd_dtype_t dt, int64_t bytes,
                         int round_rs) {
  int64_t n = bytes / (int64_t)hvd_dtype_size(dt);
  if (n < 1)
    n = 1;
  if (c == BENCH_ALLGATHER || c == BENCH_ALLTOALL ||
      (c == BENCH_REDUCESCATTER && round_rs)) {
    n -= n % bench_size;
    if (n < bench_size)
      n = bench_size;
  }
  return n;
}

static int default_iters(int64_t bytes) {
  int64_t n = (INT64_C(1) << 30) / (bytes > 0 ? bytes : 1);
  return n < 10 ? 10 : n > 100 ? 100 : (int)n;
}

/* The sweep's (or quick's) choice of cases and its running totals. */
typedef struct sweep {
  const bench_opts_t *o;
  int quick;
  unsigned colls, dtypes, ops, places;
  int total, wrong, timed;    /* cases; wrong ones; timed ones */
  double busbw_sum;           /* of the timed cases */
  int coll_cases, coll_wrong; /* of the collective being run */
} sweep_t;

/* Case c (its message size set) in each place pl allows: run, counted,
 * its row printed. */
static void sweep_places(sweep_t *sw, scase_t *c, unsigned pl) {
  const bench_opts_t *o = sw->o;
  for (int place = 0; place < 2; place++) {
    if (!(pl & (place ? BENCH_IN_PLACE : BENCH_OUT_OF_PLACE)))
      continue;
    c->inplace = place;
    sresult_t r = run_case(c, o);
    sw->total++;
    if (c->iters > 0 && isfinite(r.busbw))
      sw->busbw_sum += r.busbw, sw->timed++;
    sw->coll_cases++;
    sw->wrong += !r.ok;
    sw->coll_wrong += !r.ok;
    if (!sw->quick || o->verbose || o->json || !r.ok)
      print_row(c, o, &r);
  }
}

/* Every message size of one collective, dtype and op: quick's three
 * counts, or the sweep's sizes from --min-bytes to --max-bytes. */
static void sweep_sizes(sweep_t *sw, enum bench_coll coll, unsigned pl, int dt,
                        int op) {
  static const int64_t quick_counts[] = {1, 37, 4099};
  const bench_opts_t *o = sw->o;
  int quick = sw->quick;
  int64_t prev = -1;
  int nsizes = quick ? BENCH_COUNT(quick_counts) : 64;
  int64_t bytes = o->min_bytes;
  for (int s = 0; s < nsizes; s++) {
    scase_t c = {coll, (hvd_dtype_t)dt, (hvd_op_t)op, 0, 0, 0, 0};
    if (quick) {
      c.count = count_for(
          coll, c.dtype, quick_counts[s] * (int64_t)hvd_dtype_size(c.dtype), 0);
    } else {
      if (s > 0)
        bytes *= o->step_factor;
      if (bytes > o->max_bytes)
        break;
      c.count = count_for(coll, c.dtype, bytes, 1);
      if (c.count == prev)
        continue; /* rounding made it the same message */
      int64_t real = c.count * (int64_t)hvd_dtype_size(c.dtype);
      c.iters = o->iters > 0 ? o->iters : default_iters(real);
      c.warmup = o->warmup >= 0               ? o->warmup
                 : real > (INT64_C(16) << 20) ? 2
                                              : 5;
    }
    prev = c.count;
    sweep_places(sw, &c, pl);
  }
}

/* One collective over the chosen dtypes and ops (one pass without an op
 * for a collective that has none); quick says how it went. */
static void sweep_coll(sweep_t *sw, enum bench_coll coll) {
  const bench_opts_t *o = sw->o;
  unsigned pl = sw->places & places_of(coll);
  sw->coll_cases = 0;
  sw->coll_wrong = 0;
  if (pl == 0) {
    if (bench_rank == 0 && !o->json)
      printf("# %s skipped: it runs %s place only\n", bench_coll_name(coll),
             places_of(coll) == BENCH_IN_PLACE ? "in" : "out of");
    return;
  }
  for (int dt = 0; dt < HVD_DTYPE_COUNT; dt++) {
    if (!(sw->dtypes & (1u << dt)))
      continue;
    for (int op = 0; op < HVD_ADASUM; op++) { /* the elementwise ops */
      if (!(sw->ops & (1u << op)) && is_reduction(coll))
        continue;
      if (!is_reduction(coll) && op != 0)
        break; /* one pass for a collective without an op */
      sweep_sizes(sw, coll, pl, dt, op);
    }
  }
  if (sw->quick && bench_rank == 0 && !o->json)
    printf("%-13s: %3d cases %s\n", bench_coll_name(coll), sw->coll_cases,
           sw->coll_wrong ? "with some WRONG (see above)" : "ok");
}

/* Rank 0's closing lines: the counts, and nccl-tests' average bus
 * bandwidth. */
static void sweep_summary(const sweep_t *sw, double t_start) {
  const bench_opts_t *o = sw->o;
  int total = sw->total, wrong = sw->wrong, timed = sw->timed;
  double secs = bench_now() - t_start;
  if (o->json) {
    bench_json_close(']');
    bench_json_int("cases", total);
    bench_json_int("wrong", wrong);
    if (timed > 0)
      bench_json_num("avg_busbw_gbps", sw->busbw_sum / timed);
    bench_json_num("seconds", secs);
    bench_json_close('}');
  } else {
    printf("# %s: %d case%s on %d rank%s, %s (%.1f s)\n",
           sw->quick ? "quick" : "sweep", total, total == 1 ? "" : "s",
           bench_size, bench_size == 1 ? "" : "s",
           wrong ? "SOME WRONG" : "all results ok", secs);
  }
  if (wrong && !o->json)
    printf("# %d wrong; each wrong rank says what on stderr\n", wrong);
  if (timed > 0 && !o->json) /* as nccl-tests close */
    printf("# Avg bus bandwidth    : %g GB/s (mean of the %d cases' "
           "busbw)\n",
           sw->busbw_sum / timed, timed);
  fflush(stdout);
}

int bench_sweep(const bench_opts_t *o) {
  int quick = o->mode == BENCH_QUICK;
  sweep_t sw;
  double t_start = bench_now();

  memset(&sw, 0, sizeof sw);
  sw.o = o;
  sw.quick = quick;
  sw.colls = quick ? (1u << BENCH_COLL_COUNT) - 1 : o->colls;
  sw.dtypes = quick ? (1u << HVD_DTYPE_COUNT) - 1 : o->dtypes;
  sw.ops = quick ? (1u << HVD_ADASUM) - 1 : o->ops;
  sw.places = quick ? BENCH_IN_PLACE | BENCH_OUT_OF_PLACE : o->places;
  print_header(o);
  for (int cl = 0; cl < BENCH_COLL_COUNT; cl++)
    if (sw.colls & (1u << cl))
      sweep_coll(&sw, (enum bench_coll)cl);
  if (quick)
    sw.wrong += quick_extras(o, &sw.total);
  if (bench_rank == 0)
    sweep_summary(&sw, t_start);
  return sw.wrong ? 1 : 0;
}
