/*
 * hvdtest.c - helpers shared by hvd's C tests (see hvdtest.h).
 */
#include "hvdtest.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

/* ---- Elements ---- */

size_t hvdt_size(hvd_dtype_t dt) {
  static const size_t sizes[HVD_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
  if ((int)dt < 0 || dt >= HVD_DTYPE_COUNT)
    bail("hvdt_size: no dtype %d", (int)dt);
  return sizes[dt];
}

int hvdt_is_float(hvd_dtype_t dt) { return dt >= HVD_FLOAT16; }

int hvdt_is_signed(hvd_dtype_t dt) { return dt != HVD_UINT8; }

uint16_t hvdt_f32_to_f16(float f) {
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
  if (e <= 0) { /* subnormal half: mantissa * 2^-24 */
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
  if (rem > mid || (rem == mid && (half & 1))) /* a carry may bump e */
    half++;
  return (uint16_t)(sign | half);
}

float hvdt_f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f = e == 0    ? ldexpf((float)man, -24)
            : e == 31 ? (man ? NAN : INFINITY)
                      : ldexpf((float)(man | 0x400), e - 25);
  return (h & 0x8000) ? -f : f;
}

uint16_t hvdt_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* nan stays nan */
    return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

float hvdt_bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

double hvdt_get(hvd_dtype_t dt, const void *buf, int64_t i) {
  switch (dt) {
  case HVD_UINT8:
    return ((const uint8_t *)buf)[i];
  case HVD_INT8:
    return ((const int8_t *)buf)[i];
  case HVD_INT32:
    return ((const int32_t *)buf)[i];
  case HVD_INT64:
    return (double)((const int64_t *)buf)[i];
  case HVD_FLOAT16:
    return hvdt_f16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_BFLOAT16:
    return hvdt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32:
    return ((const float *)buf)[i];
  case HVD_FLOAT64:
    return ((const double *)buf)[i];
  default:
    bail("hvdt_get: no dtype %d", (int)dt);
  }
}

void hvdt_put(hvd_dtype_t dt, void *buf, int64_t i, double v) {
  switch (dt) {
  case HVD_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case HVD_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case HVD_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case HVD_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case HVD_FLOAT16:
    ((uint16_t *)buf)[i] = hvdt_f32_to_f16((float)v);
    break;
  case HVD_BFLOAT16:
    ((uint16_t *)buf)[i] = hvdt_f32_to_bf16((float)v);
    break;
  case HVD_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case HVD_FLOAT64:
    ((double *)buf)[i] = v;
    break;
  default:
    bail("hvdt_put: no dtype %d", (int)dt);
  }
}

double hvdt_rounding_err(const float *got, const float *want, int64_t n,
                         double r) {
  double m = 0, worst = 0;
  for (int64_t i = 0; i < n; i++)
    m = fmax(m, fabs((double)want[i]));
  for (int64_t i = 0; i < n; i++) {
    double a = got[i], b = want[i], d = fabs(a - b);
    if (!isfinite(a) || !isfinite(b))
      return INFINITY;
    if (d != 0)
      worst = fmax(worst, d / (r * fmax(fabs(a), fabs(b)) + r / 2 * m));
  }
  return worst;
}

double hvdt_as_dtype(hvd_dtype_t dt, double v) {
  double cell; /* 8 bytes, aligned for every dtype */
  hvdt_put(dt, &cell, 0, v);
  return hvdt_get(dt, &cell, 0);
}

void *hvdt_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (p == NULL)
    bail("out of memory");
  return p;
}

uint64_t hvdt_hash3(int q, int t, int64_t i) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull ^
               (uint64_t)(q + 1) * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)(t + 7) * 0x165667B19E3779F9ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

/* The file hvdt_stderr_begin opened (unlinked at once): its end reads it. */
static int stderr_file = -1;

int hvdt_stderr_begin(void) {
  char path[64] = "/tmp/hvdt-stderr-XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  if (fd < 0 || saved < 0)
    bail("hvdt_stderr_begin: cannot make a temporary file: %s",
         strerror(errno));
  unlink(path);
  fflush(stderr);
  dup2(fd, 2);
  stderr_file = fd;
  return saved;
}

void hvdt_stderr_end(int saved, char *got, size_t cap) {
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ssize_t k = pread(stderr_file, got, cap - 1, 0);
  got[k > 0 ? k : 0] = '\0';
  close(stderr_file);
  stderr_file = -1;
}

/* ---- Expected values ---- */

double hvdt_fold(hvd_op_t op, double acc, double v) {
  switch (op) {
  case HVD_SUM:
  case HVD_AVERAGE:
    return acc + v;
  case HVD_MIN:
    return v < acc ? v : acc;
  case HVD_MAX:
    return v > acc ? v : acc;
  case HVD_PRODUCT:
    return acc * v;
  default:
    bail("hvdt_fold: no op %d", (int)op);
  }
}

double hvdt_finish(hvd_op_t op, hvd_dtype_t dt, double acc, int size,
                   double post) {
  if (op == HVD_AVERAGE) /* integers: truncated toward zero */
    acc = hvdt_is_float(dt) ? acc / size : (double)((long long)acc / size);
  return acc * post;
}

/* ---- Comparison ---- */

double hvdt_want_array(const void *ctx, int64_t i) {
  return ((const double *)ctx)[i];
}

/* The distance from |v|, as dtype dt holds it, to the next value up. */
static double ulp(hvd_dtype_t dt, double v) {
  switch (dt) {
  case HVD_FLOAT16: {
    uint16_t h = hvdt_f32_to_f16(fabsf((float)v));
    return (double)hvdt_f16_to_f32((uint16_t)(h + 1)) - hvdt_f16_to_f32(h);
  }
  case HVD_BFLOAT16: {
    uint16_t h = hvdt_f32_to_bf16(fabsf((float)v));
    return (double)hvdt_bf16_to_f32((uint16_t)(h + 1)) - hvdt_bf16_to_f32(h);
  }
  case HVD_FLOAT32: {
    float f = fabsf((float)v);
    return nextafterf(f, INFINITY) - f;
  }
  case HVD_FLOAT64:
    return nextafter(fabs(v), INFINITY) - fabs(v);
  default:
    return 1;
  }
}

int hvdt_compare(hvd_dtype_t dt, const void *buf, int64_t n, hvdt_want_fn want,
                 const void *ctx, struct hvdt_tol tol, struct hvdt_wrong *w) {
  for (int64_t i = 0; i < n; i++) {
    double got = hvdt_get(dt, buf, i), exp = want(ctx, i);
    if (got == exp || (tol.rel > 0 && fabs(got - exp) <= tol.rel * fabs(exp)) ||
        (tol.ulps > 0 && fabs(got - exp) <= tol.ulps * ulp(dt, exp)))
      continue;
    if (w) {
      w->at = i;
      w->got = got;
      w->want = exp;
    }
    return 0;
  }
  return 1;
}

/* ---- Allreduce jobs ---- */

void hvdt_ar_submit(struct hvdt_ar *a, hvdt_value_fn value, double fill) {
  int64_t shape[1] = {a->n};
  hvdt_ar_free(a);
  a->send = hvdt_calloc((size_t)a->n, hvdt_size(a->dtype));
  a->recv =
      a->in_place ? a->send : hvdt_calloc((size_t)a->n, hvdt_size(a->dtype));
  for (int64_t i = 0; i < a->n; i++) {
    hvdt_put(a->dtype, a->send, i, value(a, tap_rank(), i));
    if (!a->in_place)
      hvdt_put(a->dtype, a->recv, i, fill);
  }
  a->ts = hvd_tensor_make(a->send, a->dtype, a->ndim, shape);
  a->tr = hvd_tensor_make(a->recv, a->dtype, a->ndim, shape);
  a->req = NULL;
  a->msg[0] = '\0';
  a->rc = hvd_allreduce_async(a->name, &a->ts, &a->tr, a->op, a->pre, a->post,
                              &a->req);
  if (a->rc != HVD_SUCCESS) {
    snprintf(a->msg, sizeof a->msg, "%s", hvd_last_error());
    a->req = NULL;
  }
}

void hvdt_ar_wait(struct hvdt_ar *a) {
  if (a->req == NULL)
    return;
  a->rc = hvd_wait(a->req);
  a->req = NULL;
  if (a->rc != HVD_SUCCESS)
    snprintf(a->msg, sizeof a->msg, "%s", hvd_last_error());
}

double hvdt_ar_expected(const struct hvdt_ar *a, hvdt_value_fn value, int64_t i,
                        int active) {
  double acc = 0;
  for (int q = 0; q < active; q++) {
    double v = value(a, q, i) * a->pre; /* exact */
    acc = q ? hvdt_fold(a->op, acc, v) : v;
  }
  return hvdt_finish(a->op, a->dtype, acc, tap_size(), a->post);
}

/* What hvdt_compare needs for an allreduce job. */
struct ar_ctx {
  const struct hvdt_ar *a;
  hvdt_value_fn value;
  int active;
};

static double ar_result(const void *ctx, int64_t i) {
  const struct ar_ctx *c = ctx;
  return hvdt_as_dtype(c->a->dtype,
                       hvdt_ar_expected(c->a, c->value, i, c->active));
}

static double ar_input(const void *ctx, int64_t i) {
  const struct ar_ctx *c = ctx;
  return c->value(c->a, tap_rank(), i);
}

int hvdt_ar_check(const struct hvdt_ar *a, hvdt_value_fn value, int active,
                  char *why, size_t len) {
  struct ar_ctx c = {a, value, active};
  /* float32 averages at 3 ranks are not exact: allow 2 ulps */
  struct hvdt_tol tol = {
      0, a->dtype == HVD_FLOAT32 && a->op == HVD_AVERAGE ? 2 : 0};
  struct hvdt_wrong w;
  if (a->rc != HVD_SUCCESS) {
    snprintf(why, len, "'%.47s': rc %d: %.400s", a->name, a->rc, a->msg);
    return 0;
  }
  if (!hvdt_compare(a->dtype, a->recv, a->n, ar_result, &c, tol, &w)) {
    snprintf(why, len,
             "'%.47s' (%s %s, %lld elements, pre %g post %g, %s): element "
             "%lld = %.17g, expected %.17g",
             a->name, hvd_dtype_name(a->dtype), hvd_op_name(a->op),
             (long long)a->n, a->pre, a->post,
             a->in_place ? "in place" : "out of place", (long long)w.at, w.got,
             w.want);
    return 0;
  }
  if (!a->in_place &&
      !hvdt_compare(a->dtype, a->send, a->n, ar_input, &c, HVDT_EXACT, &w)) {
    snprintf(why, len, "'%.47s': send element %lld changed", a->name,
             (long long)w.at);
    return 0;
  }
  return 1;
}

void hvdt_ar_free(struct hvdt_ar *a) {
  if (a->recv != a->send)
    free(a->recv);
  free(a->send);
  a->send = a->recv = NULL;
}

/* ---- Bursts of allreduces ---- */

const hvd_dtype_t hvdt_burst_dtypes[HVDT_BURST_DTYPES] = {
    HVD_FLOAT32, HVD_FLOAT64, HVD_FLOAT16, HVD_INT32};

double hvdt_burst_value(const struct hvdt_ar *a, int q, int64_t i) {
  int t = a->salt;
  if (a->op == HVD_PRODUCT)
    return (double)((q + i + t) % 2 + 1) *
           ((q * 3 + i + t) % 5 == 0 ? -1.0 : 1.0);
  return (double)((q * 5 + i * 3 + t) % 13) - 6;
}

/* Sets a burst job's parameters; its name is the caller's. */
static void burst_job(struct hvdt_ar *a, hvd_dtype_t dt, hvd_op_t op, int ndim,
                      int64_t n, const double scale[2], int in_place,
                      int salt) {
  a->dtype = dt;
  a->op = op;
  a->ndim = ndim;
  a->n = n;
  a->pre = scale[0];
  a->post = scale[1];
  a->in_place = in_place;
  a->salt = salt;
}

int hvdt_burst(struct hvdt_ar *out, const char *prefix, const int64_t *sizes,
               int nsizes, int salt_step, int big, int64_t big_n) {
  static const double scales[3][2] = {{1, 1}, {2, 0.25}, {0.5, 3}};
  int n = 0;
  for (int d = 0; d < HVDT_BURST_DTYPES; d++)
    for (int o = 0; o <= HVD_PRODUCT; o++) { /* the elementwise ops */
      hvd_dtype_t dt = hvdt_burst_dtypes[d];
      hvd_op_t op = (hvd_op_t)o;
      const double *sc = scales[dt == HVD_INT32 ? 0 : (d + o) % 3];
      for (int z = 0; z < nsizes; z++)
        for (int place = 0; place < 2; place++) {
          struct hvdt_ar *a = &out[n++];
          snprintf(a->name, sizeof a->name, "%s.%s.%s.%lld.%s", prefix,
                   hvd_dtype_name(dt), hvd_op_name(op), (long long)sizes[z],
                   place ? "in" : "out");
          burst_job(a, dt, op, z == 0 ? 0 : 1, sizes[z], sc, place,
                    n * salt_step);
        }
      /* big ones: sum in place, average out of place, max in place */
      int which = op == HVD_SUM       ? 0
                  : op == HVD_AVERAGE ? 1
                  : op == HVD_MAX     ? 2
                                      : -1;
      if (which < 0 || d * 3 + which >= big)
        continue;
      struct hvdt_ar *a = &out[n++];
      snprintf(a->name, sizeof a->name, "%s.%s.%s.big", prefix,
               hvd_dtype_name(dt), hvd_op_name(op));
      burst_job(a, dt, op, 1, big_n, sc, which != 1, n * salt_step);
    }
  return n;
}

/* ---- Checks ---- */

static double sum_of_ranks(const void *ctx, int64_t i) {
  int size = *(const int *)ctx;
  return (double)(size * (size + 1) / 2 + size * i);
}

hvd_result_t hvdt_sum_allreduce(const char *name, hvd_dtype_t dt, int n,
                                int *right, char *why, size_t len) {
  double x[64], y[64]; /* storage: any dtype fits */
  int64_t shape[1] = {n};
  int size = tap_size();
  struct hvdt_wrong w;
  if (n > 64)
    bail("hvdt_sum_allreduce: %d elements, at most 64", n);
  for (int i = 0; i < n; i++) {
    hvdt_put(dt, x, i, tap_rank() + 1 + i);
    hvdt_put(dt, y, i, -1);
  }
  hvd_tensor_t s = hvd_tensor_make(x, dt, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, dt, 1, shape);
  hvd_result_t rc = hvd_allreduce(name, &s, &r, HVD_SUM, 1.0, 1.0);
  *right = hvdt_compare(dt, y, n, sum_of_ranks, &size, HVDT_EXACT, &w);
  if (*right)
    why[0] = '\0';
  else
    snprintf(why, len, "'%s': element %lld = %g, expected %g", name,
             (long long)w.at, w.got, w.want);
  return rc;
}

void hvdt_allreduce_works(const char *name, hvd_dtype_t dt, int n,
                          const char *fmt, ...) {
  static int seq;
  char what[256], own[32], why[200];
  int right;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (name == NULL) {
    snprintf(own, sizeof own, "ok.%d", seq++);
    name = own;
  }
  hvd_result_t rc = hvdt_sum_allreduce(name, dt, n, &right, why, sizeof why);
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "%s", what);
  tap_note("%s", why);
  ok(right, "%s: values", what);
}

void hvdt_refused(hvd_result_t want, hvd_result_t rc, const char *msg,
                  const char *what) {
  is_int(want, rc, "%s: result", what);
  is_string(msg, hvd_last_error(), "%s: message", what);
}

void hvdt_expect_mismatch(hvd_result_t rc, const char *seen, const char *head,
                          const char *field, char vals[][HVDT_VAL_LEN],
                          char keys[][HVDT_VAL_LEN], const char *what) {
  char want[1024];
  int first = 1;
  size_t n = (size_t)snprintf(want, sizeof want, "%s: rank 0 %s %s vs", head,
                              field, vals[0]);
  if (!keys)
    keys = vals;
  for (int r = 1; r < tap_size() && n < sizeof want; r++) {
    if (strcmp(keys[r], keys[0]) == 0)
      continue;
    n += (size_t)snprintf(want + n, sizeof want - n, "%s rank %d %s %s",
                          first ? "" : ",", r, field, vals[r]);
    first = 0;
  }
  is_int(HVD_ERR_MISMATCH, rc, "%s: HVD_ERR_MISMATCH on every rank", what);
  is_string(want, seen, "%s: message", what);
}

/* ---- Orders ---- */

unsigned hvdt_shuffle(int *order, int n, unsigned seed) {
  for (int k = 0; k < n; k++)
    order[k] = k;
  for (int k = n - 1; k > 0; k--) {
    seed = seed * 1103515245u + 12345u;
    int m = (int)((seed >> 16) % (unsigned)(k + 1)), t = order[k];
    order[k] = order[m];
    order[m] = t;
  }
  return seed;
}

/* ---- Topology ---- */

static uint64_t sum_rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

static uint64_t sum_fin(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hvdt_sum64(const void *p, size_t n) {
  const unsigned char *b = p;
  const uint64_t k1 = 0x9e3779b97f4a7c15ull, k2 = 0xbf58476d1ce4e5b9ull;
  uint64_t lane[4] = {k1, 2 * k1, 3 * k1, 4 * k1};
  size_t words = (n + 31) / 32 * 4;
  for (size_t k = 0; k < words; k++) {
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--)
      w = (w << 8) | (8 * k + (size_t)i < n ? b[8 * k + (size_t)i] : 0);
    lane[k % 4] = sum_rotl(lane[k % 4] + w * k2, 31) * k1;
  }
  uint64_t h = sum_fin((uint64_t)n ^ 0x94d049bb133111ebull);
  for (int j = 0; j < 4; j++)
    h = sum_fin(h ^ lane[j]);
  return h;
}

void hvdt_init_nodes_of(int k) {
  char node[32];
  snprintf(node, sizeof node, "node%d", tap_rank() / k);
  if (setenv("HVD_HOSTNAME", node, 1) != 0)
    bail("setenv HVD_HOSTNAME failed");
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init on nodes of %d", k))
    bail("hvd_init: %s", hvd_last_error());
}

struct hvdt_topo hvdt_topo_model(char node[][32], int size, int r) {
  struct hvdt_topo t = {r, size, 0, 0, 0, 0, 1};
  int local[64] = {0}, count[64] = {0}, first[64];
  for (int q = 0; q < size && q < 64; q++) {
    first[q] = q;
    for (int p = 0; p < size; p++)
      if (strcmp(node[p], node[q]) == 0) {
        count[q]++;
        local[q] += p < q;
        first[q] = p < first[q] ? p : first[q];
      }
  }
  for (int q = 0; q < size && q < 64; q++) {
    if (count[q] != count[r])
      t.homog = 0;
    if (local[q] == local[r]) {
      t.cross_size++;
      t.cross_rank += first[q] < first[r];
    }
  }
  t.local_rank = local[r];
  t.local_size = count[r];
  return t;
}

void hvdt_is_topo(const struct hvdt_topo *want, const char *layout) {
  is_int(want->rank, hvd_rank(), "%s: hvd_rank", layout);
  is_int(want->size, hvd_size(), "%s: hvd_size", layout);
  is_int(want->local_rank, hvd_local_rank(), "%s: hvd_local_rank", layout);
  is_int(want->local_size, hvd_local_size(), "%s: hvd_local_size", layout);
  is_int(want->cross_rank, hvd_cross_rank(), "%s: hvd_cross_rank", layout);
  is_int(want->cross_size, hvd_cross_size(), "%s: hvd_cross_size", layout);
  is_int(want->homog, hvd_is_homogeneous(), "%s: hvd_is_homogeneous", layout);
}

void hvdt_burst_submit(struct hvdt_ar *jobs, const struct hvdt_ar *specs, int n,
                       int shuffled, unsigned seed, int salt_add) {
  int *order = hvdt_calloc((size_t)(n > 0 ? n : 1), sizeof *order);
  if (shuffled)
    hvdt_shuffle(order, n, seed);
  else
    for (int k = 0; k < n; k++)
      order[k] = k;
  for (int k = 0; k < n; k++) {
    struct hvdt_ar *j = &jobs[order[k]];
    *j = specs[order[k]];
    j->salt += salt_add;
    hvdt_ar_submit(j, hvdt_burst_value, -77);
  }
  free(order);
}

char *hvdt_slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  size_t got = s ? fread(s, 1, (size_t)n, f) : 0;
  fclose(f);
  if (s)
    s[got] = '\0';
  return s;
}

unsigned char *hvdt_read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  long len;
  if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0)
    bail("cannot read %s: %s", path, strerror(errno));
  unsigned char *b = hvdt_calloc((size_t)len + 1, 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

void hvdt_write_bytes(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(b, 1, n, f) != n || fclose(f) != 0)
    bail("cannot write %s: %s", path, strerror(errno));
}

/* ---- the timeline's JSON --------------------------------------------------
 */

typedef struct jp {
  const char *at, *text;
  int bad;
} jp_t;

static void jp_ws(jp_t *j) {
  while (*j->at == ' ' || *j->at == '\n' || *j->at == '\t' || *j->at == '\r')
    j->at++;
}

/* A string into out (cut to cap); escapes decoded, \uXXXX as '?'. */
static void jp_string(jp_t *j, char *out, size_t cap) {
  size_t k = 0;
  if (*j->at != '"') {
    j->bad = 1;
    return;
  }
  j->at++;
  while (*j->at != '\0' && *j->at != '"') {
    char c = *j->at++;
    if (c == '\\') {
      c = *j->at++;
      if (c == 'n')
        c = '\n';
      else if (c == 't')
        c = '\t';
      else if (c == 'u') {
        for (int i = 0; i < 4 && *j->at != '\0'; i++)
          j->at++;
        c = '?';
      } else if (c == '\0') {
        j->bad = 1;
        return;
      }
    }
    if (k + 1 < cap)
      out[k++] = c;
  }
  if (cap > 0)
    out[k] = '\0';
  if (*j->at != '"')
    j->bad = 1;
  else
    j->at++;
}

static double jp_number(jp_t *j) {
  char *end;
  double v = strtod(j->at, &end);
  if (end == j->at)
    j->bad = 1;
  j->at = end;
  return v;
}

/* Any value, skipped. */
static void jp_skip(jp_t *j, int depth) {
  char dummy[8];
  jp_ws(j);
  if (depth > 16) {
    j->bad = 1;
  } else if (*j->at == '"') {
    jp_string(j, dummy, sizeof dummy);
  } else if (*j->at == '{' || *j->at == '[') {
    char close = *j->at == '{' ? '}' : ']';
    j->at++;
    for (jp_ws(j); !j->bad && *j->at != close; jp_ws(j)) {
      if (close == '}') {
        jp_string(j, dummy, sizeof dummy);
        jp_ws(j);
        if (*j->at++ != ':')
          j->bad = 1;
      }
      jp_skip(j, depth + 1);
      jp_ws(j);
      if (*j->at == ',')
        j->at++;
      else if (*j->at != close)
        j->bad = 1;
    }
    if (*j->at == close)
      j->at++;
  } else if (*j->at == '-' || (*j->at >= '0' && *j->at <= '9')) {
    (void)jp_number(j);
  } else if (strncmp(j->at, "true", 4) == 0 || strncmp(j->at, "null", 4) == 0) {
    j->at += 4;
  } else if (strncmp(j->at, "false", 5) == 0) {
    j->at += 5;
  } else {
    j->bad = 1;
  }
}

/* An object's members, each handed to fn with its key (the value next). */
static void jp_object(jp_t *j, void (*fn)(jp_t *, const char *, void *),
                      void *ctx) {
  char key[64];
  jp_ws(j);
  if (*j->at != '{') {
    j->bad = 1;
    return;
  }
  j->at++;
  for (jp_ws(j); !j->bad && *j->at != '}'; jp_ws(j)) {
    jp_string(j, key, sizeof key);
    jp_ws(j);
    if (j->bad || *j->at++ != ':') {
      j->bad = 1;
      return;
    }
    jp_ws(j);
    fn(j, key, ctx);
    jp_ws(j);
    if (*j->at == ',')
      j->at++;
    else if (*j->at != '}')
      j->bad = 1;
  }
  if (*j->at == '}')
    j->at++;
}

static void args_member(jp_t *j, const char *key, void *ctx) {
  struct hvdt_event *e = ctx;
  if (strcmp(key, "name") == 0 && *j->at == '"')
    jp_string(j, e->track, sizeof e->track);
  else if (strcmp(key, "tensors") == 0)
    e->tensors = (int)jp_number(j);
  else
    jp_skip(j, 1);
}

static void event_member(jp_t *j, const char *key, void *ctx) {
  struct hvdt_event *e = ctx;
  if (strcmp(key, "name") == 0)
    jp_string(j, e->name, sizeof e->name);
  else if (strcmp(key, "ph") == 0)
    jp_string(j, e->ph, sizeof e->ph);
  else if (strcmp(key, "tid") == 0)
    e->tid = (int)jp_number(j);
  else if (strcmp(key, "ts") == 0)
    e->ts = jp_number(j);
  else if (strcmp(key, "args") == 0 && *j->at == '{')
    jp_object(j, args_member, e);
  else
    jp_skip(j, 1);
}

struct hvdt_event *hvdt_timeline_parse(const char *text, int *n) {
  jp_t j = {text, text, 0};
  struct hvdt_event *ev = NULL;
  int cap = 0;
  *n = 0;
  jp_ws(&j);
  if (*j.at++ != '[')
    j.bad = 1;
  for (jp_ws(&j); !j.bad && *j.at != '\0' && *j.at != ']'; jp_ws(&j)) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 256;
      struct hvdt_event *g = realloc(ev, (size_t)cap * sizeof *g);
      if (g == NULL)
        bail("hvdt_timeline_parse: out of memory");
      ev = g;
    }
    struct hvdt_event *e = &ev[*n];
    memset(e, 0, sizeof *e);
    e->tid = e->tensors = -1;
    e->ts = -1;
    jp_object(&j, event_member, e);
    (*n)++;
    jp_ws(&j);
    if (*j.at == ',')
      j.at++;
  }
  if (j.bad) {
    diag("hvdt_timeline_parse: not a timeline's JSON at offset %ld",
         (long)(j.at - j.text));
    free(ev);
    *n = 0;
    return NULL;
  }
  return ev;
}

/* Tensor `name`'s track in parsed events, or -1. */
static int find_track(const struct hvdt_event *ev, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(ev[i].ph, "M") == 0 && strcmp(ev[i].name, "thread_name") == 0 &&
        strcmp(ev[i].track, name) == 0)
      return ev[i].tid;
  return -1;
}

/* The last complete `span` on tensor `name`'s track: its index, or -1. */
static int last_span(const struct hvdt_event *ev, int n, const char *name,
                     const char *span) {
  int last = -1, tid = find_track(ev, n, name);
  for (int i = 0; tid >= 0 && i < n; i++)
    if (ev[i].tid == tid && strcmp(ev[i].ph, "X") == 0 &&
        strcmp(ev[i].name, span) == 0)
      last = i;
  return last;
}

int hvdt_timeline_track(const char *text, const char *name) {
  int n;
  struct hvdt_event *ev = hvdt_timeline_parse(text, &n);
  int tid = find_track(ev, n, name);
  free(ev);
  return tid;
}

int hvdt_timeline_span(const char *text, const char *name, const char *span,
                       double *ts) {
  int n;
  struct hvdt_event *ev = hvdt_timeline_parse(text, &n);
  int last = last_span(ev, n, name, span);
  if (last >= 0 && ts != NULL)
    *ts = ev[last].ts;
  free(ev);
  return last >= 0;
}

int hvdt_timeline_fused(const char *text, const char *const *names, int n,
                        const char *span) {
  int count = 0;
  struct hvdt_event *ev =
      text != NULL ? hvdt_timeline_parse(text, &count) : NULL;
  int good = 1;
  int l0 = last_span(ev, count, names[0], span);
  if (l0 < 0 || ev[l0].tensors != n) {
    diag("%s: %s", names[0],
         l0 < 0 ? "no span in the timeline" : "its span is not of the group");
    good = 0;
  }
  for (int i = 1; good && i < n; i++) {
    int l = last_span(ev, count, names[i], span);
    double t = l >= 0 ? ev[l].ts : -1;
    int g = l >= 0 && ev[l].tensors == n;
    if (t != ev[l0].ts || !g) {
      diag("%s starts at %.3f (%s %d tensors), %s at %.3f", names[i], t,
           g ? "with" : "not with", n, names[0], ev[l0].ts);
      good = 0;
    }
  }
  free(ev);
  return good;
}

void hvdt_shared_tmpdir(char *dir, size_t len, const char *tag) {
  int rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    const char *t = getenv("TMPDIR");
    n = snprintf(dir, len, "%s/%s.XXXXXX", t != NULL && *t ? t : "/tmp", tag);
    if (n < 0 || (size_t)n >= len || mkdtemp(dir) == NULL)
      bail("hvdt_shared_tmpdir: cannot make %s: %s", dir, strerror(errno));
  }
  MPI_Bcast(dir, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
}

int hvdt_same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa != NULL && fb != NULL, ca = 0, cb = 0;
  while (same && ca != EOF) {
    ca = getc(fa);
    cb = getc(fb);
    same = ca == cb;
  }
  if (fa)
    fclose(fa);
  if (fb)
    fclose(fb);
  return same;
}

void hvdt_remove_tmpdir(const char *dir) {
  int rank = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
      diag("could not remove %s", dir);
  }
}

int hvdt_same_on_all_ranks(const void *x, size_t bytes) {
  unsigned char *r0 = hvdt_calloc(bytes > 0 ? bytes : 1, 1);
  int same, all;
  memcpy(r0, x, bytes);
  MPI_Bcast(r0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
  same = memcmp(r0, x, bytes) == 0;
  free(r0);
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}
