/* log.c - one line per call, written with one write(2) so ranks and
 * threads do not interleave within a line. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>

int hvd__log_threshold = HVD__LOG_WARNING;
static int log_rank = -1;

static const char *const level_names[] = {"trace", "debug", "info", "warning",
                                          "error"};

int hvd__log_parse_level(const char *s) {
  for (int i = 0; i < (int)(sizeof level_names / sizeof *level_names); i++)
    if (strcasecmp(s, level_names[i]) == 0)
      return i;
  if (strcasecmp(s, "warn") == 0)
    return HVD__LOG_WARNING;
  return -1;
}

const char *hvd__log_level_name(int level) {
  if (level < 0 || level > HVD__LOG_ERROR)
    return "unknown";
  return level_names[level];
}

void hvd__log_set_rank(int rank) { log_rank = rank; }

void hvd__log_write(int level, const char *fmt, ...) {
  char line[2048];
  int n;
  if (log_rank >= 0)
    n = snprintf(line, sizeof line, "[hvd %d] %s: ", log_rank,
                 hvd__log_level_name(level));
  else
    n = snprintf(line, sizeof line, "[hvd] %s: ", hvd__log_level_name(level));
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t HVD__UNUSED w = write(STDERR_FILENO, line, (size_t)n);
}
