/*
 * message.h - what ranks say to each other in a negotiation round, and its
 * encoding on the wire (base/wire.h: little-endian, length-prefixed
 * strings). A rank's message to the coordinator is a count and, per new
 * request, its name, descriptor and ready time; the coordinator answers
 * every rank with the same list of responses. Encoders record failure in
 * the buffer (w->failed); decoders return -1 on malformed input: bytes
 * missing, or a field out of its range (an enum, ndim, a group's size and
 * index, a count).
 */
#ifndef HVD_CORE_MESSAGE_H
#define HVD_CORE_MESSAGE_H

#include "base/wire.h"
#include "core/request.h"

typedef enum hvd__response_kind {
  HVD__RESP_RUN,       /* execute desc.coll on names */
  HVD__RESP_ERROR,     /* complete names with err/errmsg */
  HVD__RESP_JOIN_DONE, /* every rank joined; arg = the last to join */
  HVD__RESP_SHUTDOWN,  /* stop; arg = the rank that asked, err = why */
  HVD__RESP_STALL,     /* a collective stalled past HVD_STALL_SHUTDOWN_TIME;
                          errmsg says which and who is missing */
  HVD__RESP_KIND_COUNT /* the kinds above; the decoder refuses others */
} hvd__response_kind_t;

/* Why a rank asks its engine to stop: a negotiation round's
 * want_shutdown (0: it does not). A SHUTDOWN response's err says which
 * the rank that asked first had: HVD_ERR_SHUTDOWN for hvd_shutdown,
 * HVD_SUCCESS for a process set's destroy. */
enum { HVD__STOP_BY_DESTROY = 1, HVD__STOP_BY_SHUTDOWN = 2 };

typedef struct hvd__response {
  int kind;
  hvd__desc_t desc; /* the reference rank's descriptor */
  int nnames;
  char **names;
  int64_t *dims0; /* allgather: first dimension of every rank, else NULL */
  int njoined;    /* ranks that have joined and take part with identities */
  double *ready;  /* timeline on: each rank's ready time (aligned clock) */
  hvd_result_t err;
  char *errmsg;
  int arg;
  hvd_request_t *req; /* fast path only: this rank's request, if any */
  int borrowed;       /* fast path: names are lent, not owned */
} hvd__response_t;

/* Clears one response (what it owns); frees a list of n. */
void hvd__response_clear(hvd__response_t *x);
void hvd__responses_free(hvd__response_t *r, int n);

/* One request of a rank's message: name, descriptor, ready time. */
void hvd__msg_put_request(hvd__wbuf_t *w, const hvd_request_t *r);
/* The next request of a rank's message; *name is malloc'd. -1 when
 * malformed (then *name is NULL). */
int hvd__msg_get_request(hvd__rbuf_t *rb, char **name, hvd__desc_t *d,
                         double *ready);

/* One response of the coordinator's list (size: the world size). */
void hvd__msg_put_response(hvd__wbuf_t *w, const hvd__response_t *x, int size);
/* The coordinator's list: a count, then the responses. On success *out
 * holds *n >= 0 responses (free with hvd__responses_free); else the
 * message is set: HVD_ERR_INTERNAL "malformed response list" (a count
 * below 0 or more than the bytes can hold, a kind or field out of range,
 * bytes missing), or HVD_ERR_NO_MEMORY for a well-formed one. */
hvd_result_t hvd__msg_get_responses(const char *buf, size_t len, int size,
                                    hvd__response_t **out, int *n);

#endif /* HVD_CORE_MESSAGE_H */
