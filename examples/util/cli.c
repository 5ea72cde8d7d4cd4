/*
 * cli.c - the command line of hvd's programs: messages, usage errors and
 * option numbers (cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_t *style;

void cli_init(const cli_t *c) { style = c; }

int cli_launcher_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                      "PMI_RANK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v != NULL && *v != '\0')
      return atoi(v);
  }
  return 0;
}

/* "PROG: " fmt suffix "\n" on stderr, in one write (stderr is unbuffered:
 * three calls came out as "PROG: PROG: ..." between ranks). */
static void put_line(const char *fmt, va_list ap, const char *suffix) {
  char line[4096];
  size_t room = sizeof line - 1; /* the newline's place */
  int k = snprintf(line, room, "%s: ", style->prog);
  vsnprintf(line + k, room - (size_t)k, fmt, ap);
  size_t len = strlen(line);
  if (suffix != NULL)
    len += (size_t)snprintf(line + len, room - len, "%s", suffix);
  if (len > room - 1)
    len = room - 1;
  line[len] = '\n';
  fwrite(line, 1, len + 1, stderr);
}

void cli_say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  put_line(fmt, ap, NULL);
  va_end(ap);
}

void cli_usage_error(const char *fmt, ...) {
  if (cli_launcher_rank() == 0) {
    va_list ap;
    va_start(ap, fmt);
    put_line(fmt, ap, style->hint);
    va_end(ap);
  }
  exit(2);
}

const char *cli_name(const char *opt, const char *s, const char *what) {
  if (*s == '\0')
    cli_usage_error("%s needs %s", opt, what);
  return s;
}

int64_t cli_int(const char *opt, const char *s, int64_t lo, int64_t hi) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
    cli_usage_error(style->int_fmt != NULL
                        ? style->int_fmt
                        : "%s needs an integer from %lld to %lld, not '%s'",
                    opt, (long long)lo, (long long)hi, s);
  return v;
}

double cli_real(const char *opt, const char *s, double lo, double hi) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < lo ||
      v > hi)
    cli_usage_error(style->real_fmt != NULL
                        ? style->real_fmt
                        : "%s needs a number from %g to %g, not '%s'",
                    opt, lo, hi, s);
  return v;
}
