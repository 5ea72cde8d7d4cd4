/*
 * controller.c - negotiation rounds and the coordinator's bookkeeping.
 *
 * A round is two collectives when nobody has anything to say:
 *   1. allgather of a 16-byte header per rank (payload length, shutdown);
 *   2. broadcast of the coordinator's response list length (0 when idle);
 * and two more when someone does: a gatherv of the payloads to rank 0 and
 * a broadcast of the encoded response list. Every rank decodes the same
 * response bytes, so all execute the same list in the same order.
 */
#include "core/controller.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/table.h"
#include "base/tensor.h"
#include "base/wire.h"
#include "base/wait.h"

/* The coordinator's record of one name some ranks have submitted. */
typedef struct pending {
  char *name;
  hvd__desc_t *desc;   /* per rank */
  double *ready;       /* per rank: submission time, aligned clock */
  unsigned char *have; /* per rank */
  int count;
  double first_seen;
  int warned;
  struct pending *prev, *next; /* in order of first submission */
} pending_t;

struct hvd__controller {
  MPI_Comm comm;
  int rank, size;
  hvd__wbuf_t out;  /* this rank's payload */
  hvd__wbuf_t resp; /* coordinator: encoded responses */
  int64_t *headers; /* 2 per rank */
  int *counts, *displs;
  char *inbox; /* coordinator: gathered payloads; others: responses */
  size_t inbox_cap;
  /* coordinator state */
  hvd__table_t *table;
  pending_t *head, *tail;
  unsigned char *joined;
  int njoined, last_joined;
  /* stall inspector */
  double stall_check, stall_shutdown, next_check;
  int npending;
  int timeline;
};

hvd__controller_t *hvd__controller_create(MPI_Comm comm, int rank, int size,
                                          const hvd__settings_t *s,
                                          int timeline) {
  hvd__controller_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->timeline = timeline;
  c->stall_check = s->stall_check_s;
  c->stall_shutdown = s->stall_shutdown_s;
  c->comm = comm;
  c->rank = rank;
  c->size = size;
  c->headers = calloc(2 * (size_t)size, sizeof *c->headers);
  c->counts = calloc((size_t)size, sizeof *c->counts);
  c->displs = calloc((size_t)size, sizeof *c->displs);
  c->joined = calloc((size_t)size, 1);
  c->table = hvd__table_create();
  c->last_joined = -1;
  if (!c->headers || !c->counts || !c->displs || !c->joined || !c->table) {
    hvd__controller_destroy(c);
    return NULL;
  }
  return c;
}

static void pending_free(pending_t *p) {
  if (p == NULL)
    return;
  free(p->name);
  free(p->desc);
  free(p->ready);
  free(p->have);
  free(p);
}

void hvd__controller_destroy(hvd__controller_t *c) {
  if (c == NULL)
    return;
  for (pending_t *p = c->head, *next; p != NULL; p = next) {
    next = p->next;
    pending_free(p);
  }
  hvd__table_destroy(c->table);
  hvd__w_free(&c->out);
  hvd__w_free(&c->resp);
  free(c->headers);
  free(c->counts);
  free(c->displs);
  free(c->joined);
  free(c->inbox);
  free(c);
}

/* ---- encoding ----------------------------------------------------------- */

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
}

static void get_desc(hvd__rbuf_t *r, hvd__desc_t *d) {
  memset(d, 0, sizeof *d);
  d->coll = hvd__r_i32(r);
  d->dtype = hvd__r_i32(r);
  d->device = hvd__r_i32(r);
  d->ndim = hvd__r_i32(r);
  if (d->ndim < 0 || d->ndim > HVD_MAX_DIMS) {
    r->failed = 1;
    return;
  }
  for (int i = 0; i < d->ndim; i++)
    d->shape[i] = hvd__r_i64(r);
  d->op = hvd__r_i32(r);
  d->prescale = hvd__r_f64(r);
  d->postscale = hvd__r_f64(r);
  d->root = hvd__r_i32(r);
  d->wire = hvd__r_i32(r);
}

static void put_response(hvd__wbuf_t *w, const hvd__response_t *x, int size) {
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

static int get_response(hvd__rbuf_t *r, hvd__response_t *x, int size) {
  memset(x, 0, sizeof *x);
  x->kind = hvd__r_i32(r);
  get_desc(r, &x->desc);
  x->nnames = hvd__r_i32(r);
  if (r->failed || x->nnames < 0 || (size_t)x->nnames > r->len)
    return -1;
  x->names = calloc((size_t)x->nnames + 1, sizeof *x->names);
  if (x->names == NULL)
    return -1;
  for (int i = 0; i < x->nnames; i++)
    if ((x->names[i] = hvd__r_str(r)) == NULL)
      return -1;
  if (hvd__r_i32(r)) {
    x->dims0 = malloc((size_t)size * sizeof *x->dims0);
    if (x->dims0 == NULL)
      return -1;
    for (int i = 0; i < size; i++)
      x->dims0[i] = hvd__r_i64(r);
  }
  if (hvd__r_i32(r)) {
    x->ready = malloc((size_t)size * sizeof *x->ready);
    if (x->ready == NULL)
      return -1;
    for (int i = 0; i < size; i++)
      x->ready[i] = hvd__r_f64(r);
  }
  x->njoined = hvd__r_i32(r);
  x->err = hvd__r_i32(r);
  x->errmsg = hvd__r_str(r);
  x->arg = hvd__r_i32(r);
  return r->failed || x->errmsg == NULL ? -1 : 0;
}

static void response_clear(hvd__response_t *x) {
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
    response_clear(&r[i]);
  free(r);
}

/* ---- the coordinator ---------------------------------------------------- */

/* The fields ranks must agree on, in the order they are checked. */
enum field { F_COLL, F_DTYPE, F_DEVICE, F_OP, F_PRESCALE, F_POSTSCALE,
             F_ROOT, F_SHAPE, F_WIRE, F_COUNT };
static const char *const field_names[F_COUNT] = {
    "collective", "dtype", "device", "op", "prescale", "postscale", "root",
    "shape", "wire dtype"};

static int field_applies(int field, int coll) {
  int reduces = coll == HVD__ALLREDUCE || coll == HVD__REDUCESCATTER;
  switch (field) {
  case F_COLL:
    return 1;
  case F_DTYPE:
  case F_DEVICE:
  case F_SHAPE:
    return coll != HVD__BARRIER && coll != HVD__JOIN;
  case F_OP:
  case F_PRESCALE:
  case F_POSTSCALE:
    return reduces;
  case F_WIRE:
    return coll == HVD__ALLREDUCE;
  case F_ROOT:
    return coll == HVD__BROADCAST;
  }
  return 0;
}

static int field_equal(int field, const hvd__desc_t *a, const hvd__desc_t *b) {
  switch (field) {
  case F_COLL:
    return a->coll == b->coll;
  case F_DTYPE:
    return a->dtype == b->dtype;
  case F_DEVICE: /* host or device; each rank's GPU has its own ordinal */
    return hvd__device_kind_equal(a->device, b->device);
  case F_OP:
    return a->op == b->op;
  case F_PRESCALE:
    return a->prescale == b->prescale;
  case F_POSTSCALE:
    return a->postscale == b->postscale;
  case F_ROOT:
    return a->root == b->root;
  case F_WIRE:
    return a->wire == b->wire;
  case F_SHAPE: {
    /* allgather and alltoall may differ in the first dimension */
    int from = (a->coll == HVD__ALLGATHER || a->coll == HVD__ALLTOALL) ? 1 : 0;
    if (a->ndim != b->ndim)
      return 0;
    for (int i = from; i < a->ndim; i++)
      if (a->shape[i] != b->shape[i])
        return 0;
    return 1;
  }
  }
  return 1;
}

static void field_str(int field, const hvd__desc_t *d, char *buf, size_t n) {
  switch (field) {
  case F_COLL:
    snprintf(buf, n, "%s", hvd__coll_name(d->coll));
    break;
  case F_DTYPE:
    snprintf(buf, n, "%s", hvd_dtype_name((hvd_dtype_t)d->dtype));
    break;
  case F_DEVICE:
    hvd__device_str(d->device, buf, n);
    break;
  case F_OP:
    snprintf(buf, n, "%s", hvd_op_name((hvd_op_t)d->op));
    break;
  case F_PRESCALE:
    snprintf(buf, n, "%g", d->prescale);
    break;
  case F_POSTSCALE:
    snprintf(buf, n, "%g", d->postscale);
    break;
  case F_ROOT:
    snprintf(buf, n, "%d", d->root);
    break;
  case F_WIRE:
    snprintf(buf, n, "%s", hvd_dtype_name((hvd_dtype_t)d->wire));
    break;
  case F_SHAPE:
    hvd__shape_str(d->ndim, d->shape, buf, n);
    break;
  }
}

/* "<kind> '<name>'" or just "<kind>" for barrier and join. */
static void label(const pending_t *p, int coll, char *buf, size_t n) {
  if (coll == HVD__BARRIER || coll == HVD__JOIN)
    snprintf(buf, n, "%s", hvd__coll_name(coll));
  else
    snprintf(buf, n, "%s '%s'", hvd__coll_name(coll), p->name);
}

#define MAX_LISTED 8

/* Fills x with an error response if the ranks disagree; returns 1 then. */
static int check_agreement(const hvd__controller_t *c, const pending_t *p,
                           int ref, hvd__response_t *x) {
  const hvd__desc_t *d0 = &p->desc[ref];
  char lab[300], v0[HVD__SHAPE_STR_MAX], v[HVD__SHAPE_STR_MAX];
  char msg[HVD__ERRMSG_MAX];
  label(p, d0->coll, lab, sizeof lab);
  for (int f = 0; f < F_COUNT; f++) {
    if (!field_applies(f, d0->coll))
      continue;
    size_t at = 0;
    int listed = 0, more = 0;
    for (int r = 0; r < c->size; r++) {
      if (!p->have[r] || r == ref || field_equal(f, d0, &p->desc[r]))
        continue;
      if (listed == MAX_LISTED) {
        more++;
        continue;
      }
      if (listed == 0) {
        field_str(f, d0, v0, sizeof v0);
        at = (size_t)snprintf(msg, sizeof msg, "%s: rank %d %s %s vs", lab,
                              ref, field_names[f], v0);
      }
      field_str(f, &p->desc[r], v, sizeof v);
      if (at < sizeof msg)
        at += (size_t)snprintf(msg + at, sizeof msg - at, "%s rank %d %s %s",
                               listed ? "," : "", r, field_names[f], v);
      listed++;
    }
    if (listed == 0)
      continue;
    if (more && at < sizeof msg)
      snprintf(msg + at, sizeof msg - at, ", and %d more ranks", more);
    x->kind = HVD__RESP_ERROR;
    x->err = HVD_ERR_MISMATCH;
    x->errmsg = strdup(msg);
    return 1;
  }
  return 0;
}

/* Builds the response for a name every rank has (or has joined past). */
static int make_response(hvd__controller_t *c, pending_t *p,
                         hvd__response_t *x) {
  int ref = 0;
  while (!p->have[ref])
    ref++;
  memset(x, 0, sizeof *x);
  x->desc = p->desc[ref];
  x->nnames = 1;
  x->names = calloc(1, sizeof *x->names);
  if (x->names == NULL || (x->names[0] = strdup(p->name)) == NULL)
    return -1;
  if (check_agreement(c, p, ref, x))
    return x->errmsg ? 0 : -1;
  for (int r = 0; r < c->size; r++) {
    if (p->have[r])
      continue;
    x->njoined++;
    if (x->desc.coll != HVD__ALLREDUCE && x->kind != HVD__RESP_ERROR) {
      char lab[300], msg[HVD__ERRMSG_MAX];
      label(p, x->desc.coll, lab, sizeof lab);
      snprintf(msg, sizeof msg,
               "%s: rank %d has joined; only allreduce can run until every "
               "rank joins",
               lab, r);
      x->kind = HVD__RESP_ERROR;
      x->err = HVD_ERR_MISMATCH;
      x->errmsg = strdup(msg);
      return x->errmsg ? 0 : -1;
    }
  }
  x->kind = HVD__RESP_RUN;
  if (c->timeline) {
    x->ready = malloc((size_t)c->size * sizeof *x->ready);
    if (x->ready == NULL)
      return -1;
    memcpy(x->ready, p->ready, (size_t)c->size * sizeof *x->ready);
  }
  if (x->desc.coll == HVD__ALLGATHER) {
    x->dims0 = calloc((size_t)c->size, sizeof *x->dims0);
    if (x->dims0 == NULL)
      return -1;
    for (int r = 0; r < c->size; r++)
      x->dims0[r] = p->desc[r].shape[0];
  }
  return 0;
}

static pending_t *pending_get(hvd__controller_t *c, const char *name) {
  pending_t *p = hvd__table_get(c->table, name);
  if (p != NULL)
    return p;
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->name = strdup(name);
  p->desc = calloc((size_t)c->size, sizeof *p->desc);
  p->ready = calloc((size_t)c->size, sizeof *p->ready);
  p->have = calloc((size_t)c->size, 1);
  if (!p->name || !p->desc || !p->ready || !p->have ||
      hvd__table_put(c->table, name, p) != 0) {
    pending_free(p);
    return NULL;
  }
  p->first_seen = hvd__now();
  c->npending++;
  p->prev = c->tail;
  if (c->tail)
    c->tail->next = p;
  else
    c->head = p;
  c->tail = p;
  return p;
}

static void pending_remove(hvd__controller_t *c, pending_t *p) {
  c->npending--;
  hvd__table_remove(c->table, p->name);
  if (p->prev)
    p->prev->next = p->next;
  else
    c->head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  else
    c->tail = p->prev;
  pending_free(p);
}

/* "1, 3" for the ranks r with want == (have[r] || joined[r]). */
static void rank_list(const hvd__controller_t *c, const pending_t *p, int want,
                      char *buf, size_t n) {
  size_t at = 0;
  buf[0] = '\0';
  for (int r = 0; r < c->size && at < n; r++)
    if ((p->have[r] || c->joined[r]) == want)
      at += (size_t)snprintf(buf + at, n - at, "%s%d", at ? ", " : "", r);
}

int hvd__controller_busy(hvd__controller_t *c) {
  return c->rank == 0 && c->npending > 0 &&
         (c->stall_check > 0 || c->stall_shutdown > 0) &&
         hvd__now() >= c->next_check;
}

/* The stall inspector (rank 0): logs the ranks a collective has waited for
 * longer than HVD_STALL_CHECK_TIME; past HVD_STALL_SHUTDOWN_TIME it writes
 * one STALL response, on which every rank stops. Returns responses written. */
static int inspect_stalls(hvd__controller_t *c) {
  double now = hvd__now();
  c->next_check = now + 0.1;
  for (pending_t *p = c->head; p != NULL; p = p->next) {
    double age = now - p->first_seen;
    int check = c->stall_check > 0 && age >= c->stall_check && !p->warned;
    int stop = c->stall_shutdown > 0 && age >= c->stall_shutdown;
    if (!check && !stop)
      continue;
    char lab[300], missing[512], present[512], msg[HVD__ERRMSG_MAX];
    int ref = 0;
    while (ref < c->size && !p->have[ref])
      ref++;
    label(p, ref < c->size ? p->desc[ref].coll : HVD__ALLREDUCE, lab,
          sizeof lab);
    rank_list(c, p, 0, missing, sizeof missing);
    rank_list(c, p, 1, present, sizeof present);
    if (check) {
      HVD__LOG(HVD__LOG_WARNING,
               "stall: %s has waited %.1f s for rank(s) %s; submitted by "
               "rank(s) %s",
               lab, age, missing, present);
      p->warned = 1;
    }
    if (stop) {
      snprintf(msg, sizeof msg,
               "%s stalled for %.1f s: rank(s) %s never submitted it "
               "(HVD_STALL_SHUTDOWN_TIME=%g)",
               lab, age, missing, c->stall_shutdown);
      hvd__response_t x = {.kind = HVD__RESP_STALL, .errmsg = msg};
      x.desc.coll = HVD__ALLREDUCE;
      put_response(&c->resp, &x, c->size);
      return 1;
    }
  }
  return 0;
}

/* Reads every rank's payload, then encodes the responses into c->resp. */
static hvd_result_t coordinate(hvd__controller_t *c, const char *inbox) {
  hvd__w_reset(&c->resp);
  int nresp = 0, shutdown_by = -1;
  hvd__w_i32(&c->resp, 0); /* count, patched below */
  for (int r = 0; r < c->size; r++) {
    if (c->headers[2 * r + 1] && shutdown_by < 0)
      shutdown_by = r;
    if (c->headers[2 * r] == 0)
      continue;
    hvd__rbuf_t rb;
    hvd__r_init(&rb, inbox + c->displs[r], (size_t)c->headers[2 * r]);
    int n = hvd__r_i32(&rb);
    for (int i = 0; i < n && !rb.failed; i++) {
      char *name = hvd__r_str(&rb);
      hvd__desc_t d;
      get_desc(&rb, &d);
      double ready = hvd__r_f64(&rb);
      if (name == NULL || rb.failed) {
        free(name);
        return hvd__set_error(HVD_ERR_INTERNAL,
                              "malformed negotiation message from rank %d", r);
      }
      if (d.coll == HVD__JOIN) {
        if (!c->joined[r]) {
          c->joined[r] = 1;
          c->njoined++;
        }
        c->last_joined = r;
      } else {
        pending_t *p = pending_get(c, name);
        if (p == NULL) {
          free(name);
          return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator table");
        }
        if (!p->have[r]) {
          p->have[r] = 1;
          p->count++;
        }
        p->desc[r] = d;
        p->ready[r] = ready;
      }
      free(name);
    }
  }
  for (pending_t *p = c->head, *next; p != NULL; p = next) {
    next = p->next;
    int ready = p->count > 0;
    for (int r = 0; r < c->size && ready; r++)
      ready = p->have[r] || c->joined[r];
    if (!ready)
      continue;
    hvd__response_t x;
    int bad = make_response(c, p, &x);
    if (!bad)
      put_response(&c->resp, &x, c->size);
    response_clear(&x);
    if (bad)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator response");
    nresp++;
    pending_remove(c, p);
  }
  nresp += inspect_stalls(c);
  if (c->njoined == c->size) {
    hvd__response_t x = {.kind = HVD__RESP_JOIN_DONE, .arg = c->last_joined};
    x.desc.coll = HVD__JOIN;
    put_response(&c->resp, &x, c->size);
    nresp++;
    memset(c->joined, 0, (size_t)c->size);
    c->njoined = 0;
  }
  if (shutdown_by >= 0) {
    hvd__response_t x = {.kind = HVD__RESP_SHUTDOWN, .arg = shutdown_by};
    put_response(&c->resp, &x, c->size);
    nresp++;
  }
  if (c->resp.failed)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator response");
  if (nresp == 0)
    c->resp.len = 0; /* nothing to say: idle round */
  else
    memcpy(c->resp.data, &nresp, sizeof nresp);
  return HVD_SUCCESS;
}

static hvd_result_t reserve_inbox(hvd__controller_t *c, size_t n) {
  if (n <= c->inbox_cap)
    return HVD_SUCCESS;
  char *p = realloc(c->inbox, n);
  if (p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "negotiation buffer of %zu bytes", n);
  c->inbox = p;
  c->inbox_cap = n;
  return HVD_SUCCESS;
}

hvd_result_t hvd__controller_negotiate(hvd__controller_t *c,
                                       hvd_request_t *const *fresh,
                                       int nfresh, int want_shutdown,
                                       hvd__response_t **out, int *nout) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request mr;
  *out = NULL;
  *nout = 0;

  hvd__w_reset(&c->out);
  if (nfresh > 0) {
    hvd__w_i32(&c->out, nfresh);
    for (int i = 0; i < nfresh; i++) {
      hvd__w_str(&c->out, fresh[i]->name);
      put_desc(&c->out, &fresh[i]->desc);
      hvd__w_f64(&c->out, fresh[i]->t_ready);
    }
    if (c->out.failed)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation message");
  }

  /* 1. everyone learns everyone's payload length and shutdown flag */
  int64_t hdr[2] = {(int64_t)c->out.len, want_shutdown};
  HVD__MPI_CHECK(MPI_Iallgather(hdr, 2, MPI_INT64_T, c->headers, 2,
                                MPI_INT64_T, c->comm, &mr));
  HVD__CHECK(hvd__mpi_wait(&mr, "negotiation"));

  /* 2. payloads to the coordinator, if anyone has one */
  size_t total = 0;
  for (int r = 0; r < c->size; r++) {
    c->counts[r] = (int)c->headers[2 * r];
    c->displs[r] = (int)total;
    total += (size_t)c->headers[2 * r];
  }
  if (total > 0) {
    if (c->rank == 0)
      HVD__CHECK(reserve_inbox(c, total));
    HVD__MPI_CHECK(MPI_Igatherv(c->out.data, (int)c->out.len, MPI_BYTE,
                                c->inbox, c->counts, c->displs, MPI_BYTE, 0,
                                c->comm, &mr));
    HVD__CHECK(hvd__mpi_wait(&mr, "negotiation"));
  }

  /* 3. the coordinator decides; everyone receives the same responses */
  int64_t len = 0;
  if (c->rank == 0) {
    HVD__CHECK(coordinate(c, c->inbox));
    len = (int64_t)c->resp.len;
  }
  HVD__MPI_CHECK(MPI_Ibcast(&len, 1, MPI_INT64_T, 0, c->comm, &mr));
  HVD__CHECK(hvd__mpi_wait(&mr, "negotiation"));
  if (len == 0)
    return HVD_SUCCESS;
  char *buf = c->resp.data;
  if (c->rank != 0) {
    HVD__CHECK(reserve_inbox(c, (size_t)len));
    buf = c->inbox;
  }
  HVD__MPI_CHECK(MPI_Ibcast(buf, (int)len, MPI_BYTE, 0, c->comm, &mr));
  HVD__CHECK(hvd__mpi_wait(&mr, "negotiation"));

  hvd__rbuf_t rb;
  hvd__r_init(&rb, buf, (size_t)len);
  int n = hvd__r_i32(&rb);
  hvd__response_t *list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
  if (list == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "response list");
  for (int i = 0; i < n; i++) {
    if (get_response(&rb, &list[i], c->size) != 0) {
      hvd__responses_free(list, i + 1);
      return hvd__set_error(HVD_ERR_INTERNAL, "malformed response list");
    }
  }
  *out = list;
  *nout = n;
  return HVD_SUCCESS;
fail:
  return rc;
}
