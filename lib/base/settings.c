/*
 * settings.c - the HVD_* variables of settings.h's HVD__SETTINGS list:
 * the table behind hvd_setting_info, the parsers of each kind, the
 * loader and the info log line, all generated from the list.
 */
#include "base/settings.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/errors.h"
#include "base/log.h"

typedef enum kind {
  K_LEVEL,
  K_DOUBLE,
  K_INT64,
  K_BYTES, /* an int64 of bytes, with an optional K, M, G or T (x 1024) */
  K_LIMIT, /* the same, 0 (no limit) or at least the minimum */
  K_INT,
  K_BOOL,
  K_PATH,
  K_HOST,
  K_GPUOPS
} kind_t;

/* One row of the list. */
typedef struct setting {
  const char *name;
  kind_t kind;
  size_t offset, size; /* of the field */
  double def, lo, hi;
  const char *shown; /* the default as hvd-info shows it */
  const char *meaning;
} setting_t;

static const setting_t table[] = {
#define ROW(name, shown, field, kind, def, lo, hi, meaning)                    \
  {#name,                                                                      \
   K_##kind,                                                                   \
   offsetof(hvd__settings_t, field),                                           \
   sizeof(((hvd__settings_t *)0)->field),                                      \
   (double)(def),                                                              \
   lo,                                                                         \
   hi,                                                                         \
   shown,                                                                      \
   meaning},
    HVD__SETTINGS(ROW)
#undef ROW
};

#define COUNT ((int)(sizeof table / sizeof table[0]))

int hvd_setting_count(void) { return COUNT; }

hvd_result_t hvd_setting_info(int i, const char **name,
                              const char **default_value,
                              const char **meaning) {
  if (i < 0 || i >= COUNT)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_setting_info: index %d is out of range 0..%d", i,
                          COUNT - 1);
  if (name != NULL)
    *name = table[i].name;
  if (default_value != NULL)
    *default_value = table[i].shown;
  if (meaning != NULL)
    *meaning = table[i].meaning;
  return HVD_SUCCESS;
}

/* ---- parsers: each sets its field when the variable is set and good --- */

static hvd_result_t parse_text(const char *name, const char *v, char *out,
                               size_t n) {
  if (strlen(v) >= n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s is longer than %zu characters", name, n - 1);
  snprintf(out, n, "%s", v);
  return HVD_SUCCESS;
}

/* A range's bound as the message shows it: a whole number in full
 * (1048576, 1000000000, not %g's 1.04858e+06 and 1e+09). */
static void bound_str(double x, char *buf, size_t n) {
  if (x == floor(x) && fabs(x) < 1e18)
    snprintf(buf, n, "%.0f", x);
  else
    snprintf(buf, n, "%g", x);
}

/* v as a finite number, all of it to *end but for what follows the
 * number; 0 if it does not start with one. White space before it is
 * refused here, where strtod would skip it: a value is read one way only
 * (" 0" is not 0). */
static int number(const char *v, double *d, char **end) {
  if (isspace((unsigned char)v[0]))
    return 0;
  errno = 0;
  *d = strtod(v, end);
  return errno == 0 && *end != v && isfinite(*d);
}

static hvd_result_t parse_double(const char *name, const char *v, double min,
                                 double max, double *out) {
  char *end = NULL, lo[32], hi[32];
  double d = 0;
  if (!number(v, &d, &end) || *end != '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is not a number", name,
                          v);
  bound_str(min, lo, sizeof lo);
  bound_str(max, hi, sizeof hi);
  if (d < min || d > max)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is out of range %s..%s",
                          name, v, lo, hi);
  *out = d;
  return HVD_SUCCESS;
}

/* BOOL: a number that is exactly 0 or 1 ("0.5" used to read as 1). */
static hvd_result_t parse_bool(const char *name, const char *v, int *out) {
  char *end = NULL;
  double d = 0;
  if (!number(v, &d, &end) || *end != '\0' || (d != 0 && d != 1))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is not 0 or 1", name,
                          v);
  *out = d == 1;
  return HVD_SUCCESS;
}

/* A size in bytes: a number, optionally followed by K, M, G or T (powers
 * of 1024; KiB, MB... and lower case too), as hvd-bench reads sizes. The
 * unit is looked up only when a letter follows the number: a space there
 * once matched strchr's terminator and multiplied by 1024^5. */
static hvd_result_t parse_bytes(const char *name, const char *v, double min,
                                double max, double *out) {
  char *end = NULL, lo[32], hi[32];
  double d = 0;
  static const char units[] = "KMGT";
  const char *u = NULL;
  int good = number(v, &d, &end) && d >= 0;
  if (good && *end != '\0') {
    const char *rest = end + 1;
    u = isalpha((unsigned char)end[0])
            ? strchr(units, toupper((unsigned char)end[0]))
            : NULL;
    good = u != NULL && (*rest == '\0' || strcasecmp(rest, "B") == 0 ||
                         strcasecmp(rest, "iB") == 0);
  }
  if (!good)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s='%s' is not a size (bytes, or with K, M, G, T)",
                          name, v);
  for (const char *k = units; u != NULL && k <= u; k++)
    d *= 1024;
  bound_str(min, lo, sizeof lo);
  bound_str(max, hi, sizeof hi);
  if (d < min || d > max || d != floor(d))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s='%s' is out of range %s..%s bytes (whole)", name,
                          v, lo, hi);
  *out = d;
  return HVD_SUCCESS;
}

static hvd_result_t parse_level(const char *v, int *out) {
  int level = hvd__log_parse_level(v);
  if (level < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "HVD_LOG_LEVEL='%s' is not one of trace, debug, "
                          "info, warning, error",
                          v);
  *out = level;
  return HVD_SUCCESS;
}

/* HVD_GPU_OPERATIONS: nccl or mpi (case-insensitive); nccl by default in
 * builds with NCCL, else mpi. nccl in a CUDA build without NCCL is an
 * error; in a build without CUDA the value is only checked for spelling
 * (there are no device tensors to route). */
static int gpu_ops_default(void) {
  return hvd_nccl_built() ? HVD__GPU_OPS_NCCL : HVD__GPU_OPS_MPI;
}

static hvd_result_t parse_gpu_ops(const char *v, int *out) {
  if (strcasecmp(v, "mpi") == 0) {
    *out = HVD__GPU_OPS_MPI;
    return HVD_SUCCESS;
  }
  if (strcasecmp(v, "nccl") != 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "HVD_GPU_OPERATIONS='%s' is not one of nccl, mpi", v);
  if (hvd_cuda_built() && !hvd_nccl_built())
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "HVD_GPU_OPERATIONS='%s': this build has no NCCL "
                          "(use mpi)",
                          v);
  *out = gpu_ops_default();
  return HVD_SUCCESS;
}

/* ---- loading ------------------------------------------------------------- */

/* The row's default into its field. */
static void set_default(const setting_t *t, char *field) {
  switch (t->kind) {
  case K_DOUBLE:
    *(double *)(void *)field = t->def;
    break;
  case K_INT64:
  case K_BYTES:
  case K_LIMIT:
    *(int64_t *)(void *)field = (int64_t)t->def;
    break;
  case K_GPUOPS:
    *(int *)(void *)field = gpu_ops_default();
    break;
  case K_PATH:
  case K_HOST:
    field[0] = '\0';
    break;
  default: /* LEVEL, INT, BOOL */
    *(int *)(void *)field = (int)t->def;
  }
}

/* v (set, not empty) into the row's field. */
static hvd_result_t parse(const setting_t *t, const char *v, char *field) {
  hvd_result_t rc = HVD_SUCCESS;
  double d = 0;
  switch (t->kind) {
  case K_LEVEL:
    return parse_level(v, (int *)(void *)field);
  case K_GPUOPS:
    return parse_gpu_ops(v, (int *)(void *)field);
  case K_PATH:
  case K_HOST:
    return parse_text(t->name, v, field, t->size);
  case K_DOUBLE:
    return parse_double(t->name, v, t->lo, t->hi, (double *)(void *)field);
  case K_BOOL:
    return parse_bool(t->name, v, (int *)(void *)field);
  case K_BYTES:
    HVD__CHECK(parse_bytes(t->name, v, t->lo, t->hi, &d));
    break;
  case K_LIMIT:
    HVD__CHECK(parse_bytes(t->name, v, 0, t->hi, &d));
    if (d != 0 && d < t->lo)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s='%s' is below the smallest limit, %.0f bytes "
                            "(0: no limit)",
                            t->name, v, t->lo);
    break;
  default: /* K_INT, K_INT64: whole ("1.5" once read as 1) */
    HVD__CHECK(parse_double(t->name, v, t->lo, t->hi, &d));
    if (d != floor(d))
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s='%s' is not a whole number", t->name, v);
  }
  if (t->kind == K_INT64 || t->kind == K_BYTES || t->kind == K_LIMIT)
    *(int64_t *)(void *)field = (int64_t)d;
  else /* K_INT */
    *(int *)(void *)field = (int)d;
fail:
  return rc;
}

hvd_result_t hvd__settings_load(hvd__settings_t *s) {
  hvd_result_t first = HVD_SUCCESS;
  char why[HVD__ERRMSG_MAX] = "";
  memset(s, 0, sizeof *s);
  for (int i = 0; i < COUNT; i++)
    set_default(&table[i], (char *)s + table[i].offset);
  for (int i = 0; i < COUNT; i++) { /* all of them: the good ones count */
    const char *v = getenv(table[i].name);
    hvd_result_t rc = v != NULL && *v != '\0'
                          ? parse(&table[i], v, (char *)s + table[i].offset)
                          : HVD_SUCCESS;
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(why, sizeof why, "%s", hvd_last_error());
    }
  }
  return first == HVD_SUCCESS ? HVD_SUCCESS : hvd__set_error_msg(first, why);
}

/* "NAME=value" of one row, as the info line shows it. */
static int show(const setting_t *t, const char *field, char *out, size_t n) {
  switch (t->kind) {
  case K_LEVEL:
    return snprintf(out, n, "%s=%s", t->name,
                    hvd__log_level_name(*(const int *)(const void *)field));
  case K_DOUBLE:
    return snprintf(out, n, "%s=%g", t->name,
                    *(const double *)(const void *)field);
  case K_INT64:
  case K_BYTES:
  case K_LIMIT:
    return snprintf(out, n, "%s=%lld", t->name,
                    (long long)*(const int64_t *)(const void *)field);
  case K_PATH:
  case K_HOST:
    return snprintf(out, n, "%s=%s", t->name, field[0] ? field : "(unset)");
  case K_GPUOPS:
    return snprintf(out, n, "%s=%s", t->name,
                    *(const int *)(const void *)field == HVD__GPU_OPS_NCCL
                        ? "nccl"
                        : "mpi");
  default: /* INT, BOOL */
    return snprintf(out, n, "%s=%d", t->name,
                    *(const int *)(const void *)field);
  }
}

void hvd__settings_log(const hvd__settings_t *s) {
  char line[4 * HVD__PATH_MAX];
  size_t at = 0;
  for (int i = 0; i < COUNT && at < sizeof line - 1; i++) {
    if (i > 0)
      line[at++] = ' ';
    int k = show(&table[i], (const char *)s + table[i].offset, line + at,
                 sizeof line - at);
    at += k > 0 ? (size_t)k : 0;
    if (at >= sizeof line)
      at = sizeof line - 1; /* cut, as the log line would be */
  }
  line[at < sizeof line ? at : sizeof line - 1] = '\0';
  HVD__LOG(HVD__LOG_INFO, "settings: %s", line);
}

hvd_result_t hvd_setting_check(int i) {
  if (i < 0 || i >= COUNT)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_setting_check: index %d is out of range 0..%d",
                          i, COUNT - 1);
  hvd__settings_t scratch;
  const char *v = getenv(table[i].name);
  if (v == NULL || *v == '\0')
    return HVD_SUCCESS;
  return parse(&table[i], v, (char *)&scratch + table[i].offset);
}

int hvd__setting_bool(const char *name, char *why, size_t n) {
  why[0] = '\0';
  for (int i = 0; i < COUNT; i++) {
    if (strcmp(table[i].name, name) != 0 || table[i].kind != K_BOOL)
      continue;
    int on = (int)table[i].def;
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
      return on;
    char keep[HVD__ERRMSG_MAX]; /* the caller's last error stays */
    snprintf(keep, sizeof keep, "%s", hvd_last_error());
    if (parse_bool(name, v, &on) != HVD_SUCCESS) {
      snprintf(why, n, "%s", hvd_last_error());
      on = (int)table[i].def;
    }
    hvd__set_error_msg(HVD_SUCCESS, keep);
    return on;
  }
  snprintf(why, n, "%s is not a 0-or-1 setting", name);
  return 0;
}

/* ---- names that look like settings but are not ----------------------------
 */

/* HVD_* variables that are not settings but are read by hvd's tools, its
 * launcher or its tests (prefixes end in '_'). */
static const char *const not_settings[] = {"HVD_ELASTIC_RESTARTS",
                                           "HVD_ELASTIC_PREVIOUS_SIZE",
                                           "HVD_RUN_NO_CMA",
                                           "HVD_BINDING_PROG",
                                           "HVD_TEST_",
                                           "HVD_STANDIN_",
                                           "HVD_TOP_",
                                           "HVD_MPIRUN_TEST",
                                           "HVD_CI_",
                                           "HVD_BENCH_",
                                           "HVD_SOAK_",
                                           "HVD_NEGOTIATION_",
                                           "HVD_BLAME_",
                                           "HVD_SHARE_"};

/* Horovod's variables whose hvd name is not HVD_ + the same rest. */
static const char *const horovod_renamed[][2] = {
    {"HOROVOD_STALL_CHECK_TIME_SECONDS", "HVD_STALL_CHECK_TIME"},
    {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HVD_STALL_SHUTDOWN_TIME"},
    {"HOROVOD_GPU_ALLREDUCE", "HVD_GPU_OPERATIONS"},
    {"HOROVOD_GPU_BROADCAST", "HVD_GPU_OPERATIONS"},
    {"HOROVOD_GPU_ALLGATHER", "HVD_GPU_OPERATIONS"},
    {"HOROVOD_HIERARCHICAL_ALLGATHER", "HVD_HIERARCHICAL_ALLREDUCE"}};

/* Edit distance of a and b (each at most 63 characters compared). */
static int distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b), row[64];
  la = la > 63 ? 63 : la;
  lb = lb > 63 ? 63 : lb;
  for (int j = 0; j <= lb; j++)
    row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* The setting an HVD_ name (rest: without "HVD_") probably meant, or
 * NULL. First the shortest setting that the name begins (at least four
 * characters of it): HVD_TIMELINE_MAX means HVD_TIMELINE_MAX_BYTES, which
 * edit distance put after HVD_TIMELINE. Else the nearest by edit distance,
 * when close (at most a third of its length apart): a typo. */
static const char *nearest(const char *rest) {
  const char *best = NULL;
  int bd = 1 << 30, len = (int)strlen(rest);
  for (int i = 0; len >= 4 && i < COUNT; i++) {
    const char *known = table[i].name + 4;
    if (strncmp(known, rest, (size_t)len) == 0 && (int)strlen(known) < bd)
      bd = (int)strlen(known), best = table[i].name;
  }
  if (best != NULL)
    return best;
  for (int i = 0; i < COUNT; i++) {
    int d = distance(rest, table[i].name + 4);
    if (d < bd)
      bd = d, best = table[i].name;
  }
  return bd <= (len < 6 ? 1 : len / 3) ? best : NULL;
}

/* hvd's equivalent of Horovod's variable `name`, or NULL when hvd has
 * none: the renamed ones, else HVD_ + the same rest when that is a
 * setting. Never a near name: HOROVOD_CPU_OPERATIONS is no typo of
 * HVD_GPU_OPERATIONS but another setting, which hvd lacks. */
static const char *horovod_equivalent(const char *name) {
  for (size_t j = 0; j < sizeof horovod_renamed / sizeof *horovod_renamed; j++)
    if (strcmp(name, horovod_renamed[j][0]) == 0)
      return horovod_renamed[j][1];
  for (int i = 0; i < COUNT; i++)
    if (strcmp(name + 8, table[i].name + 4) == 0)
      return table[i].name;
  return NULL;
}

/* The message for environment entry e ("NAME=value") if NAME is an HVD_
 * name hvd does not read or a HOROVOD_ one; 0 otherwise. */
static int unknown_message(const char *e, char *out, size_t n) {
  char name[128];
  size_t k = strcspn(e, "=");
  if (k >= sizeof name)
    return 0;
  memcpy(name, e, k);
  name[k] = '\0';
  int hvd = strncmp(name, "HVD_", 4) == 0;
  if (!hvd && strncmp(name, "HOROVOD_", 8) != 0)
    return 0;
  for (int i = 0; hvd && i < COUNT; i++)
    if (strcmp(name, table[i].name) == 0)
      return 0;
  for (size_t j = 0; hvd && j < sizeof not_settings / sizeof *not_settings;
       j++) {
    size_t l = strlen(not_settings[j]);
    if (not_settings[j][l - 1] == '_' ? strncmp(name, not_settings[j], l) == 0
                                      : strcmp(name, not_settings[j]) == 0)
      return 0;
  }
  if (!hvd) {
    const char *same = horovod_equivalent(name);
    if (same != NULL)
      snprintf(out, n, "%s is Horovod's and hvd does not read it: hvd's is %s",
               name, same);
    else
      snprintf(out, n,
               "%s is Horovod's and hvd has no such setting (hvd-info lists "
               "hvd's variables)",
               name);
    return 1;
  }
  const char *near = nearest(name + 4);
  if (near != NULL)
    snprintf(out, n, "%s is not an hvd variable: did you mean %s?", name, near);
  else
    snprintf(out, n,
             "%s is not an hvd variable and is ignored (hvd-info lists them)",
             name);
  return 1;
}

extern char **environ;

int hvd_setting_unknown(int k, char *message, size_t len) {
  char line[512];
  for (int i = 0, seen = 0; environ != NULL && environ[i] != NULL; i++)
    if (unknown_message(environ[i], line, sizeof line) && seen++ == k) {
      if (message != NULL && len > 0)
        snprintf(message, len, "%s", line);
      return 1;
    }
  return 0;
}

void hvd__settings_warn_unknown(void) {
  char line[512];
  for (int k = 0; hvd_setting_unknown(k, line, sizeof line); k++)
    HVD__LOG(HVD__LOG_WARNING, "%s", line);
}
