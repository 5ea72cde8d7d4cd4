/*
 * request.h - one submitted collective: what the caller asked for, the
 * descriptor that is negotiated across ranks, and its completion state.
 */
#ifndef HVD_CORE_REQUEST_H
#define HVD_CORE_REQUEST_H

#include <pthread.h>
#include <stddef.h>

#include "internal.h"

/* What a rank says about one collective. Negotiation compares these. */
typedef struct hvd__desc {
  int coll;        /* hvd__coll_t */
  int dtype;       /* hvd_dtype_t */
  int device;      /* HVD_CPU or CUDA ordinal */
  int ndim;
  int64_t shape[HVD_MAX_DIMS];
  int op;          /* hvd_op_t */
  double prescale, postscale;
  int root;
  int wire; /* dtype on the wire: dtype, or f16/bf16 for a compressed f32 */
} hvd__desc_t;

/* Names of the collectives that have no user name. */
#define HVD__BARRIER_NAME "hvd.barrier"
#define HVD__JOIN_NAME "hvd.join"

#define HVD__INLINE_NAME 64

struct hvd_request {
  char *name; /* inline_name when it fits, else malloc'd */
  char inline_name[HVD__INLINE_NAME];
  hvd__desc_t desc;
  hvd_tensor_t send;        /* input; broadcast's in-place tensor */
  hvd_tensor_t recv;        /* allreduce: caller's output; else hvd's output */
  hvd_tensor_t *recv_out;   /* caller's slot for an output hvd allocates */
  int64_t *splits;          /* alltoall: copy of the caller's splits */
  int64_t *recv_splits;     /* alltoall: rows received per rank (hvd's) */
  int64_t *recv_splits_out; /* caller's array, may be NULL */
  int *last_rank_out;       /* join: caller's slot, may be NULL */
  int last_rank;
  int nranks;               /* world size when submitted */
  int is_stub;              /* made by the engine for a rank that joined */
  double t_submit;          /* hvd__now() at submission (timeline) */
  double t_ready;           /* t_submit on the aligned timeline clock */

  int done; /* guarded by the completion lock in request.c */
  hvd_result_t rc;
  char *errmsg;
  hvd_request_t *next; /* engine queue link */
};

/* A zeroed request with its own copy of name; NULL when out of memory. */
hvd_request_t *hvd__request_new(const char *name);
/* Frees the request and everything it owns except recv's data when the
 * caller took it. Accepts NULL. */
void hvd__request_free(hvd_request_t *r);
/* Sets r's result (and msg when rc fails; outputs hvd allocated are then
 * released). The request is not done yet: see hvd__requests_done. */
void hvd__request_set_result(hvd_request_t *r, hvd_result_t rc,
                             const char *msg);

/* Marks n requests done at once and wakes their waiters. A waiter woken
 * by the first finds the rest done too, so a burst completes without one
 * sleep per request. After this the engine must not touch them: a waiter
 * may free them at once. */
void hvd__requests_done(hvd_request_t *const *rs, int n);

/* hvd__request_set_result + hvd__requests_done for one request. */
void hvd__request_complete(hvd_request_t *r, hvd_result_t rc, const char *msg);

/* "allreduce 'w'", or just "barrier" / "join" for those without a name. */
void hvd__request_label(const hvd_request_t *r, char *buf, size_t n);

#endif /* HVD_CORE_REQUEST_H */
