/*
 * fusion.c - fused and chunked allreduce: a burst of mixed tensors
 * (scalars, [3], [1000] and [300000] elements; float32, float64, float16,
 * int32; every op; prescale and postscale on the float dtypes; in place
 * and out of place) submitted async at once, under every combination of
 * HVD_CHUNK_SIZE 64, 4096, unset (1 MiB), 8388608 and
 * HVD_FUSION_THRESHOLD 0 (no fusion) and unset (128 MiB).
 *
 * Each configuration runs the burst twice: first in an order that keeps
 * tensors of one dtype and op together (long fused groups, through the
 * coordinator), then in a different order on every rank (through the
 * response cache). Then join: rank size-1 joins while the others run a
 * burst of cached and of new names; their results are the reduction of
 * the other ranks' values (the joined rank contributes the identity) and
 * an average still divides by the world size.
 *
 * Inputs are small integers (and halves) chosen so that every result is
 * exact in every dtype; the one exception is a float32 average whose
 * quotient is not representable: within 2 ulps. Integer averages
 * truncate toward zero. Run at 1..4 ranks.
 */
#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

static int R, P; /* this rank, world size */

static const hvd_dtype_t dtypes[4] = {HVD_FLOAT32, HVD_FLOAT64, HVD_FLOAT16,
                                      HVD_INT32};
static const hvd_op_t ops[5] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                HVD_PRODUCT};
#define BIG 300000

/* ---- float16, rounding to nearest even ---- */

static uint16_t f32_to_f16(float f) {
  uint32_t x, sign, man, half, rem, mid;
  int e;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000u;
  man = x & 0x7fffffu;
  e = (int)((x >> 23) & 0xff) - 127 + 15;
  if (((x >> 23) & 0xff) == 0xff) /* inf, nan */
    return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  if (e >= 31)
    return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half */
    int shift = 14 - e;
    if (shift > 24)
      return (uint16_t)sign;
    man |= 0x800000u;
    half = man >> shift;
    rem = man & ((1u << shift) - 1);
    mid = 1u << (shift - 1);
  } else {
    half = ((uint32_t)e << 10) | (man >> 13);
    rem = man & 0x1fffu;
    mid = 0x1000u;
  }
  if (rem > mid || (rem == mid && (half & 1)))
    half++;
  return (uint16_t)(sign | half);
}

static float f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f = e == 0    ? ldexpf((float)man, -24)
            : e == 31 ? (man ? NAN : INFINITY)
                      : ldexpf((float)(man | 0x400), e - 25);
  return (h & 0x8000) ? -f : f;
}

static size_t esize(hvd_dtype_t dt) {
  return dt == HVD_FLOAT64 ? 8 : dt == HVD_FLOAT16 ? 2 : 4;
}

static void put(hvd_dtype_t dt, void *buf, int64_t i, double v) {
  switch (dt) {
  case HVD_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case HVD_FLOAT16:
    ((uint16_t *)buf)[i] = f32_to_f16((float)v);
    break;
  case HVD_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  default:
    ((double *)buf)[i] = v;
    break;
  }
}

static double get(hvd_dtype_t dt, const void *buf, int64_t i) {
  switch (dt) {
  case HVD_INT32:
    return ((const int32_t *)buf)[i];
  case HVD_FLOAT16:
    return f16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32:
    return ((const float *)buf)[i];
  default:
    return ((const double *)buf)[i];
  }
}

/* ---- tensors of a burst ---- */

struct spec {
  char name[48];
  hvd_dtype_t dtype;
  hvd_op_t op;
  int ndim;
  int64_t n; /* elements: 1 for a scalar */
  double pre, post;
  int in_place;
  int salt;
};

struct job {
  struct spec sp;
  void *send, *recv;
  hvd_tensor_t ts, tr;
  hvd_request_t *req;
  hvd_result_t rc;
  char msg[512];
};

/* Rank q's element i of tensor salt t; small integers, {-2,-1,1,2} for a
 * product (so products of 4 ranks, even prescaled, stay exact). */
static double value(hvd_op_t op, int q, int64_t i, int t) {
  if (op == HVD_PRODUCT)
    return (double)((q + i + t) % 2 + 1) *
           ((q * 3 + i + t) % 5 == 0 ? -1.0 : 1.0);
  return (double)((q * 5 + i * 3 + t) % 13) - 6;
}

/* Element i of the result when ranks 0..active-1 contribute (the others
 * have joined and contribute the identity). */
static double expected(const struct spec *s, int64_t i, int active) {
  double acc = 0;
  for (int q = 0; q < active; q++) {
    double v = value(s->op, q, i, s->salt) * s->pre; /* exact */
    if (q == 0) {
      acc = v;
      continue;
    }
    switch (s->op) {
    case HVD_SUM:
    case HVD_AVERAGE:
      acc += v;
      break;
    case HVD_MIN:
      acc = v < acc ? v : acc;
      break;
    case HVD_MAX:
      acc = v > acc ? v : acc;
      break;
    default:
      acc *= v;
      break;
    }
  }
  if (s->op == HVD_AVERAGE) {
    if (s->dtype == HVD_INT32)
      return (double)((long long)acc / P); /* truncates toward zero */
    return acc / P * s->post;
  }
  return acc * s->post;
}

/* Allowed distance between got and the exact want: 0, except 2 ulps for a
 * float32 average. */
static int close_enough(const struct spec *s, double want, double got) {
  if (s->dtype == HVD_FLOAT32) {
    float w = (float)want;
    if (s->op != HVD_AVERAGE)
      return got == w;
    float ulp = nextafterf(fabsf(w), INFINITY) - fabsf(w);
    return fabs(got - w) <= 2.0 * ulp;
  }
  if (s->dtype == HVD_FLOAT16)
    return got == f16_to_f32(f32_to_f16((float)want));
  return got == want;
}

static void job_submit(struct job *j) {
  const struct spec *s = &j->sp;
  size_t bytes = (size_t)s->n * esize(s->dtype);
  j->send = malloc(bytes);
  j->recv = s->in_place ? j->send : malloc(bytes);
  if (j->send == NULL || j->recv == NULL)
    bail("out of memory");
  for (int64_t i = 0; i < s->n; i++) {
    put(s->dtype, j->send, i, value(s->op, R, i, s->salt));
    if (!s->in_place)
      put(s->dtype, j->recv, i, -77);
  }
  int64_t shape[1] = {s->n};
  j->ts = hvd_tensor_make(j->send, s->dtype, s->ndim, shape);
  j->tr = hvd_tensor_make(j->recv, s->dtype, s->ndim, shape);
  j->req = NULL;
  j->msg[0] = '\0';
  j->rc = hvd_allreduce_async(s->name, &j->ts, &j->tr, s->op, s->pre, s->post,
                              &j->req);
  if (j->rc != HVD_SUCCESS) {
    snprintf(j->msg, sizeof j->msg, "%s", hvd_last_error());
    j->req = NULL;
  }
}

static void job_wait(struct job *j) {
  if (j->req == NULL)
    return;
  j->rc = hvd_wait(j->req);
  j->req = NULL;
  if (j->rc != HVD_SUCCESS)
    snprintf(j->msg, sizeof j->msg, "%s", hvd_last_error());
}

/* Checks and frees j; returns 1 if right, else writes why into why. */
static int job_check(struct job *j, int active, char *why, size_t n) {
  const struct spec *s = &j->sp;
  int good = 1;
  if (j->rc != HVD_SUCCESS) {
    snprintf(why, n, "'%.47s': rc %d: %.400s", s->name, j->rc, j->msg);
    good = 0;
  }
  for (int64_t i = 0; i < s->n && good; i++) {
    double want = expected(s, i, active), got = get(s->dtype, j->recv, i);
    if (!close_enough(s, want, got)) {
      snprintf(why, n,
               "'%.47s' (%s %s, %lld elements, pre %g post %g, %s): element "
               "%lld = %.9g, expected %.9g",
               s->name, hvd_dtype_name(s->dtype), hvd_op_name(s->op),
               (long long)s->n, s->pre, s->post,
               s->in_place ? "in place" : "out of place", (long long)i, got,
               want);
      good = 0;
    }
  }
  for (int64_t i = 0; i < s->n && good && !s->in_place; i++)
    if (get(s->dtype, j->send, i) != value(s->op, R, i, s->salt)) {
      snprintf(why, n, "'%.47s': send element %lld changed", s->name,
               (long long)i);
      good = 0;
    }
  free(j->send);
  if (!s->in_place)
    free(j->recv);
  j->send = j->recv = NULL;
  return good;
}

/* The burst: for each dtype and op (scales per dtype and op, so that a
 * dtype/op run is one fusable group), a scalar, [3] and [1000] in and out
 * of place, then `big` [300000] tensors spread over the dtypes. Returns
 * the number of specs. */
static int make_burst(struct spec *out, const char *prefix, int big,
                      int small_shapes) {
  static const double scales[3][2] = {{1, 1}, {2, 0.25}, {0.5, 3}};
  static const int64_t sizes[3] = {1, 3, 1000};
  int n = 0;
  for (int d = 0; d < 4; d++)
    for (int o = 0; o < 5; o++) {
      hvd_dtype_t dt = dtypes[d];
      int sc = dt == HVD_INT32 ? 0 : (d + o) % 3;
      for (int z = 0; z < small_shapes; z++)
        for (int place = 0; place < 2; place++) {
          struct spec *s = &out[n++];
          snprintf(s->name, sizeof s->name, "%s.%s.%s.%lld.%s", prefix,
                   hvd_dtype_name(dt), hvd_op_name(ops[o]), (long long)sizes[z],
                   place ? "in" : "out");
          s->dtype = dt;
          s->op = ops[o];
          s->ndim = z == 0 ? 0 : 1;
          s->n = sizes[z];
          s->pre = scales[sc][0];
          s->post = scales[sc][1];
          s->in_place = place;
          s->salt = n * 7;
        }
      /* big ones: sum in place, average out of place, max in place */
      int which = o == 0 ? 0 : o == 1 ? 1 : o == 3 ? 2 : -1;
      if (which < 0 || d * 3 + which >= big)
        continue;
      struct spec *s = &out[n++];
      snprintf(s->name, sizeof s->name, "%s.%s.%s.big", prefix,
               hvd_dtype_name(dt), hvd_op_name(ops[o]));
      s->dtype = dt;
      s->op = ops[o];
      s->ndim = 1;
      s->n = BIG;
      s->pre = scales[sc][0];
      s->post = scales[sc][1];
      s->in_place = which != 1;
      s->salt = n * 7;
    }
  return n;
}

static struct spec specs[256];
static struct job jobs[256];

/* Submits specs[0..n) in the given order (NULL: as listed), waits for all
 * in reverse order, and checks them against ranks 0..active-1. Returns the
 * number of wrong ones per dtype in bad[4]; the first wrong one of each
 * dtype is described in why[dtype]. */
static void run_burst(int n, const int *order, int active, int salt, int bad[4],
                      char why[4][600]) {
  for (int k = 0; k < n; k++) {
    int id = order ? order[k] : k;
    jobs[id].sp = specs[id];
    jobs[id].sp.salt += salt;
    job_submit(&jobs[id]);
  }
  for (int k = n - 1; k >= 0; k--)
    job_wait(&jobs[order ? order[k] : k]);
  for (int d = 0; d < 4; d++) {
    bad[d] = 0;
    why[d][0] = '\0';
  }
  for (int k = 0; k < n; k++) {
    char w[512];
    if (!job_check(&jobs[k], active, w, sizeof w)) {
      int d = 0;
      while (dtypes[d] != jobs[k].sp.dtype)
        d++;
      if (bad[d]++ == 0)
        snprintf(why[d], 600, "%s", w);
    }
  }
}

static void shuffle(int *order, int n, unsigned seed) {
  for (int k = 0; k < n; k++)
    order[k] = k;
  for (int k = n - 1; k > 0; k--) {
    seed = seed * 1103515245u + 12345u;
    int m = (int)((seed >> 16) % (unsigned)(k + 1)), t = order[k];
    order[k] = order[m];
    order[m] = t;
  }
}

/* Reports a burst, one line per dtype. */
static void report(const int bad[4], char why[4][600], const char *cfg,
                   const char *what) {
  for (int d = 0; d < 4; d++) {
    if (bad[d])
      tap_note("%d wrong; first: %s", bad[d], why[d]);
    ok(bad[d] == 0, "%s: %s: %s", cfg, what, hvd_dtype_name(dtypes[d]));
  }
}

static void set_or_unset(const char *var, const char *v) {
  if (v)
    setenv(var, v, 1);
  else
    unsetenv(var);
}

/* Join: rank P-1 joins while the others run a burst of names cached
 * before (through the fast path) and of new names (the coordinator). */
static void join_burst(const char *cfg) {
  int order[256], bad[4], n;
  char why[4][600];
  n = make_burst(specs, "j", 0, 3);
  run_burst(n, NULL, P, 1, bad, why);
  report(bad, why, cfg, "before join: burst 'j' on every rank");

  int bad_cached[4] = {0}, bad_new[4] = {0}, last = -5;
  char why_cached[4][600] = {""}, why_new[4][600] = {""};
  hvd_result_t jrc;
  char jmsg[512] = "";
  if (R == P - 1) {
    jrc = hvd_join(&last);
  } else {
    n = make_burst(specs, "j", 0, 3); /* cached: same names and params */
    shuffle(order, n, 99u + (unsigned)R);
    run_burst(n, order, P - 1, 2, bad_cached, why_cached);
    n = make_burst(specs, "jn", 4, 2); /* new names, a few big ones */
    run_burst(n, NULL, P - 1, 3, bad_new, why_new);
    jrc = hvd_join(&last);
  }
  if (jrc != HVD_SUCCESS)
    snprintf(jmsg, sizeof jmsg, "%s", hvd_last_error());
  tap_note("%s", jmsg);
  is_int(HVD_SUCCESS, jrc, "%s: hvd_join", cfg);
  {
    int lo = last, hi = last;
    /* the same last rank everywhere, one of the ranks that joined late */
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    tap_note("last_rank %d (min %d, max %d)", last, lo, hi);
    ok(lo == hi && (P == 1 ? last == 0 : last >= 0 && last < P - 1),
       "%s: join: the same last_rank on every rank, not rank %d", cfg, P - 1);
  }
  report(bad_cached, why_cached, cfg,
         "rank size-1 joined: cached burst 'j' (identity for it)");
  report(bad_new, why_new, cfg,
         "rank size-1 joined: new burst 'jn' (identity for it)");

  n = make_burst(specs, "j", 0, 3);
  run_burst(n, NULL, P, 4, bad, why);
  report(bad, why, cfg, "after join: burst 'j' on every rank");
}

int main(int argc, char **argv) {
  static const char *chunks[4] = {"64", "4096", NULL, "8388608"};
  static const char *fusions[2] = {"0", NULL};
  int order[256], bad[4];
  char why[4][600], cfg[96];

  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();

  for (int c = 0; c < 4; c++)
    for (int f = 0; f < 2; f++) {
      snprintf(cfg, sizeof cfg, "chunk %s, fusion %s",
               chunks[c] ? chunks[c] : "default",
               fusions[f] ? fusions[f] : "default");
      set_or_unset("HVD_CHUNK_SIZE", chunks[c]);
      set_or_unset("HVD_FUSION_THRESHOLD", fusions[f]);
      hvd_result_t rc = hvd_init();
      tap_note("%s", hvd_last_error());
      if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
        bail("hvd_init: %s", hvd_last_error());
      /* 64-byte chunks take one MPI call per 16 floats: one big tensor */
      int big = c == 0 ? 1 : 12;
      int n = make_burst(specs, "b", big, 3);
      run_burst(n, NULL, P, 0, bad, why);
      report(bad, why, cfg, "burst in dtype/op order");
      shuffle(order, n, 7u + 31u * (unsigned)R);
      run_burst(n, order, P, 5, bad, why);
      report(bad, why, cfg, "burst again, shuffled per rank (cached)");
      if (c == 1 || c == 2)
        join_burst(cfg);
      is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
    }
  unsetenv("HVD_CHUNK_SIZE");
  unsetenv("HVD_FUSION_THRESHOLD");
  return tap_mpi_finish();
}
