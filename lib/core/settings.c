/* settings.c - the table of HVD_* variables and their parsers. */
#include "core/settings.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/log.h"

static const hvd__setting_info_t table[] = {
    {"HVD_LOG_LEVEL", "warning",
     "logging threshold: trace, debug, info, warning or error"},
    {"HVD_CYCLE_TIME", "1",
     "milliseconds between negotiation cycles when idle (woken early by "
     "new work)"},
    {"HVD_HOSTNAME", "(unset)",
     "when set, ranks with equal values form one node (instead of shared "
     "memory); used to simulate several nodes on one machine"},
    {NULL, NULL, NULL},
};

const hvd__setting_info_t *hvd__settings_table(void) { return table; }

static hvd_result_t parse_double(const char *name, double min, double max,
                                 double *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0')
    return HVD_SUCCESS;
  char *end = NULL;
  errno = 0;
  double d = strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !isfinite(d))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is not a number", name,
                          v);
  if (d < min || d > max)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s='%s' is out of range %g..%g", name, v, min, max);
  *out = d;
  return HVD_SUCCESS;
}

hvd_result_t hvd__settings_load(hvd__settings_t *s) {
  hvd_result_t rc;
  memset(s, 0, sizeof *s);
  s->log_level = HVD__LOG_WARNING;
  s->cycle_time_ms = 1.0;

  const char *v = getenv("HVD_LOG_LEVEL");
  if (v != NULL && *v != '\0') {
    s->log_level = hvd__log_parse_level(v);
    if (s->log_level < 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "HVD_LOG_LEVEL='%s' is not one of trace, debug, "
                            "info, warning, error",
                            v);
  }
  HVD__CHECK(parse_double("HVD_CYCLE_TIME", 0.0, 10000.0, &s->cycle_time_ms));
  v = getenv("HVD_HOSTNAME");
  if (v != NULL && *v != '\0') {
    if (strlen(v) >= sizeof s->hostname)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "HVD_HOSTNAME is longer than %zu characters",
                            sizeof s->hostname - 1);
    snprintf(s->hostname, sizeof s->hostname, "%s", v);
  }
  return HVD_SUCCESS;
fail:
  return rc;
}

void hvd__settings_log(const hvd__settings_t *s) {
  HVD__LOG(HVD__LOG_INFO,
           "settings: HVD_LOG_LEVEL=%s HVD_CYCLE_TIME=%g HVD_HOSTNAME=%s",
           hvd__log_level_name(s->log_level), s->cycle_time_ms,
           s->hostname[0] ? s->hostname : "(unset)");
}
