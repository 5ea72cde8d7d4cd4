/*
 * log.h - the one logger. Lines go to stderr as "[hvd <rank>] LEVEL: ...";
 * HVD_LOG_LEVEL picks the threshold. The library prints nothing else.
 */
#ifndef HVD_BASE_LOG_H
#define HVD_BASE_LOG_H

#include "internal.h"

enum hvd__log_level {
  HVD__LOG_TRACE,
  HVD__LOG_DEBUG,
  HVD__LOG_INFO,
  HVD__LOG_WARNING,
  HVD__LOG_ERROR
};

extern int hvd__log_threshold;

/* Parses "trace".."error" (case-insensitive); -1 if unknown. */
int hvd__log_parse_level(const char *s);
const char *hvd__log_level_name(int level);
void hvd__log_set_rank(int rank);
void hvd__log_write(int level, const char *fmt, ...) HVD__PRINTF(2, 3);

#define HVD__LOG(level, ...)                                                   \
  do {                                                                         \
    if ((level) >= hvd__log_threshold)                                         \
      hvd__log_write((level), __VA_ARGS__);                                    \
  } while (0)

#endif /* HVD_BASE_LOG_H */
