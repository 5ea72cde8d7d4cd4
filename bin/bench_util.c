/*
 * bench_util.c - the helpers of hvd-bench: fatal errors, clock and
 * statistics, element access for every dtype (with float16 and bfloat16
 * conversions of our own: libhvd keeps its own internal), byte sizes, the
 * HVD_* environment and a small streaming JSON writer.
 */
#include "bench.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/half.h"
#include "base/json.h"

int bench_rank = 0, bench_size = 1;

/* ---- failures ----------------------------------------------------------- */

static void die(void) {
  fflush(stdout);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1); /* not reached */
}

void bench_fail_hvd(hvd_result_t rc, const char *what) {
  fprintf(stderr, "[rank %d] %s failed: %s: %s\n", bench_rank, what,
          hvd_strerror(rc), hvd_last_error());
  die();
}

void bench_fail_mpi(int err, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", err);
  fprintf(stderr, "[rank %d] %s failed: %s\n", bench_rank, what, msg);
  die();
}

void bench_fail(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[rank %d] ", bench_rank);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  die();
}

void *bench_alloc(size_t bytes) {
  void *p = malloc(bytes > 0 ? bytes : 1);
  if (p == NULL)
    bench_fail("out of memory allocating %zu bytes", bytes);
  return p;
}

int bench_all_ok(int ok) {
  int v = ok ? 1 : 0;
  BENCH_MPI(
      MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return v;
}

/* ---- time and statistics ------------------------------------------------ */

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void bench_max_over_ranks(double *samples, int n) {
  BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, samples, n, MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD));
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double percentile(const double *s, int n, double p) {
  int i = (int)ceil(p * n) - 1;
  return s[i < 0 ? 0 : i >= n ? n - 1 : i];
}

bench_stats_t bench_stats(double *s, int n) {
  bench_stats_t st;
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  st.min = s[0];
  st.max = s[n - 1];
  st.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  st.p90 = percentile(s, n, 0.90);
  st.p99 = percentile(s, n, 0.99);
  return st;
}

/* ---- element values ----------------------------------------------------- */

int bench_is_float(hvd_dtype_t dt) {
  return dt == HVD_FLOAT16 || dt == HVD_BFLOAT16 || dt == HVD_FLOAT32 ||
         dt == HVD_FLOAT64;
}

void bench_put(void *buf, hvd_dtype_t dt, int64_t i, double v) {
  switch (dt) {
  case HVD_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
    break;
  case HVD_INT8:
    ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
    break;
  case HVD_INT32:
    ((int32_t *)buf)[i] = (int32_t)(int64_t)v;
    break;
  case HVD_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case HVD_FLOAT16:
    ((uint16_t *)buf)[i] = hvd__f32_to_f16((float)v);
    break;
  case HVD_BFLOAT16:
    ((uint16_t *)buf)[i] = hvd__f32_to_bf16((float)v);
    break;
  case HVD_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case HVD_FLOAT64:
  default:
    ((double *)buf)[i] = v;
    break;
  }
}

double bench_get(const void *buf, hvd_dtype_t dt, int64_t i) {
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
    return hvd__f16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_BFLOAT16:
    return hvd__bf16_to_f32(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32:
    return ((const float *)buf)[i];
  case HVD_FLOAT64:
  default:
    return ((const double *)buf)[i];
  }
}

/* ---- names, sizes, environment ------------------------------------------ */

const char *bench_coll_name(enum bench_coll c) {
  static const char *const names[] = {"allreduce", "broadcast", "allgather",
                                      "alltoall", "reducescatter"};
  return (unsigned)c < BENCH_COLL_COUNT ? names[c] : "unknown";
}

int64_t bench_parse_bytes(const char *s) {
  char *end = NULL;
  if (s == NULL || *s < '0' || *s > '9')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  switch (*end) {
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  default:
    break;
  }
  if (shift && *end == 'i')
    end++;
  if (*end == 'B' || *end == 'b')
    end++;
  if (*end != '\0' || v > (1ULL << 40) || (v << shift) > (1ULL << 40))
    return -1;
  return (int64_t)(v << shift);
}

const char *bench_bytes_str(double bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024.0) {
    bytes /= 1024.0;
    u++;
  }
  if (bytes == floor(bytes))
    snprintf(buf, len, "%.0f %s", bytes, units[u]);
  else
    snprintf(buf, len, "%.1f %s", bytes, units[u]);
  return buf;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The HVD_* entries of the environment, sorted; *n of them. Free the array
 * (not the strings). */
static const char **hvd_env(int *n) {
  int count = 0, k = 0;
  for (char **e = environ; *e != NULL; e++)
    count += strncmp(*e, "HVD_", 4) == 0;
  const char **v = bench_alloc(sizeof *v * (size_t)(count + 1));
  for (char **e = environ; *e != NULL; e++)
    if (strncmp(*e, "HVD_", 4) == 0)
      v[k++] = *e;
  qsort(v, (size_t)count, sizeof *v, cmp_str);
  *n = count;
  return v;
}

const char *bench_env_line(char *buf, size_t len) {
  int n;
  const char **v = hvd_env(&n);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < len; i++) {
    int w = snprintf(buf + used, len - used, "%s%s", i ? " " : "", v[i]);
    used += w > 0 ? (size_t)w : 0;
  }
  if (n == 0)
    snprintf(buf, len, "(none set)");
  free(v);
  return buf;
}

/* ---- JSON --------------------------------------------------------------- */

#define JSON_DEPTH 16
static int json_depth;             /* open containers */
static int json_count[JSON_DEPTH]; /* values written in each */

static void json_string(const char *s) {
  putchar('"');
  hvd__json_escape(s, hvd__json_put_file, stdout);
  putchar('"');
}

/* The comma, newline, indentation and key in front of a value. */
static void json_prefix(const char *key) {
  if (json_depth > 0) {
    if (json_count[json_depth - 1]++ > 0)
      putchar(',');
    printf("\n%*s", 2 * json_depth, "");
  }
  if (key != NULL) {
    json_string(key);
    printf(": ");
  }
}

void bench_json_open(const char *key, char bracket) {
  json_prefix(key);
  putchar(bracket);
  if (json_depth < JSON_DEPTH)
    json_count[json_depth++] = 0;
}

void bench_json_close(char bracket) {
  if (json_depth > 0 && json_count[--json_depth] > 0)
    printf("\n%*s", 2 * json_depth, "");
  putchar(bracket);
  if (json_depth == 0)
    putchar('\n');
  fflush(stdout);
}

void bench_json_str(const char *key, const char *v) {
  json_prefix(key);
  json_string(v);
}

void bench_json_num(const char *key, double v) {
  json_prefix(key);
  if (isfinite(v))
    printf("%.6g", v);
  else
    printf("null");
}

void bench_json_int(const char *key, int64_t v) {
  json_prefix(key);
  printf("%lld", (long long)v);
}

void bench_json_bool(const char *key, int v) {
  json_prefix(key);
  printf(v ? "true" : "false");
}

void bench_json_header(const char *mode) {
  int n;
  const char **v = hvd_env(&n);
  bench_json_open(NULL, '{');
  bench_json_str("mode", mode);
  bench_json_int("world_size", bench_size);
  bench_json_str("hvd_version", hvd_version());
  bench_json_open("settings", '{');
  for (int i = 0; i < n; i++) {
    char name[256];
    const char *eq = strchr(v[i], '=');
    size_t nl = eq ? (size_t)(eq - v[i]) : strlen(v[i]);
    snprintf(name, sizeof name, "%.*s", (int)nl, v[i]);
    bench_json_str(name, eq ? eq + 1 : "");
  }
  bench_json_close('}');
  free(v);
}

/* ---- workloads (.tensors files) and their inputs ------------------------- */

void *bench_alloc_as(int kind, size_t bytes) {
  if (kind != BENCH_DATA_HVD)
    return bench_alloc(bytes);
  void *p = hvd_alloc_host(bytes);
  if (p == NULL)
    bench_fail("hvd_alloc_host(%zu): %s", bytes, hvd_last_error());
  return p;
}

void bench_free_as(int kind, void *p) {
  if (kind == BENCH_DATA_HVD)
    BENCH_HVD(hvd_free_host(p));
  else
    free(p);
}

void bench_free_workload(workload_t *w) {
  for (int i = 0; i < w->count; i++) {
    free(w->t[i].name);
    bench_free_as(w->host_data, w->t[i].data);
  }
  free(w->t);
  bench_free_as(w->host_data, w->packed);
  memset(w, 0, sizeof *w);
}

/* A workload given by name (no '/'): NAME or NAME.tensors among the
 * installed workloads, else the source tree's (a build not installed). */
static FILE *open_workload(const char *path, char *found, size_t len) {
  FILE *f = fopen(path, "r");
  snprintf(found, len, "%s", path);
  if (f != NULL || errno != ENOENT || strchr(path, '/') != NULL)
    return f;
  static const char *const dirs[] = {HVD_WORKLOADS_DIR, HVD_SRC_WORKLOADS_DIR};
  for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++)
    for (int ext = 0; ext < 2; ext++) {
      snprintf(found, len, "%s/%s%s", dirs[d], path, ext ? ".tensors" : "");
      if ((f = fopen(found, "r")) != NULL)
        return f;
    }
  snprintf(found, len, "%s", path);
  errno = ENOENT;
  return NULL;
}

/* The tokens of one line of a .tensors file, its comment ('#' on) cut
 * off; at most 4 (a fourth is already one too many). */
static int split_line(char *line, char **tok) {
  char *save = NULL;
  int ntok = 0;
  char *hash = strchr(line, '#');
  if (hash != NULL)
    *hash = '\0';
  for (char *s = strtok_r(line, " \t\r\n", &save); s != NULL && ntok < 4;
       s = strtok_r(NULL, " \t\r\n", &save))
    tok[ntok++] = s;
  return ntok;
}

/* Line lineno of path, `name dim0 [dim1]` in ntok tokens, as w's next
 * tensor (*alloc: the tensors w->t has room for); 0 with the reason in err
 * if the line is malformed. */
static int add_tensor(workload_t *w, int *alloc, char **tok, int ntok,
                      const char *path, int lineno, char *err, size_t len) {
  int ok = 0;
  if (ntok < 2 || ntok > 3) {
    snprintf(err, len, "%s:%d: expected `name dim0 [dim1]`", path, lineno);
    goto done;
  }
  if (w->count == *alloc) {
    *alloc = *alloc ? 2 * *alloc : 256;
    ltensor_t *nt = realloc(w->t, sizeof *nt * (size_t)*alloc);
    if (nt == NULL)
      bench_fail("out of memory reading %s", path);
    w->t = nt;
  }
  ltensor_t *t = &w->t[w->count];
  memset(t, 0, sizeof *t);
  t->ndim = ntok - 1;
  t->n = 1;
  for (int d = 0; d < t->ndim; d++) {
    char *end = NULL;
    long long v = strtoll(tok[d + 1], &end, 10);
    if (end == tok[d + 1] || *end != '\0' || v < 1 || v > INT_MAX) {
      snprintf(err, len,
               "%s:%d: dimension '%s' is not a positive "
               "integer",
               path, lineno, tok[d + 1]);
      goto done;
    }
    t->shape[d] = v;
    t->n *= v;
  }
  if (t->n > INT_MAX) {
    snprintf(err, len, "%s:%d: tensor has more than %d elements", path, lineno,
             INT_MAX);
    goto done;
  }
  for (int i = 0; i < w->count; i++)
    if (strcmp(w->t[i].name, tok[0]) == 0) {
      snprintf(err, len, "%s:%d: tensor '%s' appears twice", path, lineno,
               tok[0]);
      goto done;
    }
  t->name = strdup(tok[0]);
  if (t->name == NULL)
    bench_fail("out of memory reading %s", path);
  w->elems += t->n;
  w->count++;
  ok = 1;
done:
  return ok;
}

/* Reads FILE; on error rank 0 says why and it returns 0 (on every rank:
 * every rank reads the same file). */
int bench_load_workload(const char *path, workload_t *w, int host_data) {
  char found[4096];
  FILE *f = open_workload(path, found, sizeof found);
  char *line = NULL, err[4600] = "";
  size_t cap = 0;
  int lineno = 0, alloc = 0;

  memset(w, 0, sizeof *w);
  if (f == NULL) {
    if (strchr(path, '/') == NULL)
      snprintf(err, sizeof err,
               "%s: %s (nor is %s.tensors among the workloads in %s)", path,
               strerror(errno), path, HVD_WORKLOADS_DIR);
    else
      snprintf(err, sizeof err, "%s: %s", path, strerror(errno));
    goto fail;
  }
  path = found;
  while (getline(&line, &cap, f) != -1) {
    char *tok[4];
    int ntok = split_line(line, tok);
    lineno++;
    if (ntok == 0)
      continue;
    if (!add_tensor(w, &alloc, tok, ntok, path, lineno, err, sizeof err))
      goto fail;
  }
  if (ferror(f)) {
    snprintf(err, sizeof err, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (w->count == 0) {
    snprintf(err, sizeof err, "%s: no tensors", path);
    goto fail;
  }
  fclose(f);
  free(line);
  w->host_data = host_data;
  for (int i = 0; host_data != BENCH_DATA_NONE && i < w->count; i++)
    w->t[i].data = bench_alloc_as(host_data, sizeof(float) * (size_t)w->t[i].n);
  return 1;
fail:
  if (bench_rank == 0)
    fprintf(stderr, "hvd-bench: %s\n", err);
  if (f != NULL)
    fclose(f);
  free(line);
  bench_free_workload(w);
  return 0;
}

/* Element i of tensor t: the same base on every rank plus offsets that
 * cancel in pairs of ranks, so the sum is P * base and the average base. */
float bench_base_value(int t, int64_t i) {
  return (float)((t * 31 + i) % 7 - 3);
}

float bench_input_value(int t, int64_t i, int r) {
  float base = bench_base_value(t, i);
  if (r % 2 == 0 && r + 1 < bench_size)
    return base + (float)((i + r) % 3);
  if (r % 2 == 1)
    return base - (float)((i + r - 1) % 3);
  return base;
}
