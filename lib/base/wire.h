/*
 * wire.h - the byte format of negotiation messages: little helpers that
 * append fixed-size values and strings to a growable buffer, and read
 * them back with bounds checks. Both ends are the same build, so values
 * travel in host byte order.
 */
#ifndef HVD_BASE_WIRE_H
#define HVD_BASE_WIRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct hvd__wbuf {
  char *data;
  size_t len, cap;
  int failed; /* out of memory at some point */
} hvd__wbuf_t;

typedef struct hvd__rbuf {
  const char *data;
  size_t len, pos;
  int failed; /* read past the end or a malformed string */
} hvd__rbuf_t;

void hvd__w_reset(hvd__wbuf_t *w); /* keeps the allocation */
void hvd__w_free(hvd__wbuf_t *w);
void hvd__w_bytes(hvd__wbuf_t *w, const void *p, size_t n);
void hvd__w_i32(hvd__wbuf_t *w, int32_t v);
void hvd__w_i64(hvd__wbuf_t *w, int64_t v);
void hvd__w_f64(hvd__wbuf_t *w, double v);
void hvd__w_str(hvd__wbuf_t *w, const char *s); /* length + bytes */

void hvd__r_init(hvd__rbuf_t *r, const void *data, size_t len);
int32_t hvd__r_i32(hvd__rbuf_t *r);
int64_t hvd__r_i64(hvd__rbuf_t *r);
double hvd__r_f64(hvd__rbuf_t *r);
/* A malloc'd copy of the next string ("" on failure; never NULL unless
 * out of memory). */
char *hvd__r_str(hvd__rbuf_t *r);

#endif /* HVD_BASE_WIRE_H */
