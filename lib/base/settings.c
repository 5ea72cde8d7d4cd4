/*
 * settings.c - the HVD_* variables of settings.h's HVD__SETTINGS list:
 * the table behind hvd_setting_info, the parsers of each kind, the
 * loader and the info log line, all generated from the list.
 */
#include "base/settings.h"

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

static hvd_result_t parse_double(const char *name, const char *v, double min,
                                 double max, double *out) {
  char *end = NULL;
  errno = 0;
  double d = strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !isfinite(d))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is not a number", name,
                          v);
  if (d < min || d > max)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is out of range %g..%g",
                          name, v, min, max);
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
  default:
    HVD__CHECK(parse_double(t->name, v, t->lo, t->hi, &d));
  }
  if (t->kind == K_INT64)
    *(int64_t *)(void *)field = (int64_t)d;
  else if (t->kind == K_INT)
    *(int *)(void *)field = (int)d;
  else /* K_BOOL */
    *(int *)(void *)field = d != 0;
fail:
  return rc;
}

hvd_result_t hvd__settings_load(hvd__settings_t *s) {
  hvd_result_t rc;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < COUNT; i++)
    set_default(&table[i], (char *)s + table[i].offset);
  for (int i = 0; i < COUNT; i++) {
    const char *v = getenv(table[i].name);
    if (v != NULL && *v != '\0')
      HVD__CHECK(parse(&table[i], v, (char *)s + table[i].offset));
  }
  return HVD_SUCCESS;
fail:
  return rc;
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
