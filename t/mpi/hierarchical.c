/*
 * hierarchical.c - HVD_HIERARCHICAL_ALLREDUCE=1 (reduce within the node,
 * allreduce across nodes among the local roots, broadcast within the
 * node) on nodes simulated by HVD_HOSTNAME, set per rank before hvd_init.
 * Its results must equal the flat computation: both the exact values
 * computed here and, bit for bit, what the flat allreduce gave for the
 * same inputs.
 *
 * The burst: float32, float64, float16, int32 x every op x a scalar, [7]
 * and [3000] elements (12000 bytes in float32: several 4096-byte chunks,
 * HVD_CHUNK_SIZE=4096) in and out of place, prescale/postscale on the
 * floats, submitted async at once (fused groups), then again in another
 * order on every rank (through the cache).
 *
 * Layouts: at np 4, 2 nodes x 2 ranks, blocked (AABB) and interleaved
 * (ABAB), then 3 + 1; at np 6, 2 nodes x 3 blocked and interleaved,
 * 3 nodes x 2, 4 + 2, and 3 + 2 + 1 (a node of one rank, whose local
 * size alone does not call for two levels: every rank must still take
 * the same path). Registered at np 4 and 6 (6 is oversubscribed on small
 * machines, so the tensors stay small). A round that does not finish
 * within 15 s bails out (a deadlock) rather than wait for the harness.
 */
#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd.h"
#include "tap/tap.h"

static int R, P; /* this rank, world size */

static const hvd_dtype_t dtypes[4] = {HVD_FLOAT32, HVD_FLOAT64, HVD_FLOAT16,
                                      HVD_INT32};
static const hvd_op_t ops[5] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                HVD_PRODUCT};
#define NSPECS 120
#define WAIT_LIMIT 15 /* seconds; a round takes well under 1 s */

static const char *cur_cfg = "";

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

/* A spec's result buffer from the flat run, kept for comparison. */
static void *flat[NSPECS][2]; /* [spec][round] */

static struct spec specs[NSPECS];
static struct job jobs[NSPECS];

static int make_specs(void) {
  static const double scales[3][2] = {{1, 1}, {2, 0.25}, {0.5, 3}};
  static const int64_t sizes[3] = {1, 7, 3000};
  int n = 0;
  for (int d = 0; d < 4; d++)
    for (int o = 0; o < 5; o++)
      for (int z = 0; z < 3; z++)
        for (int place = 0; place < 2; place++) {
          hvd_dtype_t dt = dtypes[d];
          int sc = dt == HVD_INT32 ? 0 : (d + o) % 3;
          struct spec *s = &specs[n++];
          snprintf(s->name, sizeof s->name, "h.%s.%s.%lld.%s",
                   hvd_dtype_name(dt), hvd_op_name(ops[o]), (long long)sizes[z],
                   place ? "in" : "out");
          s->dtype = dt;
          s->op = ops[o];
          s->ndim = z == 0 ? 0 : 1;
          s->n = sizes[z];
          s->pre = scales[sc][0];
          s->post = scales[sc][1];
          s->in_place = place;
          s->salt = n * 5;
        }
  return n;
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

/* Runs every spec (in order, or shuffled per rank) and checks each against
 * the exact values and, if ref, bit for bit against ref[k]. keep: store
 * the results (the flat run) instead of freeing them. Returns the number
 * of wrong ones; the first is described in why. */
static int run_round(int n, int round, int shuffled, int keep, char *why,
                     size_t whylen) {
  int order[NSPECS];
  unsigned seed = 31u * (unsigned)R + (unsigned)round;
  for (int k = 0; k < n; k++)
    order[k] = k;
  for (int k = n - 1; k > 0 && shuffled; k--) {
    seed = seed * 1103515245u + 12345u;
    int m = (int)((seed >> 16) % (unsigned)(k + 1)), t = order[k];
    order[k] = order[m];
    order[m] = t;
  }
  for (int k = 0; k < n; k++) {
    struct job *j = &jobs[order[k]];
    j->sp = specs[order[k]];
    j->sp.salt += round * 1000;
    job_submit(j);
  }
  /* Polled against a deadline: a hierarchical allreduce that deadlocks
   * (ranks taking different paths) ends the test with a clear bail-out
   * instead of the harness's timeout. */
  double deadline = MPI_Wtime() + WAIT_LIMIT;
  for (int k = 0; k < n; k++) {
    struct job *j = &jobs[order[(k * 7) % n]];
    int done = 0;
    while (j->req != NULL && !done) {
      j->rc = hvd_test(j->req, &done);
      if (done || j->rc != HVD_SUCCESS) {
        j->req = NULL;
        if (j->rc != HVD_SUCCESS)
          snprintf(j->msg, sizeof j->msg, "%s", hvd_last_error());
        break;
      }
      if (MPI_Wtime() > deadline)
        bail("%s: '%s' not done after %d s: the allreduce hangs", cur_cfg,
             j->sp.name, WAIT_LIMIT);
      nanosleep(&(struct timespec){0, 200000}, NULL);
    }
  }
  int bad = 0;
  why[0] = '\0';
  for (int k = 0; k < n; k++) {
    struct job *j = &jobs[k];
    const struct spec *s = &j->sp;
    char w[600] = "";
    size_t bytes = (size_t)s->n * esize(s->dtype);
    if (j->rc != HVD_SUCCESS)
      snprintf(w, sizeof w, "'%.47s': rc %d: %.400s", s->name, j->rc, j->msg);
    for (int64_t i = 0; i < s->n && !w[0]; i++) {
      double want = expected(s, i, P), got = get(s->dtype, j->recv, i);
      if (!close_enough(s, want, got))
        snprintf(w, sizeof w,
                 "'%.47s' (pre %g post %g): element %lld = %.9g, expected "
                 "%.9g",
                 s->name, s->pre, s->post, (long long)i, got, want);
    }
    if (!w[0] && !keep && flat[k][round] != NULL &&
        memcmp(flat[k][round], j->recv, bytes) != 0) {
      int64_t i = 0;
      while (i < s->n &&
             get(s->dtype, flat[k][round], i) == get(s->dtype, j->recv, i))
        i++;
      snprintf(w, sizeof w,
               "'%.47s': differs from the flat allreduce at element %lld: "
               "%.9g vs %.9g",
               s->name, (long long)i, get(s->dtype, j->recv, i),
               get(s->dtype, flat[k][round], i));
    }
    if (w[0]) {
      if (!bad)
        snprintf(why, whylen, "%s", w);
      bad++;
    }
    if (keep) {
      flat[k][round] = j->recv;
      if (!s->in_place)
        free(j->send);
    } else {
      free(j->send);
      if (!s->in_place)
        free(j->recv);
    }
    j->send = j->recv = NULL;
  }
  return bad;
}

/* Runs both rounds under the current environment and reports them. */
static void run_config(const char *cfg, int keep) {
  char why[700];
  int n = make_specs();
  cur_cfg = cfg;
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", cfg))
    bail("hvd_init: %s", hvd_last_error());
  for (int round = 0; round < 2; round++) {
    int bad = run_round(n, round, round == 1, keep, why, sizeof why);
    if (bad)
      tap_note("%d of %d wrong; first: %s", bad, n, why);
    ok(bad == 0, "%s: %s: %d allreduces right%s", cfg,
       round ? "again, shuffled per rank (cached)" : "burst", n,
       keep ? "" : ", equal to the flat ones");
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", cfg);
}

/* node[q] for layout l; returns its label, or NULL past the last one. */
static const char *layout(int l, char node[][16]) {
  static const char *const lay4[][2] = {{"AABB", "2 nodes x 2, blocked"},
                                        {"ABAB", "2 nodes x 2, interleaved"},
                                        {"AAAB", "nodes of 3 and 1"},
                                        {NULL, NULL}};
  static const char *const lay6[][2] = {{"AAABBB", "2 nodes x 3, blocked"},
                                        {"ABABAB", "2 nodes x 3, interleaved"},
                                        {"AABBCC", "3 nodes x 2"},
                                        {"AAAABB", "nodes of 4 and 2"},
                                        {"AAABBC", "nodes of 3, 2 and 1"},
                                        {NULL, NULL}};
  const char *const(*lay)[2] = P == 4 ? lay4 : lay6;
  static char label[64];
  if (lay[l][0] == NULL)
    return NULL;
  for (int q = 0; q < P; q++)
    snprintf(node[q], 16, "node%c", lay[l][0][q]);
  snprintf(label, sizeof label, "%s (%s)", lay[l][1], lay[l][0]);
  return label;
}

int main(int argc, char **argv) {
  char node[8][16], cfg[128];
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P != 4 && P != 6)
    skip_all("layouts are written for 4 and 6 ranks, not %d", P);
  setenv("HVD_CHUNK_SIZE", "4096", 1);

  /* The reference: flat allreduce, one node. */
  unsetenv("HVD_HOSTNAME");
  setenv("HVD_HIERARCHICAL_ALLREDUCE", "0", 1);
  run_config("flat", 1);

  setenv("HVD_HIERARCHICAL_ALLREDUCE", "1", 1);
  for (int l = 0;; l++) {
    const char *label = layout(l, node);
    if (label == NULL)
      break;
    int local_size = 0, local_rank = 0;
    for (int q = 0; q < P; q++)
      if (strcmp(node[q], node[R]) == 0) {
        local_size++;
        local_rank += q < R;
      }
    setenv("HVD_HOSTNAME", node[R], 1);
    snprintf(cfg, sizeof cfg, "hierarchical, %s", label);
    run_config(cfg, 0);
    /* (topology itself is t/mpi/topology's; here only that the layout is
     * the intended one) */
    hvd_init();
    tap_note("local %d/%d, expected %d/%d", hvd_local_rank(), hvd_local_size(),
             local_rank, local_size);
    ok(hvd_local_rank() == local_rank && hvd_local_size() == local_size,
       "%s: local rank and size as laid out", cfg);
    hvd_shutdown();
  }
  unsetenv("HVD_HOSTNAME");
  unsetenv("HVD_HIERARCHICAL_ALLREDUCE");
  unsetenv("HVD_CHUNK_SIZE");
  for (int k = 0; k < NSPECS; k++)
    for (int r = 0; r < 2; r++)
      free(flat[k][r]);
  return tap_mpi_finish();
}
