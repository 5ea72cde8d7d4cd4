/*
 * json.h - the one JSON string escaper, for the timeline (lib/core) and
 * the tools' --json output (bin/): quotes and backslashes get a backslash,
 * control characters become \u00XX, everything else (UTF-8 included)
 * passes as it is. Header-only, so that programs linked to libhvd's
 * public symbols alone use the same code.
 */
#ifndef HVD_BASE_JSON_H
#define HVD_BASE_JSON_H

#include <stddef.h>
#include <stdio.h>

/* Where escaped text goes: n bytes at p. */
typedef void (*hvd__json_put_fn)(void *ctx, const char *p, size_t n);

/* The body of a JSON string for s (without the quotes), through put. */
static inline void hvd__json_escape(const char *s, hvd__json_put_fn put,
                                    void *ctx) {
  const char *run = s; /* bytes that pass as they are, not yet put */
  for (; *s != '\0'; s++) {
    unsigned char c = (unsigned char)*s;
    if (c != '"' && c != '\\' && c >= 0x20)
      continue;
    char e[8];
    int n = c < 0x20 ? snprintf(e, sizeof e, "\\u%04x", c)
                     : snprintf(e, sizeof e, "\\%c", c);
    if (s > run)
      put(ctx, run, (size_t)(s - run));
    put(ctx, e, (size_t)n);
    run = s + 1;
  }
  if (s > run)
    put(ctx, run, (size_t)(s - run));
}

/* hvd__json_put_fn for a FILE * (ctx). */
static inline void hvd__json_put_file(void *ctx, const char *p, size_t n) {
  fwrite(p, 1, n, (FILE *)ctx);
}

#endif /* HVD_BASE_JSON_H */
