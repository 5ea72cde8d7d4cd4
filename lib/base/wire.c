/* wire.c - append/read helpers for negotiation messages. */
#include "base/wire.h"

#include <stdlib.h>
#include <string.h>

void hvd__w_reset(hvd__wbuf_t *w) {
  w->len = 0;
  w->failed = 0;
}

void hvd__w_free(hvd__wbuf_t *w) {
  free(w->data);
  memset(w, 0, sizeof *w);
}

void hvd__w_bytes(hvd__wbuf_t *w, const void *p, size_t n) {
  if (w->failed)
    return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n)
      cap *= 2;
    char *data = realloc(w->data, cap);
    if (data == NULL) {
      w->failed = 1;
      return;
    }
    w->data = data;
    w->cap = cap;
  }
  memcpy(w->data + w->len, p, n);
  w->len += n;
}

void hvd__w_i32(hvd__wbuf_t *w, int32_t v) { hvd__w_bytes(w, &v, sizeof v); }
void hvd__w_i64(hvd__wbuf_t *w, int64_t v) { hvd__w_bytes(w, &v, sizeof v); }
void hvd__w_f64(hvd__wbuf_t *w, double v) { hvd__w_bytes(w, &v, sizeof v); }

void hvd__w_str(hvd__wbuf_t *w, const char *s) {
  size_t n = strlen(s);
  hvd__w_i32(w, (int32_t)n);
  hvd__w_bytes(w, s, n);
}

void hvd__r_init(hvd__rbuf_t *r, const void *data, size_t len) {
  r->data = data;
  r->len = len;
  r->pos = 0;
  r->failed = 0;
}

static int take(hvd__rbuf_t *r, void *out, size_t n) {
  if (r->failed || r->len - r->pos < n) {
    r->failed = 1;
    memset(out, 0, n);
    return -1;
  }
  memcpy(out, r->data + r->pos, n);
  r->pos += n;
  return 0;
}

int32_t hvd__r_i32(hvd__rbuf_t *r) {
  int32_t v;
  take(r, &v, sizeof v);
  return v;
}

int64_t hvd__r_i64(hvd__rbuf_t *r) {
  int64_t v;
  take(r, &v, sizeof v);
  return v;
}

double hvd__r_f64(hvd__rbuf_t *r) {
  double v;
  take(r, &v, sizeof v);
  return v;
}

char *hvd__r_str(hvd__rbuf_t *r) {
  int32_t n = hvd__r_i32(r);
  if (r->failed || n < 0 || r->len - r->pos < (size_t)n) {
    r->failed = 1;
    return calloc(1, 1);
  }
  char *s = malloc((size_t)n + 1);
  if (s == NULL) {
    r->failed = 1;
    return NULL;
  }
  memcpy(s, r->data + r->pos, (size_t)n);
  s[n] = '\0';
  r->pos += (size_t)n;
  return s;
}
