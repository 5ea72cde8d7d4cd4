/*
 * json.h - the one JSON string escaper, for the timeline (lib/core) and
 * the tools' --json output (bin/): quotes and backslashes get a backslash,
 * control characters become \u00XX, valid UTF-8 passes as it is, and each
 * byte that does not begin a valid UTF-8 sequence becomes \ufffd (the
 * replacement character; the bytes after it are read afresh): an
 * overlong form, a surrogate (U+D800..DFFF), a code point past U+10FFFF,
 * a lone continuation byte, a sequence cut short. So the output is valid
 * JSON whatever bytes a name holds. Header-only, so that programs linked
 * to libhvd's public symbols alone use the same code.
 */
#ifndef HVD_BASE_JSON_H
#define HVD_BASE_JSON_H

#include <stddef.h>
#include <stdio.h>

/* Where escaped text goes: n bytes at p. */
typedef void (*hvd__json_put_fn)(void *ctx, const char *p, size_t n);

/* The length (2 to 4) of the valid UTF-8 sequence that begins at s, whose
 * first byte is 0x80 or more; 0 when it is not valid (RFC 3629's table:
 * the second byte's range rules out overlongs, surrogates and code points
 * past U+10FFFF; the '\0' that ends s is no continuation byte). */
static inline int hvd__utf8_len(const unsigned char *s) {
  unsigned char lo = 0x80, hi = 0xbf;
  int n;
  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    n = 2;
  else if (s[0] >= 0xe0 && s[0] <= 0xef)
    n = 3;
  else if (s[0] >= 0xf0 && s[0] <= 0xf4)
    n = 4;
  else
    return 0;
  if (s[0] == 0xe0)
    lo = 0xa0; /* overlong below U+0800 */
  else if (s[0] == 0xed)
    hi = 0x9f; /* surrogates */
  else if (s[0] == 0xf0)
    lo = 0x90; /* overlong below U+10000 */
  else if (s[0] == 0xf4)
    hi = 0x8f; /* past U+10FFFF */
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (int i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xbf)
      return 0;
  return n;
}

/* The body of a JSON string for s (without the quotes), through put. */
static inline void hvd__json_escape(const char *s, hvd__json_put_fn put,
                                    void *ctx) {
  const char *run = s; /* bytes that pass as they are, not yet put */
  while (*s != '\0') {
    unsigned char c = (unsigned char)*s;
    int len = c < 0x80 ? 1 : hvd__utf8_len((const unsigned char *)s);
    if (len > 0 && c != '"' && c != '\\' && c >= 0x20) {
      s += len;
      continue;
    }
    char e[8];
    int n = len == 0   ? snprintf(e, sizeof e, "\\ufffd")
            : c < 0x20 ? snprintf(e, sizeof e, "\\u%04x", c)
                       : snprintf(e, sizeof e, "\\%c", c);
    if (s > run)
      put(ctx, run, (size_t)(s - run));
    put(ctx, e, (size_t)n);
    run = ++s;
  }
  if (s > run)
    put(ctx, run, (size_t)(s - run));
}

/* hvd__json_put_fn for a FILE * (ctx). */
static inline void hvd__json_put_file(void *ctx, const char *p, size_t n) {
  fwrite(p, 1, n, (FILE *)ctx);
}

#endif /* HVD_BASE_JSON_H */
