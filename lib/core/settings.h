/*
 * settings.h - every HVD_* environment variable, read in one place
 * (settings.c holds the table: name, default, meaning).
 */
#ifndef HVD_CORE_SETTINGS_H
#define HVD_CORE_SETTINGS_H

#include "internal.h"

#define HVD__HOSTNAME_MAX 256

typedef struct hvd__settings {
  int log_level;                      /* HVD_LOG_LEVEL */
  double cycle_time_ms;               /* HVD_CYCLE_TIME */
  char hostname[HVD__HOSTNAME_MAX];   /* HVD_HOSTNAME; "" when unset */
} hvd__settings_t;

/* One row of the table, for hvd-info and the README. */
typedef struct hvd__setting_info {
  const char *name;
  const char *default_value;
  const char *meaning;
} hvd__setting_info_t;

/* Reads every variable; a malformed value is HVD_ERR_INVALID_ARG with a
 * message naming the variable and the value. */
hvd_result_t hvd__settings_load(hvd__settings_t *s);

/* Logs the effective settings at info level. */
void hvd__settings_log(const hvd__settings_t *s);

/* The table, terminated by a row with a NULL name. */
const hvd__setting_info_t *hvd__settings_table(void);

#endif /* HVD_CORE_SETTINGS_H */
