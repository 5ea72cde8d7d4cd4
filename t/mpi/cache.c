/*
 * cache.c - the response cache: a name that is cached with one set of
 * parameters and then submitted with others (shape, dtype) must be
 * renegotiated, never run with the stale parameters; eviction (capacity
 * smaller than the working set, names submitted in a different order on
 * every rank and step) and no cache at all give the same results; a
 * mismatch on a cached name fails on every rank with the coordinator's
 * exact message and the next step works.
 *
 * Every configuration runs the same steps, with HVD_CACHE_CAPACITY unset
 * (1024), 4, 1 and 0 (off); hvd_shutdown/hvd_init in between (settings
 * are read by hvd_init). Every value is a small integer, so every result
 * is exact. Run at 1..4 ranks.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

#define MAXN 64
#define MSG_LEN 1024

static int R, P; /* this rank, world size */

/* ---- float16 (exact for the small integers used here) ---- */

static uint16_t f32_to_f16(float f) {
  uint32_t x, sign, man, half, rem;
  int e;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000u;
  if ((x & 0x7fffffffu) == 0)
    return (uint16_t)sign;
  man = x & 0x7fffffu;
  e = (int)((x >> 23) & 0xff) - 127 + 15;
  if (e <= 0 || e >= 31)
    return (uint16_t)(sign | 0x7c00u); /* not needed here: make it show */
  half = ((uint32_t)e << 10) | (man >> 13);
  rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
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

static void put(hvd_dtype_t dt, void *buf, int64_t i, double v) {
  switch (dt) {
  case HVD_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case HVD_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case HVD_FLOAT16:
    ((uint16_t *)buf)[i] = f32_to_f16((float)v);
    break;
  case HVD_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case HVD_FLOAT64:
    ((double *)buf)[i] = v;
    break;
  default:
    bail("dtype %d not used here", (int)dt);
  }
}

static double get(hvd_dtype_t dt, const void *buf, int64_t i) {
  switch (dt) {
  case HVD_INT32:
    return ((const int32_t *)buf)[i];
  case HVD_INT64:
    return (double)((const int64_t *)buf)[i];
  case HVD_FLOAT16:
    return f16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32:
    return ((const float *)buf)[i];
  case HVD_FLOAT64:
    return ((const double *)buf)[i];
  default:
    bail("dtype %d not used here", (int)dt);
  }
}

/* Rank q's element i of a tensor salted with k: -5..5. */
static double value(int q, int64_t i, int k) {
  return (double)((q * 3 + i + k * 7) % 11) - 5;
}

/* op over the ranks of value(q, i, k); ops limited to exact ones. */
static double expected(hvd_op_t op, int64_t i, int k) {
  double acc = value(0, i, k);
  for (int q = 1; q < P; q++) {
    double v = value(q, i, k);
    switch (op) {
    case HVD_SUM:
      acc += v;
      break;
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
      bail("op %d not used here", (int)op);
    }
  }
  return acc;
}

/* One allreduce of a [n] tensor, prepared, submitted async, checked. */
struct job {
  char name[32];
  hvd_dtype_t dtype;
  hvd_op_t op;
  int64_t n;
  int salt, in_place;
  double send[MAXN], recv[MAXN]; /* storage (any dtype fits) */
  hvd_tensor_t ts, tr;
  hvd_request_t *req;
  hvd_result_t rc;
  char msg[MSG_LEN];
};

static void job_submit(struct job *j, const char *name, hvd_dtype_t dt,
                       hvd_op_t op, int64_t n, int salt, int in_place) {
  if (n > MAXN)
    bail("n %lld > %d", (long long)n, MAXN);
  snprintf(j->name, sizeof j->name, "%s", name);
  j->dtype = dt;
  j->op = op;
  j->n = n;
  j->salt = salt;
  j->in_place = in_place;
  for (int64_t i = 0; i < n; i++) {
    put(dt, j->send, i, value(R, i, salt));
    put(dt, j->recv, i, -99);
  }
  int64_t shape[1] = {n};
  j->ts = hvd_tensor_make(j->send, dt, 1, shape);
  j->tr = hvd_tensor_make(in_place ? j->send : j->recv, dt, 1, shape);
  j->req = NULL;
  j->msg[0] = '\0';
  j->rc = hvd_allreduce_async(j->name, &j->ts, &j->tr, op, 1.0, 1.0, &j->req);
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
  snprintf(j->msg, sizeof j->msg, "%s",
           j->rc == HVD_SUCCESS ? "" : hvd_last_error());
}

/* 1 if j succeeded with the right values; else notes why and returns 0. */
static int job_good(const struct job *j) {
  if (j->rc != HVD_SUCCESS) {
    tap_note("'%s': rc %d: %s", j->name, j->rc, j->msg);
    return 0;
  }
  const void *out = j->in_place ? j->send : j->recv;
  for (int64_t i = 0; i < j->n; i++) {
    double want = expected(j->op, i, j->salt), got = get(j->dtype, out, i);
    if (got != want) {
      tap_note("'%s' (%s, %s, [%lld], %s): element %lld = %g, expected %g",
               j->name, hvd_dtype_name(j->dtype), hvd_op_name(j->op),
               (long long)j->n, j->in_place ? "in place" : "out of place",
               (long long)i, got, want);
      return 0;
    }
  }
  if (!j->in_place) /* the send buffer is untouched */
    for (int64_t i = 0; i < j->n; i++)
      if (get(j->dtype, j->send, i) != value(R, i, j->salt)) {
        tap_note("'%s': send element %lld changed", j->name, (long long)i);
        return 0;
      }
  return 1;
}

/* ---- the steps ---- */

static struct job jobs[16];
static const char *cfg; /* label of the configuration */

/* "w" alternates [10] and [12] while "v" (always [7]) stays cached. */
static void shapes_alternate(void) {
  for (int s = 0; s < 6; s++) {
    int64_t n = s % 2 ? 12 : 10;
    job_submit(&jobs[0], "v", HVD_FLOAT32, HVD_SUM, 7, s, s % 2);
    job_submit(&jobs[1], "w", HVD_FLOAT32, HVD_SUM, n, s + 1, s % 3 == 0);
    job_wait(&jobs[1]);
    job_wait(&jobs[0]);
    int a = job_good(&jobs[1]);
    int b = job_good(&jobs[0]);
    ok(a && b, "%s: step %d: 'w' shape [%lld] and 'v' [7] right", cfg, s,
       (long long)n);
  }
}

/* "d" changes dtype (and op) every step. */
static void dtypes_change(void) {
  static const hvd_dtype_t dts[4] = {HVD_FLOAT32, HVD_INT32, HVD_FLOAT64,
                                     HVD_FLOAT16};
  static const hvd_op_t ops[3] = {HVD_SUM, HVD_MAX, HVD_PRODUCT};
  for (int s = 0; s < 6; s++) {
    job_submit(&jobs[0], "d", dts[s % 4], ops[s % 3], 5, s, s % 2);
    job_wait(&jobs[0]);
    ok(job_good(&jobs[0]), "%s: step %d: 'd' as %s %s right", cfg, s,
       hvd_dtype_name(dts[s % 4]), hvd_op_name(ops[s % 3]));
  }
}

/* "<head>: rank 0 <field> <v0> vs rank r <field> <vr>, ..." for the ranks
 * whose value differs from rank 0's. */
static void expect_msg(char *out, const char *head, const char *field,
                       char vals[][32]) {
  size_t n = (size_t)snprintf(out, MSG_LEN, "%s: rank 0 %s %s vs", head, field,
                              vals[0]);
  int first = 1;
  for (int q = 1; q < P; q++) {
    if (strcmp(vals[q], vals[0]) == 0)
      continue;
    n += (size_t)snprintf(out + n, MSG_LEN - n, "%s rank %d %s %s",
                          first ? "" : ",", q, field, vals[q]);
    first = 0;
  }
}

/* "w" is cached as [12] (the last step of shapes_alternate); on some
 * steps ranks disagree, on the others everything works. "v" runs in the
 * same cycles and must not be disturbed. */
static void mismatch_on_cached(void) {
  char vals[64][32], want[MSG_LEN];
  for (int s = 0; s < 6; s++) {
    int64_t n = 12;
    if (s == 2)
      n = 12 + R; /* rank 0 still matches the cache */
    else if (s == 4 && R == P - 1)
      n = 11; /* only the last rank differs */
    job_submit(&jobs[0], "v", HVD_FLOAT32, HVD_SUM, 7, 10 + s, 0);
    job_submit(&jobs[1], "w", HVD_FLOAT32, HVD_SUM, n, 20 + s, 1);
    job_wait(&jobs[0]);
    job_wait(&jobs[1]);
    ok(job_good(&jobs[0]), "%s: mismatch step %d: 'v' right", cfg, s);
    int bad = P > 1 && (s == 2 || s == 4);
    if (!bad) {
      ok(job_good(&jobs[1]), "%s: mismatch step %d: 'w' [%lld] right", cfg, s,
         (long long)n);
      continue;
    }
    for (int q = 0; q < P; q++)
      snprintf(vals[q], 32, "[%d]", s == 2 ? 12 + q : (q == P - 1 ? 11 : 12));
    expect_msg(want, "allreduce 'w'", "shape", vals);
    is_int(HVD_ERR_MISMATCH, jobs[1].rc,
           "%s: mismatch step %d: HVD_ERR_MISMATCH on every rank", cfg, s);
    is_string(want, jobs[1].msg, "%s: mismatch step %d: message", cfg, s);
  }
  /* A dtype mismatch on the cached "d" (int32 since dtypes_change step 5,
   * op max): odd ranks say float32. */
  job_submit(&jobs[0], "d", R % 2 ? HVD_FLOAT32 : HVD_INT32, HVD_MAX, 5, 40, 0);
  job_wait(&jobs[0]);
  if (P > 1) {
    for (int q = 0; q < P; q++)
      snprintf(vals[q], 32, "%s", q % 2 ? "float32" : "int32");
    expect_msg(want, "allreduce 'd'", "dtype", vals);
    is_int(HVD_ERR_MISMATCH, jobs[0].rc,
           "%s: dtype mismatch on cached 'd': HVD_ERR_MISMATCH", cfg);
    is_string(want, jobs[0].msg, "%s: dtype mismatch on cached 'd': message",
              cfg);
  } else {
    ok(job_good(&jobs[0]), "%s: 'd' int32 max right", cfg);
  }
  job_submit(&jobs[0], "d", HVD_INT32, HVD_MAX, 5, 41, 0);
  job_wait(&jobs[0]);
  ok(job_good(&jobs[0]), "%s: 'd' int32 max right after the mismatch", cfg);
}

/* 12 names, submitted in a different order on every rank and step, and
 * waited for in yet another order. */
static void many_names(void) {
  static const hvd_op_t ops[4] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT};
  unsigned seed = 12345u + (unsigned)R * 7919u;
  for (int s = 0; s < 8; s++) {
    int order[12];
    for (int k = 0; k < 12; k++)
      order[k] = k;
    for (int k = 11; k > 0; k--) { /* Fisher-Yates, rank-dependent */
      seed = seed * 1103515245u + 12345u;
      int m = (int)((seed >> 16) % (unsigned)(k + 1)), t = order[k];
      order[k] = order[m];
      order[m] = t;
    }
    for (int k = 0; k < 12; k++) {
      int id = order[k];
      char name[16];
      snprintf(name, sizeof name, "e%d", id);
      job_submit(&jobs[id], name, id % 2 ? HVD_INT32 : HVD_FLOAT32, ops[id % 4],
                 id + 1, s * 12 + id, (id + s) % 2);
    }
    int good = 1;
    for (int k = 0; k < 12; k++)
      job_wait(&jobs[(k * 5 + s) % 12]); /* 5 is prime to 12 */
    for (int k = 0; k < 12; k++)
      good &= job_good(&jobs[k]);
    ok(good, "%s: step %d: 12 names in order %d,%d,%d,... right", cfg, s,
       order[0], order[1], order[2]);
  }
}

int main(int argc, char **argv) {
  static const char *caps[] = {NULL, "4", "1", "0"};
  static const char *labels[] = {"cache 1024 (default)", "cache 4", "cache 1",
                                 "cache off"};
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P > 64)
    bail("at most 64 ranks");

  for (int c = 0; c < 4; c++) {
    cfg = labels[c];
    if (caps[c])
      setenv("HVD_CACHE_CAPACITY", caps[c], 1);
    else
      unsetenv("HVD_CACHE_CAPACITY");
    hvd_result_t rc = hvd_init();
    tap_note("%s", hvd_last_error());
    if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
      bail("hvd_init: %s", hvd_last_error());
    shapes_alternate();
    dtypes_change();
    mismatch_on_cached();
    many_names();
    is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
  }
  return tap_mpi_finish();
}
