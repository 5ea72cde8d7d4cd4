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
#include "base/wait.h"
#include "base/wire.h"
#include "core/pending.h"
#include "core/stall.h"

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
  hvd__pending_t *head, *tail;
  unsigned char *joined;
  int njoined, last_joined;
  hvd__stall_t stall; /* the stall inspector's settings and clock */
  const int *world;   /* world rank of each comm rank, or NULL */
  int npending;
  int timeline;
  double epoch; /* hvd__now() at the aligned clock's zero */
};

hvd__controller_t *hvd__controller_create(MPI_Comm comm, int rank, int size,
                                          const hvd__settings_t *s,
                                          int timeline, double epoch,
                                          const int *world_ranks) {
  hvd__controller_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->world = world_ranks;
  c->stall.world = world_ranks;
  c->timeline = timeline;
  c->epoch = epoch;
  c->stall.check_s = s->stall_check_s;
  c->stall.shutdown_s = s->stall_shutdown_s;
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

static void pending_free(hvd__pending_t *p) {
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
  for (hvd__pending_t *p = c->head, *next; p != NULL; p = next) {
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

/* ---- the coordinator ---------------------------------------------------- */

/* How messages name comm rank r: its world rank in a process set. */
#define WORLD(c, r) ((c)->world != NULL ? (c)->world[r] : (r))

/* The fields ranks must agree on, in the order they are checked. */
enum field {
  F_COLL,
  F_DTYPE,
  F_DEVICE,
  F_OP,
  F_PRESCALE,
  F_POSTSCALE,
  F_ROOT,
  F_SHAPE,
  F_WIRE,
  F_GROUP,
  F_COUNT
};
static const char *const field_names[F_COUNT] = {
    "collective", "dtype", "device", "op",         "prescale",
    "postscale",  "root",  "shape",  "wire dtype", "group"};

static int field_applies(int field, int coll) {
  int reduces = coll == HVD__ALLREDUCE || coll == HVD__REDUCESCATTER;
  switch (field) {
  case F_COLL:
    return 1;
  case F_DTYPE:
  case F_DEVICE:
  case F_SHAPE:
  case F_GROUP:
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
  case F_GROUP:
    return a->group_n == b->group_n && a->group_i == b->group_i &&
           a->group_id == b->group_id;
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

/* v in the fewest digits, 6 or more, that read back as v: two scale
 * factors that differ never print alike ("0.1 vs 0.10000000000000001"). */
static void real_str(double v, char *buf, size_t n) {
  for (int digits = 6; digits <= 17; digits++) {
    snprintf(buf, n, "%.*g", digits, v);
    if (strtod(buf, NULL) == v)
      return;
  }
}

static void field_str(int field, const hvd__desc_t *d, char *buf, size_t n) {
  switch (field) {
  case F_COLL:
    snprintf(buf, n, "%s", hvd__coll_name(d->coll));
    break;
  case F_DTYPE:
    snprintf(buf, n, "%s", hvd_dtype_name(d->dtype));
    break;
  case F_DEVICE:
    hvd__device_str(d->device, buf, n);
    break;
  case F_OP:
    snprintf(buf, n, "%s", hvd_op_name(d->op));
    break;
  case F_PRESCALE:
    real_str(d->prescale, buf, n);
    break;
  case F_POSTSCALE:
    real_str(d->postscale, buf, n);
    break;
  case F_ROOT:
    snprintf(buf, n, "%d", d->root);
    break;
  case F_WIRE:
    snprintf(buf, n, "%s", hvd_dtype_name(d->wire));
    break;
  case F_SHAPE:
    hvd__shape_str(d->ndim, d->shape, buf, n);
    break;
  case F_GROUP:
    if (d->group_n == 0)
      snprintf(buf, n, "none");
    else /* the id's last hex digits tell two groups of one size apart */
      snprintf(buf, n, "%d of %d (#%04x)", d->group_i + 1, d->group_n,
               (unsigned)(d->group_id & 0xffff));
    break;
  }
}

/* A field's value in words, after its name: "prescale 0.5". */
static void field_item(int field, const hvd__desc_t *d, char *buf, size_t n) {
  char v[HVD__SHAPE_STR_MAX];
  field_str(field, d, v, sizeof v);
  snprintf(buf, n, "%s %s", field_names[field], v);
}

/* Fills x with an error response if the ranks disagree; returns 1 then. */
static int check_agreement(const hvd__controller_t *c, const hvd__pending_t *p,
                           int ref, hvd__response_t *x) {
  const hvd__desc_t *d0 = &p->desc[ref];
  char lab[300], v[HVD__SHAPE_STR_MAX + 32], head[HVD__ERRMSG_MAX];
  char msg[HVD__ERRMSG_MAX];
  hvd__ranks_t l;
  for (int f = 0; f < F_COUNT; f++) {
    if (!field_applies(f, d0->coll))
      continue;
    hvd__ranks_begin(&l);
    for (int r = 0; r < c->size; r++) {
      if (!p->have[r] || r == ref || field_equal(f, d0, &p->desc[r]))
        continue;
      field_item(f, &p->desc[r], v, sizeof v);
      hvd__ranks_add(&l, WORLD(c, r), v);
    }
    if (l.listed == 0)
      continue;
    hvd__pending_label(p, d0->coll, lab, sizeof lab);
    field_item(f, d0, v, sizeof v);
    snprintf(head, sizeof head, "%s: rank %d %s", lab, WORLD(c, ref), v);
    hvd__ranks_write(&l, head, msg, sizeof msg);
    x->kind = HVD__RESP_ERROR;
    x->err = HVD_ERR_MISMATCH;
    x->errmsg = strdup(msg);
    return 1;
  }
  return 0;
}

/* Builds the response for a name every rank has (or has joined past). */
static int make_response(hvd__controller_t *c, hvd__pending_t *p,
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
      hvd__pending_label(p, x->desc.coll, lab, sizeof lab);
      snprintf(msg, sizeof msg,
               "%s: rank %d has joined; only allreduce can run until every "
               "rank joins",
               lab, WORLD(c, r));
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

static hvd__pending_t *pending_get(hvd__controller_t *c, const char *name) {
  hvd__pending_t *p = hvd__table_get(c->table, name);
  if (p != NULL)
    return p;
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->name = strdup(name);
  p->desc = calloc((size_t)c->size, sizeof *p->desc);
  p->ready = malloc((size_t)c->size * sizeof *p->ready);
  p->have = calloc((size_t)c->size, 1);
  if (!p->name || !p->desc || !p->ready || !p->have ||
      hvd__table_put(c->table, name, p) != 0) {
    pending_free(p);
    return NULL;
  }
  for (int r = 0; r < c->size; r++)
    p->ready[r] = -1; /* never submitted (a joined rank): none */
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

static void pending_remove(hvd__controller_t *c, hvd__pending_t *p) {
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

int hvd__controller_busy(hvd__controller_t *c) {
  return c->rank == 0 && hvd__stall_due(&c->stall, c->npending);
}

/* One entry of rank r's message: a join, or a name it now has. */
static hvd_result_t record(hvd__controller_t *c, int r, const char *name,
                           const hvd__desc_t *d, double ready) {
  if (d->coll == HVD__JOIN) {
    if (!c->joined[r]) {
      c->joined[r] = 1;
      c->njoined++;
    }
    c->last_joined = r;
    return HVD_SUCCESS;
  }
  hvd__pending_t *p = pending_get(c, name);
  if (p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator table");
  if (!p->have[r]) {
    p->have[r] = 1;
    p->count++;
  }
  p->desc[r] = *d;
  p->ready[r] = ready;
  /* the wait began at the first submission: a hit of the response cache
   * comes here only after it waited on its bit (fastpath.c) */
  if (ready >= 0 && c->epoch + ready < p->first_seen)
    p->first_seen = c->epoch + ready;
  return HVD_SUCCESS;
}

/* Rank r's message (len bytes at msg) into the pending table. */
static hvd_result_t read_message(hvd__controller_t *c, int r, const char *msg,
                                 size_t len) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd__rbuf_t rb;
  hvd__r_init(&rb, msg, len);
  int n = hvd__r_i32(&rb);
  for (int i = 0; i < n && !rb.failed && rc == HVD_SUCCESS; i++) {
    char *name;
    hvd__desc_t d;
    double ready;
    if (hvd__msg_get_request(&rb, &name, &d, &ready) != 0)
      return hvd__set_error(HVD_ERR_INTERNAL,
                            "malformed negotiation message from rank %d", r);
    rc = record(c, r, name, &d, ready);
    free(name);
  }
  return rc;
}

/* Every rank has p, or has joined past it. */
static int ready_all(const hvd__controller_t *c, const hvd__pending_t *p) {
  int ready = p->count > 0;
  for (int r = 0; r < c->size && ready; r++)
    ready = p->have[r] || c->joined[r];
  return ready;
}

/* The descriptor of the first rank that has p. */
static const hvd__desc_t *ref_desc(const hvd__controller_t *c,
                                   const hvd__pending_t *p) {
  int ref = 0;
  while (ref < c->size - 1 && !p->have[ref])
    ref++;
  return &p->desc[ref];
}

/* p's response into the list; p leaves the table. */
static hvd_result_t respond(hvd__controller_t *c, hvd__pending_t *p,
                            int *nresp) {
  hvd__response_t x;
  int bad = make_response(c, p, &x);
  if (!bad)
    hvd__msg_put_response(&c->resp, &x, c->size);
  hvd__response_clear(&x);
  if (bad)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator response");
  (*nresp)++;
  pending_remove(c, p);
  return HVD_SUCCESS;
}

/* 1 if the ranks that have p agree on its group (its other fields may
 * still differ: that member's own error, with its group). */
static int group_agrees(const hvd__controller_t *c, const hvd__pending_t *p) {
  const hvd__desc_t *d = ref_desc(c, p);
  for (int r = 0; r < c->size; r++)
    if (p->have[r] && !field_equal(F_GROUP, &p->desc[r], d))
      return 0;
  return 1;
}

/* The members of p's group (by index) that every rank has in that group;
 * returns how many of its group_n were found. */
static int group_members(const hvd__controller_t *c, const hvd__desc_t *d,
                         hvd__pending_t **m) {
  int found = 0;
  memset(m, 0, (size_t)d->group_n * sizeof *m);
  for (hvd__pending_t *q = c->head; q != NULL; q = q->next) {
    const hvd__desc_t *e = ref_desc(c, q);
    if (e->group_n != d->group_n || e->group_id != d->group_id ||
        e->group_i < 0 || e->group_i >= d->group_n || m[e->group_i] != NULL ||
        !ready_all(c, q) || !group_agrees(c, q))
      continue;
    m[e->group_i] = q;
    found++;
  }
  return found;
}

/* A response for every name that every rank has (or has joined past), in
 * order of first submission; a grouped collective's members all together,
 * in group order, once every rank has every one of them, each member's
 * own: a member whose ranks disagree fails, the others run (a group that
 * the ranks do not form alike fails at once). *nresp counts them. */
static hvd_result_t respond_ready(hvd__controller_t *c, int *nresp) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd__pending_t **m = NULL;
  int mcap = 0;
  for (hvd__pending_t *p = c->head, *next; p != NULL; p = next) {
    next = p->next;
    if (!ready_all(c, p))
      continue;
    const hvd__desc_t *d = ref_desc(c, p);
    int n = d->group_n;
    if (n == 0 || !group_agrees(c, p)) {
      HVD__CHECK(respond(c, p, nresp));
      continue;
    }
    if (n > mcap) {
      hvd__pending_t **grown = realloc(m, (size_t)n * sizeof *m);
      if (grown == NULL) {
        rc = hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator groups");
        goto fail;
      }
      m = grown, mcap = n;
    }
    if (group_members(c, d, m) < n)
      continue; /* not every member everywhere yet */
    for (int i = 0; i < n; i++)
      HVD__CHECK(respond(c, m[i], nresp));
    next = c->head; /* members left from anywhere in the list */
  }
fail:
  free(m);
  return rc;
}

/* After the names: JOIN_DONE once every rank has joined, and SHUTDOWN
 * when a rank asked (the first in rank order). */
static int respond_join_shutdown(hvd__controller_t *c, int shutdown_by) {
  int64_t why = shutdown_by >= 0 ? c->headers[2 * shutdown_by + 1] : 0;
  int n = 0;
  if (c->njoined == c->size) {
    hvd__response_t x = {.kind = HVD__RESP_JOIN_DONE, .arg = c->last_joined};
    x.desc.coll = HVD__JOIN;
    hvd__msg_put_response(&c->resp, &x, c->size);
    n++;
    memset(c->joined, 0, (size_t)c->size);
    c->njoined = 0;
  }
  if (shutdown_by >= 0) {
    hvd__response_t x = {.kind = HVD__RESP_SHUTDOWN,
                         .arg = shutdown_by,
                         .err = why == HVD__STOP_BY_SHUTDOWN ? HVD_ERR_SHUTDOWN
                                                             : HVD_SUCCESS};
    hvd__msg_put_response(&c->resp, &x, c->size);
    n++;
  }
  return n;
}

/* Reads every rank's message, then encodes the responses into c->resp
 * (empty when there is nothing to say: an idle round). */
static hvd_result_t coordinate(hvd__controller_t *c, const char *inbox) {
  hvd_result_t rc;
  int nresp = 0, shutdown_by = -1;
  hvd__w_reset(&c->resp);
  hvd__w_i32(&c->resp, 0); /* count, patched below */
  for (int r = 0; r < c->size; r++) {
    if (c->headers[2 * r + 1] && shutdown_by < 0)
      shutdown_by = r;
    if (c->headers[2 * r] > 0)
      HVD__CHECK(
          read_message(c, r, inbox + c->displs[r], (size_t)c->headers[2 * r]));
  }
  HVD__CHECK(respond_ready(c, &nresp));
  nresp += hvd__stall_inspect(&c->stall, c->head, c->joined, c->size, &c->resp);
  nresp += respond_join_shutdown(c, shutdown_by);
  if (c->resp.failed)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "coordinator response");
  if (nresp == 0)
    c->resp.len = 0;
  else
    memcpy(c->resp.data, &nresp, sizeof nresp);
  return HVD_SUCCESS;
fail:
  return rc;
}

static hvd_result_t reserve_inbox(hvd__controller_t *c, size_t n) {
  return hvd__grow((void **)&c->inbox, &c->inbox_cap, n, "negotiation buffer");
}

hvd_result_t hvd__controller_negotiate(hvd__controller_t *c,
                                       hvd_request_t *const *fresh, int nfresh,
                                       int want_shutdown, hvd__response_t **out,
                                       int *nout) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request mr;
  *out = NULL;
  *nout = 0;

  hvd__w_reset(&c->out);
  if (nfresh > 0) {
    hvd__w_i32(&c->out, nfresh);
    for (int i = 0; i < nfresh; i++)
      hvd__msg_put_request(&c->out, fresh[i]);
    if (c->out.failed)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation message");
  }

  /* 1. everyone learns everyone's payload length and shutdown flag */
  int64_t hdr[2] = {(int64_t)c->out.len, want_shutdown};
  HVD__MPI_CHECK(MPI_Iallgather(hdr, 2, MPI_INT64_T, c->headers, 2, MPI_INT64_T,
                                c->comm, &mr));
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

  return hvd__msg_get_responses(buf, (size_t)len, c->size, out, nout);
fail:
  return rc;
}
