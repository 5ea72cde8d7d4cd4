/*
 * message.c - the negotiation's wire codec (message.h).
 */
#include "core/message.h"

#include <stdlib.h>
#include <string.h>

#include "base/errors.h"

static void put_desc(hvd__wbuf_t *w, const hvd__desc_t *d) {
  hvd__w_i32(w, d->coll);
  hvd__w_i32(w, d->dtype);
  hvd__w_i32(w, d->device);
  hvd__w_i32(w, d->ndim);
  for (int i = 0; i < d->ndim; i++)
    hvd__w_i64(w, d->shape[i]);
  hvd__w_i32(w, d->op);
  hvd__w_f64(w, d->prescale);
  hvd__w_f64(w, d->postscale);
  hvd__w_i32(w, d->root);
  hvd__w_i32(w, d->wire);
  hvd__w_i32(w, d->group_n);
  hvd__w_i32(w, d->group_i);
  hvd__w_i64(w, (int64_t)d->group_id);
}

/* v if 0 <= v < count, else 0 with the read failed: an enum from a peer
 * is checked once, here. */
static int in_range(hvd__rbuf_t *r, int32_t v, int count) {
  if (v >= 0 && v < count)
    return v;
  r->failed = 1;
  return 0;
}

static void get_desc(hvd__rbuf_t *r, hvd__desc_t *d) {
  memset(d, 0, sizeof *d);
  d->coll = (hvd__coll_t)in_range(r, hvd__r_i32(r), HVD__COLL_COUNT);
  d->dtype = (hvd_dtype_t)in_range(r, hvd__r_i32(r), HVD_DTYPE_COUNT);
  d->device = hvd__r_i32(r);
  d->ndim = hvd__r_i32(r);
  if (d->ndim < 0 || d->ndim > HVD_MAX_DIMS) {
    r->failed = 1;
    return;
  }
  for (int i = 0; i < d->ndim; i++)
    d->shape[i] = hvd__r_i64(r);
  d->op = (hvd_op_t)in_range(r, hvd__r_i32(r), HVD_OP_COUNT);
  d->prescale = hvd__r_f64(r);
  d->postscale = hvd__r_f64(r);
  d->root = hvd__r_i32(r);
  d->wire = (hvd_dtype_t)in_range(r, hvd__r_i32(r), HVD_DTYPE_COUNT);
  d->group_n = hvd__r_i32(r);
  d->group_i = hvd__r_i32(r);
  d->group_id = (uint64_t)hvd__r_i64(r);
  /* a member's index within its group's size (arrays are sized by it) */
  if (d->group_n < 0 || d->group_n > HVD__GROUP_MAX ||
      (d->group_n == 0 ? d->group_i != 0
                       : d->group_i < 0 || d->group_i >= d->group_n))
    r->failed = 1;
}

/* The fewest bytes one response takes: kind, a descriptor of no
 * dimension (coll, dtype, device, ndim, op, prescale, postscale, root,
 * wire, group_n, group_i, group_id), nnames, the dims0 and ready flags,
 * njoined, err, errmsg's length and arg. A list's count is at most its
 * bytes over this. */
#define MIN_RESPONSE_BYTES (4 + (4 * 4 + 4 + 8 + 8 + 4 * 4 + 8) + 4 * 7)

void hvd__msg_put_response(hvd__wbuf_t *w, const hvd__response_t *x, int size) {
  hvd__w_i32(w, x->kind);
  put_desc(w, &x->desc);
  hvd__w_i32(w, x->nnames);
  for (int i = 0; i < x->nnames; i++)
    hvd__w_str(w, x->names[i]);
  hvd__w_i32(w, x->dims0 != NULL);
  if (x->dims0 != NULL)
    hvd__w_bytes(w, x->dims0, (size_t)size * sizeof *x->dims0);
  hvd__w_i32(w, x->ready != NULL);
  if (x->ready != NULL)
    hvd__w_bytes(w, x->ready, (size_t)size * sizeof *x->ready);
  hvd__w_i32(w, x->njoined);
  hvd__w_i32(w, x->err);
  hvd__w_str(w, x->errmsg ? x->errmsg : "");
  hvd__w_i32(w, x->arg);
}

/* 0; -1 when malformed; -2 when out of memory. */
static int get_response(hvd__rbuf_t *r, hvd__response_t *x, int size) {
  memset(x, 0, sizeof *x);
  x->kind = in_range(r, hvd__r_i32(r), HVD__RESP_KIND_COUNT);
  get_desc(r, &x->desc);
  x->nnames = hvd__r_i32(r);
  /* each name takes at least its length's 4 bytes */
  if (r->failed || x->nnames < 0 || (size_t)x->nnames > (r->len - r->pos) / 4)
    return -1;
  x->names = calloc((size_t)x->nnames + 1, sizeof *x->names);
  if (x->names == NULL)
    return -2;
  for (int i = 0; i < x->nnames; i++)
    if ((x->names[i] = hvd__r_str(r)) == NULL)
      return -2;
  if (hvd__r_i32(r)) {
    x->dims0 = malloc((size_t)size * sizeof *x->dims0);
    if (x->dims0 == NULL)
      return -2;
    for (int i = 0; i < size; i++)
      x->dims0[i] = hvd__r_i64(r);
  }
  if (hvd__r_i32(r)) {
    x->ready = malloc((size_t)size * sizeof *x->ready);
    if (x->ready == NULL)
      return -2;
    for (int i = 0; i < size; i++)
      x->ready[i] = hvd__r_f64(r);
  }
  x->njoined = hvd__r_i32(r);
  x->err = hvd__r_i32(r);
  x->errmsg = hvd__r_str(r);
  x->arg = hvd__r_i32(r);
  if (x->errmsg == NULL)
    return -2;
  return r->failed ? -1 : 0;
}

void hvd__response_clear(hvd__response_t *x) {
  for (int j = 0; j < x->nnames && x->names && !x->borrowed; j++)
    free(x->names[j]);
  if (!x->borrowed)
    free(x->names);
  free(x->dims0);
  free(x->ready);
  free(x->errmsg);
}

void hvd__responses_free(hvd__response_t *r, int n) {
  if (r == NULL)
    return;
  for (int i = 0; i < n; i++)
    hvd__response_clear(&r[i]);
  free(r);
}

void hvd__msg_put_request(hvd__wbuf_t *w, const hvd_request_t *r) {
  hvd__w_str(w, r->name);
  put_desc(w, &r->desc);
  hvd__w_f64(w, r->t_ready);
}

int hvd__msg_get_request(hvd__rbuf_t *rb, char **name, hvd__desc_t *d,
                         double *ready) {
  *name = hvd__r_str(rb);
  get_desc(rb, d);
  *ready = hvd__r_f64(rb);
  if (*name != NULL && !rb->failed)
    return 0;
  free(*name);
  *name = NULL;
  return -1;
}

hvd_result_t hvd__msg_get_responses(const char *buf, size_t len, int size,
                                    hvd__response_t **out, int *n) {
  hvd__rbuf_t rb;
  hvd__r_init(&rb, buf, len);
  int count = hvd__r_i32(&rb);
  if (rb.failed || count < 0 ||
      (size_t)count > (rb.len - rb.pos) / MIN_RESPONSE_BYTES)
    return hvd__set_error(HVD_ERR_INTERNAL, "malformed response list");
  hvd__response_t *list = calloc((size_t)(count > 0 ? count : 1), sizeof *list);
  if (list == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "response list");
  for (int i = 0; i < count; i++) {
    int got = get_response(&rb, &list[i], size);
    if (got != 0) {
      hvd__responses_free(list, i + 1);
      return got == -1
                 ? hvd__set_error(HVD_ERR_INTERNAL, "malformed response list")
                 : hvd__set_error(HVD_ERR_NO_MEMORY, "response list");
    }
  }
  *out = list;
  *n = count;
  return HVD_SUCCESS;
}
